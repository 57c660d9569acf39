"""Sick hosts: hung NVML calls, sysfs reads that block, probes that crash, a user who is not root, and
what afddiag writes to disk. Every probe is bounded; a probe that times out or crashes gives ERROR
for its own gates (naming what it was doing) and the run goes on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from afddiag import playbook as pbmod
from afddiag.cli import run
from afddiag.collect import ProbeTimeout, Progress, bounded, guarded
from afddiag.gates import Context, resolve_fabric_ip, run_gates
from afddiag.model.fabric import FabricFacts, QpFacts
from afddiag.model.gpu import GpuDevice, GpuFacts
from afddiag.model.host import HostLimits, ImageFacts
from afddiag.model.run import Inputs, Observation
from conftest import CASES, REPO

C01 = CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device"
FABRIC_FED = {"fabric.rdma-present", "fabric.link", "fabric.mtu", "fabric.link-speed", "fabric.rocev2-ipv4",
              "fabric.first-device"}

HUNG_AT_INIT = '''
import threading
NVML_ERROR_NOT_SUPPORTED = 3
class NVMLError(Exception):
    pass
def nvmlInit(*a, **k):
    threading.Event().wait()  # a driver call that never returns
nvmlInit_v2 = nvmlInit
def nvmlShutdown():
    threading.Event().wait()
'''
HUNG_AT_IMPORT = "import threading\nthreading.Event().wait()\n"


def _cli(args: list[str], env: dict | None = None, cwd: str | None = None, timeout: float = 60.0):
    """``python -m afddiag ARGS`` in a subprocess; returns (rc, report or None, stderr, seconds)."""
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "afddiag", *args], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, cwd=cwd or str(REPO))
    elapsed = time.monotonic() - t
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        rep = None
    return p.returncode, rep, p.stderr, elapsed


def _by_id(rep: dict) -> dict[str, dict]:
    return {g["id"]: g for g in rep["gates"]}


@pytest.mark.parametrize("fake", [HUNG_AT_INIT, HUNG_AT_IMPORT], ids=["nvmlInit-hangs", "import-hangs"])
def test_hung_nvml_cannot_hang_all(tmp_path, fake) -> None:
    (tmp_path / "pynvml.py").write_text(fake)
    rc, rep, err, elapsed = _cli(["all", "--json", "--timeout", "2"],
                                 env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    assert rep is not None, err[-2000:]
    assert "Traceback" not in err
    # bounds: GPU 2 s (+2 s outer margin), fabric/route/CPU well inside theirs; plus interpreter start
    assert elapsed < 12, f"took {elapsed:.1f}s"
    gates = _by_id(rep)
    gpu = {gid: g for gid, g in gates.items() if gid.startswith("gpu.")}
    assert gpu and all(g["verdict"] == "ERROR" for g in gpu.values()), {k: g["verdict"] for k, g in gpu.items()}
    assert "timed out after 2s" in gates["gpu.present"]["summary"]
    in_flight = "nvmlInit" if fake is HUNG_AT_INIT else "import pynvml"
    assert in_flight in gates["gpu.present"]["summary"], gates["gpu.present"]["summary"]
    assert not [gid for gid, g in gates.items() if not gid.startswith("gpu.") and g["verdict"] == "ERROR"]
    assert rc == 3  # ERROR is the worst verdict on this host (no FAIL)


def _snapshot_with_fifo(tmp_path: Path, rel: str) -> tuple[Path, Path]:
    snap = tmp_path / "snap"
    shutil.copytree(C01, snap)
    target = snap / rel
    target.unlink(missing_ok=True)
    os.mkfifo(target)  # opening it for reading blocks until a writer comes: a sysfs read that hangs
    return snap, target


def test_blocking_sysfs_read_is_error_for_fabric_gates_only(tmp_path, monkeypatch, capsys) -> None:
    """A FIFO in a snapshot's sysfs is refused without being opened (issue 13); a read that hangs
    anyway (a hung mount) is cut at the probe's bound. Both: ERROR for the fabric gates alone."""
    snap, fifo = _snapshot_with_fifo(tmp_path, "sys/class/infiniband/roceP2p1s0f1/ports/1/state")
    shutil.copy(CASES / "gpu" / "06-h200-healthy-measured" / "gpu.json", snap / "gpu.json")
    rc, rep, err, elapsed = _cli(["all", "--json", "--timeout", "1.5", "--snapshot", str(snap),
                                  "--fabric-ip", "192.168.100.10"])
    assert rep is not None, err[-2000:]
    assert elapsed < 15, f"took {elapsed:.1f}s"
    gates = _by_id(rep)
    for gid in FABRIC_FED:
        assert gates[gid]["verdict"] == "ERROR", (gid, gates[gid])
        assert "is a FIFO, not a regular file" in gates[gid]["summary"]
        assert str(fifo) in gates[gid]["summary"]  # what it was doing
    assert gates["gpu.present"]["verdict"] == "PASS"  # the GPU facts are not the fabric probe's
    assert gates["fabric.qp-rtr"]["verdict"] == "SKIP"  # a snapshot holds no QP test, stuck sysfs or not
    assert rc == 3

    from afddiag.probes import sysfs

    real = sysfs.read_text

    def hangs(path: str) -> str:
        if path.endswith("roceP2p1s0f1/ports/1/state"):
            time.sleep(5)  # a hung mount: the probe's thread is abandoned at the bound
        return real(path)

    monkeypatch.setattr(sysfs, "read_text", hangs)
    t0 = time.monotonic()
    rc = run(["all", "--json", "--no-history", "--timeout", "1.5", "--snapshot", str(C01),
              "--fabric-ip", "192.168.100.10"])
    assert time.monotonic() - t0 < 4.5
    gates = _by_id(json.loads(capsys.readouterr().out))
    for gid in FABRIC_FED:
        assert gates[gid]["verdict"] == "ERROR" and "did not finish within 1.5 s" in gates[gid]["summary"], gid
        assert "roceP2p1s0f1/ports/1/state" in gates[gid]["summary"]
    assert rc == 3


