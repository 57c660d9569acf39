"""The rail plan (`afddiag fleet --rails --plan`, issue 26): which pair tests prove every rail, in rounds
where no port is in two tests at once, within Δ+1 rounds (exactly Δ on the example inventory)."""

from __future__ import annotations

import ipaddress
import itertools
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from afddiag.cli import cli, run
from afddiag.fleet.inventory import InventoryError, load_inventory
from afddiag.fleet.rails import Rail, colour_edges, plan, plan_inventory

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "playbooks" / "fleet-rails.toml"


def degree_of(edges) -> Counter:
    deg: Counter = Counter()
    for u, v in edges:
        deg[u] += 1
        deg[v] += 1
    return deg


def assert_proper(edges, colours) -> None:
    seen: dict = defaultdict(set)
    for (u, v), c in zip(edges, colours, strict=True):
        assert c not in seen[u] and c not in seen[v], f"{u}-{v} shares round {c} with another test of an end"
        seen[u].add(c)
        seen[v].add(c)


def rounds_of(p) -> list[list[tuple]]:
    return [[((t.server.host, t.server.name), (t.client.host, t.client.name)) for t in r] for r in p.rounds]


def test_example_inventory_every_rail_in_exactly_delta_rounds_no_port_twice_a_round():
    p = plan_inventory(load_inventory(str(EXAMPLE)))
    assert len(p.rails) == 18 and not p.untested  # every rail of the coordinator and the four Sparks has a test
    assert p.delta == 4 and len(p.rounds) == p.delta
    for r in rounds_of(p):
        ends = [e for t in r for e in t]
        assert len(ends) == len(set(ends))  # no port in two tests of one round
    by_key = {r.key: r for r in p.rails}
    tests = [t for r in rounds_of(p) for t in r]
    for a, b in tests:
        assert by_key[a].network == by_key[b].network and a[0] != b[0]
    # the coordinator's two rails each meet every rank once; the rank-only subnets pair every two Sparks
    coord = Counter(t[0] for t in tests if t[0][0] == "coord")
    assert coord == {("coord", "rocep1s0f0"): 4, ("coord", "rocep1s0f1"): 4}
    rank_only = {frozenset((a[0], b[0])) for a, b in tests if a[1] == "roceP2p1s0f0"}
    assert len(rank_only) == 6  # C(4, 2)
    assert all(t[1][0] != "coord" for t in tests)  # the coordinator serves, the ranks are clients


