"""host.cpu-clock on a noisy host: a loop timing alone never FAILs (nor drains, nor power-cycles), the
stuck clock does unless something else explains it; the probe records contention; `baseline record`
refuses a CPU loop measured on a busy host."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from afddiag import baseline
from afddiag.cli import cli
from afddiag.diagnosis import fill_actions, needs_drain
from afddiag.gates import Context, host, resolve_fabric_ip
from afddiag.model.run import Inputs, Observation
from afddiag.playbook import load as load_playbook
from afddiag.probes import cpu as cpuprobe

IDLE = {"model": "Cortex-X925", "logical_cpus": 20, "under_load_mhz": 3900, "max_mhz": 3900, "loop_mops": 11.0,
        "loop_mops_on_cpu": 11.1, "loop_samples_mops": [10.9, 11.0, 10.8, 10.95, 10.7],
        "loop_on_cpu": [0.99, 0.99, 0.98, 0.99, 0.99], "load_avg_1m": 0.3, "governor": "schedutil",
        "scaling_driver": "cppc_cpufreq", "scaling_max_mhz": 3900, "throttle_events": None,
        # ARM has no throttle counters: a thermal zone read cool after the loop is what rules throttling out
        "thermal_zones": [{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 54.0, "trip_c": 95.0}]}
BASE = {"loop_mops": 11.02, "loop_mops_on_cpu": 11.1}


def judge(cpu, base=BASE, role=None):
    o = Observation("h", "test", cpu=cpu)
    o.baseline = {"path": "/b.json", "cpu": base} if base else None
    inputs = Inputs(playbook=load_playbook(role) if role else None)
    v = host.cpu_clock(Context(o, inputs, resolve_fabric_ip(None, None)))
    fill_actions([v])
    return v


def test_idle_host_at_baseline_passes():
    assert judge(IDLE).verdict == "PASS"


def test_shared_host_slow_loop_is_inconclusive_not_a_power_cycle():
    """The trial's host: 2 cores, other processes; the loop lost its core and ran at 43 % of baseline."""
    cpu = {**IDLE, "logical_cpus": 2, "under_load_mhz": None, "max_mhz": None, "loop_mops": 4.793,
           "loop_mops_on_cpu": 4.9, "loop_samples_mops": [1.4, 3.4, 4.793, 2.8, 4.3],
           "loop_on_cpu": [0.13, 0.3, 0.37, 0.24, 0.36], "load_avg_1m": 3.9}
    v = judge(cpu)
    assert v.verdict == "WARN" and "host busy" in v.summary and "on its core 13%-37%" in v.summary, v.summary
    assert v.action == "RERUN" and not needs_drain(v.action)


@pytest.mark.parametrize("clk", [None, 3900])
def test_a_slow_loop_alone_is_a_warn_rerun(clk):
    """No contention seen, the loop at 50 % of baseline: with no clock, or a normal clock, it is a timing."""
    cpu = {**IDLE, "under_load_mhz": clk, "max_mhz": clk, "loop_mops": 5.5, "loop_mops_on_cpu": 5.55,
           "loop_samples_mops": [5.5, 5.4, 5.45, 5.5, 5.3]}
    v = judge(cpu)
    assert v.verdict == "WARN" and v.action == "RERUN" and "timing alone" in v.summary, v.summary


def test_stuck_clock_with_a_slow_loop_fails_with_the_power_cycle():
    cpu = {**IDLE, "under_load_mhz": 1800, "loop_mops": 5.0, "loop_mops_on_cpu": 5.05,
           "loop_samples_mops": [5.0, 4.9, 4.95, 5.0, 4.8]}
    v = judge(cpu, role="expert")
    assert v.verdict == "FAIL" and v.action == "AC_POWER_CYCLE" and "1800 MHz" in v.summary and "loop" in v.summary


def test_low_clock_contradicted_by_a_loop_at_baseline_speed_is_inconclusive():
    v = judge({**IDLE, "under_load_mhz": 1500})
    assert v.verdict == "WARN" and v.action == "RERUN" and "disagree" in v.summary


@pytest.mark.parametrize("extra,action,words", [
    ({"throttle_events": 14}, "HW_INSPECTION", "thermal throttle"),
    ({"governor": "powersave", "scaling_driver": "acpi-cpufreq"}, "SET_GOVERNOR", "governor 'powersave'"),
    ({"scaling_max_mhz": 1200}, "SET_GOVERNOR", "scaling_max_freq caps"),
])
def test_low_clock_explained_by_its_own_cause_gets_that_remedy(extra, action, words):
    cpu = {**IDLE, "under_load_mhz": 1200, "loop_mops": 4.0, "loop_mops_on_cpu": 4.0,
           "loop_samples_mops": [4.0] * 5, **extra}
    v = judge(cpu)
    assert v.verdict == "WARN" and v.action == action and words in v.summary, v.summary
    assert "power-cycle" not in v.remedy and "AC removal" not in v.remedy


