"""The pair server's door (:class:`_Admission`): admits one session from the expected address once its
handshake (and, with a pair key, its proof) is right; refuses and records every other connection.
Split out of :mod:`afddiag.probes.pair`, which re-exports these names and passes ``admit_s``."""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
import selectors
import socket
import time
from dataclasses import dataclass
from typing import Any

from afddiag.model.pair import REFUSED_KEPT, PairFacts, RefusedConnection
from afddiag.probes.pair_wire import AUTH_CLIENT, NONCE_HEX, PairError, _mac, _nonce, _parse_line, _peer_hello

ADMIT_MAX_LINE = 16 << 10  # bytes: a handshake or proof line longer than this is refused
ADMIT_PENDING = 8  # connections being admitted at once; one more is refused at once


def _expected_address(peer: str) -> ipaddress.IPv4Address:
    """``peer`` (``--peer``) as an IPv4 address; :class:`PairError` otherwise."""
    try:
        return ipaddress.IPv4Address(peer)
    except ValueError:
        raise PairError(f"--peer {peer[:80]!r} is not an IPv4 address: give the client's fabric IP") from None


@dataclass
class _Pending:
    """A connection being admitted: its address, when it came (monotonic), what it sent so far, and
    with a pair key the hello and nonces of the challenge it was sent."""

    sock: socket.socket
    addr: tuple[str, int]
    since: float
    buf: bytes = b""
    hello: dict[str, Any] | None = None
    server_nonce: str | None = None


@dataclass
class _Admitted:
    """The connection admitted to the session: its socket, the client's hello, what it sent after,
    and (with a pair key) both nonces."""

    sock: socket.socket
    addr: tuple[str, int]
    hello: dict[str, Any]
    rest: bytes
    client_nonce: str | None = None
    server_nonce: str | None = None


