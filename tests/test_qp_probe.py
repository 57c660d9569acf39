"""QP probe: the parts that run without RDMA hardware.

- no pyverbs → ``ran=False`` with the install hint;
- source GID / port choice against FabricFacts built from the shared fabric cases (dataclasses
  filled directly from the snapshot files, independent of the sysfs probe);
- errno decoding;
- the walk itself against a fake pyverbs: step order, masks, errno capture, destroy order, timeout.
The real walk on soft-RoCE is tests/test_lab.py.
"""

from __future__ import annotations

import errno
import json
import sys
import threading
import types
from pathlib import Path

import pytest

from afddiag.endpoint import SGID_FABRIC_IP, SGID_FALLBACK, choose_port, choose_sgid
from afddiag.model import ROCE_V1, ROCE_V2
from afddiag.model.fabric import (
    FabricFacts,
    Gid,
    Netdev,
    Port,
    RdmaDevice,
    gid_for_ipv4,
    ipv4_from_gid,
    is_empty_gid,
)
from afddiag.probes import qp as qpmod
from afddiag.probes.qp import (
    NO_PYVERBS_WHY,
    decode_errno,
    destination_gid,
    mtu_enum_to_bytes,
    probe_qp,
)
from conftest import case_dirs, load_case

# ---------------------------------------------------------------- FabricFacts from a case snapshot


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except OSError:
        return None


def fabric_from_case(case: Path) -> FabricFacts:
    """Build FabricFacts straight from a case's snapshot files (rdma-dev.json order, sysfs, ip-addr)."""
    ib = case / "sys" / "class" / "infiniband"
    order = json.loads((case / "rdma-dev.json").read_text()) if (case / "rdma-dev.json").exists() else []
    names = [d["ifname"] for d in sorted(order, key=lambda d: d["ifindex"])]
    names += sorted(n.name for n in ib.iterdir() if n.name not in names) if ib.is_dir() else []
    idx = {d["ifname"]: d["ifindex"] for d in order}
    facts = FabricFacts(order_source="rdma-dev.json")
    for name in names:
        dev = RdmaDevice(name=name, index=idx.get(name))
        pdir = ib / name / "ports"
        for pn in sorted(int(p.name) for p in pdir.iterdir()) if pdir.is_dir() else []:
            base = pdir / str(pn)
            state = _read(base / "state")
            port = Port(num=pn, state=state.split(": ", 1)[-1] if state else None)
            gdir = base / "gids"
            slots = sorted(int(g.name) for g in gdir.iterdir()) if gdir.is_dir() else []
            port.gid_slots = len(slots)
            for i in slots:
                g = _read(gdir / str(i)) or ""
                if is_empty_gid(g):
                    continue
                port.gids.append(Gid(index=i, gid=g, type=_read(base / "gid_attrs" / "types" / str(i)),
                                     netdev=_read(base / "gid_attrs" / "ndevs" / str(i)),
                                     ipv4=ipv4_from_gid(g)))
            dev.ports.append(port)
        facts.devices.append(dev)
    ipj = case / "ip-addr.json"
    for nd in json.loads(ipj.read_text()) if ipj.exists() else []:
        facts.netdevs[nd["ifname"]] = Netdev(
            name=nd["ifname"], mtu=nd.get("mtu"),
            ipv4=[f"{a['local']}/{a['prefixlen']}" for a in nd.get("addr_info", []) if a.get("family") == "inet"],
        )
    return facts


FABRIC_CASES = case_dirs("fabric")


@pytest.mark.parametrize("case", FABRIC_CASES, ids=lambda p: p.name)
def test_sgid_is_the_fabric_ip_rocev2_gid_where_the_case_has_one(case: Path) -> None:
    c = load_case(case)
    facts = fabric_from_case(case)
    want = c["expected"].get("rocev2_ipv4_gid_index") or {}
    for dev in facts.devices:
        ch = choose_sgid(dev, c.get("fabric_ip"))
        if dev.name in want:
            assert (ch.sgid_index, ch.choice) == (want[dev.name], SGID_FABRIC_IP), dev.name
            assert ipv4_from_gid(ch.sgid) == c["fabric_ip"]
        else:
            assert ch.choice != SGID_FABRIC_IP, dev.name


