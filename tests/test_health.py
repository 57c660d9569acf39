"""GPU health and slow-state judgement: baselines and their precedence, gpu.errors, gpu.processes,
host.cpu-clock, and the --load / baseline commands with the probes replaced by recorded figures."""

import json

import pytest
from click.testing import CliRunner

from afddiag import baseline
from afddiag.cli import cli
from afddiag.gates import Context, gpu, host, resolve_fabric_ip
from afddiag.model.gpu import GpuDevice, GpuFacts, UnderLoad
from afddiag.model.run import Inputs, Observation
from afddiag.playbook import load as load_playbook
from conftest import REPO

FIX = REPO / "tests" / "fixtures" / "gpu"
PROBE = json.loads((REPO / "benchmarks" / "results" / "h200-load-probe.json").read_text())


def ctx(obs, role=None):
    return Context(obs, Inputs(playbook=load_playbook(role) if role else None), resolve_fabric_ip(None, None))


def dev(**kw):
    base = dict(index=0, name="NVIDIA H200", uuid="GPU-1", clock_sm_max_mhz=1980.0, memory_total_bytes=1)
    base.update(kw)
    return GpuDevice(**base)


def obs_with(*devices, host_baseline=None, snap_baseline=None, **gpu_kw):
    o = Observation("h", "test", gpu=GpuFacts(available=True, devices=list(devices), baseline=snap_baseline, **gpu_kw))
    o.baseline = host_baseline
    return o


def test_baseline_precedence_host_then_snapshot_then_reference():
    ul = UnderLoad(clock_sm_mhz=1980, utilization_pct=100, fp32_tflops=40.0)
    host_b = {"path": "/x", "recorded_at": "t", "gpus": {"GPU-1": {"fp32_tflops": 41.0}}}
    v = gpu.slow_state(ctx(obs_with(dev(under_load=ul), host_baseline=host_b, snap_baseline={"fp32_tflops": 80.0})))
    assert v.verdict == "PASS" and v.facts["0"]["baseline_source"].startswith("host baseline")
    v = gpu.slow_state(ctx(obs_with(dev(under_load=ul), snap_baseline={"fp32_tflops": 80.0})))
    assert v.verdict == "FAIL" and "class B" in v.summary
    v = gpu.slow_state(ctx(obs_with(dev(under_load=ul))))  # the reference table: H200 64.8 TFLOP/s
    assert v.verdict == "FAIL" and v.facts["0"]["baseline_source"].startswith("reference table for NVIDIA H200")
    other = dev(uuid="GPU-2", under_load=ul)  # the host baseline is for another GPU: not used
    v = gpu.slow_state(ctx(obs_with(other, host_baseline=host_b)))
    assert v.facts["0"]["baseline_source"].startswith("reference table")


def test_load_probe_failure_is_inconclusive_not_pass():
    v = gpu.slow_state(ctx(obs_with(dev(load_why="cuMemAlloc: out of memory"))))
    assert v.verdict == "WARN" and "out of memory" in v.summary


def test_gb10_class_a_against_reference_without_any_baseline():
    d = dev(name="NVIDIA GB10", uuid="GPU-9", clock_sm_max_mhz=None,
            under_load=UnderLoad(clock_sm_mhz=799, power_mw=19500, utilization_pct=100))
    v = gpu.slow_state(ctx(obs_with(d)))
    assert v.verdict == "FAIL" and "class A" in v.summary and "2395" in v.summary


def test_record_and_show_round_trip(tmp_path):
    readings = {"driver_version": "580.159.04", "versions": {"kernel": "6.1"},
                "devices": [{"uuid": "GPU-1", "name": "NVIDIA H200", "under_load": PROBE},
                            {"uuid": "GPU-2", "name": "x", "under_load": {"why": "no libcuda"}}]}
    p = baseline.record(readings, {"loop_mops": 6.0}, "h", tmp_path / "b.json")
    data, why = baseline.load(p)
    assert why == "" and list(data["gpus"]) == ["GPU-1"]
    assert data["gpus"]["GPU-1"]["bf16_tflops"] == PROBE["achieved"]["bf16_tflops"]
    assert data["gpus"]["GPU-1"]["clock_sm_mhz_under_load"] == PROBE["clock_sm_mhz"]
    assert data["versions"] == {"driver": "580.159.04", "kernel": "6.1"} and data["cpu"] == {"loop_mops": 6.0}
    with pytest.raises(ValueError):
        baseline.record({"devices": []}, None, "h", tmp_path / "c.json")
    (tmp_path / "bad.json").write_text("{")
    assert baseline.load(tmp_path / "bad.json")[0] is None
    res = CliRunner().invoke(cli, ["baseline", "show", "--path", str(p)], standalone_mode=False)
    assert res.return_value == 0 and "GPU-1" in res.stdout and "bf16_tflops=648.0" in res.stdout
    res = CliRunner().invoke(cli, ["baseline", "show", "--path", str(tmp_path / "none.json")], standalone_mode=False)
    assert res.return_value == 1 and "no baseline recorded" in res.stderr


