"""GPU gates pinned on facts as the GPU probe records them: the Xid catalog's verdicts and typed
actions (NVIDIA's resolution for each Xid, written here from the catalog, not read from afddiag's
table), the recovery action a driver prints, ECC/remap/retirement counters at zero and one, the
slow state's clock, throughput, utilization and power-limit edges, and the probe-failed preambles."""

from __future__ import annotations

import pytest

from afddiag.model.gpu import GpuDevice, GpuFacts, UnderLoad
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN
from fakes import gpu_baselines, judge, observation

PCI = "0000:3b:00.0"


def gpu(*devices: GpuDevice, **facts) -> object:
    """A live observation of GPUs ``devices`` (one healthy H200 when none are given)."""
    devs = list(devices) or [GpuDevice(0, name="NVIDIA H200", pci_bus_id=PCI)]
    return observation(gpu=GpuFacts(available=True, devices=devs, **facts))


def xids(*events: dict) -> object:
    return gpu(xid_events=list(events), xid_source="/dev/kmsg")


# ---------------------------------------------------------------- gpu.errors: Xids

@pytest.mark.parametrize("xid, action", [
    (48, "RESET_GPU"), (61, "RESET_GPU"), (62, "RESET_GPU"), (63, "RESET_GPU"), (64, "RESET_GPU"),
    (74, "RESET_GPU"), (95, "RESET_GPU"), (110, "RESET_GPU"), (119, "RESET_GPU"), (120, "RESET_GPU"),
    (121, "RESET_GPU"), (136, "RESET_GPU"), (140, "RESET_GPU"), (143, "RESET_GPU"), (79, "REBOOT")])
