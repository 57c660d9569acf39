"""Host-to-host RDMA pair test: two RC QPs, one on each host, connected through a TCP handshake,
moving RDMA SEND and RDMA WRITE messages from 64 bytes up to and past the path MTU.

``afddiag fabric --serve [--port N]`` on one host and ``afddiag fabric --pair HOST[:PORT]`` on the
other. The TCP connection carries the handshake (QP number, GID, PSN, buffer address and rkey,
active MTU) and the control of each phase as JSON lines; the data moves over RDMA only:

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

Sources: ``ibv_rc_pingpong(1)`` and ``ib_send_lat``/``ib_write_bw`` (perftest) for the method;
rdma-core ``tests/utils.py`` for pyverbs usage (``SendWR``, ``RecvWR``, ``SGE``, ``set_wr_rdma``).
Command-line equivalent (roughly): ``ibv_rc_pingpong -d <dev> -g <gid-index> -s <size> [host]``.
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from afddiag.facts import FabricFacts
from afddiag.probes.qp import (AH_HOP_LIMIT, RTR_MAX_DEST_RD_ATOMIC, RTR_MIN_RNR_TIMER, RTS_MAX_RD_ATOMIC,
                               RTS_RETRY_CNT, RTS_RNR_RETRY, RTS_TIMEOUT, _err_code, _import_pyverbs,
                               mtu_enum_to_bytes)

DEFAULT_PORT = 18515  # ibv_rc_pingpong's
DEFAULT_SIZES = (64, 512, 1024, 4096, 65536)
LAT_ITERS = 20
BW_COUNT = 16
QUEUE_DEPTH = 32


@dataclass
class PairPhase:
    """One measured phase: ``op`` "send" or "write" at ``size`` bytes."""

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
class PairFacts:
    """The pair test's result on one side."""

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


class PairError(Exception):
    """A step of the pair test that failed; the message says which and why (recorded, never raised out)."""


def pick_endpoint(fabric: FabricFacts, fabric_ip: str | None) -> tuple[str, int, int, str, str]:
    """``(device, port, gid_index, gid, ip)``: :func:`afddiag.endpoint.pick_endpoint`. Raises
    :class:`PairError` when there is none or it is ambiguous."""
    from afddiag import endpoint

    try:
        return endpoint.pick_endpoint(fabric, fabric_ip)
    except ValueError as e:
        raise PairError(str(e)) from None


