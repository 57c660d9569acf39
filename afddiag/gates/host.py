"""Host gates: the CPU clock under a short fixed-work load (Sparks were seen stuck below 2 GHz)."""

from __future__ import annotations

from afddiag.catalog import remedy
from afddiag.gates import Context, probe_failed
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

SLOW_CLOCK_FRACTION = 0.5
SLOW_LOOP_FRACTION = 0.8


def cpu_clock(ctx: Context) -> Verdict:
    gid = "host.cpu-clock"
    cpu = ctx.obs.cpu
    if (v := probe_failed(gid, cpu or {})) is not None:
        return v
    if not cpu:
        return Verdict(gid, SKIP, "CPU not probed (or not in the snapshot)", "run on the host")
    if cpu.get("why"):
        return Verdict(gid, SKIP, cpu["why"], "run on the host")
    base = ctx.expect.value("cpu_baseline") or {}
    clk, mx, rate = cpu.get("under_load_mhz"), cpu.get("max_mhz"), cpu.get("loop_mops")
    min_mhz = ctx.playbook.cpu_min_mhz
    facts = {"cpu": cpu, "baseline": base or None, "min_mhz": min_mhz or None}
    found = []
    if isinstance(clk, (int, float)):
        if min_mhz and clk < min_mhz:
            found.append(f"clock under load {clk:.0f} MHz, below the role's {min_mhz} MHz")
        elif isinstance(mx, (int, float)) and mx and clk < SLOW_CLOCK_FRACTION * mx:
            found.append(f"clock under load {clk:.0f} MHz is {clk / mx:.0%} of max {mx:.0f} MHz")
    ref = base.get("loop_mops")
    if isinstance(rate, (int, float)) and isinstance(ref, (int, float)) and ref > 0 and rate < SLOW_LOOP_FRACTION * ref:
        found.append(f"fixed-work loop {rate:g} Mop/s is {rate / ref:.0%} of the baseline {ref:g}")
    model = cpu.get("model") or "CPU"
    if found:
        return Verdict(gid, FAIL, f"{model}: " + "; ".join(found), remedy(gid), facts)
    compared = bool(ref) or (clk is not None and (bool(min_mhz) or bool(mx)))
    if not compared:
        what = "no cpufreq clock" if clk is None else f"clock under load {clk:.0f} MHz but no max and no role minimum"
        return Verdict(gid, WARN if min_mhz else SKIP, f"{model}: {what}, and no baseline to compare the "
                       f"loop's {rate} Mop/s with", "record a baseline on a healthy host: `afddiag baseline record`",
                       facts)
    parts = [f"clock under load {clk:.0f} MHz" + (f" of max {mx:.0f}" if mx else "")] if clk else []
    parts += [f"loop {rate:g} Mop/s" + (f" ({rate / ref:.0%} of baseline)" if ref else "")]
    return Verdict(gid, PASS, f"{model}: " + ", ".join(parts), "nothing to do", facts)


GATES = [("host.cpu-clock", cpu_clock)]
