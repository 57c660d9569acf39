"""The DGX Spark CX-7 hot-plug (issue 24 item 1): the NIC probe on fake sysfs trees and kernel logs, its
capture and replay, ``fabric.cx7-hotplug``'s verdicts, and the no-RDMA-device path saying "no cable"
(the root, a cabling remedy) instead of "load the driver" on a Spark whose CX-7 is powered off.

Kernel-log lines are as a Spark prints them (NVIDIA/NemoClaw issue 8520's dmesg excerpt; the driver's
strings from NV-Kernels PR 271's mtk-pcie-hotplug.c)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from afddiag.capture import collect_bundle
from afddiag.model.fabric import FabricFacts
from afddiag.model.nic import NicFacts, hotplug_events
from afddiag.model.pair import BandwidthRun, PairFacts, PortCounters
from afddiag.model.run import Inputs, Observation
from afddiag.playbook import Playbook
from afddiag.probes import nic as nicprobe
from afddiag.probes.registry import Run, Sources
from afddiag.runner import diagnose
from afddiag.verdict import FAIL, PASS, SKIP, WARN
from conftest import case_dirs
from fakes import judge, observation

RDMA = Playbook(name="expert", requires=["rdma"])
PLUG = [
    "[ 812.340001] cx7-pcie-hotplug MTKP0001:00: Cable plugin",
    "[ 816.100000] mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged",
    "[ 816.200000] mlx5_core 0000:01:00.0 enp1s0f0np0: Link up",
]
REMOVAL = ["[ 900.000000] cx7-pcie-hotplug MTKP0001:00: Cable removal"]
FUNCS = [{"bdf": f"000{d}:01:00.{f}", "device": "0x1021", "driver": "mlx5_core"} for d in (0, 2) for f in (0, 1)]


def spark_tree(root: Path, enabled="1", debug="0", functions=(), legacy=None) -> Path:
    """A Spark's sysfs as the hot-plug driver leaves it: the MTKP0001 device and the Mellanox functions present."""
    plat = root / "sys/devices/platform/MTKP0001:00"
    (plat / "pcie_hotplug").mkdir(parents=True)
    (plat / "pcie_hotplug/hotplug_enabled").write_text(enabled + "\n")
    (plat / "pcie_hotplug/debug_state").write_text(debug + "\n")
    if legacy is not None:
        (plat / "cx7_dbg").mkdir()
        (plat / "cx7_dbg/plugin").write_text(legacy + "\n")
    pci = root / "sys/bus/pci/devices"
    pci.mkdir(parents=True)
    (root / "drivers/mlx5_core").mkdir(parents=True)
    for bdf in ["0000:00:00.0", *functions]:
        d = pci / bdf
        d.mkdir()
        (d / "vendor").write_text("0x15b3\n" if bdf in functions else "0x10de\n")
        (d / "device").write_text("0x1021\n")
        if bdf in functions:
            os.symlink(root / "drivers/mlx5_core", d / "driver")
    return root


def read_facts(root: Path, log: list[str] | None = None) -> NicFacts:
    src = Sources(root=str(root), kernel_log=(lambda: "\n".join(log)) if log is not None else None)
    run = Run(Inputs(), Observation("h", "live"), host=src)

    class Progress:
        doing = ""

    return nicprobe.PROBE.facts(run, nicprobe.PROBE.read(run, Progress()), Progress())["nic"]


def nic(**kw) -> NicFacts:
    base = dict(hotplug_driver=True, hotplug_enabled=1, debug_state=1, functions=FUNCS, kernel_lines=[],
                kernel_source="/dev/kmsg")
    return NicFacts(**{**base, **kw})


def hp(n: NicFacts, fabric: FabricFacts | None = None, **kw):
    return judge("fabric.cx7-hotplug", observation(nic=n, fabric=fabric or FabricFacts()), **kw)


# ---------------------------------------------------------------- the probe


def test_probe_reads_the_hotplug_attributes_and_mellanox_functions(tmp_path):
    f = read_facts(spark_tree(tmp_path, functions=("0000:01:00.0", "0002:01:00.1")), PLUG + ["[1.0] usb 1-1: new"])
    assert (f.hotplug_driver, f.hotplug_enabled, f.debug_state, f.legacy_plugin) == (True, 1, 0, None)
    assert f.functions == [{"bdf": "0000:01:00.0", "device": "0x1021", "driver": "mlx5_core"},
                           {"bdf": "0002:01:00.1", "device": "0x1021", "driver": "mlx5_core"}]
    assert f.kernel_lines == PLUG  # only the NIC's lines are kept
    assert [e["event"] for e in hotplug_events(f.kernel_lines)] == ["plugin", "module-plugged"]
    assert hotplug_events(f.kernel_lines)[0]["seconds"] == pytest.approx(812.340001)


def test_probe_reads_the_older_drivers_plugin_attribute_and_never_writes(tmp_path):
    root = spark_tree(tmp_path, legacy="0")
    before = {p: (p.stat().st_mtime_ns, p.read_text()) for p in root.rglob("*") if p.is_file()}
    f = read_facts(root)
    assert f.legacy_plugin == 0 and f.functions == [] and f.kernel_lines is None
    assert {p: (p.stat().st_mtime_ns, p.read_text()) for p in root.rglob("*") if p.is_file()} == before


