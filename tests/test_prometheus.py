"""`--format prometheus`: node_exporter textfile-collector text that prometheus_client's parser reads."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from afddiag.cli import cli, run
from afddiag.prometheus import STATUS, render
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
    status = {s.labels["gate"]: s.value for s in fams["afddiag_gate_status"].samples}
    assert status == {g["id"]: float(STATUS[g["verdict"]]) for g in rep["gates"]}
    for s in fams["afddiag_gate_status"].samples:  # no host (node_exporter adds instance), no verdict label
        assert s.labels == {"role": "generic", "command": "all", "gate": s.labels["gate"]}
    (ec,) = fams["afddiag_exit_code"].samples
    assert ec.value == rep["exit_code"]
    counts = {s.labels["verdict"]: s.value for s in fams["afddiag_gates"].samples}
    assert counts == {k: float(v) for k, v in rep["counts"].items()}
    info = fams["afddiag_device_map_info"].samples if rep["device_map"] else []
    assert rep["device_map"] or "afddiag_device_map_info" not in fams  # no entries: no empty family
    dm = {s.labels["ip"]: s.labels["device"] for s in info}
    assert dm == rep["device_map"]
    assert all(s.value == 1 for s in info)
    (ts,) = fams["afddiag_last_run_timestamp_seconds"].samples
    assert abs(ts.value - os.path.getmtime(out)) < 120


def test_expected_samples_for_the_first_device_incident(tmp_path):
    case = next(c for c in FABRIC if c.name.startswith("01-"))
    text, code = invoke(["fabric", "--snapshot", str(case), "--fabric-ip", load_case(case)["fabric_ip"],
                         "--format", "prometheus", "--no-history"])
    assert code == 2
    fams = families(text)
    first = [s for s in fams["afddiag_gate_status"].samples if s.labels["gate"] == "fabric.first-device"]
    assert [s.value for s in first] == [2.0]  # FAIL
    assert fams["afddiag_exit_code"].samples[0].value == 2
    assert {s.labels["ip"]: s.labels["device"] for s in fams["afddiag_device_map_info"].samples}[
        load_case(case)["fabric_ip"]] == load_case(case)["expected"]["device_map"][load_case(case)["fabric_ip"]]
    assert text.endswith("\n") and "# TYPE afddiag_gate_status gauge" in text


def test_labels_are_escaped_and_round_trip():
    nasty = 'ex"pe\\rt\nrole'
    rep = {"host": "h", "inputs": {"role": nasty}, "gates": [{"id": "fabric.link", "verdict": "WARN"}],
           "counts": {"WARN": 1}, "exit_code": 1, "device_map": {"10.0.0.1": 'dev"\\x'},
           "generated_at": "2026-11-30T12:00:00+00:00", "afddiag_version": "0.1.0"}
    text = render(rep, "gpu")
    assert '\\"' in text and "\\n" in text and "\\\\" in text
    fams = families(text)
    (s,) = fams["afddiag_gate_status"].samples
    assert s.labels == {"role": nasty, "command": "gpu", "gate": "fabric.link"}
    assert s.value == 1
    assert fams["afddiag_device_map_info"].samples[0].labels["device"] == 'dev"\\x'
    assert fams["afddiag_last_run_timestamp_seconds"].samples[0].value == 1796040000


def test_a_flipping_verdict_changes_the_value_not_the_series():
    rep = {"host": "h", "inputs": {"role": "expert"}, "gates": [{"id": "gpu.slow-state", "verdict": "PASS"}],
           "counts": {"PASS": 1}, "exit_code": 0, "device_map": {}, "generated_at": "2026-11-30T12:00:00+00:00"}
    before = families(render(rep, "all"))
    rep["gates"][0]["verdict"], rep["counts"], rep["exit_code"] = "FAIL", {"FAIL": 1}, 2
    after = families(render(rep, "all"))
    for name in ("afddiag_gate_status", "afddiag_gates", "afddiag_exit_code"):
        assert [x.labels for x in before[name].samples] == [x.labels for x in after[name].samples], name
    assert [x.value for x in after["afddiag_gate_status"].samples] == [2.0]


def test_numeric_gauges_in_base_units():
    h200 = next(c for c in GPU if "h200" in c.name)
    rep = json.loads(invoke(["gpu", "--json", "--no-history", "--snapshot", str(h200)])[0])
    fams = families(invoke(["gpu", "--format", "prometheus", "--no-history", "--snapshot", str(h200)])[0])
    d = rep["facts"]["gpu"]["devices"][0]
    ul = d["under_load"]
    (clk,) = fams["afddiag_gpu_under_load_sm_clock_hertz"].samples
    assert clk.value == ul["clock_sm_mhz"] * 1e6
    assert clk.labels == {"role": "generic", "command": "gpu", "gpu": "0", "uuid": d["uuid"]}
    rates = {x.labels["kind"]: x.value for x in fams["afddiag_gpu_load_flops_per_second"].samples}
    want = {k: ul[f] * 1e12 for k, f in (("fp32", "fp32_tflops"), ("bf16_mma", "bf16_tflops")) if ul.get(f) is not None}
    assert rates == pytest.approx(want) and want
    empty = type("E", (), {"samples": []})
    bw = {x.labels["kind"]: x.value for x in fams.get("afddiag_gpu_load_bytes_per_second", empty).samples}
    assert bw == pytest.approx({k: ul[f] * 1e9 for k, f in (("gemv", "gemv_gbps"), ("copy", "copy_gbps"))
                                if ul.get(f) is not None})
    c10 = next(c for c in FABRIC if c.name.startswith("10-"))  # netdev MTU 1500 on the fabric rail
    fams = families(invoke(["fabric", "--format", "prometheus", "--no-history", "--snapshot", str(c10)])[0])
    mtus = {(x.labels["device"], x.labels["netdev"]): x.value for x in fams["afddiag_roce_path_mtu_bytes"].samples}
    rep = json.loads(invoke(["fabric", "--json", "--no-history", "--snapshot", str(c10)])[0])
    from afddiag.model import roce_mtu

    nds = rep["facts"]["fabric"]["netdevs"]
    assert mtus and all(v == roce_mtu(nds[n]["mtu"]) for (_, n), v in mtus.items())
    assert 1024.0 in mtus.values()  # MTU 1500 → path MTU 1024


def test_qp_rtr_latency_in_seconds():
    from afddiag.prometheus import registry_for

    rep = {"gates": [], "counts": {}, "exit_code": 0, "facts": {"qp": {"results": [
        {"device": "mlx5_1", "port": 1, "steps": [{"to": "INIT", "ok": True, "elapsed_ms": 0.2},
                                                  {"to": "RTR", "ok": True, "elapsed_ms": 12.5}]},
        {"device": "mlx5_0", "port": 1, "steps": [{"to": "INIT", "ok": True, "elapsed_ms": 0.2},
                                                  {"to": "RTR", "ok": False, "elapsed_ms": 3.0}]}]}}}
    from prometheus_client import generate_latest

    fams = families(generate_latest(registry_for(rep)).decode())
    assert [(x.labels, x.value) for x in fams["afddiag_qp_rtr_transition_seconds"].samples] == [
        ({"role": "generic", "command": "all", "device": "mlx5_1", "port": "1"}, 0.0125)]  # a failed RTR: no latency


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None and not os.environ.get("CI"), reason="promtool not installed (Debian: prometheus)")
@pytest.mark.parametrize("case", FABRIC[:3] + GPU, ids=[p.name for p in FABRIC[:3] + GPU])
def test_promtool_check_metrics_passes(case):
    assert PROMTOOL, "promtool missing: scripts/setup.sh installs Debian's prometheus package"
    meta = load_case(case)
    args = ["--snapshot", str(case)] + (["--fabric-ip", meta["fabric_ip"]] if meta.get("fabric_ip") else [])
    text, _ = invoke(["all", "--format", "prometheus", "--no-history"] + args)
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "" and p.stderr.strip() == ""  # no lint findings either


def test_output_is_atomic_and_readable_by_the_collector(tmp_path):
    case = FABRIC[0]
    out = tmp_path / "tf" / "afddiag.prom"
    out.parent.mkdir()
    out.write_text("old\n")
    _, code = invoke(["fabric", "--snapshot", str(case), "--format", "prometheus", "--output", str(out),
                      "--no-history"])
    assert code == 2  # case 01: fabric.first-device FAILs
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


def test_status_values_order_by_what_needs_attention():
    """``> 0`` fires on WARN, FAIL and ERROR, never on SKIP; ``max`` is the worst verdict (SKIP is 0,
    told from PASS by afddiag_gate_skipped)."""
    order = ["PASS", "SKIP", "WARN", "FAIL", "ERROR"]
    rep = {"inputs": {"role": "expert"}, "gates": [{"id": f"g.{v.lower()}", "verdict": v} for v in order],
           "counts": {v: 1 for v in order}, "exit_code": 3, "device_map": {}}
    fams = families(render(rep, "all"))
    status = {s.labels["gate"]: s.value for s in fams["afddiag_gate_status"].samples}
    assert status == {"g.pass": 0, "g.skip": 0, "g.warn": 1, "g.fail": 2, "g.error": 3}
    assert [g for g, v in status.items() if v > 0] == ["g.warn", "g.fail", "g.error"]
    skipped = {s.labels["gate"]: s.value for s in fams["afddiag_gate_skipped"].samples}
    assert skipped == {"g.pass": 0, "g.skip": 1, "g.warn": 0, "g.fail": 0, "g.error": 0}
    for worst, gates in (("FAIL", ["PASS", "SKIP", "FAIL"]), ("WARN", ["SKIP", "WARN"]), ("PASS", ["SKIP", "PASS"])):
        assert max(STATUS[g] for g in gates) == STATUS[worst]
    assert {s.labels["verdict"] for s in fams["afddiag_gates"].samples} == set(order)


def test_every_series_names_its_role_and_command():
    """Two commands' files in one textfile folder never hold the same series (node_exporter drops one)."""
    case = next(c for c in FABRIC if c.name.startswith("01-"))
    fip = ["--fabric-ip", load_case(case)["fabric_ip"]]
    a = families(invoke(["all", "--snapshot", str(case), "--format", "prometheus", "--no-history", *fip])[0])
    f = families(invoke(["fabric", "--snapshot", str(case), "--format", "prometheus", "--no-history", *fip])[0])
    for fams, command in ((a, "all"), (f, "fabric")):
        for fam in fams.values():
            for smp in fam.samples:
                assert (smp.labels.get("role"), smp.labels.get("command")) == ("generic", command), (fam.name, smp)
    series = [{(x.name, tuple(sorted(x.labels.items()))) for fam in fams.values() for x in fam.samples}
              for fams in (a, f)]
    assert series[0] and series[1] and not series[0] & series[1]
