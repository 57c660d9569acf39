"""Launch integration: launch env files, role playbooks, launch gates, preflight and the example
launchers, run against snapshots composed from the shared real-world cases."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from afddiag.cli import cli, run
from afddiag.envvars import LaunchEnvError, parse_launch_env
from afddiag.playbook import PlaybookError, load
from conftest import CASES, REPO

UNLIMITED = {"memlock_soft_bytes": -1, "memlock_hard_bytes": -1, "user": "afd", "in_container": False,
             "device_nodes": [{"path": "/dev/infiniband/uverbs0", "readable": True, "writable": True},
                              {"path": "/dev/infiniband/rdma_cm", "readable": True, "writable": True}]}


def snapshot(tmp_path, fabric_case, gpu_case, limits=UNLIMITED, image=None, name="snap"):
    """A whole host: one fabric case's sys/ + JSON, one GPU case's gpu.json, limits and image."""
    d = tmp_path / name
    shutil.copytree(CASES / "fabric" / fabric_case, d, ignore=shutil.ignore_patterns("case.json", "env"))
    shutil.copy(CASES / "gpu" / gpu_case / "gpu.json", d / "gpu.json")
    if limits is not None:
        (d / "limits.json").write_text(json.dumps(limits))
    if image is not None:
        (d / "image.json").write_text(json.dumps([image]))
    return d


def envfile(tmp_path, text, name="launch.env"):
    p = tmp_path / name
    p.write_text(text)
    return p


COORD_ENV = """# coordinator launch settings
export AFD_ROLE=coordinator
AFD_FABRIC_IP="198.51.100.72"
AFD_PREFILL_CAPACITY=256
AFD_PEER_FABRIC_IPS='198.51.100.73'
AFD_IMAGE=registry.example/afd/coordinator:2026.11
AFD_IMAGE_SM_COUNT=170
DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=198.51.100.72=mlx5_0
"""
EXPERT_ENV = """export AFD_ROLE=expert
export AFD_FABRIC_IP=192.168.100.11
export AFD_EXPERT_CAPACITY=256
export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1
"""
GB10_IMAGE = {"RepoTags": ["registry.example/afd/expert:2026.11"],
              "Config": {"Labels": {"afd.export.sm_count": "48"},
                         "Env": ["CUDA_VERSION=13.0.1", "NVIDIA_REQUIRE_CUDA=cuda>=13.0",
                                 "TORCH_CUDA_ARCH_LIST=12.1a"]}}


def launcher(script, env_file, *args, afddiag_args="", extra_env=None):
    env = dict(os.environ, AFDDIAG=f"{sys.executable} -m afddiag", AFDDIAG_ARGS=afddiag_args,
               PYTHONPATH=str(REPO), NO_COLOR="1")
    env.pop("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", None)
    env.update(extra_env or {})
    return subprocess.run(["bash", str(REPO / "playbooks" / script), str(env_file), *args], capture_output=True,
                          text=True, env=env, timeout=120)


# --- the example launchers against snapshots ------------------------------------------------------

def test_coordinator_launcher_healthy_starts_with_exports(tmp_path):
    snap = snapshot(tmp_path, "12-cx7-single-port-healthy", "04-rtx5090-image-exported-for-188-sms")
    p = launcher("launch-coordinator.sh", envfile(tmp_path, COORD_ENV), "--model", "m",
                 afddiag_args=f"--snapshot {snap} --expect-capacity 256")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "would start: coordinator --batch 256 --fabric-ip 198.51.100.72 --model m"
    # the launcher evaluated afddiag's exports: the map and the exact-match HCA reached its environment
    assert "launch-coordinator: 198.51.100.72=mlx5_0 NCCL_IB_HCA==mlx5_0:1 batch=256" in p.stderr
    assert "afddiag preflight: coordinator on snap: OK" in p.stderr


def test_coordinator_launcher_refuses_image_for_188_sms(tmp_path):
    snap = snapshot(tmp_path, "12-cx7-single-port-healthy", "04-rtx5090-image-exported-for-188-sms")
    env = envfile(tmp_path, COORD_ENV.replace("AFD_IMAGE_SM_COUNT=170", "AFD_IMAGE_SM_COUNT=188"))
    p = launcher("launch-coordinator.sh", env, afddiag_args=f"--snapshot {snap} --expect-capacity 256")
    assert p.returncode == 2 and p.stdout == ""
    assert "FAIL gpu.sm-count: GPU 0 NVIDIA GeForce RTX 5090: image built for 188 SMs, this GPU has 170" in p.stderr
    assert "rebuild the ahead-of-time export for 170 SMs" in p.stderr
    assert "refusing to start" in p.stderr


def test_coordinator_launcher_refuses_mismatched_capacity(tmp_path):
    snap = snapshot(tmp_path, "12-cx7-single-port-healthy", "04-rtx5090-image-exported-for-188-sms")
    env = envfile(tmp_path, COORD_ENV.replace("AFD_PREFILL_CAPACITY=256", "AFD_PREFILL_CAPACITY=1024"))
    p = launcher("launch-coordinator.sh", env, afddiag_args=f"--snapshot {snap} --expect-capacity 256")
    assert p.returncode == 2
    assert "FAIL launch.capacity: AFD_PREFILL_CAPACITY=1024 but --expect-capacity is 256" in p.stderr


def test_launchers_refuse_without_fabric_address(tmp_path):
    env = envfile(tmp_path, COORD_ENV.replace('AFD_FABRIC_IP="198.51.100.72"\n', ""))
    p = launcher("launch-coordinator.sh", env)
    assert p.returncode == 78 and "AFD_FABRIC_IP is not set" in p.stderr
    p = launcher("launch-expert.sh", envfile(tmp_path, "AFD_ROLE=expert\n", "e.env"), "3")
    assert p.returncode == 78 and "rank 3" in p.stderr


def test_expert_launcher_healthy_and_wrong_first_device(tmp_path):
    good = snapshot(tmp_path, "02-spark-map-set-healthy", "01-gb10-healthy-unified-memory", image=GB10_IMAGE)
    env = envfile(tmp_path, EXPERT_ENV + "AFD_IMAGE=registry.example/afd/expert:2026.11\n")
    p = launcher("launch-expert.sh", env, "3", afddiag_args=f"--snapshot {good} --expect-capacity 256")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "would start: expert --rank 3 --capacity 256 --fabric-ip 192.168.100.11"
    assert "NCCL_IB_HCA==rocep1s0f1:1" in p.stderr
    # the incident: the same rank on a host where the map was never exported and the first device has no IPv4
    bad = snapshot(tmp_path, "01-spark-fabric-ip-on-nonfirst-device", "01-gb10-healthy-unified-memory", name="bad")
    env = envfile(tmp_path, "AFD_ROLE=expert\nAFD_FABRIC_IP=192.168.100.10\nAFD_EXPERT_CAPACITY=256\n", "bad.env")
    # preflight alone (no --export: nothing hands the launcher a map) still refuses, naming the export
    res = CliRunner().invoke(cli, ["preflight", "--snapshot", str(bad), "--launch-env", str(env), "--role", "expert",
                                   "--expect-capacity", "256", "--no-history"], standalone_mode=False)
    assert res.return_value == 2 and "FAIL fabric.first-device: rocep1s0f0" in res.stderr
    assert "export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1" in res.stderr
    # the launcher runs preflight --export, which judges the launch with the map it prints: the fault it
    # fixes no longer stops the launch, and the engine gets the map (this test asserted the refusal before:
    # the launcher refused exactly when the exports it would have evaluated were the fix)
    p = launcher("launch-expert.sh", env, "0", afddiag_args=f"--snapshot {bad} --expect-capacity 256")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "would start: expert --rank 0 --capacity 256 --fabric-ip 192.168.100.10"
    assert "judged with the lines it prints, which fix fabric.first-device" in p.stderr
    assert "launch-expert: rank 0: 192.168.100.10=rocep1s0f1" in p.stderr  # the map reached the engine's env


def test_expert_launcher_export_fixes_only_what_it_prints(tmp_path):
    """A fault the exports do not fix still stops the launch, with the map missing or not."""
    bad = snapshot(tmp_path, "01-spark-fabric-ip-on-nonfirst-device", "01-gb10-healthy-unified-memory", name="bad")
    env = envfile(tmp_path, "AFD_ROLE=expert\nAFD_FABRIC_IP=192.168.100.10\nAFD_EXPERT_CAPACITY=1024\n", "cap.env")
    p = launcher("launch-expert.sh", env, "0", afddiag_args=f"--snapshot {bad} --expect-capacity 256")
    assert p.returncode == 2 and p.stdout == "" and "refusing to start" in p.stderr
    assert "FAIL launch.capacity" in p.stderr and "FAIL fabric.first-device" not in p.stderr
    # an address no device here carries: no export can fix it
    env = envfile(tmp_path, "AFD_ROLE=expert\nAFD_FABRIC_IP=192.168.100.99\nAFD_EXPERT_CAPACITY=256\n", "ip.env")
    p = launcher("launch-expert.sh", env, "0", afddiag_args=f"--snapshot {bad} --expect-capacity 256")
    assert p.returncode == 2 and p.stdout == "" and "refusing to start" in p.stderr


def test_expert_launcher_refuses_sm120_image_on_gb10(tmp_path):
    img = json.loads(json.dumps(GB10_IMAGE))
    img["Config"]["Env"][-1] = "TORCH_CUDA_ARCH_LIST=12.0a"
    snap = snapshot(tmp_path, "02-spark-map-set-healthy", "01-gb10-healthy-unified-memory", image=img)
    env = envfile(tmp_path, EXPERT_ENV + "AFD_IMAGE=registry.example/afd/expert:sm120\n")
    p = launcher("launch-expert.sh", env, "2", afddiag_args=f"--snapshot {snap} --expect-capacity 256")
    assert p.returncode == 2
    assert ("FAIL gpu.image-arch: GPU 0 NVIDIA GB10 is sm_121; "
            "image registry.example/afd/expert:sm120 built for sm_120a") in p.stderr


# --- gates through the CLI -----------------------------------------------------------------------

def preflight_json(tmp_path, snap, env_text, *flags):
    env = envfile(tmp_path, env_text, "pf.env")
    res = CliRunner().invoke(cli, ["all", "--json", "--snapshot", str(snap), "--launch-env", str(env), *flags],
                             standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    return {g["id"]: g for g in rep["gates"]}, rep


def test_role_from_launch_env_and_requirements(tmp_path):
    # an expert role on a host without RDMA devices and without a GPU: absence FAILs, not SKIP
    snap = tmp_path / "empty"
    (snap / "sys" / "class" / "net").mkdir(parents=True)
    (snap / "gpu.json").write_text(json.dumps({"devices": [], "why": "no NVIDIA GPU seen"}))
    (snap / "limits.json").write_text(json.dumps({**UNLIMITED, "device_nodes": []}))
    g, rep = preflight_json(tmp_path, snap, EXPERT_ENV)
    assert rep["inputs"]["role"] == "expert"
    assert g["fabric.rdma-present"]["verdict"] == "FAIL" and "requires" in g["fabric.rdma-present"]["summary"]
    assert g["gpu.present"]["verdict"] == "FAIL"
    assert g["launch.uverbs-access"]["verdict"] == "FAIL"
    # the same host in the generic role: absent hardware is SKIP
    g, rep = preflight_json(tmp_path, snap, EXPERT_ENV.replace("AFD_ROLE=expert", "AFD_ROLE=generic"))
    assert g["fabric.rdma-present"]["verdict"] == "SKIP" and g["gpu.present"]["verdict"] == "SKIP"


def test_expert_role_on_wrong_gpu_model_fails(tmp_path):
    snap = snapshot(tmp_path, "02-spark-map-set-healthy", "06-h200-healthy-measured")
    g, _ = preflight_json(tmp_path, snap, EXPERT_ENV)
    assert g["gpu.present"]["verdict"] == "FAIL" and "expects a GB10" in g["gpu.present"]["summary"]


def test_coordinator_memory_reservation(tmp_path):
    snap = snapshot(tmp_path, "12-cx7-single-port-healthy", "04-rtx5090-image-exported-for-188-sms")
    g, _ = preflight_json(tmp_path, snap, COORD_ENV)
    assert g["gpu.memory"]["verdict"] == "PASS"
    r = json.loads((snap / "gpu.json").read_text())
    mem = r["devices"][0]["nvml"]["memory_info"]
    mem["used_bytes"], mem["free_bytes"] = 4 << 30, mem["total_bytes"] - (4 << 30)  # another tenant holds 4 GiB
    (snap / "gpu.json").write_text(json.dumps(r))
    g, _ = preflight_json(tmp_path, snap, COORD_ENV)
    assert g["gpu.memory"]["verdict"] == "FAIL" and "97% reservation" in g["gpu.memory"]["summary"]


def test_memlock_and_uverbs(tmp_path):
    lim = {**UNLIMITED, "memlock_soft_bytes": 8 << 20, "device_nodes": [
        {"path": "/dev/infiniband/uverbs0", "readable": True, "writable": False}]}
    snap = snapshot(tmp_path, "12-cx7-single-port-healthy", "04-rtx5090-image-exported-for-188-sms", limits=lim)
    g, _ = preflight_json(tmp_path, snap, COORD_ENV)
    assert g["launch.memlock"]["verdict"] == "FAIL" and "8 MiB" in g["launch.memlock"]["summary"]
    assert "ulimit -l unlimited" in g["launch.memlock"]["remedy"]
    assert g["launch.uverbs-access"]["verdict"] == "FAIL" and "uverbs0" in g["launch.uverbs-access"]["summary"]
    g, _ = preflight_json(tmp_path, snap, COORD_ENV.replace("AFD_ROLE=coordinator", "AFD_ROLE=generic"))
    assert g["launch.memlock"]["verdict"] == "WARN"


def test_fabric_ip_from_launch_env_and_its_map_is_what_is_judged(tmp_path, monkeypatch):
    snap = snapshot(tmp_path, "01-spark-fabric-ip-on-nonfirst-device", "01-gb10-healthy-unified-memory")
    monkeypatch.setenv("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", "192.168.100.10=rocep1s0f0")  # ignored: file given
    g, rep = preflight_json(tmp_path, snap, EXPERT_ENV.replace("192.168.100.11=rocep1s0f1", "192.168.100.10=rocep1s0f1")
                            .replace("AFD_FABRIC_IP=192.168.100.11", "AFD_FABRIC_IP=192.168.100.10"))
    assert rep["inputs"]["fabric_ip"] == "192.168.100.10"
    assert rep["inputs"]["fabric_ip_source"] == f"AFD_FABRIC_IP in {tmp_path / 'pf.env'}"  # where it came from
    assert g["fabric.first-device"]["verdict"] == "PASS" and g["fabric.devicemap-env"]["verdict"] == "PASS"
    g, _ = preflight_json(tmp_path, snap, "AFD_ROLE=expert\nAFD_FABRIC_IP=10.1.1.1\n")
    assert g["launch.fabric-address"]["verdict"] == "FAIL" and "on no netdev" in g["launch.fabric-address"]["summary"]


def test_preflight_warn_passes_unless_strict(tmp_path, capsys):
    snap = snapshot(tmp_path, "10-spark-mtu-1500-vs-peer-9000", "01-gb10-healthy-unified-memory")
    env = envfile(tmp_path, "AFD_ROLE=expert\nAFD_FABRIC_IP=192.168.101.10\nAFD_EXPERT_CAPACITY=256\n"
                  "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.101.10=roceP2p1s0f1\n")
    args = ["preflight", "--snapshot", str(snap), "--launch-env", str(env), "--expect-capacity", "256"]
    assert run(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("afddiag preflight: expert on ") and "warn: fabric.mtu" in out[0]
    assert run(args + ["--strict"]) == 1
    assert "WARN fabric.mtu" in capsys.readouterr().err


def test_devicemap_nccl_format():
    c12 = str(CASES / "fabric" / "12-cx7-single-port-healthy")
    res = CliRunner().invoke(cli, ["devicemap", "--snapshot", c12, "--format", "nccl"], standalone_mode=False)
    assert res.stdout.splitlines() == ["NCCL_IB_HCA==mlx5_0:1", "NCCL_IB_GID_INDEX=3"]
    c01 = str(CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device")
    res = CliRunner().invoke(cli, ["devicemap", "--snapshot", c01, "--format", "nccl"], standalone_mode=False)
    # the caller's choice missing is a usage error (64, one line naming --fabric-ip), not the FAIL code
    assert res.return_value == 64 and "several fabric IPs (192.168.100.10, 192.168.101.10)" in res.stderr
    assert res.stderr.count("\n") == 1 and "give --fabric-ip" in res.stderr and res.stdout == ""
    res = CliRunner().invoke(cli, ["devicemap", "--snapshot", c01, "--format", "nccl", "--fabric-ip",
                                   "192.168.101.10"], standalone_mode=False)
    assert res.stdout.splitlines() == ["NCCL_IB_HCA==roceP2p1s0f1:1", "NCCL_IB_GID_INDEX=3"]


# --- env files and playbooks ---------------------------------------------------------------------

@pytest.mark.parametrize("text,words", [
    ("AFD_FABRIC_IP=10.0.0.1\nAFD_FABRIC_IP=10.0.0.2\n", "f.env:2: duplicate key AFD_FABRIC_IP, first set on line 1"),
    ("# ok\nthis is not a line\n", "f.env:2: not a KEY=VALUE line"),
    ("AFD_EXPERT_CAPACITY=lots\n", "f.env:1: AFD_EXPERT_CAPACITY='lots' is not a positive integer"),
    ("AFD_PEER_FABRIC_IPS=10.0.0.1,10.0.0\n", "is not an IPv4 address"),
    ("AFD_IMAGE='abc\n", "unterminated ' quote"),
    ("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=10.0.0.1:mlx5_0\n", "is not ip=device"),
])
def test_launch_env_errors_name_file_and_line(text, words):
    with pytest.raises(LaunchEnvError) as e:
        parse_launch_env(text, "f.env")
    assert words in str(e.value)


def test_launch_env_quotes_comments_export_and_aliases():
    env = parse_launch_env("export SITE_IP='10.0.0.1'  # the fabric\nAFD_IMAGE=\"r/i:1 2\"\n\n# c\nX=a # b\n",
                           "f.env", {"SITE_IP": "AFD_FABRIC_IP"})
    assert env == {"AFD_FABRIC_IP": "10.0.0.1", "AFD_IMAGE": "r/i:1 2", "X": "a"}
    with pytest.raises(LaunchEnvError, match="first set on line 1 \\(as SITE_IP, an alias of AFD_FABRIC_IP\\)"):
        parse_launch_env("SITE_IP=10.0.0.1\nAFD_FABRIC_IP=10.0.0.1\n", "f.env", {"SITE_IP": "AFD_FABRIC_IP"})


def test_capacity_is_named_as_the_sites_file_spells_it(tmp_path, monkeypatch):
    """A site's role maps its own CAPACITY to AFD_EXPERT_CAPACITY: launch.capacity and, from the reports'
    summaries, fleet.capacity name CAPACITY (the word the operator will look for in the file), never the
    afddiag name the file does not hold."""
    from afddiag.gates.fleet import HostResult, run_fleet_gates

    (tmp_path / "siterank.toml").write_text('name = "siterank"\ngates = ["launch.*"]\n[launch]\n'
                                            'capacity_key = "AFD_EXPERT_CAPACITY"\n'
                                            '[aliases]\nCAPACITY = "AFD_EXPERT_CAPACITY"\n')
    monkeypatch.setenv("AFDDIAG_PLAYBOOK_DIR", str(tmp_path))
    spelled: dict[str, str] = {}
    env = parse_launch_env("CAPACITY=128\n", "f.env", {"CAPACITY": "AFD_EXPERT_CAPACITY"}, spelled)
    assert env == {"AFD_EXPERT_CAPACITY": "128"} and spelled == {"AFD_EXPERT_CAPACITY": "CAPACITY"}
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "host").write_text("rank\n")
    reps = {}
    for name, text in (("rank-a", "AFD_ROLE=siterank\nCAPACITY=128\n"),
                       ("rank-b", "AFD_ROLE=siterank\nAFD_EXPERT_CAPACITY=256\n")):
        f = envfile(tmp_path, text, f"{name}.env")
        res = CliRunner().invoke(cli, ["all", "--json", "--snapshot", str(snap), "--launch-env", str(f),
                                       "--expect-capacity", "256"], standalone_mode=False, catch_exceptions=False)
        reps[name] = json.loads(res.stdout)
    cap = next(g for g in reps["rank-a"]["gates"] if g["id"] == "launch.capacity")
    assert cap["verdict"] == "FAIL" and cap["summary"].startswith("CAPACITY=128 (alias of AFD_EXPERT_CAPACITY)")
    assert reps["rank-a"]["summary"]["capacity"] == {"key": "AFD_EXPERT_CAPACITY", "value": 128, "set": True,
                                                     "spelled": "CAPACITY"}
    assert "spelled" not in reps["rank-b"]["summary"]["capacity"]  # the file uses afddiag's own name
    fleet = [HostResult(name=n, report=r) for n, r in reps.items()]
    v = next(v for v in run_fleet_gates(fleet, {"capacity": 256}) if v.id == "fleet.capacity")
    assert v.verdict == "FAIL" and v.summary.startswith(f"rank-a CAPACITY=128 in {tmp_path / 'rank-a.env'}: differs")
    assert v.remedy.startswith(f"set CAPACITY=256 in {tmp_path / 'rank-a.env'} on rank-a")
    assert "AFD_EXPERT_CAPACITY" not in v.summary + v.remedy


def test_bad_launch_env_is_a_usage_error(tmp_path, capsys):
    env = envfile(tmp_path, "AFD_FABRIC_IP=10.0.0\n")
    assert run(["all", "--launch-env", str(env), "--snapshot", str(tmp_path)]) == 64
    assert f"{env}:1: AFD_FABRIC_IP='10.0.0' is not an IPv4 address" in capsys.readouterr().err
    assert run(["all", "--launch-env", str(tmp_path / "nope.env")]) == 64


def test_site_adds_a_role_with_a_file(tmp_path, monkeypatch):
    (tmp_path / "pool.toml").write_text('name = "pool"\ngates = ["fabric.*"]\nrequires = ["rdma"]\n'
                                        '[aliases]\nPOOL_IP = "AFD_FABRIC_IP"\n')
    monkeypatch.setenv("AFDDIAG_PLAYBOOK_DIR", str(tmp_path))
    pb = load("pool")
    assert pb.requires == ["rdma"] and pb.runs("fabric.link") and not pb.runs("gpu.present")
    env = envfile(tmp_path, "AFD_ROLE=pool\nPOOL_IP=192.168.100.10\n")
    snap = CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device"
    res = CliRunner().invoke(cli, ["all", "--json", "--snapshot", str(snap), "--launch-env", str(env)],
                             standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    assert {g["id"].split(".")[0] for g in rep["gates"]} == {"fabric"}
    assert rep["inputs"]["fabric_ip"] == "192.168.100.10"
    (tmp_path / "bad.toml").write_text('name = "bad"\n[gpu]\nmodle = "GB10"\n')
    with pytest.raises(PlaybookError, match="unknown key"):
        load("bad")
    with pytest.raises(PlaybookError, match="known roles are"):
        load("nosuch")


def test_export_keeps_device_selection_the_launch_env_already_sets(tmp_path):
    """--export prints only what the launch env lacks: a dual-rail NCCL_IB_HCA it sets (judged not
    FAIL) is never replaced by the single device of the fabric IP's GID."""
    env = envfile(tmp_path, "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1,"
                  "192.168.101.11=roceP2p1s0f1\nNCCL_IB_HCA==rocep1s0f1:1,roceP2p1s0f1:1\n"
                  "AFD_FABRIC_IP=192.168.100.11\n")
    res = CliRunner().invoke(cli, ["preflight", "--snapshot", str(CASES / "fabric" / "02-spark-map-set-healthy"),
                                   "--role", "generic", "--launch-env", str(env), "--export"],
                             standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0
    assert "NCCL_IB_HCA" not in res.stdout and "DEVICE_MAP" not in res.stdout
    assert "export NCCL_IB_GID_INDEX=3" in res.stdout and "export UCX_NET_DEVICES=rocep1s0f1:1" in res.stdout
    assert "kept the launch env's DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP, NCCL_IB_HCA" in res.stderr


def test_exports_to_print_overrides_only_a_failed_env():
    from afddiag.endpoint import exports_to_print

    pairs = [("NCCL_IB_HCA", "=mlx5_1:1"), ("NCCL_IB_GID_INDEX", "3")]
    env = {"NCCL_IB_HCA": "=mlx5_0:1"}
    assert exports_to_print(pairs, env, []) == ([("NCCL_IB_GID_INDEX", "3")], ["NCCL_IB_HCA"])
    assert exports_to_print(pairs, env, ["NCCL_IB_HCA"]) == (pairs, [])
    assert exports_to_print(pairs, None, []) == (pairs, [])
    # the gate FAILed on another variable only: the set NCCL_IB_HCA is still kept, the failed one corrected
    env = {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "1"}
    assert exports_to_print(pairs, env, ["NCCL_IB_GID_INDEX"]) == ([("NCCL_IB_GID_INDEX", "3")], ["NCCL_IB_HCA"])


def test_export_reads_the_typed_findings_of_the_settled_gate_not_its_json():
    """preflight --export's variables come from fabric.devicemap-env's typed findings (Verdict.found), which
    the JSON report does not carry, and only from its FAIL."""
    from afddiag.model import to_jsonable
    from afddiag.model.found import DeviceSelectors
    from afddiag.runner import failed_selectors
    from afddiag.verdict import FAIL, Verdict

    found = DeviceSelectors(("MC_GID_INDEX",))
    v = Verdict("fabric.devicemap-env", FAIL, "MC_GID_INDEX=1 ...", facts={"failed_vars": ["NCCL_IB_HCA"]}, found=found)
    assert failed_selectors([v]) == ["MC_GID_INDEX"]  # the typed value, not the facts' key
    assert "found" not in to_jsonable(v)
    v.verdict = "WARN"
    assert failed_selectors([v]) == []


def test_export_overrides_only_the_variable_devicemap_env_failed_on(tmp_path):
    """A correct dual-rail NCCL_IB_HCA stays as the launcher has it when fabric.devicemap-env FAILs on
    another variable (a wrong MC_GID_INDEX): only that one is printed corrected, and the gate's facts
    name it. Before: any FAIL replaced every set variable, cutting NCCL to one rail."""
    env = envfile(tmp_path, "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1,"
                  "192.168.101.11=roceP2p1s0f1\nNCCL_IB_HCA==rocep1s0f1:1,roceP2p1s0f1:1\n"
                  "NCCL_IB_GID_INDEX=3\nMC_GID_INDEX=1\nAFD_FABRIC_IP=192.168.100.11\n")
    snap = str(CASES / "fabric" / "02-spark-map-set-healthy")
    res = CliRunner().invoke(cli, ["all", "--json", "--no-history", "--snapshot", snap, "--launch-env", str(env)],
                             standalone_mode=False, catch_exceptions=False)
    g = next(g for g in json.loads(res.stdout)["gates"] if g["id"] == "fabric.devicemap-env")
    assert g["verdict"] == "FAIL" and g["facts"]["failed_vars"] == ["MC_GID_INDEX"], g
    res = CliRunner().invoke(cli, ["preflight", "--snapshot", snap, "--role", "generic", "--launch-env", str(env),
                                   "--export"], standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.stderr
    assert "export MC_GID_INDEX=3" in res.stdout, res.stdout
    assert "NCCL_IB_HCA" not in res.stdout and "NCCL_IB_GID_INDEX" not in res.stdout and "MAP" not in res.stdout
    assert "fabric.devicemap-env FAILed on (MC_GID_INDEX)" in res.stderr
    # the HCA itself wrong as well: both corrected, the right NCCL_IB_GID_INDEX still kept
    env2 = envfile(tmp_path, "NCCL_IB_HCA==rocep1s0f0:1\nNCCL_IB_GID_INDEX=3\nMC_GID_INDEX=1\n"
                   "AFD_FABRIC_IP=192.168.100.11\n", "both.env")
    res = CliRunner().invoke(cli, ["preflight", "--snapshot", snap, "--role", "generic", "--launch-env", str(env2),
                                   "--export"], standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.stderr
    assert "export NCCL_IB_HCA==rocep1s0f1:1" in res.stdout and "export MC_GID_INDEX=3" in res.stdout, res.stdout
    assert "NCCL_IB_GID_INDEX" not in res.stdout


def _rails_at_different_gid_indexes(tmp_path):
    """Case 02 (spark-b: 192.168.100.11 on rocep1s0f1 GID 3, 192.168.101.11 on roceP2p1s0f1) with a global
    IPv6 address on the second rail's netdev taking GID slots 2/3 first, so its IPv4 sits at 4 (v1) / 5 (v2)."""
    from snapfix import derive, fabric_case

    src = fabric_case("02-")
    port = "sys/class/infiniband/roceP2p1s0f1/ports/1"
    v4 = (src / port / "gids" / "3").read_text()
    v6 = "fd00:0000:0000:0101:0000:00ff:fe02:0201\n"
    einval = [i for i in (src / port / "gid_attrs" / "EINVAL-SLOTS").read_text().split() if i not in ("4", "5")]
    edits = {f"{port}/gids/{i}": g for i, g in ((2, v6), (3, v6), (4, v4), (5, v4))}
    edits.update({f"{port}/gid_attrs/types/{i}": t for i, t in ((4, "IB/RoCE v1\n"), (5, "RoCE v2\n"))})
    edits.update({f"{port}/gid_attrs/ndevs/{i}": "enP2p1s0f1np1\n" for i in (4, 5)})
    edits[f"{port}/gid_attrs/EINVAL-SLOTS"] = "\n".join(einval) + "\n"
    return derive(src, tmp_path / "snap", edits)


def test_export_never_pairs_a_kept_dual_rail_hca_with_one_rails_gid_index(tmp_path):
    """The launch env's dual-rail NCCL_IB_HCA is kept; its rails hold their IPv4 RoCE v2 GIDs at 3 and 5.
    One NCCL_IB_GID_INDEX serves every port NCCL opens, so printing the fabric IP's 3 would make the
    second rail use an IPv6 GID: it is left out and stderr says why."""
    snap = _rails_at_different_gid_indexes(tmp_path)
    env = envfile(tmp_path, "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1,"
                  "192.168.101.11=roceP2p1s0f1\nNCCL_IB_HCA==rocep1s0f1:1,roceP2p1s0f1:1\n"
                  "AFD_FABRIC_IP=192.168.100.11\n")
    res = CliRunner().invoke(cli, ["preflight", "--snapshot", str(snap), "--role", "generic", "--launch-env", str(env),
                                   "--export"], standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0, res.stderr
    assert "NCCL_IB_HCA" not in res.stdout and "NCCL_IB_GID_INDEX" not in res.stdout, res.stdout
    assert "export UCX_NET_DEVICES=rocep1s0f1:1" in res.stdout
    assert ("NCCL_IB_GID_INDEX not printed: NCCL_IB_HCA==rocep1s0f1:1,roceP2p1s0f1:1 selects ports whose IPv4 "
            "RoCE v2 GIDs sit at different indexes (rocep1s0f1:1 GID 3, roceP2p1s0f1:1 GID 5)") in res.stderr, \
        res.stderr


def test_exported_gid_index_belongs_to_the_hca_in_effect(tmp_path):
    """On recorded facts: a kept HCA gets its own ports' index (or none), a kept GID index keeps afddiag
    from printing an HCA it does not suit; afddiag's own pair is printed as it is."""
    from afddiag.endpoint import exports_to_print, launch_exports, pair_gid_with_hca
    from afddiag.model.run import Inputs
    from afddiag.runner import gather

    fab = gather(Inputs(snapshot=str(_rails_at_different_gid_indexes(tmp_path)), families=frozenset({"fabric"}))).fabric
    ip = "192.168.100.11"
    pairs = launch_exports(fab, ip)
    assert ("NCCL_IB_HCA", "=rocep1s0f1:1") in pairs and ("NCCL_IB_GID_INDEX", "3") in pairs

    def export(env):
        return pair_gid_with_hca(fab, ip, env, *exports_to_print(pairs, env, []))

    out, notes = export({})  # nothing kept: afddiag's own pair
    assert dict(out)["NCCL_IB_HCA"] == "=rocep1s0f1:1" and dict(out)["NCCL_IB_GID_INDEX"] == "3" and notes == []
    out, notes = export({"NCCL_IB_HCA": "=roceP2p1s0f1:1"})  # another rail kept: its own IPv4 RoCE v2 GID
    assert dict(out)["NCCL_IB_GID_INDEX"] == "5" and "NCCL_IB_HCA" not in dict(out)
    assert len(notes) == 1 and "NCCL_IB_GID_INDEX=5" in notes[0] and "index 3" in notes[0]
    out, notes = export({"NCCL_IB_HCA": "=rocep1s0f0:1"})  # a DOWN port only: NCCL opens nothing there
    assert "NCCL_IB_GID_INDEX" not in dict(out) and "selects no ACTIVE port" in notes[0]
    out, notes = export({"NCCL_IB_GID_INDEX": "5"})  # kept index is not the fabric IP's GID on rocep1s0f1
    assert "NCCL_IB_HCA" not in dict(out) and "NCCL_IB_GID_INDEX" not in dict(out)
    assert "NCCL_IB_HCA not printed: the kept NCCL_IB_GID_INDEX=5" in notes[0] and "index 3" in notes[0]
    out, notes = export({"NCCL_IB_GID_INDEX": "3"})
    assert dict(out)["NCCL_IB_HCA"] == "=rocep1s0f1:1" and notes == []


def test_devicemap_env_names_each_variables_source(tmp_path):
    """Case 12: the launch env sets only the map; NCCL_IB_HCA and NCCL_IB_GID_INDEX are the snapshot's
    (what the captured process had, inherited where the file does not set them): each source is named."""
    c12 = CASES / "fabric" / "12-cx7-single-port-healthy"
    env = envfile(tmp_path, "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=198.51.100.72=mlx5_0\n", "coord.env")
    res = CliRunner().invoke(cli, ["all", "--json", "--no-history", "--snapshot", str(c12), "--launch-env", str(env)],
                             standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    g = next(g for g in rep["gates"] if g["id"] == "fabric.devicemap-env")
    assert g["facts"]["sources"] == {"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": f"launch env {env}",
                                     "NCCL_IB_HCA": "snapshot env", "NCCL_IB_GID_INDEX": "snapshot env"}
    assert (f"(DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP from the launch env {env}; NCCL_IB_HCA, NCCL_IB_GID_INDEX "
            "from the snapshot env)") in g["summary"]
    assert rep["inputs"]["env_source"] == f"launch env {env} (+ NCCL_IB_GID_INDEX, NCCL_IB_HCA from the snapshot env)"
    # the file's own value wins over the snapshot's
    env2 = envfile(tmp_path, "NCCL_IB_GID_INDEX=1\n", "gid.env")
    res = CliRunner().invoke(cli, ["all", "--json", "--no-history", "--snapshot", str(c12), "--launch-env", str(env2)],
                             standalone_mode=False, catch_exceptions=False)
    g = next(g for g in json.loads(res.stdout)["gates"] if g["id"] == "fabric.devicemap-env")
    assert g["verdict"] == "FAIL" and "NCCL_IB_GID_INDEX=1" in g["summary"]
    assert f"NCCL_IB_GID_INDEX from the launch env {env2}" in g["summary"]
