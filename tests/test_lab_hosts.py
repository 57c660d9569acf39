"""The multi-host soft-RoCE lab on the trixie-backports kernel (lab/scenario-hosts.py; one boot for the
module): three namespace hosts (a coordinator and two dual-rail Sparks) with their own veths, addresses,
rxe devices and sshd. The incident with traffic, the pair test across namespaces with real data on both
rails, and ``afddiag fleet`` over SSH to all three with faults between runs (fleet.control-plane on real
TCP connects between the namespaces among them).

Needs lab/setup.sh to have run (as root); outside CI a missing lab skips, under CI it fails.
"""

from __future__ import annotations

import json
import sys

import pytest

import labboot

pytestmark = pytest.mark.lab

SIZES = [64, 512, 1024, 4096, 65536]
HOSTS = ["coord", "spark-a", "spark-b"]
RAILS = {"coord": {"10.9.0.10": "rxco0"}, "spark-a": {"10.9.0.11": "rxsa0", "10.9.1.11": "rxsa1"},
         "spark-b": {"10.9.0.12": "rxsb0", "10.9.1.12": "rxsb1"}}  # each host's addresses and their rxe


@pytest.fixture(scope="module")
def hostlab(tmp_path_factory) -> dict:
    # 11.5-15 min in the guest on a loaded 2-core machine (three fleet runs of 145-190 s each)
    r = labboot.boot(tmp_path_factory, "hostlab", "scenario-hosts.py", kernel="bpo", timeout_s=1500)
    assert r["ready"]["ready"], r["ready"]
    print(f"\nhost lab: kernel {r['kernel']}, boot {r['boot_s']} s, in guest {r['elapsed_s']} s, "
          f"timings {json.dumps(r['timings'])}", file=sys.stderr)
    return r


def _gates(sc: dict) -> dict:
    assert sc.get("exception") is None, sc.get("exception")
    assert isinstance(sc.get("json"), dict), (sc.get("stdout"), sc.get("stderr"))
    return {g["id"]: g for g in sc["json"]["gates"]}


def test_booted_the_backports_kernel_with_five_rxe_devices(hostlab):
    kv = dict(line.split("=", 1) for line in (labboot.CACHE / "kernel.env").read_text().splitlines() if "=" in line)
    assert hostlab["kernel"] == kv["LAB_KVER_BPO"] != kv["LAB_KVER"]
    devs = sorted(hostlab["captures"]["rdma_dev"], key=lambda d: d["ifindex"])
    assert [d["ifname"] for d in devs] == ["rxsa1", "rxco0", "rxsa0", "rxsb0", "rxsb1"]
    assert "netns shared" in hostlab["captures"]["rdma_system"]


def test_incident_first_device_is_the_other_rail(hostlab):
    """spark-a without the map: the engine opens rxsa1 (index 0, rail 1), not rxsa0 (the fabric IP's)."""
    sc = hostlab["scenarios"]["incident-no-map"]
    g = _gates(sc)
    assert sc["rc"] == 2
    fd = g["fabric.first-device"]
    assert fd["verdict"] == "FAIL" and "rxsa1" in fd["summary"], fd
    assert "rxsa0" in json.dumps(fd), fd
    # the root is named once: the QP gate defers to fabric.first-device; the QP walk's facts show why
    rtr = g["fabric.qp-rtr"]
    assert rtr["verdict"] == "SKIP" and rtr["summary"].startswith("not judged: fabric.first-device failed"), rtr
    walk = {x["device"]: x for x in sc["json"]["facts"]["qp"]["results"]}
    assert (walk["rxsa1"]["reached"], walk["rxsa1"]["errno"]) == ("INIT", 22)  # RTR refused: EINVAL
    assert walk["rxsa1"]["sgid_choice"] == "first RoCE v2 GID (fallback)"  # link-local source GID
    assert walk["rxsa0"]["reached"] == "RTS" and walk["rxsa0"]["sgid_choice"] == "fabric IP"
    assert sc["json"]["host"] == "spark-a"  # its own UTS namespace


def test_incident_map_passes_and_the_mapped_device_moves_data(hostlab):
    g = _gates(hostlab["scenarios"]["incident-map"])
    assert g["fabric.first-device"]["verdict"] == "PASS", g["fabric.first-device"]
    assert g["fabric.qp-rtr"]["verdict"] == "PASS", g["fabric.qp-rtr"]
    assert "rxsa0" in json.dumps(g["fabric.qp-rtr"])
    c = hostlab["scenarios"]["pair-client"]["json"]
    assert c["device"] == "rxsa0" and c["error"] is None


