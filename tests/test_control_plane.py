"""launch.control-plane: bounded TCP connects from the fabric IP to the peers' engine ports, and
advertised addresses that are wildcards or loopback; real sockets on loopback, then a replay."""

import json
import socket

import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from afddiag.gates.launch import bad_advertised, bad_listen
from afddiag.probes.reach import connect_once, read_reach


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    yield s.getsockname()[1]
    s.close()


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_connect_outcomes(listener, monkeypatch):
    assert connect_once("127.0.0.1", listener, "127.0.0.1", 1.0)["outcome"] == "connected"
    r = connect_once("127.0.0.1", _closed_port(), "127.0.0.1", 1.0)
    assert r["outcome"] == "refused" and r["ok"] is False and r["errno"] == 111
    r = connect_once("127.0.0.1", listener, "192.0.2.55", 1.0)  # not an address of this host
    assert r["outcome"] == "bind failed" and "bind 192.0.2.55" in r["error"]
    import afddiag.probes.reach as reach

    class Dropping(socket.socket):  # a firewall that drops: connect() runs out its time bound
        def connect(self, addr):
            raise TimeoutError("timed out")

    class Unreachable(socket.socket):
        def connect(self, addr):
            raise OSError(113, "No route to host")

    monkeypatch.setattr(reach.socket, "socket", Dropping)
    r = connect_once("192.0.2.1", 9, None, 0.3)
    assert r["outcome"] == "timeout" and r["error"] == "no answer within 0.3 s"
    monkeypatch.setattr(reach.socket, "socket", Unreachable)
    assert connect_once("192.0.2.1", 9, None, 0.3)["outcome"] == "unreachable"


def test_read_reach_is_bounded(listener):
    r = read_reach(["127.0.0.1"], [listener, _closed_port()], "127.0.0.1", 2.0)
    assert [a["outcome"] for a in r["attempts"]] == ["connected", "refused"]
    import time

    import afddiag.probes.reach as reach

    def slow(peer, port, source, each):
        time.sleep(each)
        return {"peer": peer, "port": port, "outcome": "timeout"}

    reach_connect = reach.connect_once
    try:
        reach.connect_once = slow
        r = read_reach(["192.0.2.1", "192.0.2.2"], list(range(9, 19)), None, 0.5)
    finally:
        reach.connect_once = reach_connect
    assert len(r["attempts"]) < 20 and r["notes"]  # the rest recorded as not tried


@pytest.mark.parametrize("env,flagged", [
    ({"AFD_ADVERTISE_ADDR": "0.0.0.0"}, ["AFD_ADVERTISE_ADDR"]),
    ({"AFD_COORDINATOR_URL": "http://127.0.0.1:8000/v1"}, ["AFD_COORDINATOR_URL"]),
    ({"MASTER_ADDR": "localhost", "AFD_KV_HOST": "[::1]:5000"}, ["AFD_KV_HOST", "MASTER_ADDR"]),
    ({"AFD_ADVERTISE_ADDR": "10.9.0.1", "AFD_FABRIC_IP": "0.0.0.0", "AFD_BIND_ADDR_X": "0.0.0.0"}, []),
    ({"AFD_ENDPOINT": "spark-a:9000", "AFD_PEER_ADDRESS": "10.9.0.2:29500"}, []),
    # where the engine listens (binds) is no address peers are told: 0.0.0.0 there listens on every address
    ({"AFD_BIND_ADDR": "0.0.0.0", "AFD_LISTEN_HOST": "[::]:8000", "AFD_ENGINE_BIND_ADDRESS": "0.0.0.0:29500"}, []),
    ({"AFD_BIND_ADDR": "0.0.0.0", "AFD_ADVERTISE_ADDR": "0.0.0.0"}, ["AFD_ADVERTISE_ADDR"]),
])
def test_bad_advertised(env, flagged):
    assert [k for k, _, _ in bad_advertised(env)] == flagged


