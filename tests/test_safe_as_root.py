"""Issue 22: safe to run as root on a shared fleet — files (items 1, 2), bounds (6), baselines (9) and
unhandled errors (10). Each test is an attack of the issue: a link or a file planted by another uid
(65534, nobody), a hostile playbook or environment setting, a forged baseline, a full stdout."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest

from afddiag import baseline, history
from afddiag.atomic import OutputTargetError, atomic_write
from afddiag.cli import run
from conftest import case_dirs

REPO = Path(__file__).resolve().parent.parent
FABRIC = case_dirs("fabric")
H200 = next(p for p in case_dirs("gpu") if "h200-healthy" in p.name)
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root")


def _shared(tmp_path: Path, name: str = "shared") -> Path:
    """A folder like /tmp: root's, sticky, anyone may write."""
    d = tmp_path / name
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def _plant_link(at: Path, to: Path, uid: int = NOBODY) -> None:
    at.symlink_to(to)
    os.lchown(at, uid, uid)


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.mkdir(exist_ok=True)
    f = v / "shadow"
    f.write_text("root's file\n")
    return f


def _write_via(kind: str, target: Path, tmp_path: Path) -> list[str]:
    """The command line that makes afddiag write ``target`` with ``kind``."""
    snap = str(FABRIC[0])
    if kind == "--output":
        return ["fabric", "--snapshot", snap, "--no-history", "--json", "--output", str(target)]
    if kind == "--prom":
        return ["preflight", "--snapshot", snap, "--no-history", "--prom", str(target)]
    if kind == "--html":
        rep = tmp_path / "r.json"
        if not rep.exists():
            assert run(["fabric", "--snapshot", snap, "--no-history", "--json", "--output", str(rep)]) in (0, 1, 2)
        return ["merge", str(rep), "--html", str(target)]
    raise AssertionError(kind)


WRITERS = ["--output", "--prom", "--html"]


# 1. files: links, other users' files and folders ---------------------------------------------------

@root_only
@pytest.mark.parametrize("kind", WRITERS)
def test_a_link_planted_by_another_user_in_a_shared_folder_is_never_followed(tmp_path, capsys, kind):
    shared, victim = _shared(tmp_path), _victim(tmp_path)
    target = shared / "afddiag.out"
    _plant_link(target, victim)
    code = run(_write_via(kind, target, tmp_path))
    err = capsys.readouterr().err
    assert code == 64, err
    assert f"{kind} {target}: is a symbolic link" in err and "Traceback" not in err
    assert victim.read_text() == "root's file\n" and target.is_symlink()


@root_only
@pytest.mark.parametrize("kind", WRITERS)
def test_another_users_file_in_a_shared_folder_is_never_replaced(tmp_path, capsys, kind):
    shared = _shared(tmp_path)
    target = shared / "afddiag.out"
    target.write_text("nobody's\n")
    os.chown(target, NOBODY, NOBODY)
    assert run(_write_via(kind, target, tmp_path)) == 64
    assert "owned by uid 65534" in capsys.readouterr().err
    assert target.read_text() == "nobody's\n"


@root_only
@pytest.mark.parametrize("kind", WRITERS)
def test_a_shared_folder_takes_a_new_file_and_root_may_replace_its_own(tmp_path, kind):
    shared = _shared(tmp_path)
    target = shared / "afddiag.out"
    for _ in range(2):
        assert run(_write_via(kind, target, tmp_path)) in (0, 1, 2)
        st = os.lstat(target)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_nlink == 1
    assert not [p for p in os.listdir(shared) if p.endswith(".tmp")]


@root_only
def test_a_node_exporter_textfile_folder_owned_by_root_passes(tmp_path):
    textfile = tmp_path / "node_exporter" / "textfile"
    textfile.mkdir(parents=True)
    os.chmod(textfile, 0o755)
    out = textfile / "afddiag.prom"
    assert run(_write_via("--prom", out, tmp_path)) in (0, 1, 2)
    assert "afddiag_gate_status" in out.read_text() and stat.S_IMODE(os.stat(out).st_mode) == 0o644


