"""Host-to-host RDMA pair test: two RC QPs, one on each host, connected through a TCP handshake,
moving RDMA SEND and RDMA WRITE messages from 64 bytes up to and past the path MTU.

``afddiag fabric --serve --peer CLIENT_IP [--port N]`` on one host and ``afddiag fabric --pair
HOST[:PORT]`` on the other. The TCP connection carries the handshake (QP number, GID, PSN, buffer
address and rkey, active MTU) and the control of each phase as JSON lines; the data moves over RDMA
only:

- ``send`` ping-pong: the client SENDs a message of ``size`` bytes, the server receives it, checks
  its bytes and SENDs it back; the client checks the echo. Round-trip latency per message (µs).
- ``send`` stream: the client posts ``count`` SENDs back to back (the server pre-posted as many
  receives); bandwidth = bytes / time until the last send completion (RC: the last ACK), GB/s.
- ``write``: one signalled RDMA WRITE at a time (latency = post → completion, i.e. the remote ACK's
  round trip), then ``count`` WRITEs back to back (bandwidth); the server then checks that its
  buffer holds the written bytes.

Sizes default to 64 B … 64 KiB: one packet up to several path MTUs (1024 B on a 1500-byte netdev,
4096 B at MTU 9000). Everything is bounded by a deadline (``timeout_s``); every QP, CQ, MR, PD and
device context is destroyed (``PairFacts.destroyed``). Never raises: failures become ``error``.

The bandwidth run (``--pair HOST --bandwidth [SECONDS]``, instead of the phases): ``qps`` more RC
QPs (default 4) on each side, each kept ``depth`` (8) signalled RDMA WRITEs of ``size`` bytes
(1 MiB) deep for ``seconds`` (5 s), like ``ib_write_bw -q 4 -s 1048576 -D 5``; Gb/s = payload bits /
(first post → last completion) / 1e9, overall and per QP; the server checks that each QP's slot of
its buffer holds that QP's pattern. Around it each side reads its port's counters
(:mod:`afddiag.probes.counters`) and sends its deltas to the other, so both sides' facts hold both
ports'. One rail (device/port, the fabric IP's GID) per session: run one session per ``--fabric-ip``.

The server as a listener (:class:`_Admission`): it admits one session, from the ``--peer`` address
only, once that client's hello is valid and (with ``--pair-key``) its proof is right; every other
connection is refused with one ``{"error"}`` line and recorded in ``PairFacts.refused`` (address, port,
UTC time, reason), and the server keeps listening until its deadline. Connections at the door are read
without blocking (a selector, :data:`ADMIT_S` each). A session holds at most
:data:`SESSION_MAX_REGISTERED` bytes registered and :data:`SESSION_MAX_QPS` QPs (one bandwidth run, its
objects destroyed when it ends); waits for completions sleep after :data:`POLL_SPIN_S`; every read and
write of the control channel ends at the session deadline.

The pair key (protocol 3): the client's hello carries ``nonce`` (32 random bytes, hex); the server
answers ``{"op": "challenge", nonce}``; the client sends ``{"op": "auth", mac}`` = HMAC-SHA256(key,
"client proof" label + server nonce + client nonce + the client hello's QP fields); the server checks
it (``hmac.compare_digest``) and its hello carries ``mac`` = HMAC-SHA256(key, "server proof" label +
client nonce + server nonce + its own QP fields), which the client checks (:func:`_mac`). Fresh nonces
per connection: a recorded proof opens nothing; the QP fields covered: a relay cannot redirect the QPs.

Handshake protocol 2 (compatible): the client's first line says ``"proto": 2, "mode": "phases" |
"bandwidth"``, the server's says ``"proto": 2, "modes": [...]``. A protocol-1 server (no ``modes``)
is told ``bye`` and the client's ``error`` names it: no hang. A protocol-1 client never asks for the
bandwidth run. Bandwidth messages: ``{"op": "bandwidth", seconds, size, qps, depth, peers: [{qpn,
psn}]}`` → ``{qps: [{qpn, psn}], addr, rkey, len}`` or ``{"error"}``; ``{"op": "bw_done", seconds,
bytes, gbps, error, per_qp, seeds, counters}`` → ``{ok, counters}``.

Sources: ``ibv_rc_pingpong(1)`` and ``ib_send_lat``/``ib_write_bw`` (perftest) for the method;
rdma-core ``tests/utils.py`` for pyverbs usage (``SendWR``, ``RecvWR``, ``SGE``, ``set_wr_rdma``).
Command-line equivalent (roughly): ``ibv_rc_pingpong -d <dev> -g <gid-index> -s <size> [host]``.

Parts in their own modules, their names importable from here as before: the control channel, handshake checks
and pair key (:mod:`~afddiag.probes.pair_wire`), the pyverbs objects and polling (:mod:`~afddiag.probes.pair_rdma`),
the server's admission (:mod:`~afddiag.probes.pair_admit`), the text form (:mod:`~afddiag.probes.pair_text`).
"""

from __future__ import annotations

import hmac
import secrets
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Any

