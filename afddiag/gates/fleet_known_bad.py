"""``fleet.known-bad``: the hosts of a fleet whose versions match the known-bad matrix
(``checks/known_bad.toml``), grouped by entry, from each host's per-host summary (``known_bad``: what
``host.known-bad`` matched; :func:`afddiag.summary.known_bad_of`). A host whose report has no such gate,
or whose matrix could not be checked, is named as not judged. Linear in hosts; at most MAX_NAMED hosts
named per entry. Pure. :mod:`afddiag.gates.fleet` runs it with its own gates (its ``GATES``)."""

from __future__ import annotations

from typing import Any

from afddiag.catalog import remedy
from afddiag.gates import declared, gate
from afddiag.gates.known_bad import RANK, matrix
from afddiag.verdict import PASS, SKIP, WARN, Verdict

MAX_NAMED = 8  # as afddiag.gates.fleet: hosts named in one summary before "and N more"


def _names(hosts: list[str]) -> str:
    return ", ".join(hosts[:MAX_NAMED]) + (f" and {len(hosts) - MAX_NAMED} more" if len(hosts) > MAX_NAMED else "")


@gate("fleet.known-bad")
def known_bad(fleet: list[Any], expect: dict[str, Any], gate_id: str) -> Verdict:
    """``fleet``: :class:`afddiag.gates.fleet.HostResult` objects (``name``, ``ok``, ``error``, ``summary``);
    this module is imported by that one, so it names the type only here."""
    per: dict[str, list[str]] = {}
    judged, unjudged = 0, []
    for h in fleet:
        if not h.ok:
            continue
        kb = h.summary.get("known_bad")
        if not isinstance(kb, dict) or kb.get("verdict") not in (PASS, WARN, "FAIL"):
            unjudged.append(h.name)
            continue
        judged += 1
        for entry_id in kb.get("matched") or []:
            per.setdefault(str(entry_id)[:100], []).append(h.name)
    facts = {"matched": {i: {"hosts": hs[:MAX_NAMED], "count": len(hs)} for i, hs in per.items()},
             "judged": judged, "not_judged": unjudged[:MAX_NAMED], "not_judged_count": len(unjudged),
             "no_report": [f"{h.name} ({h.error})" for h in fleet if not h.ok][:MAX_NAMED]}
    down = [h.name for h in fleet if not h.ok]
    tail = (f" (matrix not checked: {_names(unjudged)})" if unjudged else "") + \
        (f" ({len(down)} host(s) without a report not judged: {_names(down)})" if down else "")
    if not judged:
        return Verdict(gate_id, SKIP, "no host's versions could be checked against the known-bad matrix"
                       + tail, remedy(gate_id), facts)
    if not per:
        return Verdict(gate_id, PASS, f"{judged} host(s): no known-bad entry matches{tail}", "nothing to do", facts)
    entries = {e["id"]: e for e in matrix()}
    hits = sorted(per, key=lambda i: (-RANK.get(entries[i]["verdict"], 1) if i in entries else -1, i))
    worst = entries.get(hits[0])
    text = "; ".join(f"{i}: {len(per[i])} host(s): {_names(per[i])}" for i in hits)
    fixes = " Then: ".join(dict.fromkeys(entries[i]["remedy"] for i in hits if i in entries)) or remedy(gate_id)
    return Verdict(gate_id, worst["verdict"] if worst else WARN, f"known-bad versions: {text}{tail}", fixes, facts,
                   action=worst["action"] if worst else "UPDATE_VERSIONS")


GATES = declared(__name__)
