"""Fuzz target ``pair_server``: what a client sends to ``afddiag fabric --serve`` (the server side of the
pair protocol), over real TCP on loopback, with a fake RDMA rail (no device).

An input is a JSON list of what the client sends, in order: an object is sent as one JSON line, a
string as its raw UTF-8 bytes (no line end added: cut lines, garbage, NaN text). A first element
``"KEY"`` starts the server with a pair key (the client's proof is the string ``"$PROOF"``: the harness
reads the server's challenge and sends the right ``auth`` line there; ``"$BADPROOF"`` sends a wrong
one). Anything else is sent as raw bytes. Then the client closes its sending side and reads the
server's lines until it closes.

The promise, checked on every input: ``serve`` returns (within its deadline + slack), never raises and
never ends with a raw exception name (every hostile field is named); every object is destroyed and
every bandwidth run's objects released; at most one bandwidth run per session and the session's
registered bytes and QPs within their caps; every refused connection recorded; each line the server
sent is a JSON object; the facts serialise to JSON, read back (``pair_facts``) and render
(``format_pair``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
from typing import Any

KEY = b"fuzz-pair-key-of-32-bytes-000000"
SERVE_S = 3.0  # the server's deadline per input
GID = "0000:0000:0000:0000:0000:ffff:7f00:0001"
HELLO = {"qpn": 17, "psn": 5, "gid": GID, "mtu": 5, "addr": 4096, "rkey": 7, "len": 131072, "device": "x",
         "proto": 3, "mode": "phases"}
RAW_EXCEPTIONS = ("KeyError", "TypeError", "ValueError", "AttributeError", "OverflowError", "JSONDecodeError",
                  "IndexError", "AssertionError", "UnicodeDecodeError", "UnicodeEncodeError", "RecursionError",
                  "ZeroDivisionError", "MemoryError", "OSError")


class _Obj:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def close(self) -> None:
        pass


class _WC:
    def __init__(self, size: int, opcode: int) -> None:
        self.status, self.opcode, self.byte_len, self.wr_id = 0, opcode, size, 0


class FuzzRail:
    """The server's rail without a device: every posted receive completes at once (so the phases run
    to their end), the bandwidth run's objects are counted until released."""

    RECV = 128

    def __init__(self) -> None:
        self.buf = bytearray(131072)
        self.qp = _Obj(qp_num=33)
        self.mr = _Obj(buf=8192, rkey=9, length=len(self.buf), read=self._read, write=self._write)
        self.psn, self.mtu_enum = 3, 5
        self.e = _Obj(IBV_WC_RECV=self.RECV)
        self.live: list[Any] = []
        self.runs = 0
        self.closed = False

    def _read(self, n: int, off: int = 0) -> bytes:
        return bytes(self.buf[off:off + n])

    def _write(self, data: bytes, n: int, off: int = 0) -> None:
        self.buf[off:off + n] = data[:n]

    def connect(self, peer: dict, qp: Any = None, psn: Any = None) -> int:
        return min(5, int(peer["mtu"]))

    def bandwidth_objects(self, qps: int, depth: int, buf: int) -> tuple:
        self.runs += 1
        mr = _Obj(buf=1 << 20, rkey=11, length=buf, read=lambda n, off=0: b"\0" * n, write=lambda *a: None)
        made = (_Obj(), mr, [_Obj(qp_num=40 + i) for i in range(qps)], [1] * qps)
        self.live += [*made[2], mr, made[0]]
        return made

    def release(self, *objs: Any) -> bool:
        self.live = [o for o in self.live if all(o is not x for x in objs)]
        return True

    def post_recv(self, *a: Any, **kw: Any) -> None:
        pass

    def post_send(self, *a: Any, **kw: Any) -> None:
        pass

    def poll(self, n: int, deadline: float) -> list:
        return [_WC(64, self.RECV) for _ in range(n)]

    def close(self) -> bool:
        self.closed = True
        return True


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    """Where two JSON values first differ, and how (for a finding's message)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path or '.'}: {str(a)[:80]} became {str(b)[:80]}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chunks(data: bytes) -> tuple[bool, list[Any]]:
    """(keyed, what to send) from an input."""
    try:
        items = json.loads(data)
    except (ValueError, RecursionError):
        return False, [data]
    if not isinstance(items, list):
        return False, [data]
    keyed = bool(items) and items[0] == "KEY"
    return keyed, items[1:] if keyed else items


def _send_all(sock: socket.socket, items: list[Any], said: list[bytes]) -> None:
    """Send ``items``; at "$PROOF"/"$BADPROOF" wait (briefly) for the challenge and answer it."""
    hello = next((x for x in items if isinstance(x, dict) and isinstance(x.get("nonce"), str)), {})
    for x in items:
        if x in ("$PROOF", "$BADPROOF"):
            nonce = _challenge(sock, said)
            bound = json.dumps([hello.get(k) for k in ("qpn", "psn", "gid", "mtu", "addr", "rkey")],
                               separators=(",", ":")).encode()
            try:
                mac = hmac.new(KEY if x == "$PROOF" else b"not the key", b"afddiag pair key: client proof\0"
                               + bytes.fromhex(nonce) + bytes.fromhex(hello.get("nonce", "")) + bound,
                               hashlib.sha256).hexdigest()
            except (ValueError, TypeError):
                mac = "00" * 32
            sock.sendall(json.dumps({"op": "auth", "mac": mac}).encode() + b"\n")
        elif isinstance(x, str):
            sock.sendall(x.encode("utf-8", "surrogatepass"))
        elif isinstance(x, bytes):
            sock.sendall(x)
        else:
            sock.sendall(json.dumps(x).encode() + b"\n")


def _challenge(sock: socket.socket, said: list[bytes]) -> str:
    sock.settimeout(1.0)
    buf = b""
    try:
        while b"\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                break
            buf += chunk
    except OSError:
        pass
    said.append(buf)
    try:
        nonce = json.loads(buf.split(b"\n", 1)[0]).get("nonce")
    except (ValueError, AttributeError):
        return ""
    return nonce if isinstance(nonce, str) else ""


def _close_door(port: int, keyed: bool) -> None:
    """A well-behaved client's whole session (hello, the key's proof, bye), if the server still listens."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=1)
    except OSError:
        return  # the server ended already
    with sock:
        nonce = "77" * 32
        try:
            _send_all(sock, [{**HELLO, "nonce": nonce}, "$PROOF", {"op": "bye"}] if keyed else
                      [HELLO, {"op": "bye"}], [])
            sock.settimeout(SERVE_S + 2)
            while sock.recv(65536):
                pass
        except OSError:
            pass


