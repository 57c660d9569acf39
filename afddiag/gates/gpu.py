"""GPU gates: presence, SM count vs the image, memory, clocks event reasons, slow state."""

from __future__ import annotations

from afddiag.catalog import remedy
from afddiag.facts import GpuDevice, clocks_event_reason_names, to_jsonable
from afddiag.gates import Context
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

FAIL_BITS = 0x8 | 0x40 | 0x80
WARN_BITS = 0x20
SLOW_CLOCK_FRACTION = 0.5  # class A: under-load SM clock below half of max or of baseline
SLOW_THROUGHPUT_FRACTION = 0.8  # class B: any throughput figure below 80 % of baseline
MIN_UTILIZATION_PCT = 80.0
THROUGHPUT = (("fp32_tflops", "TFLOP/s"), ("bf16_tflops", "TFLOP/s"), ("gemv_gbps", "GB/s"), ("copy_gbps", "GB/s"))


def reason_names(mask: int | None) -> list[str]:
    """Names of the set bits of an NVML clocks event reasons mask ([] for none or unknown)."""
    return clocks_event_reason_names(mask) if mask else []


def _label(d: GpuDevice) -> str:
    return f"GPU {d.index} {d.name or '?'}"


def _need_gpu(ctx: Context, gid: str) -> Verdict | None:
    g = ctx.obs.gpu
    if g is None or not g.captured:
        return Verdict(gid, SKIP, (g.why if g and g.why else "GPU not probed"), remedy("snapshot.gpu"))
    if not g.devices:
        reason = g.why or "no devices"
        reason = reason if reason.lower().startswith("no ") else f"no GPU seen: {reason}"
        why = reason if gid == "gpu.present" else "no GPU seen (gpu.present says why)"
        return Verdict(gid, SKIP, why, remedy("gpu.present"))
    return None


def present(ctx: Context) -> Verdict:
    gid = "gpu.present"
    if (v := _need_gpu(ctx, gid)) is not None:
        return v
    g = ctx.obs.gpu
    devs = [to_jsonable(d) for d in g.devices]
    names = "; ".join(
        f"{_label(d)} ({d.sm_count if d.sm_count is not None else '?'} SMs, cc "
        f"{'.'.join(map(str, d.compute_capability)) if d.compute_capability else '?'})" for d in g.devices)
    return Verdict(gid, PASS, f"{len(g.devices)} GPU(s): {names}; driver {g.driver_version or '?'}", "nothing to do",
                   {"devices": devs, "driver_version": g.driver_version, "cuda_driver_version": g.cuda_driver_version,
                    "versions": g.versions, "notes": g.notes})


def sm_count(ctx: Context) -> Verdict:
    gid = "gpu.sm-count"
    if (v := _need_gpu(ctx, gid)) is not None:
        return v
    g = ctx.obs.gpu
    want, src = ctx.inputs.expect_sm, "--expect-sm"
    if want is None:
        want, src = g.expect_image_sm_count, "snapshot expect.image_sm_count"
    have = {d.index: d.sm_count for d in g.devices}
    facts = {"expected": want, "expected_from": src if want is not None else None, "sm_count": have}
    if want is None:
        return Verdict(gid, SKIP, "no expected SM count (the image's export): give --expect-sm N",
                       "pass --expect-sm with the SM count the image's kernels were exported for", facts)
    unknown = [d for d in g.devices if d.sm_count is None]
    wrong = [d for d in g.devices if d.sm_count is not None and d.sm_count != want]
    if wrong:
        d = wrong[0]
        return Verdict(gid, FAIL, f"{_label(d)}: image built for {want} SMs, this GPU has {d.sm_count}",
                       remedy(gid).format(have=d.sm_count), facts)
    if unknown:
        return Verdict(gid, WARN, f"{_label(unknown[0])}: SM count could not be read (CUDA attribute 16)",
                       "check that libcuda.so.1 loads (driver installed, /dev/nvidia* visible)", facts)
    return Verdict(gid, PASS, f"{len(g.devices)} GPU(s) have {want} SMs, as the image expects ({src})",
                   "nothing to do", facts)


def memory(ctx: Context) -> Verdict:
    gid = "gpu.memory"
    if (v := _need_gpu(ctx, gid)) is not None:
        return v
    g = ctx.obs.gpu
    facts = {str(d.index): {"total_bytes": d.memory_total_bytes, "free_bytes": d.memory_free_bytes,
                            "used_bytes": d.memory_used_bytes, "source": d.memory_source, "unified": d.unified}
             for d in g.devices}
    missing = [d for d in g.devices if not d.memory_total_bytes]
    if missing:
        d = missing[0]
        return Verdict(gid, WARN, f"{_label(d)}: total memory not read ({'; '.join(d.notes) or 'no reading'})",
                       remedy(gid), facts)
    parts = [f"{_label(d)}: {d.memory_total_bytes / 2**30:.1f} GiB ({d.memory_source})" for d in g.devices]
    return Verdict(gid, PASS, "; ".join(parts), "nothing to do", facts)


