"""The rail plan of ``afddiag fleet --rails``: which pair tests prove every RoCE rail of the fleet, and
in which rounds they run so that no host port is in two tests at once.

A *rail* is one RDMA port of one host with its IPv4 interface address (``[[host]] rails`` in the
inventory). Which rails should reach each other comes from the declared wiring: ``switch`` (rails on
one IPv4 subnet reach each other) or ``links`` (the ``[[link]]`` cables, host:rail ↔ host:rail: direct
cables, rings, triangles). Which of those pairs are tested comes from ``rail_pairs``: ``coordinator``
(the traffic AFD sends: each coordinator rail with every rank rail it reaches; where no coordinator rail
is on a subnet, every pair of the ranks there, so that rail is proven too) or ``all`` (every pair that
reaches). On ``links`` wiring every cable is one test.

The schedule is an edge colouring of the test graph (rails are vertices, tests edges; a colour is a
round): a bipartite component takes exactly Δ rounds (König), a complete one of an even count n-1
(the circle method), any other at most Δ+1 (Misra & Gries, 1992), Δ being the most tests one port
takes part in. Components share no port, so their rounds run side by side. Pure: no host is touched.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from afddiag.fleet.inventory import Inventory, InventoryError

Vertex = tuple[str, str]  # (host name, rail name)


@dataclass(frozen=True)
class Rail:
    """One host port on the fabric: its host, its name there (a netdev or an RDMA device), the address
    and subnet of its interface, the RDMA device (when declared) and the host's role."""

    host: str
    name: str
    ip: str
    network: ipaddress.IPv4Network
    device: str | None = None
    role: str | None = None

    @property
    def key(self) -> Vertex:
        return (self.host, self.name)

    @property
    def label(self) -> str:
        return f"{self.host}:{self.name}"


@dataclass(frozen=True)
class PairTest:
    """One pair test: the server end (``fabric --serve``) and the client end (``fabric --pair``)."""

    server: Rail
    client: Rail

    def as_json(self) -> dict[str, str]:
        return {"client": self.client.host, "client_ip": self.client.ip,
                "server": self.server.host, "server_ip": self.server.ip}


@dataclass
class RailPlan:
    """The plan: ``rounds`` (each a list of tests that share no port), Δ, and the rails no test
    proves (with why)."""

    rounds: list[list[PairTest]]
    delta: int
    rails: list[Rail]
    untested: list[tuple[Rail, str]]
    wiring: str
    policy: str

    def as_json(self) -> dict[str, Any]:
        return {"rounds": [[t.as_json() for t in r] for r in self.rounds], "delta": self.delta,
                "tests": sum(len(r) for r in self.rounds), "rails": len(self.rails),
                "wiring": self.wiring, "rail_pairs": self.policy,
                "untested": [{"host": r.host, "rail": r.name, "ip": r.ip, "why": why} for r, why in self.untested]}


def reaching_pairs(rails: list[Rail], wiring: str,
                   links: Iterable[tuple[Vertex, Vertex]] = ()) -> list[tuple[Rail, Rail]]:
    """The pairs of rails (on different hosts) the declared wiring says reach each other, in rail order."""
    if wiring == "links":
        by_key = {r.key: r for r in rails}
        return [(by_key[a], by_key[b]) for a, b in links]
    return [(a, b) for i, a in enumerate(rails) for b in rails[i + 1:]
            if a.host != b.host and a.network == b.network]


def _is_coordinator(r: Rail) -> bool:
    return r.role == "coordinator"


def select_tests(rails: list[Rail], pairs: list[tuple[Rail, Rail]], policy: str, wiring: str) -> list[PairTest]:
    """The pair tests under ``policy`` (see the module doc), each oriented with the coordinator (else the
    rail listed first) as the server."""
    if policy == "coordinator" and wiring == "switch":
        with_coordinator = {r.network for r in rails if _is_coordinator(r)}
        pairs = [(a, b) for a, b in pairs
                 if a.network not in with_coordinator or _is_coordinator(a) != _is_coordinator(b)]
    out = []
    for a, b in pairs:
        server, client = (b, a) if _is_coordinator(b) and not _is_coordinator(a) else (a, b)
        out.append(PairTest(server, client))
    return out


def _components(edges: list[tuple[Vertex, Vertex]]) -> list[list[int]]:
    """The connected components of the edge list, as lists of edge indexes."""
    parent: dict[Vertex, Vertex] = {}

    def find(v: Vertex) -> Vertex:
        parent.setdefault(v, v)
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for u, v in edges:
        parent[find(u)] = find(v)
    groups: dict[Vertex, list[int]] = defaultdict(list)
    for i, (u, _) in enumerate(edges):
        groups[find(u)].append(i)
    return list(groups.values())


