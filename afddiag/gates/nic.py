"""NIC platform gates (family ``fabric``): the DGX Spark's ConnectX-7 hot-plug state.

``fabric.cx7-hotplug`` tells a Spark whose CX-7 functions are absent because no cable is in its QSFP
cage (the hot-plug driver powered the NIC off: the root, a cabling remedy) from one whose driver is
missing. :func:`unplugged_skip` is what the no-RDMA-device path of :mod:`afddiag.gates.fabric` says
instead of "load the driver" on such a host; :func:`hotplug_note` is what the rail gate adds to a stale
rail that came up after a hot-plug event. Pure: facts in, verdicts out (:mod:`afddiag.model.nic`).
"""

from __future__ import annotations

from typing import Any

from afddiag.catalog import remedy
from afddiag.gates import Context, declared, gate, not_probed
from afddiag.model.nic import NicFacts, hotplug_events
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

HOTPLUG_GATE = "fabric.cx7-hotplug"


def _at(ev: dict[str, Any]) -> str:
    return f" at {ev['seconds']:.1f} s" if isinstance(ev.get("seconds"), float) else ""


def _driver_events(nic: NicFacts) -> list[dict[str, Any]]:
    """The hot-plug driver's own cable events ("plugin", "removal"), in order."""
    return [e for e in hotplug_events(nic.kernel_lines) if e["event"] in ("plugin", "removal")]


def no_cable_evidence(nic: NicFacts | None) -> str | None:
    """Why the CX-7's functions are absent for want of a cable, in words, or None when the facts do not
    show it: the hot-plug driver present and enabled, no Mellanox PCI function listed, and either its last
    cable event in the kernel log is "Cable removal", or it logged none and ``debug_state`` (or the older
    ``cx7_dbg/plugin``) is 0, which the driver sets from the cage's presence pin when it starts. Pure."""
    if nic is None or not nic.captured or nic.failed or not nic.hotplug_driver or nic.hotplug_enabled != 1:
        return None
    if nic.functions is None or nic.functions:
        return None
    events = _driver_events(nic)
    if events:
        last = events[-1]
        return (f"the hot-plug driver logged \"Cable removal\"{_at(last)} and no \"Cable plugin\" since"
                if last["event"] == "removal" else None)
    boot_state = nic.debug_state if nic.debug_state is not None else nic.legacy_plugin
    if boot_state == 0:
        seen = "logged no cable event since" if nic.kernel_lines is not None else "kernel log not read"
        return f"no cable was in the cage when the hot-plug driver started (debug_state 0; {seen})"
    return None


def unplugged_skip(ctx: Context, gate_id: str) -> Verdict | None:
    """What a gate of the no-RDMA-device path says on a Spark whose CX-7 is hot-unplugged for want of a
    cable (:func:`no_cable_evidence`): SKIP pointing at ``fabric.cx7-hotplug``, the root, with its cabling
    remedy, never "load the driver"; None otherwise. Pure."""
    why = no_cable_evidence(ctx.obs.nic)
    if why is None:
        return None
    return Verdict(gate_id, SKIP, f"not judged: no RDMA device because the CX-7 is powered off by its hot-plug "
                   f"driver: no cable in its QSFP cage ({why}; the root: {HOTPLUG_GATE})", remedy(HOTPLUG_GATE),
                   {"no_cable": why})


def hotplug_note(ctx: Context) -> str:
    """``"; the CX-7 came up after a hot-plug event (...)"`` when the hot-plug driver logged "Cable
    plugin" this boot (the NIC was powered on and rescanned after boot, not at boot), else "". Pure."""
    nic = ctx.obs.nic
    if not isinstance(nic, NicFacts) or not nic.kernel_lines:
        return ""
    plugins = [e for e in _driver_events(nic) if e["event"] == "plugin"]
    if not plugins:
        return ""
    return f"; the CX-7 came up after a hot-plug event (cx7-pcie-hotplug \"Cable plugin\"{_at(plugins[-1])})"


def _named(ctx: Context) -> bool:
    return bool((ctx.fabric_ip.given and ctx.fabric_ip.ip) or ctx.inputs.peers)


@gate(HOTPLUG_GATE)
def cx7_hotplug(ctx: Context, gate_id: str) -> Verdict:
    nic = ctx.obs.nic
    if (v := not_probed(gate_id, nic, "NIC hot-plug state", remedy("snapshot.fabric"))) is not None:
        return v
    facts = {"hotplug_driver": nic.hotplug_driver, "hotplug_enabled": nic.hotplug_enabled,
             "debug_state": nic.debug_state, "legacy_plugin": nic.legacy_plugin, "functions": nic.functions,
             "cable_events": hotplug_events(nic.kernel_lines)[-20:], "kernel_source": nic.kernel_source}
    if not nic.hotplug_driver:
        return Verdict(gate_id, SKIP, "no CX-7 hot-plug driver on this host (no /sys/devices/platform/MTKP0001:00): "
                       "not a DGX Spark kernel that powers the CX-7 off without a cable", "nothing to do", facts)
    if nic.hotplug_enabled is None or nic.functions is None:
        what = "pcie_hotplug/hotplug_enabled" if nic.hotplug_enabled is None else "the PCI functions"
        return Verdict(gate_id, SKIP, f"CX-7 hot-plug driver present, but {what} not read", "nothing to do", facts)
    bdfs = ", ".join(f["bdf"] for f in nic.functions)
    if nic.hotplug_enabled == 0:
        return Verdict(gate_id, PASS if nic.functions else SKIP,
                       "CX-7 hot-plug disabled: the driver never powers the NIC off for want of a cable"
                       + (f"; Mellanox functions {bdfs}" if nic.functions else
                          "; no Mellanox PCI function, which is not the hot-plug driver's doing (fabric.rdma-present)"),
                       "nothing to do", facts)
    if nic.functions:
        return Verdict(gate_id, PASS, f"CX-7 hot-plug enabled; {len(nic.functions)} Mellanox function(s) present: "
                       f"{bdfs}{hotplug_note(ctx)}", "nothing to do", facts)
    why = no_cable_evidence(nic)
    if why is None:
        return Verdict(gate_id, WARN, "CX-7 hot-plug enabled and no Mellanox PCI function, though the driver last saw "
                       "a cable (debug_state 1 or \"Cable plugin\" last): its power-on or PCI rescan did not finish",
                       remedy(gate_id + ".rescan"), facts, action="FIX_LINK")
    summary = f"no cable in the CX-7's QSFP cage: the hot-plug driver powered the NIC off and removed its PCI " \
              f"functions ({why})"
    if ctx.requires("rdma"):
        return Verdict(gate_id, FAIL, f"{summary}; role {ctx.playbook.name} requires RDMA", remedy(gate_id), facts,
                       action="FIX_LINK")
    if _named(ctx):
        return Verdict(gate_id, WARN, f"{summary}; a fabric IP or peer was given", remedy(gate_id), facts,
                       action="FIX_LINK")
    return Verdict(gate_id, SKIP, f"{summary}; nothing here asks for the fabric", remedy(gate_id), facts)


GATES = declared(__name__)
