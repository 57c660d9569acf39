"""GPU gates on readings recorded on the lent H200 (tests/fixtures/gpu, see its README)."""

import copy
import json
import shutil

import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from conftest import CASES, REPO

FIX = REPO / "tests" / "fixtures" / "gpu"


def gates(snapshot, *extra):
    res = CliRunner().invoke(cli, ["gpu", "--json", "--snapshot", str(snapshot), *extra], standalone_mode=False,
                             catch_exceptions=False)
    rep = json.loads(res.stdout)
    return {g["id"]: g for g in rep["gates"]}


def test_h200_idle_recording():
    g = gates(FIX / "h200-live-idle", "--expect-sm", "132")
    assert g["gpu.present"]["verdict"] == "PASS" and "132 SMs, cc 9.0" in g["gpu.present"]["summary"]
    assert g["gpu.sm-count"]["verdict"] == "PASS"
    assert g["gpu.memory"]["facts"]["0"]["total_bytes"] == 150754820096
    # idle: 345 MHz with only the idle bit is low by design, never judged as a slow state
    assert g["gpu.clock-events"]["verdict"] == "PASS"
    assert g["gpu.slow-state"]["verdict"] == "SKIP"


def test_h200_under_load_recording_passes_with_power_cap_bit():
    g = gates(FIX / "h200-live-load")
    assert g.pop("gpu.image-arch")["verdict"] == "SKIP"  # no image given
    assert g.pop("gpu.errors")["verdict"] == "SKIP"  # recorded before the probe read ECC and the kernel log
    assert g.pop("gpu.processes")["verdict"] == "SKIP"
    assert g.pop("gpu.headroom")["verdict"] == "SKIP"  # the generic role plans no reservation
    assert all(v["verdict"] == "PASS" for v in g.values()), {k: v["summary"] for k, v in g.items()}
    assert "sw_power_cap" in g["gpu.clock-events"]["summary"]  # seen under bf16 load, not a fault


@pytest.mark.parametrize("field,scale,verdict,words", [
    ("bf16_tflops", 1 / 1.5, "FAIL", "class B"),  # matmul 1.5x below baseline with a normal clock
    ("copy_gbps", 0.95, "PASS", None),
    # class A is a low clock at low power: the recording's clock and power both scaled
    (("clock_sm_mhz", "power_mw"), 0.4, "FAIL", "class A"),
    # the clock alone scaled: the recording draws 95 % of its 700 W limit with SW power capping set,
    # so the limiter explains a low clock: WARN, no AC power cycle
    ("clock_sm_mhz", 0.4, "WARN", "enforced power limit"),
])
def test_derived_slow_state_fixtures(tmp_path, field, scale, verdict, words):
    r = json.loads((FIX / "h200-live-load" / "gpu.json").read_text())
    bad = copy.deepcopy(r)
    ul = bad["devices"][0]["under_load"]
    for name in (field if isinstance(field, tuple) else (field,)):
        if name in ul:
            ul[name] = ul[name] * scale
        else:
            ul["achieved"][name] = ul["achieved"][name] * scale
    (tmp_path / "gpu.json").write_text(json.dumps(bad))
    v = gates(tmp_path)["gpu.slow-state"]
    assert v["verdict"] == verdict, v["summary"]
    if words:
        assert words in v["summary"]
        assert (v["action"] == "AC_POWER_CYCLE") == (verdict == "FAIL"), (v["action"], v["remedy"])
        assert ("AC removal" in v["remedy"]) == (verdict == "FAIL"), v["remedy"]


def test_h200_busy_recording_names_the_other_process():
    g = gates(FIX / "h200-live-busy", "--role", "coordinator")
    assert g["gpu.processes"]["verdict"] == "FAIL"
    assert "python3" in g["gpu.processes"]["summary"] and "97% memory reservation" in g["gpu.processes"]["summary"]
    assert g["gpu.errors"]["verdict"] == "PASS" and "retired_pages N/A" in g["gpu.errors"]["summary"]
    assert gates(FIX / "h200-live-busy")["gpu.processes"]["verdict"] == "WARN"  # generic role: no reservation


