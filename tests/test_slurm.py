"""`afddiag preflight --drain` with a fake scontrol that records its arguments, and the Slurm examples."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from afddiag import slurm
from afddiag.cli import run
from conftest import case_dirs, load_case

FABRIC = case_dirs("fabric")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """A scontrol that appends its arguments (one per line, then '--') to calls.txt; exit code from
    FAKE_SCONTROL_RC."""
    log = tmp_path / "calls.txt"
    exe = tmp_path / "scontrol"
    exe.write_text(f"#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\" >> {log}; done\necho -- >> {log}\n"
                   "[ -n \"$FAKE_SCONTROL_RC\" ] && { echo 'slurm_update error: Invalid node name' >&2; "
                   "exit \"$FAKE_SCONTROL_RC\"; }\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("AFDDIAG_SCONTROL", str(exe))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node-7")
    return log


def calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    out, cur = [], []
    for line in log.read_text().splitlines():
        if line == "--":
            out.append(cur)
            cur = []
        else:
            cur.append(line)
    return out


def case(prefix: str) -> Path:
    return next(c for c in FABRIC if c.name.startswith(prefix))


def test_not_fit_drains_the_node_with_the_failing_gates(fake_scontrol, capsys):
    c = case("01-")
    code = run(["preflight", "--drain", "--snapshot", str(c), "--fabric-ip", load_case(c)["fabric_ip"]])
    assert code == 2  # the exit code still says FAIL (a Prolog drains on it)
    assert calls(fake_scontrol) == [["update", "nodename=gpu-node-7", "state=drain",
                                     "reason=afddiag: fabric.first-device"]]
    err = capsys.readouterr().err
    assert "NOT FIT" in err and "drained gpu-node-7 (reason=afddiag: fabric.first-device)" in err


def test_fit_host_is_not_drained(fake_scontrol):
    c = case("02-")
    assert run(["preflight", "--drain", "--snapshot", str(c), "--fabric-ip", load_case(c)["fabric_ip"]]) == 0
    assert calls(fake_scontrol) == []


def test_without_drain_scontrol_is_never_called(fake_scontrol):
    c = case("01-")
    assert run(["preflight", "--snapshot", str(c), "--fabric-ip", load_case(c)["fabric_ip"]]) == 2
    assert calls(fake_scontrol) == []


def test_scontrol_failure_is_reported_and_the_exit_code_kept(fake_scontrol, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_SCONTROL_RC", "1")
    c = case("01-")
    assert run(["preflight", "--drain", "--snapshot", str(c), "--fabric-ip", load_case(c)["fabric_ip"]]) == 2
    assert len(calls(fake_scontrol)) == 1
    err = capsys.readouterr().err
    assert "Invalid node name" in err and "the node was NOT drained" in err


def test_missing_scontrol_is_reported(monkeypatch, capsys):
    monkeypatch.setenv("AFDDIAG_SCONTROL", "no-such-scontrol-here")
    assert slurm.drain_node(["fabric.link"]) is False
    assert "no-such-scontrol-here not found: the node was NOT drained" in capsys.readouterr().err


def test_drain_command_shape(monkeypatch):
    monkeypatch.delenv("AFDDIAG_SCONTROL", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setattr(slurm.socket, "gethostname", lambda: "node12.cluster.example")
    assert slurm.drain_command(["a.b", "c.d"]) == ["scontrol", "update", "nodename=node12", "state=drain",
                                                   "reason=afddiag: a.b, c.d"]
    monkeypatch.setenv("AFDDIAG_SCONTROL", "sudo -n scontrol")
    argv = slurm.drain_command(["g" * 300])
    assert argv[:3] == ["sudo", "-n", "scontrol"] and len(argv[-1]) == len("reason=") + slurm.REASON_MAX_CHARS


def test_slurm_examples_are_valid_shell_and_use_the_documented_calls():
    d = REPO / "playbooks" / "slurm"
    prolog, health = d / "prolog.sh", d / "healthcheck.sh"
    for f in (prolog, health):
        assert subprocess.run(["bash", "-n", str(f)], capture_output=True).returncode == 0, f
        assert os.access(f, os.X_OK), f"{f} is not executable"
    assert "afddiag preflight" in prolog.read_text() and "--drain" not in prolog.read_text()
    assert "preflight" in health.read_text() and "--drain" in health.read_text()
    readme = (d / "README.md").read_text()
    assert "HealthCheckProgram" in readme and "Prolog" in readme


def test_healthcheck_example_drains_through_the_fake(fake_scontrol, tmp_path):
    """The HealthCheckProgram example, run with a snapshot of an unfit host, drains through scontrol
    and exits 0 (Slurm ignores the exit code anyway)."""
    c = case("01-")
    env = dict(os.environ, AFDDIAG=f"{sys.executable} -m afddiag", AFDDIAG_ARGS=f"--snapshot {c} "
               f"--fabric-ip {load_case(c)['fabric_ip']}", PYTHONPATH=str(REPO))
    p = subprocess.run(["bash", str(REPO / "playbooks" / "slurm" / "healthcheck.sh")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert calls(fake_scontrol) == [["update", "nodename=gpu-node-7", "state=drain",
                                     "reason=afddiag: fabric.first-device"]]


def test_prolog_example_exits_non_zero_when_unfit(fake_scontrol):
    c = case("01-")
    env = dict(os.environ, AFDDIAG=f"{sys.executable} -m afddiag", AFDDIAG_ARGS=f"--snapshot {c} "
               f"--fabric-ip {load_case(c)['fabric_ip']}", PYTHONPATH=str(REPO))
    p = subprocess.run(["bash", str(REPO / "playbooks" / "slurm" / "prolog.sh")], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode != 0 and "NOT FIT" in p.stderr
    assert calls(fake_scontrol) == []  # the Prolog leaves draining to slurmd