def test_a_tree_without_the_hotplug_device_or_pci_is_not_captured(tmp_path):
    f = read_facts(tmp_path)
    assert not f.captured and f.notes == ["sysfs not read"]


def test_kernel_log_reader_keeps_nic_lines_of_a_saved_log_and_bounds_it(tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join(["[0.1] x86: noise"] * 5000 + PLUG + REMOVAL) + "\n")
    lines, source, notes = nicprobe.read_kernel_lines(str(log))
    assert lines == PLUG + REMOVAL and source == str(log) and notes == []
    lines, _, notes = nicprobe.read_kernel_lines(str(log), max_bytes=len(PLUG[2]) + len(REMOVAL[0]) + 2 + 5)
    assert lines == PLUG[2:] + REMOVAL and "read its last" in notes[0]  # the cut line is dropped
    lines, source, _ = nicprobe.read_kernel_lines(str(tmp_path / "absent"))
    assert lines is None and source.startswith("not readable:")


def test_capture_then_replay_gives_the_same_facts(tmp_path):
    root = spark_tree(tmp_path / "host", debug="1", functions=("0000:01:00.0",))
    files, _host, _notes = collect_bundle(Sources(root=str(root), kernel_log=lambda: "\n".join(PLUG + REMOVAL)))
    assert "nic.json" in files and files["kernel-nic.log"].decode().splitlines() == PLUG + REMOVAL
    snap = tmp_path / "snap"
    for rel, data in files.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
    _rep, obs = diagnose(Inputs(snapshot=str(snap), families=frozenset({"fabric"})))
    live = read_facts(root, PLUG + REMOVAL)
    assert (obs.nic.hotplug_enabled, obs.nic.debug_state, obs.nic.functions, obs.nic.kernel_lines) == \
        (live.hotplug_enabled, live.debug_state, live.functions, live.kernel_lines)
    assert obs.nic.kernel_source == "snapshot kernel-nic.log"


def test_replay_reads_a_saved_dmesg_when_the_capture_has_no_nic_log(tmp_path):
    snap = tmp_path / "snap"
    (snap / "sys/class").mkdir(parents=True)  # the fabric looked at: no RDMA device listed
    (snap / "nic.json").write_text('{"hotplug_driver": true, "hotplug_enabled": 1, "debug_state": 1, "functions": []}')
    (snap / "dmesg.txt").write_text("\n".join(PLUG + REMOVAL) + "\n")
    rep, obs = diagnose(Inputs(snapshot=str(snap), families=frozenset({"fabric"}), playbook=RDMA))
    assert obs.nic.kernel_source == "snapshot dmesg.txt"
    got = {g["id"]: g for g in rep["gates"]}
    assert got["fabric.cx7-hotplug"]["verdict"] == FAIL and "Cable removal" in got["fabric.cx7-hotplug"]["summary"]
    assert got["fabric.rdma-present"]["verdict"] == SKIP
    assert "load" not in got["fabric.rdma-present"]["remedy"].split("Do not")[0].lower()


# ---------------------------------------------------------------- fabric.cx7-hotplug


@pytest.mark.parametrize("lines, debug, legacy", [
    ([], 0, None),            # no cable when the driver started, no event since
    (None, 0, None),          # the same, kernel log not read
    ([], None, 0),            # an older kernel: cx7_dbg/plugin 0
    (PLUG + REMOVAL, 1, None),  # plugged, then removed: the last event decides
])
def test_no_cable_is_the_root_with_the_cabling_remedy(lines, debug, legacy):
    v = hp(nic(functions=[], kernel_lines=lines, debug_state=debug, legacy_plugin=legacy), playbook=RDMA)
    assert (v.verdict, v.action) == (FAIL, "FIX_LINK")
    assert "no cable in the CX-7's QSFP cage" in v.summary and "cable" in v.remedy
    assert "never write" in v.remedy


def test_no_cable_warns_when_only_a_fabric_ip_was_given_and_skips_in_the_generic_role():
    n = nic(functions=[], debug_state=0)
    assert (hp(n, fabric_ip="10.0.0.1").verdict, hp(n, fabric_ip="10.0.0.1").action) == (WARN, "FIX_LINK")
    assert hp(n).verdict == SKIP and "no cable" in hp(n).summary


@pytest.mark.parametrize("lines, debug", [(PLUG, 0), ([], 1), (REMOVAL + PLUG, 0)])
def test_absent_functions_after_a_cable_was_seen_is_not_called_no_cable(lines, debug):
    v = hp(nic(functions=[], kernel_lines=lines, debug_state=debug), playbook=RDMA)
    assert v.verdict == WARN and "did not finish" in v.summary and "Rescan failed" in v.remedy


