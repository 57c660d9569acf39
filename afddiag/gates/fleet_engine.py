"""``fleet.engine-net``: what NCCL said it chose on each rank (the per-host summary's ``engine``, from
``--engine-log``), compared across the fleet: every rank on the same network and link layer (RoCE, not
some on sockets). GID indexes are listed, not compared: each rank's must be its own fabric IP's RoCE v2
GID, which differs between hosts legitimately (``launch.engine-net`` checks it per host). Reads each
host's summary through ``name``, ``ok`` and ``summary`` (as :mod:`afddiag.gates.control_plane` does); pure."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from afddiag.catalog import remedy
from afddiag.gates import declared, gate
from afddiag.termsafe import line
from afddiag.verdict import PASS, SKIP, WARN, Verdict

MAX_NAMED = 8  # hosts named per group before "and N more"


def _hosts(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(line(n) for n in names[:MAX_NAMED]) + more


def _groups(by: dict[str, list[str]]) -> str:
    return "; ".join(f"{_hosts(names)}: {line(key)}" for key, names in sorted(by.items(), key=lambda kv: -len(kv[1])))


@gate("fleet.engine-net")
def engine_net(fleet: list[Any], expect: dict[str, Any], gate_id: str) -> Verdict:
    """Groups the ranks whose engine log was read by NCCL's network and link layer (``IB``, ``IB/RoCE``,
    ``Socket``); more than one group is WARN naming each group's hosts."""
    nets: dict[str, list[str]] = defaultdict(list)
    gids: dict[str, list[str]] = defaultdict(list)
    unread: list[str] = []
    for h in fleet:
        e = h.summary.get("engine") if h.ok else None
        if not isinstance(e, dict) or not isinstance(e.get("network"), str):
            if h.ok:
                unread.append(h.name)
            continue
        layers = sorted({str(d).rpartition("/")[2] for d in e.get("devices") or [] if "/" in str(d)})
        nets[e["network"] + (f"/{'+'.join(layers)}" if layers else "")].append(h.name)
        g = e.get("gid_indexes")
        if e["network"] != "Socket" and isinstance(g, list) and g:
            gids[", ".join(str(x) for x in g)].append(h.name)
    facts = {"networks": dict(nets), "gid_indexes": dict(gids), "not_read": unread}
    down = [h.name for h in fleet if not h.ok]
    tail = (f" ({len(unread)} host(s) without NCCL NET lines read: {_hosts(unread)})" if unread else "") + (
        f" ({len(down)} host(s) without a report not judged: {_hosts(down)})" if down else "")
    judged = sum(len(n) for n in nets.values())
    if judged < 2:
        return Verdict(gate_id, SKIP, f"{judged} rank(s) with NCCL's choice read from an engine log: nothing to "
                       f"compare{tail}", remedy(gate_id), facts)
    if len(nets) > 1:
        return Verdict(gate_id, WARN, f"ranks on different NCCL networks: {_groups(nets)}{tail}",
                       "launch.engine-net on each host named says why its NCCL chose that network (a socket "
                       "fallback: the HCA not visible to the engine, NCCL_IB_DISABLE or NCCL_NET set)", facts,
                       action="CHECK_FABRIC")
    (net,) = nets
    gid = (f", GID index {line(next(iter(gids)))}" if len(gids) == 1 else
           f"; GID index per rank (each its own fabric IP's): {_groups(gids)}" if gids else "")
    return Verdict(gate_id, PASS, f"{judged} rank(s) on NCCL network {line(net)}{gid}{tail}", "nothing to do", facts)


GATES = declared(__name__)