def test_plan_json_shape_from_the_cli_offline():
    res = CliRunner().invoke(cli, ["fleet", "--inventory", str(EXAMPLE), "--rails", "--plan", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert len(d["rounds"]) == 4 and d["delta"] == 4 and d["tests"] == 20
    t = d["rounds"][0][0]
    assert set(t) == {"client", "client_ip", "server", "server_ip"}
    ipaddress.IPv4Address(t["client_ip"])
    text = CliRunner().invoke(cli, ["fleet", "--inventory", str(EXAMPLE), "--rails", "--plan"])
    assert text.exit_code == 0 and "20 pair tests in 4 rounds" in text.output
    assert max(len(x) for x in text.output.splitlines()) <= 80


def test_plan_without_rails_is_a_usage_error_naming_the_fix(capsys):
    assert run(["fleet", "--inventory", str(EXAMPLE), "--plan"]) == 64
    assert "--rails --plan" in capsys.readouterr().err


def rail(host, name, cidr, role="expert") -> Rail:
    iface = ipaddress.IPv4Interface(cidr)
    return Rail(host, name, str(iface.ip), iface.network, None, role)


def test_all_pairs_on_five_hosts_takes_delta_plus_one_and_a_lone_rail_is_untested():
    rails = [rail(f"h{i}", "r0", f"10.0.0.{i + 1}/24") for i in range(5)] + [rail("h0", "r1", "10.9.0.1/24")]
    p = plan(rails, "switch", "all")
    assert p.delta == 4 and len(p.rounds) == 5  # K5 has no 4-round schedule: Δ+1 is the best there is
    assert sum(len(r) for r in p.rounds) == 10
    assert [(r.label, why) for r, why in p.untested] == [("h0:r1", "no peer on its subnet")]


def test_two_coordinators_on_a_subnet_each_meet_every_rank_and_not_each_other():
    rails = [rail("c1", "r", "10.0.0.1/24", "coordinator"), rail("c2", "r", "10.0.0.2/24", "coordinator"),
             rail("s1", "r", "10.0.0.3/24"), rail("s2", "r", "10.0.0.4/24")]
    p = plan(rails, "switch", "coordinator")
    pairs = {frozenset((t.server.host, t.client.host)) for r in p.rounds for t in r}
    assert pairs == {frozenset(x) for x in [("c1", "s1"), ("c1", "s2"), ("c2", "s1"), ("c2", "s2")]}
    assert len(p.rounds) == 2 == p.delta


def write_inv(tmp_path, body: str) -> str:
    f = tmp_path / "inv.toml"
    f.write_text(body)
    return str(f)


TRIANGLE = """
[fleet]
wiring = "links"
{hosts}
[[link]]
a = "a:p1"
b = "b:p0"
[[link]]
a = "b:p1"
b = "c:p0"
[[link]]
a = "c:p1"
b = "a:p0"
"""


def triangle_hosts(ips=("10.1.0.{h}/24", "10.2.0.{h}/24")) -> str:
    return "".join(f'[[host]]\nname = "{n}"\nrails = [{{ name = "p0", ip = "{ips[0].format(h=i + 1)}" }}, '
                   f'{{ name = "p1", ip = "{ips[1].format(h=i + 1)}" }}]\n' for i, n in enumerate("abc"))


def test_links_wiring_tests_each_cable_once_in_one_round(tmp_path):
    p = plan_inventory(load_inventory(write_inv(tmp_path, TRIANGLE.format(hosts=triangle_hosts()))))
    assert p.delta == 1 and len(p.rounds) == 1 and len(p.rounds[0]) == 3 and not p.untested
    cables = {frozenset((t.server.label, t.client.label)) for t in p.rounds[0]}
    assert cables == {frozenset(x) for x in [("a:p1", "b:p0"), ("b:p1", "c:p0"), ("c:p1", "a:p0")]}


@pytest.mark.parametrize("link, why", [
    ('a = "a:p1"\nb = "b:p9"', "names no declared rail"),
    ('a = "a:p0"\nb = "a:p1"', "a link joins two hosts"),
    ('a = "a:p1"', "exactly a and b"),
    (TRIANGLE.split("[[link]]", 1)[1] + '[[link]]\na = "a:p1"\nb = "c:p1"', "already has a cable"),
])
def test_bad_links_are_one_line_errors_naming_the_fix(tmp_path, link, why):
    body = triangle_hosts() + f"[[link]]\n{link}\n"
    with pytest.raises(InventoryError, match=why):
        load_inventory(write_inv(tmp_path, body))


@pytest.mark.parametrize("rails, why", [
    ('[{ name = "p0", ip = "10.0.0.1" }]', "prefix length"),
    ('[{ name = "p0", ip = "10.0.0.1/32" }]', "prefix length"),
    ('[{ name = "p0", ip = "10.0.0.1/24" }, { name = "p0", ip = "10.0.1.1/24" }]', "used twice"),
    ('[{ ip = "10.0.0.1/24" }]', "needs a name and an ip"),
    ('[{ name = "p0", ip = "10.0.0.1/24", speed = 200 }]', "unknown key"),
])
def test_bad_rails_are_one_line_errors(tmp_path, rails, why):
    with pytest.raises(InventoryError, match=why):
        load_inventory(write_inv(tmp_path, f'[[host]]\nname = "a"\nrails = {rails}\n'))


def test_links_wiring_without_links_and_no_rails_say_what_to_add(tmp_path):
    inv = load_inventory(write_inv(tmp_path, '[fleet]\nwiring = "links"\n' + triangle_hosts()))
    with pytest.raises(InventoryError, match=r"no \[\[link\]\]"):
        plan_inventory(inv)
    with pytest.raises(InventoryError, match="declares rails"):
        plan_inventory(load_inventory(write_inv(tmp_path, '[[host]]\nname = "a"\n')))


graphs = st.integers(2, 11).flatmap(lambda n: st.lists(
    st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda e: e[0] < e[1]),
    min_size=1, max_size=n * (n - 1) // 2, unique=True))


@settings(max_examples=300, deadline=None)
@given(graphs)
def test_any_graph_is_scheduled_properly_within_delta_plus_one(edge_list):
    edges = [(("h", str(u)), ("h", str(v))) for u, v in edge_list]
    colours = colour_edges(edges)
    assert_proper(edges, colours)
    assert max(colours) + 1 <= max(degree_of(edges).values()) + 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 7), st.integers(1, 7), st.data())
def test_a_bipartite_graph_takes_exactly_delta(left, right, data):
    cand = list(itertools.product(range(left), range(right)))
    chosen = data.draw(st.lists(st.sampled_from(cand), min_size=1, unique=True))
    edges = [(("l", str(a)), ("r", str(b))) for a, b in chosen]
    colours = colour_edges(edges)
    assert_proper(edges, colours)
    assert max(colours) + 1 == max(degree_of(edges).values())


@pytest.mark.parametrize("n", [4, 6, 16])
def test_a_complete_graph_on_an_even_count_takes_n_minus_one(n):
    edges = [(("h", str(a)), ("h", str(b))) for a, b in itertools.combinations(range(n), 2)]
    colours = colour_edges(edges)
    assert_proper(edges, colours)
    assert max(colours) + 1 == n - 1
