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
from snapfix import link_down

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


@pytest.fixture
def fake_sinfo(tmp_path, monkeypatch):
    """A sinfo that prints sinfo.out ("state|reason"); tests write the node's state there."""
    out = tmp_path / "sinfo.out"
    out.write_text("idle|none\n")
    exe = tmp_path / "sinfo"
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {tmp_path / 'sinfo-args.txt'}\n"
                   f"[ -n \"$FAKE_SINFO_RC\" ] && {{ echo 'slurm_load_node: Unable to contact slurm controller' >&2; "
                   f"exit \"$FAKE_SINFO_RC\"; }}\ncat {out}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("AFDDIAG_SINFO", str(exe))
    return out


@pytest.fixture
def slurm_node(fake_scontrol, fake_sinfo, monkeypatch):
    """This host, as preflight sees it, is a recorded case: the library's seam is its inputs, so the
    case's snapshot is judged as this node's data (the CLI refuses --drain with --snapshot). Returns a
    function: (case prefix, sinfo line) → the scontrol log; its ``run(prom=None, **options)`` runs the
    preflight (:class:`afddiag.preflight.PreflightOptions`, no history) as the CLI shows it."""
    from afddiag import runner
    from afddiag.commands.preflight import show
    from afddiag.inputs import make_inputs
    from afddiag.preflight import PreflightOptions

    chosen = {}
    real = runner.diagnose

    def counted(*a, **kw):
        chosen["runs"] = chosen.get("runs", 0) + 1
        return real(*a, **kw)

    monkeypatch.setattr(runner, "diagnose", counted)  # a spy: how many times the host is judged

    def setup(prefix: str | Path, sinfo_line: str = "idle|none"):
        chosen["case"] = prefix if isinstance(prefix, Path) else case(prefix)
        fake_sinfo.write_text(sinfo_line + "\n")
        return fake_scontrol

    def run_preflight(prom: str | None = None, **options) -> int:
        c = chosen["case"]
        inputs = make_inputs(snapshot=str(c), fabric_ip=load_case(c)["fabric_ip"])
        return show(inputs, PreflightOptions(**options), prom, history=False)

    setup.chosen = chosen
    setup.run = run_preflight
    return setup


DOWN_REASON = "afddiag: fabric.link: rocep1s0f1 port 1"  # the down fixture's root, subject first


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


@pytest.fixture
def down(tmp_path):
    """Case 02 with the fabric port's cable out: fabric.link FAIL, action FIX_LINK (needs a person)."""
    return link_down(tmp_path / "down")


def test_not_fit_drains_the_node_with_the_failing_gates(slurm_node, capsys, down):
    log = slurm_node(down)
    code = slurm_node.run(drain=True)
    assert code == 2  # the exit code still says FAIL (a Prolog drains on it)
    [call] = calls(log)
    assert call[:3] == ["update", "nodename=gpu-node-7", "state=drain"]
    # the reason names the gate and the start of its summary, the port first, in one line of 80 bytes
    assert call[3].startswith(f"reason={DOWN_REASON}") and len(call[3].encode()) <= len("reason=") + 80
    err = capsys.readouterr().err
    assert "NOT FIT" in err and f"drained gpu-node-7 (reason={DOWN_REASON}" in err
    assert "[FIX_LINK, drain]" in err  # the action with its drain flag, as every view shows it


def test_a_launch_setting_fault_is_not_drained(slurm_node, capsys):
    """Case 01's fault is the launcher's device map (SET_ENV): draining the node would not fix it."""
    log = slurm_node("01-")
    assert slurm_node.run(drain=True) == 2
    assert calls(log) == []
    err = capsys.readouterr().err
    assert "NOT FIT" in err and "not drained: no fault's action needs the node drained (SET_ENV)" in err


def test_fit_host_is_not_drained(slurm_node):
    log = slurm_node("02-")
    assert slurm_node.run(drain=True) == 0
    assert calls(log) == []


def test_without_drain_scontrol_is_never_called(slurm_node):
    log = slurm_node("01-")
    assert slurm_node.run() == 2
    assert calls(log) == []


def test_drain_refuses_a_snapshot(fake_scontrol, fake_sinfo, capsys):
    c = case("01-")
    for flag in ("--drain", "--resume"):
        assert run(["preflight", flag, "--snapshot", str(c), "--fabric-ip", load_case(c)["fabric_ip"]]) == 64
        assert "--snapshot judges another host's data" in capsys.readouterr().err
    assert calls(fake_scontrol) == []