def test_powersave_under_intel_pstate_explains_nothing():
    """intel_pstate's 'powersave' is its dynamic default: a stuck-low clock under it is still the fault."""
    cpu = {**IDLE, "under_load_mhz": 1200, "loop_mops": 4.0, "loop_mops_on_cpu": 4.0, "loop_samples_mops": [4.0] * 5,
           "governor": "powersave", "scaling_driver": "intel_pstate"}
    assert judge(cpu).verdict == "FAIL"


@pytest.mark.parametrize("gov,drv,held", [
    ("powersave", "amd-pstate", True),      # passive/guided amd-pstate: the ordinary governors, minimum pinned
    ("powersave", "intel_cpufreq", True),   # intel_pstate in passive mode
    ("powersave", "acpi-cpufreq", True),
    ("powersave", None, True),
    ("powersave", "intel_pstate", False),   # active mode: powersave is the driver's dynamic policy
    ("powersave", "amd-pstate-epp", False),
    ("userspace", "amd-pstate", True),      # a fixed speed under any driver
    ("schedutil", "amd-pstate", False),
])
def test_which_governor_holds_the_clock_low(gov, drv, held):
    """Reviewer's input: powersave under amd-pstate, 1500 of 3800 MHz, steady loop, said FAIL AC_POWER_CYCLE."""
    cpu = {**IDLE, "model": "AMD EPYC 9354", "max_mhz": 3800, "scaling_max_mhz": 3800, "under_load_mhz": 1500,
           "loop_mops": 4.0, "loop_mops_on_cpu": 4.0, "loop_samples_mops": [4.0] * 5,
           "governor": gov, "scaling_driver": drv}
    assert host.governor_holds_low(gov, drv) is held
    v = judge(cpu)
    if held:
        assert v.verdict == "WARN" and v.action == "SET_GOVERNOR", v.summary
        assert f"governor '{gov}' ({drv or 'driver unknown'}) holds the clock low" in v.summary, v.summary
        assert "AC removal" not in v.remedy and not needs_drain(v.action)
    else:
        assert v.verdict == "FAIL" and v.action == "AC_POWER_CYCLE", v.summary


@pytest.mark.parametrize("role,smax,clk,explained", [
    ("expert", 1800, 1800, True),    # reviewer's input: below the role's 2000 MHz, capped at 1800 (max 3000)
    ("expert", 2000, 1800, True),    # a cap at the threshold itself: the clock cannot exceed it
    ("expert", 2400, 1800, False),   # a cap above the role's minimum explains nothing
    (None, 1500, 1400, True),        # no role: the threshold is half of max (1500)
    (None, 1600, 1400, False),
    ("expert", 1600, 1400, True),    # below both the role minimum and half of max: the higher counts
])
def test_a_frequency_cap_explains_a_clock_below_the_threshold_it_cannot_reach(role, smax, clk, explained):
    cpu = {**IDLE, "model": "Intel Xeon", "max_mhz": 3000, "idle_mhz": 800, "under_load_mhz": clk,
           "scaling_max_mhz": smax, "governor": "performance", "scaling_driver": "intel_pstate",
           "loop_mops": 4.0, "loop_mops_on_cpu": 4.0, "loop_samples_mops": [4.0] * 5}
    v = judge(cpu, role=role)
    if explained:
        assert v.verdict == "WARN" and v.action == "SET_GOVERNOR", v.summary
        assert f"caps the clock at {smax} MHz" in v.summary and "AC removal" not in v.remedy, v.summary
    else:
        assert v.verdict == "FAIL" and v.action == "AC_POWER_CYCLE", v.summary


def test_a_baseline_far_below_this_run_is_named():
    v = judge(IDLE, base={"loop_mops": 0.99, "loop_mops_on_cpu": 0.99})
    assert v.verdict == "PASS" and "looks low" in v.summary


def _spinner_on(core: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])