def test_gpu_load_flag_attaches_probe_by_uuid(monkeypatch, tmp_path):
    idle = json.loads((FIX / "h200-live-idle" / "gpu.json").read_text())
    uuid = idle["devices"][0]["uuid"]
    slow = json.loads(json.dumps(PROBE))
    slow["device"]["uuid"] = uuid
    slow["achieved"]["bf16_tflops"] = 648.0 / 1.5  # class B: matmul 1.5x below the reference
    monkeypatch.setattr("afddiag.probes.gpu.read_gpu", lambda timeout_s=10.0, **kw: json.loads(json.dumps(idle)))
    monkeypatch.setattr("afddiag.probes.load.run_load_probe", lambda i, budget_s=3.0: slow)
    res = CliRunner().invoke(cli, ["gpu", "--json", "--load"], standalone_mode=False, catch_exceptions=False)
    g = {x["id"]: x for x in json.loads(res.stdout)["gates"]}
    assert g["gpu.slow-state"]["verdict"] == "FAIL" and "class B: bf16_tflops" in g["gpu.slow-state"]["summary"]
    # without --load the idle reading is never judged
    res = CliRunner().invoke(cli, ["gpu", "--json"], standalone_mode=False, catch_exceptions=False)
    assert {x["id"]: x for x in json.loads(res.stdout)["gates"]}["gpu.slow-state"]["verdict"] == "SKIP"


ECC_OK = {"mode_current": True, "volatile": {"corrected": 3, "uncorrected": 0},
          "aggregate": {"corrected": 10, "uncorrected": 0}}