def _pair_ok(hostlab: dict, tag: str, client_dev: str, server_dev: str, client_ip: str, server_ip: str) -> dict:
    cs, ss = hostlab["scenarios"][f"{tag}-client"], hostlab["scenarios"][f"{tag}-server"]
    for sc in (cs, ss):
        assert sc.get("exception") is None, sc
        assert sc["rc"] == 0 and sc["child_exit"] == 0, sc
    c, s = cs["json"], ss["json"]
    assert c["error"] is None and s["error"] is None, (c, s)
    assert (c["device"], c["fabric_ip"], s["device"], s["fabric_ip"]) == (client_dev, client_ip, server_dev, server_ip)
    assert c["peer_qp_num"] == s["qp_num"] and s["peer_qp_num"] == c["qp_num"]
    assert c["path_mtu"] == s["path_mtu"] == 1024  # 1500-byte veths
    assert [(p["op"], p["size"]) for p in c["phases"]] == [(op, sz) for sz in SIZES for op in ("send", "write")]
    for p in c["phases"]:
        assert p["verified"], p
        assert 0 < p["rtt_us_min"] <= p["rtt_us_median"] and p["bw_gbps"] > 0, p
    assert max(p["size"] for p in c["phases"]) > 4 * c["path_mtu"]  # multi-packet messages moved
    assert c["destroyed"] and s["destroyed"]
    print(f"\n{tag}: {client_dev} -> {server_dev}\n" + "\n".join(
        f"  {p['op']:<5} {p['size']:>6} B  rtt median {p['rtt_us_median']} µs  bw {p['bw_gbps']} GB/s"
        for p in c["phases"]), file=sys.stderr)
    return c


def _payload_bytes(c: dict) -> int:
    """Bytes the client sent at least once: every ping-pong message and every streamed message."""
    return sum(p["size"] * (p["iters"] + p["bw_count"]) for p in c["phases"])


def _check_counters(hostlab: dict, tag: str, client_dev: str, server_dev: str, c: dict) -> None:
    d = hostlab["counters"][tag]["delta"]
    sent, rcvd = d[client_dev], d[server_dev]
    assert sent["sent_bytes"] >= _payload_bytes(c), (sent, _payload_bytes(c))
    assert 0 < rcvd["rcvd_pkts"] <= sent["sent_pkts"], (sent, rcvd)
    assert rcvd["rcvd_bytes"] <= sent["sent_bytes"]
    # the reverse direction (echoes, ACKs) too
    assert 0 < sent["rcvd_pkts"] <= rcvd["sent_pkts"]
    others = set(d) - {client_dev, server_dev}
    assert all(d[o].get("sent_pkts", 0) == 0 and d[o].get("rcvd_pkts", 0) == 0 for o in others), d
    print(f"{tag} hw_counters deltas: {client_dev} {sent}\n  {server_dev} {rcvd}", file=sys.stderr)


def test_pair_across_namespaces_rail0(hostlab):
    c = _pair_ok(hostlab, "pair", "rxsa0", "rxco0", "10.9.0.11", "10.9.0.10")
    _check_counters(hostlab, "pair", "rxsa0", "rxco0", c)


def test_pair_across_namespaces_rail1(hostlab):
    c = _pair_ok(hostlab, "pair-rail1", "rxsa1", "rxsb1", "10.9.1.11", "10.9.1.12")
    _check_counters(hostlab, "pair-rail1", "rxsa1", "rxsb1", c)


def _fleet(hostlab: dict, name: str) -> dict:
    sc = hostlab["scenarios"][name]
    assert sc.get("exception") is None, sc.get("exception")
    fr = sc["json"]
    assert isinstance(fr, dict), (sc.get("stdout"), sc.get("stderr"))
    assert [h["name"] for h in fr["hosts"]] == HOSTS
    assert all(h["status"] == "ok" for h in fr["hosts"]), [(h["name"], h["error"]) for h in fr["hosts"]]
    return fr


def _fgate(fr: dict, gid: str) -> dict:
    return next(g for g in fr["gates"] if g["id"] == gid)