def test_fatal_xid_fails_with_the_catalogs_resolution(xid, action):
    v = judge("gpu.errors",
              xids({"xid": xid, "pci": "0000:3b:00", "text": f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1"}))
    assert (v.verdict, v.action) == (FAIL, action)
    assert v.summary.startswith(f"Xid {xid} (") and v.summary.endswith(") on 0000:3b:00")


@pytest.mark.parametrize("xid", [8, 13, 31, 32, 38, 43, 45, 68, 69, 92, 94, 109, 137, 144, 145, 146, 147, 148,
                                 149, 150])
def test_application_xid_warns_without_a_drain(xid):
    v = judge("gpu.errors", xids({"xid": xid, "pci": "0000:3b:00", "text": "x"}))
    assert (v.verdict, v.action) == (WARN, "NONE")
    assert v.remedy.startswith("application-caused or contained: restart the application")


def test_unknown_xid_warns_and_says_to_look_it_up_first():
    v = judge("gpu.errors", xids({"xid": 999, "pci": "0000:3b:00", "text": "odd"}))
    assert (v.verdict, v.action) == (WARN, "NONE")
    assert v.summary == 'Xid 999 (not in afddiag\'s Xid table) on 0000:3b:00: "odd"'
    assert v.remedy.startswith("not in afddiag's Xid table: look it up") and "for the others" not in v.remedy
    v = judge("gpu.errors", xids({"xid": 999, "text": "odd"}, {"xid": 13, "text": "y"}))
    assert "; for the others: application-caused" in v.remedy


@pytest.mark.parametrize("text, verdict, action", [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", FAIL, "RESET_GPU"),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", FAIL, "REBOOT"),
    ("GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)", WARN, "NONE"),
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", PASS, "NONE"),
    ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)", FAIL, "RESET_GPU"),
])
def test_xid_154_follows_the_recovery_action_the_driver_printed(text, verdict, action):
    v = judge("gpu.errors", xids({"xid": 154, "pci": "0000:3b:00", "text": text}))
    assert v.verdict == verdict
    if verdict != PASS:
        assert v.action == action


def test_a_bus_reset_the_driver_asks_for_is_a_gpu_reset():
    v = judge("gpu.errors", xids({"xid": 999, "pci": "0000:3b:00", "text": "NVRM: GPU needs a bus reset"}))
    assert (v.verdict, v.action) == (FAIL, "RESET_GPU")
    v = judge("gpu.errors", xids({"xid": 13, "pci": "0000:3b:00", "text": "system reboot needed"}))
    assert (v.verdict, v.action) == (FAIL, "REBOOT")
    assert "the driver says the GPU needs a node reboot" not in v.remedy  # no recovery-action line: inferred


@pytest.mark.parametrize("xid", [79, 48, 154])
def test_an_earlier_boots_xid_never_asks_for_a_reset_or_reboot(xid):
    """An Xid from before the last reboot (a --xid-log file, a captured kernel log spanning boots) is history:
    WARN with no action, never RESET_GPU/REBOOT for the boot now running."""
    text = f"NVRM: Xid (PCI:0000:3b:00): {xid}, pid=1, GPU Reset Required, recovery action: Node Reboot Required"
    old = {"xid": xid, "pci": "0000:3b:00", "text": text, "boots_ago": 1}
    v = judge("gpu.errors", xids(old))
    assert (v.verdict, v.action) == (WARN, "NONE"), (v.summary, v.action)
    assert "in an earlier boot, 1 reboot(s) ago: not this boot's fault" in v.summary
    assert v.remedy.startswith("nothing to do for this boot") and "reset" not in v.remedy.split(":")[0]
    # the same Xid in this boot beside it: that one is judged, once
    now = {**old, "boots_ago": 0}
    v = judge("gpu.errors", xids(old, now))
    assert v.verdict == FAIL and v.action in ("RESET_GPU", "REBOOT")
    # a host whose GPU NVML does not list: this boot's Xid is why, an earlier boot's is not
    absent = {"available": False, "why": "no NVIDIA GPU seen", "xid_source": "/dev/kmsg"}
    v = judge("gpu.present", observation(gpu=GpuFacts(xid_events=[now], **absent)))
    assert v.summary.startswith("not judged: gpu.errors failed")
    v = judge("gpu.present", observation(gpu=GpuFacts(xid_events=[old], **absent)))
    assert not v.summary.startswith("not judged") and v.summary.startswith("no NVIDIA GPU seen")


def test_only_the_last_xid_154_of_a_gpu_counts():
    reset = "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    back = "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    v = judge("gpu.errors", xids({"xid": 154, "pci": "a", "text": reset}, {"xid": 154, "pci": "a", "text": back}))
    assert v.verdict == PASS
    v = judge("gpu.errors", xids({"xid": 154, "pci": "a", "text": back}, {"xid": 154, "pci": "a", "text": reset}))
    assert (v.verdict, v.action) == (FAIL, "RESET_GPU")
    v = judge("gpu.errors", xids({"xid": 154, "pci": "a", "text": reset},
                                 {"xid": 154, "pci": "b", "text": back}))
    assert v.verdict == FAIL  # another GPU's recovery does not clear this one


def test_the_worst_action_wins_and_a_printed_reboot_says_so():
    v = judge("gpu.errors", xids({"xid": 48, "text": "x"}, {"xid": 79, "pci": PCI, "text": "x"}))
    assert (v.verdict, v.action) == (FAIL, "REBOOT")
    assert "Xid 79: GPU has fallen off the bus, NVIDIA's Xid catalog resolves it with a node reboot" in v.remedy
    v = judge("gpu.errors", xids({"xid": 154, "text": "GPU recovery action changed from 0x0 (None) to 0x2 "
                                                      "(Node Reboot Required)"}))
    assert "the driver says the GPU needs a node reboot" in v.remedy


def test_a_quoted_xid_number_is_read():
    assert judge("gpu.errors", xids({"xid": "61", "text": "x"})).action == "RESET_GPU"


# ---------------------------------------------------------------- gpu.errors: counters

def dev(**kw) -> GpuDevice:
    return GpuDevice(0, name="NVIDIA H200", pci_bus_id=PCI, **kw)


@pytest.mark.parametrize("volatile, aggregate, verdict", [(0, 0, PASS), (1, 0, FAIL), (0, 1, WARN), (None, None, PASS)])
def test_uncorrected_ecc_edges(volatile, aggregate, verdict):
    ecc = {"volatile": {"uncorrected": volatile}, "aggregate": {"uncorrected": aggregate}}
    v = judge("gpu.errors", gpu(dev(ecc=ecc), xid_events=[]))
    assert v.verdict == verdict
    if verdict == FAIL:
        assert v.action == "RESET_GPU" and "1 uncorrected ECC error(s) since the last driver load" in v.summary
    if verdict == WARN:
        assert v.action == "NONE" and "1 uncorrected ECC error(s) over its lifetime" in v.summary


def test_row_remapping_and_page_retirement():
    v = judge("gpu.errors", gpu(dev(remapped_rows={"failure": True, "pending": True}), xid_events=[]))
    assert (v.verdict, v.action) == (FAIL, "HW_INSPECTION")
    assert v.remedy.startswith("drain the host and have the GPU serviced (RMA)")
    # a remap failure is service whatever the Xids say
    v = judge("gpu.errors", gpu(dev(remapped_rows={"failure": True}), xid_events=[{"xid": 79, "text": "x"}]))
    assert v.action == "HW_INSPECTION"
    v = judge("gpu.errors", gpu(dev(remapped_rows={"pending": True}), xid_events=[]))
    assert (v.verdict, v.action) == (FAIL, "RESET_GPU") and "row remapping pending" in v.summary
    v = judge("gpu.errors", gpu(dev(remapped_rows={"uncorrectable": 1}), xid_events=[]))
    assert (v.verdict, v.action) == (WARN, "NONE") and "1 rows remapped for uncorrectable errors" in v.summary
    v = judge("gpu.errors", gpu(dev(remapped_rows={"uncorrectable": 0}), xid_events=[]))
    assert v.verdict == PASS
    v = judge("gpu.errors", gpu(dev(retired_pages={"pending": True}), xid_events=[]))
    assert (v.verdict, v.action) == (FAIL, "RESET_GPU") and "page retirement pending" in v.summary


def test_errors_pass_skip_and_not_supported():
    v = judge("gpu.errors", gpu(dev(ecc="NOT_SUPPORTED"), xid_events=[]))
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "1 GPU(s): no uncorrected ECC, no pending retirement or remap; no Xid in the kernel log " \
                        "(ecc N/A on this GPU: not a fault)"
    v = judge("gpu.errors", gpu(dev(), xid_source="not readable: EPERM"))
    assert (v.verdict, v.action) == (SKIP, "NONE") and "kernel log not readable: EPERM" in v.summary
    v = judge("gpu.errors", gpu(dev(ecc={"volatile": {"uncorrected": 0}})))
    assert v.verdict == PASS and v.summary.endswith("kernel log not read (not captured)")


# ---------------------------------------------------------------- preambles

@pytest.mark.parametrize("gate_id", ["gpu.present", "gpu.sm-count", "gpu.memory", "gpu.clock-events",
                                     "gpu.slow-state", "gpu.errors", "gpu.processes"])
def test_a_failed_gpu_probe_is_error_naming_what_it_was_doing(gate_id):
    obs = observation(gpu=GpuFacts(captured=True, failed="nvmlDeviceGetHandleByIndex(0) timed out after 20 s"))
    v = judge(gate_id, obs)
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert v.summary == "not judged: nvmlDeviceGetHandleByIndex(0) timed out after 20 s"


def test_not_probed_and_no_gpu_are_skips():
    v = judge("gpu.errors", observation())
    assert (v.verdict, v.summary) == (SKIP, "GPU not probed")
    v = judge("gpu.clock-events", observation(gpu=GpuFacts(available=False, why="NVML: driver not loaded")))
    assert (v.verdict, v.summary) == (SKIP, "no GPU seen (gpu.present says why)")


def test_a_failed_load_probe_is_error_of_the_slow_state_only():
    obs = gpu(load_failed="the load kernel did not return in 60 s")
    v = judge("gpu.slow-state", obs)
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert v.facts == {"probe_failed": "the load kernel did not return in 60 s"}
    assert judge("gpu.errors", obs).verdict != ERROR


# ---------------------------------------------------------------- gpu.clock-events

@pytest.mark.parametrize("mask, verdict", [(0x0, PASS), (0x1, PASS), (0x4, PASS), (0x8, FAIL), (0x40, FAIL),
                                           (0x80, FAIL), (0x20, WARN), (0x28, FAIL)])
def test_clock_event_reason_bits(mask, verdict):
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=mask)))
    assert v.verdict == verdict
    assert v.action == {PASS: "NONE", FAIL: "HW_INSPECTION", WARN: "HW_INSPECTION"}[verdict]