class _Admission:
    """The server's door: accepts TCP connections on ``lsock`` until one from ``expected`` sends a
    valid handshake (and, with ``key``, proves it: HMAC-SHA256 challenge-response). Every other
    connection is refused, recorded in ``facts.refused`` (who, when, why) and the door stays open.
    Connections are read without blocking (a selector), each for at most ``admit_s`` seconds; waiting
    costs no CPU."""

    def __init__(self, lsock: socket.socket, expected: ipaddress.IPv4Address,
                 key: bytes | None, facts: PairFacts, t0: float, deadline: float, admit_s: float) -> None:
        self.lsock, self.expected, self.key, self.facts = lsock, expected, key, facts
        self.t0, self.deadline, self.admit_s = t0, deadline, admit_s
        self.pending: dict[socket.socket, _Pending] = {}
        self.sel = selectors.DefaultSelector()

    def run(self) -> _Admitted:
        """The admitted connection; :class:`PairError` at the deadline (naming what was refused)."""
        self.lsock.setblocking(False)
        self.sel.register(self.lsock, selectors.EVENT_READ)
        try:
            while True:
                now = time.monotonic()
                if now >= self.deadline:
                    for p in list(self.pending.values()):
                        self._refuse(p, "was still in its handshake when the server's time (--pair-timeout) ran out")
                    raise PairError(self._nobody())
                for p in [p for p in self.pending.values() if now - p.since >= self.admit_s]:
                    self._refuse(p, f"sent no {'proof of the pair key' if p.hello else 'afddiag handshake'} within "
                                    f"{self.admit_s:g} s")
                wake = min([self.deadline] + [p.since + self.admit_s for p in self.pending.values()])
                for sk, _ in self.sel.select(timeout=max(0.0, wake - now)):
                    p = self.pending.get(sk.fileobj)  # type: ignore[call-overload]
                    got = self._accept() if sk.fileobj is self.lsock else self._read(p) if p else None
                    if got is not None:
                        return got
        finally:
            for p in list(self.pending.values()):
                self._refuse(p, "another connection from the expected peer was admitted first")
            self.sel.close()

    def _nobody(self) -> str:
        f = self.facts
        msg = (f"no client from {self.expected} (--peer) {'proved the pair key ' if self.key else ''}within "
               f"{self.deadline - self.t0:g} s on port {self.lsock.getsockname()[1]}")
        if f.refused_total:
            seen = "; ".join(f"{c.address}: {c.reason}" for c in f.refused[:3])
            msg += (f"; refused {f.refused_total} connection(s): {seen}"
                    + (" (a client on another address: a swapped cable, another rail, or the wrong --peer)"
                       if any(c.address != str(self.expected) for c in f.refused) else ""))
        return msg

    def _record(self, addr: tuple[str, int], reason: str) -> None:
        f = self.facts
        f.refused_total += 1
        if len(f.refused) < REFUSED_KEPT:
            f.refused.append(RefusedConnection(address=str(addr[0])[:64], port=int(addr[1]),
                                               at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                               after_s=round(time.monotonic() - self.t0, 3), reason=reason[:300]))

    @staticmethod
    def _tell(sock: socket.socket, why: str) -> None:
        """One refusal line to the peer, if its socket takes it at once (never waits)."""
        try:
            sock.send(json.dumps({"error": why}).encode() + b"\n", socket.MSG_DONTWAIT)
        except OSError:
            pass

    def _refuse(self, p: _Pending, reason: str, tell: str | None = None) -> None:
        self._record(p.addr, reason)
        if tell:
            self._tell(p.sock, tell)
        self.pending.pop(p.sock, None)
        try:
            self.sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass
        p.sock.close()

    def _accept(self) -> _Admitted | None:
        try:
            sock, addr = self.lsock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return None
        except OSError as e:  # EMFILE, ENOBUFS: the listener cannot take a connection now
            raise PairError(f"accepting a connection on port {self.lsock.getsockname()[1]} failed: "
                            f"{e.strerror or e}") from None
        if addr[0] != str(self.expected):
            self._record(addr, f"not the expected peer {self.expected} (--peer)")
            self._tell(sock, f"this server expects another client (its --peer), not {addr[0]}: check the cabling "
                             "and which rail you are on")
            sock.close()
            return None
        if len(self.pending) >= ADMIT_PENDING:
            self._record(addr, f"{ADMIT_PENDING} connections were already being admitted")
            sock.close()
            return None
        sock.setblocking(False)
        self.pending[sock] = _Pending(sock, addr, time.monotonic())
        self.sel.register(sock, selectors.EVENT_READ)
        return None

    def _read(self, p: _Pending) -> _Admitted | None:
        try:
            chunk = p.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            self._refuse(p, f"the connection failed before its handshake: {e.strerror or e}")
            return None
        if not chunk:
            self._refuse(p, "closed the connection " + ("in the middle of its handshake" if p.buf or p.hello else
                                                        "without a handshake (a port scan?)"))
            return None
        p.buf += chunk
        while b"\n" in p.buf:
            line, _, p.buf = p.buf.partition(b"\n")
            try:
                got = self._line(p, line)
            except PairError as e:
                self._refuse(p, str(e), tell=str(e))
                return None
            if got is not None:
                return got
        if len(p.buf) > ADMIT_MAX_LINE:
            self._refuse(p, f"sent over {ADMIT_MAX_LINE} bytes without a line end: not an afddiag handshake")
        return None

    def _line(self, p: _Pending, line: bytes) -> _Admitted | None:
        """One line of a pending connection: its hello (then, with a key, the challenge goes out) or
        its proof. The admitted connection, None while it is not yet; PairError: refuse it."""
        msg = _parse_line(line)
        if p.hello is None:
            hello = _peer_hello(msg, "the client's handshake", buffer=False)
            if self.key is None:
                if "nonce" in hello:
                    raise PairError("the client asks for the pair key; this server was started without --pair-key: "
                                    "give both sides the same --pair-key FILE")
                return self._admitted(p, hello)
            if "nonce" not in hello:
                raise PairError("the client gave no pair-key proof; this server needs one: give the client "
                                "--pair-key FILE (the server's key)")
            _nonce(hello, "nonce", "the client's handshake")
            p.hello, p.server_nonce = hello, secrets.token_hex(NONCE_HEX // 2)
            challenge = json.dumps({"op": "challenge", "nonce": p.server_nonce}).encode() + b"\n"
            try:
                sent = p.sock.send(challenge, socket.MSG_DONTWAIT)
            except OSError as e:
                raise PairError(f"the challenge could not be sent: {e.strerror or e}") from None
            if sent != len(challenge):
                raise PairError("the challenge could not be sent whole: the client does not read")
            return None
        if msg.get("op") != "auth" or not isinstance(msg.get("mac"), str):
            raise PairError(f"expected the client's proof of the pair key, got {line[:60]!r}")
        assert p.server_nonce is not None and self.key is not None
        want = _mac(self.key, AUTH_CLIENT, p.server_nonce, p.hello["nonce"], p.hello)
        if not hmac.compare_digest(msg["mac"].encode("utf-8", "replace"), want.encode()):
            raise PairError("the client's proof does not match this server's pair key (a different --pair-key file)")
        return self._admitted(p, p.hello)

    def _admitted(self, p: _Pending, hello: dict[str, Any]) -> _Admitted:
        self.pending.pop(p.sock, None)
        self.sel.unregister(p.sock)
        p.sock.setblocking(True)
        return _Admitted(p.sock, p.addr, hello, p.buf, hello.get("nonce"), p.server_nonce)