def test_fleet_over_ssh_reaches_every_namespace_host(hostlab):
    fr = _fleet(hostlab, "fleet-link-down")
    for h in HOSTS:
        rep = fr["reports"][h]
        assert rep["inputs"]["fabric_ip"] == {"coord": "10.9.0.10", "spark-a": "10.9.0.11", "spark-b": "10.9.0.12"}[h]
        assert rep["inputs"]["launch_env"].endswith(f"{h}.env")
        assert rep["device_map"] == RAILS[h]  # its own addresses only, though all five devices are visible
        # the host's own namespace: its netdevs, not the others'
        assert set(rep["facts"]["fabric"].get("netdevs") or {}) >= {"m0", "f0"}
    assert fr["reports"]["coord"]["inputs"]["role"] == "coordinator"


def test_fleet_faults_undone_cross_host_gates_pass(hostlab):
    """The last run, faults undone: the cross-host gates agree on real facts (spark-b's link aside)."""
    fr = _fleet(hostlab, "fleet-link-down")
    for gid in ("fleet.capacity", "fleet.fabric-ip", "fleet.mtu", "fleet.devicemap", "fleet.versions"):
        assert _fgate(fr, gid)["verdict"] == "PASS", _fgate(fr, gid)
    assert _fgate(fr, "fleet.mtu")["facts"]["roce_mtu"] == {h: 1024 for h in HOSTS}
    assert _fgate(fr, "fleet.fabric-ip")["facts"]["fabric_ips"] == {"coord": "10.9.0.10", "spark-a": "10.9.0.11",
                                                                   "spark-b": "10.9.0.12"}


def test_fleet_faults_each_named(hostlab):
    fr = _fleet(hostlab, "fleet-faults")
    assert fr["exit_code"] == 2
    mtu = _fgate(fr, "fleet.mtu")
    assert mtu["verdict"] == "FAIL" and mtu["summary"].startswith("spark-a RoCE MTU 4096 (f0 MTU 9000)"), mtu
    assert mtu["facts"]["roce_mtu"] == {"coord": 1024, "spark-a": 4096, "spark-b": 1024}
    cap = _fgate(fr, "fleet.capacity")
    assert cap["verdict"] == "FAIL" and cap["summary"].startswith("spark-b AFD_EXPERT_CAPACITY=128"), cap
    assert cap["facts"]["flags"]["spark-a"]["value"] == 256
    dm = _fgate(fr, "fleet.devicemap")
    assert dm["verdict"] == "FAIL" and dm["summary"].startswith("spark-b"), dm
    assert dm["facts"]["maps"]["spark-b"] == "10.9.0.11=rxsa0"
    sb = {g["id"]: g for g in fr["reports"]["spark-b"]["gates"]}
    assert sb["fabric.devicemap-env"]["summary"].startswith(
        "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP sends 10.9.0.11 to rxsa0"), sb["fabric.devicemap-env"]
    # no entry for its own 10.9.0.12: the engine falls back to the first device, spark-a's rail-1 rxsa1
    assert sb["fabric.first-device"]["verdict"] == "FAIL" and sb["fabric.first-device"]["summary"].startswith(
        "rxsa1 (first enumerated device"), sb["fabric.first-device"]
    assert sb["fabric.qp-rtr"]["summary"].startswith("not judged: fabric.first-device failed"), sb["fabric.qp-rtr"]
    walk = {x["device"]: x for x in fr["reports"]["spark-b"]["facts"]["qp"]["results"]}
    assert (walk["rxsa1"]["reached"], walk["rxsa1"]["errno"]) == ("INIT", 22)
    rows = {h["name"]: h for h in fr["hosts"]}
    assert "fabric.first-device" not in rows["spark-a"]["failing"] + rows["coord"]["failing"]


