"""Host gates: the CPU clock under a short fixed-work load (Sparks were seen stuck below 2 GHz); the
PCIe links of the RDMA NICs and GPUs."""

from __future__ import annotations

from afddiag.catalog import remedy
from afddiag.gates import Context, not_probed, probe_failed
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
    judged); SKIP when a figure is unreadable; else PASS, with a finding when the port, not the card,
    is the limit (a Gen4 slot, a slot wired x2: the board's design, nothing to reseat). Without the
    port's reading a narrower link still FAILs, and the finding says the port's maximum was not read.
    ``finding`` names the device. Pure."""
    who = f"{'NIC' if link.kind == 'nic' else 'GPU'} {link.bdf}" + (f" ({', '.join(link.names)})" if link.kind == "nic" and link.names else "")
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
    if port_known and (link.current_width < link.max_width
                       or (link.kind == "nic" and link.current_speed_gts < link.max_speed_gts)):
        return PASS, (f"{who}: {now}, the most its {port} allows (the card is capable of {own}: "
                      "the slot's design, not a fault)")
    return PASS, None


def pcie(ctx: Context) -> Verdict:
    gid = "host.pcie"
    p = ctx.obs.pcie
    if (v := not_probed(gid, p, "PCIe links", "run on the host, or replay a capture made with this afddiag")) is not None:
        return v
    if not p.links:
        return Verdict(gid, SKIP, "no PCI RDMA NIC or NVIDIA GPU found through sysfs device links"
                       + (f" ({'; '.join(p.notes[:2])})" if p.notes else ""), "nothing to check", {"notes": p.notes})
    judged = [(link, *judge_pcie_link(link)) for link in p.links]
    facts = {"links": [vars(link) for link in p.links], "notes": p.notes}
    for worst in (FAIL, WARN):
        found = [(link, f) for link, v, f in judged if v == worst]
        if found:
            unknown = [link for link, _ in found if not _link_cap(link)[2]]
            rem = (remedy("host.pcie.port-unknown").format(bdfs=", ".join(link.bdf for link in unknown)) + " "
                   + remedy(gid)) if unknown else remedy(gid)
            return Verdict(gid, worst, "; ".join(f for _, f in found), rem, facts)
    ok = [link for link, v, _ in judged if v == PASS]
    if not ok:
        return Verdict(gid, SKIP, "; ".join(f for _, _, f in judged), "run on the host as a user that can read "
                       "/sys/bus/pci/devices/*/current_link_*", facts)
    idle = [link for link in ok if link.kind == "gpu" and link.current_speed_gts < (_link_cap(link)[0] or 0)]
    slot = [f for _, v, f in judged if v == PASS and f]
    text = ", ".join(f"{'NIC' if link.kind == 'nic' else 'GPU'} {link.bdf} x{link.current_width} "
                     f"{link.current_speed_gts:g} GT/s" for link in ok)
    return Verdict(gid, PASS, f"{len(ok)} link(s) at their maximum width: {text}"
                   + (f" ({'; '.join(slot)})" if slot else "")
                   + (" (GPU link speed below its maximum at idle: power saving, not judged)" if idle else ""),
                   "nothing to do", facts)


GATES = [("host.cpu-clock", cpu_clock), ("host.pcie", pcie)]
