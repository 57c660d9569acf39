"""`afddiag merge` replays the fleet the multi-host lab collected over SSH (lab/scenario-hosts.py on the
trixie-backports kernel; tests/test_lab_hosts.py). The fixtures under tests/fixtures/lab-fleet/ are that
run's `afddiag fleet --json` outputs, per-host reports embedded, and its inventory:

- fleet-faults:    coord, spark-a, spark-b (capacity 256, each host's own device map) with spark-a's f0 at
                   MTU 9000, spark-b's AFD_EXPERT_CAPACITY 128, spark-b's map cloned from spark-a;
- fleet-link-down: faults undone (the cross-host baseline), spark-b's f0 down;
- fleet-faults-control-plane: fleet-faults again, recorded after launch.control-plane and fleet.control-plane
                   joined (issue 15): every launch env has AFD_ENGINE_PORTS=29500 and spark-b drops what it
                   sends from port 29500 (an ip rule blackhole), so coord's connect to spark-b times out
                   while spark-b's to coord is refused (answered).

The same reports through `merge` (files, as Slurm or Ansible would collect them) must name the faults the
scenario planted (asserted from the scenario, not compared with the recording's own verdicts).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from afddiag import cli

FIX = Path(__file__).parent / "fixtures" / "lab-fleet"
RUNS = ["fleet-faults", "fleet-link-down"]


def _live(run: str) -> dict:
    return json.loads((FIX / f"{run}.json").read_text())


def _merge(capsys, tmp_path: Path, run: str, per_host_files: bool = False) -> tuple[int, dict]:
    live = _live(run)
    if per_host_files:
        files = []
        for h in live["hosts"]:
            f = tmp_path / f"{h['name']}.json"
            f.write_text(json.dumps(live["reports"][h["name"]]))
            files.append(str(f))
    else:
        f = tmp_path / "reports.json"
        f.write_text(json.dumps([live["reports"][h["name"]] for h in live["hosts"]]))
        files = [str(f)]
    capsys.readouterr()
    rc = cli.run(["merge", *files, "--inventory", str(FIX / "inventory.toml"), "--json"])
    return rc, json.loads(capsys.readouterr().out)


# What each recorded run planted, written from the scenario (not read back from the recording's own verdicts):
# fleet-faults: spark-a's MTU, spark-b's capacity flag and spark-b's cloned map; fleet-link-down: the faults
# undone, only spark-b's link down (a host gate's concern, no fleet-wide one). No run holds GPU load figures,
# a second rail or control-plane connects.
PLANTED = {
    "fleet-faults": {"fleet.capacity": "FAIL", "fleet.fabric-ip": "PASS", "fleet.mtu": "FAIL",
                     "fleet.gid-index": "PASS", "fleet.devicemap": "FAIL", "fleet.gpu": "SKIP",
                     "fleet.versions": "PASS", "fleet.rails": "SKIP", "fleet.control-plane": "SKIP",
                     "fleet.known-bad": "SKIP", "fleet.nccl-build": "SKIP",
                     "fleet.engine-net": "SKIP"},  # recorded before they existed
    "fleet-link-down": {"fleet.capacity": "PASS", "fleet.fabric-ip": "PASS", "fleet.mtu": "PASS",
                        "fleet.gid-index": "PASS", "fleet.devicemap": "PASS", "fleet.gpu": "SKIP",
                        "fleet.versions": "PASS", "fleet.rails": "SKIP", "fleet.control-plane": "SKIP",
                        "fleet.known-bad": "SKIP", "fleet.nccl-build": "SKIP",
                        "fleet.engine-net": "SKIP"},
}


@pytest.mark.parametrize("run", RUNS)
def test_merge_names_the_planted_faults(run, capsys, tmp_path):
    live = _live(run)
    rc, fr = _merge(capsys, tmp_path, run)
    assert rc == fr["exit_code"] == 2
    # roles and fabric IPs are the inventory's; each host's exit code is its own report's
    assert [(h["name"], h["role"], h["fabric_ip"]) for h in fr["hosts"]] == [
        ("coord", "coordinator", "10.9.0.10"), ("spark-a", "expert", "10.9.0.11"), ("spark-b", "expert", "10.9.0.12")]
    assert [h["exit_code"] for h in fr["hosts"]] == [live["reports"][h["name"]]["exit_code"] for h in fr["hosts"]]
    assert {g["id"]: g["verdict"] for g in fr["gates"]} == PLANTED[run]


def test_merge_per_host_files_names_hosts_by_their_reports(capsys, tmp_path):
    """One file per host (named after the host): the report's own hostname names the row."""
    rc, fr = _merge(capsys, tmp_path, "fleet-faults", per_host_files=True)
    assert rc == 2
    assert [h["name"] for h in fr["hosts"]] == ["coord", "spark-a", "spark-b"]


