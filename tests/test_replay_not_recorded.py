"""On a replay, a figure the snapshot simply does not hold is SKIP "not recorded in the snapshot",
not a WARN about the live NVML/CUDA library; a capture that notes the read failed keeps the WARN;
a live run keeps it too. A mask that was never read is no "no reason bit" PASS."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from afddiag.cli import run
from afddiag.gates import Context, gpu, resolve_fabric_ip
from afddiag.model.gpu import gpu_facts_from_readings
from afddiag.model.run import Inputs, Observation
from afddiag.playbook import load as load_playbook
from conftest import case_dirs

H200 = next(c for c in case_dirs("gpu") if c.name.startswith("06-"))


def readings() -> dict:
    return json.loads((H200 / "gpu.json").read_text())


def report(snap, *args) -> tuple[int, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run(["gpu", "--json", "--no-history", "--snapshot", str(snap), *args])
    return code, {g["id"]: g for g in json.loads(buf.getvalue())["gates"]}


def snap_of(tmp_path, r) -> str:
    d = tmp_path / "s"
    d.mkdir(exist_ok=True)
    (d / "gpu.json").write_text(json.dumps(r))
    return str(d)


def test_healthy_h200_replay_as_coordinator_is_not_a_warning():
    code, g = report(H200, "--role", "coordinator")
    assert g["gpu.memory"]["verdict"] == "SKIP", g["gpu.memory"]
    assert "not recorded in the snapshot" in g["gpu.memory"]["summary"]
    assert "NVML library" not in g["gpu.memory"]["remedy"]
    assert code == 0 and not [i for i, v in g.items() if v["verdict"] in ("WARN", "FAIL", "ERROR")]


def test_expert_reservation_on_a_replay_without_free_memory_is_skip():
    _, g = report(H200, "--role", "expert")
    assert g["gpu.headroom"]["verdict"] == "SKIP" and "not recorded in the snapshot" in g["gpu.headroom"]["summary"]


def test_a_capture_that_notes_the_failed_read_keeps_the_warning(tmp_path):
    r = readings()
    r["notes"] = ["NVML device 0: nvmlDeviceGetMemoryInfo failed: NVMLError_Unknown: Unknown Error"]
    _, g = report(snap_of(tmp_path, r), "--role", "coordinator")
    assert g["gpu.memory"]["verdict"] == "WARN" and "NVMLError_Unknown" in g["gpu.memory"]["summary"]


def test_live_unreadable_free_memory_still_warns():
    facts = gpu_facts_from_readings(readings())
    obs = Observation("h", "live", gpu=facts)
    v = gpu.memory(Context(obs, Inputs(playbook=load_playbook("coordinator")), resolve_fabric_ip(None, None)))
    assert v.verdict == "WARN" and "free memory not read" in v.summary


def test_sm_count_not_recorded_is_skip_on_replay(tmp_path):
    r = readings()
    r["devices"][0]["cuda"] = None
    _, g = report(snap_of(tmp_path, r), "--expect-sm", "132")
    assert g["gpu.sm-count"]["verdict"] == "SKIP" and "SM count not recorded" in g["gpu.sm-count"]["summary"]


@pytest.mark.parametrize("source", ["live", "snapshot /x"])
def test_unread_clock_event_reasons_are_no_pass(source):
    r = readings()
    r["devices"][0]["nvml"]["clocks_event_reasons"] = None
    r["devices"][0]["under_load"]["clocks_event_reasons"] = None
    obs = Observation("h", source, gpu=gpu_facts_from_readings(r))
    v = gpu.clock_events(Context(obs, Inputs(), resolve_fabric_ip(None, None)))
    assert v.verdict == "SKIP" and "no thermal" not in v.summary, v.summary
    assert ("not recorded in the snapshot" in v.summary) == source.startswith("snapshot")