def test_clock_event_remedy_hardware_or_thermal():
    """A hardware slowdown (0x8) is the board's or its power's: reseat/RMA words; a thermal one (0x20)
    asks for cooling and a re-test, never an RMA."""
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=0x8)))
    assert v.verdict == FAIL and v.remedy.startswith("hardware slowdown") and "RMA" in v.remedy
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=0x20)))
    assert v.verdict == WARN and v.remedy.startswith("check cooling and airflow") and "RMA" not in v.remedy


def test_clock_event_counters_at_zero_and_one():
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=0, clocks_event_reason_counters_us={
        "hw_slowdown": 0, "sw_thermal_slowdown": 0})))
    assert v.verdict == PASS
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=0, clocks_event_reason_counters_us={"hw_slowdown": 1})))
    assert v.verdict == WARN and "no bit now, but has spent time in hw_slowdown 0.00 s" in v.summary
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=0, clocks_event_reason_counters_us={
        "sw_thermal_slowdown": 2_000_000})))
    assert v.verdict == WARN and "sw_thermal_slowdown 2.00 s" in v.summary
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=0, clocks_event_reason_counters_us={
        "sw_thermal_slowdown": 1})))  # one microsecond of thermal slowdown since the driver loaded still counts
    assert v.verdict == WARN and "sw_thermal_slowdown 0.00 s" in v.summary
    # the mask under load counts too
    v = judge("gpu.clock-events", gpu(dev(clocks_event_reasons=0, under_load=UnderLoad(clocks_event_reasons=0x8))))
    assert v.verdict == FAIL


def test_clock_events_not_read_is_no_pass():
    v = judge("gpu.clock-events", gpu(dev()))
    assert v.verdict == SKIP and "clock event reasons not read" in v.summary
    v = judge("gpu.clock-events", gpu(dev(), GpuDevice(1, name="NVIDIA H200", clocks_event_reasons=0)))
    assert v.verdict == PASS and v.summary.startswith("1 GPU(s): no thermal") and "reasons not read on" in v.summary


# ---------------------------------------------------------------- gpu.slow-state

def loaded(**ul) -> GpuDevice:
    return dev(clock_sm_max_mhz=2000.0, under_load=UnderLoad(utilization_pct=100.0, **ul))


def slow(d: GpuDevice, **base) -> object:
    return judge("gpu.slow-state", gpu(d), expectations=gpu_baselines(i0=base))


def test_slow_state_class_a_clock_edge_at_half_of_max():
    v = slow(loaded(clock_sm_mhz=1000.0))
    assert v.verdict == PASS and "clock 1000 MHz of max 2000" in v.summary
    v = slow(loaded(clock_sm_mhz=999.0))
    assert (v.verdict, v.action) == (FAIL, "AC_POWER_CYCLE")
    assert "class A: SM clock under load 999 MHz is 50% of max 2000 MHz" in v.summary
    # against the baseline's under-load clock as well
    v = slow(loaded(clock_sm_mhz=1500.0), clock_sm_mhz_under_load=3002.0)
    assert v.verdict == FAIL and "of baseline 3002 MHz" in v.summary
    v = slow(loaded(clock_sm_mhz=1500.0), clock_sm_mhz_under_load=3000.0)
    assert v.verdict == PASS


def test_slow_state_class_b_throughput_edge_at_80_percent_of_baseline():
    v = slow(loaded(clock_sm_mhz=1900.0, fp32_tflops=80.0), fp32_tflops=100.0)
    assert v.verdict == PASS and "fp32_tflops 80% of baseline" in v.summary
    v = slow(loaded(clock_sm_mhz=1900.0, fp32_tflops=79.9), fp32_tflops=100.0)
    assert (v.verdict, v.action) == (FAIL, "AC_POWER_CYCLE")
    assert "class B: fp32_tflops 79.9 TFLOP/s is 80% of baseline 100" in v.summary
    # a zero baseline is no reference
    v = slow(loaded(clock_sm_mhz=1900.0, fp32_tflops=1.0), fp32_tflops=0.0)
    assert v.verdict == PASS and "no throughput baseline" in v.summary


