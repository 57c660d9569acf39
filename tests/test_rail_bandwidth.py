"""The per-rail bandwidth run and the port counters around it (issue 15 item 5), without RDMA hardware:

- the band judging at each boundary of the role's bands (expert: 80 / 8-25 / 8 Gb/s) and the evidence
  the stale-initialization verdict needs (link at speed, no error counter grown);
- counter deltas (growth WARNs naming the counter and by how much; congestion counters say congestion
  and do not WARN; unknown counters are reported, not judged; counters that went backwards are notes);
- the pair protocol's bandwidth mode end to end over real TCP with a fake verbs layer (bytes "land"
  in the server's fake MR): a run, an old (protocol 1) server, a refused ask, a peer that stops
  answering mid-run, a bad work completion; every session bounded and every object closed;
- replay: the saved `--pair --bandwidth --json` output as pair.json in a snapshot gives the same verdicts;
- playbook band validation and the CLI's usage errors.

The real exchange (rxe between namespace hosts) runs in the lab: tests/test_lab_rail.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from afddiag import cli
from afddiag.model import to_jsonable
from afddiag.model.pair import BandwidthRun, PairFacts, PortCounters, RailQp, counter_kind, pair_facts
from afddiag.model.run import Inputs, Observation
from afddiag.pairtest import PAIR_GATES
from afddiag.playbook import Playbook, PlaybookError, parse
from afddiag.probes import counters as cmod
from afddiag.probes import pair as pm
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN

EXPERT = dict(rail_healthy_gbps=80.0, rail_stale_init_gbps=(8.0, 25.0), rail_fail_below_gbps=8.0,
              link_speed_mbps=200_000)


# --- facts and gates on recorded facts -----------------------------------------------------------------

def _pc(side="local", dev="mlx5_0", **delta) -> PortCounters:
    hw = {k: v for k, v in delta.items() if k != "carrier_changes"}
    groups = {"hw_counters": hw}
    if "carrier_changes" in delta:
        groups["netdev"] = {"carrier_changes": delta["carrier_changes"]}
    return PortCounters(side=side, device=dev, port=1, netdev="enp1s0f1np1", read=True, delta=groups)


def _pair(gbps=95.0, speed=200_000, counters=None, error=None, verified=True, stage="done", nbytes=None,
          seconds=5.0) -> PairFacts:
    per = [RailQp(i, 100 + i, 200 + i, writes=10, bytes=10 << 20, gbps=gbps / 4 if gbps else None) for i in range(4)]
    bw = BandwidthRun(seconds_asked=5.0, size=1 << 20, qps=4, depth=8, stage=stage, seconds=seconds,
                      bytes=(int(gbps * 1e9 / 8 * seconds) if gbps else 0) if nbytes is None else nbytes,
                      gbps=gbps, per_qp=per, verified=verified, error=error,
                      counters=counters if counters is not None else [_pc(), _pc("peer", "mlx5_1")])
    return PairFacts(role="client", peer="192.168.100.11:18515", device="mlx5_0", port=1, gid_index=3,
                     fabric_ip="192.168.100.10", mode="bandwidth", netdev="enp1s0f1np1", link_speed_mbps=speed,
                     path_mtu=4096, bandwidth=bw, error=error)


def _judge(p, source="live", **pb):
    from afddiag.endpoint import FabricIp
    from afddiag.gates import Context
    from afddiag.gates.rail import port_counters, rail_bandwidth

    inputs = Inputs(playbook=Playbook(name="expert" if pb else "generic", **pb), families=frozenset({"fabric"}))
    ctx = Context(Observation("h", source, pair=p), inputs, FabricIp(None, "test", []))
    return rail_bandwidth(ctx), port_counters(ctx)


@pytest.mark.parametrize("gbps,verdict,band,action", [
    (80.0, PASS, "healthy", ""),            # the healthy line itself
    (79.99, WARN, "below", "CHECK_FABRIC"),
    (25.01, WARN, "below", "CHECK_FABRIC"),
    (25.0, FAIL, "stale-init", "REBOOT"),   # the band is inclusive at both ends
    (12.0, FAIL, "stale-init", "REBOOT"),
    (8.0, FAIL, "stale-init", "REBOOT"),
    (7.99, FAIL, "far-below", "CHECK_FABRIC"),
    (0.5, FAIL, "far-below", "CHECK_FABRIC"),
])
def test_expert_bands_at_each_boundary(gbps, verdict, band, action):
    v, _ = _judge(_pair(gbps), **EXPERT)
    assert (v.verdict, v.facts["band"]) == (verdict, band), v
    assert v.action == action
    assert f"{gbps:.2f} Gb/s over 4 QPs" in v.summary
    assert "rail mlx5_0 port 1 (192.168.100.10 <-> 192.168.100.11)" in v.summary
    if band == "stale-init":
        assert "stale-initialization signature" in v.summary and "AC" in v.remedy and "reboot" in v.remedy.lower()
    else:  # only the stale-init evidence gets a power action
        assert "power-cycle" not in v.remedy and "reboot the node" not in v.remedy


def test_stale_band_needs_the_link_at_speed_and_no_errors():
    slow_link = _judge(_pair(20.0, speed=25_000), **EXPERT)[0]
    assert (slow_link.verdict, slow_link.facts["band"], slow_link.action) == (WARN, "below", "CHECK_FABRIC")
    assert "link 25000 Mb/s is below the role's 200000 Mb/s" in slow_link.summary
    lossy = _judge(_pair(20.0, counters=[_pc(out_of_sequence=40), _pc("peer", "mlx5_1")]), **EXPERT)[0]
    assert lossy.verdict == WARN and lossy.action == "CHECK_FABRIC" and "out_of_sequence +40" in lossy.summary
    unread = _judge(_pair(20.0, speed=None), **EXPERT)[0]
    assert (unread.verdict, unread.facts["band"], unread.action) == (FAIL, "stale-unconfirmed", "CHECK_FABRIC")
    assert "not confirmed" in unread.summary and unread.commands == ["ethtool enp1s0f1np1"]
    unknown = _judge(_pair(20.0, speed=-1), **EXPERT)[0]
    assert unknown.facts["band"] == "stale-unconfirmed"
    # congestion alone does not explain it away: CNPs are the fabric pacing, not loss
    cnp = _judge(_pair(20.0, counters=[_pc(np_cnp_sent=500)]), **EXPERT)[0]
    assert cnp.facts["band"] == "stale-init"


def test_no_band_names_the_figure_and_passes():
    v, _ = _judge(_pair(3.2))
    assert v.verdict == PASS and "3.20 Gb/s" in v.summary and "sets no band" in v.summary


def test_judge_rail_bandwidth_is_pure_and_covers_lab_bands():
    from afddiag.gates.rail import judge_rail_bandwidth as j

    assert j(0.4, 0.2, (), 0.02, None, False) == (PASS, "healthy")
    assert j(0.1, 0.2, (), 0.02, None, False) == (WARN, "below")
    assert j(0.01, 0.2, (), 0.02, None, False) == (FAIL, "far-below")
    assert j(12.0, 80.0, (8.0, 25.0), 8.0, False, False) == (WARN, "below")


def test_run_that_stopped_fails_with_the_reason_and_no_power_action():
    err = "work completion status 12 (transport retry counter exceeded (no ACK: path MTU or route)) on QP 101"
    v, c = _judge(_pair(40.0, error=err, stage="run", verified=False,
                        counters=[_pc(retry_exceeded_err=1), _pc("peer", "mlx5_1")]), **EXPERT)
    assert v.verdict == FAIL and v.action == "CHECK_FABRIC"
    assert "the run stopped" in v.summary and "status 12" in v.summary
    assert "not a power issue" in v.remedy and v.commands == ["ip route get 192.168.100.11 from 192.168.100.10"]
    assert c.verdict == WARN and "retry_exceeded_err +1" in c.summary
    nothing = _judge(_pair(None, error="timed out waiting for 32 of 32 completion(s)", stage="run", verified=False),
                     **EXPERT)[0]
    assert nothing.verdict == FAIL and "no RDMA WRITE completed" in nothing.summary
    unverified = _judge(_pair(95.0, verified=False), **EXPERT)[0]
    assert unverified.verdict == FAIL and "buffer" in unverified.summary


def test_run_that_never_started_is_error_not_a_rail_verdict():
    p = _pair(None, error="cannot reach 192.168.100.11:18515 over TCP: Connection refused", stage="handshake")
    p.bandwidth.counters = []
    v, c = _judge(p, **EXPERT)
    assert v.verdict == ERROR and v.action == "RERUN" and "not measured" in v.summary and "--serve" in v.remedy
    assert c.verdict == SKIP and "not read" in c.summary


def test_gates_skip_without_a_bandwidth_run():
    v, c = _judge(None, **EXPERT)
    assert v.verdict == c.verdict == SKIP and "no bandwidth run in this command" in v.summary
    assert "--bandwidth" in v.remedy and "--serve" in v.remedy
    v, _ = _judge(None, source="snapshot /x", **EXPERT)
    assert "snapshot holds no pair-test result" in v.summary
    phases = _pair()
    phases.bandwidth, phases.mode = None, "phases"
    v, c = _judge(phases, **EXPERT)
    assert v.verdict == SKIP and "short SEND/WRITE phases only" in v.summary
    failed = PairFacts(role="unknown", failed="pair.json refused: not JSON")
    assert _judge(failed, **EXPERT)[0].verdict == ERROR


# --- counters -----------------------------------------------------------------------------------------

def test_counter_kinds():
    assert counter_kind("out_of_sequence") == counter_kind("packet_seq_err") == "error"
    assert counter_kind("local_ack_timeout_err") == counter_kind("rnr_nak_retry_err") == "error"
    assert {counter_kind(c) for c in ("roce_slow_restart", "link_downed", "carrier_changes")} == {"error"}
    assert counter_kind("np_cnp_sent") == counter_kind("rp_cnp_handled") == "congestion"
    for rxe_err in ("out_of_seq_request", "rcvd_seq_err", "retry_exceeded_err", "retry_rnr_exceeded_err",
                    "completer_retry_err", "send_err", "duplicate_request", "rcvd_rnr_err"):
        assert counter_kind(rxe_err) == "error", rxe_err
    assert counter_kind("sent_bytes") == counter_kind("rcvd_pkts") == counter_kind("port_xmit_data") == "traffic"
    assert counter_kind("vendor_magic") == "unknown"


def test_error_growth_warns_naming_counter_side_and_amount():
    _, c = _judge(_pair(95.0, counters=[_pc(packet_seq_err=3, sent_pkts=90000),
                                        _pc("peer", "mlx5_1", out_of_sequence=7, local_ack_timeout_err=0)]), **EXPERT)
    assert c.verdict == WARN and c.action == "CHECK_FABRIC"
    assert "local mlx5_0 port 1: packet_seq_err +3" in c.summary
    assert "peer mlx5_1 port 1: out_of_sequence +7" in c.summary
    assert "sent_pkts" not in c.summary and "local_ack_timeout_err" not in c.summary  # traffic and zero growth
    assert c.facts["sides"][1]["errors"] == {"out_of_sequence": 7}


def test_link_flap_is_fix_link():
    _, c = _judge(_pair(95.0, counters=[_pc(carrier_changes=2), _pc("peer", "mlx5_1")]), **EXPERT)
    assert c.verdict == WARN and c.action == "FIX_LINK" and "carrier_changes +2" in c.summary
    assert "cable" in c.remedy


def test_congestion_is_named_as_congestion_and_unknown_is_not_judged():
    _, c = _judge(_pair(95.0, counters=[_pc(np_cnp_sent=120, rp_cnp_handled=80, vendor_magic=5),
                                        _pc("peer", "mlx5_1")]), **EXPERT)
    assert c.verdict == PASS
    assert "congestion signals" in c.summary and "np_cnp_sent +120" in c.summary and "rp_cnp_handled +80" in c.summary
    assert "not judged" in c.summary and "vendor_magic +5" in c.summary
    assert c.facts["sides"][0]["unknown"] == {"vendor_magic": 5}


def test_quiet_counters_pass_and_a_missing_peer_side_is_said():
    _, c = _judge(_pair(95.0, counters=[_pc(sent_pkts=5)]), **EXPERT)
    assert c.verdict == PASS and "no error counter grew during the 5.0 s run" in c.summary
    assert "peer's counters were not received" in c.summary


def _tree(tmp_path, hw: dict, cnt: dict | None = None, carrier: int | None = 3):
    base = tmp_path / "sys/class/infiniband/rxa/ports/1"
    (base / "hw_counters").mkdir(parents=True)
    for k, v in hw.items():
        (base / "hw_counters" / k).write_text(f"{v}\n")
    if cnt is not None:
        (base / "counters").mkdir()
        for k, v in cnt.items():
            (base / "counters" / k).write_text(f"{v}\n")
    if carrier is not None:
        (tmp_path / "sys/class/net/pa").mkdir(parents=True)
        (tmp_path / "sys/class/net/pa/carrier_changes").write_text(f"{carrier}\n")
    return str(tmp_path)


def test_read_port_counters_and_delta(tmp_path):
    root = _tree(tmp_path, {"sent_pkts": 10, "rcvd_seq_err": 0, "lifespan": 10, "garbage": "x"})
    before = cmod.read_port_counters("rxa", 1, "pa", root)
    assert before["values"]["hw_counters"] == {"sent_pkts": 10, "rcvd_seq_err": 0}  # lifespan is not a counter
    assert before["values"]["netdev"] == {"carrier_changes": 3}
    assert any("counters/: not read" in n for n in before["notes"])  # rxe has no counters/
    assert any("garbage" in n and "not a counter" in n for n in before["notes"])
    _tree(tmp_path / "after", {"sent_pkts": 5010, "rcvd_seq_err": 2}, carrier=4)
    after = cmod.read_port_counters("rxa", 1, "pa", str(tmp_path / "after"))
    d = cmod.port_delta(before, after, "rxa", 1, "pa")
    assert d.read and d.delta["hw_counters"] == {"sent_pkts": 5000, "rcvd_seq_err": 2}
    assert d.delta["netdev"] == {"carrier_changes": 1}
    back = cmod.port_delta(after, before, "rxa", 1, "pa")
    assert back.delta["hw_counters"] == {} and any("went back" in n for n in back.notes)


def test_read_port_counters_timeout_with_a_real_folder(tmp_path):
    root = _tree(tmp_path, {"sent_pkts": 1})

    def stuck(path):
        time.sleep(3)
        return "0"

    t = time.monotonic()
    got = cmod.read_port_counters("rxa", 1, "pa", root, reader=stuck, timeout_s=0.3)
    assert time.monotonic() - t < 2 and got["values"] == {} and "0.3" in got["notes"][0]


def test_hw_counters_over_netlink_where_sysfs_has_none(tmp_path, monkeypatch):
    """A namespace's view of a shared device: the port folder without hw_counters/ → `rdma statistic`."""
    (tmp_path / "sys/class/infiniband/rxa/ports/1").mkdir(parents=True)
    calls = []
    monkeypatch.setattr(cmod, "rdma_statistic", lambda d, p: (calls.append((d, p)) or {"sent_pkts": 7}, None))
    got = cmod.read_port_counters("rxa", 1, None, str(tmp_path))
    assert calls == [("rxa", 1)] and got["values"]["hw_counters"] == {"sent_pkts": 7}
    assert any("rdma statistic" in n and "network namespace" in n for n in got["notes"])
    monkeypatch.setattr(cmod, "rdma_statistic", lambda d, p: (None, "exit 1: no such device"))
    got = cmod.read_port_counters("rxa", 1, None, str(tmp_path))
    assert "hw_counters" not in got["values"] and any("exit 1: no such device" in n for n in got["notes"])