def test_probe_sees_another_process_on_its_core_and_the_gate_does_not_fail():
    """A live run: the baseline measured now, then the loop with a spinner pinned to its core. Before,
    one 0.3 s sample at a fraction of the baseline FAILed with AC_POWER_CYCLE."""
    core = min(os.sched_getaffinity(0))
    idle = cpuprobe.read_cpu(0.3)
    spin = _spinner_on(core)
    try:
        import time

        time.sleep(0.2)
        busy = cpuprobe.read_cpu(0.3)
    finally:
        spin.kill()
        spin.wait()
    assert len(busy["loop_samples_mops"]) == cpuprobe.SAMPLES and busy["loop_mops"] == max(busy["loop_samples_mops"])
    assert min(busy["loop_on_cpu"]) < host.ON_CPU_MIN, busy  # the spinner took the core part of the time
    assert host.cpu_contention(busy)
    v = judge(busy, base={k: idle[k] for k in baseline.CPU_FIGURES if idle.get(k) is not None})
    assert v.verdict != "FAIL" and v.action != "AC_POWER_CYCLE", v.summary


def test_cpufreq_policy_and_throttle_read_from_sysfs(tmp_path):
    d = tmp_path / "devices" / "system" / "cpu" / "cpu3"
    (d / "cpufreq").mkdir(parents=True)
    (d / "thermal_throttle").mkdir()
    (d / "cpufreq" / "scaling_governor").write_text("powersave\n")
    (d / "cpufreq" / "scaling_driver").write_text("acpi-cpufreq\n")
    (d / "cpufreq" / "scaling_max_freq").write_text("1200000\n")
    (d / "thermal_throttle" / "core_throttle_count").write_text("7\n")
    (d / "thermal_throttle" / "package_throttle_count").write_text("2\n")
    assert cpuprobe.cpufreq_policy(3, str(tmp_path)) == {"governor": "powersave", "scaling_driver": "acpi-cpufreq",
                                                         "scaling_max_mhz": 1200.0}
    assert cpuprobe.throttle_count(3, str(tmp_path)) == 9
    assert cpuprobe.throttle_count(4, str(tmp_path)) is None
    assert cpuprobe.cpufreq_policy(4, str(tmp_path))["governor"] is None


def _record(monkeypatch, cpu, *extra):
    from snapfix import healthy_h200

    monkeypatch.setattr("afddiag.probes.gpu.read_gpu", lambda *a, **k: healthy_h200())
    monkeypatch.setattr("afddiag.probes.load.attach_load", lambda r, b, **k: None)
    monkeypatch.setattr("afddiag.probes.cpu.read_cpu", lambda: dict(cpu))
    res = CliRunner().invoke(cli, ["baseline", "record", *extra], standalone_mode=False, catch_exceptions=False)
    return res.return_value, res.stderr, res.stdout


def _refused_then_forced(monkeypatch, cpu, path, words):
    """`baseline record` refuses ``cpu`` (exit 2, stderr naming ``words``, nothing written), then
    records it with --force ("FORCED over"); returns the baseline written."""
    code, err, _ = _record(monkeypatch, cpu, "--path", str(path))
    assert code == 2 and words in err and not path.exists(), err
    code, _, out = _record(monkeypatch, cpu, "--path", str(path), "--force")
    assert code == 0 and "FORCED over" in out
    return json.loads(path.read_text())


def test_baseline_record_refuses_a_cpu_loop_measured_on_a_busy_host(monkeypatch, tmp_path):
    noisy = {**IDLE, "loop_mops": 0.99, "loop_mops_on_cpu": 5.0, "loop_samples_mops": [0.99, 0.5, 0.7, 0.4, 0.9],
             "loop_on_cpu": [0.2, 0.1, 0.14, 0.08, 0.18]}
    data = _refused_then_forced(monkeypatch, noisy, tmp_path / "b.json", "busy host")
    assert any("busy host" in w for w in data["cpu"]["forced_over"])
    v = judge({**IDLE, "loop_mops": 2.0, "loop_mops_on_cpu": 2.0, "loop_samples_mops": [2.0] * 5}, base=data["cpu"])
    assert v.verdict == "WARN" and "FORCED" in v.summary, v.summary
    code, _, _ = _record(monkeypatch, IDLE, "--path", str(tmp_path / "ok.json"))
    assert code == 0 and json.loads((tmp_path / "ok.json").read_text())["cpu"]["loop_on_cpu"] == IDLE["loop_on_cpu"]


