"""The local run history: appended by every run, bounded, safe against a killed writer and concurrent
runs; `afddiag history` shows verdict changes and load-probe drift."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from click.testing import CliRunner

from afddiag import history
from afddiag.cli import cli, run
from conftest import case_dirs, load_case

FABRIC = case_dirs("fabric")
GPU = case_dirs("gpu")
REPO = Path(__file__).resolve().parent.parent


def report(host="h1", verdicts=None, figures=None, t="2026-11-30T10:00:00+00:00", code=0):
    """A minimal JSON report: ``verdicts`` {gate: verdict}, ``figures`` {uuid: under_load dict}."""
    verdicts = verdicts or {"fabric.link": "PASS"}
    devices = [{"index": i, "uuid": u, "name": "NVIDIA GB10", "under_load": ul}
               for i, (u, ul) in enumerate((figures or {}).items())]
    return {"schema_version": 1, "host": host, "source": "live", "generated_at": t, "inputs": {"role": "expert"},
            "gates": [{"id": g, "verdict": v, "summary": "", "remedy": ""} for g, v in verdicts.items()],
            "exit_code": code, "counts": {}, "device_map": {}, "facts": {"gpu": {"devices": devices}}}


def invoke(args):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return res.stdout, res.return_value


def test_store_is_in_the_state_dir_in_wal_mode(tmp_path):
    rid = history.append(report(), "all")
    path = tmp_path / "state" / "history.sqlite3"
    assert rid == 1 and history.default_path() == path and path.is_file()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT host, command, role, exit_code FROM runs").fetchall() == [("h1", "all", "expert", 0)]
    assert json.loads(con.execute("SELECT report FROM runs").fetchone()[0])["host"] == "h1"


def test_every_command_appends_and_no_history_skips(tmp_path):
    case = next(c for c in FABRIC if c.name.startswith("01-"))
    fip = load_case(case)["fabric_ip"]
    for cmd in ("fabric", "gpu", "all"):
        invoke([cmd, "--json", "--snapshot", str(case), "--fabric-ip", fip] if cmd != "gpu"
               else [cmd, "--json", "--snapshot", str(case)])
    assert run(["preflight", "--snapshot", str(case), "--fabric-ip", fip]) == 2
    invoke(["all", "--json", "--snapshot", str(case), "--no-history"])
    assert run(["preflight", "--snapshot", str(case), "--no-history"]) in (0, 2)
    con = sqlite3.connect(tmp_path / "state" / "history.sqlite3")
    assert [r[0] for r in con.execute("SELECT command FROM runs ORDER BY id")] == ["fabric", "gpu", "all", "preflight"]
    host = load_case(case)["host"]
    assert {r[0] for r in con.execute("SELECT host FROM runs")} == {host}


def test_history_shows_when_each_verdict_changed():
    history.append(report(verdicts={"fabric.first-device": "FAIL", "fabric.link": "PASS"},
                          t="2026-11-30T10:00:00+00:00"), "all")
    history.append(report(verdicts={"fabric.first-device": "FAIL", "fabric.link": "PASS"},
                          t="2026-11-30T10:05:00+00:00"), "all")
    history.append(report(verdicts={"fabric.first-device": "PASS", "fabric.link": "PASS"},
                          t="2026-11-30T10:10:00+00:00"), "all")
    history.append(report(verdicts={"fabric.first-device": "PASS", "fabric.link": "WARN"},
                          t="2026-11-30T10:15:00+00:00"), "all")
    history.append(report(host="other", verdicts={"fabric.first-device": "ERROR"}), "all")
    out, code = invoke(["history", "--json", "--host", "h1"])
    assert code == 0
    s = json.loads(out)
    h = s["hosts"]["h1"]
    assert list(s["hosts"]) == ["h1"] and h["runs"] == 4
    assert h["gates"]["fabric.first-device"] == [
        {"verdict": "FAIL", "since": "2026-11-30T10:00:00+00:00", "first_run": 1, "last_run": 2, "runs": 2},
        {"verdict": "PASS", "since": "2026-11-30T10:10:00+00:00", "first_run": 3, "last_run": 4, "runs": 2}]
    assert [x["verdict"] for x in h["gates"]["fabric.link"]] == ["PASS", "WARN"]
    out, _ = invoke(["history", "--gate", "fabric.first-*"])
    assert "fabric.link" not in out and "host other" in out
    assert "FAIL  since 2026-11-30T10:00:00+00:00 (run 1, 2 run(s))" in out
    assert "PASS  since 2026-11-30T10:10:00+00:00 (run 3, 2 run(s))" in out


def test_drift_of_load_figures_vs_the_last_pass():
    good = {"clock_sm_mhz": 2400, "fp32_tflops": 30.0, "bf16_tflops": 200.0, "gemv_gbps": 250.0, "copy_gbps": 200.0}
    slow = {"clock_sm_mhz": 850, "fp32_tflops": 10.5, "bf16_tflops": 70.0, "gemv_gbps": 240.0, "copy_gbps": 190.0}
    history.append(report(verdicts={"gpu.slow-state": "PASS"}, figures={"GPU-a": dict(good, fp32_tflops=29.0)}), "gpu")
    history.append(report(verdicts={"gpu.slow-state": "PASS"}, figures={"GPU-a": good},
                          t="2026-11-30T11:00:00+00:00"), "gpu")
    history.append(report(verdicts={"gpu.slow-state": "SKIP"}), "gpu")  # no figures: not the latest measured
    history.append(report(verdicts={"gpu.slow-state": "FAIL"}, figures={"GPU-a": slow},
                          t="2026-11-30T12:00:00+00:00"), "gpu")
    s = history.summarize()
    d = s["hosts"]["h1"]["drift"]
    assert (d["run"], d["pass_run"], d["pass_at"]) == (4, 2, "2026-11-30T11:00:00+00:00")
    f = d["gpus"]["GPU-a"]["figures"]
    assert f["clock_sm_mhz"] == {"now": 850, "pass": 2400, "change_pct": -64.6}
    assert f["fp32_tflops"]["change_pct"] == -65.0 and f["gemv_gbps"]["change_pct"] == -4.0
    out, _ = invoke(["history"])
    assert "load-probe drift: run 4 (2026-11-30T12:00:00+00:00) vs last PASS run 2" in out
    assert "clock_sm_mhz 2400 -> 850 (-64.6 %)" in out


def test_drift_from_real_gpu_case_readings(tmp_path):
    """The same GB10 healthy (case 01's readings), then stuck in class A (case 02's readings, given
    case 01's UUID), replayed as one host: history shows the slow-state change and the drift."""
    healthy = next(c for c in GPU if c.name.startswith("01-"))
    stuck = next(c for c in GPU if c.name.startswith("02-"))
    uuid = json.loads((healthy / "gpu.json").read_text())["devices"][0]["uuid"]
    snaps = []
    for name, case in (("a", healthy), ("b", stuck)):
        d = tmp_path / name
        d.mkdir()
        g = json.loads((case / "gpu.json").read_text())
        g["devices"][0]["uuid"] = uuid
        (d / "gpu.json").write_text(json.dumps(g))
        (d / "host").write_text("spark-x\n")
        snaps.append(d)
    assert invoke(["gpu", "--json", "--snapshot", str(snaps[0])])[1] in (0, 1)
    assert invoke(["gpu", "--json", "--snapshot", str(snaps[1])])[1] == 2
    assert "spark-x" not in history.summarize()["hosts"]  # replays are not this node's live history
    s = history.summarize(replays=True)
    h = s["hosts"]["spark-x"]
    assert [x["verdict"] for x in h["gates"]["gpu.slow-state"]] == ["PASS", "FAIL"]
    f = h["drift"]["gpus"][uuid]["figures"]
    assert f["clock_sm_mhz"] == {"now": 799, "pass": 2395, "change_pct": -66.6}
    assert f["bf16_tflops"]["change_pct"] == round((36.5 - 91.6) / 91.6 * 100, 1)


def test_history_bounded_by_runs(monkeypatch):
    monkeypatch.setenv("AFDDIAG_HISTORY_MAX_RUNS", "3")
    for i in range(6):
        history.append(report(t=f"2026-11-30T10:0{i}:00+00:00"), "all")
    con = history.connect()
    assert [r[0] for r in con.execute("SELECT id FROM runs ORDER BY id")] == [4, 5, 6]
    assert {r[0] for r in con.execute("SELECT run_id FROM verdicts")} == {4, 5, 6}


def test_history_bounded_by_bytes():
    big = report()
    big["facts"]["blob"] = "x" * 4000
    con = history.connect()
    for _ in range(5):
        con.execute("BEGIN IMMEDIATE")
        history.insert_run(con, big, "all")
        history.prune(con, max_runs=100, max_bytes=10_000)
        con.execute("COMMIT")
    sizes = [r[0] for r in con.execute("SELECT length(report) FROM runs")]
    assert len(sizes) == 2 and sum(sizes) <= 10_000


def test_unwritable_store_still_reports_and_warns_once(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state dir should be")
    monkeypatch.setenv("AFDDIAG_STATE_DIR", str(blocker))
    monkeypatch.setattr(history, "_warned", False)
    case = FABRIC[0]
    assert run(["fabric", "--json", "--snapshot", str(case)]) == 2  # case 01: first-device FAILs
    first = capsys.readouterr()
    assert json.loads(first.out)["gates"]
    assert first.err.count("history not written") == 1
    assert run(["fabric", "--json", "--snapshot", str(case)]) == 2
    assert "history not written" not in capsys.readouterr().err  # once per process
    assert run(["history"]) == 1


def test_history_without_a_store_says_so(capsys):
    assert run(["history"]) == 1
    assert "no history yet" in capsys.readouterr().err


CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from afddiag import history
    def rep(i):
        return {{"host": "k", "generated_at": str(i), "gates": [{{"id": "g", "verdict": "PASS"}}],
                 "exit_code": 0, "facts": {{"pad": "x" * 20000}}}}
    mode = sys.argv[1]
    if mode == "hold":  # three committed runs, then one left open in a transaction
        for i in range(3):
            history.append(rep(i), "all")
        con = history.connect()
        con.execute("BEGIN IMMEDIATE")
        history.insert_run(con, rep(99), "all")
        print("IN-TX", flush=True)
        time.sleep(60)
    elif mode == "loop":  # append as fast as possible until killed
        i = 0
        while True:
            history.append(rep(i), "all")
            i += 1
            if i == 5:
                print("GOING", flush=True)
    elif mode == "many":
        for i in range(int(sys.argv[2])):
            history.append(rep(i), "all")
""")


def child(tmp_path, *args) -> subprocess.Popen:
    """Start the child script (written once: rewriting it while an earlier child is still reading it
    hands that child an empty file, which exits 0 having written nothing)."""
    script = tmp_path / "child.py"
    if not script.exists():
        script.write_text(CHILD.format(repo=str(REPO)))
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ))


def check_intact(path) -> list:
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    return [r[0] for r in con.execute("SELECT generated_at FROM runs ORDER BY id")]


def test_writer_killed_mid_transaction_leaves_earlier_runs(tmp_path):
    p = child(tmp_path, "hold")
    try:
        assert p.stdout.readline().strip() == "IN-TX"
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(10)
    assert p.returncode == -signal.SIGKILL
    path = tmp_path / "state" / "history.sqlite3"
    assert check_intact(path) == ["0", "1", "2"]  # the open transaction is gone, the rest intact
    history.append(report(host="after"), "all")  # the lock died with the writer
    assert check_intact(path)[-1] == "2026-11-30T10:00:00+00:00"


def test_writer_killed_at_a_random_point_leaves_a_sound_store(tmp_path):
    p = child(tmp_path, "loop")
    try:
        assert p.stdout.readline().strip() == "GOING"
        time.sleep(0.3)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(10)
    rows = check_intact(tmp_path / "state" / "history.sqlite3")
    assert len(rows) >= 5 and rows == [str(i) for i in range(len(rows))]


def test_concurrent_runs_all_land(tmp_path):
    n, each = 4, 15
    procs = [child(tmp_path, "many", str(each)) for _ in range(n)]
    for p in procs:
        p.wait(120)
        assert p.returncode == 0
    rows = check_intact(tmp_path / "state" / "history.sqlite3")
    assert len(rows) == n * each
    assert sorted(rows) == sorted(str(i) for i in range(each) for _ in range(n))


def _rep(verdicts, role, t, host="spark-a", source="live"):
    r = report(host=host, verdicts=verdicts, t=t)
    r["inputs"] = {"role": role}
    r["source"] = source
    return r


def test_a_role_change_is_no_repair_replays_stay_apart_and_only_changes_show():
    """The trial: `preflight --role expert` FAILs a gate the generic role skips; a later generic `all`
    is not a FAIL→SKIP repair. A replay of another host's bundle is not this node's history."""
    history.append(_rep({"gpu.slow-state": "FAIL", "fabric.link": "PASS"}, "expert", "2026-12-02T10:00:00+00:00"),
                   "preflight")
    history.append(_rep({"gpu.slow-state": "SKIP", "fabric.link": "PASS"}, "generic", "2026-12-02T10:01:00+00:00"),
                   "all")
    history.append(_rep({"gpu.slow-state": "SKIP", "fabric.link": "FAIL"}, "generic", "2026-12-02T10:02:00+00:00"),
                   "all")
    history.append(_rep({"fabric.link": "FAIL"}, "generic", "2026-12-02T10:03:00+00:00", host="spark-b",
                        source="snapshot /tmp/b.tar.gz"), "all")
    s = history.summarize(changed_only=True)
    assert list(s["hosts"]) == ["spark-a"]  # spark-b's bundle was replayed here: not in the live view
    h = s["hosts"]["spark-a"]
    assert (h["command"], h["role"], h["runs"]) == ("all", "generic", 2)  # the latest run's command and role
    assert list(h["gates"]) == ["fabric.link"] and h["unchanged"] == 1  # gpu.slow-state: SKIP both times
    assert h["other"] == [{"command": "preflight", "role": "expert", "runs": 1, "last": "2026-12-02T10:00:00+00:00"}]
    e = history.summarize(role="expert")["hosts"]["spark-a"]
    assert (e["command"], e["runs"]) == ("preflight", 1)
    assert [x["verdict"] for x in e["gates"]["gpu.slow-state"]] == ["FAIL"]
    r = history.summarize(replays=True)
    assert list(r["hosts"]) == ["spark-b"] and r["replays"]
    out, code = invoke(["history"])  # the CLI: changes by default, the other runs named
    assert code == 0 and "fabric.link" in out and "gpu.slow-state" not in out
    assert "live runs" in out and "not compared: 1 run(s) of `preflight --role expert`" in out
    assert "spark-b" not in out
    out, _ = invoke(["history", "--all-gates"])
    assert "gpu.slow-state" in out
    out, _ = invoke(["history", "--replays"])
    assert "spark-b" in out and "snapshot replays" in out and "spark-a" not in out


def test_preflight_export_records_the_report_that_gives_its_exit_code(tmp_path):
    """preflight --export exits on the launch as it will be (its exports laid over the launch env):
    history keeps that report, so its last run agrees with the exit code (no FAIL left when it exits 0)."""
    case = next(c for c in FABRIC if c.name.startswith("01-spark-fabric-ip-on-nonfirst-device"))
    fip = load_case(case)["fabric_ip"]
    before = invoke(["preflight", "--snapshot", str(case), "--fabric-ip", fip, "--no-history"])[1]
    assert before == 2  # without the exports the first device has no IPv4 GID
    _, code = invoke(["preflight", "--export", "--snapshot", str(case), "--fabric-ip", fip])
    assert code == 0
    con = sqlite3.connect(tmp_path / "state" / "history.sqlite3")
    rid, exit_code, rep = con.execute("SELECT id, exit_code, report FROM runs ORDER BY id DESC LIMIT 1").fetchone()
    verdicts = dict(con.execute("SELECT gate, verdict FROM verdicts WHERE run_id = ?", (rid,)).fetchall())
    assert verdicts["fabric.first-device"] == "PASS", verdicts
    assert exit_code in (0, 1) and not [g for g, v in verdicts.items() if v in ("FAIL", "ERROR")], verdicts
    assert {g["id"]: g["verdict"] for g in json.loads(rep)["gates"]} == verdicts


def test_the_table_carries_the_plain_texts_drift_and_empty_lines():
    import io

    from afddiag.history import format_text, write_history

    drift = {"run": 4, "at": "t4", "pass_run": 2, "pass_at": "t2",
             "gpus": {"0": {"name": "GB10",
                            "figures": {"clock_sm_mhz": {"now": 850, "pass": 2400, "change_pct": -64.6}}}}}
    hs = {"runs": 4, "command": "gpu", "role": None, "first": "t1", "last": "t4", "gates": {}, "unchanged": 0,
          "other": [], "drift": drift}
    for summary in ({"path": "h.db", "hosts": {"n1": hs}}, {"path": "h.db", "hosts": {}, "replays": True}):
        buf = io.StringIO()
        write_history(summary, buf, width=200)
        table = buf.getvalue().splitlines()
        for line in format_text(summary).splitlines()[1:]:  # under the head: the same words in both
            assert line.rstrip() in [t.rstrip() for t in table], line
