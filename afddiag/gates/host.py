"""Host gates: the CPU clock under a short fixed-work load (Sparks were seen stuck below 2 GHz); the
PCIe links of the RDMA NICs and GPUs."""

from __future__ import annotations

from afddiag.catalog import remedy
from afddiag.gates import Context, declared, gate, probe_failed, probed
from afddiag.shellcmd import command
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN, Verdict

SLOW_CLOCK_FRACTION = 0.5
SLOW_LOOP_FRACTION = 0.8
ON_CPU_MIN = 0.9  # a loop sample on its core less than this share of its wall time lost the core to others
NOISY_SPREAD = 0.25  # samples whose best and worst differ by more than this share of the best disagree
# The ACTIVE-mode p-state drivers implement 'powersave' themselves as a dynamic policy (the hardware picks the
# speed), so there it holds nothing low. Their passive modes (intel_cpufreq, amd-pstate in passive/guided mode)
# run the ordinary cpufreq governors: 'powersave' there pins the minimum like under acpi-cpufreq.
ACTIVE_PSTATE_DRIVERS = ("intel_pstate", "amd-pstate-epp")

TIMING_REMEDY = ("re-run `afddiag all` on an idle host; a loop timing alone is no evidence for a power cycle "
                 "(the clock under load, throttle counters and governor are what would show a stuck CPU)")


def _nums(xs) -> list[float]:
    return [x for x in (xs or []) if isinstance(x, (int, float)) and not isinstance(x, bool)]


def cpu_contention(cpu: dict) -> list[str]:
    """Evidence in the CPU probe's facts that other work shared the host while the loop ran: loop
    samples that were on their core less than :data:`ON_CPU_MIN` of their wall time
    (``loop_on_cpu``), samples that disagree by more than :data:`NOISY_SPREAD`
    (``loop_samples_mops``), a 1-minute load average at or above the CPU count. [] when none. Pure."""
    found = []
    on = _nums(cpu.get("loop_on_cpu"))
    if on and min(on) < ON_CPU_MIN:
        found.append(f"the loop was on its core {min(on):.0%}-{max(on):.0%} of the time (another process took it)")
    smp = _nums(cpu.get("loop_samples_mops"))
    if len(smp) > 1 and max(smp) > 0 and (max(smp) - min(smp)) / max(smp) > NOISY_SPREAD:
        found.append(f"loop samples {min(smp):g}-{max(smp):g} Mop/s disagree")
    load, n = cpu.get("load_avg_1m"), cpu.get("logical_cpus")
    if isinstance(load, (int, float)) and isinstance(n, int) and n > 0 and load >= n:
        found.append(f"load average {load:g} on {n} CPU(s)")
    return found


def governor_holds_low(governor, driver) -> bool:
    """True when the cpufreq governor (``scaling_governor``) under the driver (``scaling_driver``) holds
    the clock low: ``userspace`` (a fixed speed) under any driver; ``powersave`` except under the
    active-mode p-state drivers (:data:`ACTIVE_PSTATE_DRIVERS`), where it is their dynamic policy.
    An unknown driver (None) counts as a cpufreq driver. Pure."""
    if governor == "userspace":
        return True
    return governor == "powersave" and driver not in ACTIVE_PSTATE_DRIVERS


COOLING_REMEDY = ("check the CPU's cooling (fans, heatsink, airflow, ambient) and the BMC's thermal log; "
                  "no power cycle: the CPU slows itself to protect itself")


def hot_zones(cpu: dict) -> list[str] | None:
    """The thermal zones (``thermal_zones`` in the CPU probe's facts) at or above their throttling
    trip point, as ``"<type or zone> 95.0 °C >= 95.0 °C"``; [] when zones were read and none is; None
    when no zone with both a temperature and a trip point was read. Pure."""
    zones = cpu.get("thermal_zones")
    if not isinstance(zones, list):
        return None
    num = (int, float)
    read = [z for z in zones if isinstance(z, dict) and isinstance(z.get("temp_c"), num)
            and isinstance(z.get("trip_c"), num) and not isinstance(z.get("temp_c"), bool)]
    if not read:
        return None
    return [f"{z.get('type') or z.get('zone')} {z['temp_c']:.1f} °C >= {z['trip_c']:.1f} °C"
            for z in read if z["temp_c"] >= z["trip_c"]]


