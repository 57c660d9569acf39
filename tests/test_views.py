"""The problems view (issue 23): a terminal folds SKIP rows into one count line (``--all`` lists them,
a pipe or file keeps every row), ``--quiet`` prints the diagnosis alone, ids of any length keep the
summaries in one column."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from afddiag.cli import run
from afddiag.render import View, write_gate_lines
from afddiag.report import write_table
from conftest import CASES

C01 = str(CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device")  # FAIL first-device, WARN mtu, many SKIPs


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(list(args))
    return code, out.getvalue(), err.getvalue()


def _report(*args: str) -> dict:
    code, out, _ = _run("all", "--json", "--no-history", "--snapshot", C01, "--role", "expert", *args)
    rep = json.loads(out)
    assert rep["exit_code"] == code
    return rep


def _rows(text: str, gate_ids) -> set[str]:
    """The gate ids that have a row in a table (the id as the first word after the verdict)."""
    return {gid for gid in gate_ids if re.search(rf"^\s*(PASS|WARN|FAIL|SKIP|ERROR)\s+{re.escape(gid)}\s", text, re.M)}


def test_terminal_folds_skip_rows_into_one_count_line_and_all_lists_them():
    rep = _report()
    ids = [g["id"] for g in rep["gates"]]
    skipped = [g["id"] for g in rep["gates"] if g["verdict"] == "SKIP"]
    assert len(skipped) >= 10 and len(skipped) < len(ids)
    folded = io.StringIO()
    write_table(rep, folded, width=80)
    text = folded.getvalue()
    assert _rows(text, ids) == set(ids) - set(skipped)  # every row that says something, no SKIP row
    line = next(ln for ln in text.splitlines() if "folded" in ln)
    assert line.startswith(f"{len(skipped)} SKIP row(s) folded (")
    assert "--all" in " ".join(text.split())
    assert f"{rep['counts']['SKIP']} skip" in text  # the totals still count them
    every = io.StringIO()
    write_table(rep, every, width=80, view=View(all_rows=True))
    assert _rows(every.getvalue(), ids) == set(ids) and "folded" not in every.getvalue()
    assert all(len(ln) <= 80 for ln in text.splitlines() + every.getvalue().splitlines())


def test_a_pipe_gets_every_row():
    rep = _report()
    code, out, _ = _run("all", "--no-history", "--snapshot", C01, "--role", "expert")
    assert code == rep["exit_code"]
    assert _rows(out, [g["id"] for g in rep["gates"]]) == {g["id"] for g in rep["gates"]}
    assert "folded" not in out


def test_quiet_prints_the_diagnosis_alone():
    rep = _report()
    code, out, _ = _run("all", "--quiet", "--no-history", "--snapshot", C01, "--role", "expert")
    assert code == rep["exit_code"] == 2
    assert out.startswith("diagnosis: ") and not _rows(out, [g["id"] for g in rep["gates"]])
    for d in rep["diagnosis"]:
        assert f"{d['verdict']} {d['gate']}: " in out
    assert "pass," not in out and "device map" not in out
    tty = io.StringIO()
    write_table(rep, tty, width=80, view=View(quiet=True))
    assert tty.getvalue().startswith("diagnosis: ") and not _rows(tty.getvalue(), [g["id"] for g in rep["gates"]])
    # a clean host says so in one line
    healthy = str(CASES / "gpu" / "01-gb10-healthy-unified-memory")
    code, out, _ = _run("gpu", "-q", "--no-history", "--snapshot", healthy)
    assert out.startswith("diagnosis: ") and "gpu.present" not in out


@pytest.mark.parametrize("args", [["--quiet", "--json"], ["--all", "--format", "json"], ["--all", "--quiet"]])
def test_view_flags_that_cannot_apply_are_usage_errors(args):
    code, out, err = _run("all", "--no-history", "--snapshot", C01, *args)
    assert code == 64 and out == "" and ("give one" in err or "shapes the table" in err)


def test_plain_lines_keep_summaries_in_one_column_for_any_id_length():
    gates = [{"id": "fabric.link", "verdict": "PASS", "summary": "up"},
             {"id": "site.a-very-long-gate-identifier-of-40", "verdict": "FAIL", "summary": "down",
              "remedy": "fix it", "action": "RERUN"},
             {"id": "gpu.present", "verdict": "SKIP", "summary": "none"}]
    out = io.StringIO()
    write_gate_lines(gates, out)
    lines = out.getvalue().splitlines()
    starts = {ln.index(g["summary"]) for ln, g in zip([lines[0], lines[1], lines[3]], gates, strict=True)}
    assert len(starts) == 1, lines  # every summary in one column
    assert lines[2].index("remedy:") == starts.pop()  # the remedy under it


def test_terminal_table_keeps_each_gate_id_on_one_line():
    rep = _report()
    out = io.StringIO()
    write_table(rep, out, width=80, view=View(all_rows=True))
    longest = max((g["id"] for g in rep["gates"]), key=len)
    assert len(longest) >= 23 and re.search(rf"\s{re.escape(longest)}\s", out.getvalue())