def test_parse_rdma_statistic():
    row = {"ifindex": 3, "ifname": "rxa", "port": 1, "sent_pkts": 5, "rcvd_seq_err": 0,
           "optional-counters": {"np_cnp_sent": 2}, "state": "x"}
    assert cmod.parse_rdma_statistic([row, {**row, "ifname": "rxb", "sent_pkts": 9}], "rxa", 1) == \
        {"sent_pkts": 5, "rcvd_seq_err": 0, "np_cnp_sent": 2}
    for bad in ({}, [], [{"ifname": "rxa", "port": 1}], [{"ifname": "x", "port": 1}, {"ifname": "y", "port": 1}]):
        with pytest.raises(ValueError):
            cmod.parse_rdma_statistic(bad, "rxa", 1)


# --- the protocol, end to end over TCP, with a fake verbs layer -----------------------------------------

MRS: dict[int, FakeMR] = {}


class FakeMR:
    def __init__(self, n):
        self.data = bytearray(n)
        self.buf = 0x10000 * (len(MRS) + 1)
        self.rkey = self.lkey = len(MRS) + 7
        self.length = n
        MRS[self.rkey] = self

    def write(self, data, size, offset):
        self.data[offset:offset + size] = data[:size]

    def read(self, size, offset):
        return bytes(self.data[offset:offset + size])

    def close(self):
        MRS.pop(self.rkey, None)