def test_fifo_where_a_snapshot_json_belongs_is_an_error_not_a_hang(tmp_path) -> None:
    snap, _ = _snapshot_with_fifo(tmp_path, "gpu.json")
    rc, rep, err, elapsed = _cli(["all", "--json", "--timeout", "5", "--snapshot", str(snap)])
    assert rep is not None and elapsed < 15, err[-2000:]
    assert _by_id(rep)["gpu.present"]["verdict"] == "ERROR"  # a refused part is not "not captured" (issue 13)
    assert any("gpu.json refused" in n and "is a FIFO" in n for n in rep["notes"]), rep["notes"]


def test_playbook_timeouts_apply_and_the_flag_overrides(tmp_path, monkeypatch, capsys) -> None:
    from afddiag.probes import sysfs

    pb = tmp_path / "slowhost.toml"
    pb.write_text('name = "slowhost"\n[timeouts]\nfabric_s = 0.7\nqp_s = 9\n')
    real = sysfs.read_text

    def hangs(path: str) -> str:
        if path.endswith("rocep1s0f1/ports/1/rate"):
            time.sleep(3)
        return real(path)

    monkeypatch.setattr(sysfs, "read_text", hangs)
    run(["fabric", "--json", "--no-history", "--snapshot", str(C01), "--playbook", str(pb)])
    assert "did not finish within 0.7 s" in _by_id(json.loads(capsys.readouterr().out))["fabric.link"]["summary"]
    loaded = pbmod.load(path=str(pb))
    inputs = Inputs(playbook=loaded)
    assert inputs.timeout("fabric_s") == 0.7 and inputs.timeout("qp_s") == 9.0
    assert inputs.timeout("gpu_s") == pbmod.DEFAULT_TIMEOUTS["gpu_s"]
    flagged = Inputs(playbook=loaded, probe_timeout_s=3.0, qp_timeout_s=1.0)
    assert flagged.timeout("fabric_s") == 3.0 and flagged.timeout("qp_s") == 1.0
    assert flagged.timeout("load_s") == pbmod.DEFAULT_TIMEOUTS["load_s"]  # --timeout leaves the load budget
    for role in ("generic", "expert", "coordinator"):
        assert set(pbmod.load(role).timeouts) == set(pbmod.DEFAULT_TIMEOUTS), role


@pytest.mark.parametrize("body,word", [("[timeouts]\nfabric_z = 1\n", "fabric_z"),
                                       ("[timeouts]\nfabric_s = 0\n", "0.1..600"),
                                       ("[timeouts]\ngpu_s = \"soon\"\n", "bad value"),
                                       ("timeouts = 3\n", "[timeouts] must be a table")])