def clock_events(ctx: Context) -> Verdict:
    gid = "gpu.clock-events"
    if (v := _need_gpu(ctx, gid)) is not None:
        return v
    g = ctx.obs.gpu
    worst, lines, facts = PASS, [], {}
    for d in g.devices:
        idle = d.clocks_event_reasons or 0
        load = (d.under_load.clocks_event_reasons or 0) if d.under_load else 0
        mask = idle | load
        counters = d.clocks_event_reason_counters_us or {}
        facts[str(d.index)] = {"idle_mask": hex(idle), "under_load_mask": hex(load), "names": reason_names(mask),
                               "counters_us": counters}
        if mask & FAIL_BITS:
            worst = FAIL
            lines.append(f"{_label(d)}: {', '.join(reason_names(mask & FAIL_BITS))} active")
        elif mask & WARN_BITS:
            worst = FAIL if worst == FAIL else WARN
            lines.append(f"{_label(d)}: sw_thermal_slowdown active"
                         + (f" (temperature {d.temperature_c:g} C)" if d.temperature_c is not None else ""))
        else:
            hw = {k: v for k, v in counters.items() if k.startswith("hw_") and isinstance(v, int) and v > 0}
            th = counters.get("sw_thermal_slowdown")
            if hw or (isinstance(th, int) and th > 0):
                worst = FAIL if worst == FAIL else WARN
                spent = {**hw, **({"sw_thermal_slowdown": th} if th else {})}
                lines.append(f"{_label(d)}: no bit now, but has spent time in " +
                             ", ".join(f"{k} {v / 1e6:.2f} s" for k, v in spent.items()))
    if worst == PASS:
        seen = sorted({n for f in facts.values() for n in f["names"]})
        return Verdict(gid, PASS, f"{len(g.devices)} GPU(s): no thermal, HW slowdown or power-brake reason"
                       + (f" (seen: {', '.join(seen)}, not faults)" if seen else ""), "nothing to do", facts)
    return Verdict(gid, worst, "; ".join(lines), remedy(gid + (".hw" if worst == FAIL else ".thermal")), facts)


def slow_state(ctx: Context) -> Verdict:
    gid = "gpu.slow-state"
    if (v := _need_gpu(ctx, gid)) is not None:
        return v
    g = ctx.obs.gpu
    base = g.baseline or {}
    verdicts: list[tuple[str, str]] = []
    facts: dict = {"baseline": base, "baseline_source": "snapshot expect.baseline" if base else None}
    for d in g.devices:
        ul = d.under_load
        label = _label(d)
        if ul is None or (ul.clock_sm_mhz is None and all(getattr(ul, k) is None for k, _ in THROUGHPUT)):
            verdicts.append((SKIP, f"{label}: no under-load readings (idle clocks are low by design)"))
            continue
        f: dict = {"clock_sm_mhz_under_load": ul.clock_sm_mhz, "clock_sm_max_mhz": d.clock_sm_max_mhz,
                   "power_mw_under_load": ul.power_mw, "utilization_pct": ul.utilization_pct}
        facts[str(d.index)] = f
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
        if found:
            verdicts.append((FAIL, f"{label}: " + "; ".join(found)))
            continue
        if ul.utilization_pct is not None and ul.utilization_pct < MIN_UTILIZATION_PCT:
            verdicts.append((WARN, f"{label}: inconclusive, utilization under load {ul.utilization_pct:g} % "
                                   f"(< {MIN_UTILIZATION_PCT:g} %)"))
            continue
        compared = [k for k, _ in THROUGHPUT if k in f]
        if clk is None and not compared:
            verdicts.append((SKIP, f"{label}: under-load readings hold no clock or throughput figure"))
            continue
        what = ([f"clock {clk:g} MHz of max {d.clock_sm_max_mhz:g}" if clk and d.clock_sm_max_mhz else
                 (f"clock {clk:g} MHz" if clk else "")] + [f"{k} {f[k]['ratio']:.0%} of baseline" for k in compared])
        verdicts.append((PASS, f"{label}: " + ", ".join(w for w in what if w)
                         + ("" if compared else " (no throughput baseline)")))
    order = [FAIL, WARN, PASS, SKIP]
    worst = min((v for v, _ in verdicts), key=order.index)
    summary = "; ".join(s for v, s in verdicts if v == worst)
    rem = {FAIL: remedy(gid), WARN: "run the load probe on an otherwise idle GPU", PASS: "nothing to do",
           SKIP: "take under-load readings (the live load probe comes with `afddiag gpu --load`)"}[worst]
    return Verdict(gid, worst, summary, rem, facts)


GATES = [
    ("gpu.present", present),
    ("gpu.sm-count", sm_count),
    ("gpu.memory", memory),
    ("gpu.clock-events", clock_events),
    ("gpu.slow-state", slow_state),
]
