"""Replays of capture bundles recorded on a real H200 (tests/fixtures/gpu/h200-busy, made by
benchmarks/h200/record_busy_bundles.sh): a GPU busy with another job is "inconclusive", never a power
cycle or a drain (issue 12); the same GPU idle passes; and the busy figures with the busy evidence
removed FAIL, so it is the evidence, not lenient thresholds, that keeps the busy GPU from failing."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from click.testing import CliRunner

from afddiag.cli import cli

FIX = Path(__file__).resolve().parent / "fixtures" / "gpu" / "h200-busy"
HOST_CHANGING = {"AC_POWER_CYCLE", "RESET_GPU", "REBOOT", "HW_INSPECTION"}


def replay(snapshot: Path) -> tuple[dict, int]:
    res = CliRunner().invoke(cli, ["gpu", "--json", "--no-history", "--snapshot", str(snapshot),
                                   "--baseline", str(FIX / "baseline.json")],
                             standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout), res.return_value


def gate(rep: dict, gid: str) -> dict:
    return next(g for g in rep["gates"] if g["id"] == gid)


def test_busy_h200_is_inconclusive_never_a_power_cycle():
    rep, code = replay(FIX / "busy.tar.gz")
    slow = gate(rep, "gpu.slow-state")
    assert slow["verdict"] == "WARN" and "inconclusive: GPU busy" in slow["summary"], slow
    assert "python3" in slow["summary"]  # the competing process is named
    assert slow["action"] not in HOST_CHANGING
    assert code == 1  # WARN, not FAIL
    assert not any(d["action"] in HOST_CHANGING or d["drain"] for d in rep["diagnosis"]), rep["diagnosis"]
    # one fault, named once: the other process explains the inconclusive load figures
    (root,) = rep["diagnosis"]
    assert root["gate"] == "gpu.processes" and root["action"] == "STOP_PROCESSES"
    assert "gpu.slow-state" in root["explains"]


def test_idle_h200_passes_against_its_baseline():
    rep, code = replay(FIX / "idle.tar.gz")
    assert gate(rep, "gpu.slow-state")["verdict"] == "PASS"
    assert gate(rep, "gpu.processes")["verdict"] == "PASS"
    assert code == 0 and rep["diagnosis"] == []


def test_busy_figures_without_the_busy_evidence_fail(tmp_path):
    """The control: remove the other process and the utilization readings from a copy of the busy
    capture; the load figures (≈45 % of baseline at near-max clock) are then class B and FAIL."""
    with tarfile.open(FIX / "busy.tar.gz") as t:
        t.extractall(tmp_path, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(tmp_path)
    (root,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    g = json.loads((root / "gpu.json").read_text())
    for d in g["devices"]:
        d["nvml"]["processes"] = []
        d["nvml"]["utilization_pct"] = 0
        ul = d["under_load"]
        for k in ("busy_before", "busy_after"):
            ul[k] = {"utilization_pct": 0, "utilization_samples": [0] * 5, "processes": [],
                     "window_s": 0.5, "own_pid": ul[k]["own_pid"]}
    (root / "gpu.json").write_text(json.dumps(g))
    rep, code = replay(root)
    slow = gate(rep, "gpu.slow-state")
    assert slow["verdict"] == "FAIL" and code == 2, slow
    assert gate(rep, "gpu.processes")["verdict"] == "PASS"