def test_baseline_record_refuses_on_host_cpu_clock_fail_and_follows_its_rule(monkeypatch, tmp_path):
    """`baseline record` refuses exactly when host.cpu-clock FAILs: a clock stuck low with nothing to
    explain it is refused (and --force marks the CPU figures forced); a low clock the governor explains
    (the gate WARNs, no FAIL) is no reason to refuse."""
    stuck = {**IDLE, "under_load_mhz": 1200}
    assert judge(stuck, base=None).verdict == "FAIL"
    data = _refused_then_forced(monkeypatch, stuck, tmp_path / "b.json", "host.cpu-clock FAILs")
    assert [w for w in data["cpu"]["forced_over"] if "host.cpu-clock" in w], data["cpu"]
    assert all("host.cpu-clock" not in w for w in data["forced_over"] if w not in data["cpu"]["forced_over"])
    governed = {**stuck, "governor": "powersave", "scaling_driver": "acpi-cpufreq"}
    assert judge(governed, base=None).verdict == "WARN"
    code, err, _ = _record(monkeypatch, governed, "--path", str(tmp_path / "g.json"))
    assert "host.cpu-clock" not in err and "CPU clock" not in err, err


@pytest.mark.parametrize("zones,verdict,action,words", [
    (None, "WARN", "RERUN", "thermal throttling not ruled out"),  # no counters, no zones: no power cycle
    ([{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 96.5, "trip_c": 95.0}], "WARN", "HW_INSPECTION",
     "cpu-thermal 96.5 °C >= 95.0 °C"),  # at its passive trip point: the kernel throttles
    ([{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": None, "trip_c": 95.0}], "WARN", "RERUN",
     "not ruled out"),  # a zone without a temperature rules nothing out
    ([{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 54.0, "trip_c": 95.0}], "FAIL", "AC_POWER_CYCLE",
     "1800 MHz"),  # cool: nothing explains the stuck clock
])
def test_a_stuck_clock_needs_thermal_throttling_ruled_out_before_a_power_cycle(zones, verdict, action, words):
    """Review: on ARM (GB10) the CPU has no throttle counters, so a CPU slowed by heat read exactly like
    the stuck state and got the AC power cycle. The thermal zones are the evidence either way."""
    cpu = {**IDLE, "under_load_mhz": 1800, "loop_mops": 5.0, "loop_mops_on_cpu": 5.05,
           "loop_samples_mops": [5.0, 4.9, 4.95, 5.0, 4.8], "thermal_zones": zones}
    v = judge(cpu, role="expert")
    assert (v.verdict, v.action) == (verdict, action) and words in v.summary, v.summary
    assert (v.action == "AC_POWER_CYCLE") == (verdict == "FAIL")


def test_thermal_zones_are_read_with_their_lowest_throttling_trip_point(tmp_path):
    z = tmp_path / "class/thermal/thermal_zone0"
    z.mkdir(parents=True)
    for name, val in (("type", "cpu-thermal"), ("temp", "61250"), ("trip_point_0_type", "active"),
                      ("trip_point_0_temp", "50000"), ("trip_point_1_type", "passive"), ("trip_point_1_temp", "95000"),
                      ("trip_point_2_type", "critical"), ("trip_point_2_temp", "105000")):
        (z / name).write_text(val + "\n")
    (tmp_path / "class/thermal/cooling_device0").mkdir()
    assert cpuprobe.thermal_zones(str(tmp_path)) == [
        {"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 61.25, "trip_c": 95.0}]
    assert cpuprobe.thermal_zones(str(tmp_path / "none")) is None


@pytest.mark.parametrize("bound_s,measured", [(0.1, False), (0.49, False), (cpuprobe.MIN_BOUND_S, True), (10.0, True)])
def test_a_bound_too_short_to_measure_says_so_and_never_calls_the_host_stuck(bound_s, measured):
    """--timeout 0.1 cannot hold the 0.3 s loop: the probe is not started and host.cpu-clock names the bound
    and the least that measures, not a stuck host (issue 23); from the least bound up the loop runs."""
    from afddiag import runner
    from afddiag.probes.registry import Sources

    calls = []

    def reading():
        calls.append(1)
        return dict(IDLE)

    inputs = Inputs(probe_timeout_s=bound_s, families=frozenset({"host"}))
    rep, _ = runner.diagnose(inputs, host=Sources(cpu=reading))
    v = next(g for g in rep["gates"] if g["id"] == "host.cpu-clock")
    assert bool(calls) is measured
    if measured:
        assert v["verdict"] != "ERROR"
        return
    assert v["verdict"] == "ERROR" and v["action"] == "RERUN"
    assert f"time bound {bound_s:g} s (--timeout)" in v["summary"] and "0.5 s" in v["summary"]
    assert "stuck" not in v["summary"] + v["remedy"] and "did not finish" not in v["summary"]
    assert v["remedy"].startswith(f"give --timeout {cpuprobe.MIN_BOUND_S:g} or more")
