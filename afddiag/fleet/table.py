"""The fleet table: :func:`afddiag.fleet.judge.judge`'s fleet report rendered for a person (one row
per host, then the cross-host gates), plain text for pipes and files, rich tables on a terminal."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from afddiag.render import COLORS, console_for, print_gate_table, wrap, write_gate_lines
from afddiag.termsafe import one_line
from afddiag.verdict import VERDICTS


def write_fleet_table(fr: dict[str, Any], out: TextIO | None = None, width: int | None = None) -> None:
    """The fleet table: one row per host (status, exit, counts, failing gates or the error), then
    one row per fleet gate with its remedy. Plain full-width text when ``out`` is not a terminal;
    on a terminal (or at ``width``) rich tables whose cells fold, so 80 columns cut nothing. Names
    and a remote's stderr are shown with control characters escaped (:mod:`afddiag.termsafe`)."""
    fr = one_line(fr)
    out = out or sys.stdout

    con = console_for(out, width)
    w = max([len(r["name"]) for r in fr["hosts"]] + [4])
    if con is None:
        out.write(f"{'host':<{w}}  {'role':<12} {'collected':<9} exit  "
                  "pass/warn/fail/skip/error  failing gates / error\n")
        for r in fr["hosts"]:
            c = r.get("counts") or {}
            cnt = "/".join(str(c.get(k, "-")) for k in VERDICTS) if c else "-"
            what = r["error"] if r["status"] != "ok" else (", ".join(r["failing"]) or "-")
            out.write(f"{r['name']:<{w}}  {str(r.get('role') or '-'):<12} {r['status']:<9} {r['exit_code']!s:<5} "
                      f"{cnt:<26} {what}\n")
        out.write("\n")
        write_gate_lines(fr["gates"], out, 16)
    else:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        t = Table(title=Text(f"afddiag fleet — {len(fr['hosts'])} host(s) ({fr['source']})"), box=box.SIMPLE_HEAD,
                  pad_edge=False)
        t.add_column("host", overflow="fold")
        t.add_column("role", overflow="fold")
        t.add_column("status", no_wrap=True)
        t.add_column("exit", no_wrap=True)
        t.add_column("p/w/f/s/e", overflow="fold")
        t.add_column("failing gates / error", overflow="fold", ratio=1)
        for r in fr["hosts"]:
            c = r.get("counts") or {}
            cnt = "/".join(str(c.get(k, "-")) for k in VERDICTS) if c else "-"
            what = r["error"] if r["status"] != "ok" else (", ".join(r["failing"]) or "-")
            status = Text(r["status"], style="" if r["status"] == "ok" else COLORS["ERROR"])
            t.add_row(Text(r["name"]), Text(str(r.get("role") or "-")), status, Text(str(r["exit_code"])), Text(cnt),
                      Text(str(what)))
        con.print(t)
        print_gate_table(con, fr["gates"], "cross-host gates")
    c = fr["counts"]
    line = (f"{fr['hosts_ok']} host(s) reported, {fr['hosts_error']} without a report; fleet gates: {c['PASS']} "
            f"pass, {c['WARN']} warn, {c['FAIL']} fail, {c['SKIP']} skip, {c['ERROR']} error — exit {fr['exit_code']}")
    out.write("".join(ln + "\n" for ln in (wrap(line, con.width, "", "  ") if con else [line])))
