"""One runner, one probe registry: a live run, a capture and a replay read through the same code.

- every snapshot artifact name lives in one module (the registry);
- a live run from fake host sources and the replay of their capture give the same facts and verdicts;
- `gpu`/`fabric` and `all` give the same verdicts for the gates they share, on every shared case;
- `gpu --snapshot` reads the image the snapshot holds; `gpu --launch-env` with AFD_IMAGE inspects it;
- the gates and the probes do not import the runner.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from afddiag import runner
from afddiag.cli import cli
from afddiag.model import to_jsonable
from afddiag.model.run import Inputs, Observation
from afddiag.probes import registry
from conftest import CASES, REPO, case_dirs, load_case
from fakes import case_args, case_sources

FABRIC = case_dirs("fabric")
GPU = case_dirs("gpu")
IDS = [f"{p.parent.name}/{p.name}" for p in FABRIC + GPU]


def run_json(args):
    res = CliRunner().invoke(cli, args + ["--json", "--no-history"], standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout), res.return_value


def test_each_artifact_name_is_in_one_module_only():
    """A probe lives in one place: each JSON artifact's name is written in its probe's module only."""
    owner = {a.name: e.module.partition(":")[0] for e in registry.PROBES for a in e.probe().artifacts
             if a.kind == "json"}
    owner[registry.CAPTURE_MANIFEST] = "afddiag.probes.registry"
    assert {"ip-addr.json", "rdma-dev.json", "image.json", "gpu.json", "limits.json", "versions.json"} <= set(owner)
    sources = {p: p.read_text(encoding="utf-8") for p in (REPO / "afddiag").rglob("*") if p.is_file()
               and p.suffix in (".py", ".json", ".toml", ".md")}
    for name, module in sorted(owner.items()):
        where = sorted(str(p.relative_to(REPO)) for p, text in sources.items() if name in text)
        assert where == [module.replace(".", "/") + ".py"], (name, where)


def test_registry_entries_are_complete():
    seen = set()
    for e in registry.PROBES:
        p = e.probe()
        assert p.name == e.name and p.name not in seen, (e, p.name)
        assert p.what and callable(p.read) and callable(p.facts) and callable(p.failed)
        seen.add(p.name)
        for a in p.artifacts:
            assert a.kind in ("json", "text", "tree"), (p.name, a)
            assert a.kind != "tree" or p.copy is not None, (p.name, a)  # a tree is copied
        assert p.live_only == (not p.artifacts), p.name
        assert not p.live_only or p.replay is not None, p.name
        assert not e.report or hasattr(Observation(host="", source=""), e.name), e.name
    assert "how to add a probe" in registry.__doc__.lower()


def test_a_run_imports_only_the_probes_its_families_need():
    """The registry loads probe modules by family: a `gpu` replay never imports the fabric probe (so
    never the fabric models), in a fresh interpreter."""
    import subprocess
    import sys

    code = ("import sys\nfrom afddiag.model.run import Inputs\nfrom afddiag import runner\n"
            "runner.gather(Inputs(snapshot=sys.argv[1], families=frozenset({'gpu'})))\n"
            "print(sorted(m for m in sys.modules if m.startswith('afddiag.probes.')))\n")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "tests/fixtures/gpu/h200-live-idle")],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    loaded = set(eval(out.strip().splitlines()[-1]))  # noqa: S307 - our own print of a list of names
    assert "afddiag.probes.gpu" in loaded and {"afddiag.probes.fabric", "afddiag.probes.qp", "afddiag.probes.route",
                                               "afddiag.probes.memreg"}.isdisjoint(loaded), loaded


def _facts(obs) -> dict:
    """The facts of an observation without the labels that name where they came from."""
    out = to_jsonable({"fabric": obs.fabric, "gpu": obs.gpu, "limits": obs.limits, "image": obs.image,
                       "route": obs.route, "versions": obs.versions, "cpu": obs.cpu, "env": obs.env, "host": obs.host})
    if out["fabric"]:
        out["fabric"].pop("order_source")
        out["fabric"].pop("addresses_source")
        out["fabric"]["notes"] = [n for n in out["fabric"]["notes"] if "device index order" not in n]
    if out["gpu"]:
        out["gpu"].pop("readings")
    for r in (out["route"] or {}).get("routes", []):
        r.pop("source")
    return out


@pytest.mark.parametrize("case", FABRIC + GPU, ids=IDS)
def test_live_run_and_replay_of_its_capture_see_the_same(case, tmp_path):
    """The live loop over fake host sources (a case) and the replay of the capture of those sources:
    the same facts (source labels aside) and the same verdicts (QP walk aside)."""
    meta = load_case(case)
    peers = meta.get("peer_fabric_ips") or []
    src = case_sources(case, route=None)
    inputs = Inputs(fabric_ip=meta.get("fabric_ip"), peers=list(peers), run_qp=False)
    # ip route get is not faked: no peers for the live side, so both judge "no peer given"
    inputs.peers = []
    live_rep, live_obs = runner.diagnose(inputs, host=src)
    files, _, _ = runner.capture(inputs, src)
    snap = tmp_path / "snap"
    for rel, data in files.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
    import dataclasses

    replay_rep, replay_obs = runner.diagnose(dataclasses.replace(inputs, snapshot=str(snap)))
    a, b = _facts(live_obs), _facts(replay_obs)
    b["env"] = {k: v for k, v in b["env"].items() if k in a["env"] or not k.startswith("AFD_")}
    assert {k: v for k, v in b["env"].items() if k in ("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", "NCCL_IB_HCA",
                                                          "NCCL_IB_GID_INDEX")} == a["env"]
    a.pop("env"), b.pop("env")
    skip = ("fabric.qp-rtr",)
    if not (case / "sys").is_dir():  # a GPU case has no sysfs at all, which no live host lacks: nothing to compare
        a.pop("fabric"), b.pop("fabric")
        skip = ("fabric.",)
    assert a == b
    verdicts = lambda rep: {g["id"]: g["verdict"] for g in rep["gates"] if not g["id"].startswith(skip)}  # noqa: E731
    assert verdicts(live_rep) == verdicts(replay_rep)


SHARED = {"gpu": "gpu", "fabric": "fabric"}


@pytest.mark.parametrize("case", FABRIC + GPU, ids=IDS)
def test_family_commands_and_all_agree_on_shared_gates(case):
    """Every shared case through its family command and `all`: the same verdict for every gate both run."""
    args = ["--snapshot", str(case)] + case_args(case)
    both = {}
    for cmd in ("fabric", "gpu", "all"):
        extra = [] if cmd != "gpu" else [a for a in args if a not in case_args(case)]
        rep, _ = run_json([cmd] + (args if cmd != "gpu" else extra))
        both[cmd] = {g["id"]: (g["verdict"], g["summary"]) for g in rep["gates"]}
    for fam in ("fabric", "gpu"):
        shared = set(both[fam]) & set(both["all"])
        assert shared and all(g.startswith(fam + ".") for g in shared), fam
        assert {g: both[fam][g] for g in shared} == {g: both["all"][g] for g in shared}, (fam, case.name)


GB10_IMAGE = {"RepoTags": ["registry.example/afd/expert:2026.11"],
              "Config": {"Labels": {"afd.export.sm_count": "48"},
                         "Env": ["CUDA_VERSION=13.0.1", "NVIDIA_REQUIRE_CUDA=cuda>=13.0",
                                 "TORCH_CUDA_ARCH_LIST=12.0a"]}}


def test_gpu_snapshot_with_image_judges_image_arch(tmp_path):
    snap = tmp_path / "snap"
    shutil.copytree(CASES / "gpu" / "01-gb10-healthy-unified-memory", snap)
    (snap / "image.json").write_text(json.dumps([GB10_IMAGE]))
    for cmd in ("gpu", "all"):
        rep, code = run_json([cmd, "--snapshot", str(snap)])
        g = next(g for g in rep["gates"] if g["id"] == "gpu.image-arch")
        assert g["verdict"] == "FAIL" and "sm_121" in g["summary"] and "sm_120a" in g["summary"], (cmd, g)
        assert code == 2


def test_gpu_launch_env_with_image_inspects_it(tmp_path, monkeypatch):
    """`gpu --launch-env F` with AFD_IMAGE in F: the image probe runs (here docker answers from a fake)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    docker = bindir / "docker"
    docker.write_text("#!/bin/sh\n[ \"$3\" = -- ] && [ \"$4\" = registry.example/afd/expert:sm120 ] || exit 1\n"
                      "cat <<'EOF'\n"
                      + json.dumps([GB10_IMAGE]) + "\nEOF\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    env = tmp_path / "l.env"
    env.write_text("AFD_IMAGE=registry.example/afd/expert:sm120\n")
    snap = tmp_path / "snap"
    shutil.copytree(CASES / "gpu" / "01-gb10-healthy-unified-memory", snap)
    # a snapshot without image.json, with the launch env's AFD_IMAGE: "not captured", not "no AFD_IMAGE"
    rep, _ = run_json(["gpu", "--snapshot", str(snap), "--launch-env", str(env)])
    g = next(g for g in rep["gates"] if g["id"] == "gpu.image-arch")
    assert g["verdict"] == "SKIP" and "not captured" in g["summary"] and "no AFD_IMAGE" not in g["summary"], g
    # live: the image probe inspects it
    obs = runner.gather(Inputs(launch_env={"AFD_IMAGE": "registry.example/afd/expert:sm120"}, launch_env_path=str(env),
                               families=frozenset({"gpu"})))
    assert obs.image is not None and obs.image.source == "docker" and obs.image.ref.endswith(":sm120")
    assert obs.image.env["TORCH_CUDA_ARCH_LIST"] == "12.0a"


def test_gates_and_probes_do_not_import_the_runner():
    code = ("import sys, afddiag.gates, afddiag.gates.fabric, afddiag.gates.gpu, afddiag.probes.route, "
            "afddiag.probes.registry, afddiag.endpoint; "
            "print(sorted(m for m in sys.modules if m in ('afddiag.runner', 'afddiag.cli', 'click')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert out.strip() == "[]"
    for path in list((REPO / "afddiag" / "gates").glob("*.py")) + list((REPO / "afddiag" / "probes").glob("*.py")):
        assert not re.search(r"from afddiag(\.runner| import runner)|import afddiag\.runner", path.read_text()), path


def test_endpoint_is_decided_in_one_place():
    """The fabric IP / endpoint choices live in afddiag/endpoint.py; the other modules call it."""
    for path in (REPO / "afddiag").rglob("*.py"):
        if path.name == "endpoint.py":
            continue
        text = path.read_text()
        for fn in ("def resolve_fabric_ip", "def choose_sgid", "def choose_port", "def launch_exports",
                   "def device_map"):
            assert fn not in text, (path, fn)


def test_the_load_probe_is_its_own_entry_and_both_bundle_layouts_replay(tmp_path, monkeypatch):
    """The load probe is a registry entry of its own, after the GPU probe: a run without --load never
    imports it; a live --load run and the replay of its capture (gpu.json without the figures, the load
    probe's own gpu-load.json) give the same GPU facts and verdicts, and so does a bundle of an older
    afddiag (the figures inside gpu.json, no gpu-load.json)."""
    import dataclasses

    from test_health import FIX, PROBE

    idle = json.loads((FIX / "h200-live-idle" / "gpu.json").read_text())
    probe = json.loads(json.dumps(PROBE))
    probe["device"]["uuid"] = idle["devices"][0]["uuid"]
    monkeypatch.setattr("afddiag.probes.load.run_load_probe", lambda i, budget_s=3.0: json.loads(json.dumps(probe)))
    src = registry.Sources(gpu=lambda: json.loads(json.dumps(idle)))
    inputs = Inputs(load=True, run_qp=False, families=frozenset({"gpu"}))
    quiet = registry.Run(dataclasses.replace(inputs, load=False), Observation(host="h", source="t"), host=src)
    assert [p.name for p in registry.probes({"gpu"}, quiet)] == ["host", "env", "image", "gpu", "shm", "versions"]
    live_rep, live_obs = runner.diagnose(inputs, host=src)
    assert live_obs.gpu.devices[0].under_load.bf16_tflops == probe["achieved"]["bf16_tflops"]
    files, _, _ = runner.capture(inputs, src)
    assert all(d.get("under_load") is None for d in json.loads(files["gpu.json"])["devices"])
    assert json.loads(files["gpu-load.json"])["devices"][0]["under_load"]["achieved"] == probe["achieved"]

    def replay(snap, files):
        for rel, data in files.items():
            (snap / rel).parent.mkdir(parents=True, exist_ok=True)
            (snap / rel).write_bytes(data)
        return runner.diagnose(dataclasses.replace(inputs, load=False, snapshot=str(snap)))

    older = {k: v for k, v in files.items() if k != "gpu-load.json"}
    older["gpu.json"] = (json.dumps(live_obs.gpu.readings) + "\n").encode()  # the figures inside gpu.json
    verdicts = lambda rep: {g["id"]: (g["verdict"], g["summary"]) for g in rep["gates"]}  # noqa: E731
    for snap, bundle in ((tmp_path / "new", files), (tmp_path / "old", older)):
        rep, obs = replay(snap, bundle)
        assert _facts(obs)["gpu"] == _facts(live_obs)["gpu"], snap.name
        assert verdicts(rep) == verdicts(live_rep), snap.name


def test_baseline_record_reads_through_the_runner(tmp_path, monkeypatch):
    """`baseline record`: the registry's GPU probe (load probe attached by UUID) and CPU probe."""
    from test_health import FIX, PROBE

    idle = json.loads((FIX / "h200-live-idle" / "gpu.json").read_text())
    probe = json.loads(json.dumps(PROBE))
    probe["device"]["uuid"] = idle["devices"][0]["uuid"]
    monkeypatch.setattr("afddiag.probes.gpu.read_gpu", lambda timeout_s=10.0, **kw: json.loads(json.dumps(idle)))
    monkeypatch.setattr("afddiag.probes.load.run_load_probe", lambda i, budget_s=3.0: probe)
    monkeypatch.setattr("afddiag.probes.cpu.read_cpu", lambda: {"loop_mops": 123.0, "max_mhz": 3000.0})
    path = tmp_path / "b.json"
    res = CliRunner().invoke(cli, ["baseline", "record", "--path", str(path)], standalone_mode=False,
                             catch_exceptions=False)
    assert res.return_value == 0, res.output
    data = json.loads(path.read_text())
    g = data["gpus"][idle["devices"][0]["uuid"]]
    assert g["bf16_tflops"] == probe["achieved"]["bf16_tflops"] and data["cpu"]["loop_mops"] == 123.0

    def boom():
        raise RuntimeError("cpufreq exploded")

    monkeypatch.setattr("afddiag.probes.cpu.read_cpu", boom)
    res = CliRunner().invoke(cli, ["baseline", "record", "--path", str(tmp_path / "c.json")], standalone_mode=False,
                             catch_exceptions=False)
    assert res.return_value == 3 and "cpufreq exploded" in res.stderr and "nothing recorded" in res.stderr
    assert not (tmp_path / "c.json").exists()


def test_expectations_are_resolved_once_with_their_source(tmp_path):
    """--expect-sm beats the launch env's AFD_IMAGE_SM_COUNT, which beats the image label and the
    snapshot's expect; the capacity comes from --expect-capacity, else the other side's flag; the
    report carries each with its source and the gates judge by it."""
    from afddiag.expect import resolve
    from afddiag.model.gpu import GpuFacts
    from afddiag.model.host import ImageFacts
    from afddiag.model.run import Observation

    obs = Observation(host="h", source="t", gpu=GpuFacts(expect_image_sm_count=132),
                      image=ImageFacts(ref="img:1", labels={"afd.export.sm_count": "170"}))
    le = {"AFD_ROLE": "coordinator", "AFD_PREFILL_CAPACITY": "256", "AFD_EXPERT_CAPACITY": "128",
          "AFD_IMAGE_SM_COUNT": "188", "AFD_IMAGE": "img:1"}
    ex = resolve(Inputs(expect_sm=48, launch_env=le, launch_env_path="c.env"), obs)
    assert (ex.sm_count.value, ex.sm_count.source) == (48, "--expect-sm")
    ex = resolve(Inputs(launch_env=le, launch_env_path="c.env"), obs)
    assert (ex.sm_count.value, ex.sm_count.source) == (188, "AFD_IMAGE_SM_COUNT in c.env")
    assert (ex.capacity_key.value, ex.capacity.value, ex.capacity.source) == \
        ("AFD_PREFILL_CAPACITY", 128, "AFD_EXPERT_CAPACITY in the same file")
    assert ex.image.value == "img:1" and ex.role.value == "generic"
    ex = resolve(Inputs(launch_env={"AFD_ROLE": "expert"}, launch_env_path="e.env", expect_capacity=64), obs)
    assert (ex.sm_count.value, ex.sm_count.source) == (170, "image img:1 label afd.export.sm_count")
    assert (ex.capacity_key.value, ex.capacity.value, ex.capacity.source) == \
        ("AFD_EXPERT_CAPACITY", 64, "--expect-capacity")
    ex = resolve(Inputs(), Observation(host="h", source="t", gpu=GpuFacts(expect_image_sm_count=132)))
    assert (ex.sm_count.value, ex.sm_count.source) == (132, "snapshot expect.image_sm_count") and ex.capacity is None
    # through the CLI: the report names what was expected, and the gate judged by it
    case = CASES / "gpu" / "04-rtx5090-image-exported-for-188-sms"
    rep, code = run_json(["gpu", "--snapshot", str(case), "--expect-sm", "170"])
    assert rep["expectations"]["sm_count"] == {"value": 170, "source": "--expect-sm"}
    sm = next(g for g in rep["gates"] if g["id"] == "gpu.sm-count")
    assert sm["verdict"] == "PASS" and sm["facts"]["expected_from"] == "--expect-sm"
    rep, _ = run_json(["gpu", "--snapshot", str(CASES / "gpu" / "01-gb10-healthy-unified-memory")])
    base = rep["expectations"]["gpu_baselines"]["0"]
    assert base["source"].startswith(("snapshot", "reference table")) and base["value"]
    slow = next(g for g in rep["gates"] if g["id"] == "gpu.slow-state")
    assert slow["facts"]["0"]["baseline_source"] == base["source"]


def test_host_report_carries_a_summary_the_fleet_reads(report_schema):
    """Each host report carries its summary (schema-checked); the fleet gates read it, not gate facts:
    a report whose gate facts lack the keys still compares by its summary."""
    import jsonschema

    from afddiag.gates import fleet as fg

    case = CASES / "fabric" / "02-spark-map-set-healthy"
    rep, _ = run_json(["all", "--snapshot", str(case), "--fabric-ip", "192.168.100.11"])
    jsonschema.validate(rep, report_schema)
    s = rep["summary"]
    assert (s["fabric_ip"], s["rdma_device"], s["engine_device"], s["gid_index"], s["roce_mtu_bytes"]) == \
        ("192.168.100.11", "rocep1s0f1", "rocep1s0f1", 3, 4096)
    assert s["ipv4_prefixlen"]["192.168.100.11"] and s["versions"]["afddiag"]
    other = json.loads(json.dumps(rep))
    other["host"] = "other"
    other["summary"]["roce_mtu_bytes"] = 1024
    other["summary"]["netdev_mtu_bytes"] = 1500
    for g in rep["gates"] + other["gates"]:
        g["facts"] = {}  # the fleet never looks here
    hosts = [fg.HostResult(name=r["host"], report=r) for r in (rep, other)]
    v = fg.mtu(hosts, {})
    assert v.verdict == "FAIL" and "other RoCE MTU 1024" in v.summary, v
    assert sorted(fg.gid_index(hosts, {}).facts["gid_index"].values()) == [3, 3]