def test_case17_first_device_falls_back_to_its_linklocal_rocev2_gid() -> None:
    case = next(p for p in FABRIC_CASES if p.name.startswith("17-"))
    facts = fabric_from_case(case)
    assert [d.name for d in facts.devices] == ["zrxe0", "arxe1"]  # index order, not name order
    z = choose_sgid(facts.devices[0], "10.9.0.2")
    assert z.choice == SGID_FALLBACK and z.port == 1
    assert z.sgid is not None and z.sgid.startswith("fe80:")
    first_v2 = min(g.index for g in facts.devices[0].ports[0].gids if g.type == ROCE_V2)
    assert z.sgid_index == first_v2
    a = choose_sgid(facts.devices[1], "10.9.0.2")
    assert (a.sgid_index, a.choice, a.sgid) == (1, SGID_FABRIC_IP, gid_for_ipv4("10.9.0.2"))


def test_rocev1_only_entry_is_not_taken_as_the_fabric_ip_gid() -> None:
    case = next(p for p in FABRIC_CASES if p.name.startswith("09-"))
    c = load_case(case)
    facts = fabric_from_case(case)
    for dev in facts.devices:
        ch = choose_sgid(dev, c["fabric_ip"])
        assert ch.choice != SGID_FABRIC_IP
        if ch.sgid_index is not None:
            g = next(g for p in dev.ports for g in p.gids if g.index == ch.sgid_index and p.num == ch.port)
            assert g.type == ROCE_V2


def _dev(ports: list[Port]) -> RdmaDevice:
    return RdmaDevice(name="mlx5_0", ports=ports)


def test_port_choice_order() -> None:
    ip = "192.0.2.10"
    p1 = Port(num=1, state="ACTIVE", gids=[Gid(0, "fe80:0000:0000:0000:0000:00ff:fe00:0001", ROCE_V2)])
    p2 = Port(num=2, state="DOWN", gids=[Gid(3, gid_for_ipv4(ip), ROCE_V2, ipv4=ip)])
    assert choose_port(_dev([p1, p2]), ip) == 2  # carries the fabric IP, even when DOWN
    assert choose_port(_dev([p1, p2]), None) == 1  # first ACTIVE
    assert choose_port(_dev([Port(num=1, state="DOWN"), Port(num=2, state="ACTIVE")]), ip) == 2
    assert choose_port(_dev([Port(num=1, state="DOWN"), Port(num=2, state="DOWN")]), ip) == 1
    assert choose_port(_dev([]), ip) == 1


def test_sgid_choice_prefers_v2_ip_gid_then_first_v2_then_none() -> None:
    ip = "192.0.2.10"
    mapped = gid_for_ipv4(ip)
    ll = "fe80:0000:0000:0000:0000:00ff:fe00:0001"
    port = Port(num=1, state="ACTIVE", gids=[
        Gid(0, ll, ROCE_V1), Gid(1, ll, ROCE_V2), Gid(2, mapped, ROCE_V1, ipv4=ip), Gid(3, mapped, ROCE_V2, ipv4=ip),
    ])
    ch = choose_sgid(_dev([port]), ip)
    assert (ch.sgid_index, ch.choice) == (3, SGID_FABRIC_IP)
    ch = choose_sgid(_dev([port]), "192.0.2.99")  # not here: what an engine falls back to
    assert (ch.sgid_index, ch.sgid, ch.choice) == (1, ll, SGID_FALLBACK)
    ch = choose_sgid(_dev([port]), None)
    assert (ch.sgid_index, ch.choice) == (1, SGID_FALLBACK)
    only_v1 = Port(num=1, state="ACTIVE", gids=[Gid(0, ll, ROCE_V1), Gid(1, mapped, ROCE_V1, ipv4=ip)])
    ch = choose_sgid(_dev([only_v1]), ip)
    assert ch.sgid_index is None and "no RoCE v2 GID" in ch.choice
    ch = choose_sgid(_dev([]), ip)
    assert ch.sgid_index is None and ch.port == 1


