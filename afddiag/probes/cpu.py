"""Host CPU probe: clocks at idle and during a short fixed-work loop (psutil.cpu_freq), and the
loop's rate — a clock that reads normal but runs slow shows in the rate.

The loop runs as several short samples on one pinned core. Each sample records its rate (wall
clock) and how much of its wall time the loop's thread was on the CPU (CLOCK_THREAD_CPUTIME_ID): a
sample that lost its core to another process is slow for that reason, not the CPU's. The best
sample is the rate (noise only ever slows a loop). The core's cpufreq policy (governor, driver,
scaling_max_freq) and, where the kernel has them, its thermal throttle counters around the loop
are recorded: they are what explains a low clock other than a stuck power state."""

from __future__ import annotations

import os
import platform
import threading
import time
from typing import Any

from afddiag.probes.registry import Artifact, Probe, Run, read_source
from afddiag.textnum import kernel_int

SAMPLES = 5  # short loop samples; the best is the rate
LOOP_S = 0.3  # the fixed-work loop's length, seconds (all samples)
# The shortest time bound in which the probe can measure: the loop plus cpufreq and thermal reads and the
# clock sampler's last 50 ms step (0.33-0.36 s measured on a loaded 2-core VM). A live run with a shorter
# bound (--timeout, the playbook's cpu_s) does not start the loop: it could only time out, which is no
# evidence about the CPU.
MIN_BOUND_S = 0.5


def _freqs() -> tuple[list[float], float | None]:
    """Per-CPU current MHz and the max MHz (psutil.cpu_freq; cpufreq in sysfs). [] when absent."""
    import psutil

    try:
        per = psutil.cpu_freq(percpu=True) or []
        mx = max((f.max for f in per if f.max), default=None) or None
        return [f.current for f in per if f.current], mx
    except (OSError, NotImplementedError, AttributeError):
        return [], None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(256).strip() or None
    except OSError:
        return None


def cpufreq_policy(core: int | None, sys_root: str = "/sys") -> dict[str, Any]:
    """The cpufreq policy of ``core``: ``governor`` (scaling_governor: "performance", "schedutil",
    "powersave", ...), ``scaling_driver`` ("intel_pstate", "acpi-cpufreq", "cppc_cpufreq", ...),
    ``scaling_max_mhz`` (scaling_max_freq, kHz → MHz: a cap an admin or a power profile set). Each
    None when unreadable (VMs have no cpufreq). Source: /sys/devices/system/cpu/cpu<N>/cpufreq/.
    Never raises."""
    base = f"{sys_root}/devices/system/cpu/cpu{core if core is not None else 0}/cpufreq"
    smax = _read(f"{base}/scaling_max_freq")
    return {"governor": _read(f"{base}/scaling_governor"), "scaling_driver": _read(f"{base}/scaling_driver"),
            "scaling_max_mhz": (lambda k: k / 1000 if k else None)(kernel_int(smax, 1, 2**31 - 1))}


def throttle_count(core: int | None, sys_root: str = "/sys") -> int | None:
    """The core's thermal throttle events so far (x86 ``thermal_throttle/core_throttle_count`` plus
    ``package_throttle_count``), None when the kernel has no such counters (ARM, VMs). Never raises."""
    base = f"{sys_root}/devices/system/cpu/cpu{core if core is not None else 0}/thermal_throttle"
    vals = [_read(f"{base}/{n}_throttle_count") for n in ("core", "package")]
    nums = [n for n in (kernel_int(v, 0, 2**63 - 1) for v in vals) if n is not None]
    return sum(nums) if nums else None


TRIP_TYPES = ("passive", "hot", "critical")  # trip points at which the kernel throttles or shuts down