@pytest.mark.parametrize("kw,xids,verdict,words", [
    (dict(ecc=ECC_OK, remapped_rows={"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}),
     [], "PASS", "no Xid"),
    (dict(ecc={**ECC_OK, "volatile": {"corrected": 0, "uncorrected": 2}}), [], "FAIL", "2 uncorrected ECC"),
    (dict(ecc={**ECC_OK, "aggregate": {"corrected": 0, "uncorrected": 1}}), [], "WARN", "over its lifetime"),
    (dict(remapped_rows={"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}), [], "FAIL",
     "row remapping pending"),
    (dict(ecc="NOT_SUPPORTED", retired_pages="NOT_SUPPORTED", remapped_rows="NOT_SUPPORTED"), [], "PASS",
     "N/A on this GPU: not a fault"),
    (dict(ecc=ECC_OK), [{"xid": 79, "pci": "0000:01:00", "text": "fallen off the bus"}], "FAIL", "Xid 79"),
    (dict(ecc=ECC_OK), [{"xid": 13, "pci": "0000:01:00", "text": "Graphics Exception"}], "WARN", "Xid 13"),
    (dict(), None, "SKIP", "not captured"),
])
def test_gpu_errors(kw, xids, verdict, words):
    v = gpu.errors(ctx(obs_with(dev(**kw), xid_events=xids, xid_source="/dev/kmsg" if xids is not None else None)))
    assert v.verdict == verdict and words in v.summary, v.summary


@pytest.mark.parametrize("rows,xids,action", [
    ({"correctable": 0, "uncorrectable": 512, "pending": False, "failure": True},
     [{"xid": 64, "pci": "0000:b3:00", "text": "Row Remapper Error: Failed to remap row"}], "HW_INSPECTION"),
    ({"correctable": 0, "uncorrectable": 512, "pending": False, "failure": True},
     [{"xid": 79, "pci": "0000:b3:00", "text": "GPU has fallen off the bus."}], "HW_INSPECTION"),
    ({"correctable": 0, "uncorrectable": 1, "pending": True, "failure": False}, [], "RESET_GPU"),
])
def test_gpu_errors_row_remap_failure_is_service_not_a_reset(rows, xids, action):
    """No spare rows left (the remap failure flag, NVIDIA's RMA threshold): drain for service
    (HW_INSPECTION), never a GPU reset that cannot restore them; a pending remap is still a reset."""
    v = gpu.errors(ctx(obs_with(dev(ecc=ECC_OK, remapped_rows=rows), xid_events=xids, xid_source="/dev/kmsg")))
    assert v.verdict == "FAIL" and v.action == action, (v.action, v.summary)
    if action == "HW_INSPECTION":
        assert "RMA" in v.remedy and "does not restore spare rows" in v.remedy


def test_gpu_processes_fail_only_where_memory_is_reserved():
    procs = [{"pid": 4242, "name": "python3", "used_bytes": 2 << 30, "type": "compute"}]
    v = gpu.processes(ctx(obs_with(dev(processes=procs))))
    assert v.verdict == "WARN" and "pid 4242 python3 2.00 GiB" in v.summary
    v = gpu.processes(ctx(obs_with(dev(processes=procs)), role="coordinator"))
    assert v.verdict == "FAIL" and "97% memory reservation" in v.summary
    assert gpu.processes(ctx(obs_with(dev(processes=[])))).verdict == "PASS"
    assert gpu.processes(ctx(obs_with(dev(processes="NOT_SUPPORTED")))).verdict == "SKIP"


@pytest.mark.parametrize("procs,own,verdict", [
    ([{"pid": 4242, "name": "afddiag", "used_bytes": 1 << 29, "type": "compute"}], 4242, "PASS"),
    ([{"pid": 4242, "name": "python3", "used_bytes": 1 << 29, "type": "compute"}], 4242, "PASS"),
    ([{"pid": 5151, "name": "afddiag-old", "used_bytes": 1 << 29, "type": "compute"}], 4242, "PASS"),
    ([{"pid": 4242, "name": "afddiag", "used_bytes": 1 << 29, "type": "compute"},
      {"pid": 77, "name": "python3", "used_bytes": 1 << 30, "type": "compute"}], 4242, "FAIL"),
    ([{"pid": 4242, "name": "python3", "used_bytes": 1 << 29, "type": "compute"}], 1, "FAIL"),
])
def test_gpu_processes_leave_out_afddiag_itself(procs, own, verdict):
    """The CUDA context afddiag opens to read the SM count is listed by NVML like any other; it is
    not another tenant (it exits before the engine starts): only the others count."""
    v = gpu.processes(ctx(obs_with(dev(processes=procs), probe_pid=own), role="coordinator"))
    assert v.verdict == verdict, v.summary
    if verdict == "PASS":
        assert "afddiag's own context left out" in v.summary
    else:
        assert "pid 77 python3" in v.summary or own == 1
        assert "afddiag " not in v.summary


@pytest.mark.parametrize("role", ["coordinator", "expert", None])
def test_gpu_processes_display_server_is_not_a_tenant(role):
    """Xorg and gnome-shell (NVML graphics processes) on a desktop Spark or a workstation coordinator
    are named but not counted: the memory they hold is in the free figure the memory gates judge; a
    compute process beside them is still another tenant."""
    gfx = [{"pid": 1804, "name": "Xorg", "used_bytes": 180 << 20, "type": "graphics"},
           {"pid": 2090, "name": "gnome-shell", "used_bytes": 60 << 20, "type": "graphics"}]
    v = gpu.processes(ctx(obs_with(dev(processes=gfx)), role=role))
    assert v.verdict == "PASS" and "not tenants: GPU 0 NVIDIA H200: pid 1804 Xorg 0.18 GiB" in v.summary, v.summary
    job = {"pid": 3311, "name": "python3", "used_bytes": 24 << 30, "type": "compute"}
    v = gpu.processes(ctx(obs_with(dev(processes=gfx + [job])), role=role))
    assert v.verdict == ("WARN" if role is None else "FAIL") and "pid 3311 python3" in v.summary
    assert "Xorg" not in v.summary


COOL = [{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 54.0, "trip_c": 95.0}]


@pytest.mark.parametrize("cpu,base,role,verdict", [
    ({"model": "Cortex-X925", "under_load_mhz": 3900, "max_mhz": 3900, "loop_mops": 10.0}, None, "expert", "PASS"),
    # stuck low with throttling ruled out (ARM: a thermal zone read cool, no throttle counters)
    ({"model": "Cortex-X925", "under_load_mhz": 1800, "max_mhz": 3900, "loop_mops": 10.0, "thermal_zones": COOL}, None,
     "expert", "FAIL"),
    ({"model": "Cortex-X925", "under_load_mhz": 1800, "max_mhz": 3900, "loop_mops": 10.0, "thermal_zones": COOL}, None,
     None, "FAIL"),
    ({"model": "Cortex-X925", "under_load_mhz": 2100, "max_mhz": 3900, "loop_mops": 10.0}, None, None, "PASS"),
    # a loop timing alone (no clock to corroborate it) is a WARN RERUN, never a FAIL with a power cycle
    ({"model": "vCPU", "under_load_mhz": None, "max_mhz": None, "loop_mops": 7.9}, {"loop_mops": 10.0}, None, "WARN"),
    ({"model": "vCPU", "under_load_mhz": None, "max_mhz": None, "loop_mops": 8.0}, {"loop_mops": 10.0}, None, "PASS"),
    ({"model": "vCPU", "under_load_mhz": None, "max_mhz": None, "loop_mops": 8.0}, None, None, "SKIP"),
])
def test_host_cpu_clock(cpu, base, role, verdict):
    o = Observation("h", "test", cpu=cpu)
    o.baseline = {"cpu": base} if base else None
    assert host.cpu_clock(ctx(o, role)).verdict == verdict
