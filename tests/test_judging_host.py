"""Host gates pinned on facts as the CPU and PCIe probes record them: host.cpu-clock's half-of-max
and role-minimum clock edges, the slow-loop fraction (80 % of the baseline), contention (on-CPU
share, sample spread, load average), what explains a low clock (throttle events, hot zones, the
governor, a scaling_max_freq cap), and host.pcie's width/speed/port judgments — each with its
verdict and typed action — plus the probe-failed preambles."""

from __future__ import annotations

import pytest

from afddiag.expect import Expectations, Expected
from afddiag.model.host import PcieFacts, PcieLink
from afddiag.playbook import Playbook
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN
from fakes import judge, observation

COOL = [{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 45.0, "trip_c": 95.0}]


def cpu(clk=None, mx=3000.0, base=None, min_mhz=0, **facts):
    """host.cpu-clock on the CPU probe's facts (a cool zone read unless ``thermal_zones`` is given)."""
    f = {"model": "Cortex-X925", "max_mhz": mx, "under_load_mhz": clk, "thermal_zones": COOL, **facts}
    ex = Expectations(cpu_baseline=Expected(base, "host baseline /var/lib/afddiag/baseline.json") if base else None)
    return judge("host.cpu-clock", observation(cpu=f), expectations=ex,
                 playbook=Playbook(cpu_min_mhz=min_mhz) if min_mhz else None)


def test_cpu_clock_half_of_max_edge():
    v = cpu(1500.0)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "Cortex-X925: clock under load 1500 MHz of max 3000"
    v = cpu(1499.0)
    assert (v.verdict, v.action) == (FAIL, "AC_POWER_CYCLE")
    assert v.summary == "Cortex-X925: clock under load 1499 MHz is 50% of max 3000 MHz"


def test_cpu_clock_role_minimum_edge():
    assert cpu(2000.0, min_mhz=2000).verdict == PASS
    v = cpu(1999.0, min_mhz=2000)
    assert (v.verdict, v.action) == (FAIL, "AC_POWER_CYCLE")
    assert "clock under load 1999 MHz, below the role's 2000 MHz" in v.summary


def test_slow_loop_fraction_edge_is_a_rerun_never_a_power_cycle():
    base = {"loop_mops": 100.0}
    v = cpu(2900.0, base=base, loop_mops=80.0)
    assert (v.verdict, v.action) == (PASS, "NONE") and "loop 80 Mop/s (80% of baseline)" in v.summary
    v = cpu(2900.0, base=base, loop_mops=79.9)
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert v.summary == ("Cortex-X925: fixed-work loop 79.9 Mop/s is 80% of the baseline 100, but the clock under "
                         "load reads 2900 MHz of max 3000, normal: a timing alone, not the stuck state")
    # per second on the CPU when both figures have it
    v = cpu(2900.0, base={"loop_mops": 100.0, "loop_mops_on_cpu": 100.0}, loop_mops=50.0, loop_mops_on_cpu=90.0)
    assert v.verdict == PASS and "(per second on the CPU)" in v.summary
    v = cpu(None, base=base, loop_mops=50.0)
    assert v.verdict == WARN and "no cpufreq clock to corroborate it" in v.summary


def test_a_loop_far_above_the_baseline_says_the_baseline_looks_low():
    ref = 100.0
    assert "looks low" not in cpu(2900.0, base={"loop_mops": ref}, loop_mops=156.0).summary
    assert "the baseline 100 looks low for this host" in cpu(2900.0, base={"loop_mops": ref}, loop_mops=157.0).summary


@pytest.mark.parametrize("facts, busy", [
    ({"loop_on_cpu": [0.9, 1.0]}, False), ({"loop_on_cpu": [0.89, 1.0]}, True),
    ({"loop_samples_mops": [75.0, 100.0]}, False), ({"loop_samples_mops": [74.0, 100.0]}, True),
    ({"load_avg_1m": 3.9, "logical_cpus": 4}, False), ({"load_avg_1m": 4.0, "logical_cpus": 4}, True)])
