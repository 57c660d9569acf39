"""Rail gates pinned on a pair test's result as the pair probe records it (PairFacts): the rate
slack on both sides (a Gb/s that follows from bytes and seconds, a payload rate against the link's
speed), the role's bandwidth bands at their edges with each band's typed action, port counters at
zero and one (a link flap is FIX_LINK), link speed at half and at the expectation, and the
preambles (a pair result that could not be read, a test that stopped on this host)."""

from __future__ import annotations

import pytest

from afddiag.model.pair import BandwidthRun, PairFacts, PortCounters, RailQp
from afddiag.playbook import Playbook
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN
from fakes import judge, observation

BANDS = Playbook(name="expert", rail_healthy_gbps=180.0, rail_stale_init_gbps=(90.0, 110.0),
                 rail_fail_below_gbps=50.0, link_speed_mbps=200000)
NO_STALE = Playbook(name="expert", rail_healthy_gbps=180.0, rail_fail_below_gbps=50.0, link_speed_mbps=200000)


def run(gbps: float, seconds: float = 10.0, counters=None, **kw) -> BandwidthRun:
    """A finished run whose bytes follow from ``gbps`` and ``seconds`` exactly."""
    kw.setdefault("bytes", int(round(gbps * 1e9 * seconds / 8)))
    return BandwidthRun(seconds_asked=seconds, size=65536, qps=4, depth=16, stage=kw.pop("stage", "done"),
                        seconds=seconds, gbps=gbps, verified=kw.pop("verified", True),
                        counters=counters if counters is not None else [PortCounters(read=True, device="mlx5_0",
                                                                                     port=1, delta={})], **kw)


def pair(bw: BandwidthRun | None, speed: int | None = 200000, **kw) -> PairFacts:
    return PairFacts(role=kw.pop("role", "client"), peer="10.0.0.2:18515", device="mlx5_0", port=1,
                     fabric_ip="10.0.0.1", netdev="enp1", link_speed_mbps=speed, mode="bandwidth", bandwidth=bw, **kw)


def rail(p: PairFacts, pb: Playbook = BANDS, gate_id: str = "fabric.rail-bandwidth"):
    return judge(gate_id, observation(pair=p), playbook=pb)


# ---------------------------------------------------------------- the rate slack

def test_a_gbps_within_the_rate_slack_of_bytes_and_seconds_is_judged():
    bw = run(100.0, bytes=125_000_000_000)  # 100 Gb/s from bytes and seconds
    bw.gbps = 102.0  # 2 % off: within the slack
    assert rail(pair(bw), NO_STALE).verdict == WARN
    bw.gbps = 98.0
    assert rail(pair(bw), NO_STALE).verdict == WARN
    bw.gbps = 102.01
    v = rail(pair(bw), NO_STALE)
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert "102.01 Gb/s does not follow from 125000000000 bytes in 10 s (100 Gb/s)" in v.summary
    assert v.summary.endswith("the result was edited or corrupted")
    bw.gbps = 97.99
    assert rail(pair(bw), NO_STALE).verdict == ERROR


def test_a_payload_rate_above_the_links_speed_by_more_than_the_slack_is_impossible():
    assert rail(pair(run(102.0), speed=100000), NO_STALE).verdict == WARN  # 2 % above the line rate: rounding
    v = rail(pair(run(102.1), speed=100000), NO_STALE)
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert "102.1 Gb/s of payload is faster than the link's negotiated 100000 Mb/s" in v.summary
    assert rail(pair(run(102.1), speed=-1), NO_STALE).verdict == WARN  # SPEED_UNKNOWN: not compared


@pytest.mark.parametrize("edit, words", [
    ({"bytes": -1}, "bytes -1 is negative"), ({"gbps": -1.0}, "gbps -1 is negative"),
    ({"seconds": 0.0}, "seconds 0 is not a duration"), ({"bytes": 0}, "100 Gb/s with no byte moved"),
    ({"seconds": None}, "bytes moved but no duration"), ({"gbps": None}, "but no Gb/s figure"),
    ({"per_qp": [RailQp(0, bytes=-5)]}, "a QP's bytes are negative (-5)")])
def test_figures_that_cannot_all_be_true(edit, words):
    bw = run(100.0)
    for k, val in edit.items():
        setattr(bw, k, val)
    v = rail(pair(bw))
    assert (v.verdict, v.action) == (ERROR, "RERUN") and words in v.summary
    v = rail(pair(bw, role="server"))
    assert v.summary.endswith("they are the client's, as it reported them")


def test_inconsistent_figures_of_a_run_that_stopped_are_the_stop():
    bw = run(100.0, error="IBV_WC_RETRY_EXC_ERR on QP 3", stage="run")
    bw.seconds = 0.0
    v = rail(pair(bw))
    assert (v.verdict, v.action) == (FAIL, "CHECK_FABRIC")
    assert "the run stopped: IBV_WC_RETRY_EXC_ERR on QP 3 (its figures are not judged" in v.summary


