"""Text rendering shared by the per-host report, the fleet report and the history: one rich
Console per output, verdict tables whose cells wrap (never cut) at the terminal's width.

Plain text (no rich, no colour, full-width lines) goes to anything that is not a terminal or when
``NO_COLOR`` is set, so pipes, files and ``grep`` see every character; a terminal gets a rich table
sized to its width (80 columns included): gate ids and remedies fold onto more lines instead of
ending in ``…``.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any, TextIO

from afddiag.diagnosis import drains
from afddiag.shellcmd import lines as shell_lines
from afddiag.textlayout import unbroken, units, wrap  # noqa: F401 - the renderers' text layout, re-exported

COLORS = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim", "ERROR": "magenta"}
TELLS = ("WARN", "FAIL", "ERROR")  # verdicts whose remedy is printed
ID_MAX = 40  # a gate id longer than this folds in a terminal's table (plain lines are never cut)


@dataclass(frozen=True)
class View:
    """Which parts of a host report the table shows. ``all_rows``: every gate's row on a terminal too
    (by default a terminal folds SKIP rows into one count line, :func:`fold_skips`; a pipe or file
    always gets every row, so ``grep`` sees every gate); ``quiet``: the diagnosis alone."""

    all_rows: bool = False
    quiet: bool = False


DEFAULT_VIEW = View()  # a terminal folds SKIP rows; a pipe gets every row


def id_width(gates: list[dict[str, Any]], least: int = 4) -> int:
    """Columns of the gate-id column: the longest id in ``gates`` (``least`` at the fewest)."""
    return max([len(str(g["id"])) for g in gates] + [least])


def fold_skips(gates: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str | None]:
    """``(rows to show, the count line for the folded ones)``: every row but SKIP, and for the SKIP
    rows one line counting them by family (``None`` when there is none), ``--all`` named as the way
    to list them."""
    shown = [g for g in gates if g["verdict"] != "SKIP"]
    skipped = [str(g["id"]) for g in gates if g["verdict"] == "SKIP"]
    if not skipped:
        return shown, None
    fams: dict[str, int] = {}
    for gid in skipped:
        fams[gid.split(".", 1)[0]] = fams.get(gid.split(".", 1)[0], 0) + 1
    by = ", ".join(f"{n} {fam}" for fam, n in fams.items())
    return shown, f"{len(skipped)} SKIP row(s) folded ({by}): not judged on this host; --all lists each with why"




def terminal_width(out: TextIO | None = None) -> int | None:
    """The terminal's width in columns when ``out`` (default: ``sys.stdout``) is a terminal, else None
    (a pipe or file gets the full layout). Source: :func:`shutil.get_terminal_size` (``COLUMNS``, then the tty)."""
    import shutil
    import sys

    out = sys.stdout if out is None else out
    if not getattr(out, "isatty", lambda: False)():
        return None
    return shutil.get_terminal_size().columns


def console_for(out: TextIO, width: int | None = None):
    """A rich Console writing to ``out`` when it is a terminal (or ``width`` is given: tests, fixed
    layouts); None when plain text is wanted (not a terminal, or ``NO_COLOR`` set without ``width``).
    Markup is off: a string printed or put in a table is never read as rich markup (data such as a
    host named ``spark-b[/bold]`` reaches tables; :mod:`afddiag.termsafe`)."""
    tty = bool(getattr(out, "isatty", lambda: False)())
    if width is None and (not tty or "NO_COLOR" in os.environ):
        return None
    from rich.console import Console

    return Console(file=out, width=width, highlight=False, no_color="NO_COLOR" in os.environ or not tty,
                   force_terminal=tty if width is not None else None, emoji=False, markup=False)


def action_tag(entry: dict[str, Any]) -> str:
    """``[ACTION]`` or ``[ACTION, drain]`` for a diagnosis entry (its ``drain``) or a gate verdict
    (``drain`` worked out from its verdict and action, :func:`afddiag.diagnosis.drains`); ``""``
    without an action. The one rendering of action and drain: tables, plain lines, the diagnosis,
    preflight and the fleet page all use it."""
    action = entry.get("action")
    if not action:
        return ""
    drain = entry.get("drain")
    if drain is None:
        try:
            drain = drains(str(entry.get("verdict")), str(action))
        except Exception:  # noqa: BLE001 - a report from elsewhere with an action this catalog lacks
            drain = False
    return f"[{action}{', drain' if drain else ''}]"


def command_lines(commands: list[str], width: int | None, indent: str) -> list[str]:
    """Each of ``commands`` on lines of its own after ``indent``, never with prose: whole when ``width``
    is None (pipes, files); on a terminal broken only where the shell reads it as the same command
    (:func:`afddiag.shellcmd.lines`), at column 0 when it does not fit after ``indent``."""
    out: list[str] = []
    for cmd in commands:
        if width is None:
            out.append(indent + cmd)
            continue
        ls = shell_lines(cmd, width - len(indent))
        if all(len(ln) <= width - len(indent) for ln in ls):
            out += [indent + ln for ln in ls]
        else:
            out += shell_lines(cmd, width)
    return out


def gate_table(gates: list[dict[str, Any]], title: str | None = None, below: frozenset[str] = frozenset(),
               caption: str | None = None):
    """A rich Table of verdicts: verdict, gate id, summary with the remedy under it (for WARN, FAIL,
    ERROR; for the gates in ``below``, a pointer to the remedy printed under the table; a remedy's
    commands are always printed under it, :func:`print_gate_table`); ``caption`` (the folded rows' count
    line, :func:`fold_skips`) right under it. Words wrap at spaces."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(title) if title is not None else None, box=box.SIMPLE_HEAD, show_lines=False, expand=False,
              pad_edge=False, caption=Text(caption) if caption else None, caption_justify="left")
    t.add_column("verdict", no_wrap=True, min_width=5)
    t.add_column("gate", overflow="fold", min_width=min(id_width(gates), ID_MAX))
    t.add_column("summary / remedy", overflow="fold", ratio=1)
    for g in gates:
        body = Text(g["summary"], overflow="fold")
        if g["verdict"] in TELLS and g.get("remedy"):
            tail = "remedy below the table" if g["id"] in below else g["remedy"]
            if g.get("commands") and g["id"] not in below:
                tail += " (commands below the table)"
            body.append("\n→ " + tail + (f" {action_tag(g)}" if g.get("action") else ""), style="italic")
        t.add_row(Text(g["verdict"], style=COLORS.get(g["verdict"], "")), Text(g["id"]), body)
    return t