class FakeWC:
    def __init__(self, wr_id, status=0):
        self.wr_id, self.status, self.opcode, self.byte_len = wr_id, status, 0, 0


class FakeCQ:
    def __init__(self):
        self.q, self.lock = [], threading.Lock()

    def poll(self, num_entries=1):
        with self.lock:
            out, self.q = self.q[:num_entries], self.q[num_entries:]
        return len(out), out


class FakeQP:
    n = 1000

    def __init__(self):
        FakeQP.n += 1
        self.qp_num = FakeQP.n


class FakeRdma:
    """What pair.py uses of _Rdma: the handshake QP/MR, connect, bandwidth objects, post_send, close.
    ``fail_after``: the nth WRITE completes with status 12; ``hang_after``: WRITEs past it never complete."""

    fail_after: int | None = None
    hang_after: int | None = None

    def __init__(self):
        self.qp, self.mr, self.psn, self.mtu_enum = FakeQP(), FakeMR(1024), 5, 3
        self.cq, self.posted, self.closed = FakeCQ(), 0, False
        self.e = None

    def connect(self, peer, qp=None, psn=None):
        return 3

    def bandwidth_objects(self, qps, depth, buf_bytes):
        self.bw_mr = FakeMR(buf_bytes)
        return self.cq, self.bw_mr, [FakeQP() for _ in range(qps)], [11] * qps

    def release(self, *objs):
        return True

    def post_send(self, offset, size, wr_id=0, rdma=None, qp=None, mr=None):
        self.posted += 1
        if self.hang_after is not None and self.posted > self.hang_after:
            return
        if rdma and rdma[0] in MRS:
            at = rdma[1] - MRS[rdma[0]].buf
            MRS[rdma[0]].data[at:at + size] = mr.data[offset:offset + size]
        bad = self.fail_after is not None and self.posted > self.fail_after
        with self.cq.lock:
            self.cq.q.append(FakeWC(wr_id, 12 if bad else 0))

    def close(self):
        self.closed = True
        return True