class _Chan:
    """JSON lines over a TCP socket, every read bounded by the session deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.buf = sock, deadline, b""

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise PairError("timed out waiting for the peer's control message")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise PairError("timed out waiting for the peer's control message") from None
            if not chunk:
                raise PairError("the peer closed the TCP connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)


class _Rdma:
    """Device context, PD, CQ, MR and one RC QP; :meth:`close` destroys them in reverse order."""

    def __init__(self, pv: dict[str, Any], device: str, port: int, gid_index: int, buf_bytes: int) -> None:
        import pyverbs.mr as mrmod
        import pyverbs.wr as wrmod

        self.pv, self.e, self.wr = pv, pv["enums"], wrmod
        self.port, self.gid_index = port, gid_index
        self.created: list[Any] = []
        e = self.e
        self.ctx = self._keep(pv["device"].Context(name=device))
        self.pd = self._keep(pv["pd"].PD(self.ctx))
        self.cq = self._keep(pv["cq"].CQ(self.ctx, 2 * QUEUE_DEPTH + 4))
        self.mr = self._keep(mrmod.MR(self.pd, buf_bytes, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                                      | e.IBV_ACCESS_REMOTE_READ))
        cap = pv["qp"].QPCap(max_send_wr=QUEUE_DEPTH, max_recv_wr=QUEUE_DEPTH, max_send_sge=1, max_recv_sge=1)
        self.qp = self._keep(pv["qp"].QP(self.pd, pv["qp"].QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq,
                                                                         rcq=self.cq, cap=cap)))
        self.mtu_enum = self.ctx.query_port(port).active_mtu
        self.psn = random.randrange(1 << 24)

    def _keep(self, obj: Any) -> Any:
        self.created.append(obj)
        return obj

    def connect(self, peer: dict[str, Any]) -> int:
        """RESET→INIT→RTR→RTS toward ``peer`` (its qpn, gid, psn, mtu enum); returns the path MTU enum."""
        e, qpm, addr = self.e, self.pv["qp"], self.pv["addr"]
        a = qpm.QPAttr()
        a.qp_state, a.pkey_index, a.port_num = e.IBV_QPS_INIT, 0, self.port
        a.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self._step("INIT", a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
        mtu = min(self.mtu_enum, int(peer["mtu"]))
        gr = addr.GlobalRoute(dgid=addr.GID(peer["gid"]), sgid_index=self.gid_index, hop_limit=AH_HOP_LIMIT)
        a = qpm.QPAttr()
        a.qp_state, a.path_mtu, a.dest_qp_num, a.rq_psn = e.IBV_QPS_RTR, mtu, int(peer["qpn"]), int(peer["psn"])
        a.max_dest_rd_atomic, a.min_rnr_timer = RTR_MAX_DEST_RD_ATOMIC, RTR_MIN_RNR_TIMER
        a.ah_attr = addr.AHAttr(gr=gr, is_global=1, port_num=self.port)
        self._step("RTR", a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
                   | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        a = qpm.QPAttr()
        a.qp_state, a.timeout, a.retry_cnt, a.rnr_retry = e.IBV_QPS_RTS, RTS_TIMEOUT, RTS_RETRY_CNT, RTS_RNR_RETRY
        a.sq_psn, a.max_rd_atomic = self.psn, RTS_MAX_RD_ATOMIC
        self._step("RTS", a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
                   | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
        return mtu

    def _step(self, to: str, attr: Any, mask: int) -> None:
        try:
            self.qp.modify(attr, mask)
        except Exception as exc:  # noqa: BLE001
            from afddiag.probes.qp import decode_errno

            err = _err_code(exc)
            raise PairError(f"QP →{to} failed: errno {err} ({decode_errno(err)})" if err else f"QP →{to}: {exc}")

    def post_recv(self, offset: int, size: int, wr_id: int = 0) -> None:
        sge = self.wr.SGE(self.mr.buf + offset, size, self.mr.lkey)
        self.qp.post_recv(self.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))

    def post_send(self, offset: int, size: int, wr_id: int = 0, rdma: tuple[int, int] | None = None) -> None:
        e = self.e
        sge = self.wr.SGE(self.mr.buf + offset, size, self.mr.lkey)
        wr = self.wr.SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE if rdma else e.IBV_WR_SEND, num_sge=1,
                            sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
        if rdma:
            wr.set_wr_rdma(rdma[0], rdma[1])
        self.qp.post_send(wr)

    def poll(self, n: int, deadline: float) -> list[Any]:
        """``n`` completions (any kind), in order; raises PairError on a bad status or the deadline."""
        out: list[Any] = []
        while len(out) < n:
            got, wcs = self.cq.poll(num_entries=n - len(out))
            for wc in wcs[:got]:
                if wc.status != 0:
                    raise PairError(f"work completion status {wc.status} ({_wc_status(wc.status)}) on wr_id "
                                    f"{wc.wr_id}")
                out.append(wc)
            if got == 0:
                if time.monotonic() > deadline:
                    raise PairError(f"timed out waiting for {n - len(out)} of {n} completion(s)")
                os.sched_yield()
        return out

    def close(self) -> bool:
        ok = True
        for obj in reversed(self.created):
            try:
                obj.close()
            except Exception:  # noqa: BLE001
                ok = False
        self.created.clear()
        return ok


WC_STATUS = {1: "local length error", 4: "local protection error", 5: "flushed", 10: "remote access error",
             12: "transport retry counter exceeded (no ACK: path MTU or route)", 13: "RNR retry exceeded"}


def _wc_status(s: int) -> str:
    return WC_STATUS.get(s, "see ibv_wc_status_str")


def _pattern(size: int, seed: int) -> bytes:
    b = bytes((seed + i) & 0xFF for i in range(256))
    return (b * (size // 256 + 1))[:size]


def _open(fabric: FabricFacts | None, fabric_ip: str | None, buf: int, facts: PairFacts) -> _Rdma:
    pv = _import_pyverbs()
    if pv is None:
        raise PairError("pyverbs is not installed: apt install python3-pyverbs")
    dev, port, gidx, gid, ip = pick_endpoint(fabric if fabric is not None else FabricFacts(), fabric_ip)
    facts.device, facts.port, facts.gid_index, facts.gid, facts.fabric_ip = dev, port, gidx, gid, ip
    try:
        r = _Rdma(pv, dev, port, gidx, buf)
    except PairError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise PairError(f"open {dev} / create PD, CQ, MR, QP failed: {exc}")
    facts.qp_num = r.qp.qp_num
    return r


def _hello(r: _Rdma, facts: PairFacts) -> dict[str, Any]:
    return {"qpn": r.qp.qp_num, "psn": r.psn, "gid": facts.gid, "mtu": int(r.mtu_enum), "addr": r.mr.buf,
            "rkey": r.mr.rkey, "len": r.mr.length, "device": facts.device}


def serve(port: int = DEFAULT_PORT, bind: str | None = None, fabric_ip: str | None = None,
          timeout_s: float = 60.0, fabric: FabricFacts | None = None) -> PairFacts:
    """Serve one pair session: listen on TCP ``bind`` (default: the fabric IP) ``port``, accept one
    client within ``timeout_s``, follow its phases, tear down. Returns the server's facts."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    facts = PairFacts(role="server")
    r: _Rdma | None = None
    lsock = conn = None
    try:
        r = _open(fabric, fabric_ip, max(DEFAULT_SIZES) * 2, facts)
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((bind or facts.fabric_ip or "0.0.0.0", port))
        lsock.listen(1)
        lsock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, peer = lsock.accept()
        except socket.timeout:
            raise PairError(f"no client within {timeout_s:g} s on port {port}") from None
        facts.peer = peer[0]
        ch = _Chan(conn, deadline)
        hello = ch.recv()
        ch.send(_hello(r, facts))
        facts.peer_qp_num, facts.peer_gid = hello["qpn"], hello["gid"]
        facts.path_mtu = mtu_enum_to_bytes(r.connect(hello))
        ch.send({"op": "rts"})
        while True:
            msg = ch.recv()
            op = msg.get("op")
            if op == "bye":
                break
            size, n = int(msg["size"]), int(msg.get("n", 0))
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
                ch.send({"ok": r.mr.read(size, 0) == _pattern(size, int(msg["seed"]))})
            else:
                raise PairError(f"unknown control message {msg!r}")
    except PairError as e:
        facts.error = str(e)
    except Exception as e:  # noqa: BLE001 - never raise
        facts.error = f"{type(e).__name__}: {e}"
    finally:
        for s in (conn, lsock):
            if s is not None:
                s.close()
        facts.destroyed = r.close() if r else True
        facts.elapsed_s = round(time.monotonic() - t0, 3)
    return facts


