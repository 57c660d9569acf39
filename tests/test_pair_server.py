"""`afddiag fabric --serve` as a listener on a shared fabric: the pair key (HMAC-SHA256 challenge-response
each way, a key file that obeys the file rules), one bandwidth run and capped resources per session, no
core spent on a silent client (getrusage), and the session's end at its deadline whatever the client does.

No RDMA device: ``_open`` gives the fake rail of test_hostile_pair (the real ``_Rdma.poll`` over an empty
CQ where the CPU spent waiting for completions is measured)."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import resource
import socket
import threading

import pytest

from afddiag import cli
from afddiag.atomic import SecretFileError, read_secret
from afddiag.model.fabric import FabricFacts
from afddiag.probes import pair as pm
from test_hostile_pair import (
    GID,
    HELLO,
    SERVER_HELLO,
    FakeRail,
    _connect,
    _ended,
    _free_port,
    _hostile_client,
    _hostile_server,
    _line,
)


def _fake_open(rail_class):
    def _open(fabric, fabric_ip, buf, facts):
        facts.device, facts.port, facts.gid_index, facts.gid, facts.fabric_ip = "fake0", 1, 1, GID, "127.0.0.1"
        return rail_class()

    return _open


@pytest.fixture
def fake_rail(monkeypatch):
    monkeypatch.setattr(pm, "_open", _fake_open(FakeRail))


KEY = b"k" * 24 + b"-shared-fabric-key"
OTHER_KEY = b"o" * 24 + b"-shared-fabric-key"


def _serve(port, timeout_s=4.0, key=None, peer="127.0.0.1", name=None):
    box: dict = {}

    def run():
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        box["f"] = pm.serve(port, bind="127.0.0.1", timeout_s=timeout_s, fabric=FabricFacts(), peer=peer, key=key)
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        box["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)

    t = threading.Thread(target=run, daemon=True, name=name or f"serve-{port}")
    t.start()
    return t, box


def _client(port, key=None, timeout_s=4.0):
    return pm.pair("127.0.0.1", port, timeout_s=timeout_s, fabric=FabricFacts(), key=key, sizes=(64,))


def _mac(key: bytes, label: bytes, first: str, second: str, hello: dict) -> str:
    """The proof as the protocol defines it (HMAC-SHA256 over label, both nonces and the sender's QP
    fields qpn, psn, gid, mtu, addr, rkey as a compact JSON list), computed here."""
    bound = json.dumps([hello.get(k) for k in ("qpn", "psn", "gid", "mtu", "addr", "rkey")], separators=(",", ":"))
    return hmac.new(key, label + bytes.fromhex(first) + bytes.fromhex(second) + bound.encode(),
                    hashlib.sha256).hexdigest()


def _read_line(s: socket.socket) -> dict:
    buf = b""
    while b"\n" not in buf:
        chunk = s.recv(4096)
        assert chunk, f"closed after {buf!r}"
        buf += chunk
    return json.loads(buf.split(b"\n", 1)[0])


# --- the pair key ----------------------------------------------------------------------------------

def test_both_sides_with_the_key_prove_it_and_the_session_begins(fake_rail):
    port = _free_port()
    t, box = _serve(port, key=KEY)
    c = _client(port, key=KEY)
    s = _ended(t, box, 8)
    assert c.pair_key and s.pair_key and s.refused_total == 0
    assert s.peer_qp_num == 33 and c.peer_qp_num == 33  # the handshake went through; the fake rail then stops
    assert "fake rail" in c.error and "fake rail" in s.error
    assert "pair key proved" in pm.format_pair(s)


def test_a_client_with_another_key_is_refused_and_told(fake_rail):
    port = _free_port()
    t, box = _serve(port, key=KEY, timeout_s=2.0)
    c = _client(port, key=OTHER_KEY)
    s = _ended(t, box, 6)
    assert "refused this client" in c.error and "does not match" in c.error and not c.pair_key
    assert s.refused_total == 1 and "does not match this server's pair key" in s.refused[0].reason
    assert "proved the pair key within" in s.error and s.peer_qp_num is None


def test_a_client_without_the_key_is_refused_by_a_server_with_one(fake_rail):
    port = _free_port()
    t, box = _serve(port, key=KEY, timeout_s=2.0)
    c = _client(port)
    s = _ended(t, box, 6)
    assert "give the client --pair-key" in c.error
    assert "gave no pair-key proof" in s.refused[0].reason


def test_a_client_with_the_key_refuses_a_server_without_one(fake_rail):
    port = _free_port()
    t, box = _serve(port, timeout_s=2.0)
    c = _client(port, key=KEY)
    s = _ended(t, box, 6)
    assert "started without --pair-key" in c.error and not c.pair_key
    assert "asks for the pair key" in s.refused[0].reason


def test_a_proof_for_one_challenge_or_other_qp_fields_is_refused(fake_rail):
    """Each connection gets its own server nonce: a proof recorded on one connection (a replay) does
    not open another, nor does a proof for other QP fields (a relay pointing the server's QP at its
    own); the right proof on the first still does. All wait at the door together."""
    port = _free_port()
    t, box = _serve(port, key=KEY, timeout_s=8.0)
    nonce = "ab" * 32
    mine = {**HELLO, "nonce": nonce}
    a, b, c = _connect(port), _connect(port), _connect(port)
    try:
        for s, hello in ((a, mine), (b, mine), (c, {**mine, "qpn": 18})):
            s.settimeout(5)
            s.sendall(_line(hello))
        ca, cb, cc = _read_line(a), _read_line(b), _read_line(c)
        assert ca["op"] == cb["op"] == cc["op"] == "challenge" and len({ca["nonce"], cb["nonce"], cc["nonce"]}) == 3
        b.sendall(_line({"op": "auth", "mac": _mac(KEY, pm.AUTH_CLIENT, ca["nonce"], nonce, mine)}))  # a's on b
        assert "does not match" in _read_line(b)["error"]
        c.sendall(_line({"op": "auth", "mac": _mac(KEY, pm.AUTH_CLIENT, cc["nonce"], nonce, mine)}))  # qpn 17's
        assert "does not match" in _read_line(c)["error"]
        a.sendall(_line({"op": "auth", "mac": _mac(KEY, pm.AUTH_CLIENT, ca["nonce"], nonce, mine)}))
        hello = _read_line(a)
        assert hello["qpn"] == 33 and hello["mac"] == _mac(KEY, pm.AUTH_SERVER, nonce, ca["nonce"], hello)
        assert _read_line(a)["op"] == "rts"
        a.sendall(_line({"op": "bye"}))
        s = _ended(t, box, 10, error=False)
    finally:
        for sock in (a, b, c):
            sock.close()
    assert s.pair_key and s.refused_total == 2 and all("does not match" in r.reason for r in s.refused)


@pytest.mark.parametrize("replies,words", [
    ((_line(SERVER_HELLO),), "did not ask for the pair key"),
    ((_line({"op": "challenge", "nonce": "zz"}),), "not 64 hex digits"),
    ((_line({"op": "challenge", "nonce": "cd" * 32}), _line({**SERVER_HELLO, "mac": "00" * 32})),
     "did not prove the pair key"),
    ((_line({"op": "challenge", "nonce": "cd" * 32}), _line(SERVER_HELLO)), "did not prove the pair key"),
    ((_line({"error": "\x1b]52;c;cm0gLXJmIH4K\x07 go away"}),), "refused this client"),
], ids=["no-challenge", "bad-nonce", "wrong-mac", "no-mac", "refusal-with-escapes"])
def test_a_keyed_client_refuses_an_impostor_server(fake_rail, replies, words):
    port, t, _ = _hostile_server(*replies, linger_s=0.5)
    c = _client(port, key=KEY, timeout_s=3.0)
    assert words in c.error and not c.pair_key and c.peer_qp_num is None, c.error
    assert "\x1b" not in c.error and "\x07" not in c.error


def test_the_client_connects_from_its_fabric_ip(monkeypatch):
    """The server's --peer names the client's fabric IP: the client's TCP leaves from it (127.0.0.2
    here), not from the address the kernel would pick toward the server (127.0.0.1)."""
    def _open(fabric, fabric_ip, buf, facts):
        facts.device, facts.port, facts.gid_index, facts.gid = "fake0", 1, 1, GID
        facts.fabric_ip = "127.0.0.2" if facts.role == "client" else "127.0.0.1"
        return FakeRail()

    monkeypatch.setattr(pm, "_open", _open)
    port = _free_port()
    t, box = _serve(port, peer="127.0.0.2")
    c = _client(port)
    s = _ended(t, box, 8)
    assert s.peer == "127.0.0.2" and s.refused_total == 0 and c.peer_qp_num == 33


# --- the key file ------------------------------------------------------------------------------------

def _key_file(tmp_path, mode=0o600, data=KEY):
    p = tmp_path / "pair.key"
    p.write_bytes(data)
    os.chmod(p, mode)
    return p


def test_a_safe_key_file_is_read(tmp_path):
    assert pm.load_key(str(_key_file(tmp_path, data=KEY + b"\n"))) == KEY


@pytest.mark.parametrize("make,words", [
    (lambda d: _key_file(d, mode=0o644), "mode 0644 lets group or others at it: chmod 600"),
    (lambda d: _key_file(d, mode=0o620), "mode 0620"),
    (lambda d: _key_file(d, data=b"short\n"), "at least 16"),
    (lambda d: _key_file(d, data=b"x" * 5000), "over 4096 bytes"),
    (lambda d: d, "is a folder"),
    (lambda d: d / "absent", "No such file"),
], ids=["world-readable", "group-writable", "short", "huge", "folder", "absent"])
def test_an_unsafe_key_file_is_refused_in_one_line(tmp_path, make, words):
    p = make(tmp_path)
    with pytest.raises(ValueError) as e:
        pm.load_key(str(p))
    assert words in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_a_key_file_through_a_link_is_refused(tmp_path):
    real = _key_file(tmp_path)
    link = tmp_path / "link.key"
    link.symlink_to(real)
    with pytest.raises(SecretFileError, match="symbolic link"):
        read_secret(link)


def test_a_fifo_as_key_file_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(SecretFileError, match="is a FIFO, not a regular file"):
        read_secret(fifo)  # an open without O_NONBLOCK would wait here for a writer, forever


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_key_file_owned_by_another_user_is_refused(tmp_path):
    p = _key_file(tmp_path)
    os.chown(p, 4242, 4242)
    with pytest.raises(SecretFileError, match="owned by uid 4242, not by root or you"):
        read_secret(p)


# --- the options ---------------------------------------------------------------------------------------

def test_serve_needs_exactly_one_peer(capsys):
    assert cli.run(["fabric", "--serve"]) == 64
    assert "--serve needs --peer IP" in capsys.readouterr().err
    assert cli.run(["fabric", "--serve", "--peer", "10.0.0.1", "--peer", "10.0.0.2"]) == 64
    assert "exactly one" in capsys.readouterr().err
    assert cli.run(["fabric", "--serve", "--peer", "spark-b"]) == 64


def test_an_unsafe_pair_key_is_a_usage_error_naming_it(tmp_path, capsys):
    p = _key_file(tmp_path, mode=0o644)
    assert cli.run(["fabric", "--serve", "--peer", "10.0.0.1", "--pair-key", str(p)]) == 64
    err = capsys.readouterr().err
    assert err.startswith(f"afddiag: --pair-key {p}: mode 0644") and "chmod 600" in err
    assert cli.run(["fabric", "--pair-key", str(_key_file(tmp_path))]) == 64
    assert "with --serve or --pair" in capsys.readouterr().err


def test_the_help_names_the_peer_and_the_key(capsys):
    from click.testing import CliRunner

    out = CliRunner().invoke(cli.cli, ["fabric", "--help"], terminal_width=200).output
    assert "--pair-key FILE" in out and "HMAC-SHA256" in out and "the one client the pair server accepts" in out


# --- one bandwidth run and capped resources per session ---------------------------------------------

class LoggingRail(FakeRail):
    """The fake rail, logging what the session creates and frees, in order."""

    def __init__(self):
        super().__init__()
        self.log = []

    def bandwidth_objects(self, qps, depth, buf):
        cq, mr, qplist, psns = super().bandwidth_objects(qps, depth, buf)
        self.log.append(("create", len(qplist), buf))
        self.made = [*qplist, mr, cq]
        return cq, mr, qplist, psns

    def release(self, *objs):
        self.log.append(("release", len(objs)))
        return super().release(*objs)


@pytest.fixture
def logging_rail(monkeypatch):
    made = []

    def _open(fabric, fabric_ip, buf, facts):
        facts.device, facts.port, facts.gid_index, facts.gid, facts.fabric_ip = "fake0", 1, 1, GID, "127.0.0.1"
        made.append(LoggingRail())
        return made[-1]

    monkeypatch.setattr(pm, "_open", _open)
    monkeypatch.setattr(pm, "_read_counters", lambda facts: {"values": {}, "notes": []})
    return made


def _ask(qps, size):
    return {"op": "bandwidth", "seconds": 1, "size": size, "qps": qps, "depth": 1,
            "peers": [{"qpn": 1 + i, "psn": 1} for i in range(qps)]}


def test_one_bandwidth_run_per_session_its_objects_freed_before_anything_else(logging_rail):
    port = _free_port()
    t, box = _serve(port, timeout_s=6)
    done = {"op": "bw_done", "seconds": 1.0, "bytes": 0, "gbps": 0.0, "error": None, "seeds": [1, 2], "per_qp": []}
    said = _hostile_client(port, HELLO, _ask(2, 1 << 20), done, _ask(2, 1 << 20), keep_open_s=0.3)
    s = _ended(t, box, 10)
    rail = logging_rail[0]
    assert rail.log == [("create", 2, 2 << 20), ("release", 4)]  # 2 QPs, MR, CQ: freed, never a second set
    assert rail.released == rail.made
    assert "second bandwidth run" in s.error and b"one bandwidth run per session" in said
    assert s.registered_bytes_peak == 2 * max(pm.DEFAULT_SIZES) + (2 << 20) and s.qps_peak == 3


def test_the_largest_run_allowed_fits_the_session_caps_exactly(logging_rail):
    port = _free_port()
    t, box = _serve(port, timeout_s=3)
    qps = int(pm.BW_LIMITS["qps"][1])
    _hostile_client(port, HELLO, _ask(qps, pm.BW_MAX_BUFFER // qps), _line({"op": "bye"}), keep_open_s=0.3)
    s = _ended(t, box, 8)
    assert (s.registered_bytes_peak, s.qps_peak) == (pm.SESSION_MAX_REGISTERED, pm.SESSION_MAX_QPS)
    assert logging_rail[0].log[-1] == ("release", qps + 2)


def test_the_session_budget_refuses_past_a_cap_and_counts_nothing():
    b = pm.SessionBudget(max_bytes=100, max_qps=2)
    b.take(60, 1, "first")
    with pytest.raises(pm.PairError, match="would hold 120 bytes and 2 QPs in this session: the caps are 100"):
        b.take(60, 1, "second")
    with pytest.raises(pm.PairError, match="3 QPs"):
        b.take(10, 2, "third")
    assert (b.bytes, b.qps) == (60, 1)
    b.give(60, 1)
    b.take(100, 2, "fourth")
    assert (b.peak_bytes, b.peak_qps) == (100, 2)


# --- the server's end and its CPU, whatever the client does -------------------------------------------

class _EmptyCQ:
    def poll(self, num_entries=1):
        return 0, []


class SilentCompletionsRail(FakeRail):
    """The fake rail with a CQ where nothing ever completes, polled by the real ``_Rdma.poll``."""

    poll = pm._Rdma.poll

    def __init__(self):
        super().__init__()
        self.cq = _EmptyCQ()


def _by_thread_rail(monkeypatch):
    def _open(fabric, fabric_ip, buf, facts):
        facts.device, facts.port, facts.gid_index, facts.gid, facts.fabric_ip = "fake0", 1, 1, GID, "127.0.0.1"
        return SilentCompletionsRail() if "poll" in threading.current_thread().name else FakeRail()

    monkeypatch.setattr(pm, "_open", _open)


CPU_WINDOW_S = 10.0
CPU_SHARE = 0.05  # of one core


def test_a_silent_client_costs_the_server_under_5_percent_of_a_core(monkeypatch):
    """Three clients that connect and then say nothing for the server's whole 10 s: before the
    handshake, after it, and after asking for a SEND stream (the server then waits for completions that
    never come). Each server thread's CPU time (getrusage RUSAGE_THREAD) over its 10 s stays under
    5 % of one core, and each server ends by its deadline."""
    _by_thread_rail(monkeypatch)
    scenarios = {"door": b"", "session": _line(HELLO),
                 "poll": _line(HELLO) + _line({"op": "send_stream", "size": 64, "n": pm.QUEUE_DEPTH})}
    running = {}
    for name, first in scenarios.items():
        port = _free_port()
        t, box = _serve(port, timeout_s=CPU_WINDOW_S, name=f"serve-{name}")
        s = _connect(port)
        s.sendall(first)
        running[name] = (t, box, s)
    try:
        for name, (t, box, _) in running.items():
            f = _ended(t, box, CPU_WINDOW_S + 10)
            assert f.elapsed_s < CPU_WINDOW_S + 2, (name, f.elapsed_s)
            print(f"server waiting on a silent client ({name}): {box['cpu_s']:.3f} s CPU over {f.elapsed_s:.1f} s "
                  f"= {100 * box['cpu_s'] / f.elapsed_s:.2f} % of one core")
            assert box["cpu_s"] <= CPU_SHARE * CPU_WINDOW_S, (name, box["cpu_s"], f.error)
        assert "completion" in running["poll"][1]["f"].error  # it was waiting in the completion poll
    finally:
        for _, _, s in running.values():
            s.close()


def test_a_client_that_floods_requests_and_never_reads_ends_at_the_deadline(fake_rail):
    port = _free_port()
    t, box = _serve(port, timeout_s=2.0)
    s = _connect(port)
    stop = threading.Event()

    def flood():
        try:
            s.sendall(_line(HELLO))
            while not stop.is_set():
                s.sendall(_line({"op": "write", "size": 64}) * 512)
        except OSError:
            pass

    threading.Thread(target=flood, daemon=True).start()
    try:
        f = _ended(t, box, 6)
    finally:
        stop.set()
        s.close()
    assert f.elapsed_s < 4 and "timed out" in f.error, (f.elapsed_s, f.error)


@pytest.mark.parametrize("first", [b"", _line(HELLO)], ids=["at-the-door", "in-the-session"])
def test_a_client_that_drips_bytes_ends_at_the_deadline(fake_rail, first):
    port = _free_port()
    t, box = _serve(port, timeout_s=2.0)
    s = _connect(port)
    s.sendall(first + b'{"op": ')
    try:
        while t.is_alive() and box.get("f") is None:
            try:
                s.sendall(b" ")
            except OSError:
                break
            t.join(0.1)
        f = _ended(t, box, 6)
    finally:
        s.close()
    assert f.elapsed_s < 4, f.elapsed_s