@pytest.fixture
def fake_verbs(monkeypatch):
    made = []

    def fake_open(fabric, fabric_ip, buf, facts):
        facts.device, facts.port, facts.gid_index = "rxa" if not made else "rxb", 1, 1
        facts.gid, facts.fabric_ip, facts.netdev, facts.link_speed_mbps = "0000:0000:0000:0000:0000:ffff:7f00:0001", \
            "127.0.0.1", "pa", 10_000
        r = FakeRdma()
        made.append(r)
        return r

    reads = iter(range(10 ** 6))

    def fake_counters(facts):
        n = next(reads) * 100
        return {"values": {"hw_counters": {"sent_pkts": n, "retry_exceeded_err": 0}}, "notes": []}

    monkeypatch.setattr(pm, "_open", fake_open)
    monkeypatch.setattr(pm, "_read_counters", fake_counters)
    FakeRdma.fail_after = FakeRdma.hang_after = None
    return made


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_thread(port, timeout_s=20.0):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("facts", pm.serve(port, bind="127.0.0.1", timeout_s=timeout_s,
                                                                     peer="127.0.0.1")),
                         daemon=True)
    t.start()
    return t, out


def test_bandwidth_run_end_to_end(fake_verbs):
    port = _free_port()
    t, out = _serve_thread(port)
    spec = pm.BandwidthSpec(seconds=0.5, size=4096, qps=3, depth=4)
    c = pm.pair("127.0.0.1", port, timeout_s=20, bandwidth=spec)
    t.join(10)
    s = out["facts"]
    assert c.error is None, c.error
    bw = c.bandwidth
    assert c.mode == "bandwidth" and bw.stage == "done" and bw.verified and bw.gbps > 0
    assert bw.bytes == sum(q.bytes for q in bw.per_qp) == 4096 * sum(q.writes for q in bw.per_qp)
    assert abs(bw.gbps - bw.bytes * 8 / bw.seconds / 1e9) < 1e-3
    assert len(bw.per_qp) == 3 and all(q.gbps > 0 and q.peer_qp_num for q in bw.per_qp)
    assert 0.4 < bw.seconds < 5
    # both sides hold both ports' deltas
    assert [x.side for x in bw.counters] == ["local", "peer"] and bw.counters[0].delta["hw_counters"]["sent_pkts"] > 0
    assert s.error is None and s.bandwidth.verified and s.bandwidth.gbps == bw.gbps
    assert [x.side for x in s.bandwidth.counters] == ["local", "peer"]
    assert all(r.closed for r in fake_verbs) and c.destroyed and s.destroyed
    # what the CLI prints is what a replay reads back
    again = pair_facts(json.loads(json.dumps(to_jsonable(c))))
    assert to_jsonable(again) == to_jsonable(c)