def target_pair_server(data: bytes) -> None:
    """See the module docstring."""
    from afddiag.model import to_jsonable
    from afddiag.model.pair import REFUSED_KEPT, pair_facts
    from afddiag.probes import pair as pm
    from fuzzlib import Finding

    keyed, items = _chunks(data)
    rails: list[FuzzRail] = []

    def fake_open(fabric: Any, fabric_ip: Any, buf: int, facts: Any) -> FuzzRail:
        facts.device, facts.port, facts.gid_index, facts.gid, facts.fabric_ip = "fuzz0", 1, 1, GID, "127.0.0.1"
        rails.append(FuzzRail())
        return rails[-1]

    real_open, real_counters = pm._open, pm._read_counters
    pm._open = fake_open  # type: ignore[assignment]
    pm._read_counters = lambda facts: {"values": {}, "notes": []}  # type: ignore[assignment]
    port = _free_port()
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(f=pm.serve(port, bind="127.0.0.1", timeout_s=SERVE_S,
                                                               peer="127.0.0.1", key=KEY if keyed else None)),
                         daemon=True)
    said: list[bytes] = []
    try:
        t.start()
        sock = None
        for _ in range(200):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=2)
                break
            except ConnectionRefusedError:
                time.sleep(0.005)
        if sock is None:
            raise Finding("serve never listened")
        with sock:
            try:
                _send_all(sock, items, said)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(SERVE_S + 2)
                while chunk := sock.recv(65536):
                    said.append(chunk)
            except OSError:
                pass  # the server hung up first: allowed
        _close_door(port, keyed)  # a refused connection leaves the server listening: a good client ends it
        t.join(SERVE_S + 5)
        if t.is_alive():
            raise Finding(f"serve did not end within {SERVE_S + 5:g} s of a {SERVE_S:g} s deadline")
    finally:
        pm._open, pm._read_counters = real_open, real_counters  # type: ignore[assignment]
    f = box.get("f")
    if f is None:
        raise Finding("serve raised instead of returning its facts")
    if f.error and f.error.startswith(RAW_EXCEPTIONS):
        raise Finding(f"a raw exception ended the session: {f.error[:200]}")
    if not f.destroyed or any(not r.closed for r in rails):
        raise Finding("an object was not destroyed")
    if any(r.live for r in rails):
        raise Finding(f"{sum(len(r.live) for r in rails)} bandwidth-run objects were never released")
    if any(r.runs > 1 for r in rails):
        raise Finding("more than one bandwidth run in a session")
    if f.registered_bytes_peak > pm.SESSION_MAX_REGISTERED or f.qps_peak > pm.SESSION_MAX_QPS:
        raise Finding(f"session held {f.registered_bytes_peak} bytes, {f.qps_peak} QPs: over the caps")
    if len(f.refused) != min(f.refused_total, REFUSED_KEPT):
        raise Finding(f"{f.refused_total} refused, {len(f.refused)} recorded")
    for line in b"".join(said).split(b"\n")[:-1]:
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            raise Finding(f"the server sent a line that is not a JSON object: {line[:80]!r}")
    js = json.loads(json.dumps(to_jsonable(f)))
    back = pair_facts(js)
    again = to_jsonable(back) if back is not None else None
    if again != js:
        raise Finding(f"the server's facts do not read back as they were written: {_first_difference(js, again)}")
    pm.format_pair(f)