def clock_explained(cpu: dict, limit_mhz: float | None = None) -> tuple[str, str, str, list[str]] | None:
    """``(cause, remedy, action, commands)`` when the CPU probe's facts explain a low clock by something other than a
    stuck power state: thermal throttle events during the loop (``throttle_events``), a governor that
    holds the clock low (:func:`governor_holds_low`), or a ``scaling_max_freq`` cap (``scaling_max_mhz``,
    MHz) at or below ``limit_mhz``, the threshold the clock fell below (the role's minimum or half of
    max; half of ``max_mhz`` when None): a clock capped there cannot reach it. None when nothing does. Pure."""
    thr = cpu.get("throttle_events")
    if isinstance(thr, int) and thr > 0:
        return (f"{thr} thermal throttle event(s) on the loop's core during the loop", COOLING_REMEDY, "HW_INSPECTION",
                [])
    hot = hot_zones(cpu)
    if hot:
        return (f"thermal zone(s) at their throttling trip point after the loop: {', '.join(hot)}", COOLING_REMEDY,
                "HW_INSPECTION", [])
    gov, drv = cpu.get("governor"), cpu.get("scaling_driver")
    if governor_holds_low(gov, drv):
        return (f"cpufreq governor '{gov}' ({drv or 'driver unknown'}) holds the clock low",
                "set the governor to performance (the command below) or schedutil, and persist it in the host's "
                "tuned/power profile", "SET_GOVERNOR", ["sudo cpupower frequency-set -g performance"])
    smax, mx = cpu.get("scaling_max_mhz"), cpu.get("max_mhz")
    num = (int, float)
    if limit_mhz is None and isinstance(mx, num) and not isinstance(mx, bool) and mx:
        limit_mhz = SLOW_CLOCK_FRACTION * mx
    if (isinstance(smax, num) and not isinstance(smax, bool) and isinstance(limit_mhz, num) and smax > 0
            and smax <= limit_mhz):
        of = f" of {mx:.0f}" if isinstance(mx, num) and mx else ""
        return (f"scaling_max_freq caps the clock at {smax:.0f} MHz{of}, at or below the {limit_mhz:.0f} MHz "
                "it had to reach",
                "raise scaling_max_freq to cpuinfo_max_freq" + (" (the command below)" if isinstance(mx, num) and mx
                                                                 else "") + " and find the power profile or tool "
                "that capped it", "SET_GOVERNOR",
                [command("sudo", "cpupower", "frequency-set", "-u", f"{mx:.0f}MHz")] if isinstance(mx, num) and mx
                else [])
    return None


def _loop_rates(cpu: dict, base: dict) -> tuple[float | None, float | None, str]:
    """The loop rate now and in the baseline, compared like with like: per second on the CPU
    (``loop_mops_on_cpu``) when both have it, else per wall second (``loop_mops``, best sample)."""
    now, ref = cpu.get("loop_mops_on_cpu"), base.get("loop_mops_on_cpu")
    if isinstance(now, (int, float)) and isinstance(ref, (int, float)) and ref > 0:
        return now, ref, " (per second on the CPU)"
    now, ref = cpu.get("loop_mops"), base.get("loop_mops")
    ok = isinstance(now, (int, float)) and isinstance(ref, (int, float)) and ref > 0
    return (now, ref, "") if ok else (now if isinstance(now, (int, float)) else None, None, "")