def _old_server(port, seen):
    """A protocol-1 server: hello without modes, rts, then it waits for bye (as afddiag before the bandwidth mode)."""
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(1)
    ls.settimeout(10)
    conn, _ = ls.accept()
    f = conn.makefile("rwb")
    seen.append(json.loads(f.readline()))
    f.write(json.dumps({"qpn": 9, "psn": 1, "gid": "::1", "mtu": 3, "addr": 0, "rkey": 1, "len": 1,
                        "device": "old"}).encode() + b"\n")
    f.write(b'{"op": "rts"}\n')
    f.flush()
    conn.settimeout(10)
    seen.append(json.loads(f.readline()))
    conn.close()
    ls.close()


def test_old_server_gets_bye_and_a_clear_error_not_a_hang(fake_verbs):
    port = _free_port()
    seen: list = []
    t = threading.Thread(target=_old_server, args=(port, seen), daemon=True)
    t.start()
    t0 = time.monotonic()
    c = pm.pair("127.0.0.1", port, timeout_s=30, bandwidth=pm.BandwidthSpec(seconds=1))
    t.join(5)
    assert time.monotonic() - t0 < 10
    assert "does not know the bandwidth mode" in c.error and "protocol 1" in c.error and "update afddiag" in c.error
    assert seen[0]["mode"] == "bandwidth" and seen[0]["proto"] == pm.PROTO and seen[1] == {"op": "bye"}
    assert c.bandwidth.stage == "handshake" and c.destroyed
    v, _ = _judge(c, **EXPERT)
    assert v.verdict == ERROR and "not measured" in v.summary