def test_slow_state_utilization_edge_at_80_percent():
    d = dev(clock_sm_max_mhz=2000.0, under_load=UnderLoad(utilization_pct=80.0, clock_sm_mhz=100.0))
    assert slow(d).verdict == FAIL  # kept busy: the low clock is the slow state
    d = dev(clock_sm_max_mhz=2000.0, under_load=UnderLoad(utilization_pct=79.9, clock_sm_mhz=100.0))
    v = slow(d)
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert "utilization under load 79.9 % (< 80 %)" in v.summary
    # no utilization figure: P8 or deeper says idle, P7 does not
    v = slow(dev(clock_sm_max_mhz=2000.0, under_load=UnderLoad(pstate=8, clock_sm_mhz=100.0)))
    assert v.verdict == WARN and "P8 (an idle performance state)" in v.summary
    v = slow(dev(clock_sm_max_mhz=2000.0, under_load=UnderLoad(pstate=7, clock_sm_mhz=100.0)))
    assert v.verdict == FAIL


def test_slow_state_power_limit_edges():
    lim = 700_000.0
    at = dev(clock_sm_max_mhz=2000.0, power_limit_mw=lim,
             under_load=UnderLoad(utilization_pct=100.0, clock_sm_mhz=900.0, power_mw=0.95 * lim))
    v = slow(at)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "at the enforced power limit 700.0 W" in v.summary
    assert v.remedy.startswith("the power limiter holds the clock")
    under = dev(clock_sm_max_mhz=2000.0, power_limit_mw=lim,
                under_load=UnderLoad(utilization_pct=100.0, clock_sm_mhz=900.0, power_mw=0.949 * lim))
    assert slow(under).verdict == FAIL
    # with the SW power cap bit the limiter's average sits lower: 90 %
    capped = dev(clock_sm_max_mhz=2000.0, power_limit_mw=lim, clocks_event_reasons=0x4,
                 under_load=UnderLoad(utilization_pct=100.0, clock_sm_mhz=900.0, power_mw=0.90 * lim))
    v = slow(capped)
    assert v.verdict == WARN and "sw_power_cap active" in v.summary
    capped.under_load.power_mw = 0.899 * lim
    assert slow(capped).verdict == FAIL
    over = dev(clock_sm_max_mhz=2000.0, power_limit_mw=lim,
               under_load=UnderLoad(utilization_pct=100.0, clock_sm_mhz=900.0, power_mw=1.06 * lim))
    assert "the power telemetry is suspect" in slow(over).summary


def test_slow_state_only_the_sw_power_cap_bit_lowers_the_power_edge():
    """90 % of the limit explains the clock only with SW power capping (0x4) among the reasons; another
    reason (0x1, GPU idle) is not the limiter: class A."""
    lim = 700_000.0
    for reasons, verdict in ((0x4, WARN), (0x1, FAIL), (0x5, WARN)):
        d = dev(clock_sm_max_mhz=2000.0, power_limit_mw=lim, clocks_event_reasons=reasons,
                under_load=UnderLoad(utilization_pct=100.0, clock_sm_mhz=900.0, power_mw=0.92 * lim))
        v = slow(d)
        assert v.verdict == verdict, (hex(reasons), v.summary)
        assert ("sw_power_cap active" in v.summary) is (verdict == WARN)


@pytest.mark.parametrize("fraction, suspect", [(1.05, False), (1.0501, True)])
def test_slow_state_power_reading_suspect_only_above_105_percent(fraction, suspect):
    """A reading at 105 % of the enforced limit is still within what the limiter's averaging lets a
    sample show; only above it is the telemetry called suspect (735.0 W on 700 W is exactly 105 %)."""
    lim = 700_000.0
    d = dev(clock_sm_max_mhz=2000.0, power_limit_mw=lim,
            under_load=UnderLoad(utilization_pct=100.0, clock_sm_mhz=900.0, power_mw=fraction * lim))
    v = slow(d)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "at the enforced power limit 700.0 W" in v.summary
    assert ("the power telemetry is suspect" in v.summary) is suspect, v.summary


def test_slow_state_explained_by_a_clock_event_reason_is_no_power_cycle():
    d = loaded(clock_sm_mhz=500.0, clocks_event_reasons=0x20)
    v = slow(d)
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert "sw_thermal_slowdown active (gpu.clock-events names the cause)" in v.summary
    assert v.remedy.startswith("fix what gpu.clock-events names first")


def test_slow_state_busy_gpu_and_no_figures():
    d = loaded(clock_sm_mhz=500.0)
    d.processes = [{"pid": 4242, "name": "python3", "type": "compute", "used_bytes": 1}]
    v = slow(d)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "inconclusive: GPU busy (pid 4242, python3" in v.summary
    v = slow(dev(load_why="CUDA not available"))
    assert v.verdict == WARN and "the load probe gave no figures (CUDA not available)" in v.summary
    v = slow(dev())
    assert (v.verdict, v.action) == (SKIP, "NONE")
    assert v.summary.endswith("no under-load readings (idle clocks are low by design)")


# ---------------------------------------------------------------- gpu.present, gpu.sm-count, gpu.memory, gpu.processes