@gate("host.cpu-clock")
def cpu_clock(ctx: Context, gate_id: str) -> Verdict:
    """host.cpu-clock: FAIL (AC_POWER_CYCLE) only on the clock under load stuck low (below the role's
    minimum or half of max) with nothing else to explain it and nothing to contradict it; a loop
    timing alone (noisy on a shared host) is at most WARN RERUN, and contention is named as such."""
    cpu = ctx.obs.cpu
    if (v := probe_failed(gate_id, cpu or {})) is not None:
        return v
    if not cpu:
        return Verdict(gate_id, SKIP, "CPU not probed (or not in the snapshot)", "run on the host")
    if isinstance(short := cpu.get("unmeasurable"), dict):  # the bound given cannot hold the loop: no evidence
        least = short.get("min_bound_s")
        least = f"{least:g}" if isinstance(least, (int, float)) else "a longer value"
        return Verdict(gate_id, ERROR, str(cpu.get("why")),
                       f"give --timeout {least} or more (or leave it out: the playbook's cpu_s, 10 s by default), "
                       "then re-run", {"cpu": cpu}, action="RERUN")
    if cpu.get("why"):
        return Verdict(gate_id, SKIP, cpu["why"], "run on the host")
    base = ctx.expect.value("cpu_baseline") or {}
    clk, mx = cpu.get("under_load_mhz"), cpu.get("max_mhz")
    rate, ref, per = _loop_rates(cpu, base)
    min_mhz = ctx.playbook.cpu_min_mhz
    busy = cpu_contention(cpu)
    facts = {"cpu": cpu, "baseline": base or None, "min_mhz": min_mhz or None, "contention": busy or None}
    model = cpu.get("model") or "CPU"
    low_clock, limit = None, None  # limit: the highest threshold the clock fell below, MHz
    if isinstance(clk, (int, float)):
        half = SLOW_CLOCK_FRACTION * mx if isinstance(mx, (int, float)) and mx else None
        if min_mhz and clk < min_mhz:
            low_clock = f"clock under load {clk:.0f} MHz, below the role's {min_mhz} MHz"
            limit = max(min_mhz, half) if half is not None and clk < half else min_mhz
        elif half is not None and mx and clk < half:
            low_clock = f"clock under load {clk:.0f} MHz is {clk / mx:.0%} of max {mx:.0f} MHz"
            limit = half
    slow = ref is not None and rate is not None and rate < SLOW_LOOP_FRACTION * ref
    loop = (f"fixed-work loop {rate:g} Mop/s{per} is {rate / ref:.0%} of the baseline {ref:g}"
            + (" (a baseline recorded FORCED)" if base.get("forced_over") else "")) if ref and rate is not None else ""
    if low_clock:
        why = clock_explained(cpu, limit)
        if why:
            cause, rem, action, cmds = why
            return Verdict(gate_id, WARN, f"{model}: {low_clock}, explained by {cause}: not the stuck state", rem,
                           {**facts, "explained_by": cause}, action=action, commands=cmds)
        if ref is not None and rate is not None and not slow:
            return Verdict(gate_id, WARN, f"{model}: {low_clock}, but the loop runs at {rate / ref:.0%} of the "
                           f"baseline {ref:g} Mop/s: the cpufreq reading and the work disagree, inconclusive",
                           TIMING_REMEDY, facts, action="RERUN")
        if not isinstance(cpu.get("throttle_events"), int) and hot_zones(cpu) is None:
            # No throttle counters (ARM) and no thermal zone read: thermal throttling reads the same as the
            # stuck state, so the power cycle has no evidence of its own cause here.
            return Verdict(gate_id, WARN, f"{model}: {low_clock}" + (f"; {loop}" if slow else "")
                           + ": thermal throttling not ruled out (no throttle counters, no thermal zone read)",
                           "check the CPU's temperature and cooling (`sensors`, the BMC's thermal log, "
                           "/sys/class/thermal/thermal_zone*/temp against trip_point_*_temp) and re-run on the host; "
                           "a power cycle is advised only once throttling is ruled out", facts, action="RERUN")
        return Verdict(gate_id, FAIL, f"{model}: {low_clock}" + (f"; {loop}" if slow else ""), remedy(gate_id), facts)
    if slow:
        if busy:
            return Verdict(gate_id, WARN, f"{model}: inconclusive: host busy ({'; '.join(busy)}): {loop}",
                           TIMING_REMEDY, facts, action="RERUN")
        corro = (f"the clock under load reads {clk:.0f} MHz" + (f" of max {mx:.0f}" if mx else "") + ", normal"
                 if isinstance(clk, (int, float)) else "no cpufreq clock to corroborate it")
        return Verdict(gate_id, WARN, f"{model}: {loop}, but {corro}: a timing alone, not the stuck state",
                       TIMING_REMEDY, facts, action="RERUN")
    compared = bool(ref) or (clk is not None and (bool(min_mhz) or bool(mx)))
    if not compared:
        what = "no cpufreq clock" if clk is None else f"clock under load {clk:.0f} MHz but no max and no role minimum"
        return Verdict(gate_id, WARN if min_mhz else SKIP, f"{model}: {what}, and no baseline to compare the "
                       f"loop's {rate} Mop/s with", "record a baseline on a healthy host: `afddiag baseline record`",
                       facts)
    parts = [f"clock under load {clk:.0f} MHz" + (f" of max {mx:.0f}" if mx else "")] if clk else []
    if rate is not None:  # a capture without the loop's figure still has its clock judged
        parts += [f"loop {rate:g} Mop/s{per}" + (f" ({rate / ref:.0%} of baseline)" if ref else "")]
    if ref and rate is not None and rate > ref / SLOW_LOOP_FRACTION ** 2:
        parts.append(f"the baseline {ref:g} looks low for this host: record it again on an idle host")
    return Verdict(gate_id, PASS, f"{model}: " + ", ".join(parts), "nothing to do", facts)