def test_fleet_link_down_on_one_peer(hostlab):
    fr = _fleet(hostlab, "fleet-link-down")
    assert fr["exit_code"] == 2
    rows = {h["name"]: h for h in fr["hosts"]}
    assert rows["spark-b"]["exit_code"] == 2 and rows["spark-b"]["failing"], rows["spark-b"]
    sb = {g["id"]: g for g in fr["reports"]["spark-b"]["gates"]}
    link = sb["fabric.link"]
    assert link["verdict"] == "FAIL", link
    assert link["summary"].startswith("rxsb0 port 1 (fabric IP 10.9.0.12, f0): port DOWN"), link
    # the route the down link removed is the link's fault: not judged, pointing at fabric.link
    route = sb["fabric.route"]
    assert route["verdict"] == "SKIP" and route["summary"].startswith("not judged: fabric.link failed"), route
    assert "unreachable" in route["facts"]["judged_alone"]["summary"], route
    for other in ("coord", "spark-a"):
        assert "fabric.link" not in rows[other]["failing"], rows[other]
    # the link is the root, named once: spark-b's map is still right, its QP gate defers to fabric.link
    assert sb["fabric.devicemap-env"]["verdict"] == "PASS", sb["fabric.devicemap-env"]
    assert sb["fabric.qp-rtr"]["summary"].startswith("not judged: fabric.link failed"), sb["fabric.qp-rtr"]
    # Recorded, not judged here: the coordinator's QP toward spark-b (its neighbour entry for 10.9.0.12 may
    # still resolve while spark-b's link is down).
    coord_rtr = next(g for g in fr["reports"]["coord"]["gates"] if g["id"] == "fabric.qp-rtr")
    print(f"\nlink down: coord fabric.qp-rtr {coord_rtr['verdict']}: {coord_rtr['summary']}", file=sys.stderr)


def test_fleet_control_plane_names_the_asymmetric_pair(hostlab):
    """Real TCP connects across the namespaces: spark-b drops what it sends from the engine port (an ip rule
    blackholes sport 29500, so its RST never leaves, as behind a firewall dropping inbound connects): coord's
    connect to spark-b times out while spark-b's to coord is refused (answered). Each host alone sees half of
    it; the fleet names the pair asymmetric and the side that drops."""
    fr = _fleet(hostlab, "fleet-faults")
    cp = _fgate(fr, "fleet.control-plane")
    assert cp["verdict"] == "FAIL" and cp["action"] == "OPEN_PORTS", cp
    assert cp["facts"]["matrix"] == {"coord": {"spark-a": {"29500": "refused"}, "spark-b": {"29500": "timeout"}},
                                     "spark-a": {"coord": {"29500": "refused"}},
                                     "spark-b": {"coord": {"29500": "refused"}}}, cp["facts"]["matrix"]
    assert cp["summary"].startswith("asymmetric: spark-b reaches coord, but coord cannot reach spark-b (10.9.0.12) "
                                    "port 29500 timeout: spark-b's side drops incoming connections"), cp
    assert cp["remedy"].startswith("on spark-b, open port(s) 29500 to coord's fabric address 10.9.0.10"), cp
    assert cp["facts"]["not_tested"] == {} and cp["facts"]["hosts_not_judged"] == []
    per_host = {h: next(g for g in fr["reports"][h]["gates"] if g["id"] == "launch.control-plane") for h in HOSTS}
    assert per_host["coord"]["verdict"] == "FAIL" and "10.9.0.12:29500 timeout" in per_host["coord"]["summary"]
    assert per_host["spark-b"]["verdict"] == "PASS", per_host["spark-b"]  # spark-b alone sees nothing wrong


def test_fleet_control_plane_link_down_fails_both_ways(hostlab):
    """The drop undone, spark-b's f0 down: neither side reaches the other (no asymmetry to name);
    spark-a still answers the coordinator."""
    fr = _fleet(hostlab, "fleet-link-down")
    cp = _fgate(fr, "fleet.control-plane")
    m = cp["facts"]["matrix"]
    assert cp["verdict"] == "FAIL" and cp["facts"]["asymmetric"] == [], cp
    assert m["coord"]["spark-a"] == {"29500": "refused"} and m["spark-a"]["coord"] == {"29500": "refused"}, m
    assert m["coord"]["spark-b"]["29500"] in ("timeout", "unreachable"), m
    assert m["spark-b"]["coord"]["29500"] in ("timeout", "unreachable"), m
    assert "coord cannot reach spark-b" in cp["summary"] and "spark-b cannot reach coord" in cp["summary"], cp
    # spark-b's own fabric.link FAILs: that is the root, not a firewall (no ufw advice)
    assert cp["action"] == "FIX_LINK" and cp["remedy"].startswith("fix the fabric link first on spark-b"), cp
    assert "ufw" not in cp["remedy"], cp


def test_nothing_left_behind(hostlab):
    caps = hostlab["captures"]
    rows = caps["resource_qp_after_runs"]
    assert isinstance(rows, list), rows
    assert [x for x in rows if x.get("comm") != "ib_core"] == []
    assert all(d["ctx"] == 0 for d in caps["resource_after_runs"]), caps["resource_after_runs"]
    assert caps["rdma_dev_after_cleanup"] == []
