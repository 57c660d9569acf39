"""fabric.nic-kernel-log (issue 24 item 3): the NIC's kernel-log lines against checks/nic_kernel_log.toml.

The lines are as hosts printed them in public reports (gpud's syslog fixtures, the DGX Spark forum and
playbook reports, NVIDIA/NemoClaw issue 8520) or built from the driver's format strings where no report
quoted one (named in the catalog's ``source``). A healthy Spark's boot, 27 W slot-power lines included,
must pass."""

from __future__ import annotations

import pytest

from afddiag.gates.nic import LogCatalogError, log_catalog, validate_log_catalog
from afddiag.model.nic import NicFacts
from afddiag.model.run import Inputs
from afddiag.playbook import Playbook
from afddiag.runner import diagnose
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN
from conftest import case_dirs
from fakes import judge, observation
from snapfix import derive, fabric_case

#: A healthy DGX Spark boot's NIC lines: four 27 W slot-power lines, a hot-plug bring-up, cables plugged.
HEALTHY_BOOT = [
    "[    9.812345] mlx5_core 0000:01:00.0: mlx5_pcie_event:326:(pid 3202): Detected insufficient power on the "
    "PCIe slot (27W).",
    "[    9.912345] mlx5_core 0000:01:00.1: mlx5_pcie_event:326:(pid 3202): Detected insufficient power on the "
    "PCIe slot (27W).",
    "[   10.012345] mlx5_core 0002:01:00.0: mlx5_pcie_event:326:(pid 3202): Detected insufficient power on the "
    "PCIe slot (27W).",
    "[   10.112345] mlx5_core 0002:01:00.1: mlx5_pcie_event:326:(pid 3202): Detected insufficient power on the "
    "PCIe slot (27W).",
    "[   10.200000] mlx5_core 0002:01:00.0: 126.028 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x4 link)",
    "[  812.340001] cx7-pcie-hotplug MTKP0001:00: Cable plugin",
    "[  816.100000] mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged",
    "[  816.100100] mlx5_core 0002:01:00.0: Port module event: module 0, Cable plugged",
    "[  816.200000] mlx5_core 0000:01:00.0 enp1s0f0np0: Link up",
]

#: (line, verdict, action): one per fault entry of the catalog.
FAULTS = [
    ("[ 1201.0] mlx5_core 0000:01:00.0: mlx5_pci_err_detected Device state = 1 health sensors: 1 pci_status: 1. "
     "Enter, pci channel state = 2", FAIL, "REBOOT"),
    ("[   17.982092] mlx5_core 0000:41:00.0: poll_health:852:(pid 0): device's health compromised - reached miss "
     "count", FAIL, "REBOOT"),
    ("6,4021,131207025,-;mlx5_core 0000:41:00.0: poll_health:471:(pid 0): Fatal error 1 detected", FAIL, "REBOOT"),
    ("Oct 03 06:01:36 h kernel: mlx5_core 0000:61:00.1: mlx5_health_try_recover:381:(pid 1): health recovery flow "
     "aborted, PCI reads still not working", FAIL, "REBOOT"),
    ("[  300.1] mlx5_core 0000:01:00.0: Port module event[error]: module 0, Cable error, High Temperature",
     FAIL, "HW_INSPECTION"),
    ("[   51.227747] mlx5_core 0000:41:00.1: temp_warn:170:(pid 0): High temperature on sensors with bit set 0 1",
     WARN, "HW_INSPECTION"),
    ("[  300.2] mlx5_core 0000:01:00.0: Port module event[error]: module 0, Cable error, Bad or shorted "
     "cable/module", WARN, "FIX_LINK"),
    ("[   66.816635] mlx5_core 0000:03:00.0: wait_func:964:(pid 112): ENABLE_HCA(0x104) timeout. Will cause a leak "
     "of a command resource", WARN, "REBOOT"),
    ("[  77.0] mlx5_core 0000:01:00.0: cmd[3]: DESTROY_EQ(0x302) Async, timeout. Will cause a leak of a command "
     "resource", WARN, "REBOOT"),
    ("[  900.5] cx7-pcie-hotplug MTKP0001:00: Rescan failed: -110", WARN, "FIX_LINK"),
]
RDMA = Playbook(name="expert", requires=["rdma"])