# ---------------------------------------------------------------- the role's bands

@pytest.mark.parametrize("gbps, verdict, action, band", [
    (180.0, PASS, "NONE", "healthy"), (179.9, WARN, "CHECK_FABRIC", "below"),
    (110.0, FAIL, "REBOOT", "stale-init"), (110.1, WARN, "CHECK_FABRIC", "below"),
    (90.0, FAIL, "REBOOT", "stale-init"), (89.9, WARN, "CHECK_FABRIC", "below"),
    (50.0, WARN, "CHECK_FABRIC", "below"), (49.9, FAIL, "CHECK_FABRIC", "far-below")])
def test_bandwidth_band_edges(gbps, verdict, action, band):
    v = rail(pair(run(gbps)))
    assert (v.verdict, v.action, v.facts["band"]) == (verdict, action, band)


def test_the_stale_signature_needs_a_link_at_speed_and_no_error_counter():
    v = rail(pair(run(100.0), speed=None))
    assert (v.verdict, v.action, v.facts["band"]) == (FAIL, "CHECK_FABRIC", "stale-unconfirmed")
    v = rail(pair(run(100.0), speed=100000))  # a 100G link explains 100 Gb/s
    assert (v.verdict, v.facts["band"]) == (WARN, "below")
    assert "the link 100000 Mb/s is below the role's 200000 Mb/s (fabric.link-speed)" in v.summary
    grew = [PortCounters(read=True, device="mlx5_0", port=1, delta={"hw_counters": {"out_of_sequence": 1}})]
    v = rail(pair(run(100.0, counters=grew)))
    assert (v.verdict, v.facts["band"]) == (WARN, "below") and "error counters grew during the run" in v.summary
    zero = [PortCounters(read=True, device="mlx5_0", port=1, delta={"hw_counters": {"out_of_sequence": 0}})]
    assert rail(pair(run(100.0, counters=zero))).facts["band"] == "stale-init"


def test_no_band_and_runs_that_did_not_finish():
    v = rail(pair(run(10.0)), Playbook(name="generic"))
    assert (v.verdict, v.action) == (PASS, "NONE") and "role generic sets no band" in v.summary
    v = rail(pair(run(180.0, verified=False)))
    assert (v.verdict, v.action) == (FAIL, "CHECK_FABRIC") and "does not hold what each QP wrote" in v.summary
    v = rail(pair(run(180.0, error="peer closed")))
    assert (v.verdict, v.action) == (FAIL, "CHECK_FABRIC") and ": peer closed" in v.summary
    none = BandwidthRun(stage="setup", error="ibv_modify_qp RTR: EINVAL")
    v = rail(pair(none))
    assert (v.verdict, v.action) == (FAIL, "CHECK_FABRIC")
    assert "no RDMA WRITE completed (ibv_modify_qp RTR: EINVAL, stage setup)" in v.summary
    v = rail(pair(none, role="server"))
    assert (v.verdict, v.action) == (FAIL, "CHECK_FABRIC") and "the client's end of the run never arrived" in v.summary
    v = rail(pair(BandwidthRun(stage="handshake", error="peer refused the mode")))
    assert (v.verdict, v.action) == (ERROR, "RERUN") and "not measured: peer refused the mode" in v.summary


def test_pair_preambles():
    for gate_id in ("fabric.rail-bandwidth", "fabric.port-counters"):
        v = judge(gate_id, observation(pair=PairFacts(role="client", failed="pair.json: not JSON")), playbook=BANDS)
        assert (v.verdict, v.action) == (ERROR, "RERUN") and v.summary == "not judged: pair.json: not JSON"
        v = judge(gate_id, observation(), playbook=BANDS)
        assert v.verdict == SKIP and v.summary.startswith("no bandwidth run in this command")
        v = judge(gate_id, observation("snapshot /tmp/s"), playbook=BANDS)
        assert v.summary.startswith("the snapshot holds no pair-test result")
        v = judge(gate_id, observation(pair=pair(None)), playbook=BANDS)
        assert v.verdict == SKIP and "short SEND/WRITE phases only" in v.summary
    stopped = pair(None, local_error="no RDMA device carries 10.0.0.1")
    v = rail(stopped)
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    assert v.summary == ("rail mlx5_0 port 1 (10.0.0.1 <-> 10.0.0.2): not measured: stopped on this host before "
                         "contacting the peer: no RDMA device carries 10.0.0.1")
    v = rail(stopped, gate_id="fabric.port-counters")  # one fault, named once
    assert (v.verdict, v.action) == (SKIP, "NONE")


# ---------------------------------------------------------------- fabric.port-counters

