"""fabric.route and fabric.arp on snapshots (case 02 plus captured routes and ARP sysctls), and the
route probe's own parsing (afddiag/probes/route.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from afddiag import cli
from afddiag.probes.route import lookup_table, read_sysctls, route_from_get_json
from conftest import CASES

CASE = CASES / "fabric" / "02-spark-map-set-healthy"
FIP = "192.168.100.11"  # on enp1s0f1np1 = rocep1s0f1 GID 3
OTHER_RAIL = "enP2p1s0f1np1"


@pytest.fixture
def snap(tmp_path) -> Path:
    d = tmp_path / "spark-b"
    shutil.copytree(CASE, d)
    return d


def _gates(capsys, snap: Path, *peers: str) -> dict:
    args = ["fabric", "--json", "--snapshot", str(snap), "--fabric-ip", FIP]
    for p in peers:
        args += ["--peer", p]
    cli.run(args)
    rep = json.loads(capsys.readouterr().out)
    return {g["id"]: g for g in rep["gates"]} | {"_facts": rep["facts"]}


def _sysctl(snap: Path, values: dict[str, dict[str, int]]) -> None:
    for nd, kv in values.items():
        d = snap / "proc/sys/net/ipv4/conf" / nd
        d.mkdir(parents=True, exist_ok=True)
        for k, v in kv.items():
            (d / k).write_text(f"{v}\n")


def test_route_get_capture_right_and_wrong_rail(snap, capsys):
    (snap / "ip-route-get.json").write_text(json.dumps({
        "192.168.100.10": [{"dst": "192.168.100.10", "from": FIP, "dev": "enp1s0f1np1", "prefsrc": FIP}],
        "192.168.100.20": [{"dst": "192.168.100.20", "from": FIP, "dev": OTHER_RAIL, "prefsrc": "192.168.101.11"}],
    }))
    g = _gates(capsys, snap, "192.168.100.10")
    assert g["fabric.route"]["verdict"] == "PASS", g["fabric.route"]
    assert "leaves by enp1s0f1np1 (rocep1s0f1 GID 3)" in g["fabric.route"]["summary"]
    g = _gates(capsys, snap, "192.168.100.10", "192.168.100.20")
    r = g["fabric.route"]
    assert r["verdict"] == "FAIL"
    assert r["summary"] == (f"route to peer 192.168.100.20 leaves by {OTHER_RAIL}, not enp1s0f1np1 (the netdev of "
                            f"rocep1s0f1 GID 3 carrying {FIP})")
    assert "enp1s0f1np1" in r["remedy"] and "{netdev}" not in r["remedy"]


def test_route_from_table_longest_prefix_and_unreachable(snap, capsys):
    (snap / "ip-route.json").write_text(json.dumps([
        {"dst": "192.168.100.0/24", "dev": "enp1s0f1np1", "prefsrc": FIP, "protocol": "kernel", "scope": "link"},
        {"dst": "192.168.100.128/25", "dev": OTHER_RAIL, "metric": 10},
        {"dst": "192.168.101.0/24", "dev": OTHER_RAIL, "prefsrc": "192.168.101.11"},
        {"type": "blackhole", "dst": "10.0.0.0/8"},
    ]))
    g = _gates(capsys, snap, "192.168.100.10", "192.168.100.200", "10.1.1.1")
    r = g["fabric.route"]
    assert r["verdict"] == "FAIL"
    assert f"route to peer 192.168.100.200 leaves by {OTHER_RAIL}" in r["summary"]
    assert "no route to peer 10.1.1.1 from 192.168.100.11: Network is unreachable" in r["summary"]
    assert "192.168.100.10 " not in r["summary"]
    assert [x["dev"] for x in r["facts"]["routes"]] == ["enp1s0f1np1", OTHER_RAIL, None]


def test_route_skips_without_peer_or_capture(snap, capsys):
    g = _gates(capsys, snap)
    assert g["fabric.route"]["verdict"] == "SKIP" and "no peer given" in g["fabric.route"]["summary"]
    g = _gates(capsys, snap, "192.168.100.10")
    r = g["fabric.route"]
    assert r["verdict"] == "SKIP" and r["summary"].count("routes not captured") == 1, r
    assert "ARP sysctls" not in r["summary"]  # fabric.arp's concern, not the route's


def _two_rails_one_subnet(snap: Path) -> None:
    addrs = json.loads((snap / "ip-addr.json").read_text())
    for x in addrs:
        for a in x["addr_info"]:
            if a["local"] == "192.168.101.11":
                a["local"] = "192.168.100.21"
    (snap / "ip-addr.json").write_text(json.dumps(addrs))


def test_arp_one_rail_per_subnet_passes_only_with_its_sysctls_read(snap, capsys):
    a = _gates(capsys, snap)["fabric.arp"]  # case 02 holds no proc/sys: the catalog says SKIP, not PASS
    assert a["verdict"] == "SKIP" and "ARP sysctls not captured" in a["summary"], a
    _sysctl(snap, {"all": {"arp_ignore": 0, "arp_announce": 0, "rp_filter": 0}})
    g = _gates(capsys, snap)
    assert g["fabric.arp"]["verdict"] == "PASS" and "one RDMA netdev per subnet" in g["fabric.arp"]["summary"]


def test_arp_two_rails_one_subnet(snap, capsys):
    _two_rails_one_subnet(snap)
    g = _gates(capsys, snap)
    assert g["fabric.arp"]["verdict"] == "SKIP" and "not captured" in g["fabric.arp"]["summary"]
    base = {"arp_ignore": 0, "arp_announce": 0, "rp_filter": 0}
    _sysctl(snap, {"all": base, "enp1s0f1np1": base, OTHER_RAIL: base})
    a = _gates(capsys, snap)["fabric.arp"]
    assert a["verdict"] == "FAIL"
    assert a["summary"].startswith(f"several rails on one subnet ({OTHER_RAIL} and enp1s0f1np1 on 192.168.100.0/24): "
                                   f"{OTHER_RAIL} (192.168.100.0/24): arp_ignore 0")
    # "all" raises every interface's effective value (max of all and the interface)
    _sysctl(snap, {"all": {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 1}})
    a = _gates(capsys, snap)["fabric.arp"]
    assert a["verdict"] == "WARN" and "rp_filter 1 (strict)" in a["summary"]
    _sysctl(snap, {"all": {"rp_filter": 0}, "enp1s0f1np1": {"rp_filter": 2}, OTHER_RAIL: {"rp_filter": 2}})
    a = _gates(capsys, snap)["fabric.arp"]
    assert a["verdict"] == "PASS", a
    assert a["facts"]["effective"]["enp1s0f1np1"] == {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 2}


def test_probe_parsers():
    r = route_from_get_json("10.0.0.1", [{"dst": "10.0.0.1", "gateway": "10.0.0.254", "dev": "eth1",
                                          "prefsrc": "10.0.0.2"}], "x")
    assert (r.dev, r.via, r.src, r.error) == ("eth1", "10.0.0.254", "10.0.0.2", None)
    assert route_from_get_json("10.0.0.1", [], "x").error
    t = [{"dst": "default", "gateway": "1.1.1.1", "dev": "eth0", "metric": 100},
         {"dst": "default", "gateway": "1.1.1.2", "dev": "eth9", "metric": 50}]
    assert lookup_table("8.8.8.8", t).dev == "eth9"  # lower metric wins a tie on prefix length
    # `ip -j route show table all`: local/broadcast rows and policy tables are not the main lookup
    t += [{"type": "local", "dst": "8.8.8.8", "dev": "lo", "table": "local"},
          {"dst": "8.8.8.0/24", "dev": "eth5", "table": "101"}]
    assert lookup_table("8.8.8.8", t).dev == "eth9"


def test_live_route_probe_on_loopback(tmp_path):
    """The registry's route probe read live: ``ip route get`` to a loopback peer and lo's ARP sysctls."""
    from afddiag.collect import Progress
    from afddiag.model.fabric import FabricFacts, Gid, Port, RdmaDevice
    from afddiag.model.run import Inputs, Observation
    from afddiag.probes import registry, route

    lo = Gid(index=0, gid="::ffff:127.0.0.1", type="RoCE v2", netdev="lo", ipv4="127.0.0.1")
    fab = FabricFacts(devices=[RdmaDevice("x", ports=[Port(1, gids=[lo])])])
    obs = Observation(host="h", source="live", fabric=fab)
    run = registry.Run(Inputs(peers=["127.0.0.1"]), obs, host=registry.Sources.live())
    f = route.PROBE.facts(run, route.PROBE.read(run, Progress()), Progress())["route"]
    assert f.routes_captured and f.routes[0].dev == "lo" and f.routes[0].error is None
    assert f.sysctl_captured and set(f.effective["lo"]) == {"arp_ignore", "arp_announce", "rp_filter"}
    conf, eff = read_sysctls(str(tmp_path), ["x"])
    assert conf["x"]["arp_ignore"] is None and eff["x"]["arp_ignore"] is None