def log(lines, **kw):
    return judge("fabric.nic-kernel-log", observation(nic=NicFacts(kernel_lines=lines, kernel_source="/dev/kmsg")),
                 **kw)


def test_a_healthy_spark_boot_passes_and_names_the_benign_lines():
    v = log(HEALTHY_BOOT)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert "spark-slot-power-27w x4" in v.summary and v.facts["matched"]["spark-slot-power-27w"]["verdict"] == "BENIGN"


@pytest.mark.parametrize("line, verdict, action", FAULTS)
def test_each_fault_line(line, verdict, action):
    v = log(HEALTHY_BOOT + [line])
    assert (v.verdict, v.action) == (verdict, action), v.summary
    assert "x1" in v.summary and v.remedy


def test_a_27w_line_is_benign_but_another_insufficient_power_reading_is_not_hidden_by_it():
    other = "[ 9.8] mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the " \
            "PCIe slot (25W)."
    v = log([other])
    assert v.verdict == PASS and "spark-slot-power-27w" not in v.facts["matched"]  # no catalog line: not judged


def test_fails_come_first_and_every_finding_is_named():
    v = log([FAULTS[7][0], FAULTS[1][0], FAULTS[5][0]])
    assert (v.verdict, v.action) == (FAIL, "REBOOT")
    assert v.summary.index("health-compromised") < v.summary.index("cmd-timeout")
    assert "nic-high-temperature" in v.summary


def test_a_cable_left_unplugged_warns_and_a_replug_clears_it():
    out = "[ 500.0] mlx5_core 0000:01:00.0: Port module event: module 0, Cable unplugged"
    back = "[ 510.0] mlx5_core 0000:01:00.0: Port module event: module 0, Cable plugged"
    v = log(HEALTHY_BOOT + [out])
    assert (v.verdict, v.action) == (WARN, "FIX_LINK") and "0000:01:00.0" in v.summary
    assert log(HEALTHY_BOOT + [out, back]).verdict == PASS
    other = "[ 520.0] mlx5_core 0002:01:00.0: Port module event: module 0, Cable plugged"
    assert log(HEALTHY_BOOT + [out, other]).verdict == WARN  # another function's plug is not this one's


def test_unread_and_failed():
    v = judge("fabric.nic-kernel-log", observation(nic=NicFacts(kernel_source="not readable: /dev/kmsg: "
                                                                "Permission denied (run as root or give --xid-log)")))
    assert v.verdict == SKIP and "Permission denied" in v.summary and "--xid-log" in v.remedy
    assert judge("fabric.nic-kernel-log", observation()).verdict == SKIP
    assert judge("fabric.nic-kernel-log", observation(nic=NicFacts(failed="NIC probe timed out"))).verdict == ERROR


def test_a_saved_kernel_log_in_a_snapshot_is_judged_and_xid_log_overrides_it(tmp_path):
    snap = derive(fabric_case("02-"), tmp_path / "s", {"dmesg.txt": "\n".join(HEALTHY_BOOT + [FAULTS[1][0]]) + "\n"})
    rep, obs = diagnose(Inputs(snapshot=str(snap), playbook=RDMA))
    v = next(g for g in rep["gates"] if g["id"] == "fabric.nic-kernel-log")
    assert (v["verdict"], v["action"]) == (FAIL, "REBOOT") and obs.nic.kernel_source.startswith("snapshot dmesg.txt")
    clean = tmp_path / "clean.log"
    clean.write_text("\n".join(HEALTHY_BOOT) + "\n")
    rep, _ = diagnose(Inputs(snapshot=str(snap), playbook=RDMA, xid_log=str(clean)))
    assert next(g for g in rep["gates"] if g["id"] == "fabric.nic-kernel-log")["verdict"] == PASS