def pair(host: str, port: int = DEFAULT_PORT, fabric_ip: str | None = None, sizes: tuple[int, ...] = DEFAULT_SIZES,
         lat_iters: int = LAT_ITERS, bw_count: int = BW_COUNT, timeout_s: float = 60.0,
         fabric: FabricFacts | None = None) -> PairFacts:
    """Connect to a ``serve`` on ``host:port`` and run SEND ping-pong, SEND stream and WRITE phases
    at each of ``sizes`` (bytes, at most 64 KiB). Returns the client's facts (latency in µs,
    bandwidth in GB/s per phase); ``error`` says where it stopped. Bounded by ``timeout_s``."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    facts = PairFacts(role="client", peer=f"{host}:{port}")
    r: _Rdma | None = None
    sock = None
    big = max(DEFAULT_SIZES)
    sizes = tuple(s for s in sizes if 0 < s <= big)
    bw_count = min(bw_count, QUEUE_DEPTH)
    try:
        r = _open(fabric, fabric_ip, big * 2, facts)
        connect_by = min(deadline, time.monotonic() + 30.0)  # the server may still be starting: retry refusals
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=max(0.1, min(10.0, deadline - time.monotonic())))
                break
            except ConnectionRefusedError as e:
                if time.monotonic() > connect_by:
                    raise PairError(f"cannot reach {host}:{port} over TCP: {e.strerror or e}") from None
                time.sleep(0.2)
            except OSError as e:
                raise PairError(f"cannot reach {host}:{port} over TCP: {e.strerror or e}") from None
        ch = _Chan(sock, deadline)
        ch.send(_hello(r, facts))
        peer = ch.recv()
        facts.peer_qp_num, facts.peer_gid = peer["qpn"], peer["gid"]
        facts.path_mtu = mtu_enum_to_bytes(r.connect(peer))
        if ch.recv().get("op") != "rts":
            raise PairError("the server did not reach RTS")
        from afddiag.progress import steps

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
    if not p.isdigit() or not 0 < int(p) < 65536:
        raise ValueError(f"{text!r}: port {p!r} is not 1..65535")
    return host, int(p)


def format_pair(f: PairFacts) -> str:
    """Plain text: one line per phase (size, latency µs, bandwidth GB/s, verified)."""
    head = (f"afddiag pair ({f.role}): {f.device} port {f.port} GID {f.gid_index} ({f.fabric_ip}) ↔ {f.peer}, "
            f"QP {f.qp_num} ↔ {f.peer_qp_num}, path MTU {f.path_mtu}")
    lines = [head]
    for p in f.phases:
        lines.append(f"  {p.op:<5} {p.size:>6} B  rtt median {p.rtt_us_median} µs (min {p.rtt_us_min})  "
                     f"bw {p.bw_gbps} GB/s  {'verified' if p.verified else 'NOT verified'}"
                     + (f"  error: {p.error}" if p.error else ""))
    lines.append(f"{'ERROR: ' + f.error if f.error else 'OK'} in {f.elapsed_s:.2f} s; "
                 f"{'all objects destroyed' if f.destroyed else 'NOT all objects destroyed'}")
    return "\n".join(lines)
