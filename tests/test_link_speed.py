"""fabric.link-speed: the fabric IP's netdev speed (/sys/class/net/<if>/speed, Mb/s) against the
role's [fabric] link_speed_mbps; table-driven, then a capture round trip of a case with a speed file."""

import json
import shutil

import pytest
from click.testing import CliRunner

from afddiag.capture import collect_bundle, write_bundle
from afddiag.cli import cli
from afddiag.gates import rail
from afddiag.playbook import load
from conftest import CASES

CX7 = CASES / "fabric" / "12-cx7-single-port-healthy"


@pytest.mark.parametrize("speed,expect,verdict,words", [
    (200000, 200000, "PASS", "negotiated 200 Gb/s (role expert expects 200 Gb/s)"),
    (400000, 200000, "PASS", "400 Gb/s"),
    (199999, 200000, "WARN", "below the 200 Gb/s"),
    (100001, 200000, "WARN", "100.001 Gb/s"),
    (100000, 200000, "FAIL", "negotiated 100 Gb/s, role expert expects 200 Gb/s"),
    (25000, 200000, "FAIL", "25 Gb/s"),
    (25000, 0, "PASS", "sets no expected speed"),
    (-1, 200000, "SKIP", "SPEED_UNKNOWN"),
    (None, 200000, "SKIP", "not read"),
])
def test_judge_link_speed(speed, expect, verdict, words):
    got, summary = rail.judge_link_speed("enp1s0f0np0 (rocep1s0f0 port 1)", speed, expect, "expert")
    assert got == verdict and words in summary, summary
    assert summary.startswith("enp1s0f0np0")


def test_expert_expects_200g():
    assert load("expert").link_speed_mbps == 200000
    assert load("generic").link_speed_mbps == 0


def _with_speed(tmp_path, speed):
    snap = tmp_path / "cx7"
    shutil.copytree(CX7, snap)
    (snap / "sys" / "class" / "net" / "ens3np0" / "speed").write_text(f"{speed}\n")
    return snap


def _gate(args, gid="fabric.link-speed"):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    return next(g for g in rep["gates"] if g["id"] == gid)


@pytest.mark.parametrize("speed,verdict", [(200000, "PASS"), (100000, "FAIL"), (150000, "WARN")])
def test_capture_replay_link_speed(tmp_path, speed, verdict):
    """The speed file is captured into the bundle and judged the same from the folder and the bundle."""
    from fakes import case_sources

    snap = _with_speed(tmp_path, speed)
    files, _, _ = collect_bundle(case_sources(snap))
    assert files["sys/class/net/ens3np0/speed"].decode().strip() == str(speed)
    bundle = tmp_path / "b.tar.gz"
    write_bundle(bundle, case_sources(snap))
    args = ["fabric", "--json", "--no-qp", "--role", "expert", "--fabric-ip", "198.51.100.72"]
    direct = _gate(args + ["--snapshot", str(snap)])
    replay = _gate(args + ["--snapshot", str(bundle)])
    assert direct["verdict"] == replay["verdict"] == verdict, direct
    assert direct["facts"]["speed_mbps"] == speed and direct["facts"]["netdev"] == "ens3np0"
    assert direct["summary"].startswith("ens3np0 (mlx5_0 port 1, fabric IP 198.51.100.72)")
    if verdict != "PASS":
        assert direct["commands"] == ["ethtool ens3np0"] and "ethtool" in direct["remedy"]
        # a site that runs the rail slower on purpose changes the expectation, not the link
        assert "link_speed_mbps" in direct["remedy"] and "200 Gb/s" in direct["summary"]


def test_case_without_speed_file_skips():
    v = _gate(["fabric", "--json", "--no-qp", "--snapshot", str(CX7), "--fabric-ip", "198.51.100.72"])
    assert v["verdict"] == "SKIP" and "not read" in v["summary"]


def test_a_speed_refused_live_replays_with_the_same_errno(tmp_path):
    """A netdev whose speed read fails with EINVAL (the link down, as rxe's veths answer in the lab)
    is captured as that refusal (speed.errno), and the replay says what the live run said, not 'not
    captured'; the same bundle without the marker still says not captured."""
    import errno as _errno

    from afddiag.probes.sysfs import read_text
    from fakes import case_sources

    snap = _with_speed(tmp_path, 200000)

    def reader(path):
        if path.endswith("/ens3np0/speed"):
            raise OSError(_errno.EINVAL, "Invalid argument", path)
        return read_text(path)

    files, _, _ = collect_bundle(case_sources(snap, reader=reader))
    assert "sys/class/net/ens3np0/speed" not in files
    assert files["sys/class/net/ens3np0/speed.errno"].decode().strip() == "22"
    bundle = tmp_path / "b.tar.gz"
    write_bundle(bundle, case_sources(snap, reader=reader))
    args = ["fabric", "--json", "--no-qp", "--role", "expert", "--fabric-ip", "198.51.100.72", "--snapshot"]
    v = _gate(args + [str(bundle)])
    assert v["verdict"] == "SKIP" and "not captured" not in v["summary"] and "EINVAL" in v["summary"], v
    (snap / "sys/class/net/ens3np0/speed").unlink()
    v = _gate(args + [str(snap)])
    assert v["verdict"] == "SKIP" and "not captured" in v["summary"], v