def test_xid_log_flag_feeds_gpu_errors(tmp_path, monkeypatch):
    log = tmp_path / "dmesg.txt"
    log.write_text("[ 12.3] NVRM: Xid (PCI:0000:01:00): 79, pid=1234, GPU has fallen off the bus.\n")
    seen = {}

    def fake_read_gpu(timeout_s=10.0, xid_log=None, **kw):
        seen["xid_log"] = xid_log
        from afddiag.probes.gpu import parse_xid_lines

        r = json.loads((FIX / "h200-live-busy" / "gpu.json").read_text())
        r["xid_events"], r["xid_source"] = parse_xid_lines(open(xid_log).read().splitlines()), xid_log
        return r

    monkeypatch.setattr("afddiag.probes.gpu.read_gpu", fake_read_gpu)
    res = CliRunner().invoke(cli, ["gpu", "--json", "--xid-log", str(log)], standalone_mode=False,
                             catch_exceptions=False)
    g = {x["id"]: x for x in json.loads(res.stdout)["gates"]}
    assert seen["xid_log"] == str(log)
    assert g["gpu.errors"]["verdict"] == "FAIL" and "Xid 79" in g["gpu.errors"]["summary"]


def test_a_captured_kernel_log_spanning_reboots_asks_no_reset_for_this_boot(tmp_path):
    """A capture's kernel log holding an Xid 79 from before the last reboot: replayed, gpu.errors names it as
    an earlier boot's and asks for no reset or reboot now; the same line in this boot's log still FAILs."""
    snap = tmp_path / "snap"
    snap.mkdir()
    shutil.copy(CASES / "gpu" / "06-h200-healthy-measured" / "gpu.json", snap / "gpu.json")
    xid79 = "Nov 30 12:03:06 h kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=2291, GPU has fallen off the bus."
    two_boots = ["-- Boot 5b0f3c6a --", xid79, "-- Boot 0e1d2c3b --", "Dec 01 08:00:00 h kernel: ok"]
    for log, verdict in ((two_boots, "WARN"), (["-- Boot 0e1d2c3b --", xid79], "FAIL")):
        (snap / "journalctl-k.txt").write_text("\n".join(log) + "\n")
        res = CliRunner().invoke(cli, ["gpu", "--json", "--snapshot", str(snap)], standalone_mode=False,
                                 catch_exceptions=False)
        g = {x["id"]: x for x in json.loads(res.stdout)["gates"]}["gpu.errors"]
        assert g["verdict"] == verdict, g
        if verdict == "WARN":
            assert g["action"] == "NONE" and "in an earlier boot" in g["summary"]


# where each typed field of the readings lands in the facts, and a value of the wrong type for it
TYPED_FIELDS = [  # (path in the readings, attribute of GpuFacts or devices[0], a right value, a wrong one)
    (("driver_version",), "driver_version", "580.95.05", 580),
    (("xid_source",), "xid_source", "dmesg", ["dmesg"]),
    (("xid_events",), "xid_events", [], {"xid": 79}),
    (("cuda_view",), "cuda_view", {"sm": 132}, "132"),
    (("failed",), "failed", "timed out", True),
    (("load_failed",), "load_failed", "timed out", 1.0),
    (("versions",), "versions", {"kernel": "6.8"}, "6.8"),
    (("devices", 0, "name"), "0.name", "NVIDIA H200", 200),
    (("devices", 0, "uuid"), "0.uuid", "GPU-1", None),
    (("devices", 0, "pci_bus_id"), "0.pci_bus_id", "00000000:1B:00.0", 27),
    (("devices", 0, "cuda", "integrated"), "0.integrated", False, 0),
    (("devices", 0, "nvml", "ecc"), "0.ecc", "NOT_SUPPORTED", 0),
    (("devices", 0, "nvml", "processes"), "0.processes", [], {"pid": 1}),
    (("devices", 0, "nvml", "clocks_event_reason_counters_us"), "0.clocks_event_reason_counters_us", {}, [1]),
]


@pytest.mark.parametrize("path,attr,right,wrong", TYPED_FIELDS)
def test_a_reading_of_the_wrong_type_is_none_never_kept(path, attr, right, wrong):
    """gpu_facts_from_readings keeps a field of the recorded H200 readings when it has its type and
    leaves it None (versions: {}) when it has another: what the readings' shape cannot be trusted for."""
    from afddiag.model.gpu import gpu_facts_from_readings

    def facts_with(value):
        r = copy.deepcopy(json.loads((FIX / "h200-live-load" / "gpu.json").read_text()))
        node = r
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        f = gpu_facts_from_readings(r)
        obj, name = (f.devices[0], attr.split(".", 1)[1]) if "." in attr else (f, attr)
        return getattr(obj, name)

    assert facts_with(right) == right
    assert facts_with(wrong) == ({} if attr == "versions" else None)