def test_bad_timeouts_table_is_a_usage_error(tmp_path, capsys, body, word) -> None:
    pb = tmp_path / "bad.toml"
    pb.write_text('name = "bad"\n' + body)
    assert run(["fabric", "--json", "--snapshot", str(C01), "--playbook", str(pb)]) == 64
    err = capsys.readouterr().err
    assert word in err and len(err.strip().splitlines()) <= 2, err


def test_crashed_probe_is_error_for_its_own_gates(monkeypatch, capsys) -> None:
    def boom(*a, **k):
        raise RuntimeError("cpufreq exploded")

    monkeypatch.setattr("afddiag.probes.cpu.read_cpu", boom)
    rc = run(["all", "--json", "--no-qp"])
    rep = json.loads(capsys.readouterr().out)
    gates = _by_id(rep)
    assert gates["host.cpu-clock"]["verdict"] == "ERROR"
    assert "CPU probe" in gates["host.cpu-clock"]["summary"]
    assert "cpufreq exploded" in gates["host.cpu-clock"]["summary"]
    assert [gid for gid, g in gates.items() if g["verdict"] == "ERROR"] == ["host.cpu-clock"]
    assert rc == 3


def test_crashed_sysfs_probe_in_a_snapshot_names_the_file(monkeypatch, capsys) -> None:
    from afddiag.probes import sysfs

    real = sysfs.read_text

    def flaky(path: str) -> str:
        if path.endswith("/ports/1/phys_state"):
            raise MemoryError("no memory left")  # not an OSError: the probe's own guard lets it through
        return real(path)

    monkeypatch.setattr(sysfs, "read_text", flaky)
    run(["all", "--json", "--snapshot", str(C01), "--fabric-ip", "192.168.100.10"])
    gates = _by_id(json.loads(capsys.readouterr().out))
    link = gates["fabric.link"]
    assert link["verdict"] == "ERROR" and "crashed while reading" in link["summary"] and "phys_state" in link["summary"]
    assert all(gates[g]["verdict"] == "ERROR" for g in FABRIC_FED)
    assert gates["gpu.present"]["verdict"] == "SKIP"


def _ctx(**obs) -> Context:
    o = Observation(host="h", source="test", **obs)
    inputs = Inputs(fabric_ip="192.0.2.1")
    return Context(o, inputs, resolve_fabric_ip(o.fabric, inputs.fabric_ip))


def test_failed_field_turns_exactly_the_fed_gates_to_error() -> None:
    fams = {"fabric", "gpu", "host", "launch"}
    ok_gpu = GpuFacts(available=True, devices=[GpuDevice(index=0, name="NVIDIA H200", sm_count=132)])
    cases = [
        (dict(fabric=FabricFacts(captured=False, failed="fabric probe stuck"), qp=QpFacts(why="x"), gpu=ok_gpu, env={}),
         FABRIC_FED | {"fabric.arp"}),
        (dict(fabric=FabricFacts(captured=False, failed="fabric probe stuck"),
              qp=QpFacts(why="x", failed="not run: fabric probe stuck"), gpu=ok_gpu, env={}),
         FABRIC_FED | {"fabric.arp", "fabric.qp-rtr"}),
        (dict(fabric=FabricFacts(), qp=QpFacts(failed="QP probe stuck"), gpu=ok_gpu, env={}), {"fabric.qp-rtr"}),
        (dict(fabric=FabricFacts(), gpu=GpuFacts(failed="GPU probe stuck"), env={}),
         {"gpu.present", "gpu.sm-count", "gpu.image-arch", "gpu.memory", "gpu.headroom", "gpu.clock-events",
          "gpu.slow-state", "gpu.errors", "gpu.processes"}),
        (dict(fabric=FabricFacts(), gpu=GpuFacts(available=True, devices=ok_gpu.devices, load_failed="load stuck"),
              env={}), {"gpu.slow-state"}),
        (dict(fabric=FabricFacts(), gpu=ok_gpu, env={}, cpu={"why": "x", "failed": "CPU probe stuck"}),
         {"host.cpu-clock"}),
        (dict(fabric=FabricFacts(), gpu=ok_gpu, env={}, limits=HostLimits(captured=False, failed="limits stuck")),
         {"launch.memlock", "launch.uverbs-access"}),
        (dict(fabric=FabricFacts(), gpu=ok_gpu, env={}, image=ImageFacts(ref="img", why="x", failed="inspect stuck")),
         {"gpu.image-arch"}),
    ]
    for obs, want in cases:
        verdicts = {v.id: v for v in run_gates(_ctx(**obs), fams)}
        errors = {gid for gid, v in verdicts.items() if v.verdict == "ERROR"}
        assert errors == {g for g in want if g in verdicts}, (obs, sorted(errors))
        assert all("stuck" in verdicts[g].summary for g in errors)