@pytest.mark.parametrize("env,flagged", [
    ({"AFD_BIND_ADDR": "0.0.0.0", "AFD_LISTEN_HOST": "10.9.0.1"}, []),
    ({"AFD_BIND_ADDR": "127.0.0.1:29500", "AFD_LISTEN_URL": "http://localhost:8000", "AFD_ADVERTISE_ADDR": "::1"},
     ["AFD_BIND_ADDR", "AFD_LISTEN_URL"]),
])
def test_bad_listen(env, flagged):
    assert [k for k, _, _ in bad_listen(env)] == flagged


def _gate(tmp_path, attempts, env_lines=("AFD_FABRIC_IP=10.9.0.1",)):
    snap = tmp_path / "snap"
    snap.mkdir(exist_ok=True)
    (snap / "reach.json").write_text(json.dumps({"source": "10.9.0.1", "peers": ["10.9.0.2"], "ports": [29500, 29501],
                                                 "attempts": attempts, "notes": []}))
    env = tmp_path / "r.env"
    env.write_text("\n".join(env_lines) + "\n")
    res = CliRunner().invoke(cli, ["all", "--json", "--snapshot", str(snap), "--launch-env", str(env),
                                   "--peer", "10.9.0.2"], standalone_mode=False, catch_exceptions=False)
    return next(g for g in json.loads(res.stdout)["gates"] if g["id"] == "launch.control-plane")


def _att(port, outcome, error=None):
    return {"peer": "10.9.0.2", "port": port, "source": "10.9.0.1", "ok": outcome == "connected", "outcome": outcome,
            "errno": None, "error": error, "elapsed_ms": 1.0}


@pytest.mark.parametrize("attempts,env,verdict,words,action", [
    ([_att(29500, "connected"), _att(29501, "connected")], (), "PASS", "2 connected", "NONE"),
    ([_att(29500, "connected"), _att(29501, "refused")], (), "PASS", "1 refused (the peer answered", "NONE"),
    ([_att(29500, "connected"), _att(29501, "timeout", "no answer within 2 s")], (), "FAIL",
     "1 of 2 control connection(s) from 10.9.0.1 fail: 10.9.0.2:29501 timeout", "OPEN_PORTS"),
    ([_att(29500, "connected")], ("AFD_ADVERTISE_ADDR=0.0.0.0",), "FAIL", "AFD_ADVERTISE_ADDR=0.0.0.0 is a wildcard",
     "SET_ENV"),
    # the engine's listen (bind) address of 0.0.0.0 beside the fabric IP it advertises: nothing wrong
    ([_att(29500, "connected")], ("AFD_BIND_ADDR=0.0.0.0", "AFD_ADVERTISE_ADDR=10.9.0.1"), "PASS", "1 connected",
     "NONE"),
    ([_att(29500, "connected")], ("AFD_LISTEN_HOST=127.0.0.1",), "FAIL",
     "AFD_LISTEN_HOST=127.0.0.1 is a listen address on loopback: no peer can connect to it", "SET_ENV"),
])
def test_control_plane_replay(tmp_path, attempts, env, verdict, words, action):
    v = _gate(tmp_path, attempts, ("AFD_FABRIC_IP=10.9.0.1",) + env)
    assert v["verdict"] == verdict and words in v["summary"], v["summary"]
    assert v["action"] == action
    # a dropped connection: the route to that peer from the fabric address is the command to run first
    assert v["commands"] == (["ip route get 10.9.0.2 from 10.9.0.1"] if action == "OPEN_PORTS" else [])


def test_no_ports_skips(tmp_path):
    snap = tmp_path / "s"
    snap.mkdir()
    (snap / "env").write_text("AFD_ROLE=expert\n")
    res = CliRunner().invoke(cli, ["all", "--json", "--snapshot", str(snap)], standalone_mode=False)
    v = next(g for g in json.loads(res.stdout)["gates"] if g["id"] == "launch.control-plane")
    assert v["verdict"] == "SKIP"


def test_engine_ports_in_launch_env_are_checked(tmp_path):
    from afddiag.envvars import LaunchEnvError, parse_launch_env

    assert parse_launch_env("AFD_ENGINE_PORTS='29500, 29501'\n")["AFD_ENGINE_PORTS"] == "29500, 29501"
    with pytest.raises(LaunchEnvError, match="not a list of TCP ports"):
        parse_launch_env("AFD_ENGINE_PORTS=29500,http\n")
