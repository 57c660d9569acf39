"""A capture keeps its inputs (``inputs.json``: fabric IP, peers, role, expectations, the launch env,
redacted) and a replay judges against them unless its own flags say otherwise (issue 23): captured
with ``--fabric-ip``/``--peer``, replayed with ``--snapshot`` alone, ``fabric.route`` still PASSes."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from afddiag.capture import write_bundle
from afddiag.cli import cli
from afddiag.probes.registry import CAPTURE_INPUTS
from conftest import CASES, case_dirs, load_case
from fakes import case_args, case_sources

CASE = CASES / "fabric" / "02-spark-map-set-healthy"
FIP = "192.168.100.11"  # on enp1s0f1np1 = rocep1s0f1 GID 3
PEER = "192.168.100.10"
ROUTES = [{"dst": "192.168.100.0/24", "dev": "enp1s0f1np1", "prefsrc": FIP, "protocol": "kernel", "scope": "link"},
          {"dst": "192.168.101.0/24", "dev": "enP2p1s0f1np1", "prefsrc": "192.168.101.11"}]
WITH_PEERS = [c for c in case_dirs("fabric") if "--peer" in case_args(c)]


def run_json(args: list[str]) -> tuple[dict, int]:
    res = CliRunner().invoke(cli, args + ["--no-history"], standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout), res.return_value


def verdicts(rep: dict) -> dict[str, str]:
    return {g["id"]: g["verdict"] for g in rep["gates"]}


@pytest.fixture
def routed(tmp_path) -> Path:
    """Case 02 as a snapshot folder holding its route table (what the live host's lookup reads)."""
    d = tmp_path / "spark-b"
    shutil.copytree(CASE, d)
    (d / "ip-route.json").write_text(json.dumps(ROUTES))
    return d


def capture(tmp_path: Path, case: Path = CASE, **inputs) -> Path:
    bundle = tmp_path / "cap" / "host.tar.gz"
    bundle.parent.mkdir(exist_ok=True)
    write_bundle(bundle, case_sources(case, route=lambda: ROUTES), **inputs)
    return bundle


def test_replay_without_flags_gives_the_captured_runs_verdicts_route_included(routed, tmp_path):
    live, code_live = run_json(["all", "--json", "--snapshot", str(routed), "--fabric-ip", FIP, "--peer", PEER])
    assert verdicts(live)["fabric.route"] == "PASS"
    bundle = capture(tmp_path, fabric_ip=FIP, peers=(PEER,))
    replay, code = run_json(["all", "--json", "--snapshot", str(bundle)])
    assert verdicts(replay) == verdicts(live) and code == code_live
    assert replay["inputs"]["fabric_ip"] == FIP and replay["inputs"]["peers"] == [PEER]
    assert replay["inputs"]["sources"]["fabric_ip"] == "captured with --fabric-ip"
    assert replay["inputs"]["sources"]["peers"] == "captured with --peer"
    assert replay["inputs"]["fabric_ip_source"] == "captured with --fabric-ip"
    assert any(n.startswith("inputs from the capture: fabric IP 192.168.100.11, peers 192.168.100.10")
               for n in replay["notes"])


def test_flags_at_the_replay_override_the_captured_ones(tmp_path):
    bundle = capture(tmp_path, fabric_ip=FIP, peers=(PEER,))
    other = "192.168.101.20"  # reached over the other rail: the route gate must judge this peer, not the stored one
    replay, _ = run_json(["all", "--json", "--snapshot", str(bundle), "--peer", other])
    assert replay["inputs"]["peers"] == [other] and replay["inputs"]["sources"]["peers"] == "--peer"
    assert replay["inputs"]["sources"]["fabric_ip"] == "captured with --fabric-ip"  # not given: still the capture's
    route = next(g for g in replay["gates"] if g["id"] == "fabric.route")
    assert route["verdict"] == "FAIL" and other in route["summary"], route


def test_a_bundle_without_stored_inputs_replays_as_before(tmp_path):
    bundle = capture(tmp_path, fabric_ip=FIP, peers=(PEER,))
    old = tmp_path / "old.tar.gz"  # the same bundle less inputs.json: a capture from before inputs were kept
    with tarfile.open(bundle) as src, tarfile.open(old, "w:gz") as dst:
        for m in src.getmembers():
            if not m.name.endswith("/" + CAPTURE_INPUTS):
                dst.addfile(m, src.extractfile(m) if m.isfile() else None)
    replay, _ = run_json(["all", "--json", "--snapshot", str(old)])
    route = next(g for g in replay["gates"] if g["id"] == "fabric.route")
    assert route["verdict"] == "SKIP" and "no peer given" in route["summary"]
    assert "fabric_ip" not in replay["inputs"]["sources"]
    assert not any("inputs from the capture" in n for n in replay["notes"])


@pytest.mark.parametrize("case", WITH_PEERS, ids=[c.name for c in WITH_PEERS])
def test_every_case_captured_with_its_flags_replays_alike_without_them(case, tmp_path):
    meta = load_case(case)
    direct, code_d = run_json(["all", "--json", "--snapshot", str(case)] + case_args(case))
    bundle = tmp_path / "h.tar.gz"
    write_bundle(bundle, case_sources(case), fabric_ip=meta["fabric_ip"], peers=tuple(meta["peer_fabric_ips"]))
    replay, code_r = run_json(["all", "--json", "--snapshot", str(bundle)])
    assert verdicts(replay) == verdicts(direct) and code_r == code_d
    assert replay["device_map"] == direct["device_map"]


def test_role_expectations_and_launch_env_are_kept_redacted(tmp_path):
    env = tmp_path / "expert.env"
    env.write_text(f"AFD_FABRIC_IP={FIP}\nAFD_HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123\nMODEL_DIR=/models/x\n"
                   "AFD_EXPERT_CAPACITY=8\n")
    args = ["--role", "expert", "--launch-env", str(env), "--expect-sm", "48", "--expect-capacity", "8"]
    live, _ = run_json(["all", "--json", "--snapshot", str(CASE)] + args)
    bundle = capture(tmp_path, role="expert", launch_env_path=str(env), expect_sm=48, expect_capacity=8)
    with tarfile.open(bundle) as t:
        stored = json.load(t.extractfile(next(n for n in t.getnames() if n.endswith("/" + CAPTURE_INPUTS))))
    assert stored["launch_env"] == {"AFD_FABRIC_IP": FIP, "AFD_HF_TOKEN": "<redacted>", "AFD_EXPERT_CAPACITY": "8"}
    assert "hf_abc" not in json.dumps(stored) and "MODEL_DIR" not in json.dumps(stored)  # allow-listed, redacted
    assert (stored["role"], stored["expect_sm"], stored["expect_capacity"]) == ("expert", 48, 8)
    replay, _ = run_json(["all", "--json", "--snapshot", str(bundle)])
    assert replay["inputs"]["role"] == "expert"
    assert replay["inputs"]["sources"]["role"] == "captured with --role expert"
    assert replay["inputs"]["sources"]["launch_env"] == f"captured with --launch-env {env}"
    assert replay["inputs"]["fabric_ip_source"] == f"AFD_FABRIC_IP in {env} (captured)"
    assert (replay["inputs"]["expect_sm"], replay["inputs"]["expect_capacity"]) == (48, 8)
    assert verdicts(replay) == verdicts(live)
    replay, _ = run_json(["all", "--json", "--snapshot", str(bundle), "--role", "coordinator"])
    assert replay["inputs"]["role"] == "coordinator" and replay["inputs"]["sources"]["role"] == "--role coordinator"


def test_a_replay_names_the_capacity_flag_as_the_captured_file_spelled_it(tmp_path, monkeypatch):
    (tmp_path / "siterank.toml").write_text('name = "siterank"\ngates = ["launch.*"]\n[launch]\n'
                                            'capacity_key = "AFD_EXPERT_CAPACITY"\n'
                                            '[aliases]\nCAPACITY = "AFD_EXPERT_CAPACITY"\n')
    monkeypatch.setenv("AFDDIAG_PLAYBOOK_DIR", str(tmp_path))
    env = tmp_path / "rank.env"
    env.write_text("CAPACITY=128\n")
    bundle = capture(tmp_path, role="siterank", launch_env_path=str(env), expect_capacity=256)
    replay, _ = run_json(["all", "--json", "--snapshot", str(bundle)])
    cap = next(g for g in replay["gates"] if g["id"] == "launch.capacity")
    assert cap["verdict"] == "FAIL" and cap["summary"].startswith("CAPACITY=128 (alias of AFD_EXPERT_CAPACITY)"), cap


@pytest.mark.parametrize("bad", [{"fabric_ip": "10.0.0.1; reboot"}, {"peers": ["x"] * 3}, {"role": "../../etc"},
                                 {"expect_sm": True}, {"launch_env": {"AFD_FABRIC_IP": "nope"}, "launch_env_path": "f"},
                                 {"launch_env": {"A": "x\ny"}, "launch_env_path": "f"}, {"sources": {"peers": 3}},
                                 {"launch_env_spelled": {"AFD_EXPERT_CAPACITY": "CAP; reboot"}}],
                         ids=["ip", "peers", "role", "bool", "env-value", "env-newline", "sources", "spelled"])
def test_hostile_stored_inputs_are_refused_whole_with_a_note(bad, tmp_path):
    snap = tmp_path / "snap"
    shutil.copytree(CASE, snap)
    (snap / CAPTURE_INPUTS).write_text(json.dumps({"fabric_ip": FIP, "peers": [PEER], **bad}))
    replay, _ = run_json(["all", "--json", "--snapshot", str(snap)])
    assert replay["inputs"]["peers"] == [] and "fabric_ip" not in replay["inputs"]["sources"]
    assert any("replayed without the captured inputs" in n for n in replay["notes"]), replay["notes"]


def test_capture_command_prints_the_replay_with_the_kept_flags(tmp_path, monkeypatch):
    import afddiag.commands.capture as cmd

    monkeypatch.setattr(cmd.Sources, "live", classmethod(lambda cls, **kw: case_sources(CASE)))
    out = tmp_path / "b.tar.gz"
    res = CliRunner().invoke(cli, ["capture", "-o", str(out), "--fabric-ip", FIP, "--peer", PEER],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert f"--snapshot {out}` (it judges with the captured --fabric-ip {FIP} --peer {PEER};" in res.stderr
