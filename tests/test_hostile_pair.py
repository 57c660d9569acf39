"""The pair test's TCP control protocol against a hostile peer, and pair.json replays that are corrupt.

No RDMA device is needed: ``_open`` is replaced by a fake rail (QP, MR, connect) so that the real
``serve``/``pair`` code talks to a raw socket playing a peer that sends garbage, truncated or huge
lines, NaN, wrong types, closes mid-line or never answers. At the server's door such a connection is
refused, told why and recorded (``facts.refused``), and the server keeps listening for its client;
inside a session, and on the client, the session ends within its bound with ``error`` naming what
the peer sent, never a raw exception name, and destroys its objects."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from afddiag.cli import run
from afddiag.model.fabric import FabricFacts
from afddiag.probes import pair as pm
from conftest import CASES

FIX = Path(__file__).parent / "fixtures" / "lab-rail"
GID = "0000:0000:0000:0000:0000:ffff:7f00:0001"
HELLO = {"qpn": 17, "psn": 5, "gid": GID, "mtu": 5, "addr": 4096, "rkey": 7, "len": 131072, "device": "x",
         "proto": 2, "mode": "phases"}


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def close(self):
        pass


class FakeRail:
    """What ``_Rdma`` offers the session, with no device: connect succeeds, nothing is posted."""

    def __init__(self):
        self.qp = _Obj(qp_num=33)
        self.mr = _Obj(buf=8192, rkey=9, length=131072, read=lambda n, off=0: b"\0" * n, write=lambda *a: None)
        self.psn, self.mtu_enum, self.connected, self.released = 3, 5, [], []
        self.e = _Obj(IBV_WC_RECV=128)

    def connect(self, peer, qp=None, psn=None):
        self.connected.append(peer)
        return min(5, int(peer["mtu"]))

    def bandwidth_objects(self, qps, depth, buf):
        return (_Obj(), _Obj(buf=0, rkey=1, length=buf, read=lambda n, off=0: b"\0" * n, write=lambda *a: None),
                [_Obj(qp_num=40 + i) for i in range(qps)], [1] * qps)

    def post_recv(self, *a, **kw):
        pass

    def post_send(self, *a, **kw):
        pass

    def poll(self, n, deadline):
        raise pm.PairError("fake rail: no completions")

    def release(self, *objs):
        self.released.extend(objs)
        return True

    def close(self):
        return True


@pytest.fixture
def fake_rail(monkeypatch):
    def _open(fabric, fabric_ip, buf, facts):
        facts.device, facts.port, facts.gid_index, facts.gid, facts.fabric_ip = "fake0", 1, 1, GID, "127.0.0.1"
        return FakeRail()

    monkeypatch.setattr(pm, "_open", _open)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port, timeout_s=4.0):
    box = {}
    t = threading.Thread(target=lambda: box.update(f=pm.serve(port, bind="127.0.0.1", timeout_s=timeout_s,
                                                                peer="127.0.0.1", fabric=FabricFacts())), daemon=True)
    t.start()
    return t, box


def _connect(port, source=None):
    for _ in range(100):
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5,
                                            source_address=(source, 0) if source else None)
        except ConnectionRefusedError:
            time.sleep(0.02)
    raise AssertionError("serve did not listen")


def _line(d):
    return json.dumps(d).encode() + b"\n"


def _hostile_client(port, *chunks, keep_open_s=0.0, source=None):
    """Connect to a serve (from ``source``, an address on loopback, when given) and send ``chunks``
    (bytes, or a dict sent as one line after reading the server's previous line); return what the
    server said."""
    return _hostile_session(port, *chunks, keep_open_s=keep_open_s, source=source)[0]


def _hostile_session(port, *chunks, keep_open_s=0.0, source=None):
    """As :func:`_hostile_client`; returns (what the server said, this connection's local port)."""
    s = _connect(port, source)
    local = s.getsockname()[1]
    got = b""
    s.settimeout(5)
    try:
        for c in chunks:
            s.sendall(c if isinstance(c, bytes) else _line(c))
            if isinstance(c, dict):
                try:
                    got += s.recv(65536)
                except (TimeoutError, OSError):
                    pass
        time.sleep(keep_open_s)
        s.settimeout(0.5)
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    finally:
        s.close()
    return got, local


def _ended(t, box, bound_s, error=True):
    t.join(bound_s)
    assert not t.is_alive(), "serve did not end within its bound"
    f = box["f"]
    assert (bool(f.error) == error) and f.destroyed, f
    assert not (f.error or "").startswith(("KeyError", "TypeError", "ValueError", "AttributeError", "OverflowError",
                                           "JSONDecodeError", "IndexError")), f.error
    return f


# --- a hostile client against `afddiag fabric --serve` ---------------------------------------------

GARBAGE_HANDSHAKES = [  # (what a connection sends, then closes; words of its recorded reason; told why)
    ((b"GET / HTTP/1.0\r\n\r\n",), "not JSON", True),
    ((b"[1, 2]\n",), "not an object", True),
    ((b'{"qpn": 1, "psn": 1, "gid": "' + GID.encode() + b'", "mtu": NaN, "addr": 0, "rkey": 0}\n',), "not JSON", True),
    ((b"\x00\xff\xfe\n",), "not JSON", True),
    ((_line({k: v for k, v in HELLO.items() if k != "qpn"}),), "qpn (missing)", True),
    ((_line({**HELLO, "mtu": 1e308}),), "mtu", True),
    ((_line({**HELLO, "qpn": -1}),), "qpn", True),
    ((_line({**HELLO, "qpn": 1 << 40}),), "qpn", True),
    ((_line({**HELLO, "gid": {"x": 1}}),), "gid", True),
    ((_line({**HELLO, "proto": "two"}),), "proto", True),
    ((_line({**HELLO, "nonce": "00" * 32}),), "started without --pair-key", True),
    ((b'{"qpn": 1, "psn"',), "in the middle of its handshake", False),
    ((b"[" * 10000 + b"\n",), "not JSON", True),
    ((b"",), "without a handshake", False),
    ((b"x" * (pm.ADMIT_MAX_LINE + 10),), f"over {pm.ADMIT_MAX_LINE} bytes without a line end", False),
]


def test_serve_refuses_each_garbage_handshake_naming_it_and_keeps_listening(fake_rail):
    """One server: every garbage handshake (HTTP, an array, NaN, binary, missing or out-of-range fields,
    a pair-key nonce the server has no key for, a line cut at close, deep nesting, a port scan's
    connect-and-close, a long line) is refused and recorded with its reason, the client is told why,
    and the next connection is still served."""
    port = _free_port()
    t, box = _serve(port, timeout_s=30)
    told = {}
    for chunks, words, answered in GARBAGE_HANDSHAKES:
        got, local = _hostile_session(port, *chunks)
        told[local] = (words, answered, got)
    got, _ = _hostile_session(port, HELLO, _line({"op": "bye"}))
    f = _ended(t, box, 35, error=False)
    assert f.peer_qp_num == HELLO["qpn"] and b'"rts"' in got  # the good client was served after all of them
    by_port = {c.port: c for c in f.refused}
    assert f.refused_total == len(GARBAGE_HANDSHAKES) == len(by_port)
    for local, (words, answered, said) in told.items():
        c = by_port[local]
        assert words in c.reason and c.address == "127.0.0.1" and c.at.endswith("Z"), (words, c)
        if answered:
            assert json.loads(said.splitlines()[0])["error"], (words, said)
    text = pm.format_pair(f)
    assert f"refused {len(GARBAGE_HANDSHAKES)} other connection(s)" in text and "accepts 127.0.0.1 only" in text


def test_serve_refuses_a_client_on_another_address_and_serves_the_expected_one(fake_rail):
    """A swapped cable: a client arrives from 127.0.0.2 while the server expects 127.0.0.1. It is told
    and refused, the refusal names its address, and the expected client is still served."""
    port = _free_port()
    t, box = _serve(port, timeout_s=10)
    said, local = _hostile_session(port, HELLO, source="127.0.0.2")
    assert b"expects another client" in said and b"127.0.0.2" in said
    _hostile_client(port, HELLO, _line({"op": "bye"}))
    f = _ended(t, box, 12, error=False)
    assert [(c.address, c.port) for c in f.refused] == [("127.0.0.2", local)]
    assert "not the expected peer 127.0.0.1" in f.refused[0].reason and f.peer == "127.0.0.1"


def test_serve_names_the_stranger_when_the_expected_client_never_comes(fake_rail):
    port = _free_port()
    t, box = _serve(port, timeout_s=1.5)
    _hostile_client(port, HELLO, source="127.0.0.2")
    f = _ended(t, box, 5)
    assert "no client from 127.0.0.1 (--peer)" in f.error and "127.0.0.2: not the expected peer" in f.error
    assert "swapped cable" in f.error


def test_a_port_scan_does_not_take_the_session_and_the_facts_stay_bounded(fake_rail):
    port = _free_port()
    t, box = _serve(port, timeout_s=30)
    for _ in range(pm.REFUSED_KEPT + 8):
        _connect(port).close()  # the first waits for the server thread to listen
    time.sleep(0.3)  # the last closes reach the server before the client below
    _hostile_client(port, HELLO, _line({"op": "bye"}))
    f = _ended(t, box, 35, error=False)
    assert f.refused_total == pm.REFUSED_KEPT + 8 and len(f.refused) == pm.REFUSED_KEPT
    assert all("without a handshake" in c.reason for c in f.refused)


def test_a_silent_connection_does_not_hold_the_door(fake_rail):
    """A connection from the expected address that says nothing is not served first: the client that
    speaks is admitted while it waits, and the silent one is recorded."""
    port = _free_port()
    t, box = _serve(port, timeout_s=10)
    silent = _connect(port)
    try:
        time.sleep(0.2)
        _hostile_client(port, HELLO, _line({"op": "bye"}))
        f = _ended(t, box, 12, error=False)
    finally:
        silent.close()
    assert f.refused_total == 1 and "admitted first" in f.refused[0].reason


def test_a_silent_connection_is_refused_after_the_admission_bound(fake_rail, monkeypatch):
    monkeypatch.setattr(pm, "ADMIT_S", 0.5)
    port = _free_port()
    t, box = _serve(port, timeout_s=10)
    silent = _connect(port)
    try:
        time.sleep(1.0)
        _hostile_client(port, HELLO, _line({"op": "bye"}))
        f = _ended(t, box, 12, error=False)
    finally:
        silent.close()
    assert f.refused_total == 1 and "sent no afddiag handshake within 0.5 s" in f.refused[0].reason


def test_serve_refuses_a_huge_line_in_the_session_without_holding_it(fake_rail):
    """After a good handshake the session's lines may be longer (up to MAX_MESSAGE), never unbounded."""
    port = _free_port()
    t, box = _serve(port, timeout_s=20)
    s = _connect(port)
    sent = 0
    try:
        s.settimeout(5)
        s.sendall(_line(HELLO))
        while sent < 8 * pm.MAX_MESSAGE:
            s.sendall(b"x" * 65536)
            sent += 65536
    except OSError:
        pass  # the server hung up: what it is meant to do
    finally:
        s.close()
    f = _ended(t, box, 10)
    assert f"over {pm.MAX_MESSAGE} bytes" in f.error, f.error


@pytest.mark.parametrize("first", [b"", _line(HELLO), _line(HELLO) + b'{"op": "wri'],
                         ids=["before-hello", "after-hello", "mid-line"])
def test_serve_with_a_silent_client_ends_within_its_bound(fake_rail, first):
    port = _free_port()
    t0 = time.monotonic()
    t, box = _serve(port, timeout_s=1.5)
    s = _connect(port)
    try:
        s.sendall(first)
        f = _ended(t, box, 6)
    finally:
        s.close()
    assert ("timed out" in f.error or "time (--pair-timeout) ran out" in f.error) and time.monotonic() - t0 < 6


@pytest.mark.parametrize("op,words", [
    ({"op": "send_stream", "size": 64, "n": 10 ** 9}, "n 1000000000"),
    ({"op": "send_pingpong", "size": 1 << 30, "n": 1}, "size"),
    ({"op": "send_pingpong", "size": "64", "n": 1}, "size"),
    ({"op": "check_write", "size": 64, "seed": 1e300}, "seed"),
    ({"op": "reboot"}, "unknown control message"),
    ({"size": 64}, "unknown control message"),
], ids=["huge-n", "huge-size", "text-size", "float-seed", "unknown-op", "no-op"])
def test_serve_refuses_out_of_range_phase_requests(fake_rail, op, words):
    port = _free_port()
    t, box = _serve(port)
    _hostile_client(port, HELLO, op)
    f = _ended(t, box, 8)
    assert words in f.error, f.error


@pytest.mark.parametrize("ask,words", [
    (b'{"op": "bandwidth", "seconds": 1e999, "size": 1048576, "qps": 1, "depth": 1, "peers": [{"qpn": 1, "psn": 1}]}\n',
     "seconds inf"),
    (b'{"op": "bandwidth", "seconds": 1, "size": 1e999, "qps": 1, "depth": 1, "peers": [{"qpn": 1, "psn": 1}]}\n',
     "size inf is not an integer"),
    (_line({"op": "bandwidth", "seconds": 1, "size": 1 << 20, "qps": 2, "depth": 1, "peers": [{"qpn": 1, "psn": 1}]}),
     "named 1 QPs for a run of 2"),
    (_line({"op": "bandwidth", "seconds": 1, "size": 1 << 20, "qps": 1, "depth": 1, "peers": ["x"]}),
     "not an object"),
    (_line({"op": "bandwidth", "seconds": 1, "size": 1 << 20, "qps": 1, "depth": 1, "peers": [{"qpn": "1", "psn": 1}]}),
     "qpn"),
    (_line({"op": "bandwidth", "seconds": -5, "size": 1 << 20, "qps": 1, "depth": 1, "peers": []}), "seconds -5"),
    (_line({"op": "bandwidth", "seconds": 1, "size": 4096.5, "qps": 1, "depth": 1, "peers": []}),
     "size 4096.5 is not an integer"),
    (_line({"op": "bandwidth", "seconds": 1, "size": 1 << 20, "qps": 1 << 63, "depth": 1, "peers": []}),
     "qps 9223372036854775808 is not an integer 1..64"),
    (_line({"op": "bandwidth", "seconds": 1, "size": 64 << 20, "qps": 64, "depth": 1, "peers": []}),
     "exceeds 268435456 bytes"),
    (_line({"op": "bandwidth", "seconds": 1, "size": 1 << 20, "qps": 1}), "depth (missing)"),
], ids=["seconds-inf", "size-inf", "peer-count", "peer-text", "qpn-text", "negative-seconds", "float-size",
        "huge-qps", "over-the-buffer-cap", "no-depth"])
def test_serve_refuses_an_absurd_bandwidth_ask_and_says_why_to_the_client(fake_rail, ask, words):
    port = _free_port()
    t, box = _serve(port, timeout_s=3)
    got = _hostile_client(port, HELLO, ask, _line({"op": "bye"}), keep_open_s=0.3)
    t.join(6)
    assert not t.is_alive()
    f = box["f"]
    assert f.bandwidth is not None and words in (f.bandwidth.error or ""), f.bandwidth
    assert b'"error"' in got and f.destroyed
    from afddiag.model import to_jsonable
    from afddiag.model.pair import pair_facts

    saved = json.loads(json.dumps(to_jsonable(f)))  # the refused ask's values live in its error, not as figures
    assert to_jsonable(pair_facts(saved)) == saved


def test_serve_keeps_a_liars_figures_as_its_claim_and_the_gate_does_not_judge_them(fake_rail):
    """A client that reports 1e9 Gb/s for its run: the server records it (the client measures), and
    fabric.rail-bandwidth on the server's result says ERROR (cannot be true), never PASS."""
    port = _free_port()
    t, box = _serve(port, timeout_s=4)
    done = {"op": "bw_done", "seconds": 5.0, "bytes": 1 << 30, "gbps": 1e9, "error": None, "seeds": [0x41],
            "per_qp": [{"index": 0, "writes": 1024, "bytes": 1 << 30, "gbps": 1e9}], "counters": None}
    _hostile_client(port, HELLO, {"op": "bandwidth", "seconds": 1, "size": 1 << 20, "qps": 1, "depth": 1,
                                  "peers": [{"qpn": 1, "psn": 1}]}, done, _line({"op": "bye"}), keep_open_s=0.3)
    t.join(8)
    f = box["f"]
    assert f.bandwidth.gbps == 1e9
    from afddiag.model import to_jsonable

    v = _judge(to_jsonable(f))
    assert v["verdict"] == "ERROR" and "cannot all be true" in v["summary"], v["summary"]


# --- a hostile server against `afddiag fabric --pair` ---------------------------------------------

def _hostile_server(*replies, linger_s=0.5):
    """A listening socket that reads the client's first line and answers ``replies`` (bytes), each after
    the client's next line; after the last it waits ``linger_s`` and hangs up. Returns (port, thread,
    what it received)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    got: list[bytes] = []

    def serve():
        ls.settimeout(10)
        try:
            c, _ = ls.accept()
        except OSError:
            return
        c.settimeout(5)
        with c:
            try:
                got.append(c.recv(65536))
                for i, r in enumerate(replies):
                    c.sendall(r)
                    if i + 1 < len(replies):
                        got.append(c.recv(65536))
            except OSError:
                pass
            time.sleep(linger_s)
        ls.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return ls.getsockname()[1], t, got


def _client(port, timeout_s=4.0, bandwidth=False):
    t0 = time.monotonic()
    f = pm.pair("127.0.0.1", port, timeout_s=timeout_s, fabric=FabricFacts(),
                bandwidth=pm.BandwidthSpec(seconds=1.0, size=1 << 20, qps=1, depth=1) if bandwidth else None)
    assert time.monotonic() - t0 < timeout_s + 3, "the client overran its bound"
    assert f.error and f.destroyed, f
    assert not f.error.startswith(("KeyError", "TypeError", "ValueError", "AttributeError", "OverflowError",
                                   "JSONDecodeError", "IndexError")), f.error
    return f


SERVER_HELLO = {**HELLO, "mode": None, "modes": ["phases", "bandwidth"]}
SERVER_HELLO.pop("mode")


@pytest.mark.parametrize("replies,words", [
    ((b"SSH-2.0-OpenSSH_9.2\r\n",), "not JSON"),
    ((b'"hello"\n',), "not an object"),
    ((_line({**SERVER_HELLO, "gid": None}),), "gid"),
    ((_line({**SERVER_HELLO, "addr": -1}),), "addr"),
    ((b'{"qpn": 1',), "in the middle"),
    ((b"",), "timed out"),
], ids=["ssh-banner", "string", "no-gid", "negative-addr", "closed-mid-line", "silent"])
def test_pair_against_a_garbage_server_ends_bounded_naming_it(fake_rail, replies, words):
    port, t, _ = _hostile_server(*replies, linger_s=3 if replies == (b"",) else 0.2)
    f = _client(port, timeout_s=2.0)
    assert words in f.error, f.error


def test_pair_bandwidth_against_a_server_whose_modes_is_a_string_is_refused(fake_rail):
    """'bandwidth' in "bandwidth-ish" is True for a string: the modes must be a list."""
    port, t, _ = _hostile_server(_line({**SERVER_HELLO, "modes": "bandwidth-ish"}))
    f = _client(port, bandwidth=True)
    assert "modes" in f.error, f.error


def test_pair_bandwidth_against_a_protocol_1_server_says_so_and_says_bye(fake_rail):
    old = {k: v for k, v in SERVER_HELLO.items() if k not in ("proto", "modes")}
    port, t, got = _hostile_server(_line(old) + _line({"op": "rts"}), b"", linger_s=1.0)
    f = _client(port, bandwidth=True)
    t.join(5)
    assert "does not know the bandwidth mode" in f.error and b'"bye"' in b"".join(got)


@pytest.mark.parametrize("answer,words", [
    ({"qps": [{"qpn": 1, "psn": 1}], "addr": "0", "rkey": 1}, "addr"),
    ({"qps": [{"qpn": 1, "psn": 1}], "addr": 0, "rkey": 1 << 40}, "rkey"),
    ({"qps": [[1, 1]], "addr": 0, "rkey": 1}, "not an object"),
    ({"qps": "all of them", "addr": 0, "rkey": 1}, "QPs for a run of 1"),
    ({"error": "x" * 100000}, "refused the bandwidth run"),
], ids=["addr-text", "rkey-huge", "qp-list", "qps-text", "huge-error"])
def test_pair_bandwidth_with_a_garbage_answer_is_an_error_naming_it(fake_rail, answer, words):
    port, t, _ = _hostile_server(_line(SERVER_HELLO) + _line({"op": "rts"}), _line(answer), linger_s=1.0)
    f = _client(port, bandwidth=True)
    assert words in f.error and len(f.error) < 1000, f.error


# --- pair.json replays ----------------------------------------------------------------------------

SNAP = CASES / "fabric" / "02-spark-map-set-healthy"


def _judge(pair_json, raw=None, role="expert"):
    import contextlib
    import io
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        snap = Path(d) / "s"
        shutil.copytree(SNAP, snap)
        (snap / "pair.json").write_text(raw if raw is not None else json.dumps(pair_json))
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            run(["fabric", "--snapshot", str(snap), "--json", "--no-history", "--role", role])
    return next(g for g in json.loads(out.getvalue())["gates"] if g["id"] == "fabric.rail-bandwidth")


def _client_json(**bw):
    b = json.loads((FIX / "bw-client.json").read_text())
    b["bandwidth"].update(bw)
    return b


def _stale(b):
    """The fixture's run made a stale-initialization case: 200 Gb/s link, no error counter grown."""
    b["link_speed_mbps"] = 200000
    b["bandwidth"]["counters"] = []
    return b


@pytest.mark.parametrize("edit,words", [
    ({"gbps": 15.0}, "does not follow from"),
    ({"gbps": 1e9}, "does not follow from"),
    ({"gbps": -5.0}, "negative"),
    ({"gbps": True}, "no Gb/s figure"),
    ({"seconds": None}, "no duration"),
    ({"seconds": -3}, "not a duration"),
    ({"bytes": -100}, "negative"),
], ids=["stale-band-claim", "huge", "negative", "bool", "no-seconds", "negative-seconds", "negative-bytes"])
def test_a_replayed_run_whose_figures_cannot_be_true_is_error_never_reboot_or_pass(edit, words):
    v = _judge(_stale(_client_json(**edit)))
    assert v["verdict"] == "ERROR" and v["action"] == "RERUN", v
    assert words in v["summary"], v["summary"]


def test_a_replayed_run_faster_than_its_link_is_error():
    b = _client_json(seconds=1.0, bytes=25_000_000_000, gbps=200.0, per_qp=[])
    b["link_speed_mbps"] = 100000
    v = _judge(b)
    assert v["verdict"] == "ERROR" and "faster than the link" in v["summary"], v["summary"]


def test_a_true_stale_band_run_is_still_judged_stale():
    """The check does not hide the rule: consistent figures in the band at full speed still FAIL REBOOT."""
    b = _stale(_client_json(seconds=5.0, bytes=10_000_000_000, gbps=16.0, per_qp=[]))
    v = _judge(b)
    assert v["verdict"] == "FAIL" and v["action"] == "REBOOT", v["summary"]


@pytest.mark.parametrize("raw,words", [
    ("[1, 2]", "a JSON array"),
    ('"pair"', "a JSON string"),
    (json.dumps({**json.loads((FIX / "bw-client.json").read_text()), "bandwidth": "fast"}),
     "bandwidth is a JSON string"),
], ids=["array", "string", "bandwidth-string"])
def test_a_pair_json_of_the_wrong_shape_is_error_not_skip(raw, words):
    v = _judge(None, raw=raw)
    assert v["verdict"] == "ERROR" and words in v["summary"], v["summary"]


def test_negative_counter_deltas_in_a_replay_are_noted_not_judged():
    from afddiag.model.pair import port_counters

    pc = port_counters({"side": "peer", "read": True, "delta": {"hw_counters": {"out_of_sequence": -7,
                                                                                 "sent_pkts": 3}}})
    assert pc.delta["hw_counters"] == {"sent_pkts": 3}
    assert any("out_of_sequence" in n and "went back" in n for n in pc.notes)


def test_the_lab_fixtures_are_consistent():
    from afddiag.gates.rail import bandwidth_problem
    from afddiag.model.pair import pair_facts

    for p in sorted(FIX.glob("bw-*.json")):
        f = pair_facts(json.loads(p.read_text()))
        assert bandwidth_problem(f.bandwidth, f.link_speed_mbps) is None, p.name


def test_the_door_admits_a_bounded_number_of_connections_at_once(fake_rail):
    """ADMIT_PENDING silent connections fill the door: the next is refused at once (nothing held for
    it); once they close, the expected client is served."""
    port = _free_port()
    t, box = _serve(port, timeout_s=20)
    silent = [_connect(port) for _ in range(pm.ADMIT_PENDING)]
    time.sleep(0.3)  # all of them accepted
    _, extra = _hostile_session(port)
    for s in silent:
        s.close()
    time.sleep(0.3)
    _hostile_client(port, HELLO, _line({"op": "bye"}))
    f = _ended(t, box, 25, error=False)
    by_port = {c.port: c.reason for c in f.refused}
    assert f"{pm.ADMIT_PENDING} connections were already being admitted" in by_port[extra]
    assert f.refused_total == pm.ADMIT_PENDING + 1 and f.peer_qp_num == HELLO["qpn"]