@root_only
@pytest.mark.parametrize("how", ["owned by nobody", "writable by all", "writable by a group"])
def test_a_folder_another_user_owns_or_can_write_is_refused_naming_it(tmp_path, capsys, how):
    d = tmp_path / "reports"
    d.mkdir()
    if how == "owned by nobody":
        os.chown(d, NOBODY, NOBODY)
    elif how == "writable by all":
        os.chmod(d, 0o777)
    else:
        os.chmod(d, 0o775)
        os.chown(d, 0, NOBODY)
    out = d / "r.json"
    assert run(_write_via("--output", out, tmp_path)) == 64
    err = capsys.readouterr().err
    assert f"folder {d} is" in err and len(err.strip().splitlines()) == 2  # the line and click's "Try ..."
    assert not out.exists()


@root_only
def test_a_folder_link_planted_by_another_user_is_not_followed(tmp_path, capsys):
    shared, victim = _shared(tmp_path), _victim(tmp_path)
    _plant_link(shared / "reports", victim.parent)
    assert run(_write_via("--output", shared / "reports" / "shadow", tmp_path)) == 64
    assert "is a link owned by uid 65534" in capsys.readouterr().err
    assert victim.read_text() == "root's file\n"


@root_only
def test_a_link_planted_while_afddiag_writes_is_not_replaced(tmp_path):
    shared, victim = _shared(tmp_path), _victim(tmp_path)
    target = shared / "r.json"
    with pytest.raises(OutputTargetError, match="while afddiag wrote it: not replaced"):
        with atomic_write(target) as f:
            f.write("report")
            _plant_link(target, victim)  # the race logrotate guards against
    assert target.is_symlink() and victim.read_text() == "root's file\n"
    assert not [p for p in os.listdir(shared) if p.endswith(".tmp")]


@root_only
def test_a_link_to_a_device_planted_by_another_user_is_refused_even_where_devices_are_allowed(tmp_path):
    shared = _shared(tmp_path)
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # stands for /dev/mem, /dev/kmsg
    _plant_link(shared / "r.prom", dev)
    with pytest.raises(OutputTargetError, match="owned by uid 65534"):
        with atomic_write(shared / "r.prom", device_ok=True) as f:
            f.write("x")


@root_only
def test_capture_output_obeys_the_same_rules(tmp_path, capsys):
    shared, victim = _shared(tmp_path), _victim(tmp_path)
    target = shared / "cap.tar.gz"
    _plant_link(target, victim)
    assert run(["capture", "-o", str(target), "--timeout", "1"]) == 64
    assert "is a symbolic link" in capsys.readouterr().err and victim.read_text() == "root's file\n"


@root_only
def test_baseline_record_path_obeys_the_same_rules(tmp_path):
    shared, victim = _shared(tmp_path), _victim(tmp_path)
    _plant_link(shared / "baseline.json", victim)
    readings = {"devices": [{"uuid": "GPU-1", "name": "NVIDIA H200",
                             "under_load": {"clock_sm_mhz": 1980, "achieved": {"fp32_tflops": 60.0}}}]}
    with pytest.raises(OutputTargetError, match="symbolic link"):
        baseline.record(readings, None, "h", shared / "baseline.json")
    assert victim.read_text() == "root's file\n"


# 1./2. the state folder and the history store ------------------------------------------------------

def test_the_state_folder_is_created_0700_and_the_store_0600(tmp_path):
    history.append({"host": "h", "source": "live", "gates": []}, "all")
    state = tmp_path / "state"
    assert stat.S_IMODE(os.stat(state).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(state / "history.sqlite3").st_mode) == 0o600


