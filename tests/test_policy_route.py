"""Policy routing (issue 16): capture records the rules (`ip -j rule show` form, read through
pyroute2), and a replay looks routes up through them the way the kernel does, so a host fixed with
a rule passes fabric.route on replay as it does live."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from afddiag import cli
from afddiag.probes import route
from afddiag.probes.route import lookup_policy, rule_matches
from conftest import CASES

CASE = CASES / "fabric" / "02-spark-map-set-healthy"
FIP = "192.168.100.11"  # on enp1s0f1np1 = rocep1s0f1 GID 3
RAIL = "enp1s0f1np1"
OTHER = "enP2p1s0f1np1"
PEER = "192.168.100.10"
DEFAULT_RULES = [{"priority": 0, "src": "all", "table": "local"}, {"priority": 32766, "src": "all", "table": "main"},
                 {"priority": 32767, "src": "all", "table": "default"}]
# the main table sends the fabric subnet out of the other rail (the break); table 100 has the fix
TABLES = [{"dst": "192.168.100.0/24", "dev": OTHER, "prefsrc": "192.168.101.11", "table": "main", "type": "unicast"},
          {"dst": "192.168.100.0/24", "dev": RAIL, "prefsrc": FIP, "table": "100"},
          {"type": "local", "dst": FIP, "dev": RAIL, "table": "local"}]
FIX = {"priority": 100, "src": FIP, "table": "100"}


def test_rule_selects_by_source_and_the_table_decides():
    assert lookup_policy(PEER, FIP, DEFAULT_RULES, TABLES).dev == OTHER  # main table: the break
    r = lookup_policy(PEER, FIP, DEFAULT_RULES + [FIX], TABLES)
    assert (r.dev, r.src, r.error) == (RAIL, FIP, None) and "rule 100 → table 100" in r.source
    # another source address is not selected by the rule
    assert lookup_policy(PEER, "192.168.101.11", DEFAULT_RULES + [FIX], TABLES).dev == OTHER


@pytest.mark.parametrize("rule,selects", [
    ({"src": "192.168.100.0", "srclen": 24}, True), ({"src": "192.168.100.0/24"}, True),
    ({"src": "10.0.0.0", "srclen": 8}, False), ({"dst": "192.168.100.0", "dstlen": 24}, True),
    ({"dst": "192.168.200.0", "dstlen": 24}, False), ({"fwmark": "0x1"}, False), ({"iif": "eth0"}, False),
    ({"iif": "lo"}, True), ({"oif": RAIL}, False), ({"src": "10.0.0.0", "srclen": 8, "not": True}, True),
])
def test_rule_selectors(rule, selects):
    assert rule_matches({"priority": 1, **rule}, PEER, FIP) is selects


def test_refusing_rules_and_routes_and_fallthrough():
    r = lookup_policy(PEER, FIP, [{"priority": 5, "src": "all", "action": "unreachable"}] + DEFAULT_RULES, TABLES)
    assert r.dev is None and "policy rule 5 says unreachable" in r.error
    # a rule whose table has no route falls through to the next rule
    empty = {"priority": 50, "src": "all", "table": "200"}
    assert lookup_policy(PEER, FIP, DEFAULT_RULES + [empty, FIX], TABLES).dev == RAIL
    bh = TABLES + [{"type": "blackhole", "dst": PEER, "table": "100"}]
    assert "blackhole route in table 100" in lookup_policy(PEER, FIP, DEFAULT_RULES + [FIX], bh).error
    assert "no policy rule's table" in lookup_policy("10.1.1.1", FIP, DEFAULT_RULES, TABLES).error


def _fabric_route(capsys, snap: Path) -> dict:
    cli.run(["fabric", "--json", "--no-history", "--snapshot", str(snap), "--fabric-ip", FIP, "--peer", PEER])
    rep = json.loads(capsys.readouterr().out)
    return next(g for g in rep["gates"] if g["id"] == "fabric.route") | {"notes": rep["facts"]["route"]["notes"]}


def test_replay_of_a_host_fixed_with_a_rule(tmp_path, capsys):
    snap = tmp_path / "spark-b"
    shutil.copytree(CASE, snap)
    (snap / "ip-route.json").write_text(json.dumps(TABLES))
    (snap / "ip-rule.json").write_text(json.dumps(DEFAULT_RULES))
    g = _fabric_route(capsys, snap)
    assert g["verdict"] == "FAIL" and f"leaves by {OTHER}" in g["summary"]  # no rule: the break shows
    (snap / "ip-rule.json").write_text(json.dumps(DEFAULT_RULES + [FIX]))
    g = _fabric_route(capsys, snap)
    assert g["verdict"] == "PASS", g["summary"]
    assert g["facts"]["routes"][0]["source"].endswith("rule 100 → table 100")
    (snap / "ip-rule.json").unlink()  # an old capture without rules: main table, and the note says so
    g = _fabric_route(capsys, snap)
    assert g["verdict"] == "FAIL" and any("policy rules not seen" in n for n in g["notes"])


def test_live_readers_give_iproute2_shapes():
    """pyroute2 on this host's own netlink: rules and tables in `ip -j` form, a route to a local address."""
    pytest.importorskip("pyroute2")
    rules = route.netlink_rules()
    assert any(r.get("table") == "main" and r.get("priority") == 32766 for r in rules), rules
    rows = route.netlink_routes()
    assert rows and all({"dst", "table", "type"} <= set(r) for r in rows)
    assert any(r["table"] == "local" and r["type"] == "local" and r["dst"] == "127.0.0.1" for r in rows)
    got = route.netlink_route_get("127.0.0.1", None)
    assert got[0]["dev"] == "lo"
    assert route.netlink_route_get("not-an-ip", None)["error"]


def test_capture_records_the_rules_and_the_replay_uses_them(tmp_path, capsys):
    from afddiag.capture import collect_bundle, write_bundle
    from fakes import case_sources

    src = case_sources(CASE, route=lambda: TABLES, rules=lambda: DEFAULT_RULES + [FIX])
    files, _, _ = collect_bundle(src)
    assert json.loads(files["ip-rule.json"]) == DEFAULT_RULES + [FIX]
    bundle, _ = write_bundle(tmp_path / "host.tar.gz", src)
    g = _fabric_route(capsys, bundle)
    assert g["verdict"] == "PASS", g["summary"]
