"""The connect matrix ``fleet.control-plane`` judges (the gate is :func:`afddiag.gates.fleet.control_plane`):
which host reached which peer's engine port, from each host's summary ``control_plane`` (its
``launch.control-plane`` TCP connects from its fabric IP). Pure functions over the hosts'
:class:`~afddiag.gates.fleet.HostResult` (read through ``name``, ``ok``, ``fip`` and ``summary``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable
from typing import Any

from afddiag.catalog import remedy
from afddiag.summary import as_int

REACHED = ("connected", "refused")  # refused: the peer's kernel answered (nothing listens yet before launch)
DROPPED = ("timeout", "unreachable")  # a firewall drops (or rejects with host-unreachable), or no route

Matrix = dict[str, dict[str, dict[int, str]]]  # source host -> peer host -> port -> outcome


def owners(fleet: Iterable[Any]) -> dict[str, str]:
    """IPv4 address → the host holding it: each host's fabric IP first, then every other address its
    netdevs hold (summary ``ipv4_prefixlen``)."""
    hosts = [h for h in fleet if h.ok]
    own: dict[str, str] = {}
    for h in hosts:
        if h.fip:
            own.setdefault(h.fip, h.name)
    for h in hosts:
        for addr in h.summary.get("ipv4_prefixlen") or {}:
            own.setdefault(str(addr), h.name)
    return own


def ports_txt(cells: dict[int, str]) -> str:
    """``"5000 timeout, 5001 connected"``: each port tried and its outcome, by port."""
    return ", ".join(f"{p} {o}" for p, o in sorted(cells.items()))


def connect_matrix(fleet: Iterable[Any], owner: dict[str, str]
                   ) -> tuple[Matrix, dict[str, set[str]], dict[str, list[dict[str, str]]], list[str]]:
    """``(matrix, not_tried, advertised, unjudged)`` from the hosts' summaries: the outcome of each
    connect by source host, peer host (an address no host holds stays the address) and port; the peers
    a host did not try (its time bound used up); each host's launch-env addresses advertised as a
    wildcard or loopback; the hosts not judged, each with why."""
    matrix: Matrix = {}
    not_tried: dict[str, set[str]] = defaultdict(set)
    advertised: dict[str, list[dict[str, str]]] = {}
    unjudged: list[str] = []
    for h in fleet:
        if not h.ok:
            continue
        cp = h.summary.get("control_plane")
        if not isinstance(cp, dict):
            unjudged.append(f"{h.name} (no control-plane facts: launch gates not run, or an afddiag before them)")
            continue
        bad = [b for b in cp.get("advertised_bad") or [] if isinstance(b, dict)]
        if bad:
            advertised[h.name] = bad
        row: dict[str, dict[int, str]] = {}
        for a in cp.get("attempts") or []:
            port = as_int((a or {}).get("port")) if isinstance(a, dict) else None
            if port is None or not isinstance(a.get("peer"), str):
                continue
            dst = owner.get(a["peer"], a["peer"])
            if dst == h.name:
                continue
            row.setdefault(dst, {})[port] = str(a.get("outcome") or "error")
        for t in cp.get("not_tried") or []:
            if isinstance(t, dict) and isinstance(t.get("peer"), str):
                not_tried[h.name].add(owner.get(t["peer"]) or t["peer"])
        if row:
            matrix[h.name] = row
        else:
            unjudged.append(f"{h.name} (launch.control-plane {cp.get('verdict') or '?'}: no connection tried)")
    return matrix, not_tried, advertised, unjudged


def asymmetric(matrix: Matrix, down: dict[tuple[str, str], dict[int, str]],
               explained: Container[tuple[str, str]]) -> list[dict[str, Any]]:
    """The pairs where d reaches s on every port it tried while s's connects to d are dropped (not a
    source that could not bind, not a pair ``explained`` by another fault: a link that is down, a host off
    the fleet's subnet): d's side drops what it does not start."""
    reached = {(s, d) for s, row in matrix.items() for d, cells in row.items()
               if any(o in REACHED for o in cells.values())}
    asym: list[dict[str, Any]] = []
    for (s, d), cells in down.items():
        if (s, d) in explained:  # a link that is down, an address off the subnet: no firewall
            continue
        if (d, s) in reached and (d, s) not in down and all(o in DROPPED for o in cells.values()):
            asym.append({"reaches": d, "cannot_reach_back": s, "drops": d, "ports": sorted(cells),
                         "outcomes": {p: o for p, o in sorted(cells.items())}})
    return asym


def not_tested(matrix: Matrix, coords: list[str], ranks: list[str], fip: dict[str, str | None],
               keep: int = 8) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The pairs a role requires (each coordinator ↔ every rank) that the source host never tested:
    ``({source: [the first `keep` peers]}, {source: how many peers in all})``, coordinators' rows
    first. Walks the pairs without building them and keeps at most ``keep`` names a host, so memory
    and the report grow with the hosts, not with the pairs (a fleet of thousands of ranks)."""
    names: dict[str, list[str]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)

    def add(src: str, peer: str) -> None:
        counts[src] += 1
        if len(names[src]) < keep:
            names[src].append(peer)

    for c in coords:
        if c in matrix:
            for r in ranks:
                if r not in matrix[c] and fip.get(r):
                    add(c, r)
    for c in coords:
        for r in ranks:
            if r in matrix and c not in matrix[r] and fip.get(c):
                add(r, c)
    return dict(names), dict(counts)