def test_an_older_store_readable_by_others_is_made_0600(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    sqlite3.connect(state / "history.sqlite3").close()
    os.chmod(state / "history.sqlite3", 0o644)
    history.append({"host": "h", "source": "live", "gates": []}, "all")
    assert stat.S_IMODE(os.stat(state / "history.sqlite3").st_mode) == 0o600


@root_only
def test_a_history_link_planted_in_the_state_folder_is_not_followed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(history, "_warned", False)
    victim = _victim(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    _plant_link(state / "history.sqlite3", victim)
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2) and json.loads(out)["gates"]  # the report is unaffected
    assert "history not written" in err and "symbolic link" in err
    assert victim.read_text() == "root's file\n"


@root_only
@pytest.mark.parametrize("how", ["owned by nobody", "writable by all", "sticky and writable by all"])
def test_a_state_folder_another_user_owns_or_can_write_is_refused(tmp_path, capsys, monkeypatch, how):
    monkeypatch.setattr(history, "_warned", False)
    state = tmp_path / "state"
    state.mkdir()
    if how == "owned by nobody":
        os.chown(state, NOBODY, NOBODY)
    else:
        os.chmod(state, 0o1777 if how.startswith("sticky") else 0o777)
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--json"])
    err = capsys.readouterr().err
    assert code in (0, 1, 2) and "history not written" in err and f"state folder {state}" in err
    assert not (state / "history.sqlite3").exists()
    readings = {"devices": [{"uuid": "GPU-1", "name": "NVIDIA H200",
                             "under_load": {"clock_sm_mhz": 1980, "achieved": {"fp32_tflops": 60.0}}}]}
    with pytest.raises(OutputTargetError, match="state folder"):
        baseline.record(readings, None, "h")
    assert not (state / "baseline.json").exists()


# 6. bounds -----------------------------------------------------------------------------------------

def test_engine_ports_over_the_limit_are_a_usage_error_naming_it(tmp_path, capsys):
    from afddiag.probes.reach import MAX_ATTEMPTS

    env = tmp_path / "l.env"
    env.write_text("AFD_ENGINE_PORTS=" + ",".join(str(p) for p in range(1, 1001)) + "\n")
    assert run(["all", "--launch-env", str(env), "--peer", "10.0.0.9", "--no-history"]) == 64
    err = capsys.readouterr().err
    assert f"limit of {MAX_ATTEMPTS}" in err and "1000 engine port(s)" in err


def test_the_reach_probe_tries_nothing_past_its_limit_and_only_named_ipv4_peers():
    from afddiag.probes.reach import MAX_ATTEMPTS, read_reach

    r = read_reach(["10.0.0.1", "10.0.0.2"], list(range(1, MAX_ATTEMPTS)), None, 0.5)
    assert r["attempts"] == [] and "over the control-plane probe's limit" in r["notes"][0]
    r = read_reach(["localhost"], [1], None, 0.5)  # a name: no lookup, not tried
    assert r["attempts"] == [] and "not an IPv4 address" in r["notes"][0]


def test_a_playbook_port_list_over_the_limit_is_refused(tmp_path, capsys):
    pb = tmp_path / "p.toml"
    pb.write_text("[launch]\nengine_ports = [" + ",".join(str(p) for p in range(1, 400)) + "]\n")
    assert run(["fabric", "--snapshot", str(FABRIC[0]), "--playbook", str(pb), "--no-history"]) == 64
    assert "over the control-plane probe's limit" in capsys.readouterr().err


class _Clock:
    """time for afddiag.probes.qp: each monotonic() call is one second later."""

    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        self.t += 1.0
        return self.t


def test_the_qp_walk_ends_by_its_own_deadline_whatever_the_peer_count(monkeypatch):
    from afddiag.model.fabric import FabricFacts, QpFacts
    from afddiag.probes import qp

    opened = []

    class Context:
        def __init__(self, name):
            opened.append(name)
            raise OSError(19, "no device")

    pv = {"device": types.SimpleNamespace(Context=Context), "enums": None}
    monkeypatch.setattr(qp, "time", _Clock())
    devs = [types.SimpleNamespace(name=f"mlx5_{i}", ports=[]) for i in range(4)]
    monkeypatch.setattr(qp, "choose_sgid", lambda dev, ip: types.SimpleNamespace(port=1, sgid_index=None,
                                                                                 sgid=None, choice="none"))
    facts = QpFacts(ran=True)
    peers = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(100)]
    deadline = qp.time.monotonic() + qp.total_bound(1.0)
    qp._walk_all(pv, FabricFacts(devices=devs), None, peers, 1.0, facts,
                 types.SimpleNamespace(step=lambda what: None), deadline)
    assert len(facts.results) == 4 * 100
    assert 0 < len(opened) <= qp.QP_WALKS_IN_BOUND
    skipped = [r for r in facts.results if (r.error or "").startswith("timed out: not tried")]
    assert len(skipped) == 400 - len(opened)
    assert any("not tried" in n for n in facts.notes)


