"""Edges found by trying afddiag as a new user: replays ignore this machine's baseline, bad launch
env bytes and shell-unsafe lines, roles that cannot be passed on missing evidence, missing psutil,
a CPU gate with nothing to compare, and a lazily loaded command whose module cannot import."""

import json

import pytest
from click.testing import CliRunner

from afddiag import baseline
from afddiag import cli as climod
from afddiag.cli import cli, run
from afddiag.envvars import LaunchEnvError, parse_launch_env
from afddiag.gates import Context, host, resolve_fabric_ip
from afddiag.model.run import Inputs, Observation
from conftest import CASES

C01 = CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device"
GB10 = CASES / "gpu" / "01-gb10-healthy-unified-memory"


def gates(args):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return {g["id"]: g for g in json.loads(res.stdout)["gates"]}


def test_replay_ignores_this_machines_baseline_unless_named(tmp_path):
    r = json.loads((GB10 / "gpu.json").read_text())
    uuid = r["devices"][0]["uuid"]
    fast = {"devices": [{"uuid": uuid, "name": "NVIDIA GB10",
                         "under_load": {"clock_sm_mhz": 2395, "achieved": {"bf16_tflops": 500.0}}}]}
    baseline.record(fast, {"loop_mops": 1000.0}, "elsewhere")  # the default state-dir baseline
    g = gates(["all", "--json", "--no-history", "--snapshot", str(GB10)])
    assert g["gpu.slow-state"]["verdict"] == "PASS"  # judged by the snapshot's own baseline
    named = baseline.record(fast, None, "elsewhere", tmp_path / "b.json")
    g = gates(["all", "--json", "--no-history", "--snapshot", str(GB10), "--baseline", str(named)])
    assert g["gpu.slow-state"]["verdict"] == "FAIL" and "class B" in g["gpu.slow-state"]["summary"]


def test_launch_env_not_utf8_is_a_usage_error(tmp_path, capsys):
    p = tmp_path / "bin.env"
    p.write_bytes(b"\xff\xfeAFD_ROLE=expert\n")
    assert run(["all", "--no-history", "--launch-env", str(p), "--snapshot", str(C01)]) == 64
    assert "not UTF-8" in capsys.readouterr().err


@pytest.mark.parametrize("line", ["AFD_FABRIC_IP = 10.0.0.1", "AFD_FABRIC_IP= 10.0.0.1", "AFD_FABRIC_IP =10.0.0.1"])
def test_spaces_around_equals_are_refused(line):
    with pytest.raises(LaunchEnvError, match="spaces around '='"):
        parse_launch_env(line + "\n", "f.env")


def test_role_that_requires_hardware_fails_on_a_snapshot_without_it(tmp_path):
    env = tmp_path / "e.env"
    env.write_text("AFD_ROLE=expert\nAFD_FABRIC_IP=192.168.100.10\n")
    g = gates(["all", "--json", "--no-history", "--snapshot", str(C01), "--launch-env", str(env)])
    assert g["gpu.present"]["verdict"] == "FAIL" and "requires a GPU" in g["gpu.present"]["summary"]
    g = gates(["all", "--json", "--no-history", "--snapshot", str(GB10), "--launch-env", str(env)])
    assert g["fabric.rdma-present"]["verdict"] == "FAIL" and "not looked at" in g["fabric.rdma-present"]["summary"]


def test_cpu_probe_without_psutil_says_why(monkeypatch):
    import builtins

    from afddiag.probes import cpu

    real = builtins.__import__

    def no_psutil(name, *a, **kw):
        if name == "psutil":
            raise ImportError("No module named 'psutil'")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_psutil)
    assert "psutil is not installed" in cpu.read_cpu(0.01)["why"]


def test_cpu_gate_skips_when_nothing_is_compared():
    o = Observation("h", "test", cpu={"model": "x", "under_load_mhz": 2400.0, "max_mhz": None, "loop_mops": 5.0})
    v = host.cpu_clock(Context(o, Inputs(), resolve_fabric_ip(None, None)))
    assert v.verdict == "SKIP" and "no baseline" in v.summary


def test_a_command_whose_dependency_is_missing_is_not_available(monkeypatch, capsys, tmp_path):
    """A missing dependency outside afddiag: the command is "not available", saying which (exit 64)."""
    (tmp_path / "afd_fake_fleet.py").write_text("import afd_no_such_dependency\nfleet = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(climod.LAZY_COMMANDS, "fleet", "afd_fake_fleet:fleet")
    assert run(["fleet", "--help"]) == 64
    assert "'fleet' is not available: No module named 'afd_no_such_dependency'" in capsys.readouterr().err


@pytest.mark.parametrize("target, words", [
    ("afddiag.no_such_module:fleet", "No module named 'afddiag.no_such_module'"),
    ("afd_fake_broken:fleet", "cannot import name 'no_such_name' from 'afddiag.render'"),
    ("afddiag.commands.fleet:no_such_command", "has no no_such_command"),
])
def test_a_command_broken_inside_afddiag_surfaces_naming_the_module(monkeypatch, capsys, tmp_path, target, words):
    """An import that fails in afddiag's own code is a bug, not "not available": one line naming the
    command's module and the error, exit 3, from the command and from the group's --help alike."""
    (tmp_path / "afd_fake_broken.py").write_text("from afddiag.render import no_such_name\nfleet = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(climod.LAZY_COMMANDS, "fleet", target)
    module = target.partition(":")[0]
    for argv in (["fleet", "--help"], ["--help"]):
        assert run(argv) == 3, argv
        err = capsys.readouterr().err
        assert f"'fleet' command's module {module}" in err and words in err and "not available" not in err, err
        assert len(err.strip().splitlines()) == 1, err


def test_history_gate_filter_that_matches_nothing_exits_1(capsys):
    assert run(["fabric", "--json", "--snapshot", str(C01)]) == 2  # one recorded run (first-device FAILs)
    capsys.readouterr()
    assert run(["history", "--replays", "--gate", "fabric.link"]) == 0  # a snapshot run: a replay
    capsys.readouterr()
    assert run(["history", "--replays", "--gate", "no.such-gate"]) == 1
    assert "no recorded gate matches 'no.such-gate'" in capsys.readouterr().err