def thermal_zones(sys_root: str = "/sys") -> list[dict[str, Any]] | None:
    """The thermal zones the kernel exposes (``/sys/class/thermal/thermal_zone<N>/``): per zone
    ``{"zone", "type", "temp_c", "trip_c"}``, ``temp_c`` from ``temp`` (millidegrees Celsius) and
    ``trip_c`` the lowest ``trip_point_<i>_temp`` whose ``trip_point_<i>_type`` is passive, hot or
    critical (the temperature at which the kernel starts throttling), None when unread. The way to
    see thermal throttling where the CPU has no throttle counters (ARM, e.g. GB10's Cortex cores).
    None when there are no zones (VMs). Never raises."""
    base = f"{sys_root}/class/thermal"
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("thermal_zone"))
    except OSError:
        return None
    zones = []
    for n in names:
        z = f"{base}/{n}"
        temp = kernel_int(_read(f"{z}/temp"), -273_000, 1_000_000)
        trips = []
        for i in range(32):
            kind = _read(f"{z}/trip_point_{i}_type")
            if kind is None:
                break
            t = kernel_int(_read(f"{z}/trip_point_{i}_temp"), -273_000, 1_000_000)
            if kind in TRIP_TYPES and t is not None and t > 0:
                trips.append(t)
        zones.append({"zone": n, "type": _read(f"{z}/type"), "temp_c": temp / 1000 if temp is not None else None,
                      "trip_c": min(trips) / 1000 if trips else None})
    return zones or None


def _work(n: int) -> int:
    """Fixed integer work (an LCG): the same instructions on every host and run."""
    x = 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def run_loop(work_s: float, samples: int = SAMPLES) -> list[dict[str, float]]:
    """Run the fixed-work loop as ``samples`` samples of ``work_s / samples`` seconds each on the
    calling thread → ``[{"mops", "on_cpu"}]``: millions of loop iterations per wall second, and the
    fraction (0..1) of the sample's wall time the thread was on a CPU (thread CPU time / wall time;
    below 1 when another process took the core). Never raises."""
    per = max(work_s / max(samples, 1), 0.002)
    out = []
    n = 20000
    for _ in range(max(samples, 1)):
        done, t0, c0 = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - t0 < per:
            _work(n)
            done += n
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        out.append({"mops": round(done / wall / 1e6, 3), "on_cpu": round(min(cpu / wall, 1.0), 3) if wall else 1.0})
    return out