def test_functions_present_pass_and_name_a_hotplug_bringup():
    assert hp(nic()).verdict == PASS and "hot-plug event" not in hp(nic()).summary
    v = hp(nic(kernel_lines=PLUG))
    assert v.verdict == PASS and "came up after a hot-plug event" in v.summary and "812.3 s" in v.summary


@pytest.mark.parametrize("n, verdict, words", [
    (nic(hotplug_driver=False), SKIP, "no CX-7 hot-plug driver"),
    (nic(hotplug_enabled=None), SKIP, "hotplug_enabled not read"),
    (nic(functions=None), SKIP, "PCI functions not read"),
    (nic(hotplug_enabled=0), PASS, "hot-plug disabled"),
    (nic(hotplug_enabled=0, functions=[], debug_state=0), SKIP, "not the hot-plug driver's doing"),
    (NicFacts(captured=False, notes=["NIC hot-plug state not captured"]), SKIP, "not captured"),
])
def test_other_states(n, verdict, words):
    v = hp(n, playbook=RDMA)
    assert v.verdict == verdict and words in v.summary


def test_a_failed_probe_is_error():
    assert hp(NicFacts(captured=False, failed="NIC probe timed out")).verdict == "ERROR"


# ---------------------------------------------------------------- the no-RDMA-device path


def test_no_device_path_says_no_cable_not_load_the_driver():
    unplugged = nic(functions=[], debug_state=0)
    for gid in ("fabric.rdma-present", "fabric.link"):
        v = judge(gid, observation(fabric=FabricFacts(), nic=unplugged), playbook=RDMA, fabric_ip="10.0.0.1")
        assert v.verdict == SKIP and v.action != "LOAD_DRIVER"
        assert "no cable" in v.summary and "fabric.cx7-hotplug" in v.summary
    # the same host with the hot-plug driver disabled, or a cable seen: still the driver's remedy
    for other in (nic(functions=[], debug_state=0, hotplug_enabled=0), nic(functions=[], debug_state=1), None):
        v = judge("fabric.rdma-present", observation(fabric=FabricFacts(), nic=other), playbook=RDMA)
        assert (v.verdict, v.action) == (FAIL, "LOAD_DRIVER")


def test_a_stale_rail_that_came_up_after_a_hotplug_event_says_so():
    bw = BandwidthRun(seconds_asked=5.0, size=1048576, qps=4, depth=8, stage="done", seconds=5.0, gbps=13.2,
                      verified=True, bytes=int(13.2e9 * 5 / 8), counters=[PortCounters(read=True, device="mlx5_0",
                                                                                      port=1, delta={})])
    stale = PairFacts(role="client", peer="10.0.0.2:18515", device="mlx5_0", port=1, fabric_ip="10.0.0.1",
                      netdev="enp1", link_speed_mbps=200000, mode="bandwidth", bandwidth=bw)
    for lines, said in ((PLUG, True), ([], False)):
        v = judge("fabric.rail-bandwidth", observation(pair=stale, nic=nic(kernel_lines=lines)), playbook=Playbook(
            name="expert", rail_healthy_gbps=80, rail_stale_init_gbps=(8.0, 25.0), rail_fail_below_gbps=8,
            link_speed_mbps=200000))
        assert (v.verdict, v.action) == (FAIL, "REBOOT")
        assert ("came up after a hot-plug event" in v.summary) is said


def test_the_pair_test_stops_on_no_cable_not_on_load_the_driver():
    from afddiag.pairtest import judge_pair
    from afddiag.probes.pair import format_pair, pair

    unplugged = nic(functions=[], debug_state=0)
    f = pair("127.0.0.1", port=1, fabric_ip="192.0.2.77", fabric=FabricFacts(), timeout_s=5, nic=unplugged)
    assert f.local_error and f.local_error.startswith("no RDMA device on this host: its CX-7 is powered off")
    assert "load the" not in f.local_error and "fabric.cx7-hotplug" in format_pair(f)
    plain = pair("127.0.0.1", port=1, fabric_ip="192.0.2.77", fabric=FabricFacts(), timeout_s=5,
                 nic=nic(functions=[], debug_state=1))
    assert plain.local_error and "load the RDMA driver" in plain.local_error  # a cable was seen: not "no cable"
    f.bandwidth = BandwidthRun(seconds_asked=1.0, stage="handshake")
    rep = judge_pair(Inputs(), FabricFacts(), json.loads(json.dumps(f, default=vars)), unplugged)
    got = {g["id"]: (g["verdict"], g["action"]) for g in rep["gates"]}
    assert got["fabric.cx7-hotplug"] == (FAIL, "FIX_LINK") and got["fabric.rdma-present"][0] == SKIP


# ---------------------------------------------------------------- the healthy Spark capture


@pytest.mark.parametrize("case", [c for c in case_dirs("fabric") if "spark" in c.name and "healthy" in c.name])
def test_healthy_spark_capture_never_warns_or_fails(case):
    rep, _ = diagnose(Inputs(snapshot=str(case), families=frozenset({"fabric"})))
    v = next(g for g in rep["gates"] if g["id"] == "fabric.cx7-hotplug")
    assert v["verdict"] in (PASS, SKIP), v