def test_the_runners_bound_on_the_qp_walk_does_not_grow_with_peers():
    from afddiag.model.run import Inputs
    from afddiag.probes.qp import _bound as _qp_bound

    one = _qp_bound(types.SimpleNamespace(inputs=Inputs(peers=["10.0.0.1"])))
    many = _qp_bound(types.SimpleNamespace(inputs=Inputs(peers=[f"10.0.1.{i}" for i in range(1, 200)])))
    assert one == many


def _playbook_run(capsys, path) -> str:
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--playbook", str(path), "--no-history"])
    err = capsys.readouterr().err
    assert code == 64 and "Traceback" not in err and err.startswith("afddiag: ") and str(path) in err, err
    assert len(err.strip().splitlines()) <= 2, err  # the line, and click's "Try ..." after a usage error
    return err


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "not-utf8"])
def test_a_playbook_that_is_no_text_file_is_one_line(tmp_path, capsys, kind):
    p = tmp_path / "p.toml"
    if kind == "fifo":
        os.mkfifo(p)  # nobody writes it: an unbounded read would hang here
    elif kind == "dev-zero":
        p = Path("/dev/zero")
    elif kind == "folder":
        p.mkdir()
    else:
        p.write_bytes(b'name = "x\xff"\n')
    err = _playbook_run(capsys, p)
    assert {"fifo": "a FIFO", "dev-zero": "a character device", "folder": "is a directory",
            "not-utf8": "not UTF-8"}[kind] in err


@pytest.mark.parametrize("line", ["[gpu]\nreserve_bytes = inf", "[fabric]\nrail_healthy_gbps = nan",
                                  "[timeouts]\nqp_s = inf", "[plan]\nkv_bytes_per_token = inf",
                                  "[gpu]\nreserve_fraction = nan", "gates = \"gpu.*\"", "requires = 3"])
def test_a_playbook_number_that_is_not_finite_or_a_wrong_type_is_one_line(tmp_path, capsys, line):
    p = tmp_path / "p.toml"
    p.write_text(line + "\n")
    _playbook_run(capsys, p)


def test_a_playbook_whose_gates_leave_a_required_component_unjudged_is_refused(tmp_path, capsys):
    p = tmp_path / "p.toml"
    p.write_text('requires = ["gpu", "rdma"]\ngates = ["fabric.*"]\n')
    err = _playbook_run(capsys, p)
    assert "gpu (gate gpu.present)" in err and "rdma" not in err.split("requires", 1)[1].split("but")[0]


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e400", "many"])
def test_a_history_limit_that_is_not_a_finite_number_never_loses_the_report(capsys, monkeypatch, value):
    monkeypatch.setattr(history, "_warned", False)
    monkeypatch.setenv("AFDDIAG_HISTORY_MAX_RUNS", value)
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2) and json.loads(out)["gates"]
    assert "history not written" in err and f"AFDDIAG_HISTORY_MAX_RUNS={value!r}" in err


