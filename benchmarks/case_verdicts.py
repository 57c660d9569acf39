"""Verdict counts (and gate verdicts) of every shared case, replayed as tests/test_cases.py does.

    .venv/bin/python benchmarks/case_verdicts.py [--cases DIR] [--json] > before.txt

Used to say, per case, how a change moved the verdicts (issue 12's note: counts before and after).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from pathlib import Path


def replay(case: Path) -> dict:
    """Run `afddiag all --json --snapshot CASE` (with the case's fabric IP and peers) in-process."""
    from afddiag.cli import run

    meta = json.loads((case / "case.json").read_text())
    args = ["all", "--json", "--no-history", "--snapshot", str(case)]
    if meta.get("fabric_ip"):
        args += ["--fabric-ip", meta["fabric_ip"]]
    for p in meta.get("peer_fabric_ips") or []:
        args += ["--peer", p]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run(args)
    rep = json.loads(out.getvalue())
    return {"case": f"{case.parent.name}/{case.name}", "exit": code, "counts": rep["counts"],
            "gates": {g["id"]: g["verdict"] for g in rep["gates"]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=os.environ.get("AFDDIAG_CASES",
                                                      str(Path(__file__).resolve().parents[2] / "shared" / "cases")))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = [replay(c) for kind in ("fabric", "gpu") for c in sorted((Path(a.cases) / kind).iterdir())
            if (c / "case.json").is_file()]
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        return
    for r in rows:
        c = r["counts"]
        print(f"{r['case']:<48} exit {r['exit']}  {c['PASS']}P {c['WARN']}W {c['FAIL']}F {c['SKIP']}S {c['ERROR']}E")


if __name__ == "__main__":
    main()