def test_destination_gid() -> None:
    assert destination_gid("10.9.0.1", None) == "0000:0000:0000:0000:0000:ffff:0a09:0001"
    assert destination_gid("loopback", "fe80:0000:0000:0000:0000:00ff:fe00:0001").startswith("fe80")
    assert destination_gid("loopback", None) is None
    assert destination_gid("peer.example", None) is None


@pytest.mark.parametrize(
    "err,words",
    [
        (22, "invalid attribute (this GID cannot reach that destination: no IPv4 on this port?)"),
        (-22, "invalid attribute (this GID cannot reach that destination: no IPv4 on this port?)"),
        (110, "address resolution timed out (no ARP reply from the peer on this port)"),
        (-110, "address resolution timed out (no ARP reply from the peer on this port)"),
        (101, "network unreachable from this GID's netdev"),
        (-101, "network unreachable from this GID's netdev"),
        (61, "the GID slot is empty"),
        (errno.EIO, "Input/output error"),
        (None, None),
    ],
)
def test_decode_errno(err, words) -> None:
    assert decode_errno(err) == words


def test_mtu_enum() -> None:
    assert [mtu_enum_to_bytes(i) for i in range(0, 7)] == [None, 256, 512, 1024, 2048, 4096, None]


# ---------------------------------------------------------------- no pyverbs


def test_no_pyverbs_gives_ran_false_with_the_install_hint(monkeypatch) -> None:
    for mod in [m for m in list(sys.modules) if m == "pyverbs" or m.startswith("pyverbs.")] + ["pyverbs"]:
        monkeypatch.setitem(sys.modules, mod, None)  # None in sys.modules: import raises ImportError
    facts = probe_qp(FabricFacts(devices=[RdmaDevice(name="mlx5_0")]), "192.0.2.10", ["192.0.2.11"])
    assert facts.ran is False
    assert facts.why == NO_PYVERBS_WHY
    assert facts.why.startswith("pyverbs is not installed: apt install python3-pyverbs")
    assert facts.results == []


# ---------------------------------------------------------------- the walk, on a fake pyverbs


class FakeRDMAError(Exception):
    def __init__(self, msg: str, code: int) -> None:
        super().__init__(f"{msg}. Errno: {code}")
        self.error_code = code


