"""Host CPU probe: clocks at idle and during a short fixed-work loop (psutil.cpu_freq), and the
loop's rate — a clock that reads normal but runs slow shows in the rate."""

from __future__ import annotations

import os
import platform
import threading
import time
from typing import Any


def _freqs() -> tuple[list[float], float | None]:
    """Per-CPU current MHz and the max MHz (psutil.cpu_freq; cpufreq in sysfs). [] when absent."""
    import psutil

    try:
        per = psutil.cpu_freq(percpu=True) or []
        mx = max((f.max for f in per if f.max), default=None) or None
        return [f.current for f in per if f.current], mx
    except (OSError, NotImplementedError, AttributeError):
        return [], None


def _work(n: int) -> int:
    """Fixed integer work (an LCG): the same instructions on every host and run."""
    x = 1
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


def read_cpu(work_s: float = 0.3) -> dict[str, Any]:
    """CPU facts: ``model``, ``logical_cpus``, ``max_mhz``, ``idle_mhz`` (median of per-CPU current),
    ``under_load_mhz`` (highest per-CPU current sampled while one core runs the loop), ``loop_mops``
    (millions of loop iterations per second, one core). Sources: psutil.cpu_freq (cpufreq sysfs),
    /proc/cpuinfo. Missing cpufreq (VMs) leaves the clocks None with a note. Never raises."""
    try:
        import psutil
    except ImportError:
        return {"why": "psutil is not installed (apt install python3-psutil, or pip install psutil)"}

    out: dict[str, Any] = {"model": platform.processor() or None, "logical_cpus": psutil.cpu_count(),
                           "max_mhz": None, "idle_mhz": None, "under_load_mhz": None, "loop_mops": None, "notes": []}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model")):
                    out["model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if not out["model"]:  # aarch64 (Grace, GB10) has no model name line: name the machine instead
        for path in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
            try:
                with open(path, "rb") as f:
                    out["model"] = f.read().rstrip(b"\0\n").decode(errors="replace") + " CPU"
                break
            except OSError:
                continue
        out["model"] = out["model"] or f"{platform.machine()} CPU"
    idle, mx = _freqs()
    out["max_mhz"] = mx
    if idle:
        out["idle_mhz"] = sorted(idle)[len(idle) // 2]
    else:
        out["notes"].append("no cpufreq clocks (psutil.cpu_freq empty: a VM or no cpufreq driver)")
    samples: list[float] = []
    stop = threading.Event()

    core = None
    try:  # pin the loop to one core and sample that core: another idle-fast core must not hide it
        core = min(os.sched_getaffinity(0))
        old_affinity = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {core})
    except (AttributeError, OSError):
        old_affinity = None
    out["core"] = core

    def sample() -> None:
        while not stop.wait(0.05):
            cur, _ = _freqs()
            if cur:
                samples.append(cur[core] if core is not None and core < len(cur) else max(cur))

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    n, t0 = 20000, time.perf_counter()
    done = 0
    while time.perf_counter() - t0 < work_s:
        _work(n)
        done += n
    elapsed = time.perf_counter() - t0
    stop.set()
    if old_affinity is not None:
        try:
            os.sched_setaffinity(0, old_affinity)
        except OSError:
            pass
    t.join(1.0)
    out["loop_mops"] = round(done / elapsed / 1e6, 3)
    if samples:
        out["under_load_mhz"] = sorted(samples)[len(samples) // 2]
    return out
