"""``fleet.nccl-build``: the libnccl each rank's engine loads, compared across the fleet. Ranks loading
different NCCL builds (pip's nvidia-nccl wheel on one host, DGX OS's libnccl2 on another) are reported
hanging in collectives even at the same version (vLLM issues 41725 and 42354). Reads each host's
per-host summary ``nccl`` (:mod:`afddiag.summary`) through ``name``, ``ok`` and ``summary``, as
:mod:`afddiag.gates.control_plane` does; pure."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from afddiag.catalog import remedy
from afddiag.gates import declared, gate
from afddiag.termsafe import line
from afddiag.verdict import PASS, SKIP, WARN, Verdict

MAX_NAMED = 8  # hosts named per build before "and N more"


def _build(b: dict[str, Any]) -> str:
    """``NCCL 2.28.9 build 1a2b3c4d5e6f (wheel)`` of a summary's ``nccl``, host text escaped. Pure."""
    ver = f"NCCL {line(b.get('version'))}" if b.get("version") else "NCCL version unread"
    bid = f"build {line(str(b['build_id'])[:12])}" if b.get("build_id") else "no build id"
    return f"{ver} {bid} ({line(b.get('origin'))})"


def _hosts(names: list[str]) -> str:
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return ", ".join(line(n) for n in names[:MAX_NAMED]) + more


@gate("fleet.nccl-build")
def nccl_build(fleet: list[Any], expect: dict[str, Any], gate_id: str) -> Verdict:
    """Groups the hosts by (version, build id) of the libnccl their engine loads; more than one group
    among the hosts that read one is WARN naming each group's hosts (the largest first)."""
    builds: dict[tuple[str, str], list[str]] = defaultdict(list)
    shown: dict[tuple[str, str], dict[str, Any]] = {}
    unread: list[str] = []
    for h in fleet:
        if not h.ok:
            continue
        b = h.summary.get("nccl")
        if not isinstance(b, dict) or not (b.get("build_id") or b.get("version")):
            unread.append(h.name)
            continue
        key = (str(b.get("version") or ""), str(b.get("build_id") or ""))
        builds[key].append(h.name)
        shown.setdefault(key, b)
    facts = {"builds": [{"version": v, "build_id": bid, "hosts": names} for (v, bid), names in builds.items()],
             "not_read": unread}
    down = [h.name for h in fleet if not h.ok]
    tail = (f" ({len(unread)} host(s) without a libnccl read: {_hosts(unread)})" if unread else "") + (
        f" ({len(down)} host(s) without a report not judged: {_hosts(down)})" if down else "")
    judged = sum(len(n) for n in builds.values())
    if judged < 2:
        return Verdict(gate_id, SKIP, f"{judged} host(s) with the libnccl their engine loads read: nothing to "
                       f"compare{tail}", remedy(gate_id), facts)
    if len(builds) > 1:
        groups = sorted(builds.items(), key=lambda kv: -len(kv[1]))
        parts = [f"{_hosts(names)}: {_build(shown[key])}" for key, names in groups]
        return Verdict(gate_id, WARN, f"ranks load {len(builds)} different NCCL builds: {'; '.join(parts)}{tail}",
                       "make every rank load the same libnccl build (the same wheel everywhere, or the system "
                       "library named in LD_PRELOAD or first in LD_LIBRARY_PATH of every host's launch env); "
                       "launch.nccl on each host names the copy it loads", facts, action="SET_ENV")
    key, names = next(iter(builds.items()))
    return Verdict(gate_id, PASS, f"{judged} host(s) load the same {_build(shown[key])}{tail}", "nothing to do", facts)


GATES = declared(__name__)
