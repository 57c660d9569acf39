"""The per-host summary: built at judge time from the run's typed facts (afddiag.summary.from_run), loaded
from a report's JSON only once it passes the schema (afddiag.summary.load), and the control plane's
untried connects read from the reach facts, not from note text."""

import json

import pytest
from click.testing import CliRunner

from afddiag import summary
from afddiag.cli import cli
from afddiag.model.host import reach_facts
from conftest import case_dirs, load_case

CASES = case_dirs("fabric") + case_dirs("gpu")


def _report(case):
    meta = load_case(case)
    args = ["all", "--json", "--snapshot", str(case)]
    if meta.get("fabric_ip"):
        args += ["--fabric-ip", meta["fabric_ip"]]
    for peer in meta.get("peer_fabric_ips") or []:
        args += ["--peer", peer]
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout)


@pytest.mark.parametrize("case", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_typed_summary_agrees_with_the_one_an_older_report_gets(case):
    # two derivations: from the typed facts at judge time, and from the report's JSON (what a merged report
    # of an older afddiag, carrying no summary, is summarised by); a fact lost on either path differs here
    rep = _report(case)
    assert rep["summary"] == summary.from_report(rep)
    assert summary.load(rep["summary"]) == rep["summary"]


@pytest.mark.parametrize("junk", [{"control_plane": "x"}, {"gpus": "x"}, {"capacity": {"key": "X", "value": 1}},
                                  {"summary_version": 2}, {"ipv4_prefixlen": {"10.0.0.1": 99}}])
def test_a_summary_the_schema_refuses_is_not_loaded(junk):
    assert summary.load({"summary_version": 1, **junk}) is None
    rep = {"host": "h", "gates": [], "inputs": {"role": "expert", "fabric_ip": "10.0.0.1"},
           "summary": {"summary_version": 1, **junk}}
    s = summary.of(rep)  # rebuilt from the report
    assert s["role"] == "expert" and s["fabric_ip"] == "10.0.0.1" and s["summary_version"] == 1


def test_not_tried_comes_from_the_readings_and_from_an_older_capture_notes():
    new = reach_facts({"source": "10.0.0.1", "peers": ["10.0.0.2"], "ports": [9000, 9001], "attempts": [],
                       "not_tried": [{"peer": "10.0.0.2", "port": 9001}, {"peer": 3, "port": "x"}],
                       "notes": ["10.0.0.2:9000 not tried: the 5 s bound was used up"]})
    assert new.not_tried == [("10.0.0.2", 9001)]  # the readings' field wins over note text
    old = reach_facts({"source": "10.0.0.1", "peers": ["10.0.0.2"], "ports": [9000], "attempts": [],
                       "notes": ["10.0.0.2:9000 not tried: the 5 s bound was used up", "not tried: 70 pairs"]})
    assert old.not_tried == [("10.0.0.2", 9000)]
