"""Fabric gates pinned on facts as the sysfs, QP and route probes record them: every verdict and typed
action of fabric.rdma-present, fabric.link, fabric.mtu, fabric.rocev2-ipv4, fabric.first-device,
fabric.qp-rtr, fabric.route and fabric.arp, the RoCE MTU edge, the ARP sysctl edges, and the
preambles (probe failed, not captured, no device, fabric IP ambiguous)."""

from __future__ import annotations

import pytest

from afddiag.diagnosis import drains
from afddiag.envvars import MAP_VAR
from afddiag.model.fabric import (
    FabricFacts,
    Gid,
    Netdev,
    Port,
    QpFacts,
    QpResult,
    QpStep,
    RdmaDevice,
    RouteFacts,
    RouteResult,
)
from afddiag.playbook import Playbook
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN
from fakes import judge, observation

FE80 = "fe80:0000:0000:0000:0817:58ff:fe65:b049"
RDMA = Playbook(name="expert", requires=["rdma"])


def v4gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def dev(name, index, ip=None, netdev=None, state="ACTIVE", phys="LinkUp", gtype="RoCE v2", gid_index=3):
    gids = [Gid(0, FE80, "RoCE v2", netdev)]
    if ip:
        gids.append(Gid(gid_index, v4gid(ip), gtype, netdev, ip))
    return RdmaDevice(name, index, ports=[Port(1, state, phys, "Ethernet", "200 Gb/sec (2X NDR)", gids)])


def fabric(*devices, netdevs=None, order="netlink (RDMA_NLDEV_CMD_GET)", **kw) -> FabricFacts:
    """Two rails by default: mlx5_0 (enp0, no IPv4) enumerates first; mlx5_1 carries 10.0.0.1 on enp1."""
    devs = list(devices) or [dev("mlx5_0", 0, netdev="enp0"), dev("mlx5_1", 1, "10.0.0.1", "enp1")]
    nds = netdevs if netdevs is not None else {"enp0": Netdev("enp0", 9000, "up"),
                                               "enp1": Netdev("enp1", 9000, "up", ["10.0.0.1/24"])}
    return FabricFacts(devices=devs, netdevs=nds, order_source=order, addresses_source="test", **kw)


def fab(gate_id, f=None, env=None, **kw):
    obs = observation(fabric=f if f is not None else fabric(), env=env if env is not None else {},
                      qp=kw.pop("qp", None), route=kw.pop("route", None))
    return judge(gate_id, obs, **kw)


# ---------------------------------------------------------------- preambles

@pytest.mark.parametrize("gate_id", ["fabric.rdma-present", "fabric.link", "fabric.mtu", "fabric.first-device",
                                     "fabric.arp", "fabric.link-speed"])
def test_a_failed_fabric_probe_is_error(gate_id):
    v = fab(gate_id, FabricFacts(failed="reading /sys/class/infiniband timed out after 10 s"))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert v.summary == "not judged: reading /sys/class/infiniband timed out after 10 s"


def test_fabric_not_captured_or_not_probed():
    v = fab("fabric.mtu", FabricFacts(captured=False, notes=["no sys/ in the snapshot"]))
    assert (v.verdict, v.summary) == (SKIP, "fabric not captured: no sys/ in the snapshot")
    v = fab("fabric.mtu", FabricFacts(captured=False, notes=["fabric: sysfs tree absent"]))
    assert v.summary == "fabric: sysfs tree absent"
    v = judge("fabric.mtu", observation())
    assert (v.verdict, v.summary) == (SKIP, "fabric not probed")


def test_rdma_present_every_verdict():
    v = fab("fabric.rdma-present")
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "2 RDMA device(s) in enumeration order (netlink (RDMA_NLDEV_CMD_GET)): mlx5_0, mlx5_1"
    none = FabricFacts(notes=["no /sys/class/infiniband"])
    v = fab("fabric.rdma-present", none)
    assert (v.verdict, v.action) == (SKIP, "NONE")
    assert v.summary == "no RDMA device on this host (no /sys/class/infiniband)"
    v = fab("fabric.rdma-present", none, playbook=RDMA)
    assert (v.verdict, v.action) == (FAIL, "LOAD_DRIVER") and v.summary.endswith("; role expert requires one")
    v = fab("fabric.rdma-present", FabricFacts(captured=False, notes=["no sys/ in the snapshot"]), playbook=RDMA)
    assert (v.verdict, v.action) == (FAIL, "RERUN") and "the fabric was not looked at" in v.summary
    v = fab("fabric.rdma-present", FabricFacts(captured=False, notes=["no sys/ in the snapshot"]))
    assert (v.verdict, v.summary) == (SKIP, "fabric not captured: no sys/ in the snapshot")