def _link_cap(link) -> tuple[float | None, int | None, bool]:
    """``(speed GT/s, width lanes, port_known)``: what the link can train to, the lower of the
    function's LnkCap and its upstream port's (a link trains to what both ends support). Without the
    port's reading, the function's own maximum and ``port_known`` False. Pure."""
    known = link.upstream_max_width is not None and link.upstream_max_speed_gts is not None
    if not known or link.max_width is None or link.max_speed_gts is None:
        return link.max_speed_gts, link.max_width, False
    return min(link.max_speed_gts, link.upstream_max_speed_gts), min(link.max_width, link.upstream_max_width), True


def judge_pcie_link(link) -> tuple[str, str | None]:
    """``(verdict, finding)`` for one :class:`~afddiag.model.host.PcieLink`, against what the link can
    train to (:func:`_link_cap`: the lower of the function's and its upstream port's maximum):
    FAIL when it trained fewer lanes than that (a NIC or GPU capped at a fraction of its bandwidth);
    WARN when a NIC trained below that speed (GPUs lower the link speed at idle by design: not
    judged); WARN too when the port's width, narrower than the card's, is the limit (the slot's wiring
    or the BIOS's bifurcation / lane sharing: nothing to reseat, something to check); SKIP when a
    figure is unreadable; else PASS, with a finding when the port's generation, not the card, is the
    limit (a Gen5 NIC in a Gen4 slot). Without the
    port's reading a narrower link still FAILs, and the finding says the port's maximum was not read.
    ``finding`` names the device. Pure."""
    who = f"{'NIC' if link.kind == 'nic' else 'GPU'} {link.bdf}"
    if link.kind == "nic" and link.names:
        who += f" ({', '.join(link.names)})"
    if None in (link.current_width, link.max_width, link.current_speed_gts, link.max_speed_gts):
        return SKIP, f"{who}: link figures not readable"
    cap_speed, cap_width, port_known = _link_cap(link)
    now = f"x{link.current_width} at {link.current_speed_gts:g} GT/s"
    own = f"x{link.max_width} at {link.max_speed_gts:g} GT/s"
    port = (f"upstream port {link.upstream_bdf} x{link.upstream_max_width} at {link.upstream_max_speed_gts:g} GT/s"
            if port_known else "")
    cap = f"capable of {own}" + (f", {port}" if port_known else " (upstream port's maximum not read)")
    if link.current_width < cap_width:
        return FAIL, f"{who}: PCIe link trained {now}, {cap}"
    speed_low = link.current_speed_gts < cap_speed
    if link.kind == "nic" and speed_low:
        return WARN, f"{who}: PCIe link trained {now}, {cap}"
    if port_known and link.current_width < link.max_width:
        # The port's LnkCap is narrower than the card: a board wired so (a GX10's CX-7 functions), or
        # the BIOS's bifurcation / lane sharing (an M.2 drive taking half of an x16 slot), which the
        # operator can change. Not a fault of the card (no reseat), but half the bandwidth is a claim
        # worth a look: WARN, CHECK_BIOS (no drain).
        return WARN, (f"{who}: PCIe link {now}, the most its {port} allows; the card is capable of {own} "
                      "(the slot's lane count: its wiring, or the BIOS's bifurcation or lane sharing)")
    if port_known and link.kind == "nic" and link.current_speed_gts < link.max_speed_gts:
        return PASS, (f"{who}: {now}, the most its {port} allows (the card is capable of {own}: "
                      "the slot's generation, not a fault)")
    return PASS, None


