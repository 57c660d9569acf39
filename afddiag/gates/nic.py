"""NIC platform gates (family ``fabric``): the DGX Spark's ConnectX-7 hot-plug state and the NIC's
kernel-log lines judged against the catalog ``checks/nic_kernel_log.toml``.

``fabric.cx7-hotplug`` tells a Spark whose CX-7 functions are absent because no cable is in its QSFP
cage (the hot-plug driver powered the NIC off: the root, a cabling remedy) from one whose driver is
missing. :func:`unplugged_skip` is what the no-RDMA-device path of :mod:`afddiag.gates.fabric` says
instead of "load the driver" on such a host; :func:`hotplug_note` is what the rail gate adds to a stale
rail that came up after a hot-plug event. Pure: facts in, verdicts out (:mod:`afddiag.model.nic`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from afddiag import packaged
from afddiag.catalog import load, remedy, tomllib
from afddiag.gates import Context, declared, gate, not_probed, probe_failed
from afddiag.model.nic import NicFacts, at_seconds, driver_events, hotplug_events, message, no_cable_evidence
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

HOTPLUG_GATE = "fabric.cx7-hotplug"


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
    plugins = [e for e in driver_events(nic) if e["event"] == "plugin"]
    if not plugins:
        return ""
    return f"; the CX-7 came up after a hot-plug event (cx7-pcie-hotplug \"Cable plugin\"{at_seconds(plugins[-1])})"


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


# ---------------------------------------------------------------- fabric.nic-kernel-log

LOG_VERDICTS = (FAIL, WARN, "INFO", "BENIGN")
_BDF = re.compile(r"\b([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")


class LogCatalogError(ValueError):
    """checks/nic_kernel_log.toml is not a valid catalog: the message names the line entry and field."""


def validate_log_catalog(lines: Any, actions: set[str]) -> list[dict[str, Any]]:
    """The catalog's entries with their patterns compiled (``rx``): ids unique, a verdict of
    :data:`LOG_VERDICTS`, an action of ``actions`` and a remedy for FAIL and WARN, a source. Raises
    :class:`LogCatalogError`. Pure."""
    if not isinstance(lines, list) or not lines:
        raise LogCatalogError("checks/nic_kernel_log.toml: no [[line]]")
    out, seen = [], set()
    for i, e in enumerate(lines):
        where = f"checks/nic_kernel_log.toml line entry {i + 1} ({e.get('id') if isinstance(e, dict) else '?'})"
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str) and e[k] for k in
                                              ("id", "pattern", "verdict", "meaning", "source")):
            raise LogCatalogError(f"{where}: id, pattern, verdict, meaning and source are required")
        if e["verdict"] not in LOG_VERDICTS or e["id"] in seen:
            raise LogCatalogError(f"{where}: verdict one of {', '.join(LOG_VERDICTS)}, id unique")
        if e["verdict"] in (FAIL, WARN) and (e.get("action") not in actions or not e.get("remedy")):
            raise LogCatalogError(f"{where}: a {e['verdict']} needs an action of checks/gates.toml [actions] "
                                  "and a remedy")
        try:
            rx = re.compile(e["pattern"])
        except re.error as err:
            raise LogCatalogError(f"{where}: pattern does not compile ({err})") from None
        seen.add(e["id"])
        out.append({**e, "rx": rx})
    return out


@lru_cache(maxsize=1)
def log_catalog() -> tuple[dict[str, Any], ...]:
    """checks/nic_kernel_log.toml's entries, validated and compiled (:func:`validate_log_catalog`)."""
    data = tomllib.loads(packaged.read_text("checks", "nic_kernel_log.toml"))
    return tuple(validate_log_catalog(data.get("line"), set(load()["actions"])))


def classify(lines: list[str]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``({entry id: {"count", "last", "verdict"}}, [functions whose last module event is "Cable
    unplugged"])`` over kernel-log ``lines``: each line counts for the first catalog entry matching its
    message. Pure."""
    hits: dict[str, dict[str, Any]] = {}
    module: dict[str, str] = {}
    for line in lines:
        msg = message(line)
        for e in log_catalog():
            if e["rx"].search(msg):
                h = hits.setdefault(e["id"], {"count": 0, "last": "", "verdict": e["verdict"]})
                h["count"] += 1
                h["last"] = msg[:300]
                if e["id"] in ("cable-unplugged", "cable-plugged") and (m := _BDF.search(msg)):
                    module[m.group(1)] = e["id"]
                break
    return hits, sorted(b for b, state in module.items() if state == "cable-unplugged")


@gate("fabric.nic-kernel-log")
def nic_kernel_log(ctx: Context, gate_id: str) -> Verdict:
    nic = ctx.obs.nic
    if (v := probe_failed(gate_id, nic)) is not None:
        return v
    if nic is None or nic.kernel_lines is None:
        why = (nic.kernel_source if nic is not None and nic.kernel_source else "not probed")
        return Verdict(gate_id, SKIP, f"NIC kernel log not read: {why}", remedy(gate_id + ".unread"))
    hits, unplugged = classify(nic.kernel_lines)
    facts = {"lines_read": len(nic.kernel_lines), "source": nic.kernel_source, "matched": hits,
             "unplugged": unplugged}
    entries = {e["id"]: e for e in log_catalog()}
    found = [entries[i] for i in entries if i in hits and entries[i]["verdict"] in (FAIL, WARN)]
    quiet = ", ".join(f"{i} x{h['count']}" for i, h in hits.items() if h["verdict"] in ("BENIGN", "INFO"))
    said = f"{len(nic.kernel_lines)} NIC kernel-log line(s) ({nic.kernel_source})"
    if not found and not unplugged:
        return Verdict(gate_id, PASS, f"{said}: no fault line" + (f" (not faults: {quiet})" if quiet else ""),
                       "nothing to do", facts)
    found.sort(key=lambda e: e["verdict"] != FAIL)  # FAILs first, catalog order within a verdict
    parts = [f"{e['id']} x{hits[e['id']]['count']}: {e['meaning']}; last: {hits[e['id']]['last']}" for e in found]
    fixes = [e["remedy"] for e in found]
    if unplugged:
        parts.append(f"cable unplugged from {', '.join(unplugged)} and not plugged back (the last module event)")
        fixes.append(remedy(gate_id + ".unplugged"))
    worst = found[0] if found else None
    verdict = worst["verdict"] if worst else WARN
    return Verdict(gate_id, verdict, f"{said}: " + "; ".join(parts), " Then: ".join(dict.fromkeys(fixes)), facts,
                   action=worst["action"] if worst else "FIX_LINK")


GATES = declared(__name__)