def _two_sides(edges: list[tuple[Vertex, Vertex]]) -> dict[Vertex, int] | None:
    """A 2-colouring of the vertices (the two sides of a bipartite graph), or None when an odd cycle
    makes it impossible."""
    adj: dict[Vertex, list[Vertex]] = defaultdict(list)
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    side: dict[Vertex, int] = {}
    for start in adj:
        if start in side:
            continue
        side[start] = 0
        stack = [start]
        while stack:
            u = stack.pop()
            for w in adj[u]:
                if w not in side:
                    side[w] = 1 - side[u]
                    stack.append(w)
                elif side[w] == side[u]:
                    return None
    return side


class _Colouring:
    """A proper partial edge colouring: ``at[v][c]`` is the neighbour joined to ``v`` by colour ``c``,
    ``of[{u, v}]`` the colour of the edge u-v."""

    def __init__(self) -> None:
        self.at: dict[Vertex, dict[int, Vertex]] = defaultdict(dict)
        self.of: dict[frozenset[Vertex], int] = {}

    def free(self, v: Vertex, c: int) -> bool:
        return c not in self.at[v]

    def first_free(self, v: Vertex) -> int:
        c = 0
        while c in self.at[v]:
            c += 1
        return c

    def colour_of(self, u: Vertex, v: Vertex) -> int | None:
        return self.of.get(frozenset((u, v)))

    def set(self, u: Vertex, v: Vertex, c: int) -> None:
        self.at[u][c] = v
        self.at[v][c] = u
        self.of[frozenset((u, v))] = c

    def unset(self, u: Vertex, v: Vertex) -> None:
        c = self.of.pop(frozenset((u, v)), None)
        if c is not None:
            del self.at[u][c]
            del self.at[v][c]

    def swap_path(self, start: Vertex, a: int, b: int) -> None:
        """Swap colours ``a`` and ``b`` along the path that leaves ``start`` by its ``a`` edge."""
        path, v, c = [], start, a
        while c in self.at[v]:
            w = self.at[v][c]
            path.append((v, w, c))
            v, c = w, (b if c == a else a)
        for u, w, _ in path:
            self.unset(u, w)
        for u, w, c in path:
            self.set(u, w, b if c == a else a)


def _colour_bipartite(edges: list[tuple[Vertex, Vertex]]) -> list[int]:
    """König's colouring with Δ colours: free colour ``a`` at u, ``b`` at v; when ``a`` is taken at v,
    swap a/b along v's alternating path (it cannot reach u in a bipartite graph)."""
    col = _Colouring()
    for u, v in edges:
        a, b = col.first_free(u), col.first_free(v)
        if not col.free(v, a):
            col.swap_path(v, a, b)
        col.set(u, v, a)
    return [col.of[frozenset((u, v))] for u, v in edges]


def _colour_complete_even(edges: list[tuple[Vertex, Vertex]]) -> list[int] | None:
    """The circle method for a complete graph on an even number n of vertices: n-1 colours; None when
    the component is not one."""
    verts = sorted({v for e in edges for v in e})
    n = len(verts)
    if n % 2 or len(edges) != n * (n - 1) // 2:
        return None
    idx = {v: i for i, v in enumerate(verts)}
    out = []
    for u, v in edges:
        i, j = idx[u], idx[v]
        if n - 1 in (i, j):
            other = j if i == n - 1 else i
            out.append((2 * other) % (n - 1))
        else:
            out.append((i + j) % (n - 1))
    return out


def _fan(col: _Colouring, x: Vertex, f: Vertex, nbrs: list[Vertex]) -> list[Vertex]:
    """A maximal fan of ``x`` starting at ``f`` (its uncoloured edge): each next neighbour's colour at
    ``x`` is free on the fan's last vertex."""
    fan, used = [f], {f}
    grown = True
    while grown:
        grown = False
        for w in nbrs:
            c = col.colour_of(x, w)
            if w not in used and c is not None and col.free(fan[-1], c):
                fan.append(w)
                used.add(w)
                grown = True
                break
    return fan


