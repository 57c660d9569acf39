"""Every exit code afddiag uses, with its meaning: the one list the top-level ``--help``, the CLI and
README's "Exit code" sentence follow (``tests/test_operator_views.py`` keeps README in step).

No imports: ``afddiag --help`` loads this and click alone. :class:`CatalogError` lives here, not in
:mod:`afddiag.catalog`, so the CLI can catch it without loading the catalog."""

EXIT_OK, EXIT_WARN, EXIT_FAIL, EXIT_ERROR = 0, 1, 2, 3
EXIT_USAGE = 64  # BSD EX_USAGE: a missing file, a bad value, conflicting flags
EXIT_ABORT = 130  # 128 + SIGINT: interrupted (Ctrl-C)
EXIT_SIGPIPE = 141  # 128 + SIGPIPE: the reader closed the pipe (`afddiag all | head`), quietly


class CatalogError(RuntimeError):
    """The gate catalog (checks/gates.toml) is missing, unreadable or not valid TOML: a broken
    install or a bad local edit. The message names the file and the fix in one line; the CLI prints
    it and exits :data:`EXIT_ERROR` (nothing could be judged). Re-exported by :mod:`afddiag.catalog`."""


#: (code, meaning), in order; a verdict's code is the worst verdict's: FAIL, then ERROR, then WARN.
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "clean (every gate PASS or SKIP)"),
    (EXIT_WARN, "a WARN (no FAIL, no ERROR)"),
    (EXIT_FAIL, "a FAIL"),
    (EXIT_ERROR, "an ERROR (no FAIL)"),
    (EXIT_USAGE, "usage error: a missing file, a bad value, conflicting flags"),
    (EXIT_ABORT, "interrupted (Ctrl-C)"),
    (EXIT_SIGPIPE, "the reader closed the pipe (SIGPIPE), quietly"),
)


def help_text() -> str:
    """The exit codes as click help lines (one per code, kept unwrapped by click's ``\\b``)."""
    return "\b\nExit codes:\n" + "\n".join(f"  {c:>3}  {m}" for c, m in EXIT_CODES)


def unexpected_line(e: BaseException) -> str:
    """One stderr line for an error nothing else handled (the CLI then exits :data:`EXIT_ERROR`, never
    :data:`EXIT_WARN`): an OSError's own words (a failed write of stdout: ``> /dev/full``), else the
    exception's type and message, newlines folded, at most 400 characters."""
    if isinstance(e, OSError) and e.strerror:
        where = f"{e.filename}: " if e.filename else "writing the output: " if e.errno in (5, 28, 27) else ""
        text = f"{where}{e.strerror}"
    else:
        text = f"unexpected error ({type(e).__name__}: {e}); this is a bug, please report it with the command line"
    return "afddiag: " + " ".join(str(text).split())[:400]