def _store_with_runs(n: int = 80) -> Path:
    for i in range(n):
        history.append({"host": "h1", "source": "live", "generated_at": f"2026-11-30T10:{i % 60:02d}:00",
                        "gates": [{"id": "gpu.slow-state", "verdict": "PASS" if i % 3 else "FAIL"},
                                  {"id": "fabric.link", "verdict": "PASS"}],
                        "facts": {"gpu": {"devices": [{"uuid": "GPU-1", "under_load": {"clock_sm_mhz": 1900 + i}}]}}},
                       "all")
    con = history.connect()
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return history.default_path()


def test_history_with_a_garbled_report_in_the_store_still_shows(capsys):
    path = _store_with_runs(5)
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET report = '{\"facts\": [1' WHERE id = 5")
    con.execute("UPDATE runs SET report = '[]' WHERE id = 4")
    con.commit()
    con.close()
    assert run(["history"]) == 0
    out, err = capsys.readouterr()
    assert "host h1: 5 run(s)" in out and "Traceback" not in err


def test_history_reads_what_it_can_of_a_damaged_store_and_says_so_in_one_line(capsys):
    path = _store_with_runs()
    clean = path.read_bytes()
    page = 4096
    partial = 0
    for n in range(1, len(clean) // page):
        damaged = bytearray(clean)
        damaged[n * page + 100:(n + 1) * page] = bytes(range(256)) * ((page - 100) // 256) + bytes((page - 100) % 256)
        path.write_bytes(bytes(damaged))
        code = run(["history"])
        out, err = capsys.readouterr()
        assert code in (0, 1) and "Traceback" not in err, (n, err)
        said = [ln for ln in (out + err).splitlines() if "damaged" in ln or "malformed" in ln]
        assert len(said) <= 1, said
        if said and code == 0 and "run(s) that could be read" in said[0]:
            assert "host h1:" in out
            partial += 1
    assert partial, "no damaged page left runs to read"


# 9. baselines --------------------------------------------------------------------------------------

def _baseline_file(tmp_path: Path, figures: dict, mode: int = 0o644) -> Path:
    uuid = json.loads((H200 / "gpu.json").read_text())["devices"][0]["uuid"]
    p = tmp_path / "bl" / "baseline.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(json.dumps({"schema_version": 1, "host": "h", "recorded_at": "2026-12-01T00:00:00+00:00",
                             "gpus": {uuid: {"name": "NVIDIA H200", **figures}}}))
    os.chmod(p, mode)
    return p


def _slow_state(capsys, bl: Path) -> dict:
    code = run(["gpu", "--snapshot", str(H200), "--baseline", str(bl), "--json", "--no-history"])
    rep = json.loads(capsys.readouterr().out)
    assert code == rep["exit_code"]
    return next(g for g in rep["gates"] if g["id"] == "gpu.slow-state") | {"exit_code": code}


def _no_drain(g: dict) -> None:
    assert g["verdict"] != "FAIL" and "power cycle" not in g["remedy"].lower() and g.get("action") != "AC_POWER_CYCLE"


def test_a_baseline_clock_above_the_gpus_maximum_is_ignored_with_a_warn(tmp_path, capsys):
    g = _slow_state(capsys, _baseline_file(tmp_path, {"clock_sm_mhz_under_load": 4000}))
    _no_drain(g)
    assert g["verdict"] == "WARN" and "4000 MHz is above the GPU's maximum SM clock 1980 MHz" in g["summary"]
    assert "baseline record" in g["remedy"]


@pytest.mark.parametrize("figure", [{"bf16_tflops": 5000.0}, {"fp32_tflops": float("inf")}, {"copy_gbps": -1}])
def test_a_baseline_throughput_the_model_cannot_reach_is_ignored_with_a_warn(tmp_path, capsys, figure):
    g = _slow_state(capsys, _baseline_file(tmp_path, figure))
    _no_drain(g)
    assert g["verdict"] == "WARN" and "ignored" in g["summary"]