def test_new_server_refuses_an_ask_out_of_bounds(fake_verbs):
    port = _free_port()
    t, out = _serve_thread(port)
    c = pm.pair("127.0.0.1", port, timeout_s=20, bandwidth=pm.BandwidthSpec(seconds=1, size=64 << 20, qps=8))
    t.join(10)
    assert "the server refused the bandwidth run" in c.error and "exceeds" in c.error
    assert out["facts"].error is None and "refused the client's bandwidth run" in out["facts"].bandwidth.error


def test_a_bad_work_completion_stops_the_run_and_the_server_still_reports(fake_verbs):
    FakeRdma.fail_after = 40
    port = _free_port()
    t, out = _serve_thread(port)
    c = pm.pair("127.0.0.1", port, timeout_s=20, bandwidth=pm.BandwidthSpec(seconds=2, size=4096, qps=2, depth=4))
    t.join(10)
    bw = c.bandwidth
    assert "work completion status 12" in c.error and bw.error == c.error and bw.stage == "verify"
    assert bw.bytes > 0 and bw.gbps and [x.side for x in bw.counters] == ["local", "peer"]
    s = out["facts"]
    assert s.bandwidth.error == bw.error and s.error is None  # the server's session ended cleanly
    v, _ = _judge(c, **EXPERT)
    assert v.verdict == FAIL and "the run stopped" in v.summary and v.action == "CHECK_FABRIC"


def test_a_peer_that_stops_acking_is_bounded(fake_verbs, monkeypatch):
    monkeypatch.setattr(pm, "BW_STALL_S", 0.5)
    FakeRdma.hang_after = 30
    port = _free_port()
    t, out = _serve_thread(port, timeout_s=15)
    t0 = time.monotonic()
    c = pm.pair("127.0.0.1", port, timeout_s=15, bandwidth=pm.BandwidthSpec(seconds=3, size=4096, qps=2, depth=4))
    assert time.monotonic() - t0 < 12
    t.join(15)
    assert "no RDMA WRITE completed for 0.5 s" in c.error and c.destroyed
    assert all(r.closed for r in fake_verbs)


