"""Pair-test facts: the phases of ``afddiag fabric --pair/--serve``, its bandwidth run over one rail and
the port counters around it.

Data only (no I/O). Sources: the pair test (:mod:`afddiag.probes.pair`: pyverbs RC QPs, a TCP
handshake), the port's ``/sys/class/infiniband/<dev>/ports/<p>/{hw_counters,counters}/*`` and the
netdev's ``/sys/class/net/<if>/carrier_changes`` (:mod:`afddiag.probes.counters`). Units in field
names or comments: bytes, seconds, µs, GB/s (1e9 bytes/s) for the short phases, Gb/s (1e9 bits/s of
payload) for the bandwidth run.

A rail is one RDMA device/port and the fabric IP its RoCE v2 GID carries; one pair session tests one
rail (``--fabric-ip`` picks it on each side).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# --- what each port counter means -------------------------------------------------------------------

ERROR, CONGESTION, TRAFFIC, UNKNOWN = "error", "congestion", "traffic", "unknown"

#: Counter name → kind, for the names of mlx5 (ConnectX: ``hw_counters/``, the IB PMA ``counters/``) and
#: rxe (soft-RoCE ``hw_counters/``), and the netdev's ``carrier_changes``. "error": growth under a
#: bandwidth run is a fault signal (retransmissions, sequence errors, timeouts, link flaps);
#: "congestion": the fabric paced the traffic (ECN marks, CNPs, transmit wait), not a port error;
#: "traffic": normal activity. A name not here is reported, never judged. Sources: Linux
#: drivers/infiniband/hw/mlx5/counters.c (q counters, congestion counters), NVIDIA's "Understanding mlx5
#: Linux counters" notes, drivers/infiniband/sw/rxe/rxe_hw_counters.c, IBTA PortCounters (the
#: ``counters/`` attributes of ib_core's sysfs).
COUNTER_KINDS: dict[str, str] = {
    # mlx5 q counters (hw_counters/)
    **dict.fromkeys(("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "rnr_nak_retry_err",
                     "implied_nak_seq_err", "out_of_buffer", "duplicate_request", "resp_local_length_error",
                     "resp_cqe_error", "req_cqe_error", "req_remote_invalid_request", "req_remote_access_errors",
                     "resp_remote_access_errors", "resp_cqe_flush_error", "req_cqe_flush_error",
                     "req_rnr_retries_exceeded", "req_transport_retries_exceeded", "roce_adp_retrans",
                     "roce_adp_retrans_to", "roce_slow_restart", "roce_slow_restart_trans",
                     "rx_icrc_encapsulated"), ERROR),
    **dict.fromkeys(("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
                     "roce_slow_restart_cnps"), CONGESTION),
    **dict.fromkeys(("rx_write_requests", "rx_read_requests", "rx_atomic_requests", "rx_dct_connect"), TRAFFIC),
    # IBTA PortCounters (counters/)
    **dict.fromkeys(("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                     "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
                     "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
                     "excessive_buffer_overrun_errors", "VL15_dropped"), ERROR),
    "port_xmit_wait": CONGESTION,
    **dict.fromkeys(("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets",
                     "unicast_xmit_packets", "unicast_rcv_packets", "multicast_xmit_packets",
                     "multicast_rcv_packets", "port_unicast_xmit_packets", "port_unicast_rcv_packets",
                     "port_multicast_xmit_packets", "port_multicast_rcv_packets"), TRAFFIC),
    # rxe (hw_counters/)
    **dict.fromkeys(("out_of_seq_request", "rcvd_rnr_err", "send_rnr_err", "rcvd_seq_err", "retry_exceeded_err",
                     "retry_rnr_exceeded_err", "completer_retry_err", "send_err"), ERROR),
    **dict.fromkeys(("sent_pkts", "rcvd_pkts", "rdma_sends", "rdma_recvs", "sent_bytes", "rcvd_bytes",
                     "ack_deferred"), TRAFFIC),
    # the netdev (/sys/class/net/<if>/carrier_changes)
    "carrier_changes": ERROR,
}

#: Error counters whose growth says the link itself went down (cable, transceiver), not packet loss.
LINK_FLAPS = frozenset({"link_downed", "carrier_changes", "link_error_recovery"})

#: Files of a ``hw_counters/`` folder that are not counters (ib_core's stats-cache lifespan, ms).
NOT_COUNTERS = frozenset({"lifespan"})


def counter_kind(name: str) -> str:
    """``"error"``, ``"congestion"``, ``"traffic"`` or ``"unknown"`` for a port counter's name (see
    :data:`COUNTER_KINDS`). Pure."""
    return COUNTER_KINDS.get(name, UNKNOWN)


# --- the facts ------------------------------------------------------------------------------------


@dataclass
class PairPhase:
    """One measured phase of the short pair test: ``op`` "send" or "write" at ``size`` bytes."""

    op: str
    size: int
    iters: int = 0
    rtt_us_median: float | None = None  # round trip, microseconds
    rtt_us_min: float | None = None
    bw_count: int = 0
    bw_gbps: float | None = None  # GB/s (1e9 bytes per second) of payload
    verified: bool = False  # the bytes arrived as sent (server check; echo check for send)
    error: str | None = None


@dataclass
class PortCounters:
    """One port's counters over the bandwidth run. ``delta[group][name]`` = after − before for every
    counter read both times (zero deltas included): group ``hw_counters`` and ``counters``
    (``/sys/class/infiniband/<device>/ports/<port>/{hw_counters,counters}/<name>``) and ``netdev``
    (``/sys/class/net/<netdev>/carrier_changes``). ``side`` is "local" (this host's port) or "peer"
    (the other side's, as its afddiag reported it over the handshake)."""

    side: str = "local"
    device: str | None = None
    port: int | None = None
    netdev: str | None = None
    read: bool = False  # read before and after the run
    delta: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # unreadable files, counters that went backwards

    def counters(self) -> dict[str, int]:
        """``{name: delta}`` over the groups (a ``counters/`` name shadowed by the same
        ``hw_counters/`` name keeps the larger growth)."""
        out: dict[str, int] = {}
        for group in ("netdev", "counters", "hw_counters"):
            for k, v in self.delta.get(group, {}).items():
                out[k] = max(out.get(k, v), v)
        return out


@dataclass
class RailQp:
    """One RC QP of the bandwidth run: completed RDMA WRITEs, payload bytes, Gb/s (1e9 bits/s)."""

    index: int
    qp_num: int | None = None
    peer_qp_num: int | None = None
    writes: int = 0
    bytes: int = 0
    gbps: float | None = None


@dataclass
class BandwidthRun:
    """The bounded bandwidth run over one rail: ``qps`` RC QPs, each kept ``depth`` RDMA WRITEs of
    ``size`` bytes deep for ``seconds_asked`` seconds. ``gbps`` = payload bits / ``seconds`` / 1e9
    (``seconds``: first post to last completion). ``stage`` says how far it got: "handshake" (the peer
    agreed to the mode), "setup" (QPs, MR, RTR/RTS), "run", "verify" (the peer checked its buffer),
    "done". ``error`` says why it stopped early."""

    seconds_asked: float = 0.0
    size: int = 0  # bytes per RDMA WRITE
    qps: int = 0
    depth: int = 0  # WRITEs kept outstanding per QP
    stage: str = "handshake"
    seconds: float | None = None
    bytes: int = 0  # payload bytes of the completed WRITEs
    gbps: float | None = None  # Gb/s: 1e9 bits per second of payload
    per_qp: list[RailQp] = field(default_factory=list)
    verified: bool = False  # the peer's buffer holds what each QP wrote
    error: str | None = None
    counters: list[PortCounters] = field(default_factory=list)  # "local", and "peer" when it reported


#: Refused connections a pair server's facts list (the rest are counted in ``refused_total``): a port
#: scan of every port must not grow a report.
REFUSED_KEPT = 32


@dataclass
class RefusedConnection:
    """A TCP connection the pair server refused before any session (``afddiag fabric --serve``): who
    (``address``:``port``, as the socket saw it), when (``at``: UTC, ISO 8601; ``after_s``: seconds
    after the server started) and why (not the expected ``--peer``, no or a wrong pair key, no
    afddiag handshake: a port scan, a swapped cable, a client of the wrong rail)."""

    address: str
    port: int
    at: str
    after_s: float
    reason: str


@dataclass
class PairFacts:
    """The pair test's result on one side (``mode`` "phases": the short SEND/WRITE phases;
    "bandwidth": the bandwidth run)."""

    role: str  # "server" or "client"
    peer: str | None = None  # the other side's address (TCP)
    device: str | None = None
    port: int | None = None
    gid_index: int | None = None
    gid: str | None = None
    fabric_ip: str | None = None
    qp_num: int | None = None
    peer_qp_num: int | None = None
    peer_gid: str | None = None
    path_mtu: int | None = None  # bytes
    phases: list[PairPhase] = field(default_factory=list)
    error: str | None = None
    elapsed_s: float = 0.0
    destroyed: bool = True
    notes: list[str] = field(default_factory=list)
    mode: str = "phases"
    netdev: str | None = None  # the GID's netdev (the rail's)
    link_speed_mbps: int | None = None  # /sys/class/net/<netdev>/speed at the start, Mb/s (-1 unknown)
    bandwidth: BandwidthRun | None = None
    failed: str | None = None  # a saved result that could not be read (its gates say ERROR)
    local_error: str | None = None  # the test stopped on this host before contacting the peer (no RDMA
    # device/GID carries the fabric IP here, pyverbs missing, the device would not open): the peer is not at fault
    expected_peer: str | None = None  # the server: the one client address it accepts (--peer)
    pair_key: bool = False  # both sides proved the shared key (HMAC-SHA256 challenge-response, --pair-key)
    refused: list[RefusedConnection] = field(default_factory=list)  # the server: the first REFUSED_KEPT refused
    refused_total: int = 0  # every connection the server refused (the list keeps the first ones)
    registered_bytes_peak: int = 0  # the server: most bytes of memory registered (MRs) at once in the session
    qps_peak: int = 0  # the server: most QPs held at once in the session


# --- JSON (a saved `afddiag fabric --pair ... --json`) → facts; never raises --------------------------


def _json_kind(x: Any) -> str:
    """The JSON type name of a parsed value ("array", "string", ...), for messages."""
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number", dict: "object",
            type(None): "null"}.get(type(x), type(x).__name__)


def _s(x: Any) -> str | None:
    return x[:500] if isinstance(x, str) else None


def _i(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and -(1 << 63) <= x < (1 << 63) else None


def _f(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    v = float(x) if abs(x) < 1e300 else None
    return v if v is not None and v == v and abs(v) != float("inf") else None


def _d(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def _l(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def _strs(x: Any) -> list[str]:
    return [n[:500] for n in _l(x) if isinstance(n, str)]


def port_counters(r: Any, side: str = "local") -> PortCounters | None:
    """:class:`PortCounters` from its JSON form (None when ``r`` is not an object); counters that are
    not integers are left out with a note. Never raises."""
    if not isinstance(r, dict):
        return None
    pc = PortCounters(side=_s(r.get("side")) or side, device=_s(r.get("device")), port=_i(r.get("port")),
                      netdev=_s(r.get("netdev")), read=r.get("read") is True, notes=_strs(r.get("notes")))
    for group, vals in _d(r.get("delta")).items():
        if not isinstance(group, str) or not isinstance(vals, dict):
            continue
        kept = {}
        for k, v in vals.items():
            if isinstance(k, str) and _i(v) is not None and v < 0:
                pc.notes.append(f"{group}/{k[:80]}: a negative delta ({v}): the counter went back (reset or wrap); "
                                "not judged")
            elif isinstance(k, str) and _i(v) is not None:
                kept[k[:200]] = v
            else:
                pc.notes.append(f"{group}/{str(k)[:80]}: not an integer delta ({str(v)[:40]!r}); left out")
        pc.delta[group[:50]] = kept
    return pc


def bandwidth_run(r: Any) -> BandwidthRun | None:
    """:class:`BandwidthRun` from its JSON form (None when ``r`` is not an object). Never raises."""
    if not isinstance(r, dict):
        return None
    bw = BandwidthRun(seconds_asked=_f(r.get("seconds_asked")) or 0.0, size=_i(r.get("size")) or 0,
                      qps=_i(r.get("qps")) or 0, depth=_i(r.get("depth")) or 0,
                      stage=_s(r.get("stage")) or "handshake", seconds=_f(r.get("seconds")),
                      bytes=_i(r.get("bytes")) or 0, gbps=_f(r.get("gbps")), verified=r.get("verified") is True,
                      error=_s(r.get("error")))
    for q in _l(r.get("per_qp")):
        if isinstance(q, dict) and _i(q.get("index")) is not None:
            bw.per_qp.append(RailQp(index=q["index"], qp_num=_i(q.get("qp_num")), peer_qp_num=_i(q.get("peer_qp_num")),
                                    writes=_i(q.get("writes")) or 0, bytes=_i(q.get("bytes")) or 0,
                                    gbps=_f(q.get("gbps"))))
    for c in _l(r.get("counters")):
        pc = port_counters(c)
        if pc is not None:
            bw.counters.append(pc)
    return bw


def pair_facts(r: Any) -> PairFacts | None:
    """:class:`PairFacts` from the pair test's JSON (``afddiag fabric --pair/--serve --json``, live or
    saved into a snapshot); None when ``r`` is not an object. Odd values become None; never raises."""
    if not isinstance(r, dict):
        return None
    f = PairFacts(role=_s(r.get("role")) or "unknown", peer=_s(r.get("peer")), device=_s(r.get("device")),
                  port=_i(r.get("port")), gid_index=_i(r.get("gid_index")), gid=_s(r.get("gid")),
                  fabric_ip=_s(r.get("fabric_ip")), qp_num=_i(r.get("qp_num")), peer_qp_num=_i(r.get("peer_qp_num")),
                  peer_gid=_s(r.get("peer_gid")), path_mtu=_i(r.get("path_mtu")), error=_s(r.get("error")),
                  elapsed_s=_f(r.get("elapsed_s")) or 0.0, destroyed=r.get("destroyed") is not False,
                  notes=_strs(r.get("notes")), mode=_s(r.get("mode")) or "phases", netdev=_s(r.get("netdev")),
                  link_speed_mbps=_i(r.get("link_speed_mbps")), bandwidth=bandwidth_run(r.get("bandwidth")),
                  local_error=_s(r.get("local_error")), expected_peer=_s(r.get("expected_peer")),
                  pair_key=r.get("pair_key") is True, refused_total=max(0, _i(r.get("refused_total")) or 0),
                  registered_bytes_peak=max(0, _i(r.get("registered_bytes_peak")) or 0),
                  qps_peak=max(0, _i(r.get("qps_peak")) or 0))
    for c in _l(r.get("refused"))[:REFUSED_KEPT]:
        if isinstance(c, dict):
            f.refused.append(RefusedConnection(address=_s(c.get("address")) or "unknown", port=_i(c.get("port")) or 0,
                                               at=_s(c.get("at")) or "unknown", after_s=_f(c.get("after_s")) or 0.0,
                                               reason=_s(c.get("reason")) or "not recorded"))
    raw_bw = r.get("bandwidth")
    if raw_bw is not None and not isinstance(raw_bw, dict):
        f.failed = (f"the saved pair-test result's bandwidth is a JSON {_json_kind(raw_bw)}, not the bandwidth "
                    "run's object: save the output of `afddiag fabric --pair HOST --bandwidth --json` unedited")
    for p in _l(r.get("phases")):
        if isinstance(p, dict) and isinstance(p.get("op"), str) and _i(p.get("size")) is not None:
            f.phases.append(PairPhase(op=p["op"][:20], size=p["size"], iters=_i(p.get("iters")) or 0,
                                      rtt_us_median=_f(p.get("rtt_us_median")), rtt_us_min=_f(p.get("rtt_us_min")),
                                      bw_count=_i(p.get("bw_count")) or 0, bw_gbps=_f(p.get("bw_gbps")),
                                      verified=p.get("verified") is True, error=_s(p.get("error"))))
    return f