from afddiag import endpoint
from afddiag.model import to_jsonable
from afddiag.model.fabric import FabricFacts
from afddiag.model.nic import NicFacts
from afddiag.model.pair import REFUSED_KEPT as REFUSED_KEPT
from afddiag.model.pair import (
    BandwidthRun,
    PairFacts,
    PairPhase,
    PortCounters,
    RailQp,
    bandwidth_run,
    port_counters,
)
from afddiag.probes.counters import port_delta, read_port_counters
from afddiag.probes.pair_admit import ADMIT_MAX_LINE as ADMIT_MAX_LINE
from afddiag.probes.pair_admit import ADMIT_PENDING, _Admission, _expected_address
from afddiag.probes.pair_rdma import POLL_SLEEP_MAX_S as POLL_SLEEP_MAX_S
from afddiag.probes.pair_rdma import POLL_SPIN_S as POLL_SPIN_S
from afddiag.probes.pair_rdma import QUEUE_DEPTH, _Rdma, _wc_status
from afddiag.probes.pair_rdma import WC_STATUS as WC_STATUS
from afddiag.probes.pair_rdma import idle_wait as idle_wait
from afddiag.probes.pair_text import format_pair as format_pair
from afddiag.probes.pair_wire import AUTH_BOUND as AUTH_BOUND
from afddiag.probes.pair_wire import (
    AUTH_CLIENT,
    AUTH_SERVER,
    MODES,
    NONCE_HEX,
    PROTO,
    PairError,
    _Chan,
    _mac,
    _nonce,
    _num,
    _peer_hello,
    _qp_list,
    stop_if_no_cable,
)
from afddiag.probes.pair_wire import KEY_MAX_BYTES as KEY_MAX_BYTES
from afddiag.probes.pair_wire import KEY_MIN_BYTES as KEY_MIN_BYTES
from afddiag.probes.pair_wire import MAX_MESSAGE as MAX_MESSAGE
from afddiag.probes.pair_wire import _parse_line as _parse_line
from afddiag.probes.pair_wire import load_key as load_key
from afddiag.probes.qp import _import_pyverbs, mtu_enum_to_bytes
from afddiag.progress import steps
from afddiag.termsafe import clean
from afddiag.textnum import kernel_int

DEFAULT_PORT = 18515  # ibv_rc_pingpong's
DEFAULT_SIZES = (64, 512, 1024, 4096, 65536)
LAT_ITERS = 20
BW_COUNT = 16
# The bandwidth run: payload Gb/s = 1e9 bits/s.
BW_SECONDS = 5.0  # per rail
BW_SIZE = 1 << 20  # bytes per RDMA WRITE
BW_QPS = 4
BW_DEPTH = 8  # WRITEs kept outstanding per QP
BW_LIMITS = {"seconds": (0.5, 600.0), "size": (4096, 64 << 20), "qps": (1, 64), "depth": (1, 256)}
BW_MAX_BUFFER = 256 << 20  # qps x size on each side, bytes
BW_STALL_S = 10.0  # no completion for this long while WRITEs are outstanding: the run stops
BW_DRAIN_S = 15.0  # after the run (or an error), outstanding WRITEs get this long to complete
# What one server session may hold at once: the handshake QP and its buffer (2 x 64 KiB), plus one
# bandwidth run's QPs and buffer (freed when the run ends; one run per session).
SESSION_MAX_QPS = 1 + int(BW_LIMITS["qps"][1])
SESSION_MAX_REGISTERED = 2 * max(DEFAULT_SIZES) + BW_MAX_BUFFER  # bytes of registered memory (MRs)
# Admission (before any session): the server accepts a session from the expected address only, after
# its handshake line (and, with a pair key, its proof); a connection has ADMIT_S to get there.
ADMIT_S = 10.0


@dataclass(frozen=True)
class BandwidthSpec:
    """What the bandwidth run asks: ``seconds`` of ``qps`` RC QPs each kept ``depth`` RDMA WRITEs of
    ``size`` bytes deep. :meth:`problem` says what is out of bounds."""

    seconds: float = BW_SECONDS
    size: int = BW_SIZE
    qps: int = BW_QPS
    depth: int = BW_DEPTH

    def problem(self) -> str | None:
        """None when every value is within :data:`BW_LIMITS` and ``qps * size`` ≤ :data:`BW_MAX_BUFFER`,
        else one line naming the value and its bounds."""
        for k, (lo, hi) in BW_LIMITS.items():
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                return f"bandwidth {k} {v!r} is outside {lo:g}..{hi:g}"
        if self.qps * self.size > BW_MAX_BUFFER:
            return (f"bandwidth buffer {self.qps} QPs x {self.size} bytes = {self.qps * self.size} bytes exceeds "
                    f"{BW_MAX_BUFFER} bytes: fewer QPs or smaller WRITEs")
        return None


def pick_endpoint(fabric: FabricFacts, fabric_ip: str | None) -> tuple[str, int, int, str, str]:
    """``(device, port, gid_index, gid, ip)``: :func:`afddiag.endpoint.pick_endpoint`. Raises
    :class:`PairError` when there is none or it is ambiguous."""
    try:
        return endpoint.pick_endpoint(fabric, fabric_ip)
    except ValueError as e:
        raise PairError(str(e)) from None