def seeds() -> list[bytes]:
    """A whole session of each kind, keyed and not, and a few hostile starts."""
    bw = {"op": "bandwidth", "seconds": 1, "size": 1 << 20, "qps": 2, "depth": 1,
          "peers": [{"qpn": 1, "psn": 1}, {"qpn": 2, "psn": 2}]}
    done = {"op": "bw_done", "seconds": 1.0, "bytes": 1 << 21, "gbps": 16.7, "error": None, "seeds": [65, 94],
            "per_qp": [{"index": 0, "writes": 1, "bytes": 1 << 20, "gbps": 8.3}], "counters": None}
    phases = [{"op": "send_pingpong", "size": 64, "n": 3}, {"op": "send_stream", "size": 64, "n": 4},
              {"op": "write", "size": 64}, {"op": "check_write", "size": 64, "seed": 1}, {"op": "bye"}]
    nonce = "5a" * 32
    sessions: list[list[Any]] = [
        [HELLO, *phases],
        [HELLO, bw, done, {"op": "bye"}],
        [HELLO, bw, done, bw, {"op": "bye"}],
        ["KEY", {**HELLO, "nonce": nonce}, "$PROOF", *phases],
        ["KEY", {**HELLO, "nonce": nonce}, "$PROOF", bw, done, {"op": "bye"}],
        ["KEY", {**HELLO, "nonce": nonce}, "$BADPROOF"],
        ["KEY", HELLO, *phases],
        [{**HELLO, "nonce": nonce}],
        ['{"qpn": 1, "psn"'],
        [HELLO, '{"op": "send_stream", "size": 64, "n": NaN}\n'],
    ]
    return [json.dumps(s).encode() for s in sessions] + [b"GET / HTTP/1.0\r\n\r\n", b""]