def _colour_misra_gries(edges: list[tuple[Vertex, Vertex]]) -> list[int]:
    """Misra & Gries: at most Δ+1 colours on any simple graph."""
    col = _Colouring()
    nbrs: dict[Vertex, list[Vertex]] = defaultdict(list)
    for u, v in edges:
        nbrs[u].append(v)
        nbrs[v].append(u)
    for x, f in edges:
        fan = _fan(col, x, f, nbrs[x])
        c, d = col.first_free(x), col.first_free(fan[-1])
        if c != d:
            col.swap_path(x, d, c)  # the cd path through x: c is free at x, so it leaves x by d
        w = None
        for i, v in enumerate(fan):  # the first vertex with d free whose prefix is still a fan
            if i and not col.free(fan[i - 1], col.of[frozenset((x, v))]):
                break
            if col.free(v, d):
                w = i
                break
        if w is None:  # Misra & Gries prove one exists; a defect here must not colour two edges alike
            raise AssertionError(f"edge colouring: no fan vertex with colour {d} free at {x}")
        for i in range(w):  # rotate the fan: each edge takes the next one's colour
            nxt = col.of[frozenset((x, fan[i + 1]))]
            col.unset(x, fan[i + 1])
            col.set(x, fan[i], nxt)
        col.set(x, fan[w], d)
    return [col.of[frozenset((u, v))] for u, v in edges]


def colour_edges(edges: list[tuple[Vertex, Vertex]]) -> list[int]:
    """A round (colour, from 0) per edge such that no vertex has two edges of one round; per connected
    component: König where bipartite (Δ), the circle method where complete on an even count (Δ),
    Misra & Gries otherwise (at most Δ+1)."""
    out = [0] * len(edges)
    for comp in _components(edges):
        sub = [edges[i] for i in comp]
        colours = (_colour_bipartite(sub) if _two_sides(sub) is not None
                   else _colour_complete_even(sub) or _colour_misra_gries(sub))
        for i, c in zip(comp, colours, strict=True):
            out[i] = c
    return out


def plan(rails: list[Rail], wiring: str = "switch", policy: str = "coordinator",
         links: Iterable[tuple[Vertex, Vertex]] = ()) -> RailPlan:
    """The rail plan: the tests the wiring and policy call for, in rounds (see the module doc)."""
    tests = select_tests(rails, reaching_pairs(rails, wiring, list(links)), policy, wiring)
    edges = [(t.server.key, t.client.key) for t in tests]
    colours = colour_edges(edges)
    rounds: list[list[PairTest]] = [[] for _ in range(max(colours, default=-1) + 1)]
    for t, c in zip(tests, colours, strict=True):
        rounds[c].append(t)
    rounds = [r for r in rounds if r]
    degree: dict[Vertex, int] = defaultdict(int)
    for u, v in edges:
        degree[u] += 1
        degree[v] += 1
    untested = [(r, "no peer on its subnet" if wiring == "switch" else "no [[link]] names it")
                for r in rails if r.key not in degree]
    return RailPlan(rounds, max(degree.values(), default=0), rails, untested, wiring, policy)


def format_plan(p: RailPlan) -> str:
    """The plan as text: a two-line head, then each round's tests one a line (server <- client, columns
    as wide as the longest rail label), then the rails left untested."""
    tests = sum(len(r) for r in p.rounds)
    width = max((len(r.label) for r in p.rails), default=0)
    lines = [f"{len(p.rails)} rails, {tests} pair tests in {len(p.rounds)} rounds",
             f"(Δ = {p.delta}, the most tests one port is in; wiring {p.wiring}, rail_pairs {p.policy})"]
    for i, tests_in_round in enumerate(p.rounds, 1):
        lines.append(f"round {i}: {len(tests_in_round)} test(s) at once")
        for t in tests_in_round:
            lines.append(f"  {t.server.label:<{width}} {t.server.ip:<15} <- {t.client.label:<{width}} {t.client.ip}")
    for lone, why in p.untested:
        lines.append(f"untested: {lone.label} {lone.ip} ({why})")
    return "\n".join(lines)


def inventory_rails(inv: Inventory) -> list[Rail]:
    """Every declared rail of the inventory, in file order."""
    out = []
    for h in inv.hosts:
        for r in h.rails:
            iface = ipaddress.IPv4Interface(r["ip"])
            out.append(Rail(h.name, r["name"], str(iface.ip), iface.network, r.get("device"), h.role))
    return out


def plan_inventory(inv: Inventory) -> RailPlan:
    """The rail plan of an inventory (its rails, ``[fleet] wiring`` and ``rail_pairs``, its ``[[link]]``
    cables). Raises :class:`InventoryError` when it declares no rails, or links wiring without links."""
    rails = inventory_rails(inv)
    if not rails:
        raise InventoryError(f"inventory {inv.path}: no [[host]] declares rails: add rails = [{{ name = \"...\", "
                             "ip = \"192.168.100.10/24\" }] to each host for fleet --rails")
    wiring = inv.settings.get("wiring", "switch")
    if wiring == "links" and not inv.links:
        raise InventoryError(f"inventory {inv.path}: wiring = \"links\" but no [[link]] cables: declare each cable "
                             "(a = \"host:rail\", b = \"host:rail\") or use wiring = \"switch\"")
    return plan(rails, wiring, inv.settings.get("rail_pairs", "coordinator"), inv.links)