@pytest.mark.parametrize("line", ["drained|bad DIMM, ticket 4411", "draining|reboot pending", "down*|Not responding",
                                  "idle+drain|maintenance window"])
def test_an_admins_drain_is_never_overwritten(slurm_node, capsys, line, down):
    log = slurm_node(down, line)
    assert slurm_node.run(drain=True) == 2
    assert calls(log) == []
    assert "left as it is" in capsys.readouterr().err


def _reason_of(slurm_node, down) -> str:
    """The reason afddiag drains the ``down`` node with (one run on a node in service)."""
    log = slurm_node(down)
    slurm_node.run(drain=True)
    reason = calls(log)[0][3].split("=", 1)[1]
    log.unlink()
    return reason


def test_own_drain_kept_or_updated(slurm_node, down):
    reason = _reason_of(slurm_node, down)
    log = slurm_node(down, f"drained|{reason}")
    assert slurm_node.run(drain=True) == 2
    assert calls(log) == []  # same reason: nothing to do
    log = slurm_node(down, "drained|afddiag: gpu.slow-state: GPU 0 class A")
    assert slurm_node.run(drain=True) == 2
    assert calls(log) == [["update", "nodename=gpu-node-7", "state=drain", f"reason={reason}"]]


def test_unreadable_state_drains_nothing(slurm_node, monkeypatch, capsys, down):
    log = slurm_node(down)
    monkeypatch.setenv("FAKE_SINFO_RC", "1")
    assert slurm_node.run(drain=True) == 2
    assert calls(log) == []
    assert "Unable to contact slurm controller" in capsys.readouterr().err


@pytest.mark.parametrize("line,resumed", [("drained|afddiag: fabric.first-device", True),
                                          ("draining|afddiag: gpu.slow-state", True),
                                          ("drained|bad DIMM", False), ("down|Not responding", False),
                                          ("idle|none", False), ("allocated|none", False)])
def test_resume_only_what_afddiag_drained(slurm_node, line, resumed):
    log = slurm_node("02-", line)
    assert slurm_node.run(resume=True) == 0
    assert calls(log) == ([["update", "nodename=gpu-node-7", "state=resume"]] if resumed else [])


def test_a_fault_that_needs_a_drain_keeps_the_node_out(slurm_node, down):
    log = slurm_node(down, f"drained|{_reason_of(slurm_node, down)}")
    assert slurm_node.run(drain=True, resume=True) == 2
    assert calls(log) == []  # same reason, still drained, not resumed


def test_a_fault_that_needs_no_drain_lifts_afddiags_drain(slurm_node):
    """Case 01's fault is the launcher's map (SET_ENV): not a reason to keep the node out, so an
    earlier afddiag drain (the link was down then) is lifted; an admin's drain is not."""
    log = slurm_node("01-", "drained|afddiag: fabric.link")
    assert slurm_node.run(drain=True, resume=True) == 2
    assert calls(log) == [["update", "nodename=gpu-node-7", "state=resume"]]
    log.unlink()
    log = slurm_node("01-", "drained|bad DIMM")
    assert slurm_node.run(drain=True, resume=True) == 2
    assert calls(log) == []


def test_one_run_writes_verdict_and_prom(slurm_node, tmp_path, capsys):
    from prometheus_client.parser import text_string_to_metric_families

    slurm_node("01-")
    prom = tmp_path / "tf" / "afddiag.prom"
    prom.parent.mkdir()
    assert slurm_node.run(drain=True, prom=str(prom)) == 2
    assert slurm_node.chosen["runs"] == 1
    assert "NOT FIT" in capsys.readouterr().err
    fams = {f.name: f for f in text_string_to_metric_families(prom.read_text())}
    first = [x for x in fams["afddiag_gate_status"].samples if x.labels["gate"] == "fabric.first-device"]
    assert [(x.labels["command"], x.value) for x in first] == [("preflight", 2.0)]


def test_scontrol_failure_is_reported_and_the_exit_code_kept(slurm_node, monkeypatch, capsys, down):
    log = slurm_node(down)
    monkeypatch.setenv("FAKE_SCONTROL_RC", "1")
    assert slurm_node.run(drain=True) == 2
    assert len(calls(log)) == 1
    err = capsys.readouterr().err
    assert "Invalid node name" in err and "the node was NOT drained" in err