def _pattern(size: int, seed: int) -> bytes:
    b = bytes((seed + i) & 0xFF for i in range(256))
    return (b * (size // 256 + 1))[:size]


def _open(fabric: FabricFacts | None, fabric_ip: str | None, buf: int, facts: PairFacts) -> _Rdma:
    """This side's RDMA resources on the fabric IP's endpoint. Any failure here is this host's
    (``facts.local_error`` is set: no RDMA device at all, named first as the root; pyverbs missing; no
    device/GID carries the fabric IP; the device would not open) and is raised as :class:`PairError`
    before the peer is contacted."""
    facts.fabric_ip = fabric_ip
    try:
        if fabric is not None and fabric.captured and not fabric.failed and not fabric.devices:
            # the root: no device to open, whatever else is missing (pyverbs, a fabric IP)
            said = [n for n in fabric.notes if "infiniband" in n] or fabric.notes
            raise PairError("no RDMA device on this host" + (f" ({said[-1]})" if said else "") + ": load the "
                            "RDMA driver (mlx5_ib for ConnectX, rdma_rxe for soft-RoCE); `rdma dev` lists none")
        pv = _import_pyverbs()
        if pv is None:
            raise PairError("pyverbs is not installed: apt install python3-pyverbs")
        dev, port, gidx, gid, ip = pick_endpoint(fabric if fabric is not None else FabricFacts(), fabric_ip)
        facts.device, facts.port, facts.gid_index, facts.gid, facts.fabric_ip = dev, port, gidx, gid, ip
        facts.netdev, facts.link_speed_mbps = _rail_netdev(fabric, dev, port, gidx)
        try:
            r = _Rdma(pv, dev, port, gidx, buf)
        except PairError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise PairError(f"open {dev} / create PD, CQ, MR, QP failed: {exc}") from exc
    except PairError as e:
        facts.local_error = str(e)
        raise
    facts.qp_num = r.qp.qp_num
    return r


def _rail_netdev(fabric: FabricFacts | None, dev: str, port: int, gid_index: int) -> tuple[str | None, int | None]:
    """The netdev of ``dev``/``port``'s GID ``gid_index`` (gid_attrs/ndevs) and its speed in Mb/s
    (/sys/class/net/<if>/speed as the fabric probe read it), None where unknown."""
    if fabric is None:
        return None, None
    for d in fabric.devices:
        for p in d.ports:
            for g in p.gids:
                if d.name == dev and p.num == port and g.index == gid_index and g.netdev:
                    nd = fabric.netdevs.get(g.netdev)
                    return g.netdev, (nd.speed_mbps if nd else None)
    return None, None


def _hello(r: _Rdma, facts: PairFacts, mode: str | None = None) -> dict[str, Any]:
    """The handshake line: QP number, PSN, GID, MTU enum, buffer address/rkey/length, device, and the
    protocol version with what this side does (a client: ``mode``; a server: ``modes`` it serves).
    A peer of protocol 1 (no ``proto`` key) ignores the extra keys and knows the phases only."""
    h = {"qpn": r.qp.qp_num, "psn": r.psn, "gid": facts.gid, "mtu": int(r.mtu_enum), "addr": r.mr.buf,
         "rkey": r.mr.rkey, "len": r.mr.length, "device": facts.device, "proto": PROTO}
    if mode is None:
        h["modes"] = list(MODES)
    else:
        h["mode"] = mode
    return h


@dataclass
class SessionBudget:
    """What one server session holds at once: registered memory (bytes, every MR) and QPs, each
    capped (:data:`SESSION_MAX_REGISTERED`, :data:`SESSION_MAX_QPS`); the peaks go to the facts."""

    max_bytes: int = SESSION_MAX_REGISTERED
    max_qps: int = SESSION_MAX_QPS
    bytes: int = 0
    qps: int = 0
    peak_bytes: int = 0
    peak_qps: int = 0

    def take(self, nbytes: int, nqps: int, what: str) -> None:
        """Count ``nbytes`` and ``nqps`` more; :class:`PairError` (nothing counted) past a cap."""
        if self.bytes + nbytes > self.max_bytes or self.qps + nqps > self.max_qps:
            raise PairError(f"{what} ({nbytes} bytes registered, {nqps} QPs) would hold {self.bytes + nbytes} bytes "
                            f"and {self.qps + nqps} QPs in this session: the caps are {self.max_bytes} bytes and "
                            f"{self.max_qps} QPs")
        self.bytes, self.qps = self.bytes + nbytes, self.qps + nqps
        self.peak_bytes, self.peak_qps = max(self.peak_bytes, self.bytes), max(self.peak_qps, self.qps)

    def give(self, nbytes: int, nqps: int) -> None:
        self.bytes, self.qps = max(0, self.bytes - nbytes), max(0, self.qps - nqps)



def serve(port: int = DEFAULT_PORT, bind: str | None = None, fabric_ip: str | None = None,
          timeout_s: float = 60.0, fabric: FabricFacts | None = None, *, peer: str,
          key: bytes | None = None, nic: NicFacts | None = None) -> PairFacts:
    """Serve one pair session: listen on TCP ``bind`` (default: the fabric IP) ``port``, admit the
    client at ``peer`` (an IP address: ``--peer``) that sends an afddiag handshake and, with ``key``
    (the pair key's bytes), proves the key, then follow its phases or its one bandwidth run, tear
    down. Any other connection is refused and recorded (``facts.refused``), and the server keeps
    listening. Ends by ``timeout_s`` whatever the client does; holds at most
    :data:`SESSION_MAX_REGISTERED` bytes registered and :data:`SESSION_MAX_QPS` QPs at once.
    Returns the server's facts."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    facts = PairFacts(role="server", expected_peer=peer[:64])
    budget = SessionBudget()
    r: _Rdma | None = None
    lsock = conn = None
    try:
        expected = _expected_address(peer)
        facts.expected_peer = str(expected)
        big = max(DEFAULT_SIZES)
        budget.take(big * 2, 1, "the handshake QP and buffer")
        stop_if_no_cable(fabric, nic, fabric_ip, facts)  # a Spark's CX-7 powered off: no cable, not no driver
        r = _open(fabric, fabric_ip, big * 2, facts)
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((bind or facts.fabric_ip or "0.0.0.0", port))
        lsock.listen(ADMIT_PENDING)
        door = _Admission(lsock, expected, key, facts, t0, deadline, ADMIT_S)
        try:
            got = door.run()
        finally:
            lsock.close()  # one session: later connections are refused by the kernel
            lsock = None
        conn = got.sock
        facts.peer = str(got.addr[0])
        ch = _Chan(conn, deadline, got.rest)
        hello_out = _hello(r, facts)
        if key is not None:
            assert got.client_nonce is not None and got.server_nonce is not None
            hello_out["mac"] = _mac(key, AUTH_SERVER, got.client_nonce, got.server_nonce, hello_out)
            facts.pair_key = True
        ch.send(hello_out)
        _session(r, ch, got.hello, facts, deadline, budget)
    except PairError as e:
        facts.error = str(e)
    except Exception as e:  # noqa: BLE001 - never raise
        facts.error = f"{type(e).__name__}: {e}"
    finally:
        for s in (conn, lsock):
            if s is not None:
                s.close()
        facts.destroyed = r.close() if r else True
        facts.registered_bytes_peak, facts.qps_peak = budget.peak_bytes, budget.peak_qps
        facts.elapsed_s = round(time.monotonic() - t0, 3)
    return facts


def _session(r: _Rdma, ch: _Chan, hello: dict[str, Any], facts: PairFacts, deadline: float,
             budget: SessionBudget) -> None:
    """The server's session with the admitted client: RTS toward its QP, then each control message
    (the phases, one bandwidth run) until ``bye``. Raises :class:`PairError`."""
    facts.peer_qp_num, facts.peer_gid = hello["qpn"], hello["gid"]
    facts.path_mtu = mtu_enum_to_bytes(r.connect(hello))
    ch.send({"op": "rts"})
    while True:
        msg = ch.recv()
        op = msg.get("op")
        if op == "bye":
            break
        if op == "bandwidth":
            if facts.bandwidth is not None:
                ch.send({"error": "one bandwidth run per session: start another session for the next"})
                raise PairError("the client asked for a second bandwidth run in one session (one per session): "
                                "refused, the session ends")
            _serve_bandwidth(r, ch, msg, hello, facts, deadline, budget)
            continue
        if op not in ("send_pingpong", "send_stream", "write", "check_write"):
            raise PairError(f"unknown control message {str(msg)[:200]}")
        size = _num(msg, "size", 1, max(DEFAULT_SIZES), f"the client's {op}")
        n = _num(msg, "n", 0, QUEUE_DEPTH if op == "send_stream" else 100000, f"the client's {op}") \
            if op.startswith("send") else 0
        if op == "send_pingpong":
            big = max(DEFAULT_SIZES)
            r.post_recv(0, size)
            ch.send({"ready": True})
            bad = outstanding = 0
            for i in range(n):
                while True:  # the next message; our earlier echo's completion may come first
                    wc = r.poll(1, deadline)[0]
                    if wc.opcode & r.e.IBV_WC_RECV:
                        break
                    outstanding -= 1
                got = r.mr.read(size, 0)
                bad += got != _pattern(size, i) or wc.byte_len != size
                r.mr.write(got, size, big)  # the client sends the next only after this echo arrived
                if i + 1 < n:
                    r.post_recv(0, size)
                r.post_send(big, size)
                outstanding += 1
            if outstanding:
                r.poll(outstanding, deadline)
            ch.send({"ok": bad == 0, "bad": bad})
        elif op == "send_stream":
            for _ in range(n):
                r.post_recv(0, size)
            ch.send({"ready": True})
            wcs = r.poll(n, deadline)
            ok = all(wc.byte_len == size for wc in wcs) and r.mr.read(size, 0) == _pattern(size, 7)
            ch.send({"ok": ok, "received": len(wcs)})
        elif op == "write":
            ch.send({"ready": True})
        elif op == "check_write":
            seed = _num(msg, "seed", 0, 255, "the client's check_write")
            ch.send({"ok": r.mr.read(size, 0) == _pattern(size, seed)})


def _read_counters(facts: PairFacts) -> dict[str, Any]:
    """This side's rail counters now (:func:`afddiag.probes.counters.read_port_counters`)."""
    if not facts.device or facts.port is None:
        return {"values": {}, "notes": ["no RDMA device/port: counters not read"]}
    return read_port_counters(facts.device, facts.port, facts.netdev)


def _local_delta(facts: PairFacts, before: dict[str, Any]) -> PortCounters:
    return port_delta(before, _read_counters(facts), facts.device, facts.port, facts.netdev, "local")


def _peer_counters(raw: Any) -> PortCounters | None:
    pc = port_counters(raw, "peer")
    if pc is not None:
        pc.side = "peer"
    return pc


def bandwidth_ask(msg: dict[str, Any]) -> tuple[BandwidthSpec, str | None]:
    """The client's bandwidth ask as a :class:`BandwidthSpec` and None, or a spec of defaults and one
    line naming the first value that is missing, of the wrong type (seconds: a number; size, QPs,
    depth: integers) or out of :data:`BW_LIMITS` or the buffer cap."""
    for k, (lo, hi) in BW_LIMITS.items():
        v = msg.get(k)
        kinds = (int, float) if k == "seconds" else (int,)
        if isinstance(v, bool) or not isinstance(v, kinds) or not lo <= v <= hi:  # NaN fails the range
            return BandwidthSpec(), (f"bandwidth {k} {str(v)[:40] if k in msg else '(missing)'} is not "
                                     f"{'a number' if k == 'seconds' else 'an integer'} {lo:g}..{hi:g}")
    spec = BandwidthSpec(float(msg["seconds"]), msg["size"], msg["qps"], msg["depth"])
    return spec, spec.problem()


def _serve_bandwidth(r: _Rdma, ch: _Chan, msg: dict[str, Any], hello: dict[str, Any], facts: PairFacts,
                     deadline: float, budget: SessionBudget) -> None:
    """The server's half of the bandwidth run: check the client's ask (and the session's caps,
    ``budget``), create its QPs and MR, bring each QP to RTS toward the client's QP, answer with their
    numbers, the buffer address and rkey; wait for the client's end of run; check the buffer (each QP's
    slot holds its pattern); answer with the check and this port's counter deltas; destroy the run's
    QPs, MR and CQ. The client's figures and counters are kept in ``facts``."""
    spec, why = bandwidth_ask(msg)
    facts.mode = "bandwidth"
    bw = facts.bandwidth = (BandwidthRun(seconds_asked=spec.seconds, size=spec.size, qps=spec.qps, depth=spec.depth)
                            if why is None else BandwidthRun())  # a refused ask's values are in the error only
    peers: list[dict[str, int]] = []
    if why is None:
        try:
            peers = _qp_list(msg.get("peers"), spec.qps, "the client")
        except PairError as e:
            why = str(e)
    if why is None:
        try:
            budget.take(spec.qps * spec.size, spec.qps, "the bandwidth run")
        except PairError as e:
            why = str(e)
    if why:
        bw.error = f"refused the client's bandwidth run: {why}"
        ch.send({"error": why})
        return
    before = _read_counters(facts)
    local: PortCounters | None = None
    made: tuple[Any, ...] = ()
    try:
        bw.stage = "setup"
        cq, mr, qps, psns = r.bandwidth_objects(spec.qps, spec.depth, spec.qps * spec.size)
        made = (*qps, mr, cq)
        for i, (qp, psn) in enumerate(zip(qps, psns, strict=True)):
            r.connect({**hello, "qpn": int(peers[i]["qpn"]), "psn": int(peers[i]["psn"])}, qp, psn)
            bw.per_qp.append(RailQp(i, qp.qp_num, int(peers[i]["qpn"])))
        ch.send({"qps": [{"qpn": q.qp_num, "psn": p} for q, p in zip(qps, psns, strict=True)], "addr": mr.buf,
                 "rkey": mr.rkey, "len": mr.length})
        bw.stage = "run"
        done = ch.recv()  # the client's end of run (bounded by the session deadline)
        if done.get("op") != "bw_done":
            raise PairError(f"expected the client's end of the bandwidth run, got {str(done)[:200]}")
        bw.stage = "verify"
        sent = done["seeds"] if isinstance(done.get("seeds"), list) else []
        seeds = sent if all(isinstance(sd, int) and not isinstance(sd, bool) and 0 <= sd <= 255 for sd in sent) else []
        ok = len(seeds) == spec.qps and all(
            mr.read(spec.size, i * spec.size) == _pattern(spec.size, int(sd)) for i, sd in enumerate(seeds))
        local = _local_delta(facts, before)
        ch.send({"ok": ok, "counters": to_jsonable(local)})
        got = bandwidth_from_client(done)
        bw.seconds, bw.bytes, bw.gbps, bw.error = got.seconds, got.bytes, got.gbps, got.error
        for q, g in zip(bw.per_qp, got.per_qp, strict=False):  # the client's answer may be short
            q.writes, q.bytes, q.gbps = g.writes, g.bytes, g.gbps
        bw.verified = ok
        peer = _peer_counters(done.get("counters"))
        bw.counters = [local] + ([peer] if peer else [])
        bw.stage = "done" if bw.error is None else "run"
    except PairError as e:
        bw.error = bw.error or str(e)
        raise
    finally:
        if local is None:  # what this port saw up to the failure
            bw.counters = [_local_delta(facts, before)]
        if made and not r.release(*made):  # before anything else this session does
            facts.notes.append("a bandwidth-run QP, MR or CQ would not close after the run (tried again at the end)")
        budget.give(spec.qps * spec.size, spec.qps)


def bandwidth_from_client(done: dict[str, Any]) -> BandwidthRun:
    """The client's figures from its end-of-run message (bytes, seconds, Gb/s, per QP, error); odd
    values become None/0. Never raises."""
    return bandwidth_run({k: done.get(k) for k in ("seconds", "bytes", "gbps", "per_qp", "error")}) or BandwidthRun()


def _client_bandwidth(r: _Rdma, ch: _Chan, peer: dict[str, Any], facts: PairFacts, spec: BandwidthSpec,
                      deadline: float, bar: Any) -> None:
    """The client's bandwidth run (``facts.bandwidth``): counters, QPs and MR, the server's QPs, then
    ``spec.seconds`` of RDMA WRITEs kept ``spec.depth`` deep on each QP, then the server's buffer check
    and counters. Raises :class:`PairError` with the run's error (a bad completion, a stall, the
    deadline) after the counters are read and the server was told."""
    facts.mode = "bandwidth"
    bw = facts.bandwidth = facts.bandwidth or BandwidthRun(seconds_asked=spec.seconds, size=spec.size, qps=spec.qps,
                                                           depth=spec.depth)
    if "bandwidth" not in (peer.get("modes") or []):
        bw.error = (f"the server at {facts.peer} does not know the bandwidth mode (its afddiag speaks handshake "
                    f"protocol {peer.get('proto', 1)}): update afddiag there, or run without --bandwidth")
        ch.send({"op": "bye"})  # an older server ends its session cleanly
        raise PairError(bw.error)
    before = _read_counters(facts)
    bw.stage = "setup"
    cq, mr, qps, psns = r.bandwidth_objects(spec.qps, spec.depth, spec.qps * spec.size)
    seeds = [(0x41 + 29 * i) & 0xFF for i in range(spec.qps)]
    for i in range(spec.qps):
        mr.write(_pattern(spec.size, seeds[i]), spec.size, i * spec.size)
    ch.send({"op": "bandwidth", "seconds": spec.seconds, "size": spec.size, "qps": spec.qps, "depth": spec.depth,
             "peers": [{"qpn": q.qp_num, "psn": p} for q, p in zip(qps, psns, strict=True)]})
    rep = ch.recv()
    if rep.get("error"):
        bw.error = f"the server refused the bandwidth run: {str(rep['error'])[:300]}"
        ch.send({"op": "bye"})
        raise PairError(bw.error)
    theirs = _qp_list(rep.get("qps"), spec.qps, "the server")
    _num(rep, "addr", 0, (1 << 64) - 1, "the server's bandwidth answer")
    _num(rep, "rkey", 0, (1 << 32) - 1, "the server's bandwidth answer")
    for i, (qp, psn) in enumerate(zip(qps, psns, strict=True)):
        r.connect({**peer, "qpn": int(theirs[i]["qpn"]), "psn": int(theirs[i]["psn"])}, qp, psn)
        bw.per_qp.append(RailQp(i, qp.qp_num, int(theirs[i]["qpn"])))
    bw.stage = "run"
    bar.step(f"RDMA WRITE {spec.size} B x {spec.qps} QPs, {spec.seconds:g} s")
    _write_for(r, bw, cq, mr, qps, (int(rep["rkey"]), int(rep["addr"])), spec, deadline)
    local = _local_delta(facts, before)
    bw.counters = [local]
    if bw.error is not None:  # the path may be gone (TCP too): tell the server, but do not wait long for it
        ch.deadline = min(ch.deadline, time.monotonic() + 10.0)
    bw.stage = "verify"
    try:
        ch.send({"op": "bw_done", "seconds": bw.seconds, "bytes": bw.bytes, "gbps": bw.gbps, "error": bw.error,
                 "per_qp": to_jsonable(bw.per_qp), "seeds": seeds, "counters": to_jsonable(local)})
        res = ch.recv()
        bw.verified = res.get("ok") is True
        peer_c = _peer_counters(res.get("counters"))
        if peer_c is not None:
            bw.counters.append(peer_c)
    except (PairError, OSError) as e:
        if bw.error is None:
            raise
        facts.notes.append(f"after the run's error, the server's check and counters were not received: {e}")
    if bw.error is not None:
        try:
            ch.send({"op": "bye"})  # the server's session ends now, not at its deadline
        except OSError:
            pass
        raise PairError(bw.error)
    bw.stage = "done"


def _write_for(r: _Rdma, bw: BandwidthRun, cq: Any, mr: Any, qps: list[Any], remote: tuple[int, int],
               spec: BandwidthSpec, deadline: float) -> None:
    """Keep ``spec.depth`` signalled RDMA WRITEs outstanding on each QP for ``spec.seconds`` (QP ``i``
    writes its slot ``i * size`` of ``mr`` to the same slot of the remote buffer ``remote`` = (rkey,
    address)), then let the outstanding ones complete. Fills ``bw`` (bytes, seconds, Gb/s, per QP);
    a bad completion status, no completion for :data:`BW_STALL_S` or the session deadline sets
    ``bw.error``. Polls the CQ, sleeping 0.2 ms when it is empty (the queues stay full meanwhile)."""
    rkey, addr = remote
    size, n = spec.size, len(qps)
    outstanding = [0] * n

    def post(i: int) -> None:
        r.post_send(i * size, size, wr_id=i, rdma=(rkey, addr + i * size), qp=qps[i], mr=mr)
        outstanding[i] += 1

    t0 = time.perf_counter()
    end_at = time.monotonic() + spec.seconds
    last = t0
    last_seen = time.monotonic()
    stopping_at: float | None = None
    try:
        for i in range(n):
            for _ in range(spec.depth):
                post(i)
    except Exception as e:  # noqa: BLE001
        bw.error = f"post RDMA WRITE failed: {e}"
        stopping_at = time.monotonic()
    while sum(outstanding):
        got, wcs = cq.poll(num_entries=64)
        now = time.monotonic()
        if stopping_at is None and (now >= end_at or now >= deadline):
            stopping_at = now
        if not got:
            if now - last_seen > BW_STALL_S:  # nothing completes: waiting longer for the rest changes nothing
                bw.error = bw.error or (f"no RDMA WRITE completed for {BW_STALL_S:g} s with {sum(outstanding)} "
                                        "outstanding (no ACK from the peer)")
                break
            if stopping_at is not None and now - stopping_at > min(BW_DRAIN_S, max(0.0, deadline - stopping_at)):
                bw.error = bw.error or (f"{sum(outstanding)} RDMA WRITE(s) still outstanding {BW_DRAIN_S:g} s after "
                                        "the run (no ACK from the peer)")
                break
            time.sleep(0.0002)
            continue
        last_seen = now
        for wc in wcs[:got]:
            i = int(wc.wr_id)
            outstanding[i] -= 1
            if wc.status != 0:
                if bw.error is None:
                    bw.error = (f"work completion status {wc.status} ({_wc_status(wc.status)}) on QP {qps[i].qp_num} "
                                f"after {now - (end_at - spec.seconds):.2f} s of the run")
                stopping_at = stopping_at or now
                continue
            bw.per_qp[i].writes += 1
            bw.per_qp[i].bytes += size
            last = time.perf_counter()
            if stopping_at is None:
                try:
                    post(i)
                except Exception as e:  # noqa: BLE001
                    bw.error = f"post RDMA WRITE failed: {e}"
                    stopping_at = now
    bw.bytes = sum(q.bytes for q in bw.per_qp)
    bw.seconds = round(last - t0, 6) if last > t0 else None
    if bw.seconds:
        bw.gbps = round(bw.bytes * 8 / bw.seconds / 1e9, 6)
        for q in bw.per_qp:
            q.gbps = round(q.bytes * 8 / bw.seconds / 1e9, 6)


def pair(host: str, port: int = DEFAULT_PORT, fabric_ip: str | None = None, sizes: tuple[int, ...] = DEFAULT_SIZES,
         lat_iters: int = LAT_ITERS, bw_count: int = BW_COUNT, timeout_s: float = 60.0,
         fabric: FabricFacts | None = None, bandwidth: BandwidthSpec | None = None,
         key: bytes | None = None, nic: NicFacts | None = None) -> PairFacts:
    """Connect to a ``serve`` on ``host:port`` and run SEND ping-pong, SEND stream and WRITE phases
    at each of ``sizes`` (bytes, at most 64 KiB). Returns the client's facts (latency in µs,
    bandwidth in GB/s per phase); ``error`` says where it stopped. Bounded by ``timeout_s``.

    With ``bandwidth``: the bandwidth run instead of the phases (``facts.bandwidth``: Gb/s = 1e9
    bits/s of payload, per QP, the server's buffer check, both ports' counter deltas). A server whose
    afddiag does not know the mode is told goodbye and named in ``error``; the session still ends
    within ``timeout_s``.

    With ``key`` (the pair key's bytes, ``--pair-key``): the client proves the key to the server and
    the server proves it back (:func:`_client_handshake`) before anything else; a server without the
    key, or with another, is an ``error``."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    facts = PairFacts(role="client", peer=f"{host}:{port}")
    if bandwidth is not None:
        facts.mode = "bandwidth"
        facts.bandwidth = BandwidthRun(seconds_asked=bandwidth.seconds, size=bandwidth.size, qps=bandwidth.qps,
                                       depth=bandwidth.depth)
    r: _Rdma | None = None
    sock = None
    big = max(DEFAULT_SIZES)
    sizes = tuple(s for s in sizes if 0 < s <= big)
    bw_count = min(bw_count, QUEUE_DEPTH)
    try:
        stop_if_no_cable(fabric, nic, fabric_ip, facts)  # a Spark's CX-7 powered off: no cable, not no driver
        r = _open(fabric, fabric_ip, big * 2, facts)
        connect_by = min(deadline, time.monotonic() + 30.0)  # the server may still be starting: retry refusals
        # from the rail's fabric IP: the address the server's --peer names (with two rails on one subnet the
        # kernel's own choice may be the other rail's)
        source = (facts.fabric_ip, 0) if facts.fabric_ip else None
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(0.1, min(10.0, deadline - time.monotonic())),
                                                source_address=source)
                break
            except ConnectionRefusedError as e:
                if time.monotonic() > connect_by:
                    raise PairError(f"cannot reach {host}:{port} over TCP: {e.strerror or e}") from None
                time.sleep(0.2)
            except OSError as e:
                raise PairError(f"cannot reach {host}:{port} over TCP: {e.strerror or e}") from None
        ch = _Chan(sock, deadline)
        peer = _client_handshake(ch, _hello(r, facts, "bandwidth" if bandwidth else "phases"), key, facts)
        facts.peer_qp_num, facts.peer_gid = peer["qpn"], peer["gid"]
        facts.path_mtu = mtu_enum_to_bytes(r.connect(peer))
        if ch.recv().get("op") != "rts":
            raise PairError("the server did not reach RTS")

        if bandwidth is not None:
            with steps("bandwidth run", 1) as bar:
                _client_bandwidth(r, ch, peer, facts, bandwidth, deadline, bar)
        else:
            with steps("pair test", len(sizes)) as bar:
                _client_phases(r, ch, peer, facts, sizes, big, lat_iters, bw_count, deadline, bar)
        ch.send({"op": "bye"})
    except PairError as e:
        facts.error = str(e)
        if facts.phases and facts.phases[-1].rtt_us_median is None:
            facts.phases[-1].error = str(e)
    except Exception as e:  # noqa: BLE001 - never raise
        facts.error = f"{type(e).__name__}: {e}"
    finally:
        if sock is not None:
            sock.close()
        facts.destroyed = r.close() if r else True
        facts.elapsed_s = round(time.monotonic() - t0, 3)
    return facts


def _refusal(msg: dict[str, Any], facts: PairFacts) -> None:
    """:class:`PairError` when the server's line is its refusal (``{"error": ...}``)."""
    if "error" in msg:
        raise PairError(f"the server at {facts.peer} refused this client: "
                        f"{clean(str(msg['error'])[:300], keep_newlines=False)}")


def _client_handshake(ch: _Chan, hello: dict[str, Any], key: bytes | None, facts: PairFacts) -> dict[str, Any]:
    """Send the client's ``hello``; with ``key``, answer the server's challenge and check the server's
    proof. Returns the server's handshake (checked by :func:`_peer_hello`); :class:`PairError` names a
    refusal, a server without the key or with another, or a bad line."""
    nonce = secrets.token_hex(NONCE_HEX // 2) if key is not None else None
    hello = {**hello, "nonce": nonce} if nonce else hello
    ch.send(hello)
    msg = ch.recv()
    _refusal(msg, facts)
    if key is None or nonce is None:
        if msg.get("op") == "challenge":
            raise PairError(f"the server at {facts.peer} asks for a pair key: give --pair-key FILE (the server's key)")
        return _peer_hello(msg, "the server's handshake")
    if msg.get("op") != "challenge":
        raise PairError(f"the server at {facts.peer} did not ask for the pair key: it was started without "
                        "--pair-key (it would take any client) or is not afddiag; give both sides the same --pair-key")
    server_nonce = _nonce(msg, "nonce", "the server's challenge")
    ch.send({"op": "auth", "mac": _mac(key, AUTH_CLIENT, server_nonce, nonce, hello)})
    msg = ch.recv()
    _refusal(msg, facts)
    proof = msg.get("mac")
    if not isinstance(proof, str) or not hmac.compare_digest(proof.encode("utf-8", "replace"),
                                                             _mac(key, AUTH_SERVER, nonce, server_nonce, msg).encode()):
        raise PairError(f"the server at {facts.peer} did not prove the pair key: not the server you meant, or "
                        "another key")
    facts.pair_key = True
    return _peer_hello(msg, "the server's handshake")


def _client_phases(r: Any, ch: Any, peer: dict, facts: PairFacts, sizes: tuple[int, ...], big: int, lat_iters: int,
                   bw_count: int, deadline: float, bar: Any) -> None:
    """The client's phases at each size: SEND ping-pong and stream, then RDMA WRITE latency and burst;
    each appended to ``facts.phases`` as it starts (so an error names where it stopped)."""
    for size in sizes:
        bar.step(f"SEND/WRITE {size} B")
        # SEND ping-pong: send from [0, big), echo lands in [big, 2 big)
        ph = PairPhase("send", size, iters=lat_iters)
        facts.phases.append(ph)
        ch.send({"op": "send_pingpong", "size": size, "n": lat_iters})
        ch.recv()
        rtts, echo_ok = [], True
        for i in range(lat_iters):
            r.mr.write(_pattern(size, i), size, 0)
            r.post_recv(big, size)
            t = time.perf_counter()
            r.post_send(0, size)
            r.poll(2, deadline)  # our send's completion and the echo
            rtts.append((time.perf_counter() - t) * 1e6)
            echo_ok &= r.mr.read(size, big) == _pattern(size, i)
        res = ch.recv()
        ph.verified = bool(res.get("ok")) and echo_ok
        ph.rtt_us_median, ph.rtt_us_min = round(statistics.median(rtts), 1), round(min(rtts), 1)
        # SEND stream
        ch.send({"op": "send_stream", "size": size, "n": bw_count})
        ch.recv()
        r.mr.write(_pattern(size, 7), size, 0)
        t = time.perf_counter()
        for i in range(bw_count):
            r.post_send(0, size, wr_id=i)
        r.poll(bw_count, deadline)
        dt = time.perf_counter() - t
        res = ch.recv()
        ph.bw_count, ph.bw_gbps = bw_count, round(size * bw_count / dt / 1e9, 6)
        ph.verified = ph.verified and bool(res.get("ok"))
        # RDMA WRITE: latency one at a time, then a burst; the server checks its buffer
        ph = PairPhase("write", size, iters=lat_iters)
        facts.phases.append(ph)
        ch.send({"op": "write", "size": size})
        ch.recv()
        seed = (size // 64 * 37 + 11) & 0xFF  # differs from what the buffer held before
        r.mr.write(_pattern(size, seed), size, 0)
        rdma = (peer["rkey"], peer["addr"])
        lat = []
        for _ in range(lat_iters):
            t = time.perf_counter()
            r.post_send(0, size, rdma=rdma)
            r.poll(1, deadline)
            lat.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        for i in range(bw_count):
            r.post_send(0, size, wr_id=i, rdma=rdma)
        r.poll(bw_count, deadline)
        dt = time.perf_counter() - t
        ch.send({"op": "check_write", "size": size, "seed": seed})
        ph.verified = bool(ch.recv().get("ok"))
        ph.rtt_us_median, ph.rtt_us_min = round(statistics.median(lat), 1), round(min(lat), 1)
        ph.bw_count, ph.bw_gbps = bw_count, round(size * bw_count / dt / 1e9, 6)


def parse_hostport(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``HOST[:PORT]`` → ``(host, port)``; raises ValueError for a bad port."""
    host, sep, p = text.rpartition(":")
    if not sep:
        return text, default_port

    port = kernel_int(p, 1, 65535) if p.strip() == p and not p.startswith("-") else None
    if port is None:
        raise ValueError(f"{text!r}: port {p[:20]!r} is not 1..65535")
    return host, port
