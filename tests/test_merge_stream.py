"""Issue 25: `afddiag merge` reads its inputs a report at a time and keeps per-host summaries.

Each report is reduced, once checked, to the per-host summary the fleet gates read and its row's
brief; the fleet report's rows carry the summaries, the whole reports only with --full-reports.
The verdicts must not change: the planted faults are named whichever form the reports come in
(files, JSON lines, one JSON array), and each row's summary is what :func:`afddiag.summary.from_report`
builds from that host's report. No timing here: benchmarks/merge_bench.py measures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from afddiag import cli, summary
from afddiag.envvars import redact_report
from afddiag.fleet import load_reports
from afddiag.reader import DepthError, json_depth
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import merge_scaling  # noqa: E402

N = 300  # the planted faults of merge_scaling.FAULTS below 300, and the shared fabric IP (100, 101)


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[Path]:
    return merge_scaling.make_reports(N, tmp_path_factory.mktemp("reports"))


def _merge(args: list[str], capsys) -> tuple[dict, int]:
    capsys.readouterr()
    rc = cli.run(["merge", "--json", *args])
    out = capsys.readouterr().out
    return json.loads(out), rc


def _planted_named(fr: dict) -> None:
    gates = {g["id"]: g for g in fr["gates"]}
    assert gates["fleet.capacity"]["verdict"] == "FAIL"
    assert gates["fleet.capacity"]["summary"].startswith("node00017 AFD_EXPERT_CAPACITY=128")
    assert gates["fleet.mtu"]["summary"].startswith("node00042 RoCE MTU 1024 (enp1s0f1np1 MTU 1500)")
    assert "node00100, node00101 share fabric IP 10.64.0.110" in gates["fleet.fabric-ip"]["summary"]
    assert "node00099 10.65.0.9 (10.65.0.0/16)" in gates["fleet.fabric-ip"]["summary"]
    assert gates["fleet.gid-index"]["verdict"] == "PASS"


def test_rows_carry_each_hosts_summary_and_no_reports(reports, capsys):
    fr, rc = _merge([*map(str, reports)], capsys)
    assert rc == 2 and fr["hosts_ok"] == N and "reports" not in fr
    _planted_named(fr)
    for row, path in zip(fr["hosts"], reports, strict=True):
        rep = json.loads(path.read_text())
        assert row["name"] == rep["host"] and row["target"] == str(path)
        assert row["summary"] == json.loads(json.dumps(summary.from_report(rep))), row["name"]
    schema = json.loads((REPO / "afddiag/schema/fleet.schema.json").read_text())
    jsonschema.validate(fr, schema)


def test_full_reports_embeds_each_report_redacted(reports, capsys):
    fr, _ = _merge(["--full-reports", *map(str, reports[:20])], capsys)
    assert sorted(fr["reports"]) == [f"node{i:05d}" for i in range(20)]
    for p in reports[:20]:
        rep = json.loads(p.read_text())
        assert fr["reports"][rep["host"]] == json.loads(json.dumps(redact_report(rep)))


def test_every_form_gives_the_same_verdicts(reports, capsys, tmp_path):
    reps = [json.loads(p.read_text()) for p in reports]
    lines, array = tmp_path / "all.jsonl", tmp_path / "all.json"
    lines.write_text("".join(json.dumps(r) + "\n" for r in reps))
    array.write_text(json.dumps(reps, indent=2))
    files, _ = _merge([*map(str, reports)], capsys)
    by_line, _ = _merge([str(lines)], capsys)
    by_array, _ = _merge([str(array)], capsys)
    for fr in (by_line, by_array):
        _planted_named(fr)
        assert [(g["id"], g["verdict"], g["summary"]) for g in fr["gates"]] == \
               [(g["id"], g["verdict"], g["summary"]) for g in files["gates"]]
        assert [(r["name"], r["exit_code"], r["summary"]) for r in fr["hosts"]] == \
               [(r["name"], r["exit_code"], r["summary"]) for r in files["hosts"]]
    assert [r["target"] for r in by_line["hosts"][:2]] == [f"{lines}:1", f"{lines}:2"]
    assert {r["target"] for r in by_array["hosts"]} == {str(array)}


def test_a_bad_line_is_one_error_row_and_the_rest_are_judged(reports, capsys, tmp_path):
    reps = [json.loads(p.read_text()) for p in reports[:4]]
    bad = dict(reps[2], facts=[1])  # breaks the schema: an ERROR row named after its host
    text = [json.dumps(reps[0]), "<html>502 Bad Gateway</html>", json.dumps(bad), json.dumps(reps[3]) + " trailing"]
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join(text) + "\n")
    fr, rc = _merge([str(p)], capsys)
    rows = {r["name"]: r for r in fr["hosts"]}
    assert rows["node00000"]["status"] == "ok"
    assert rows["mixed.jsonl:2"]["status"] == "ERROR" and "not JSON" in rows["mixed.jsonl:2"]["error"]
    assert rows["node00002"]["status"] == "ERROR" and "report.facts" in rows["node00002"]["error"]
    assert rows["node00003"]["status"] == "ok"  # its line's trailing word is the next (bad) value
    assert rc == 2 and fr["hosts_ok"] == 2


def test_a_truncated_array_keeps_the_reports_before_the_cut(reports, capsys, tmp_path):
    reps = [json.loads(p.read_text()) for p in reports[:3]]
    p = tmp_path / "cut.json"
    p.write_text(json.dumps(reps)[:-500])
    fr, _ = _merge([str(p)], capsys)
    assert [r["status"] for r in fr["hosts"]] == ["ok", "ok", "ERROR"]
    assert "not JSON" in fr["hosts"][2]["error"] and fr["hosts"][2]["name"] == "cut.json"


def test_the_same_report_in_two_forms_is_one_host(reports, capsys, tmp_path):
    rep = json.loads(reports[5].read_text())
    p = tmp_path / "again.jsonl"
    p.write_text(json.dumps(rep, sort_keys=True) + "\n" + json.dumps(json.loads(reports[6].read_text())) + "\n")
    capsys.readouterr()
    rc = cli.run(["merge", "--json", str(reports[5]), str(p)])
    cap = capsys.readouterr()
    fr = json.loads(cap.out)
    assert [r["name"] for r in fr["hosts"]] == ["node00005", "node00006"] and rc in (0, 1, 2)
    assert f"{p}:1: the same report as {reports[5]}" in cap.err and "duplicate input" in cap.err


def test_nan_is_an_error_row_naming_where(reports, capsys, tmp_path):
    text = reports[3].read_text().replace('"value": 256', '"value": NaN', 1)
    assert "NaN" in text
    p = tmp_path / "nan.json"
    p.write_text(text)
    fr, _ = _merge([str(p), str(reports[4])], capsys)
    row = fr["hosts"][0]
    assert row["status"] == "ERROR" and "is not a number JSON allows" in row["error"] and "report." in row["error"]
    assert fr["hosts"][1]["status"] == "ok"


def test_depth_is_bounded_per_file_without_parsing(tmp_path, capsys):
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"a": 1}\n' + "[" * 100 + "]" * 100 + "\n")
    assert cli.run(["merge", str(deep)]) == 64
    assert "deeper than 64 levels" in capsys.readouterr().err
    with pytest.raises(DepthError):
        load_reports([str(deep)])
    # brackets inside strings, escaped quotes and backslashes do not count
    assert json_depth(json.dumps({"a": ["[[[[", '\\"]]', {"b": '\\\\"{{{'}]})) == 3
    assert json_depth(b'"\\\\"[[]]') == 2
