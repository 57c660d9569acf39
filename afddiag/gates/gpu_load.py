"""gpu.slow-state's judging of one GPU's under-load figures (the gate is :func:`afddiag.gates.gpu.slow_state`):
whether the GPU was busy with another job, kept busy by the load probe, held by its power limiter or a
clocks event, or slow against its maximum clock and baseline (class A: the SM clock; class B: a
throughput figure); and the GPU's label and clocks event reason names the other GPU gates share."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from afddiag.gates import Context
from afddiag.model.gpu import THROUGHPUT_FIGURES as THROUGHPUT
from afddiag.model.gpu import GpuDevice, GpuFacts, UnderLoad, busy_evidence, clocks_event_reason_names
from afddiag.verdict import FAIL, PASS, SKIP, WARN

FAIL_BITS = 0x8 | 0x40 | 0x80
WARN_BITS = 0x20
SLOW_CLOCK_FRACTION = 0.5  # class A: under-load SM clock below half of max or of baseline
SLOW_THROUGHPUT_FRACTION = 0.8  # class B: any throughput figure below 80 % of baseline
MIN_UTILIZATION_PCT = 80.0
IDLE_PSTATE = 8  # P8 and deeper are idle performance states; a compute load runs at P0-P2
# under-load power at or above 95 % of the enforced limit: the power limiter holds the clock there
POWER_LIMITED_FRACTION = 0.95
POWER_CAPPED_FRACTION = 0.90  # ... or 90 % with SW power capping active under load (the limiter's averaging window)
SW_POWER_CAP = 0x4


def reason_names(mask: int | None) -> list[str]:
    """Names of the set bits of an NVML clocks event reasons mask ([] for none or unknown)."""
    return clocks_event_reason_names(mask) if mask else []


def gpu_label(d: GpuDevice) -> str:
    """``GPU 0 NVIDIA H200``: how the GPU gates name a GPU."""
    return f"GPU {d.index} {d.name or '?'}"


_MIG_RE = re.compile(r"\bMIG (\d+g\.\d+gb)\b", re.IGNORECASE)


def mig_instance(d: GpuDevice) -> str | None:
    """The MIG profile (``"3g.40gb"``) when device ``d`` is a MIG instance, as CUDA enumerates one with
    MIG mode on (``cuDeviceGetName``: "NVIDIA H100 80GB HBM3 MIG 3g.40gb"; its UUID starts ``MIG-``);
    ``"MIG"`` when only the UUID says so; None for a whole GPU. Pure."""
    m = _MIG_RE.search(d.name or "")
    if m:
        return m.group(1)
    return "MIG" if str(d.uuid or "").upper().startswith("MIG-") else None


def _baseline_kind(src: str) -> str:
    """A short name for a baseline source (the full one is in facts)."""
    for prefix, kind in (("host baseline", "the host baseline"), ("snapshot", "the snapshot baseline"),
                         ("reference table", "the reference table")):
        if src.startswith(prefix):
            return kind
    return "baseline"


def own_pids(d: GpuDevice, g: GpuFacts) -> set[int]:
    """The pids that are afddiag on ``d``: the GPU probe's (``probe_pid``) and the load probe's
    (``own_pid`` of its busy checks before and after). Pure."""
    own = {g.probe_pid} if g.probe_pid is not None else set()
    ul = d.under_load
    for chk in (d.load_busy_before or (ul.busy_before if ul else None) or {}, (ul.busy_after if ul else None) or {}):
        if isinstance(chk.get("own_pid"), int):
            own.add(chk["own_pid"])
    return own


def gpu_busy(d: GpuDevice, g: GpuFacts) -> list[str]:
    """Evidence that another job computes on ``d``: compute processes other than afddiag (NVML, at
    the GPU probe's read, just before and right after the load probe) and utilization at or above
    :data:`afddiag.model.gpu.BUSY_UTILIZATION_PCT` at the GPU probe's read or just before the load probe.
    [] when none was seen. Pure: reads the recorded facts only."""
    own = own_pids(d, g)
    ul = d.under_load
    before = d.load_busy_before or (ul.busy_before if ul else None) or {}
    after = (ul.busy_after if ul else None) or {}
    found = busy_evidence(d.processes, d.utilization_pct, own, "at the GPU probe's read")
    found += busy_evidence(before.get("processes"), before.get("utilization_pct"), own)
    found += busy_evidence(after.get("processes"), None, own)
    return list(dict.fromkeys(found))


BUSY_REMEDY = ("re-run `afddiag gpu --load` when the GPU is idle (stop or wait for the listed process); "
               "nothing is wrong with the GPU on this evidence")


def power_limited(d: GpuDevice) -> str | None:
    """Why ``d``'s under-load clock is the power limiter's doing, or None: the under-load power reading
    (``nvmlDeviceGetPowerUsage``, mW) is at or above :data:`POWER_LIMITED_FRACTION` (95 %) of the
    enforced power limit (``nvmlDeviceGetEnforcedPowerLimit``, mW), or :data:`POWER_CAPPED_FRACTION`
    (90 %) with the SW power cap reason (0x4) set (the limiter holds a running average, so a sample
    sits a few percent under the limit), both read. The GPU then draws all the power
    it is allowed (or its power reading says so), and SW power capping lowers the clock to stay there:
    a low clock at the limit is not the low-power slow state (class A draws far less than any limit),
    and a power cycle does not raise a limit. Words name the figures and the SW power cap bit (0x4)
    when set. None on GPUs whose limit NVML does not report (GB10: NOT_SUPPORTED). Pure."""
    ul = d.under_load
    pw, lim = (ul.power_mw if ul else None), d.power_limit_mw
    if ul is None or not isinstance(pw, (int, float)) or not isinstance(lim, (int, float)) or lim <= 0:
        return None
    cap = ((d.clocks_event_reasons or 0) | (ul.clocks_event_reasons or 0)) & SW_POWER_CAP
    if pw < (POWER_CAPPED_FRACTION if cap else POWER_LIMITED_FRACTION) * lim:
        return None
    over = " (a reading above the limit the GPU may draw: the power telemetry is suspect)" if pw > 1.05 * lim else ""
    return (f"power under load {pw / 1000:.1f} W is at the enforced power limit {lim / 1000:.1f} W{over}"
            + (", sw_power_cap active" if cap else ""))


POWER_LIMITED_REMEDY = ("the power limiter holds the clock, not the slow state: compare `nvidia-smi -q -d POWER` "
                        "(Enforced, Default and Max Power Limit, Power Draw); raise a limit set below the default "
                        "(`nvidia-smi -pl`, the platform's power settings) or, when the reading exceeds what the "
                        "board can draw, update or roll back the driver; then re-run `afddiag gpu --load`. No AC power "
                        "cycle is indicated by this evidence")
BASELINE_IGNORED_REMEDY = ("record the baseline again on this healthy host (`afddiag baseline record`, into a "
                           "folder only root or you can write) and find out who changed it; the GPU was judged "
                           "against the reference table meanwhile")
EXPLAINED_REMEDY = ("fix what gpu.clock-events names first (cooling, power delivery), then re-run "
                    "`afddiag gpu --load`; an AC power cycle is advised only for low figures no clock event reason "
                    "explains")


@dataclass
class SlowSeen:
    """What gpu.slow-state saw across the GPUs that picks its WARN remedy."""

    busy: list[str] = field(default_factory=list)
    explained: bool = False
    power: bool = False
    ignored: bool = False


def _slow_findings(d: GpuDevice, ul: UnderLoad, base: dict, f: dict) -> list[str]:
    """Class A (SM clock under load below :data:`SLOW_CLOCK_FRACTION` of max or of the baseline) and
    class B (a throughput figure below :data:`SLOW_THROUGHPUT_FRACTION` of the baseline) findings;
    each compared throughput figure goes into ``f``."""
    found: list[str] = []
    clk = ul.clock_sm_mhz
    bclk = base.get("clock_sm_mhz_under_load")
    if clk is not None:
        refs = [(d.clock_sm_max_mhz, "max"), (bclk, "baseline")]
        low = [(r, n) for r, n in refs if isinstance(r, (int, float)) and r and clk < SLOW_CLOCK_FRACTION * r]
        if low:
            r, n = low[0]
            pw = ""
            if ul.power_mw is not None:
                bp = base.get("power_mw_under_load")
                pw = f", power {ul.power_mw / 1000:.1f} W" + (f" vs {bp / 1000:.1f} W baseline" if bp else "")
            found.append(f"class A: SM clock under load {clk:g} MHz is {clk / r:.0%} of {n} {r:g} MHz{pw}")
    for key, unit in THROUGHPUT:
        got, ref = getattr(ul, key), base.get(key)
        if isinstance(got, (int, float)) and isinstance(ref, (int, float)) and ref > 0:
            f[key] = {"achieved": got, "baseline": ref, "ratio": round(got / ref, 3)}
            if got < SLOW_THROUGHPUT_FRACTION * ref and not any(x.startswith("class A") for x in found):
                found.append(f"class B: {key} {got:g} {unit} is {got / ref:.0%} of baseline {ref:g}")
    return found


def _not_kept_busy(d: GpuDevice, ul: UnderLoad, facts: dict) -> str | None:
    """Why the under-load figures are idle ones (utilization below :data:`MIN_UTILIZATION_PCT`, or no
    utilization and an idle P-state): a GPU kept busy is busy longer when slow, never less, so such
    figures (low clock, low power, P8 by design) are never class A or B. None when it was kept busy."""
    idle_pstate = ul.utilization_pct is None and ul.pstate is not None and ul.pstate >= IDLE_PSTATE
    if not ((ul.utilization_pct is not None and ul.utilization_pct < MIN_UTILIZATION_PCT) or idle_pstate):
        return None
    facts[str(d.index)] = {"clock_sm_mhz_under_load": ul.clock_sm_mhz, "pstate_under_load": ul.pstate,
                           "power_mw_under_load": ul.power_mw, "utilization_pct": ul.utilization_pct}
    seen = ", ".join(x for x in (f"{ul.clock_sm_mhz:g} MHz" if ul.clock_sm_mhz is not None else "",
                                 f"P{ul.pstate}" if ul.pstate is not None else "") if x)
    why = (f"P{ul.pstate} (an idle performance state) and no utilization recorded" if idle_pstate else
           f"utilization under load {ul.utilization_pct:g} % (< {MIN_UTILIZATION_PCT:g} %)")
    return (f"{gpu_label(d)}: inconclusive, {why}: the GPU was not kept busy, so its figures"
            + (f" ({seen})" if seen else "") + " are idle ones, not the slow state")


def slow_device(ctx: Context, d: GpuDevice, g: GpuFacts, facts: dict, seen: SlowSeen) -> list[tuple[str, str]]:
    """gpu.slow-state's ``(verdict, summary)`` lines for one GPU (its facts go into ``facts``)."""
    ul = d.under_load
    label = gpu_label(d)
    busy = gpu_busy(d, g)
    if busy and (d.load_why or ul is not None):
        seen.busy += busy
        facts[str(d.index)] = {"busy": busy, "load_why": d.load_why}
        return [(WARN, f"{label}: inconclusive: GPU busy ({'; '.join(busy)}): the load figures of a "
                       "shared GPU say nothing about its health")]
    if d.load_why:
        return [(WARN, f"{label}: inconclusive, the load probe gave no figures ({d.load_why})")]
    if ul is None or (ul.clock_sm_mhz is None and all(getattr(ul, k) is None for k, _ in THROUGHPUT)):
        return [(SKIP, f"{label}: no under-load readings (idle clocks are low by design)")]
    if (idle := _not_kept_busy(d, ul, facts)) is not None:
        return [(WARN, idle)]
    out: list[tuple[str, str]] = []
    eb = ctx.expect.gpu_baselines.get(d.index)  # host baseline, snapshot expect, reference table
    base, src = (eb.value, eb.source) if eb is not None else ({}, "")
    if ignored := getattr(eb, "ignored", ""):  # a baseline others could write, or one the GPU cannot reach
        seen.ignored = True
        out.append((WARN, f"{label}: {ignored}"))
    f: dict = {"clock_sm_mhz_under_load": ul.clock_sm_mhz, "clock_sm_max_mhz": d.clock_sm_max_mhz,
               "power_mw_under_load": ul.power_mw, "utilization_pct": ul.utilization_pct,
               "baseline": base, "baseline_source": src or None}
    facts[str(d.index)] = f
    found = _slow_findings(d, ul, base, f)
    clk = ul.clock_sm_mhz
    cause = ((d.clocks_event_reasons or 0) | (ul.clocks_event_reasons or 0)) & (FAIL_BITS | WARN_BITS)
    limited = power_limited(d) if any(x.startswith("class A") for x in found) else None
    if limited and not cause:  # the power limiter holds the clock at the enforced limit: no AC power cycle
        seen.power = True
        f["explained_by"] = ["power_limit"]
        f["power_limit_mw"] = d.power_limit_mw
        return out + [(WARN, f"{label}: not the slow state on this evidence: {limited}, which explains "
                       + "; ".join(found))]
    if found and cause:  # thermal, HW slowdown or power brake explains the low figures: no AC power cycle
        seen.explained = True
        f["explained_by"] = reason_names(cause)
        return out + [(WARN, f"{label}: not the slow state on this evidence: {', '.join(reason_names(cause))} "
                             f"active (gpu.clock-events names the cause) explains " + "; ".join(found))]
    if found:
        return out + [(FAIL, f"{label}: " + "; ".join(found))]
    compared = [k for k, _ in THROUGHPUT if k in f]
    if clk is None and not compared:
        return out + [(SKIP, f"{label}: under-load readings hold no clock or throughput figure")]
    what = ([f"clock {clk:g} MHz of max {d.clock_sm_max_mhz:g}" if clk and d.clock_sm_max_mhz else
             (f"clock {clk:g} MHz" if clk else "")] + [f"{k} {f[k]['ratio']:.0%} of baseline" for k in compared])
    return out + [(PASS, f"{label}: " + ", ".join(w for w in what if w)
                   + (f" (vs {_baseline_kind(src)})" if compared else " (no throughput baseline)"))]
