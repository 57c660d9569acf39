"""``afddiag npd``: the node-problem-detector custom-plugin contract (issue 25).

The rules of ``deploy/kubernetes/afddiag-monitor.json`` are run the way NPD's custom-plugin monitor runs
them (``pkg/custompluginmonitor/plugin/plugin.go``): the rule's path with its args as a subprocess,
killed at the rule's timeout (at most the global one), stdout trimmed of white space and cut at
``max_output_length`` bytes, exit 0 OK, 1 NonOK, anything else Unknown. The path is the console script
this checkout installed (``.venv/bin/afddiag``, the file the config's ``/usr/local/bin/afddiag`` names
in the image); args, timeout and the output limit are the config's. The reports are those ``afddiag
all --snapshot`` makes of the real-world cases, marked as this node's live run at a chosen time.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from afddiag import npd

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "deploy" / "kubernetes" / "afddiag-monitor.json"
CASES = Path(os.environ.get("AFDDIAG_CASES", REPO.parent / "shared" / "cases"))
EXE = Path(sys.executable).with_name("afddiag")
NPD_STATUS = {0: "OK", 1: "NonOK"}


def _duration(text: str) -> float:
    assert text.endswith("s") and not text.endswith("ms"), text  # the config uses whole seconds
    return float(text[:-1])


@pytest.fixture(scope="module")
def case_reports(tmp_path_factory) -> dict[str, dict]:
    """``afddiag all --snapshot <case> --json`` of the cases these tests use, once per module."""
    out = {}
    home = tmp_path_factory.mktemp("npd-state")
    for name in ("fabric/07-ipv6-only-no-ipv4-gid", "fabric/12-cx7-single-port-healthy",
                 "fabric/13-spark-env-map-wrong-device", "gpu/02-gb10-class-a-stuck-low-clock",
                 "gpu/01-gb10-healthy-unified-memory"):
        p = subprocess.run([str(EXE), "all", "--snapshot", str(CASES / name), "--json", "--no-history"],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "AFDDIAG_STATE_DIR": str(home)})
        assert p.returncode in (0, 1, 2), p.stderr
        out[name.split("/")[1][:2] + name.split("/")[0]] = json.loads(p.stdout)
    env = home / "rank.env"  # the launcher names a fabric IP this host does not hold
    env.write_text("AFD_FABRIC_IP=10.77.0.9\n")
    p = subprocess.run([str(EXE), "all", "--snapshot", str(CASES / "fabric/12-cx7-single-port-healthy"),
                        "--launch-env", str(env), "--json", "--no-history"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "AFDDIAG_STATE_DIR": str(home)})
    out["12launch"] = json.loads(p.stdout)
    return out


def _as_live(report: dict, age_s: float) -> dict:
    """The report as the node's own full run written ``age_s`` seconds ago."""
    r = dict(report, source="live")
    r["generated_at"] = dt.datetime.fromtimestamp(time.time() - age_s, dt.timezone.utc).isoformat(timespec="seconds")
    return r


def _state(tmp_path: Path, report: dict | str | None) -> Path:
    d = tmp_path / "state"
    d.mkdir(mode=0o700, parents=True)
    if isinstance(report, dict):
        (d / "last.json").write_text(json.dumps(report))
    elif isinstance(report, str):
        (d / "last.json").write_text(report)
    return d