def test_present_every_verdict():
    from afddiag.playbook import Playbook

    v = judge("gpu.present", gpu(dev(sm_count=132, compute_capability=(9, 0)), driver_version="580.1"))
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "1 GPU(s): GPU 0 NVIDIA H200 (132 SMs, cc 9.0); driver 580.1"
    v = judge("gpu.present", gpu(dev()), playbook=Playbook(name="expert", gpu_model="GB10"))
    assert (v.verdict, v.action) == (FAIL, "SET_ENV") and v.summary.endswith("role expert expects a GB10")
    nogpu = observation(gpu=GpuFacts(why="no NVIDIA driver"))
    v = judge("gpu.present", nogpu)
    assert (v.verdict, v.action) == (SKIP, "NONE") and v.summary == "no NVIDIA driver"
    v = judge("gpu.present", nogpu, playbook=Playbook(name="expert", requires=["gpu"]))
    assert (v.verdict, v.action) == (FAIL, "INSTALL") and v.summary.endswith("; role expert requires a GPU")
    v = judge("gpu.present", observation(), playbook=Playbook(name="expert", requires=["gpu"]))
    assert (v.verdict, v.action) == (FAIL, "RERUN")  # not looked at: nothing to install
    fell = observation(gpu=GpuFacts(why="no GPU", xid_events=[{"xid": 79, "pci": "0000:3b:00", "text": "x"}]))
    v = judge("gpu.present", fell, playbook=Playbook(name="expert", requires=["gpu"]))
    assert v.verdict == SKIP and v.summary.startswith("not judged: gpu.errors failed (Xid 79")
    v = judge("gpu.errors", fell)
    assert (v.verdict, v.action) == (FAIL, "REBOOT")


def test_sm_count_every_verdict():
    v = judge("gpu.sm-count", gpu(dev(sm_count=132)), expect_sm=132)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "1 GPU(s) have 132 SMs, as the image expects (--expect-sm)"
    v = judge("gpu.sm-count", gpu(dev(sm_count=114)), expect_sm=132)
    assert (v.verdict, v.action) == (FAIL, "REBUILD_IMAGE")
    assert v.summary == "GPU 0 NVIDIA H200: image built for 132 SMs, this GPU has 114"
    mig = GpuDevice(0, name="NVIDIA H200 MIG 3g.71gb", sm_count=60)
    v = judge("gpu.sm-count", gpu(mig), expect_sm=132)
    assert (v.verdict, v.action) == (FAIL, "RESET_GPU") and "a MIG instance (3g.71gb, 60 SMs)" in v.summary
    v = judge("gpu.sm-count", gpu(dev()), expect_sm=132)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "SM count could not be read" in v.summary
    v = judge("gpu.sm-count", gpu(dev(sm_count=132)))
    assert (v.verdict, v.action) == (SKIP, "NONE") and v.summary.startswith("no expected SM count")
    assert v.facts["expected"] is None and v.facts["expected_from"] is None  # no source for what was not given
    v = judge("gpu.sm-count", observation(gpu=GpuFacts(why="no driver")), expect_sm=132)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "but no GPU is seen (no driver)" in v.summary