def print_gate_table(con, gates: list[dict[str, Any]], title: str | None = None, caption: str | None = None,
                     fix_order: list[str] | None = None) -> None:
    """Print :func:`gate_table` on ``con`` so that no command is split: a remedy's commands are printed
    under the table, each on lines of its own (:func:`command_lines`), and so is a remedy whose long
    word would not fit its cell (the table is rendered once to see, :func:`wrap`). ``fix_order``: gate
    ids in the diagnosis' order; the blocks under the table follow it (then table order), so pasting
    them top to bottom fixes the root first."""
    from rich.console import Console
    from rich.text import Text

    probe = Console(width=con.width, record=True, file=io.StringIO(), color_system=None, emoji=False,
                    highlight=False, markup=False)
    probe.print(gate_table(gates, title, caption=caption))
    lines = probe.export_text().splitlines()
    below = frozenset(g["id"] for g in gates if g["verdict"] in TELLS and g.get("remedy")
                      and not all(any(u in ln for ln in lines) for u in unbroken(g["remedy"])))
    con.print(gate_table(gates, title, below, caption))
    rank = {gid: i for i, gid in enumerate(fix_order or [])}
    for g in sorted(gates, key=lambda g: rank.get(g["id"], len(rank))):  # stable: the rest keep table order
        cmds = (g.get("commands") or []) if g["verdict"] in TELLS and g.get("remedy") else []
        if g["id"] in below or cmds:
            con.print(Text(f"{g['verdict']} {g['id']} {action_tag(g)}:", style=COLORS.get(g["verdict"], "")),
                      overflow="ignore", crop=False)
            text = (wrap(g["remedy"], con.width, "  ", "  ") if g["id"] in below else []) \
                + command_lines(cmds, con.width, "    ")
            for ln in text:
                con.print(Text(ln), overflow="ignore", crop=False, soft_wrap=True)


def write_gate_lines(gates: list[dict[str, Any]], out: TextIO, least_id_width: int = 22) -> None:
    """Plain verdict lines, one per gate (``VERDICT  gate.id  summary``), the ids padded to the longest
    (``least_id_width`` at the fewest) so every summary starts in one column; the remedy on the next
    line for WARN, FAIL and ERROR and each of its commands on a line of its own under it; full length,
    never cut."""
    w = id_width(gates, least_id_width)
    for g in gates:
        out.write(f"{g['verdict']:<5}  {g['id']:<{w}} {g['summary']}\n")
        if g["verdict"] in TELLS and g.get("remedy"):
            out.write(f"{'':<5}  {'':<{w}} remedy: {g['remedy']}"
                      + (f" {action_tag(g)}" if g.get("action") else "") + "\n")
            out.write("".join(ln + "\n" for ln in command_lines(g.get("commands") or [], None, " " * (w + 11))))
