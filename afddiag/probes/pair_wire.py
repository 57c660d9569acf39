"""The pair test's control channel: JSON lines over TCP (:class:`_Chan`), the handshake's checks
(:func:`_peer_hello`, :func:`_qp_list`) and the pair key's HMAC-SHA256 proofs (:func:`load_key`,
:func:`_mac`, :func:`_nonce`). Split out of :mod:`afddiag.probes.pair`, which re-exports these names."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
from typing import Any

from afddiag.atomic import read_secret
from afddiag.model.nic import no_cable_stop

PROTO = 3  # handshake protocol: 1 = phases only (no "proto" key); 2 adds "modes"/"mode" and the bandwidth run;
# 3 adds the server's refusal line ({"error"}) and the pair key's challenge-response ("nonce", "challenge", "auth",
# "mac")
MODES = ("phases", "bandwidth")
# The pair key (--pair-key FILE): HMAC-SHA256 over a label and both sides' nonces, each side proving it.
KEY_MIN_BYTES = 16
KEY_MAX_BYTES = 4096
NONCE_HEX = 64  # 32 random bytes, hex
AUTH_CLIENT = b"afddiag pair key: client proof\0"
AUTH_SERVER = b"afddiag pair key: server proof\0"


class PairError(Exception):
    """A step of the pair test that failed; the message says which and why (recorded, never raised out)."""


def stop_if_no_cable(fabric: Any, nic: Any, fabric_ip: str | None, facts: Any) -> None:
    """Raise :class:`PairError` (``facts.local_error`` set, nothing opened) when this host lists no RDMA
    device because a DGX Spark's hot-plug driver powered its CX-7 off for want of a cable
    (:func:`afddiag.model.nic.no_cable_stop`): that root and its cabling remedy, not "load the driver"."""
    if (why := no_cable_stop(fabric, nic)) is not None:
        facts.fabric_ip, facts.local_error = fabric_ip, why
        raise PairError(why)


MAX_MESSAGE = 1 << 20  # bytes: a control line longer than this (no newline yet) is refused, never held


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_line(line: bytes) -> dict[str, Any]:
    """One control line as a JSON object; :class:`PairError` naming what the peer sent otherwise
    (garbage, NaN/Infinity, nesting too deep, not an object)."""
    try:
        msg = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise PairError(f"the peer's control message is not JSON ({str(e)[:80]}): {line[:60]!r}: not an afddiag "
                        "pair test, or a different protocol; check the host and port") from None
    if not isinstance(msg, dict):
        raise PairError(f"the peer's control message is a JSON {type(msg).__name__}, not an object: "
                        f"{line[:60]!r}")
    return msg


class _Chan:
    """JSON lines over a TCP socket, every read and write bounded by the session deadline and every
    line by :data:`MAX_MESSAGE` bytes; each line must be a JSON object (garbage, NaN/Infinity,
    a truncated line at close are :class:`PairError` naming what the peer sent)."""

    def __init__(self, sock: socket.socket, deadline: float, buf: bytes = b"") -> None:
        self.sock, self.deadline, self.buf = sock, deadline, buf

    def _left(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise PairError(f"timed out {what}")
        return left

    def send(self, obj: dict[str, Any]) -> None:
        self.sock.settimeout(self._left("before sending a control message to the peer"))
        try:
            self.sock.sendall(json.dumps(obj).encode() + b"\n")
        except TimeoutError:
            raise PairError("timed out sending a control message: the peer does not read") from None

    def recv(self) -> dict[str, Any]:
        self._left("waiting for the peer's control message")  # a peer that floods lines still ends at the deadline
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_MESSAGE:
                raise PairError(f"the peer sent a control message over {MAX_MESSAGE} bytes (no line end): not an "
                                "afddiag pair test; check the host and port")
            self.sock.settimeout(self._left("waiting for the peer's control message"))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise PairError("timed out waiting for the peer's control message") from None
            if not chunk:
                raise PairError("the peer closed the TCP connection"
                                + (f" in the middle of a control message ({len(self.buf)} bytes)" if self.buf else ""))
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return _parse_line(line)


def _num(msg: dict[str, Any], key: str, lo: int, hi: int, what: str) -> int:
    """``msg[key]`` as an integer within ``lo..hi``; :class:`PairError` naming ``what`` (whose message)
    and the key otherwise (missing, not an integer, out of range)."""
    v = msg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise PairError(f"{what}: {key} {str(v)[:40] if key in msg else '(missing)'} is not an integer "
                        f"{lo}..{hi}: a different afddiag version or not afddiag; update both sides")
    return v


def _peer_hello(msg: dict[str, Any], what: str, buffer: bool = True) -> dict[str, Any]:
    """The handshake line's fields checked (QP number and PSN 24-bit, MTU enum 1..5, GID text; with
    ``buffer``, the buffer address and rkey this side will WRITE to: the server's); raises
    :class:`PairError` naming the first bad one. Returns ``msg``."""
    _num(msg, "qpn", 0, (1 << 24) - 1, what)
    _num(msg, "psn", 0, (1 << 24) - 1, what)
    _num(msg, "mtu", 1, 5, what)
    if buffer:
        _num(msg, "addr", 0, (1 << 64) - 1, what)
        _num(msg, "rkey", 0, (1 << 32) - 1, what)
    gid = msg.get("gid")
    if not isinstance(gid, str) or not 2 <= len(gid) <= 39 or set(gid.lower()) - set("0123456789abcdef:"):
        raise PairError(f"{what}: gid {str(gid)[:60]!r} is not a GID (8 groups of 4 hex digits)")
    if "modes" in msg and not (isinstance(msg["modes"], list) and all(isinstance(m, str) for m in msg["modes"])):
        raise PairError(f"{what}: modes {str(msg['modes'])[:60]} is not a list of mode names")
    if "proto" in msg and (isinstance(msg["proto"], bool) or not isinstance(msg["proto"], int)):
        raise PairError(f"{what}: proto {str(msg['proto'])[:40]} is not a protocol number")
    return msg


def _qp_list(raw: Any, n: int, what: str) -> list[dict[str, int]]:
    """``n`` ``{qpn, psn}`` objects (24-bit integers each); :class:`PairError` otherwise."""
    if not isinstance(raw, list) or len(raw) != n:
        got = len(raw) if isinstance(raw, list) else "no list of"
        raise PairError(f"{what} named {got} QPs for a run of {n}")
    for q in raw:
        if not isinstance(q, dict):
            raise PairError(f"{what}: a QP entry {str(q)[:40]} is not an object")
        _num(q, "qpn", 0, (1 << 24) - 1, what)
        _num(q, "psn", 0, (1 << 24) - 1, what)
    return raw


def load_key(path: str) -> bytes:
    """The pair key in ``path`` (``--pair-key``): its bytes, surrounding whitespace stripped, at least
    :data:`KEY_MIN_BYTES`. The file is read by :func:`afddiag.atomic.read_secret` (regular, no link,
    owned by root or you, mode 0600 or stricter). Raises ValueError with one line naming the file."""
    key = read_secret(path, KEY_MAX_BYTES).strip()
    if len(key) < KEY_MIN_BYTES:
        raise ValueError(f"{path}: holds {len(key)} bytes, a pair key needs at least {KEY_MIN_BYTES}: write one "
                         f"with `head -c 32 /dev/urandom | base64 > {path}; chmod 600 {path}` and copy it to both "
                         "hosts")
    return key


#: The handshake fields a proof covers: whoever relays a proven session cannot point its QPs elsewhere.
AUTH_BOUND = ("qpn", "psn", "gid", "mtu", "addr", "rkey")


def _mac(key: bytes, label: bytes, first_nonce: str, second_nonce: str, hello: dict[str, Any]) -> str:
    """HMAC-SHA256 (hex) of ``label``, two nonces (hex text) and the sender's handshake fields
    :data:`AUTH_BOUND` (compact JSON list, null where absent): a side's proof that it holds ``key``.
    The label keeps the server's proof from serving as a client's."""
    bound = json.dumps([hello.get(k) for k in AUTH_BOUND], separators=(",", ":")).encode()
    return hmac.new(key, label + bytes.fromhex(first_nonce) + bytes.fromhex(second_nonce) + bound,
                    hashlib.sha256).hexdigest()


def _nonce(msg: dict[str, Any], key: str, what: str) -> str:
    """``msg[key]`` as a nonce (:data:`NONCE_HEX` lowercase hex digits); :class:`PairError` otherwise."""
    v = msg.get(key)
    if not isinstance(v, str) or len(v) != NONCE_HEX or set(v) - set("0123456789abcdef"):
        raise PairError(f"{what}: {key} {str(v)[:80]!r} is not {NONCE_HEX} hex digits")
    return v