def counters(**delta) -> list[PortCounters]:
    return [PortCounters(read=True, device="mlx5_0", port=1, delta={"hw_counters": delta}),
            PortCounters(side="peer", read=True, device="mlx5_1", port=1, delta={"hw_counters": {}})]


def test_port_counters_at_zero_and_one():
    v = rail(pair(run(180.0, counters=counters(out_of_sequence=0, rx_write_requests=9))),
             gate_id="fabric.port-counters")
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == ("rail mlx5_0 port 1 (10.0.0.1 <-> 10.0.0.2): no error counter grew during the 10.0 s run "
                         "(local mlx5_0 port 1: 2 counters; peer mlx5_1 port 1: 0 counters)")
    v = rail(pair(run(180.0, counters=counters(out_of_sequence=1))), gate_id="fabric.port-counters")
    assert (v.verdict, v.action) == (WARN, "CHECK_FABRIC")
    assert "error counters grew during the 10.0 s run: local mlx5_0 port 1: out_of_sequence +1" in v.summary
    v = rail(pair(run(180.0, counters=counters(link_downed=1))), gate_id="fabric.port-counters")
    assert (v.verdict, v.action) == (WARN, "FIX_LINK")


def test_port_counters_congestion_unknown_one_side_and_unread():
    v = rail(pair(run(180.0, counters=counters(np_cnp_sent=3, some_new_counter=2))), gate_id="fabric.port-counters")
    assert v.verdict == PASS
    assert "congestion signals (the fabric paced the traffic, not a port error): local mlx5_0 port 1: np_cnp_sent +3" \
        in v.summary
    assert "changed, not judged (names afddiag does not know): local mlx5_0 port 1: some_new_counter +2" in v.summary
    v = rail(pair(run(180.0, counters=counters()[:1])), gate_id="fabric.port-counters")
    assert v.summary.endswith("; the peer's counters were not received")
    unread = [PortCounters(read=False, notes=["hw_counters: EACCES"])]
    v = rail(pair(run(180.0, counters=unread)), gate_id="fabric.port-counters")
    assert (v.verdict, v.summary) == (SKIP, "rail mlx5_0 port 1 (10.0.0.1 <-> 10.0.0.2): port counters not read "
                                            "around the run (hw_counters: EACCES)")
    v = rail(pair(run(180.0, counters=[], stage="setup")), gate_id="fabric.port-counters")
    assert v.summary.endswith("(the run stopped at stage setup)")


# ---------------------------------------------------------------- fabric.link-speed

def speed_host(mbps, errno_=None, source="live"):
    from afddiag.model.fabric import FabricFacts, Gid, Netdev, Port, RdmaDevice

    gid = Gid(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2", "enp1", "10.0.0.1")
    f = FabricFacts(devices=[RdmaDevice("mlx5_1", 0, ports=[Port(1, "ACTIVE", "LinkUp", "Ethernet", "200 Gb/sec",
                                                                 [gid])])],
                    netdevs={"enp1": Netdev("enp1", 9000, "up", ["10.0.0.1/24"], speed_mbps=mbps,
                                            speed_errno=errno_)}, order_source="netlink")
    return observation(source, fabric=f)


@pytest.mark.parametrize("mbps, verdict, action", [
    (200000, PASS, "NONE"), (199999, WARN, "FIX_LINK"), (100001, WARN, "FIX_LINK"), (100000, FAIL, "FIX_LINK"),
    (400000, PASS, "NONE")])
def test_link_speed_edges_at_the_expectation_and_half_of_it(mbps, verdict, action):
    v = judge("fabric.link-speed", speed_host(mbps), playbook=BANDS)
    assert (v.verdict, v.action) == (verdict, action)
    assert v.summary.startswith("enp1 (mlx5_1 port 1, fabric IP 10.0.0.1): negotiated")


def test_link_speed_unread_unknown_and_no_expectation():
    v = judge("fabric.link-speed", speed_host(None, 22), playbook=BANDS)
    assert (v.verdict, v.action) == (SKIP, "NONE")
    assert v.summary.endswith("negotiated speed not read: the kernel refused the read (EINVAL), as it does while the "
                              "link is down")
    v = judge("fabric.link-speed", speed_host(None, None, "snapshot /tmp/s"), playbook=BANDS)
    assert v.summary.endswith("not read: not captured in this snapshot (no sys/class/net/enp1/speed)")
    v = judge("fabric.link-speed", speed_host(None, 13), playbook=BANDS)
    assert v.summary.endswith("not read: reading sys/class/net/enp1/speed failed (EACCES: Permission denied)")
    v = judge("fabric.link-speed", speed_host(-1), playbook=BANDS)
    assert v.verdict == SKIP and "SPEED_UNKNOWN" in v.summary
    v = judge("fabric.link-speed", speed_host(25000))
    assert (v.verdict, v.action) == (PASS, "NONE") and v.summary.endswith("(role generic sets no expected speed)")