def test_memory_edges():
    from afddiag.playbook import Playbook

    total = 100 * 2**30
    pb = Playbook(name="coordinator", reserve_fraction=0.5, min_memory_bytes=80 * 10**9)
    d = dev(memory_total_bytes=total, memory_free_bytes=total // 2, memory_source="nvml")
    v = judge("gpu.memory", gpu(d), playbook=pb)
    assert (v.verdict, v.action) == (PASS, "NONE") and v.summary == "GPU 0 NVIDIA H200: 100.0 GiB (nvml)"
    d.memory_free_bytes = total // 2 - 1
    v = judge("gpu.memory", gpu(d), playbook=pb)
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES") and "a 50% reservation needs 50.00 GiB" in v.summary
    exact = dev(memory_total_bytes=80 * 10**9, memory_free_bytes=80 * 10**9)  # the role's minimum, exactly
    assert judge("gpu.memory", gpu(exact), playbook=pb).verdict == PASS
    small = dev(memory_total_bytes=80 * 10**9 - 1, memory_free_bytes=80 * 10**9 - 1)
    v = judge("gpu.memory", gpu(small), playbook=pb)
    assert v.verdict == FAIL and "role coordinator needs 80 GB" in v.summary
    v = judge("gpu.memory", gpu(dev(memory_total_bytes=total)), playbook=pb)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "free memory not read" in v.summary
    v = judge("gpu.memory", gpu(dev()))
    assert (v.verdict, v.action) == (WARN, "RERUN") and "total memory not read" in v.summary
    v = judge("gpu.memory", observation("snapshot /tmp/s", gpu=GpuFacts(available=True, devices=[dev()])))
    assert v.verdict == SKIP and "total memory not recorded in the snapshot" in v.summary
    unified = dev(memory_total_bytes=total, unified=True, memory_source="meminfo, unified memory")
    assert judge("gpu.memory", gpu(unified), playbook=pb).verdict == PASS  # gpu.headroom judges unified memory


def test_processes_every_verdict():
    from afddiag.playbook import Playbook

    other = {"pid": 4242, "name": "python3", "used_bytes": 2 * 2**30, "type": "compute"}
    v = judge("gpu.processes", gpu(dev(processes=[other])))
    assert (v.verdict, v.action) == (WARN, "STOP_PROCESSES")
    assert v.summary == "other processes hold GPU memory: GPU 0 NVIDIA H200: pid 4242 python3 2.00 GiB"
    v = judge("gpu.processes", gpu(dev(processes=[other])), playbook=Playbook(name="c", reserve_fraction=0.9))
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES") and "(a 90% memory reservation will fail)" in v.summary
    v = judge("gpu.processes", gpu(dev(processes=[other])), playbook=Playbook(name="c", reserve_bytes=8 * 2**30))
    assert v.verdict == FAIL and "(the 8.0 GiB reservation of role c may not fit)" in v.summary
    own = {"pid": 7, "name": "afddiag", "type": "compute"}
    xorg = {"pid": 9, "name": "Xorg", "type": "graphics", "used_bytes": 2**20}
    v = judge("gpu.processes", gpu(dev(processes=[own, xorg])))
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert "(afddiag's own context left out: pid 7)" in v.summary and "graphics (display server)" in v.summary
    v = judge("gpu.processes", gpu(dev(processes="NOT_SUPPORTED")))
    assert (v.verdict, v.action) == (SKIP, "NONE") and v.summary.startswith("GPU process list not read")
    v = judge("gpu.processes", gpu(dev(processes=[]), GpuDevice(1, name="NVIDIA H200")))
    assert v.verdict == PASS and v.summary.startswith("1 GPU(s): no other compute process")


def test_memory_and_headroom_never_tell_to_stop_what_processes_calls_no_tenant():
    """A desktop's display server holds the memory a reservation finds short: gpu.processes passes it as no
    tenant, so gpu.memory and gpu.headroom do not say "stop the processes" for the same reading."""
    from afddiag.playbook import Playbook

    total = 32 * 2**30
    xorg = {"pid": 1234, "name": "/usr/lib/xorg/Xorg", "used_bytes": 2 * 2**30, "type": "graphics"}
    shell = {"pid": 2345, "name": "gnome-shell", "used_bytes": 2**30, "type": "graphics"}
    own = {"pid": 7, "name": "afddiag", "type": "compute"}
    desk = dev(memory_total_bytes=total, memory_free_bytes=29 * 2**30, memory_source="nvml",
               processes=[xorg, shell, own])
    pb = Playbook(name="coordinator", reserve_fraction=0.97)
    procs = judge("gpu.processes", gpu(desk), playbook=pb)
    assert procs.verdict == PASS and "not tenants" in procs.summary
    for gid, playbook in (("gpu.memory", pb), ("gpu.headroom", Playbook(name="c", reserve_bytes=31 * 2**30))):
        v = judge(gid, gpu(desk), playbook=playbook)
        assert (v.verdict, v.action) == (FAIL, "SET_ENV"), (gid, v.action, v.remedy)
        assert "a display server holds the rest (no compute tenant)" in v.summary
        assert "stop" not in v.remedy.replace("it is not a process to stop", "")
        assert v.remedy.startswith("the display server holds the rest (pid 1234 /usr/lib/xorg/Xorg 2.00 GiB, "
                                   "pid 2345 gnome-shell 1.00 GiB)")
        assert "at most 0.90 of this GPU's memory" in v.remedy
    # a compute tenant beside the display: then both gates say stop it, as gpu.processes does
    tenant = {"pid": 4242, "name": "python3", "used_bytes": 2**30, "type": "compute"}
    desk.processes = [xorg, tenant]
    assert judge("gpu.processes", gpu(desk), playbook=pb).action == "STOP_PROCESSES"
    v = judge("gpu.memory", gpu(desk), playbook=pb)
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES") and v.remedy.startswith("stop the other processes")
    v = judge("gpu.headroom", gpu(desk), playbook=Playbook(name="c", reserve_bytes=31 * 2**30))
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES")


# ---------------------------------------------------------------- gpu.headroom

def headroom(d: GpuDevice, meminfo=None, **pb):
    from afddiag.playbook import Playbook

    return judge("gpu.headroom", gpu(d, host_meminfo_kb=meminfo), playbook=Playbook(name="expert", **pb))


def test_unified_memory_held_by_shared_memory_no_process_holds_names_the_files_not_processes():
    """A GB10 whose memory a killed engine's POSIX shared memory still holds: no process to stop. The files are
    named with path and owner, and removing them is the remedy (CLEAN_SHM); live holders are stopped by pid."""
    from afddiag.model.shm import ShmFacts, ShmFile
    from afddiag.playbook import Playbook

    gb10 = GpuDevice(0, name="NVIDIA GB10", unified=True, memory_total_bytes=128 * 2**30)
    need = 100 * 2**30
    meminfo = {"MemFree": 40 * 2**20, "MemAvailable": 45 * 2**20, "Cached": 75 * 2**20, "Shmem": 60 * 2**20}
    left = ShmFile("/dev/shm/vllm-kv-7f3a", 60 * 2**30, "afd", holders=[])
    tiny = ShmFile("/dev/shm/sem.mp-1", 4096, "root", holders=[])

    def judged(shm):
        obs = observation(gpu=GpuFacts(available=True, devices=[gb10], host_meminfo_kb=meminfo), shm=shm)
        return judge("gpu.headroom", obs, playbook=Playbook(name="expert", reserve_bytes=need))

    v = judged(ShmFacts(files=[left, tiny], total_bytes=left.bytes + 4096, entries=2, holders_read=True))
    assert (v.verdict, v.action) == (FAIL, "CLEAN_SHM"), (v.action, v.remedy)
    assert ("shared memory no live process maps or holds open: 60.0 GiB in /dev/shm/vllm-kv-7f3a (owner afd, "
            "60.0 GiB)") in v.summary and "sem.mp-1" not in v.summary
    assert v.remedy.startswith("remove the shared memory an exited engine left behind, no process to stop for it")
    assert v.commands == ["sudo rm -- /dev/shm/vllm-kv-7f3a"]
    assert "stop the processes" not in v.remedy
    # a live engine still maps it: stop that one, named by pid
    v = judged(ShmFacts(files=[ShmFile(left.path, left.bytes, "afd", holders=[4242])], holders_read=True))
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES") and "/dev/shm/vllm-kv-7f3a: pid 4242" in v.remedy
    # the processes could not all be read (not root): named, and checked before anything is removed
    v = judged(ShmFacts(files=[ShmFile(left.path, left.bytes, "afd", holders=None)], holders_read=False))
    assert v.action == "STOP_PROCESSES" and v.remedy.startswith("check /dev/shm first")
    assert v.commands == ["sudo fuser -v -- /dev/shm/vllm-kv-7f3a"]
    # less than the shortfall: both the files and the processes
    small = ShmFile("/dev/shm/x", 2**30, "afd", holders=[])
    v = judged(ShmFacts(files=[small], holders_read=True))
    assert v.action == "STOP_PROCESSES" and v.remedy.startswith("remove the shared memory") and "; and stop" in v.remedy
    # nothing notable in /dev/shm, or not read: the processes, as before
    for shm in (ShmFacts(files=[tiny], holders_read=True), None, ShmFacts(captured=False)):
        v = judged(shm)
        assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES") and "shared memory" not in v.summary


def test_unified_headroom_memfree_and_memavailable_edges():
    gb10 = GpuDevice(0, name="NVIDIA GB10", unified=True, memory_total_bytes=128 * 2**30)
    need = 64 * 2**30
    kib = need // 1024
    v = headroom(gb10, {"MemFree": kib, "MemAvailable": kib}, reserve_bytes=need)
    assert (v.verdict, v.action) == (PASS, "NONE")
    v = headroom(gb10, {"MemFree": kib - 1, "MemAvailable": kib, "Cached": 10, "Buffers": 1}, reserve_bytes=need)
    assert (v.verdict, v.action) == (WARN, "DROP_CACHES")
    v = headroom(gb10, {"MemFree": kib - 1, "MemAvailable": kib - 1, "Cached": 10}, reserve_bytes=need)
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES")
    assert "processes hold the memory, dropping caches will not free it" in v.summary
    v = headroom(gb10, {"MemAvailable": kib}, reserve_bytes=need)
    assert v.verdict == PASS and "(MemFree not captured" in v.summary
    v = headroom(gb10, {}, reserve_bytes=need)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "MemAvailable not read" in v.summary
    v = headroom(gb10, {"MemFree": kib, "MemAvailable": kib}, reserve_fraction=0.5)
    assert v.verdict == PASS and "50% reservation of role expert" in v.summary
    v = headroom(gb10, {"MemFree": kib, "MemAvailable": kib})
    assert (v.verdict, v.action) == (SKIP, "NONE") and "plans no reservation" in v.summary


def test_discrete_headroom_nvml_free_edge():
    need = 40 * 2**30
    d = dev(memory_total_bytes=141 * 2**30, memory_free_bytes=need)
    v = headroom(d, reserve_bytes=need)
    assert (v.verdict, v.action) == (PASS, "NONE") and "NVML free 40.00 GiB covers the 40.00 GiB" in v.summary
    d.memory_free_bytes = need - 1
    v = headroom(d, reserve_bytes=need)
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES") and "is below the 40.00 GiB reservation" in v.summary
    d.memory_free_bytes = None
    v = headroom(d, reserve_bytes=need)
    assert (v.verdict, v.action) == (WARN, "RERUN") and "NVML free memory not read" in v.summary
    v = headroom(dev(memory_total_bytes=141 * 2**30), reserve_fraction=0.9)
    assert v.verdict == SKIP and "gpu.memory judges NVML free memory against the 90% reservation" in v.summary


# ---------------------------------------------------------------- gpu.image-arch

def image(arch="", cc=(9, 0), driver_cuda=12080, **env):
    from afddiag.model.host import ImageFacts

    img = ImageFacts(ref="afd:1", labels={"afd.cuda_arch_list": arch} if arch else {}, env=env)
    o = observation(gpu=GpuFacts(available=True, cuda_driver_version=driver_cuda,
                                 devices=[GpuDevice(0, name="NVIDIA H200", compute_capability=cc)]), image=img)
    return judge("gpu.image-arch", o)


@pytest.mark.parametrize("arch, verdict", [
    ("9.0", PASS), ("9.0a", PASS), ("sm_90", PASS), ("90", PASS), ("8.0 9.0a", PASS),
    ("8.9", FAIL), ("8.0+PTX", WARN), ("compute_80", WARN), ("10.0", FAIL), ("10.0+PTX", FAIL), ("7.5a", FAIL),
    ("9.0+PTX", WARN), ("compute_90", WARN)])  # PTX of the GPU's own SM: JIT-compiled at start, still runs
def test_image_arch_against_the_gpus_compute_capability(arch, verdict):
    v = image(arch)
    assert (v.verdict, v.action) == (verdict, "REBUILD_IMAGE" if verdict != PASS else "NONE")


def test_image_arch_ptx_words_and_no_gpu_facts():
    v = image("8.0+PTX")
    assert v.summary == ("GPU 0 NVIDIA H200 is sm_90; image has only PTX for it (sm_80+PTX): JIT-compiled at start")
    from afddiag.model.host import ImageFacts

    img = ImageFacts(ref="afd:1", labels={"afd.cuda_arch_list": "9.0"})
    v = judge("gpu.image-arch", observation(image=img))  # an image inspected, the GPU not probed
    assert (v.verdict, v.action, v.summary) == (SKIP, "NONE", "GPU not probed")


def test_binary_compatibility_holds_within_one_major_only():
    v = image("12.0", cc=(12, 1))
    assert (v.verdict, v.action) == (WARN, "REBUILD_IMAGE") and "runs by binary compatibility" in v.summary
    assert image("12.0a", cc=(12, 1)).verdict == FAIL  # arch-specific kernels are for that one SM only
    assert image("12.1", cc=(12, 0)).verdict == FAIL


def test_image_arch_cuda_version_edge_and_skips():
    v = image("9.0", NVIDIA_REQUIRE_CUDA="cuda>=12.8 brand=tesla")
    assert v.verdict == PASS and v.summary == "image afd:1 has kernels for sm_90; needs CUDA 12.8, driver has 12.8"
    v = image("9.0", driver_cuda=12070, CUDA_VERSION="12.8.1")
    assert (v.verdict, v.action) == (FAIL, "REBUILD_IMAGE")
    assert v.summary == "the driver supports CUDA 12.7, image afd:1 needs 12.8"
    v = image("", TORCH_CUDA_ARCH_LIST="9.0")
    assert v.verdict == PASS
    v = image("")
    assert (v.verdict, v.action) == (SKIP, "NONE") and v.summary.startswith("image afd:1: no arch list")
    from afddiag.model.host import ImageFacts

    g = GpuFacts(available=True, devices=[GpuDevice(0, name="NVIDIA H200")])
    v = judge("gpu.image-arch", observation(gpu=g, image=ImageFacts(failed="docker inspect timed out")))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = judge("gpu.image-arch", observation(gpu=g))
    assert v.summary == "image not inspected: no image given (--launch-env with AFD_IMAGE)"
    v = judge("gpu.image-arch", observation(gpu=g), launch_env={"AFD_ROLE": "expert"})
    assert v.summary == "image not inspected: no AFD_IMAGE in the launch env"


def test_replayed_missing_figure_quotes_only_the_capture_notes_about_that_gpu():
    """On a replay, GPU 0's missing total memory is a claim about the host only when the capture noted
    the read failing on GPU 0 or on no GPU in particular; a note about GPU 1's failed read is no
    evidence about GPU 0 (its figure was simply not recorded)."""
    other = "NVML device 1: nvmlDeviceGetMemoryInfo failed: NVMLError_GpuIsLost: GPU is lost"
    mine = "NVML device 0: nvmlDeviceGetMemoryInfo failed: NVMLError_Unknown: Unknown Error"
    host = "NVML: nvmlDeviceGetMemoryInfo failed: NVMLError_DriverNotLoaded: Driver Not Loaded"

    def replay(*notes: str) -> object:
        return judge("gpu.memory", observation("snapshot /tmp/s", gpu=GpuFacts(available=True, devices=[dev()],
                                                                                notes=list(notes))))

    v = replay(other)
    assert (v.verdict, v.action) == (SKIP, "NONE") and "total memory not recorded in the snapshot" in v.summary
    assert "GPU is lost" not in v.summary
    for note in (mine, host):
        v = replay(other, note)
        assert (v.verdict, v.action) == (WARN, "RERUN") and "total memory not read" in v.summary
        assert v.summary.endswith(f"(the capture says: {note})"), v.summary


@pytest.mark.parametrize("fraction, refused", [(0.8, False), (0.79, True)])
def test_baseline_refuses_a_figure_below_the_reference_floor_only(fraction, refused):
    """A figure at 80 % of the reference table's for the model is still a healthy baseline; below it,
    recording it would make a slow GPU the reference."""
    from afddiag import baseline
    from afddiag.gates.refusals import gpu_refusals

    ref = baseline.REFERENCE["NVIDIA H200"]["bf16_tflops"]
    readings = {"devices": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA H200", "nvml": {"clock_sm_max_mhz": 1980},
                             "under_load": {"clock_sm_mhz": 1980, "utilization_pct": 100,
                                            "achieved": {"bf16_tflops": fraction * ref}}}]}
    said = [r for r in gpu_refusals(readings) if "below the reference table's floor" in r]
    assert bool(said) is refused, said
    if refused:
        assert said[0].startswith("GPU 0 NVIDIA H200: bf16_tflops") and "(80% of 648 for this model)" in said[0]