def test_no_load_turns_the_playbooks_load_probe_off():
    from afddiag.inputs import make_inputs
    from afddiag.model.run import wants_load

    assert wants_load(make_inputs(role="expert"))
    assert not wants_load(make_inputs(role="expert", no_load=True))
    assert run(["gpu", "--load", "--no-load"]) == 64


def test_missing_scontrol_or_sinfo_is_reported(fake_sinfo, monkeypatch, capsys):
    monkeypatch.setenv("AFDDIAG_SCONTROL", "no-such-scontrol-here")
    assert slurm.drain_node(["fabric.link"]) is False
    assert "no-such-scontrol-here not found: the node was NOT drained" in capsys.readouterr().err
    monkeypatch.setenv("AFDDIAG_SINFO", "no-such-sinfo-here")
    assert slurm.drain_node(["fabric.link"]) is False
    assert "no-such-sinfo-here not found" in capsys.readouterr().err


def test_drain_command_shape(monkeypatch):
    monkeypatch.delenv("AFDDIAG_SCONTROL", raising=False)
    monkeypatch.delenv("SLURMD_NODENAME", raising=False)
    monkeypatch.setattr(slurm.socket, "gethostname", lambda: "node12.cluster.example")
    assert slurm.drain_command(["a.b: x", "c.d: y"]) == ["scontrol", "update", "nodename=node12", "state=drain",
                                                         "reason=afddiag: a.b: x (+1)"]
    assert slurm.drain_command(["a.b: port\n1\x1b[2J"])[-1] == "reason=afddiag: a.b: port\\n1\\x1b[2J"
    monkeypatch.setenv("AFDDIAG_SCONTROL", "sudo -n scontrol")
    argv = slurm.drain_command(["g" * 300, "h"])
    assert argv[:3] == ["sudo", "-n", "scontrol"] and len(argv[-1]) == len("reason=") + slurm.REASON_MAX_CHARS
    assert argv[-1].endswith("g... (+1)")


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


def _fake_afddiag(tmp_path):
    exe = tmp_path / "afddiag-fake"
    exe.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'afddiag-args.txt'}\nexit 2\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("state,load", [("allocated", False), ("mixed", False), ("idle", True), ("drained", True)])
def test_healthcheck_example_one_run_skips_load_on_busy_nodes(fake_scontrol, fake_sinfo, tmp_path, state, load):
    """The HealthCheckProgram example makes one preflight run that drains, resumes and writes the
    metrics, without the load probe on a node that runs jobs; it exits 0 (Slurm ignores the code)."""
    fake_sinfo.write_text(state + "\n")
    env = dict(os.environ, AFDDIAG=str(_fake_afddiag(tmp_path)), AFDDIAG_ROLE="expert",
               AFDDIAG_PROM=str(tmp_path / "afddiag.prom"), AFDDIAG_ARGS="--peer 192.168.100.11")
    p = subprocess.run(["bash", str(REPO / "playbooks" / "slurm" / "healthcheck.sh")], capture_output=True,
                       text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    args = (tmp_path / "afddiag-args.txt").read_text().split("\n")[:-1]
    assert args[:3] == ["preflight", "--drain", "--resume"]
    assert args[args.index("--prom") + 1] == str(tmp_path / "afddiag.prom")
    assert args[args.index("--role") + 1] == "expert" and args[-2:] == ["--peer", "192.168.100.11"]
    assert ("--no-load" not in args) == load
    assert "-n gpu-node-7" in (tmp_path / "sinfo-args.txt").read_text()


def _prolog(snap, fabric_ip):
    env = dict(os.environ, AFDDIAG=f"{sys.executable} -m afddiag", AFDDIAG_ARGS=f"--snapshot {snap} "
               f"--fabric-ip {fabric_ip}", PYTHONPATH=str(REPO))
    return subprocess.run(["bash", str(REPO / "playbooks" / "slurm" / "prolog.sh")], capture_output=True,
                          text=True, env=env, timeout=120)


def test_prolog_example_exits_non_zero_when_unfit(fake_scontrol, down):
    p = _prolog(down, "192.168.100.11")
    assert p.returncode != 0 and "NOT FIT" in p.stderr
    assert calls(fake_scontrol) == []  # the Prolog leaves draining to slurmd


def test_prolog_example_lets_a_launch_setting_fault_through(fake_scontrol):
    """A Prolog failure drains the node; a wrong device map is the job's launcher, not the node."""
    c = case("01-")
    p = _prolog(c, load_case(c)["fabric_ip"])
    assert p.returncode == 0 and "NOT FIT" in p.stderr and "[SET_ENV]" in p.stderr