def _port_narrow(link) -> bool:
    """The link is at its port's width, which is narrower than the card's (:func:`judge_pcie_link`'s
    port WARN): the slot, not the card. Pure."""
    cap_speed, cap_width, known = _link_cap(link)
    return (known and None not in (link.current_width, link.max_width, link.current_speed_gts)
            and link.current_width == cap_width < link.max_width
            and not (link.kind == "nic" and link.current_speed_gts < (cap_speed or 0)))


@gate("host.pcie")
def pcie(ctx: Context, gate_id: str) -> Verdict:
    p = probed(gate_id, ctx.obs.pcie, "PCIe links", "run on the host, or replay a capture made with this afddiag")
    if isinstance(p, Verdict):
        return p
    if not p.links:
        return Verdict(gate_id, SKIP, "no PCI RDMA NIC or NVIDIA GPU found through sysfs device links"
                       + (f" ({'; '.join(p.notes[:2])})" if p.notes else ""), "nothing to check", {"notes": p.notes})
    judged = [(link, *judge_pcie_link(link)) for link in p.links]
    facts = {"links": [vars(link) for link in p.links], "notes": p.notes}
    for worst in (FAIL, WARN):
        found = [(link, f) for link, v, f in judged if v == worst and f is not None]  # a FAIL or WARN names its finding
        if found:
            unknown = [link for link, _ in found if not _link_cap(link)[2]]
            rem = (remedy("host.pcie.port-unknown").format(bdfs=", ".join(link.bdf for link in unknown)) + " "
                   + remedy(gate_id)) if unknown else remedy(gate_id)
            cmds = [command("sudo", "lspci", "-vv", "-s", link.bdf) for link, _ in found]  # LnkCap / LnkSta
            if worst == WARN and all(_port_narrow(link) for link, _ in found):
                return Verdict(gate_id, WARN, "; ".join(f for _, f in found), remedy("host.pcie.port-narrow"), facts,
                               action="CHECK_BIOS", commands=cmds)
            return Verdict(gate_id, worst, "; ".join(f for _, f in found), rem, facts, commands=cmds)
    ok = [link for link, v, _ in judged if v == PASS]
    if not ok:
        return Verdict(gate_id, SKIP, "; ".join(f for _, _, f in judged if f),
                       "run on the host as a user that can read /sys/bus/pci/devices/*/current_link_*", facts)
    idle = [link for link in ok if link.kind == "gpu" and (link.current_speed_gts or 0) < (_link_cap(link)[0] or 0)]
    slot = [f for _, v, f in judged if v == PASS and f]
    text = ", ".join(f"{'NIC' if link.kind == 'nic' else 'GPU'} {link.bdf} x{link.current_width} "
                     f"{link.current_speed_gts:g} GT/s" for link in ok)
    return Verdict(gate_id, PASS, f"{len(ok)} link(s) at their maximum width: {text}"
                   + (f" ({'; '.join(slot)})" if slot else "")
                   + (" (GPU link speed below its maximum at idle: power saving, not judged)" if idle else ""),
                   "nothing to do", facts)


GATES = declared(__name__)