def test_contention_edges_make_a_slow_loop_inconclusive(facts, busy):
    v = cpu(2900.0, base={"loop_mops": 100.0}, loop_mops=50.0, **facts)
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert v.summary.startswith("Cortex-X925: inconclusive: host busy") == busy


@pytest.mark.parametrize("facts, action, cause", [
    ({"throttle_events": 1}, "HW_INSPECTION", "1 thermal throttle event(s)"),
    ({"thermal_zones": [{"type": "cpu", "temp_c": 95.0, "trip_c": 95.0}]}, "HW_INSPECTION", "cpu 95.0 °C >= 95.0 °C"),
    ({"governor": "powersave", "scaling_driver": "acpi-cpufreq"}, "SET_GOVERNOR", "governor 'powersave'"),
    ({"governor": "userspace", "scaling_driver": "intel_pstate"}, "SET_GOVERNOR", "governor 'userspace'"),
    ({"scaling_max_mhz": 1500.0}, "SET_GOVERNOR", "scaling_max_freq caps the clock at 1500 MHz of 3000")])
def test_a_low_clock_explained_by_something_else_warns_with_its_own_action(facts, action, cause):
    v = cpu(1000.0, **facts)
    assert (v.verdict, v.action) == (WARN, action)
    assert cause in v.summary and v.summary.endswith("not the stuck state")
    # the governor and the cap have a command with the host's own maximum; cooling has none
    assert v.commands == {"HW_INSPECTION": [], "SET_GOVERNOR": (
        ["sudo cpupower frequency-set -u 3000MHz"] if "scaling_max_mhz" in facts
        else ["sudo cpupower frequency-set -g performance"])}[action], v.commands


@pytest.mark.parametrize("facts", [
    {"throttle_events": 0}, {"thermal_zones": [{"type": "cpu", "temp_c": 94.9, "trip_c": 95.0}]},
    {"governor": "powersave", "scaling_driver": "intel_pstate"}, {"governor": "performance"},
    {"scaling_max_mhz": 1501.0}, {"scaling_max_mhz": 0}])
def test_what_does_not_explain_a_low_clock(facts):
    assert cpu(1000.0, **facts).verdict == FAIL


def test_a_low_clock_with_a_normal_loop_or_no_thermal_evidence_is_inconclusive():
    v = cpu(1000.0, base={"loop_mops": 100.0}, loop_mops=80.0)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "the cpufreq reading and the work disagree" in v.summary
    v = cpu(1000.0, base={"loop_mops": 100.0}, loop_mops=79.0)
    assert (v.verdict, v.action) == (FAIL, "AC_POWER_CYCLE") and "; fixed-work loop 79 Mop/s is 79%" in v.summary
    v = cpu(1000.0, thermal_zones=None)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "thermal throttling not ruled out" in v.summary
    v = cpu(1000.0, thermal_zones=None, throttle_events=0)
    assert v.verdict == FAIL  # x86: counters read, none during the loop


def test_cpu_clock_skip_warn_and_error_preambles():
    v = judge("host.cpu-clock", observation(cpu={"failed": "reading /proc/cpuinfo timed out after 5 s"}))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert v.summary == "not judged: reading /proc/cpuinfo timed out after 5 s"
    v = judge("host.cpu-clock", observation())
    assert (v.verdict, v.action, v.summary) == (SKIP, "NONE", "CPU not probed (or not in the snapshot)")
    v = judge("host.cpu-clock", observation(cpu={"why": "no cpufreq on this host"}))
    assert (v.verdict, v.summary) == (SKIP, "no cpufreq on this host")
    v = cpu(None, mx=None, loop_mops=50.0)
    assert v.verdict == SKIP and "no cpufreq clock, and no baseline" in v.summary
    v = cpu(None, mx=None, min_mhz=2000, loop_mops=50.0)
    assert (v.verdict, v.action) == (WARN, "RERUN")
    v = cpu(1000.0, mx=None, loop_mops=50.0)
    assert v.verdict == SKIP and "clock under load 1000 MHz but no max and no role minimum" in v.summary