def _gate(fr: dict, gid: str) -> dict:
    return next(g for g in fr["gates"] if g["id"] == gid)


def test_faults_undone_the_fleet_agrees(capsys, tmp_path):
    _, fr = _merge(capsys, tmp_path, "fleet-link-down")
    for gid in ("fleet.capacity", "fleet.fabric-ip", "fleet.mtu", "fleet.devicemap"):
        assert _gate(fr, gid)["verdict"] == "PASS", _gate(fr, gid)
    assert _gate(fr, "fleet.mtu")["facts"]["roce_mtu"] == {"coord": 1024, "spark-a": 1024, "spark-b": 1024}


def test_faults_are_each_named_once(capsys, tmp_path):
    _, fr = _merge(capsys, tmp_path, "fleet-faults")
    mtu, cap, dm = (_gate(fr, g) for g in ("fleet.mtu", "fleet.capacity", "fleet.devicemap"))
    assert mtu["verdict"] == "FAIL" and mtu["summary"].startswith("spark-a RoCE MTU 4096 (f0 MTU 9000)"), mtu
    assert cap["verdict"] == "FAIL" and cap["summary"].startswith("spark-b AFD_EXPERT_CAPACITY=128"), cap
    assert "the inventory's capacity 256" in cap["summary"]
    assert dm["verdict"] == "FAIL" and dm["summary"].startswith("spark-b"), dm
    assert dm["facts"]["maps"]["spark-b"] == "10.9.0.11=rxsa0"
    assert "spark-a" not in dm["summary"].split(":")[0]


def test_link_down_fails_that_host_only(capsys, tmp_path):
    _, fr = _merge(capsys, tmp_path, "fleet-link-down")
    rows = {h["name"]: h for h in fr["hosts"]}
    assert "fabric.link" in rows["spark-b"]["failing"]
    assert "fabric.link" not in rows["coord"]["failing"] + rows["spark-a"]["failing"]
    # the link is the root: the map is still right
    assert _gate(fr, "fleet.devicemap")["verdict"] == "PASS"


def test_control_plane_recorded_across_namespaces_names_the_side_that_drops(capsys, tmp_path):
    """The lab's real TCP connects (fleet-faults-control-plane): merge names the planted faults, and
    fleet.control-plane the asymmetric pair and the side that drops."""
    live = _live("fleet-faults-control-plane")
    rc, fr = _merge(capsys, tmp_path, "fleet-faults-control-plane", per_host_files=True)
    assert rc == fr["exit_code"] == 2
    assert {g["id"]: g["verdict"] for g in fr["gates"]} == {**PLANTED["fleet-faults"], "fleet.control-plane": "FAIL"}
    cp = _gate(fr, "fleet.control-plane")
    assert cp["facts"]["matrix"] == {"coord": {"spark-a": {"29500": "refused"}, "spark-b": {"29500": "timeout"}},
                                     "spark-a": {"coord": {"29500": "refused"}},
                                     "spark-b": {"coord": {"29500": "refused"}}}
    assert cp["summary"].startswith("asymmetric: spark-b reaches coord, but coord cannot reach spark-b (10.9.0.12) "
                                    "port 29500 timeout"), cp
    assert cp["facts"]["matrix"]["spark-b"] == {"coord": {"29500": "refused"}}
    # the per-host summaries carry what the fleet gate read
    cps = {n: r["summary"]["control_plane"] for n, r in live["reports"].items()}
    assert cps["coord"]["peers"] == ["10.9.0.11", "10.9.0.12"] and cps["coord"]["source"] == "10.9.0.10"
    assert [a["outcome"] for a in cps["coord"]["attempts"]] == ["refused", "timeout"]