def test_no_device_but_a_named_fabric_ip_or_peer():
    none = FabricFacts(notes=["no /sys/class/infiniband"])
    v = fab("fabric.link", none, fabric_ip="10.0.0.1")
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert v.summary.startswith("fabric IP 10.0.0.1 given, but no RDMA device on this host")
    v = fab("fabric.link", none, peers=["10.0.0.2"])
    assert v.verdict == WARN and v.summary.startswith("peer(s) 10.0.0.2 given")
    v = fab("fabric.link", none, playbook=RDMA)
    assert (v.verdict, v.action) == (FAIL, "LOAD_DRIVER")
    v = fab("fabric.link", none)
    assert (v.verdict, v.summary) == (SKIP, "no RDMA device on this host")


def test_an_ambiguous_fabric_ip_warns_and_no_fabric_ip_skips():
    two = fabric(dev("mlx5_0", 0, "10.0.0.1", "enp0"), dev("mlx5_1", 1, "10.1.0.1", "enp1"),
                 netdevs={"enp0": Netdev("enp0", 9000, "up", ["10.0.0.1/24"]),
                          "enp1": Netdev("enp1", 9000, "up", ["10.1.0.1/24"])})
    v = fab("fabric.mtu", two)
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert v.summary.startswith("fabric IP ambiguous: 2 IPv4 addresses have a RoCE v2 GID")
    v = fab("fabric.mtu", fabric(dev("mlx5_0", 0, netdev="enp0")))
    assert v.verdict == SKIP and v.summary.startswith("no fabric IP")
    v = fab("fabric.mtu", fabric(), fabric_ip="10.9.9.9")
    assert v.verdict == SKIP and v.summary.startswith("fabric IP 10.9.9.9: no port carries it")


# ---------------------------------------------------------------- fabric.link and fabric.mtu