def root_fixes(by_link: dict[tuple[str, str], Any], link_down: dict[str, str], off_named: str, n_off: int,
               fleet_subnet: str | None) -> list[str]:
    """The faults that explain dropped connects, each named once as its root: a fabric link that is down
    (``by_link``: the pairs it explains; ``link_down``: host → its fabric.link summary), ``n_off`` hosts
    off the fleet's subnet (``off_named``: their names, as the gate lists them; fleet.fabric-ip)."""
    fixes = []
    if by_link:
        fixes.append("fix the fabric link first on " + "; on ".join(
            f"{n} (fabric.link there: {link_down[n]})" if link_down[n] else n for n in sorted(
                {h for k in by_link for h in k if h in link_down}))
            + ": the connections to and from it are judged again once it is up")
    if n_off:
        fixes.append(f"fix the fabric address first on {off_named} (fleet.fabric-ip: not on the fleet's subnet "
                     f"{fleet_subnet}; its remedy): the connections to and from {'it' if n_off == 1 else 'them'} "
                     "are judged again once on it (no firewall is at fault for them)")
    return fixes


def control_remedy(gate_id: str, down: dict[tuple[str, str], dict[int, str]], explained: int,
                    roots: list[str], root_action: str, asym: list[dict[str, Any]],
                    advertised: dict[str, list[dict[str, str]]], fip: dict[str, str | None]) -> tuple[str, str]:
    """fleet.control-plane's FAIL remedy and action: the root's (FIX_LINK for a link that is down,
    FIX_ADDRESS for a host off the fleet's subnet) when those explain every dropped connection
    (``explained`` of them); OPEN_PORTS for the other dropped connections (the firewall rule to open on the
    dropping side when each is one-way); SET_ENV when only advertised addresses are wrong."""
    root_fix = "; and ".join(roots)
    if down and explained == len(down):  # every dropped connection is explained by a root fault
        return root_fix + ("; and " + remedy("launch.control-plane.advertised") if advertised else ""), root_action
    if not down:
        return remedy("launch.control-plane.advertised"), "SET_ENV"
    if asym and len(asym) == len(down) - explained:
        fixes = "; ".join(f"on {a['drops']}, open port(s) {', '.join(map(str, a['ports']))} to "
                          f"{a['cannot_reach_back']}'s fabric address {fip.get(a['cannot_reach_back'])} "
                          f"(`sudo ufw allow proto tcp from {fip.get(a['cannot_reach_back'])} to any port "
                          f"{a['ports'][0]}`, or nftables/iptables)" for a in asym)
        rem = fixes + ": its firewall drops connections it does not start (the other way works)"
    else:
        rem = remedy(gate_id)
    if root_fix:
        rem += "; and " + root_fix
    if advertised:
        rem += "; and " + remedy("launch.control-plane.advertised")
    return rem, "OPEN_PORTS"
