"""Reports: render verdicts as a table for people, JSON for machines, metrics for Prometheus, and the
device map. :data:`REPORTERS` is the one table of output formats every command chooses from."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TextIO, cast

from afddiag import prometheus
from afddiag.atomic import atomic_write
from afddiag.document import SCHEMA_VERSION, build  # noqa: F401 - the report document, importable from here too
from afddiag.envvars import MAP_VAR, format_device_map
from afddiag.render import (
    COLORS,  # noqa: F401 - importable from here too
    DEFAULT_VIEW,
    View,
    action_tag,
    command_lines,
    console_for,
    fold_skips,
    print_gate_table,
    wrap,
    write_gate_lines,
)
from afddiag.termsafe import one_line


def write_json(report: Mapping[str, Any], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    json.dump(report, out, indent=2, sort_keys=False, default=str)
    out.write("\n")


def write_table(report: Mapping[str, Any], out: TextIO | None = None, width: int | None = None,
                view: View = DEFAULT_VIEW) -> None:
    """A rich table on a terminal (cells fold at its width, or at ``width``); plain full-width
    lines when ``out`` is not a terminal or NO_COLOR is set (:mod:`afddiag.render`). ``view``: a
    terminal folds the SKIP rows into one count line unless ``view.all_rows`` (plain lines keep every
    row); ``view.quiet`` prints the diagnosis alone."""
    report = one_line(report)  # device names, remote text: no control sequence or forged row reaches the terminal
    out = out or sys.stdout
    con = console_for(out, width)
    if view.quiet:
        write_diagnosis(report, out, con.width if con is not None else None, trailer=False)
        return
    if con is None:  # plain text needs no rich (start-up: rich costs ~40 ms to import)
        write_diagnosis(report, out)
        write_gate_lines(report["gates"], out)
    else:  # a terminal: lines wrap between words, a command stays on one line (afddiag.render.wrap)
        write_diagnosis(report, out, con.width)
        rows, folded = (list(report["gates"]), None) if view.all_rows else fold_skips(report["gates"])
        print_gate_table(con, rows, f"afddiag {report['afddiag_version']} — {report['host']} "
                         f"({report['source']})", folded, [d["gate"] for d in report.get("diagnosis") or []])
    dm = report.get("device_map") or {}
    if dm:
        line = f"device map: {MAP_VAR}={format_device_map(dm)}"
        if con is None or len(line) <= con.width:
            out.write(line + "\n")
        else:  # one entry a line; `afddiag devicemap --format shell` prints the line to paste
            head = f"device map: {MAP_VAR}, one entry a line (`afddiag devicemap` prints the line to paste):"
            out.write("".join(ln + "\n" for ln in wrap(head, con.width, "", "  ")))
            for ip, dev in dm.items():
                out.write(f"  {ip}={dev}\n")
    c = report["counts"]
    out.write(f"{c['PASS']} pass, {c['WARN']} warn, {c['FAIL']} fail, {c['SKIP']} skip, {c['ERROR']} error"
              f" — exit {report['exit_code']}\n")


def write_diagnosis(report: Mapping[str, Any], out: TextIO, width: int | None = None, trailer: bool = True) -> None:
    """The report's opening: each independent fault with its one remedy and action, in fix order, the
    remedy's commands under it, each on lines of its own. ``width`` (a terminal's columns): prose wraps
    between words, under its indent (:func:`afddiag.render.wrap`); a command breaks only where the shell
    reads it as the same command (:func:`afddiag.render.command_lines`). ``trailer``: the blank line that
    parts it from the table."""
    def put(first: str, text: str, indent: str) -> None:  # prose: wrapped between words
        if width is None:
            out.write(first + text + "\n")
        else:
            out.write("".join(ln + "\n" for ln in wrap(text, width, first, indent)))

    diag = report.get("diagnosis") or []
    faults = [d for d in diag if d["verdict"] in ("FAIL", "ERROR")]
    if not diag:
        out.write("diagnosis: no fault found\n")
        return
    head = (f"{len(faults)} fault(s)" if faults else "no fault") + (
        f", {len(diag) - len(faults)} warning(s)" if len(diag) > len(faults) else "")
    put("", f"diagnosis: {head}, in the order to fix them", "  ")
    for i, d in enumerate(diag, 1):
        put(f"  {i}. ", f"{d['verdict']} {d['gate']}: {d['summary']}", "     ")
        put("     remedy: ", f"{d['remedy']} {action_tag(d)}", "     ")
        out.write("".join(ln + "\n" for ln in command_lines(d.get("commands") or [], width, "       ")))
        if d["explains"]:
            put("     explains: ", ", ".join(d["explains"]), "     ")
    if trailer:
        out.write("\n")


def format_exports(pairs: list[tuple[str, str]], fmt: str = "shell") -> str:
    """``export K='v'`` lines (shell) or ``K=v`` lines (env)."""
    if fmt == "shell":
        return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in pairs)
    return "\n".join(f"{k}={v}" for k, v in pairs)


def format_devicemap(dm: dict[str, str], fmt: str) -> str:
    """The device map as ``env`` (``VAR=ip=dev,...``), ``shell`` (``export VAR='...'``) or ``json``."""
    if fmt == "json":
        return json.dumps(dm, indent=2)
    value = format_device_map(dm)
    if fmt == "shell":
        return f"export {MAP_VAR}={shlex.quote(value)}"
    return f"{MAP_VAR}={value}"


# ---------------------------------------------------------------------------------------------
# Output formats: one table, one selection


class FormatError(ValueError):
    """The output asked for cannot be given (two formats at once, a library missing): one line that
    names the flags and the fix; the CLI makes it a usage error (exit 64)."""


def _prometheus_missing() -> str | None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        return (f"--format prometheus needs prometheus_client ({e}): pip install prometheus-client, "
                "or apt install python3-prometheus-client")
    return None


def _write_text(out: TextIO, text: str) -> None:
    out.write(text)


class Reporter(NamedTuple):
    """One output format: ``write(report, out, command, view)`` renders the report on ``out`` (``view``:
    :class:`afddiag.render.View`, the rows a table shows; the other formats write everything);
    ``missing()`` says why it cannot run on this machine (None: it can), checked before any probing."""

    write: Callable[[Mapping[str, Any], TextIO, str, View], None]
    missing: Callable[[], str | None] = lambda: None


#: format name → renderer: every command that prints a report chooses here (``--format``, ``--json``,
#: ``preflight --prom``). Order: the order ``--help`` lists them.
REPORTERS: dict[str, Reporter] = {
    "table": Reporter(lambda rep, out, command, view: write_table(rep, out, view=view)),
    "json": Reporter(lambda rep, out, command, view: write_json(rep, out)),
    "prometheus": Reporter(lambda rep, out, command, view: _write_text(out, prometheus.render(rep, command)),
                           _prometheus_missing),
}


def choose_format(as_json: bool = False, fmt: str | None = None) -> str:
    """``--json`` and ``--format`` → one name of :data:`REPORTERS`, checked usable here. Raises
    :class:`FormatError` when they disagree (``--json --format prometheus``) or the format's library
    is missing."""
    if as_json and fmt not in (None, "json"):
        raise FormatError(f"--json and --format {fmt} ask for two outputs: give one of them")
    name = fmt or ("json" if as_json else "table")
    if name not in REPORTERS:
        raise FormatError(f"--format {name}: give one of {', '.join(REPORTERS)}")
    why = REPORTERS[name].missing()
    if why:
        raise FormatError(why)
    return name


def emit(report: Mapping[str, Any], fmt: str, output: str | os.PathLike | None = None, command: str = "all",
         view: View = DEFAULT_VIEW) -> None:
    """Render ``report`` as ``fmt`` (a :data:`REPORTERS` name; ``view`` the table's rows) on stdout, or
    into ``output`` atomically (temporary file, fsync, rename, mode 0644; a character device written
    in place). Raises OSError when ``output`` cannot be written."""
    write = REPORTERS[fmt].write
    if output is None:
        write(report, sys.stdout, command, view)
        return
    with atomic_write(output, device_ok=True) as f:
        write(report, cast(TextIO, f), command, view)  # opened in text mode