def test_bounded_reports_what_the_probe_was_doing() -> None:
    import threading

    progress = Progress()
    release = threading.Event()

    def stuck() -> None:
        progress.doing = "reading /sys/x"
        release.wait(30)

    t = time.monotonic()
    with pytest.raises(ProbeTimeout, match=r"within 0.3 s \(stuck reading /sys/x\)"):
        bounded(stuck, 0.3, "probe X", progress)
    release.set()
    assert time.monotonic() - t < 3
    assert guarded(lambda: 1 / 0, 1, "probe Y") == (None, "probe Y crashed (ZeroDivisionError: division by zero)")
    assert guarded(lambda: 7, 1, "probe Z") == (7, None)


def _nobody_can_run() -> str | None:
    if os.geteuid() != 0:
        return "not root: cannot switch to an unprivileged user"
    if not shutil.which("runuser"):
        return "runuser not installed"
    p = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-c", "import afddiag.cli"],
                       capture_output=True, text=True, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    return None if p.returncode == 0 else f"nobody cannot import afddiag here: {p.stderr[-300:]}"


def test_non_root_run_finishes_and_names_what_it_could_not_read(tmp_path) -> None:
    why = _nobody_can_run()
    if why:
        pytest.skip(why)
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(home, 0o777)
    env = {k: v for k, v in os.environ.items() if k not in ("AFDDIAG_STATE_DIR", "XDG_STATE_HOME")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run(["runuser", "-u", "nobody", "--", sys.executable, "-m", "afddiag", "all", "--json",
                        "--timeout", "5"], capture_output=True, text=True, timeout=90, cwd=str(home), env=env)
    assert p.returncode in (0, 1, 2, 3), (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr
    rep = json.loads(p.stdout)
    assert rep["gates"] and all(g["verdict"] in ("PASS", "WARN", "FAIL", "SKIP", "ERROR") for g in rep["gates"])
    assert not [g["id"] for g in rep["gates"] if "gate failed" in g["summary"]]
    text = json.dumps(rep)
    # the kernel log needs root (or CAP_SYSLOG): the report says it could not read it, and why
    assert "not readable: /dev/kmsg" in text and "run as root" in text
    memlock = _by_id(rep)["launch.memlock"]
    assert "nobody" in memlock["summary"]  # limits were read as the unprivileged user, not skipped


def test_gpu_errors_gate_says_why_the_kernel_log_was_not_read() -> None:
    g = GpuFacts(available=True, devices=[GpuDevice(index=0, name="NVIDIA H200")],
                 xid_source="not readable: /dev/kmsg: Operation not permitted (run as root or give --xid-log)")
    v = {x.id: x for x in run_gates(_ctx(gpu=g, fabric=FabricFacts(), env={}), {"gpu"})}["gpu.errors"]
    assert v.verdict == "SKIP" and "/dev/kmsg" in v.summary and "run as root" in v.summary


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_nothing_written_but_the_state_directory(tmp_path) -> None:
    home, cwd, tmp = tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    for d in (home, cwd, tmp):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("AFDDIAG_STATE_DIR", "XDG_STATE_HOME", "AFDDIAG_HISTORY")}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    snap = str(C01)
    runs = [["all", "--json", "--snapshot", snap], ["all", "--snapshot", snap], ["fabric", "--snapshot", snap],
            ["devicemap", "--snapshot", snap], ["catalog"], ["baseline", "show"], ["gpu", "--json", "--timeout", "3"],
            ["preflight", "--snapshot", snap], ["all", "--snapshot", "/nonexistent"]]
    from afddiag.commands.check import all_

    asked = {"report.json"} if any(p.name == "output" for p in all_.params) else set()
    if asked:  # where the user asks for a file, that file and nothing else
        runs.append(["all", "--snapshot", snap, "--format", "json", "--output", str(cwd / "report.json")])
    for args in runs:
        p = subprocess.run([sys.executable, "-m", "afddiag", *args], capture_output=True, text=True, timeout=60,
                           cwd=str(cwd), env=env)
        assert "Traceback" not in p.stderr, (args, p.stderr[-2000:])
    state = home / ".local" / "state" / "afddiag"
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    outside = sorted(w for w in written if not w.startswith(str(state.relative_to(tmp_path)))
                     and w not in {f"cwd/{a}" for a in asked})
    assert outside == [], outside
    assert _tree(cwd) == asked and _tree(tmp) == set()
    if asked:
        assert json.loads((cwd / "report.json").read_text())["gates"]


def test_baseline_file_is_replaced_atomically(tmp_path, monkeypatch) -> None:
    from afddiag import baseline

    path = tmp_path / "baseline.json"
    readings = {"devices": [{"uuid": "GPU-1", "name": "NVIDIA H200",
                             "under_load": {"clock_sm_mhz": 1980, "achieved": {"fp32_tflops": 60.0}}}]}
    baseline.record(readings, None, "h", path)
    before = path.read_bytes()

    def torn(obj, f, **kw):
        f.write('{"schema_version": 1, "gpus": {')  # half a file, then the disk fills up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(baseline.json, "dump", torn)
    with pytest.raises(OSError):
        baseline.record(readings, None, "h", path)
    assert path.read_bytes() == before  # the old baseline is whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline.json"]  # no temporary left behind


def test_map_naming_a_deleted_device_fails_qp_rtr_not_error() -> None:
    """The lab's 'device deleted between runs': the map still names arxe1, only zrxe0 is left."""
    from afddiag.model.fabric import Port, QpResult, RdmaDevice

    fab = FabricFacts(devices=[RdmaDevice(name="zrxe0", index=0, ports=[Port(num=1, state="ACTIVE")])],
                      order_source="netlink")
    qp = QpFacts(ran=True, results=[QpResult(device="zrxe0", port=1, target="10.9.0.1", reached="RTS")])
    env = {"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=arxe1"}
    o = Observation(host="h", source="test", fabric=fab, qp=qp, env=env)
    inputs = Inputs(fabric_ip="10.9.0.2", peers=["10.9.0.1"])
    v = {x.id: x for x in run_gates(Context(o, inputs, resolve_fabric_ip(fab, "10.9.0.2")), {"fabric"})}
    assert v["fabric.qp-rtr"].verdict == "FAIL", v["fabric.qp-rtr"]
    assert "arxe1" in v["fabric.qp-rtr"].summary and "not an RDMA device" in v["fabric.qp-rtr"].summary


def test_qp_walk_past_its_bound_is_error_not_fail() -> None:
    from afddiag.model.fabric import Port, QpResult, QpStep, RdmaDevice

    fab = FabricFacts(devices=[RdmaDevice(name="arxe1", index=0, ports=[Port(num=1, state="ACTIVE")])])
    res = QpResult(device="arxe1", port=1, target="10.9.0.1", reached="INIT", steps=[QpStep(to="INIT", ok=True)],
                   error="timed out after 5s", destroyed=False)
    o = Observation(host="h", source="test", fabric=fab, qp=QpFacts(ran=True, results=[res]), env={})
    v = {x.id: x for x in run_gates(Context(o, Inputs(peers=["10.9.0.1"]), resolve_fabric_ip(fab, None)),
                                    {"fabric"})}["fabric.qp-rtr"]
    assert v.verdict == "ERROR" and "timed out after 5s" in v.summary and "arxe1" in v.summary, v


def test_live_fabric_probe_hang_errors_fabric_and_qp_gates_only(monkeypatch, capsys) -> None:
    import threading

    release = threading.Event()

    def stuck(run, progress=None):
        progress.doing = "reading /sys/class/infiniband/mlx5_0/ports/1/gids/3"
        release.wait(20)

    import dataclasses

    from afddiag.probes import fabric

    monkeypatch.setattr(fabric, "PROBE", dataclasses.replace(fabric.PROBE, read=stuck))
    t = time.monotonic()
    try:
        rc = run(["all", "--json", "--timeout", "0.5", "--fabric-ip", "10.9.0.2"])
    finally:
        release.set()
    assert time.monotonic() - t < 10
    gates = _by_id(json.loads(capsys.readouterr().out))
    errors = {gid for gid, g in gates.items() if g["verdict"] == "ERROR"}
    assert FABRIC_FED | {"fabric.qp-rtr"} <= errors, errors
    assert not [g for g in errors if not g.startswith("fabric.")], errors
    assert "stuck reading /sys/class/infiniband/mlx5_0/ports/1/gids/3" in gates["fabric.qp-rtr"]["summary"]
    assert rc == 3