def test_server_side_of_a_client_that_vanished_is_bounded(fake_verbs):
    """The client asks for the run, then its TCP goes away: the server's wait ends, its counters are read."""
    port = _free_port()
    t, out = _serve_thread(port, timeout_s=6)
    for _ in range(50):  # the server thread may not listen yet
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    f = sock.makefile("rwb")
    f.write(json.dumps({"qpn": 1, "psn": 1, "gid": "::1", "mtu": 3, "proto": 2, "mode": "bandwidth"}).encode() + b"\n")
    f.flush()
    hello = json.loads(f.readline())
    assert hello["modes"] == ["phases", "bandwidth"] and hello["proto"] == pm.PROTO  # a protocol-2 client is served
    assert json.loads(f.readline()) == {"op": "rts"}
    f.write(json.dumps({"op": "bandwidth", "seconds": 1, "size": 4096, "qps": 1, "depth": 1,
                        "peers": [{"qpn": 5, "psn": 1}]}).encode() + b"\n")
    f.flush()
    assert json.loads(f.readline())["qps"]
    f.close()
    sock.close()
    t.join(10)
    s = out["facts"]
    assert s.error == "the peer closed the TCP connection" and s.bandwidth.stage == "run"
    assert s.bandwidth.counters and s.bandwidth.counters[0].read and s.destroyed


# --- replay, playbooks, CLI ---------------------------------------------------------------------------------

def test_replay_of_a_saved_run_gives_the_same_verdicts(tmp_path, capsys):
    import shutil

    from conftest import CASES

    snap = tmp_path / "snap"
    shutil.copytree(CASES / "fabric" / "02-spark-map-set-healthy", snap)
    p = _pair(20.0, counters=[_pc(out_of_sequence=4), _pc("peer", "mlx5_1")])
    (snap / "pair.json").write_text(json.dumps(to_jsonable(p)))
    rc = cli.run(["fabric", "--json", "--snapshot", str(snap), "--role", "expert", "--fabric-ip", "192.168.100.11",
                  "--no-history"])
    rep = json.loads(capsys.readouterr().out)
    g = {x["id"]: x for x in rep["gates"]}
    live = _judge(p, **EXPERT)
    assert g["fabric.rail-bandwidth"]["verdict"] == live[0].verdict == WARN
    assert g["fabric.port-counters"]["verdict"] == live[1].verdict == WARN
    assert "out_of_sequence +4" in g["fabric.port-counters"]["summary"]
    assert rep["facts"]["pair"]["bandwidth"]["gbps"] == 20.0 and rc == rep["exit_code"]
    (snap / "pair.json").write_text("{not json")
    cli.run(["fabric", "--json", "--snapshot", str(snap), "--no-history"])
    g = {x["id"]: x for x in json.loads(capsys.readouterr().out)["gates"]}
    assert g["fabric.rail-bandwidth"]["verdict"] == ERROR and "pair.json" in g["fabric.rail-bandwidth"]["summary"]


def test_saved_pair_json_parser_never_raises():
    hyp = pytest.importorskip("hypothesis")
    from hypothesis import given, settings
    from hypothesis import strategies as st

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=8))
    anyjson = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(
        st.sampled_from(["bandwidth", "counters", "delta", "per_qp", "gbps", "hw_counters", "side", "index",
                         "phases", "op", "size", "x"]), c, max_size=4)), max_leaves=25)

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(anyjson)
    def run(data):
        f = pair_facts(data)
        if f is not None:
            _judge(f, **EXPERT)
            json.dumps(to_jsonable(f))

    run()
    assert hyp


def test_playbook_bands_are_validated():
    base = "[fabric]\n"
    pb = parse(base + "rail_healthy_gbps = 80\nrail_stale_init_gbps = [8, 25]\n", "x")
    assert pb.rail_stale_init_gbps == (8.0, 25.0)
    for bad, what in (("rail_stale_init_gbps = [25, 8]", "low <= high"), ("rail_stale_init_gbps = 8", "[low, high]"),
                      ("rail_healthy_gbps = 20\nrail_stale_init_gbps = [8, 25]", "below rail_healthy_gbps"),
                      ("rail_healthy_gbps = -1", ">= 0"),
                      ("rail_healthy_gbps = 10\nrail_fail_below_gbps = 20", "above")):
        with pytest.raises(PlaybookError, match=what):
            parse(base + bad + "\n", "x.toml")