def cpu_model() -> str:
    """The CPU's name: ``model name`` of /proc/cpuinfo, else the device tree's machine model + " CPU"
    (aarch64: Grace, GB10 have no model name line), else ``platform.processor()``/the machine type."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.processor():
        return platform.processor()
    for path in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
        try:
            with open(path, "rb") as fb:
                return fb.read().rstrip(b"\0\n").decode(errors="replace") + " CPU"
        except OSError:
            continue
    return f"{platform.machine()} CPU"


def read_cpu(work_s: float = LOOP_S, samples: int = SAMPLES) -> dict[str, Any]:
    """CPU facts: ``model``, ``logical_cpus``, ``max_mhz``, ``idle_mhz`` (median of per-CPU current),
    ``under_load_mhz`` (median of the loop core's current clock sampled every 50 ms while it runs the
    loop), ``loop_mops`` (millions of loop iterations per second, one core, the best of
    ``loop_samples_mops``), ``loop_samples_mops`` and ``loop_on_cpu`` (per sample: rate, and the
    fraction of wall time the loop was on the CPU), ``loop_mops_on_cpu`` (the best sample's rate per
    second the loop was on the CPU: what another process taking the core does not lower; None when no
    sample ran 5 % of its time), ``load_avg_1m`` (os.getloadavg), ``governor``,
    ``scaling_driver``, ``scaling_max_mhz`` (:func:`cpufreq_policy`), ``throttle_events`` (thermal
    throttle events on the loop's core during the loop; None when not counted), ``thermal_zones``
    (:func:`thermal_zones` right after the loop; None without zones). Sources:
    psutil.cpu_freq (cpufreq sysfs), /proc/cpuinfo, /sys/devices/system/cpu. Missing cpufreq (VMs)
    leaves the clocks None with a note. Never raises."""
    try:
        import psutil
    except ImportError:
        return {"why": "psutil is not installed (apt install python3-psutil, or pip install psutil)"}

    out: dict[str, Any] = {"model": cpu_model(), "logical_cpus": psutil.cpu_count(),
                           "max_mhz": None, "idle_mhz": None, "under_load_mhz": None, "loop_mops": None, "notes": []}
    idle, mx = _freqs()
    out["max_mhz"] = mx
    if idle:
        out["idle_mhz"] = sorted(idle)[len(idle) // 2]
    else:
        out["notes"].append("no cpufreq clocks (psutil.cpu_freq empty: a VM or no cpufreq driver)")
    try:
        out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        out["load_avg_1m"] = None
    clk_samples: list[float] = []
    stop = threading.Event()

    core = None
    try:  # pin the loop to one core and sample that core: another idle-fast core must not hide it
        core = min(os.sched_getaffinity(0))
        old_affinity = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError):
        old_affinity = None
    out["core"] = core
    out.update(cpufreq_policy(core))
    thr0 = throttle_count(core)

    def sample() -> None:
        while not stop.wait(0.05):
            cur, _ = _freqs()
            if cur:
                clk_samples.append(cur[core] if core is not None and core < len(cur) else max(cur))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    loop = run_loop(work_s, samples)
    stop.set()
    if old_affinity is not None:
        try:
            os.sched_setaffinity(0, old_affinity)
        except OSError:
            pass
    t.join(1.0)
    thr1 = throttle_count(core)
    out["throttle_events"] = thr1 - thr0 if thr0 is not None and thr1 is not None else None
    out["thermal_zones"] = thermal_zones()  # read right after the load, when a throttling CPU is hottest
    out["loop_samples_mops"] = [s["mops"] for s in loop]
    out["loop_on_cpu"] = [s["on_cpu"] for s in loop]
    out["loop_mops"] = max(out["loop_samples_mops"])
    per_cpu = [s["mops"] / s["on_cpu"] for s in loop if s["on_cpu"] >= 0.05]
    out["loop_mops_on_cpu"] = round(max(per_cpu), 3) if per_cpu else None
    if clk_samples:
        out["under_load_mhz"] = sorted(clk_samples)[len(clk_samples) // 2]
    return out


# ---------------------------------------------------------------------------------------------
# the probe


def too_short(bound_s: float, source: str) -> dict[str, Any] | None:
    """The CPU facts of a run whose time bound cannot hold the measurement (below :data:`MIN_BOUND_S`):
    ``{"why", "unmeasurable": {"bound_s", "bound_source", "min_bound_s", "loop_s"}}``; None when it can."""
    if bound_s >= MIN_BOUND_S:
        return None
    return {"why": f"not measured: the time bound {bound_s:g} s ({source}) is shorter than the {MIN_BOUND_S:g} s the "
                   f"CPU probe needs to measure (its fixed-work loop alone runs {LOOP_S:g} s), so the loop was not "
                   "started",
            "unmeasurable": {"bound_s": bound_s, "bound_source": source, "min_bound_s": MIN_BOUND_S, "loop_s": LOOP_S}}


def _read_probe(run: Run, progress: Any) -> dict[str, Any]:
    if not run.capturing:  # a capture runs under its own bound (afddiag capture --timeout)
        src = "--timeout" if run.inputs.probe_timeout_s is not None else "the playbook's [timeouts] cpu_s"
        if (short := too_short(run.inputs.timeout("cpu_s"), src)) is not None:
            return {"cpu.json": short}
    progress.doing = "reading cpufreq and running the fixed-work loop"
    return {"cpu.json": read_source(run.src.cpu, lambda: read_cpu())}


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get("cpu.json")
    return {"cpu": raw if isinstance(raw, dict) else None}


PROBE = Probe("cpu", "CPU probe (cpufreq, fixed-work loop)", "cpu_s", (Artifact("cpu.json"),), _read_probe, _facts,
              lambda why: {"cpu": {"why": why, "failed": why}})