@pytest.mark.parametrize("edit, words", [
    ({"pattern": "("}, "compile"), ({"verdict": "MAYBE"}, "verdict"), ({"action": "PRAY"}, "action"),
    ({"source": ""}, "required"), ({"remedy": ""}, "remedy"),
])
def test_catalog_validation_refuses_a_bad_line(edit, words):
    entry = {k: v for k, v in log_catalog()[1].items() if k != "rx"}
    with pytest.raises(LogCatalogError, match=words):
        validate_log_catalog([{**entry, **edit}], {"REBOOT"})
    with pytest.raises(LogCatalogError, match="unique"):
        validate_log_catalog([entry, entry], {"REBOOT"})


@pytest.mark.parametrize("case", [c for c in case_dirs("fabric") if "healthy" in c.name])
def test_healthy_spark_captures_never_warn_or_fail(case):
    rep, _ = diagnose(Inputs(snapshot=str(case)))
    v = next(g for g in rep["gates"] if g["id"] == "fabric.nic-kernel-log")
    assert v["verdict"] in (PASS, SKIP), v


def _nic_gate(rep):
    return next(g for g in rep["gates"] if g["id"] == "fabric.nic-kernel-log")


@pytest.mark.parametrize("between", [
    ["-- Boot 2b4c9e0f1a8d4f3c9d2e7a6b5c4d3e2f --"],  # journalctl -k spanning boots
    ["[    0.000000] Linux version 6.17.0-1031-nvidia (buildd@bos03) #31-Ubuntu SMP"],  # the kernel's banner
    [],  # dmesg timestamps that start again (the fault's 17.98 s after the healthy boot's 816 s, reversed)
])
def test_a_fault_of_an_earlier_boot_asks_no_reboot_for_this_one(tmp_path, between):
    """A saved log spanning reboots: the mlx5 health failure printed before the last reboot is not this
    boot's, so no REBOOT; the source says how many lines of earlier boots were left out."""
    earlier = [FAULTS[1][0].replace("[   17.982092]", "[ 1017.982092]")] if not between else [FAULTS[1][0]]
    text = "\n".join(earlier + between + HEALTHY_BOOT) + "\n"
    snap = derive(fabric_case("02-"), tmp_path / "s", {"dmesg.txt": text})
    rep, obs = diagnose(Inputs(snapshot=str(snap), playbook=RDMA))
    v = _nic_gate(rep)
    assert v["verdict"] == PASS and v.get("action") in (None, "NONE"), v
    assert "1 NIC line(s) of earlier boots not judged" in obs.nic.kernel_source
    assert len(obs.nic.kernel_lines) == len(HEALTHY_BOOT)
    # the same fault in the boot that is running still fails
    snap2 = derive(fabric_case("02-"), tmp_path / "t", {"dmesg.txt": "\n".join(
        between + [FAULTS[1][0].replace("[   17.982092]", "[ 1017.982092]")]) + "\n"})
    rep2, _ = diagnose(Inputs(snapshot=str(snap2), playbook=RDMA))
    assert (_nic_gate(rep2)["verdict"], _nic_gate(rep2)["action"]) == (FAIL, "REBOOT")


def test_a_live_saved_log_older_than_this_boot_is_not_judged(tmp_path, monkeypatch):
    """--xid-log read live: a log whose last timestamps pass this boot's uptime is an earlier boot."""
    from afddiag.probes import nic as nicprobe

    lines, earlier = nicprobe.this_boot([FAULTS[1][0].replace("[   17.982092]", "[ 5000.1]")], uptime_s=120.0)
    assert (lines, earlier) == ([], 1)
    lines, earlier = nicprobe.this_boot([FAULTS[1][0].replace("[   17.982092]", "[ 50.1]")], uptime_s=120.0)
    assert len(lines) == 1 and earlier == 0