def test_lab_playbook_parses_and_has_no_stale_band():
    from conftest import REPO

    pb = parse((REPO / "lab" / "playbook-rxe.toml").read_text(), "lab/playbook-rxe.toml")
    assert pb.rail_healthy_gbps > 0 and pb.rail_stale_init_gbps == () and pb.rail_fail_below_gbps < pb.rail_healthy_gbps


def test_cli_bandwidth_usage_errors(capsys):
    assert cli.run(["fabric", "--serve", "--bandwidth"]) == 64
    assert cli.run(["fabric", "--pair", "h", "--bandwidth", "50", "--pair-timeout", "60"]) == 64
    assert "--pair-timeout of at least 70" in capsys.readouterr().err
    assert cli.run(["fabric", "--pair", "h", "--bandwidth", "--bw-qps", "64", "--bw-size", str(64 << 20)]) == 64
    assert "exceeds" in capsys.readouterr().err


def test_cli_bandwidth_without_a_device_reports_and_judges(capsys):
    rc = cli.run(["fabric", "--pair", "127.0.0.1:9", "--bandwidth", "--json", "--fabric-ip", "10.1.1.1",
                  "--pair-timeout", "25", "--role", "expert"])
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "bandwidth" and out["error"] and out["bandwidth"]["stage"] == "handshake"
    g = {x["id"]: x for x in out["report"]["gates"]}
    assert set(g) == set(PAIR_GATES)
    assert g["fabric.rail-bandwidth"]["verdict"] == ERROR and rc == out["report"]["exit_code"] != 0


# --- the lab's recorded runs (tests/fixtures/lab-rail: one rail boot's pair-test JSON, see lab/README.md) ---


def _lab_replay(tmp_path, name: str, *role_args: str) -> dict:
    import shutil

    from conftest import REPO

    snap = tmp_path / name
    snap.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "lab-rail" / f"{name}.json", snap / "pair.json")
    args = list(role_args) or ["--playbook", str(REPO / "lab" / "playbook-rxe.toml")]
    from click.testing import CliRunner

    res = CliRunner().invoke(cli.cli, ["fabric", "--json", "--no-history", "--snapshot", str(snap)] + args,
                             catch_exceptions=False)
    return {g["id"]: g for g in json.loads(res.stdout)["gates"]}


def test_lab_run_replays_pass_with_the_lab_band_and_names_rxe_retransmissions(tmp_path):
    g = _lab_replay(tmp_path, "bw-client")
    rb, pc = g["fabric.rail-bandwidth"], g["fabric.port-counters"]
    assert rb["verdict"] == PASS and rb["facts"]["gbps"] > rb["facts"]["bands_gbps"]["healthy"] > 0
    assert rb["facts"]["bands_gbps"]["role"] == "lab-rxe" and rb["facts"]["verified"]
    # that boot's rxe retransmitted under TCG: one completer retry on the client, duplicates at the server
    assert pc["verdict"] == WARN
    assert "completer_retry_err +1" in pc["summary"] and "duplicate_request +40" in pc["summary"]
    sides = {s["side"]: s for s in pc["facts"]["sides"]}
    assert sides["local"]["counters_read"] >= 17 and sides["peer"]["device"] == "rxrb"


def test_lab_run_under_the_expert_bands_is_far_below_without_power_advice(tmp_path):
    rb = _lab_replay(tmp_path, "bw-client", "--role", "expert")["fabric.rail-bandwidth"]
    assert rb["verdict"] == FAIL and rb["facts"]["band"] == "far-below" and rb["action"] == "CHECK_FABRIC"
    assert "reboot the node" not in rb["remedy"]


def test_lab_fault_replays_fail_with_the_stop_and_the_retries(tmp_path):
    g = _lab_replay(tmp_path, "bw-fault-client")
    rb, pc = g["fabric.rail-bandwidth"], g["fabric.port-counters"]
    assert rb["verdict"] == FAIL and "the run stopped" in rb["summary"] and "no ACK" in rb["summary"]
    assert pc["verdict"] == WARN and "completer_retry_err +576" in pc["summary"]
    s = _lab_replay(tmp_path, "bw-fault-server")["fabric.rail-bandwidth"]
    assert s["verdict"] == FAIL and "client's end of the run never arrived" in s["summary"]
