"""Command line: ``afddiag fabric|gpu|all|preflight|devicemap|baseline|catalog|schema|fleet|merge|capture|history``
and ``afddiag version``.

The group alone: every command lives in :mod:`afddiag.commands` and is imported when named (start-up,
``--version`` and ``--help`` stay light); each parses its options into the library's inputs, calls one
library function (:mod:`afddiag.check`, :mod:`afddiag.preflight`, :mod:`afddiag.pairtest`,
:mod:`afddiag.devicemap`, :mod:`afddiag.baseline_record`, ...), renders its result and returns the
exit code (2 FAIL, 3 ERROR, 1 WARN, 0 clean, 64 usage error).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Sequence

import click

from afddiag import __version__
from afddiag.exitcodes import EXIT_ABORT, EXIT_ERROR, EXIT_SIGPIPE, EXIT_USAGE, CatalogError, help_text, unexpected_line

# Commands, each in its own module, imported only when named (start-up stays cheap).
LAZY_COMMANDS = {
    "fabric": "afddiag.commands.fabric:fabric",
    "gpu": "afddiag.commands.check:gpu",
    "all": "afddiag.commands.check:all_",
    "preflight": "afddiag.commands.preflight:preflight_command",
    "devicemap": "afddiag.commands.devicemap:devicemap",
    "baseline": "afddiag.commands.baseline:baseline",
    "catalog": "afddiag.commands.catalog:catalog",
    "schema": "afddiag.commands.catalog:schema",
    "fleet": "afddiag.commands.fleet:fleet",
    "merge": "afddiag.commands.fleet:merge",
    "capture": "afddiag.commands.capture:capture",
    "history": "afddiag.commands.history:history",
    "npd": "afddiag.commands.npd:npd",
    "version": "afddiag.commands.version:version",
}


class CommandLoadError(Exception):
    """A command's module failed to import for a reason in afddiag itself (not a missing dependency): a bug
    that must surface, naming the module, never read as "not available"."""


def missing_dependency(e: ImportError) -> bool:
    """Whether ``e`` is a dependency outside afddiag that is missing or broken (``No module named
    'asyncssh'``, ``cannot import name 'X' from 'rich'``), not an import that fails inside afddiag's own
    code (``cannot import name 'X' from 'afddiag.render'``, a missing ``afddiag.*`` module)."""
    name = e.name or ""
    return bool(name) and name.split(".")[0] != "afddiag"


class PipeClosed(Exception):
    """stdout's reader went away (EPIPE). Not an OSError, so click's own handler (exit 1) lets it pass."""


class LazyGroup(click.Group):
    """A click group whose extra commands are imported on first use (click's lazy-loading pattern)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as e:
            raise PipeClosed() from e

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | {n for n in LAZY_COMMANDS if self._load(n)})

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name) or self._load(name)
        if cmd is None and name in LAZY_COMMANDS:
            why = self._why.get(name, "")
            raise click.UsageError(f"'{name}' is not available: {why} (pip install 'afddiag' with its dependencies)")
        return cmd

    _why: dict[str, str] = {}

    @classmethod
    def _load(cls, name):
        """The command ``name``, imported now; None when a dependency it needs is missing (why: ``_why``).
        Raises :class:`CommandLoadError` when its module fails for a reason in afddiag's own code."""
        target = LAZY_COMMANDS.get(name)
        if not target:
            return None
        mod, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except ImportError as e:
            if not missing_dependency(e):
                raise CommandLoadError(f"the '{name}' command's module {mod} failed to import: {e} (a bug in "
                                       "afddiag, not a missing dependency: please report it)") from e
            cls._why[name] = str(e)
            return None
        except AttributeError as e:
            raise CommandLoadError(f"the '{name}' command's module {mod} has no {attr}: {e} (a bug in afddiag: "
                                   "please report it)") from e


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             help="Bring-up diagnostics for an attention-FFN-disaggregated fleet: RoCE v2 fabric and GPUs.\n\n"
             + help_text())
@click.version_option(__version__, prog_name="afddiag")
def cli() -> None:
    """The command group; its help (with every exit code, :mod:`afddiag.exitcodes`) is set above."""


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (no ``sys.exit``)."""
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="afddiag", standalone_mode=False)
    except click.UsageError as e:
        click.echo(f"afddiag: {e.format_message()}", err=True)
        if e.ctx is not None:
            click.echo(f"Try '{e.ctx.command_path} --help'.", err=True)
        return EXIT_USAGE
    except click.Abort:
        click.echo("afddiag: aborted", err=True)
        return EXIT_ABORT
    except PipeClosed:
        return EXIT_SIGPIPE
    except click.ClickException as e:
        e.show()
        return EXIT_USAGE
    except (CatalogError, CommandLoadError) as e:
        click.echo(f"afddiag: {e}", err=True)
        return EXIT_ERROR  # nothing could be judged
    return rv if isinstance(rv, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: run and exit with the code. A reader that closes the pipe early
    (``afddiag all | head -3``) ends the run quietly with 141 (128 + SIGPIPE), not a traceback and not
    a verdict's code."""
    try:
        code = run(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        code = EXIT_SIGPIPE
    except Exception as e:  # noqa: BLE001 - the one place an unhandled error becomes one line and exit 3
        with contextlib.suppress(OSError, ValueError):
            print(unexpected_line(e), file=sys.stderr, flush=True)
        code = EXIT_SIGPIPE if _stdout_closed() else EXIT_ERROR
        with contextlib.suppress(OSError, ValueError):  # unwritten output must not fail again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if code == EXIT_SIGPIPE or _stdout_closed():
        try:  # Python flushes stdout again at exit: point it at /dev/null so that flush cannot fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        sys.exit(EXIT_SIGPIPE)
    sys.exit(code)


def _stdout_closed() -> bool:
    try:
        sys.stdout.flush()
        return False
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