def test_link_every_verdict():
    v = fab("fabric.link")
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "mlx5_1 port 1 (fabric IP 10.0.0.1, enp1): ACTIVE, LinkUp, 200 Gb/sec (2X NDR)"
    v = fab("fabric.link", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", state="DOWN", phys="Disabled")))
    assert (v.verdict, v.action) == (FAIL, "FIX_LINK") and v.summary.endswith("port DOWN, physical Disabled")
    v = fab("fabric.link", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", phys="Polling")))
    assert v.verdict == FAIL
    v = fab("fabric.link", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", phys=None)))
    assert v.verdict == PASS  # physical state not read: the logical state says ACTIVE
    down = {"enp1": Netdev("enp1", 9000, "lowerlayerdown", ["10.0.0.1/24"])}
    v = fab("fabric.link", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1"), netdevs=down))
    assert (v.verdict, v.summary.split(": ")[-1]) == (FAIL, "netdev enp1 is lowerlayerdown")
    unread = fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", state=None))
    v = fab("fabric.link", unread)
    assert (v.verdict, v.action) == (SKIP, "NONE") and "port state not read" in v.summary
    v = fab("fabric.link", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", state=None), netdevs=down))
    assert v.verdict == FAIL  # an unread state but a netdev that is down


def test_link_facts():
    v = fab("fabric.link")
    assert (v.facts["netdev"], v.facts["netdev_operstate"], v.facts["state"]) == ("enp1", "up", "ACTIVE")


@pytest.mark.parametrize("netdev_mtu, verdict", [(4192, PASS), (4191, WARN), (9000, PASS), (1500, WARN)])
def test_mtu_edge(netdev_mtu, verdict):
    f = fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1"),
               netdevs={"enp1": Netdev("enp1", netdev_mtu, "up", ["10.0.0.1/24"])})
    v = fab("fabric.mtu", f)
    assert (v.verdict, v.action) == (verdict, "SET_MTU" if verdict == WARN else "NONE")
    v = fab("fabric.mtu", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1"),
                                 netdevs={"enp1": Netdev("enp1", None, "up", ["10.0.0.1/24"])}))
    assert (v.verdict, v.summary) == (SKIP, "enp1: netdev MTU not read")


# ---------------------------------------------------------------- fabric.rocev2-ipv4

def test_rocev2_ipv4_every_verdict():
    v = fab("fabric.rocev2-ipv4")
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "fabric IP 10.0.0.1: mlx5_1 port 1 GID 3 (RoCE v2, enp1) on an ACTIVE port"
    # the given address is no RoCE address of this host, which has one: the launcher names the wrong one
    v = fab("fabric.rocev2-ipv4", fabric_ip="192.168.1.5")
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary == ("fabric IP 192.168.1.5: no GID carries it (no netdev on this host holds it); this host's "
                         "IPv4 RoCE v2 addresses: 10.0.0.1 (enp1, mlx5_1 GID 3)")
    # only RoCE v1: the HCA's mode
    v1 = fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", gtype="IB/RoCE v1"))
    v = fab("fabric.rocev2-ipv4", v1, fabric_ip="10.0.0.1")
    assert (v.verdict, v.action) == (FAIL, "HW_INSPECTION") and "only as RoCE v1" in v.summary
    v = fab("fabric.rocev2-ipv4", v1)
    assert (v.verdict, v.action) == (FAIL, "HW_INSPECTION") and v.summary.startswith("no IPv4 RoCE v2 GID: only")
    # an unread GID type is no v1
    v = fab("fabric.rocev2-ipv4", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", gtype=None)), fabric_ip="10.0.0.1")
    assert (v.verdict, v.action) == (SKIP, "NONE") and "cannot tell RoCE v2 from v1" in v.summary
    # the port that carries it is down: the link's fault, named by fabric.link
    down = fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1", state="DOWN"))
    v = fab("fabric.rocev2-ipv4", down, fabric_ip="10.0.0.1")
    assert v.verdict == PASS and "(fabric.link judges the link)" in v.summary
    v = fab("fabric.rocev2-ipv4", down)  # the only candidate address is the fabric IP, its port down or not
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary.endswith("its port is DOWN (fabric.link judges the link)")
    # no IPv4-mapped GID at all
    v = fab("fabric.rocev2-ipv4", fabric(dev("mlx5_0", 0, netdev="enp0")))
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS")
    assert v.summary.endswith("no GID on any device is IPv4-mapped (only fe80/IPv6 entries)")


def test_rocev2_ipv4_address_on_a_netdev_no_port_is_bound_to():
    f = fabric(netdevs={"enp0": Netdev("enp0", 9000, "up"), "enp1": Netdev("enp1", 9000, "up", ["10.0.0.1/24"]),
                        "eno1": Netdev("eno1", 1500, "up", ["192.168.1.5/24"])})
    v = fab("fabric.rocev2-ipv4", f, fabric_ip="192.168.1.5")
    assert v.verdict == FAIL and "(it is on netdev eno1, which no RDMA port is bound to)" in v.summary
    # a GID for it whose netdev no longer holds the address
    stray = fabric(dev("mlx5_1", 0, "10.0.0.9", "enp1"), netdevs={"enp1": Netdev("enp1", 9000, "up", ["10.0.0.1/24"])})
    v = fab("fabric.rocev2-ipv4", stray, fabric_ip="10.0.0.9")
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS")
    assert v.summary == "fabric IP 10.0.0.9: GID present (mlx5_1 port 1 GID 3 (RoCE v2, enp1)) but netdev enp1 does " \
                        "not hold the address"


def test_rocev2_ipv4_a_fabric_ip_on_a_host_with_no_roce_address():
    """No IPv4 RoCE v2 GID at all and a fabric IP given: FAIL naming the address (not the wrong-address
    SET_ENV, which needs a RoCE address of this host to point at)."""
    v = fab("fabric.rocev2-ipv4", fabric(dev("mlx5_0", 0, netdev="enp0")), fabric_ip="10.0.0.7")
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS")
    assert v.summary == "fabric IP 10.0.0.7: no GID carries it (no netdev on this host holds it)"


def test_rocev2_ipv4_several_roce_addresses_and_no_fabric_ip_pass():
    nds = {"enp0": Netdev("enp0", 9000, "up", ["10.0.0.1/24"]), "enp1": Netdev("enp1", 9000, "up", ["10.1.0.1/24"])}
    two = fabric(dev("mlx5_0", 0, "10.0.0.1", "enp0"), dev("mlx5_1", 1, "10.1.0.1", "enp1"), netdevs=nds)
    v = fab("fabric.rocev2-ipv4", two)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "IPv4 RoCE v2 GIDs on ACTIVE ports: 10.0.0.1=mlx5_0 (GID 3), 10.1.0.1=mlx5_1 (GID 3)"


# ---------------------------------------------------------------- fabric.first-device

def test_first_device_every_verdict():
    v = fab("fabric.first-device")  # mlx5_0 enumerates first, mlx5_1 carries the fabric IP
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary == (f"mlx5_0 (first enumerated device, {MAP_VAR} not set) does not carry fabric IP 10.0.0.1 "
                         "(fabric IP 10.0.0.1 is on mlx5_1 GID 3)")
    assert v.commands == [f"export {MAP_VAR}=10.0.0.1=mlx5_1"] and "launch file" in v.remedy
    v = fab("fabric.first-device", env={MAP_VAR: "10.0.0.1=mlx5_1"})
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == f"mlx5_1 ({MAP_VAR} names it for 10.0.0.1) carries fabric IP 10.0.0.1"
    v = fab("fabric.first-device", env={MAP_VAR: "10.0.0.1=mlx5_9"})
    assert v.verdict == FAIL and "mlx5_9" in v.summary and "is not an RDMA device on this host" in v.summary
    # the order unknown: never guessed from names
    v = fab("fabric.first-device", fabric(order="name (device index unknown)"))
    assert (v.verdict, v.action) == (WARN, "SET_ENV") and v.summary.startswith("order unknown")
    one = fabric(dev("mlx5_1", None, "10.0.0.1", "enp1"), order="name (device index unknown)")
    v = fab("fabric.first-device", one)
    assert v.verdict == PASS and v.summary.startswith("every RDMA device carries fabric IP 10.0.0.1")


def test_first_device_with_an_ambiguous_fabric_ip():
    nds = {"enp0": Netdev("enp0", 9000, "up", ["10.0.0.1/24"]), "enp1": Netdev("enp1", 9000, "up", ["10.1.0.1/24"])}
    two = fabric(dev("mlx5_0", 0, "10.0.0.1", "enp0"), dev("mlx5_1", 1, "10.1.0.1", "enp1"), netdevs=nds)
    v = fab("fabric.first-device", two)
    assert (v.verdict, v.action) == (WARN, "RERUN") and v.summary.endswith("the engine's device carries 10.0.0.1")
    v = fab("fabric.first-device", two, env={MAP_VAR: "10.0.0.1=mlx5_1,10.1.0.1=mlx5_0"})
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary.startswith("fabric IP ambiguous (10.0.0.1, 10.1.0.1), and the device the engine opens "
                                "carries none")


def test_first_device_ambiguous_fabric_ip_and_a_map_that_misses():
    """Two RoCE addresses, a device map naming the wrong device for one and nothing for the other: with
    the device order unknown the device the engine opens for the unmapped one cannot be told (WARN,
    SET_ENV); with the order known, neither candidate is carried by what the engine opens (FAIL)."""
    nds = {"enp0": Netdev("enp0", 9000, "up", ["10.0.0.1/24"]), "enp1": Netdev("enp1", 9000, "up", ["10.1.0.1/24"])}
    devs = (dev("mlx5_0", 0, "10.0.0.1", "enp0"), dev("mlx5_1", 1, "10.1.0.1", "enp1"))
    wrong = {MAP_VAR: "10.0.0.1=mlx5_1"}
    v = fab("fabric.first-device", fabric(*devs, netdevs=nds, order="name (device index unknown)"), env=wrong)
    assert (v.verdict, v.action) == (WARN, "SET_ENV")
    assert v.summary.endswith("; device order unknown, so the device the engine opens for 10.1.0.1 cannot be told")
    v = fab("fabric.first-device", fabric(*devs, netdevs=nds), env=wrong)
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary.endswith("carries none of them: mlx5_0 (first enumerated device), mlx5_1 (map)")


# ---------------------------------------------------------------- fabric.qp-rtr

def qp(*results, **kw) -> QpFacts:
    return QpFacts(ran=True, results=list(results), **kw)


def walk(reached="RTR", errno=None, target="10.0.0.2", device="mlx5_1", error=None):
    steps = [QpStep("INIT", True)] + ([QpStep("RTR", reached in ("RTR", "RTS"), errno)] if reached != "RESET" else [])
    return QpResult(device, 1, 3, v4gid("10.0.0.1"), "fabric IP", target, steps=steps, reached=reached, errno=errno,
                    error=error)


QPMAP = {MAP_VAR: "10.0.0.1=mlx5_1"}


def test_qp_rtr_every_verdict():
    v = fab("fabric.qp-rtr", env=QPMAP, qp=qp(walk()))
    assert (v.verdict, v.action) == (PASS, "NONE") and "RC QP reached RTR toward 10.0.0.2 from GID index 3" in v.summary
    v = fab("fabric.qp-rtr", env=QPMAP, qp=qp(walk(target="loopback")))
    assert v.verdict == PASS and "loopback only, a weaker test" in v.summary
    v = fab("fabric.qp-rtr", env=QPMAP, qp=qp(walk("INIT", -22)))
    assert (v.verdict, v.action) == (FAIL, "SET_ENV") and "RC QP INIT→RTR toward 10.0.0.2 failed: errno 22" in v.summary
    v = fab("fabric.qp-rtr", env=QPMAP, qp=qp(walk("INIT", 110)))
    assert (v.verdict, v.action) == (FAIL, "FIX_ROUTE")
    assert v.commands == ["ip route get 10.0.0.2 from 10.0.0.1"] and "<" not in v.remedy
    v = fab("fabric.qp-rtr", env=QPMAP, qp=qp(walk("INIT", -95)))
    assert (v.verdict, v.action) == (SKIP, "NONE") and "this device cannot run the RC QP walk" in v.summary
    v = fab("fabric.qp-rtr", env=QPMAP, qp=qp(walk("INIT", None, error="timed out after 5 s")))
    assert (v.verdict, v.action) == (ERROR, "RERUN") and v.summary.startswith("not judged: mlx5_1 QP walk toward")
    v = fab("fabric.qp-rtr", fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1")), env=QPMAP, qp=qp(walk()))
    assert v.verdict == PASS  # one device, the engine's: judged
    v = fab("fabric.qp-rtr", FabricFacts(devices=[], addresses_source="test"), env=QPMAP, qp=qp(walk()))
    assert (v.verdict, v.action, v.summary) == (SKIP, "NONE", "no RDMA device")
    v = fab("fabric.qp-rtr", env=QPMAP, qp=qp(walk(device="mlx5_0")))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert v.summary == "mlx5_1: no QP result for the device the engine opens"
    v = fab("fabric.qp-rtr", env={MAP_VAR: "10.0.0.1=mlx5_7"}, qp=qp(walk()))
    assert v.verdict == FAIL and "is not an RDMA device on this host: the engine cannot open it" in v.summary


def test_qp_rtr_not_run():
    v = fab("fabric.qp-rtr", qp=QpFacts(ran=False, why="pyverbs is not installed"))
    assert (v.verdict, v.summary) == (SKIP, "QP test not run: pyverbs is not installed")
    assert "pyverbs" in v.remedy
    v = fab("fabric.qp-rtr", qp=QpFacts(ran=False, why="--no-qp"))
    assert (v.verdict, v.remedy) == (SKIP, "nothing to do")
    v = fab("fabric.qp-rtr", qp=QpFacts(failed="ibv_open_device timed out"))
    assert (v.verdict, v.action) == (ERROR, "RERUN")


# ---------------------------------------------------------------- fabric.route

def routes(*rs, **kw) -> RouteFacts:
    return RouteFacts(routes=list(rs), routes_captured=True, **kw)


def test_route_every_verdict():
    peers = {"peers": ["10.0.0.2"]}
    v = fab("fabric.route", route=routes(RouteResult("10.0.0.2", "enp1", "10.0.0.1")), **peers)
    assert (v.verdict, v.action) == (PASS, "NONE") and v.summary == "route to 10.0.0.2 leaves by enp1 (mlx5_1 GID 3)"
    v = fab("fabric.route", route=routes(RouteResult("10.0.0.2", "enp1", via="10.0.0.254")), **peers)
    assert v.summary.endswith("; routed: 10.0.0.2 via 10.0.0.254")
    v = fab("fabric.route", route=routes(RouteResult("10.0.0.2", "eno1", via="192.168.1.1")), **peers)
    assert (v.verdict, v.action) == (FAIL, "FIX_ROUTE")
    assert v.summary == ("route to peer 10.0.0.2 leaves by eno1 via 192.168.1.1, not enp1 (the netdev of mlx5_1 GID 3 "
                         "carrying 10.0.0.1)")
    v = fab("fabric.route", route=routes(RouteResult("10.0.0.2", error="Network is unreachable")), **peers)
    assert v.verdict == FAIL and v.summary == "no route to peer 10.0.0.2 from 10.0.0.1: Network is unreachable"
    v = fab("fabric.route", route=routes(RouteResult("10.0.0.2", error="ip timed out", failed=True)), **peers)
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = fab("fabric.route", route=RouteFacts(failed="ip route get timed out"), **peers)
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = fab("fabric.route", route=RouteFacts(notes=["routes not captured in this snapshot"]), **peers)
    assert (v.verdict, v.summary) == (SKIP, "routes not captured in this snapshot")
    v = fab("fabric.route", **peers)
    assert (v.verdict, v.summary) == (SKIP, "routes not captured: route probe not run")
    v = fab("fabric.route")
    assert v.verdict == SKIP and v.summary.startswith("no peer given")


# ---------------------------------------------------------------- a port in the InfiniBand link layer

IB_GUID = "58a2:e103:002c:0bf6"


def infiniband_host(ip="10.0.0.1"):
    """A ConnectX port left in InfiniBand link layer (mlx5_1 port 1: IB GID only, its IPoIB netdev ibp1s0f1 holds
    the fabric IP) beside an Ethernet port without IPv4 (mlx5_0, enp0)."""
    ib = RdmaDevice("mlx5_1", 1, ports=[Port(1, "ACTIVE", "LinkUp", "InfiniBand", "200 Gb/sec (2X NDR)",
                                             [Gid(0, f"fe80:0000:0000:0000:{IB_GUID}", "IB/RoCE v1")])])
    hw = "00:00:10:49:fe:80:00:00:00:00:00:00:" + ":".join(IB_GUID.replace(":", "")[i:i + 2] for i in range(0, 16, 2))
    nds = {"enp0": Netdev("enp0", 9000, "up", link_type="ether"),
           "ibp1s0f1": Netdev("ibp1s0f1", 2044, "up", [f"{ip}/24"], link_type="infiniband", hw_address=hw)}
    return fabric(dev("mlx5_0", 0, netdev="enp0"), ib, netdevs=nds)


def test_a_port_in_infiniband_link_layer_is_named_so_with_the_port_type_as_remedy():
    v = fab("fabric.rocev2-ipv4", infiniband_host(), fabric_ip="10.0.0.1")
    assert (v.verdict, v.action) == (FAIL, "SET_PORT_TYPE")
    assert v.summary == ("fabric IP 10.0.0.1 is on IPoIB netdev ibp1s0f1: mlx5_1 port 1 runs the InfiniBand link "
                         "layer, not Ethernet (RoCE)")
    assert v.commands == ["sudo mlxconfig -d mlx5_1 set LINK_TYPE_P1=2"] and "reboot" in v.remedy
    assert v.remedy.startswith("mlx5_1 port 1: the port runs InfiniBand") and "drain the node" in v.remedy
    assert not v.remedy.startswith("put the fabric IPv4 address")  # moving the address fixes nothing
    assert drains(v.verdict, v.action)  # a firmware setting and a reboot: the node is drained
    assert v.facts["infiniband_ports"] == [{"device": "mlx5_1", "port": 1}]
    # no fabric IP given: the addressed IPoIB netdev is named the same way
    v = fab("fabric.rocev2-ipv4", infiniband_host())
    assert (v.verdict, v.action) == (FAIL, "SET_PORT_TYPE") and "InfiniBand link layer" in v.summary
    # an Ethernet netdev holding an address no GID carries is still an address to move
    eth = infiniband_host()
    eth.netdevs["ibp1s0f1"].link_type = "ether"
    v = fab("fabric.rocev2-ipv4", eth, fabric_ip="10.0.0.1")
    assert v.action == "FIX_ADDRESS" and "InfiniBand" not in v.summary


# ---------------------------------------------------------------- fabric.arp

def arp_fabric():
    nds = {"enp0": Netdev("enp0", 9000, "up", ["10.0.0.1/24"]), "enp1": Netdev("enp1", 9000, "up", ["10.0.0.2/24"])}
    return fabric(dev("mlx5_0", 0, "10.0.0.1", "enp0"), dev("mlx5_1", 1, "10.0.0.2", "enp1"), netdevs=nds)


def sysctls(ai=1, aa=2, rp=2) -> RouteFacts:
    eff = {"arp_ignore": ai, "arp_announce": aa, "rp_filter": rp}
    return RouteFacts(effective={"enp0": eff, "enp1": dict(eff)}, sysctl_captured=True)


@pytest.mark.parametrize("kw, verdict", [
    ({}, PASS), ({"ai": 0}, FAIL), ({"ai": 2}, PASS), ({"aa": 0}, FAIL), ({"aa": 1}, WARN),
    ({"rp": 1}, WARN), ({"rp": 0}, PASS)])
def test_arp_sysctl_edges_on_two_rails_of_one_subnet(kw, verdict):
    v = fab("fabric.arp", arp_fabric(), route=sysctls(**kw), fabric_ip="10.0.0.1")
    assert (v.verdict, v.action) == (verdict, "NONE" if verdict == PASS else "SET_SYSCTL")
    assert v.summary.startswith("several rails on one subnet (enp0 and enp1 on 10.0.0.0/24)")
    # the fix is one sysctl line per shared rail (issue 23: the remedy was a command with <netdev> in it)
    assert v.commands == ([] if verdict == PASS else [
        f"sudo sysctl -w net.ipv4.conf.{n}.arp_ignore=1 net.ipv4.conf.{n}.arp_announce=2 net.ipv4.conf.{n}.rp_filter=2"
        for n in ("enp0", "enp1")])


def two_subnets():
    nds = {"enp0": Netdev("enp0", 9000, "up", ["10.0.1.1/24"]), "enp1": Netdev("enp1", 9000, "up", ["10.0.0.1/24"])}
    return fabric(dev("mlx5_0", 0, "10.0.1.1", "enp0"), dev("mlx5_1", 1, "10.0.0.1", "enp1"), netdevs=nds)


def test_arp_one_rail_per_subnet_and_not_captured():
    v = fab("fabric.arp", two_subnets(), route=sysctls(ai=0), fabric_ip="10.0.0.1")
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary.startswith("one RDMA netdev per subnet (10.0.0.0/24: enp1, 10.0.1.0/24: enp0)")
    v = fab("fabric.arp", two_subnets(), fabric_ip="10.0.0.1")
    assert v.verdict == SKIP and "but not judged: ARP sysctls not captured (route probe not run)" in v.summary
    v = fab("fabric.arp", arp_fabric(), fabric_ip="10.0.0.1")
    assert v.verdict == SKIP and "enp0 and enp1 share 10.0.0.0/24, but the ARP sysctls were not captured" in v.summary
    v = fab("fabric.arp", arp_fabric(), route=RouteFacts(failed="sysctl read timed out"), fabric_ip="10.0.0.1")
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = fab("fabric.arp", fabric(dev("mlx5_0", 0, netdev="enp0")))
    assert v.verdict == SKIP and v.summary.startswith("no IPv4 address on any RDMA netdev")


@pytest.mark.parametrize("route", [None, sysctls(ai=0, aa=0, rp=1), RouteFacts(notes=["ARP sysctls not captured"])])
def test_arp_one_ipv4_rdma_netdev_passes_without_the_sysctls(route):
    """One IPv4 RDMA netdev (a second port without IPv4 beside it): no sibling port on the L2 domain can answer
    ARP for its address, so no flux is possible whatever the sysctls, read or not."""
    v = fab("fabric.arp", route=route)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary.startswith("one IPv4 RDMA netdev (enp1 on 10.0.0.0/24): no sibling RDMA port")


# ---------------------------------------------------------------- fabric.devicemap-env

def dm(env, f=None, **kw):
    return fab("fabric.devicemap-env", f, env=env, **kw)


def test_devicemap_env_map_entries():
    v = dm({MAP_VAR: "10.0.0.1=mlx5_1"})
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == f"{MAP_VAR} points at the fabric IP's device (mlx5_1 GID 3)"
    v = dm({MAP_VAR: "10.0.0.1=mlx5_0"})
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary == f"{MAP_VAR} sends 10.0.0.1 to mlx5_0, which does not carry it as RoCE v2 (should be mlx5_1)"
    assert v.commands == [f"export {MAP_VAR}=10.0.0.1=mlx5_1"] and v.facts["failed_vars"] == [MAP_VAR]
    v = dm({MAP_VAR: "10.0.0.1=mlx5_1,10.0.0.7=mlx5_0"})  # another host's entry: not this host's concern
    assert v.verdict == PASS
    v = dm({MAP_VAR: "10.0.0.1=mlx5_1,bogus"})
    assert v.verdict == FAIL and f"{MAP_VAR}: entry 'bogus' is not ip=device" in v.summary
    # no entry for the fabric IP: the engine falls back to the first device, which does not carry it
    v = dm({MAP_VAR: "10.0.0.7=mlx5_0"})
    assert v.verdict == FAIL
    assert "has no entry for fabric IP 10.0.0.1" in v.summary and "mlx5_0, which does not" in v.summary
    one = fabric(dev("mlx5_1", 0, "10.0.0.1", "enp1"))
    v = dm({MAP_VAR: "10.0.0.7=mlx5_0"}, one)
    assert (v.verdict, v.action) == (WARN, "SET_ENV") and v.summary.endswith("mlx5_1, which carries it")


def test_devicemap_env_nccl_and_gid_index():
    v = dm({"NCCL_IB_HCA": "=mlx5_1:1", "NCCL_IB_GID_INDEX": "3"})
    assert (v.verdict, v.action) == (PASS, "NONE")
    v = dm({"NCCL_IB_HCA": "=mlx5_0:1"})
    assert v.verdict == FAIL
    assert v.summary == "NCCL_IB_HCA==mlx5_0:1 selects mlx5_0:1, not mlx5_1:1 which carries 10.0.0.1"
    v = dm({"NCCL_IB_HCA": "mlx5"})  # a prefix: selects mlx5_0 too, whose port has no IPv4 RoCE v2 GID
    assert v.verdict == FAIL and "also selects ports NCCL cannot use to reach a peer: mlx5_0:1 has no IPv4" in v.summary
    v = dm({"NCCL_IB_GID_INDEX": "0"})
    assert v.verdict == FAIL
    assert v.summary.startswith("NCCL_IB_GID_INDEX=0 on mlx5_1 port 1 is fe80") and "(that is GID index 3)" in v.summary
    v = dm({"MC_GID_INDEX": "x3"})
    assert v.verdict == FAIL and v.summary == "MC_GID_INDEX='x3' is not a GID index"
    v = dm({"UCX_IB_GID_INDEX": "7"})
    assert v.verdict == FAIL and "is an empty slot" in v.summary


def test_devicemap_env_skips_and_warns():
    v = dm({})
    assert (v.verdict, v.action) == (SKIP, "NONE") and v.summary.startswith(f"none of {MAP_VAR}")
    v = judge("fabric.devicemap-env", observation(fabric=fabric(), env=None))
    assert (v.verdict, v.summary) == (SKIP, "launch environment not captured")
    nds = {"enp0": Netdev("enp0", 9000, "up", ["10.0.0.1/24"]), "enp1": Netdev("enp1", 9000, "up", ["10.1.0.1/24"])}
    two = fabric(dev("mlx5_0", 0, "10.0.0.1", "enp0"), dev("mlx5_1", 1, "10.1.0.1", "enp1"), netdevs=nds)
    v = dm({"NCCL_IB_GID_INDEX": "3"}, two)
    assert (v.verdict, v.action) == (WARN, "SET_ENV")
    assert v.summary == "NCCL_IB_GID_INDEX set but the fabric IP is ambiguous: give --fabric-ip"
    v = dm({MAP_VAR: "10.0.0.1=mlx5_0,10.1.0.1=mlx5_1"}, two)
    assert v.verdict == PASS and "(no fabric IP decided" in v.summary
    v = dm({"NCCL_IB_GID_INDEX": "3"}, fabric_ip="10.9.9.9")
    assert v.verdict == SKIP and v.summary == "NCCL_IB_GID_INDEX not judged: fabric IP 10.9.9.9 has no RoCE v2 GID " \
                                              "(fabric.rocev2-ipv4)"


# ---------------------------------------------------------------- fabric.mem-registration

def memreg(*devices, pb=None, **kw):
    from afddiag.model.fabric import MemRegFacts

    return judge("fabric.mem-registration", observation(memreg=MemRegFacts(devices=list(devices), **kw)), playbook=pb)


OK = {"ok": True}


def test_mem_registration_every_verdict():
    v = memreg({"name": "mlx5_0", "host_mr": OK, "gpu_mr": OK})
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == ("mlx5_0: host memory yes; GPU memory yes (nvidia-peermem); role generic does not say which "
                         "memory its engine registers")
    v = memreg({"name": "mlx5_0", "host_mr": OK, "gpu_mr": {"ok": False, "errno": 14}},
               pb=Playbook(name="expert", engine_registers="gpu"))
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert "GPU memory no (GPU pointer registration on mlx5_0: errno 14" in v.summary
    assert "(nvidia_peermem not loaded)" in v.summary
    v = memreg({"name": "mlx5_0", "host_mr": OK, "dmabuf_mr": OK}, pb=Playbook(name="expert", engine_registers="gpu"))
    assert v.verdict == PASS and "GPU memory yes (dma-buf)" in v.summary
    v = memreg({"name": "mlx5_0", "host_mr": {"ok": False, "errno": 12}}, memlock_soft_bytes=64 * 2**20)
    assert (v.verdict, v.action) == (FAIL, "RAISE_LIMIT")
    v = memreg({"name": "mlx5_0", "host_mr": {"ok": False, "errno": 12}}, memlock_soft_bytes=-1)
    assert (v.verdict, v.action) == (FAIL, "LOAD_DRIVER")
    v = memreg({"name": "mlx5_0", "open_error": {"errno": 13, "error": "EACCES"}})
    assert (v.verdict, v.action) == (FAIL, "LOAD_DRIVER")
    assert "cannot register host memory (mlx5_0: errno 13" in v.summary


def test_mem_registration_pinned_count_and_the_cma_signature():
    short = {"name": "mlx5_0", "host_mr": OK, "host_mr_count": {"registered": 100, "wanted": 512, "errno": 12}}
    v = memreg(short, memlock_soft_bytes=-1)
    assert (v.verdict, v.action) == (WARN, "STOP_PROCESSES") and "only 100 of 512 x 1 MiB held at once" in v.summary
    v = memreg(short, memlock_soft_bytes=511 * 2**20)  # the limit stopped the count: launch.memlock's
    assert v.verdict == PASS and "the count stopped at RLIMIT_MEMLOCK 511 MiB" in v.summary
    v = memreg(short, memlock_soft_bytes=512 * 2**20)
    assert v.verdict == WARN
    cma = {"cma_total_kb": 100, "cma_free_kb": 101, "kho_off": False, "kernel_release": "6.11.0-nvidia"}
    v = memreg(short, memlock_soft_bytes=-1, **cma)
    assert (v.verdict, v.action) == (FAIL, "REBOOT") and "Spark registration-bug signature: CmaFree 101 kB" in v.summary
    v = memreg({"name": "mlx5_0", "host_mr": OK}, **cma)
    assert (v.verdict, v.action) == (WARN, "REBOOT")
    assert memreg({"name": "mlx5_0", "host_mr": OK}, **{**cma, "cma_free_kb": 100}).verdict == PASS
    assert memreg({"name": "mlx5_0", "host_mr": OK}, **{**cma, "kho_off": True}).verdict == PASS


def test_mem_registration_skips():
    v = memreg(verbs_why="pyverbs is not installed")
    assert (v.verdict, v.summary) == (SKIP, "no registration tried: pyverbs is not installed")
    v = judge("fabric.mem-registration", observation())
    assert (v.verdict, v.summary) == (SKIP, "memory registration (--no-qp skips it) not probed")