def fake_pyverbs(calls: list, fail: dict[str, int] | None = None, block: threading.Event | None = None,
                 open_fail: int | None = None) -> dict:
    """A pyverbs stand-in recording every call in ``calls``. ``fail`` maps a target state name to
    the errno its modify raises; ``block`` makes RTR wait on the event."""
    fail = fail or {}
    names = ["IBV_QPT_RC", "IBV_QPS_INIT", "IBV_QPS_RTR", "IBV_QPS_RTS", "IBV_ACCESS_LOCAL_WRITE",
             "IBV_ACCESS_REMOTE_READ", "IBV_ACCESS_REMOTE_WRITE", "IBV_QP_STATE", "IBV_QP_PKEY_INDEX",
             "IBV_QP_PORT", "IBV_QP_ACCESS_FLAGS", "IBV_QP_AV", "IBV_QP_PATH_MTU", "IBV_QP_DEST_QPN",
             "IBV_QP_RQ_PSN", "IBV_QP_MAX_DEST_RD_ATOMIC", "IBV_QP_MIN_RNR_TIMER", "IBV_QP_TIMEOUT",
             "IBV_QP_RETRY_CNT", "IBV_QP_RNR_RETRY", "IBV_QP_SQ_PSN", "IBV_QP_MAX_QP_RD_ATOMIC"]
    enums = types.SimpleNamespace(**{n: 1 << i for i, n in enumerate(names)})
    enums.IBV_QPT_RC = 2
    enums.IBV_QPS_INIT, enums.IBV_QPS_RTR, enums.IBV_QPS_RTS = 1, 2, 3
    state_name = {1: "INIT", 2: "RTR", 3: "RTS"}

    class Closable:
        def close(self) -> None:
            calls.append(("close", type(self).__name__))

    class Context(Closable):
        def __init__(self, name: str) -> None:
            if open_fail:
                raise FakeRDMAError(f"Failed to open device {name}", open_fail)
            calls.append(("open", name))

        def query_port(self, port: int):
            calls.append(("query_port", port))
            return types.SimpleNamespace(active_mtu=3)

    class PD(Closable):
        def __init__(self, ctx) -> None:
            calls.append(("pd",))

    class CQ(Closable):
        def __init__(self, ctx, cqe) -> None:
            calls.append(("cq", cqe))

    class QP(Closable):
        qp_num = 17

        def __init__(self, pd, init_attr) -> None:
            calls.append(("qp", init_attr.kw["qp_type"]))

        def modify(self, attr, mask) -> None:
            to = state_name[attr.qp_state]
            calls.append(("modify", to, mask, dict(vars(attr))))
            if to == "RTR" and block is not None:
                block.wait(5)
            if to in fail:
                raise FakeRDMAError("Failed to modify QP", fail[to])

        def to_rts(self, attr) -> None:  # must never be used
            raise AssertionError("to_rts hides which step failed")

    class Rec:
        def __init__(self, *a, **kw) -> None:
            self.a, self.kw = a, kw

    qpns = types.SimpleNamespace(QPCap=Rec, QPInitAttr=Rec, QP=QP, QPAttr=types.SimpleNamespace)
    addr = types.SimpleNamespace(GID=lambda s: ("GID", s), GlobalRoute=Rec, AHAttr=Rec)
    return {"addr": addr, "cq": types.SimpleNamespace(CQ=CQ), "device": types.SimpleNamespace(Context=Context),
            "enums": enums, "pd": types.SimpleNamespace(PD=PD), "qp": qpns}


def lab_like_fabric() -> FabricFacts:
    ll = "fe80:0000:0000:0000:0817:58ff:fe65:b049"
    z = RdmaDevice(name="zrxe0", index=0, ports=[Port(num=1, state="ACTIVE", gids=[Gid(0, ll, ROCE_V2, "va")])])
    a = RdmaDevice(name="arxe1", index=1, ports=[Port(num=1, state="ACTIVE", gids=[
        Gid(0, "fe80:0000:0000:0000:20df:c8ff:fed7:9d30", ROCE_V2, "vc"),
        Gid(1, gid_for_ipv4("10.9.0.2"), ROCE_V2, "vc", "10.9.0.2")])])
    return FabricFacts(devices=[z, a])


