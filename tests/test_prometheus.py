"""`--format prometheus`: node_exporter textfile-collector text that prometheus_client's parser reads."""

from __future__ import annotations

import json
import os
import stat

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from afddiag.cli import cli, run
from afddiag.prometheus import STATUS, escape_label, render
from conftest import case_dirs, load_case

FABRIC = case_dirs("fabric")
GPU = case_dirs("gpu")


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def invoke(args):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return res.stdout, res.return_value


@pytest.mark.parametrize("case", FABRIC + GPU, ids=[f"{p.parent.name}/{p.name}" for p in FABRIC + GPU])
def test_every_case_renders_parseable_metrics_matching_the_json(case, tmp_path):
    meta = load_case(case)
    args = ["--snapshot", str(case)] + (["--fabric-ip", meta["fabric_ip"]] if meta.get("fabric_ip") else [])
    rep = json.loads(invoke(["all", "--json", "--no-history"] + args)[0])
    out = tmp_path / "afddiag.prom"
    _, code = invoke(["all", "--format", "prometheus", "--output", str(out), "--no-history"] + args)
    assert code == rep["exit_code"]
    fams = families(out.read_text())
    assert {f.type for f in fams.values()} == {"gauge"}
    status = {s.labels["gate"]: (s.labels["verdict"], s.value) for s in fams["afddiag_gate_status"].samples}
    assert status == {g["id"]: (g["verdict"], float(STATUS[g["verdict"]])) for g in rep["gates"]}
    for s in fams["afddiag_gate_status"].samples:
        assert s.labels["host"] == rep["host"] and s.labels["role"] == "generic" and s.labels["command"] == "all"
    (ec,) = fams["afddiag_exit_code"].samples
    assert ec.value == rep["exit_code"]
    counts = {s.labels["verdict"]: s.value for s in fams["afddiag_gates"].samples}
    assert counts == {k: float(v) for k, v in rep["counts"].items()}
    dm = {s.labels["ip"]: s.labels["device"] for s in fams["afddiag_device_map_info"].samples}
    assert dm == rep["device_map"]
    assert all(s.value == 1 for s in fams["afddiag_device_map_info"].samples)
    (ts,) = fams["afddiag_last_run_timestamp_seconds"].samples
    assert abs(ts.value - os.path.getmtime(out)) < 120


def test_expected_samples_for_the_first_device_incident(tmp_path):
    case = next(c for c in FABRIC if c.name.startswith("01-"))
    text, code = invoke(["fabric", "--snapshot", str(case), "--fabric-ip", load_case(case)["fabric_ip"],
                         "--format", "prometheus", "--no-history"])
    assert code == 2
    fams = families(text)
    first = [s for s in fams["afddiag_gate_status"].samples if s.labels["gate"] == "fabric.first-device"]
    assert [(s.labels["verdict"], s.value) for s in first] == [("FAIL", 2.0)]
    assert fams["afddiag_exit_code"].samples[0].value == 2
    assert {s.labels["ip"]: s.labels["device"] for s in fams["afddiag_device_map_info"].samples}[
        load_case(case)["fabric_ip"]] == load_case(case)["expected"]["device_map"][load_case(case)["fabric_ip"]]
    assert text.endswith("\n") and "# TYPE afddiag_gate_status gauge" in text


def test_labels_are_escaped_and_round_trip():
    nasty = 'h"o\\st\nname'
    rep = {"host": nasty, "inputs": {"role": "ex\"pert"}, "gates": [{"id": "fabric.link", "verdict": "WARN"}],
           "counts": {"WARN": 1}, "exit_code": 1, "device_map": {"10.0.0.1": 'dev"\\x'},
           "generated_at": "2026-11-30T12:00:00+00:00", "afddiag_version": "0.1.0"}
    text = render(rep, "gpu")
    assert '\\"' in text and "\\n" in text and "\\\\" in text
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    fams = families(text)
    (s,) = fams["afddiag_gate_status"].samples
    assert s.labels == {"host": nasty, "role": 'ex"pert', "command": "gpu", "gate": "fabric.link", "verdict": "WARN"}
    assert s.value == 1
    assert fams["afddiag_device_map_info"].samples[0].labels["device"] == 'dev"\\x'
    assert fams["afddiag_last_run_timestamp_seconds"].samples[0].value == 1796040000


def test_output_is_atomic_and_readable_by_the_collector(tmp_path):
    case = FABRIC[0]
    out = tmp_path / "tf" / "afddiag.prom"
    out.parent.mkdir()
    out.write_text("old\n")
    _, code = invoke(["fabric", "--snapshot", str(case), "--format", "prometheus", "--output", str(out),
                      "--no-history"])
    assert code in (0, 1, 2)
    assert os.listdir(out.parent) == ["afddiag.prom"]  # replaced in place, no temporary left
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert "afddiag_gate_status" in out.read_text() and "old" not in out.read_text()


def test_json_and_table_go_to_output_too(tmp_path):
    case = FABRIC[0]
    j = tmp_path / "r.json"
    stdout, _ = invoke(["fabric", "--snapshot", str(case), "--json", "--output", str(j), "--no-history"])
    assert stdout == "" and json.loads(j.read_text())["gates"]
    t = tmp_path / "r.txt"
    invoke(["fabric", "--snapshot", str(case), "--output", str(t), "--no-history"])
    assert "fabric.first-device" in t.read_text()


def test_unwritable_output_is_a_usage_error(tmp_path, capsys):
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--format", "prometheus", "--output",
                str(tmp_path / "missing" / "x.prom"), "--no-history"])
    assert code == 64
    assert "--output" in capsys.readouterr().err