def test_a_reachable_but_high_baseline_is_still_used(tmp_path, capsys):
    """The control: a figure within the peak is the host's own and is judged against (class B)."""
    g = _slow_state(capsys, _baseline_file(tmp_path, {"fp32_tflops": 66.0}))
    assert g["verdict"] == "FAIL" and "class B" in g["summary"]


def test_a_baseline_file_others_can_write_is_ignored_with_a_warn(tmp_path, capsys):
    g = _slow_state(capsys, _baseline_file(tmp_path, {"fp32_tflops": 66.0}, mode=0o666))
    _no_drain(g)
    assert g["verdict"] == "WARN" and "others can write it (mode 0666)" in g["summary"]


def test_baseline_record_refuses_a_figure_the_gpu_cannot_reach_even_forced(tmp_path):
    from afddiag.gates.refusals import gpu_refusals

    readings = {"devices": [{"index": 0, "uuid": "GPU-1", "name": "NVIDIA H200", "nvml": {"clock_sm_max_mhz": 1980},
                             "under_load": {"clock_sm_mhz": 4000, "utilization_pct": 100,
                                            "achieved": {"bf16_tflops": 640.0}}}]}
    assert any("above the GPU's maximum SM clock 1980" in r for r in gpu_refusals(readings))
    with pytest.raises(ValueError, match="cannot reach"):
        baseline.record(readings, None, "h", tmp_path / "b.json", forced=["anything"])
    assert not (tmp_path / "b.json").exists()


# 10. unhandled errors ------------------------------------------------------------------------------

def test_a_failed_stdout_write_is_one_line_and_exit_3():
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "afddiag", "fabric", "--snapshot", str(FABRIC[0]), "--json",
                            "--no-history"], stdout=full, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert p.returncode == 3
    assert p.stderr.strip().splitlines() == ["afddiag: writing the output: No space left on device"]


def test_an_unexpected_error_is_one_line_and_exit_3_never_the_warn_code(monkeypatch, capsys):
    from afddiag import cli

    def boom(*a, **k):
        raise KeyError("surprise\nsecond line")

    monkeypatch.setattr("afddiag.runner.diagnose", boom)  # the library the command calls
    with pytest.raises(SystemExit) as e:
        cli.main(["fabric", "--snapshot", str(FABRIC[0]), "--no-history"])
    assert e.value.code == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "KeyError" in err and "Traceback" not in err


# beyond the list: a playbook others can write, Ctrl-C ------------------------------------------------

@pytest.mark.parametrize("how", ["file writable by all", "folder writable by all"])
def test_a_playbook_others_can_write_is_refused(tmp_path, capsys, how):
    """A role playbook decides the gates and the bands (a stale-initialization band around the healthy
    figure says REBOOT): one others could have written is no playbook."""
    d = tmp_path / "playbooks"
    d.mkdir()
    p = d / "expert.toml"
    p.write_text('name = "expert"\n')
    os.chmod(p if how.startswith("file") else d, 0o666 if how.startswith("file") else 0o777)
    err = _playbook_run(capsys, p)
    assert "refused" in err and "writ" in err


def test_a_playbook_of_your_own_still_loads(tmp_path):
    p = tmp_path / "expert.toml"
    p.write_text('name = "expert"\n')
    assert run(["fabric", "--snapshot", str(FABRIC[0]), "--playbook", str(p), "--no-history", "--json",
                "--output", str(tmp_path / "r.json")]) in (0, 1, 2)


def test_ctrl_c_during_a_run_is_one_line_and_130(monkeypatch, capsys):
    from afddiag import cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("afddiag.runner.diagnose", interrupted)  # the library the command calls
    with pytest.raises(SystemExit) as e:
        cli.main(["fabric", "--snapshot", str(FABRIC[0]), "--no-history"])
    assert e.value.code == 130 and capsys.readouterr().err.strip() == "afddiag: aborted"
