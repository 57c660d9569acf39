"""The fleet's fabric subnet: which subnet each host's fabric IP is on and which hosts are off the
fleet's. ``fleet.fabric-ip`` judges it (:func:`afddiag.gates.fleet.fabric_ip`); ``fleet.control-plane``
attributes the connects such a host drops to its address, not to a firewall. Pure functions over the
hosts' :class:`~afddiag.gates.fleet.HostResult` (read through ``name``, ``ok``, ``fip``, ``host_role``
and ``summary``)."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from afddiag.summary import as_int

COORDINATOR = "coordinator"
DEFAULT_PREFIX = 24  # judged with when no host's prefix length was seen


def minority(values: dict[str, Any]) -> tuple[Any, list[str]]:
    """The most common value and the hosts holding any other value (host order kept). A tie goes
    to the largest value (the larger MTU, the newer-sorting version), so the result is stable."""
    counts = Counter(values.values())
    top = max(counts.values())
    common = max((v for v, c in counts.items() if c == top), key=lambda v: (str(type(v)), v))
    return common, [h for h, v in values.items() if v != common]


@dataclass
class Subnets:
    """``nets``: host → the subnet of its fabric IP (``"10.0.0.0/24"``, the prefix length read from the
    netdev holding the address); ``assumed``: the hosts whose prefix was unseen (judged with the most
    common one seen, else /24); ``common``: the fleet's subnet, the most common, the coordinator's among
    subnets with as many hosts each (every rank must reach it); ``off``: the hosts not on it."""

    nets: dict[str, str] = field(default_factory=dict)
    assumed: list[str] = field(default_factory=list)
    common: str | None = None
    source: str = "the most common"

    @property
    def off(self) -> list[str]:
        return [n for n, net in self.nets.items() if net != self.common]


def _prefix(h: Any, ip: str) -> int | None:
    """The prefix length of ``ip`` on the netdev holding it (summary ``ipv4_prefixlen``), None if unseen."""
    return as_int((h.summary.get("ipv4_prefixlen") or {}).get(ip))


def fabric_subnets(fleet: Iterable[Any], ips: dict[str, str] | None = None) -> Subnets:
    """The subnet of each host's fabric IP (``ips``: host → fabric IP; by default each reporting
    host's ``fip``) and the fleet's subnet (:class:`Subnets`)."""
    hosts = {h.name: h for h in fleet if h.ok}
    if ips is None:
        ips = {n: h.fip for n, h in hosts.items() if h.fip}
    prefixes = {n: _prefix(hosts[n], ip) for n, ip in ips.items() if n in hosts}
    known = [p for p in prefixes.values() if p is not None]
    default_plen = Counter(known).most_common(1)[0][0] if known else DEFAULT_PREFIX
    out = Subnets(assumed=[n for n, p in prefixes.items() if p is None])
    for n, ip in ips.items():
        plen = prefixes.get(n)
        try:
            out.nets[n] = str(ipaddress.IPv4Network(f"{ip}/{plen if plen is not None else default_plen}", strict=False))
        except ValueError:
            continue
    if not out.nets:
        return out
    counts = Counter(out.nets.values())
    top = max(counts.values())
    tied = {net for net, c in counts.items() if c == top}
    coords = {n: net for n, net in out.nets.items() if hosts[n].host_role == COORDINATOR and net in tied}
    if coords and len(tied) > 1:  # as many hosts on each: the ranks must reach the coordinator, its subnet wins
        out.common, out.source = minority(coords)[0], "the coordinator's"
    else:
        out.common = minority(out.nets)[0]
    return out


def off_subnet_pairs(subnets: Subnets, down: dict[tuple[str, str], Any]) -> dict[tuple[str, str], str]:
    """The dropped connects (``down``: (source host, peer host) → cells) that a host off the fleet's
    subnet explains: the two ends are fleet hosts on different subnets and one of them is off the
    fleet's. Value: the host off the subnet (the source when both are)."""
    off = set(subnets.off)
    out: dict[tuple[str, str], str] = {}
    for s, d in down:
        if s in subnets.nets and d in subnets.nets and subnets.nets[s] != subnets.nets[d] and {s, d} & off:
            out[(s, d)] = s if s in off else d
    return out