def test_walk_steps_one_at_a_time_and_records_the_rtr_errno(monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr(qpmod, "_import_pyverbs", lambda: fake_pyverbs(calls, fail={"RTR": -22}))
    facts = probe_qp(lab_like_fabric(), "10.9.0.2", ["10.9.0.1"])
    assert facts.ran and len(facts.results) == 2
    z, a = facts.results
    assert (z.device, z.target, z.sgid_index, z.sgid_choice) == ("zrxe0", "10.9.0.1", 0, SGID_FALLBACK)
    assert z.dgid == "0000:0000:0000:0000:0000:ffff:0a09:0001" and z.path_mtu == 1024
    assert [(s.to, s.ok, s.errno) for s in z.steps] == [("INIT", True, None), ("RTR", False, 22)]
    assert z.reached == "INIT" and z.errno == 22
    assert "errno 22" in z.error and "no IPv4 on this port?" in z.error
    assert z.destroyed
    assert (a.sgid_index, a.sgid_choice) == (1, SGID_FABRIC_IP)
    # destroy order per walk: QP, CQ, PD, Context
    closes = [c[1] for c in calls if c[0] == "close"]
    assert closes == ["QP", "CQ", "PD", "Context"] * 2
    # RTR attributes as specified
    rtr = next(c for c in calls if c[0] == "modify" and c[1] == "RTR")[3]
    assert (rtr["path_mtu"], rtr["dest_qp_num"], rtr["rq_psn"], rtr["max_dest_rd_atomic"], rtr["min_rnr_timer"]) == (
        3, 17, 0, 1, 12)
    gr = rtr["ah_attr"].kw["gr"].kw
    assert gr["sgid_index"] == 0 and gr["hop_limit"] == 64 and gr["dgid"] == ("GID", z.dgid)
    assert rtr["ah_attr"].kw["is_global"] == 1 and rtr["ah_attr"].kw["port_num"] == 1


def test_walk_reaches_rts_and_loopback_without_peers(monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr(qpmod, "_import_pyverbs", lambda: fake_pyverbs(calls))
    facts = probe_qp(lab_like_fabric(), "10.9.0.2", [])
    assert [r.target for r in facts.results] == ["loopback", "loopback"]
    a = facts.results[1]
    assert a.dgid == a.sgid == gid_for_ipv4("10.9.0.2")
    assert [s.to for s in a.steps] == ["INIT", "RTR", "RTS"] and a.reached == "RTS"
    assert a.errno is None and a.error is None and a.destroyed
    rts = next(c for c in calls if c[0] == "modify" and c[1] == "RTS")[3]
    assert (rts["timeout"], rts["retry_cnt"], rts["rnr_retry"], rts["sq_psn"], rts["max_rd_atomic"]) == (14, 7, 7, 0, 1)


def test_one_result_per_device_and_peer(monkeypatch) -> None:
    monkeypatch.setattr(qpmod, "_import_pyverbs", lambda: fake_pyverbs([]))
    facts = probe_qp(lab_like_fabric(), "10.9.0.2", ["10.9.0.1", "10.9.0.3"])
    assert [(r.device, r.target) for r in facts.results] == [
        ("zrxe0", "10.9.0.1"), ("zrxe0", "10.9.0.3"), ("arxe1", "10.9.0.1"), ("arxe1", "10.9.0.3")]


def test_open_failure_is_a_fact(monkeypatch) -> None:
    monkeypatch.setattr(qpmod, "_import_pyverbs", lambda: fake_pyverbs([], open_fail=19))
    facts = probe_qp(lab_like_fabric(), "10.9.0.2", ["10.9.0.1"])
    r = facts.results[0]
    assert r.steps == [] and r.reached == "RESET" and r.errno == 19 and r.destroyed
    assert "open zrxe0" in r.error


def test_timeout_gives_up_and_says_so(monkeypatch) -> None:
    gate = threading.Event()
    monkeypatch.setattr(qpmod, "_import_pyverbs", lambda: fake_pyverbs([], block=gate))
    try:
        facts = probe_qp(lab_like_fabric(), "10.9.0.2", ["10.9.0.1"], timeout_s=0.2)
    finally:
        gate.set()
    r = facts.results[0]
    assert r.error.startswith("timed out after 0.2s") and r.destroyed is False
    assert [s.to for s in r.steps][:1] == ["INIT"]
    assert any("still running" in n for n in facts.notes)


def test_no_source_gid_stops_after_init(monkeypatch) -> None:
    monkeypatch.setattr(qpmod, "_import_pyverbs", lambda: fake_pyverbs([]))
    dev = RdmaDevice(name="mlx5_0", ports=[Port(num=1, state="ACTIVE")])
    r = probe_qp(FabricFacts(devices=[dev]), "192.0.2.10", ["192.0.2.11"]).results[0]
    assert [s.to for s in r.steps] == ["INIT"] and r.sgid_index is None
    assert r.error.startswith("RTR not attempted: no source GID")


def test_never_raises_on_odd_input(monkeypatch) -> None:
    monkeypatch.setattr(qpmod, "_import_pyverbs", lambda: fake_pyverbs([]))
    facts = probe_qp(FabricFacts(devices=[RdmaDevice(name="x", ports=None)]), None, ["not-an-ip"])  # type: ignore[arg-type]
    assert facts.ran is False or facts.results