# ---------------------------------------------------------------- host.pcie

def link(kind="nic", now=(16, 32.0), cap=(16, 32.0), port=None, bdf="0000:01:00.0"):
    return PcieLink(bdf, kind, ["mlx5_0"] if kind == "nic" else ["nvidia"], current_width=now[0],
                    current_speed_gts=now[1], max_width=cap[0], max_speed_gts=cap[1],
                    upstream_bdf="0000:00:01.0" if port else None,
                    upstream_max_width=port[0] if port else None, upstream_max_speed_gts=port[1] if port else None)


def pcie(*links, **kw):
    return judge("host.pcie", observation(pcie=PcieFacts(links=list(links), **kw)))


def test_pcie_width_and_speed():
    v = pcie(link(), link("gpu", bdf="0000:02:00.0"))
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "2 link(s) at their maximum width: NIC 0000:01:00.0 x16 32 GT/s, GPU 0000:02:00.0 x16 32 GT/s"
    v = pcie(link(now=(8, 32.0), port=(16, 32.0)))
    assert (v.verdict, v.action) == (FAIL, "HW_INSPECTION")
    assert v.summary == ("NIC 0000:01:00.0 (mlx5_0): PCIe link trained x8 at 32 GT/s, capable of x16 at 32 GT/s, "
                         "upstream port 0000:00:01.0 x16 at 32 GT/s")
    v = pcie(link(now=(8, 32.0)))  # port not read: still a FAIL, and the remedy says what was not read
    assert v.verdict == FAIL and "(upstream port's maximum not read)" in v.summary and "0000:01:00.0" in v.remedy
    v = pcie(link(now=(16, 16.0), port=(16, 32.0)))  # a NIC below its speed
    assert (v.verdict, v.action) == (WARN, "HW_INSPECTION")
    v = pcie(link("gpu", now=(16, 2.5), port=(16, 32.0)))  # a GPU at idle speed: not judged
    assert v.verdict == PASS and "GPU link speed below its maximum at idle" in v.summary
    v = pcie(link("gpu", now=(16, 16.0), port=(16, 32.0)))  # Gen4 speed on a Gen5 link at idle: still not judged
    assert v.verdict == PASS and "GPU link speed below its maximum at idle" in v.summary
    v = pcie(link(port=(16, 32.0)))  # a NIC at its maximum behind a port that allows it: nothing to add
    assert (v.verdict, v.summary) == (PASS, "1 link(s) at their maximum width: NIC 0000:01:00.0 x16 32 GT/s")


def test_pcie_the_slot_not_the_card():
    v = pcie(link(now=(8, 32.0), port=(8, 32.0)))
    assert (v.verdict, v.action) == (WARN, "CHECK_BIOS")
    assert "the most its upstream port 0000:00:01.0 x8 at 32 GT/s allows" in v.summary
    v = pcie(link(now=(16, 16.0), cap=(16, 32.0), port=(16, 16.0)))
    assert (v.verdict, v.action) == (PASS, "NONE") and "the slot's generation, not a fault" in v.summary
    # a port WARN beside a NIC speed WARN: the device's remedy, not the slot's
    v = pcie(link(now=(8, 32.0), port=(8, 32.0)), link(now=(16, 16.0), port=(16, 32.0), bdf="0000:03:00.0"))
    assert (v.verdict, v.action) == (WARN, "HW_INSPECTION")


def test_pcie_skips_and_error():
    assert pcie(PcieLink("0000:01:00.0", "nic")).verdict == SKIP
    v = pcie(notes=["no /sys/bus/pci"])
    assert v.verdict == SKIP and v.summary.endswith("(no /sys/bus/pci)")
    v = judge("host.pcie", observation(pcie=PcieFacts(failed="reading config space timed out")))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = judge("host.pcie", observation())
    assert (v.verdict, v.summary) == (SKIP, "PCIe links not probed")