def run_rule(config: dict, rule: dict, state: Path) -> tuple[str, str, float]:
    """One rule as NPD runs it → (status, message, wall seconds)."""
    glob = config["pluginConfig"]
    timeout_s = min(_duration(rule.get("timeout", glob["timeout"])), _duration(glob["timeout"]))
    assert Path(rule["path"]).name == EXE.name, rule["path"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AFDDIAG")}
    env["AFDDIAG_STATE_DIR"] = str(state)
    t0 = time.monotonic()
    p = subprocess.run([str(EXE), *rule.get("args", [])], capture_output=True, timeout=timeout_s, env=env)
    wall = time.monotonic() - t0
    out = p.stdout.strip()
    assert len(out) <= glob["max_output_length"], out  # afddiag's own line never relies on NPD's cut
    message = out[: glob["max_output_length"]].decode("utf-8")
    return NPD_STATUS.get(p.returncode, "Unknown"), message, wall


def _config() -> dict:
    return json.loads(CONFIG.read_text())


def test_the_config_fits_npds_defaults_and_names_one_condition_per_area():
    c = _config()
    assert c["plugin"] == "custom"
    g = c["pluginConfig"]
    assert (g["invoke_interval"], g["timeout"], g["max_output_length"], g["concurrency"]) == ("30s", "5s", 80, 3)
    conditions = {x["type"] for x in c["conditions"]}
    rules = c["rules"]
    assert len(rules) == len(conditions) == 3
    assert {r["condition"] for r in rules} == conditions
    assert sorted(r["args"][r["args"].index("--area") + 1] for r in rules) == ["fabric", "gpu", "launch"]
    for r in rules:
        assert r["type"] == "permanent" and r["reason"].isalnum() and r["reason"][0].isupper()
        assert _duration(r["timeout"]) <= _duration(g["timeout"])


@pytest.mark.parametrize("area", ["fabric", "gpu", "launch"])
def test_every_rule_on_fresh_stale_missing_and_failing_reports(case_reports, tmp_path, area):
    c = _config()
    rule = next(r for r in c["rules"] if f"--area {area}" in " ".join(r["args"]))
    failing = {"fabric": case_reports["07fabric"], "gpu": case_reports["02gpu"],
               "launch": case_reports["12launch"]}[area]
    healthy = {"fabric": case_reports["12fabric"], "gpu": case_reports["01gpu"],
               "launch": case_reports["12fabric"]}[area]
    seen = {}
    for what, report in (("fresh", _as_live(healthy, 60)), ("stale", _as_live(healthy, 960)),
                         ("missing", None), ("corrupt", '{"gates": [')):
        seen[what] = run_rule(c, rule, _state(tmp_path / what, report))
    seen["failing"] = run_rule(c, rule, _state(tmp_path / "failing", _as_live(failing, 60)))
    assert seen["fresh"][0] == "OK" and seen["fresh"][1].startswith("OK: ")
    assert seen["stale"][0] == "Unknown" and "old (limit 15m00s)" in seen["stale"][1]
    assert seen["missing"][0] == "Unknown" and seen["missing"][1].startswith("unknown: no report yet")
    assert seen["corrupt"][0] == "Unknown" and "not JSON" in seen["corrupt"][1]
    root = failing["diagnosis"][0]  # the launch area's symptom is named by its fabric root (fabric.rocev2-ipv4)
    assert seen["failing"][0] == "NonOK"
    assert seen["failing"][1].startswith(f"{root['gate']}: {root['summary'][:20]}")
    assert area == "launch" or root["gate"].startswith(area)
    print(area, {k: (s, m, round(w, 3)) for k, (s, m, w) in seen.items()})


def test_npd_mode_loads_neither_click_nor_the_cli(tmp_path):
    """The console script answers `afddiag npd` on its fast path (three plugins every 30 s)."""
    code = ("import sys\nsys.argv = ['afddiag'] + sys.argv[1:]\nfrom afddiag.entry import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
            "sys.stderr.write(repr((code, 'click' in sys.modules, 'afddiag.cli' in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('afddiag.probes', 'afddiag.gates', "
            "'afddiag.runner'))))))\n")
    p = subprocess.run([sys.executable, "-c", code, "npd", "--area", "gpu"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "AFDDIAG_STATE_DIR": str(_state(tmp_path, None))})
    assert eval(p.stderr.splitlines()[-1]) == (2, False, False, [])  # noqa: S307 - our own repr above
    assert p.stdout.startswith("unknown: no report yet")


# ------------------------------------------------------------------------- the judging, on recorded reports

def test_a_fail_of_the_area_is_a_problem_naming_the_root_and_other_areas_stay_ok(case_reports):
    rep = _as_live(case_reports["13fabric"], 10)  # fabric.devicemap-env FAILs and explains fabric.first-device
    c = npd.judge(rep, "fabric")
    assert c.code == npd.PROBLEM and c.message.startswith("fabric.devicemap-env: ")
    assert npd.judge(rep, "gpu").code == npd.OK
    # SET_ENV is the launcher's setting: no drain, so an NHC-style caller (--exit-for drain) passes it
    assert npd.judge(rep, "fabric", exit_for="drain").code == npd.OK


def test_exit_for_drain_keeps_a_fault_that_needs_a_person(case_reports):
    rep = _as_live(case_reports["02gpu"], 10)  # gpu.slow-state FAIL, AC_POWER_CYCLE: drains
    c = npd.judge(rep, "gpu", exit_for="drain")
    assert c.code == npd.PROBLEM and c.message.startswith("gpu.slow-state: ")


def test_a_root_in_another_area_is_named_for_the_symptom_it_explains():
    rep = {"source": "live", "generated_at": "2026-12-02T10:00:00+00:00",
           "gates": [{"id": "fabric.link", "verdict": "FAIL"}, {"id": "launch.fabric-address", "verdict": "FAIL"}],
           "diagnosis": [{"gate": "fabric.link", "verdict": "FAIL", "summary": "rocep1s0f1 port 1 DOWN",
                          "drain": True, "explains": ["launch.fabric-address"]}]}
    now = dt.datetime(2026, 12, 2, 10, 1, tzinfo=dt.timezone.utc).timestamp()
    assert npd.judge(rep, "launch", now=now) == npd.Condition(npd.PROBLEM, "fabric.link: rocep1s0f1 port 1 DOWN")
    assert npd.judge(rep, "gpu", now=now).code == npd.UNKNOWN  # no gpu gate in it: not judged, not OK


def test_freshness_edges_and_replays(case_reports):
    base = case_reports["12fabric"]
    assert npd.judge(_as_live(base, 899), "fabric").code == npd.OK
    assert npd.judge(_as_live(base, 901), "fabric").code == npd.UNKNOWN
    assert npd.judge(_as_live(base, 60), "fabric", max_age_s=30).code == npd.UNKNOWN
    assert npd.judge(_as_live(base, -299), "fabric").code == npd.OK  # a few minutes of clock skew
    ahead = npd.judge(_as_live(base, -301), "fabric")
    assert ahead.code == npd.UNKNOWN and "ahead" in ahead.message
    replay = npd.judge(dict(_as_live(base, 10), source=base["source"]), "fabric")
    assert base["source"] != "live" and replay.code == npd.UNKNOWN and "replay" in replay.message
    naive = dict(_as_live(base, 10), generated_at="2026-12-02T10:00:00")
    assert npd.judge(naive, "fabric").code == npd.UNKNOWN


def test_error_is_unknown_and_strict_makes_a_warn_a_problem(case_reports):
    rep = _as_live(case_reports["12fabric"], 10)
    rep["gates"] = [dict(g, verdict="ERROR", summary="rdma netlink: timed out") if g["id"] == "fabric.link" else g
                    for g in rep["gates"]]
    rep["diagnosis"] = [{"gate": "fabric.link", "verdict": "ERROR", "summary": "rdma netlink: timed out",
                         "drain": False, "explains": []}]
    c = npd.judge(rep, "fabric")
    assert c == npd.Condition(npd.UNKNOWN, "ERROR fabric.link: rdma netlink: timed out")
    assert npd.judge(rep, "fabric", exit_for="drain").code == npd.OK  # an ERROR never drains
    warn = _as_live(case_reports["07fabric"], 10)
    warn["diagnosis"] = [dict(d, verdict="WARN") for d in warn["diagnosis"]]
    assert npd.judge(warn, "fabric").code == npd.OK
    assert npd.judge(warn, "fabric", strict=True).code == npd.PROBLEM


def test_the_message_is_one_escaped_line_of_at_most_80_bytes():
    hostile = "rocep\x1b]52;c;cm0gLXJmIC8K\x07s0 \u202egnp.exe\n" + "\u00b5" * 200
    rep = {"source": "live", "generated_at": "2026-12-02T10:00:00+00:00",
           "gates": [{"id": "fabric.link", "verdict": "FAIL"}],
           "diagnosis": [{"gate": "fabric.link", "verdict": "FAIL", "summary": hostile, "drain": True, "explains": []},
                         {"gate": "fabric.mtu", "verdict": "FAIL", "summary": "x", "drain": False, "explains": []}]}
    c = npd.judge(rep, "fabric", now=dt.datetime(2026, 12, 2, 10, 0, tzinfo=dt.timezone.utc).timestamp())
    raw = c.message.encode()
    assert c.code == npd.PROBLEM and len(raw) <= npd.MAX_MESSAGE_BYTES
    assert not any(ch < 0x20 or ch == 0x7f for ch in raw) and "\u202e" not in c.message
    assert "\\x1b" in c.message and c.message.endswith("... (+1)")


def test_a_report_others_can_write_is_not_read(case_reports, tmp_path):
    d = _state(tmp_path, _as_live(case_reports["07fabric"], 10))
    os.chmod(d / "last.json", 0o666)
    c = npd.answer("fabric", d / "last.json")
    assert c.code == npd.UNKNOWN and "others can write it" in c.message


def test_usage_errors_are_unknown_to_npd(capsys):
    assert npd.main(["--area", "disk"]) == npd.UNKNOWN
    assert npd.main(["--area", "gpu", "--max-age", "0"]) == npd.UNKNOWN
    assert "invalid choice" in capsys.readouterr().err