def test_headroom_with_a_gpu_off_the_bus_points_at_gpu_errors():
    """A GPU that fell off the bus (no NVML readings, Xid 79 on its address) with the readable GPU's
    reservation covered: headroom is not judged on that host (gpu.errors is the root, one fault one
    remedy), and says what it found on the readable one; with the readable one short, that FAIL stands."""
    from afddiag.playbook import Playbook

    pb = Playbook(name="expert", reserve_bytes=8 * 2**30)
    lost = GpuDevice(1, name="NVIDIA H200", pci_bus_id="0000:5b:00.0", nvml_read=False)
    xid79 = [{"xid": 79, "pci": "0000:5b:00", "text": "NVRM: Xid (PCI:0000:5b:00): 79, GPU has fallen off the bus."}]
    ok = dev(memory_total_bytes=141 * 2**30, memory_free_bytes=100 * 2**30)
    v = judge("gpu.headroom", gpu(ok, lost, xid_events=xid79), playbook=pb)
    assert (v.verdict, v.action) == (SKIP, "NONE")
    assert v.summary.startswith("not judged: gpu.errors failed (Xid 79, GPU has fallen off the bus on 0000:5b:00")
    assert "; readable: GPU 0 NVIDIA H200: NVML free 100.00 GiB covers the 8.00 GiB reservation" in v.summary
    short = dev(memory_total_bytes=141 * 2**30, memory_free_bytes=4 * 2**30)
    v = judge("gpu.headroom", gpu(short, lost, xid_events=xid79), playbook=pb)
    assert (v.verdict, v.action) == (FAIL, "STOP_PROCESSES") and "is below the 8.00 GiB reservation" in v.summary


@pytest.mark.parametrize("event, judged", [
    ({"xid": 154, "text": "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"}, (PASS, "NONE")),
    ({"xid": 154, "text": "GPU recovery action changed from 0x0 (None) to 0x3 (Drain P2P)"}, (WARN, "NONE")),
    ({"xid": 999, "text": "odd"}, (WARN, "NONE"))])
def test_xid_judgment_asks_for_no_action_unless_it_fails(event, judged):
    """xid_judgment's (verdict, words, action) as its callers read it: an action only with a FAIL."""
    from afddiag.gates.gpu import xid_judgment

    assert xid_judgment(event)[0::2] == judged
