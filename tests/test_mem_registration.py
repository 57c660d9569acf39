"""fabric.mem-registration on recorded-shape readings (memreg.json): a Spark, an H200 with GPUDirect
RDMA, the CMA signature, RLIMIT_MEMLOCK; then a snapshot replay and a capture round trip."""

import copy
import json

import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from afddiag.gates import Context, fabric, resolve_fabric_ip
from afddiag.model.fabric import memreg_facts
from afddiag.model.run import Inputs, Observation
from afddiag.playbook import Playbook, PlaybookError, load, parse

SPARK_DEVS = ["rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"]


def _dev(name, host=True, count=(64, 64, None), gpu_errno=14, dmabuf=None):
    d = {"name": name, "host_mr": {"ok": host, "bytes": 1 << 20} if host is not None else None,
         "host_mr_count": {"wanted": count[0], "registered": count[1], "bytes_each": 1 << 20, "errno": count[2],
                           "error": "Failed to register a MR" if count[2] else None},
         "gpu_mr": {"ok": gpu_errno is None, "errno": gpu_errno, "gpu_ordinal": 0, "bytes": 2 << 20},
         "dmabuf_mr": dmabuf, "destroyed": True}
    if host is False:
        d["host_mr"].update(errno=12, error="Failed to register a MR")
    return d


def spark(**over):
    """A DGX Spark as the probe reads it: no GPUDirect RDMA, the dma-buf export refused."""
    r = {"driver": {"version": "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05",
                    "open_kernel_module": True, "peermem_loaded": False, "notes": []},
         "cma": {"cma_total_kb": 65536, "cma_free_kb": 60000, "kho_off": False, "kernel_release": "6.17.0-1014-nvidia",
                 "notes": []},
         "memlock_soft_bytes": -1,
         "cuda": {"devices": [{"ordinal": 0, "name": "NVIDIA GB10", "integrated": True,
                               "gpu_direct_rdma_supported": False, "dma_buf_supported": False}],
                  "dmabuf_export": {"ordinal": 0, "bytes": 2 << 20, "ok": False,
                                    "error": "cuMemGetHandleForAddressRange returned CUDA_ERROR_NOT_SUPPORTED (801)"}},
         "verbs": {"devices": [_dev(n) for n in SPARK_DEVS]}, "count_wanted": 64, "notes": []}
    r.update(over)
    return r


def h200():
    r = spark()
    r["driver"].update(peermem_loaded=True, open_kernel_module=False)
    r["cuda"] = {"devices": [{"ordinal": 0, "name": "NVIDIA H200", "integrated": False,
                              "gpu_direct_rdma_supported": True, "dma_buf_supported": True}],
                 "dmabuf_export": {"ordinal": 0, "bytes": 2 << 20, "ok": True, "error": None}}
    r["verbs"] = {"devices": [_dev("mlx5_0", gpu_errno=None, dmabuf={"ok": True, "gpu_ordinal": 0})]}
    return r


def _v(readings, pb):
    obs = Observation("h", "test", memreg=memreg_facts(readings))
    return fabric.mem_registration(Context(obs, Inputs(playbook=pb), resolve_fabric_ip(None, None)))


HOST = Playbook(name="expert", engine_registers="host")
GPU = Playbook(name="gds", engine_registers="gpu")


def _cma(r, free, kho=False):
    r["cma"].update(cma_free_kb=free, kho_off=kho)
    return r


def _count(r, got, errno=12, memlock=-1):
    for d in r["verbs"]["devices"]:
        d["host_mr_count"].update(registered=got, errno=errno)
    r["memlock_soft_bytes"] = memlock
    return r


def _dmabuf_eopnotsupp():
    r = spark()
    r["cuda"]["dmabuf_export"] = {"ordinal": 0, "bytes": 2 << 20, "ok": True, "error": None}
    for d in r["verbs"]["devices"]:
        d["dmabuf_mr"] = {"ok": False, "errno": 95, "error": "Failed to register a dma-buf MR"}
    return r


@pytest.mark.parametrize("readings,pb,verdict,words", [
    (spark(), HOST, "PASS", "host memory yes (64 of 64 x 1 MiB held at once); GPU memory no"),
    (spark(), HOST, "PASS", "CUDA reports no GPUDirect RDMA on GPU 0 NVIDIA GB10"),
    (spark(), HOST, "PASS", "errno 14: Bad address (nvidia_peermem not loaded)"),
    (spark(), GPU, "FAIL", "role gds registers gpu memory: its registrations will fail"),
    (spark(), Playbook(), "PASS", "role generic does not say"),
    (h200(), GPU, "PASS", "GPU memory yes (nvidia-peermem, dma-buf)"),
    (_dmabuf_eopnotsupp(), GPU, "FAIL", "this device cannot (EOPNOTSUPP)"),
    # the Spark kernel bug: signature alone WARNs; with the count cut short by ENOMEM it FAILs
    (_cma(spark(), 70000), HOST, "WARN", "CmaFree 70000 kB > CmaTotal 65536 kB"),
    (_count(_cma(spark(), 70000), 9), HOST, "FAIL", "9 of 64 x 1 MiB held at once (ENOMEM)"),
    (_count(_cma(spark(), 70000, kho=True), 9), HOST, "WARN", "only 9 of 64"),  # kho=off: not the signature
    (_count(spark(), 7, memlock=8 << 20), HOST, "PASS", "stopped at RLIMIT_MEMLOCK 8 MiB (launch.memlock judges it)"),
    (_count(_cma(spark(), 70000), 7, memlock=8 << 20), HOST, "WARN", "signature"),  # memlock explains the count
    # a short count with RLIMIT_MEMLOCK unread: WARN naming it (the summary divided None by a MiB: a crash)
    (_count(spark(), 7, memlock=None), HOST, "WARN", "only 7 of 64 x 1 MiB held at once (ENOMEM with RLIMIT_MEMLOCK "
     "not read)"),
    (spark(verbs={"devices": [_dev("rocep1s0f0", host=False)]}), HOST, "FAIL", "cannot register host memory"),
    (spark(verbs={"devices": [], "why": "pyverbs is not installed: apt install python3-pyverbs"}), HOST, "SKIP",
     "pyverbs"),
    (None, HOST, "SKIP", "not captured"),
])
def test_mem_registration_table(readings, pb, verdict, words):
    v = _v(copy.deepcopy(readings), pb)
    assert v.verdict == verdict, v.summary
    assert words in v.summary, v.summary
    if readings and readings["verbs"]["devices"]:
        assert v.summary.startswith(readings["verbs"]["devices"][0]["name"])
    if verdict == "FAIL" and "CmaFree" in v.summary:
        assert "kho=off" in v.remedy


def test_roles_say_which_memory_their_engine_registers():
    assert load("expert").engine_registers == "host" and load("coordinator").engine_registers == "host"
    assert load("generic").engine_registers == ""
    with pytest.raises(PlaybookError, match="engine_registers"):
        parse('[fabric]\nengine_registers = "vram"\n', "x.toml")


def _gate(args):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return next(g for g in json.loads(res.stdout)["gates"] if g["id"] == "fabric.mem-registration")


@pytest.mark.parametrize("readings,role,verdict", [(spark(), "expert", "PASS"),
                                                   (_count(_cma(spark(), 70000), 9), "expert", "FAIL")])
def test_replay_and_capture_round_trip(tmp_path, readings, role, verdict):
    """memreg.json replays from a folder and from a capture bundle with the same verdict."""
    from afddiag.capture import collect_bundle, write_bundle
    from conftest import CASES
    from fakes import case_sources

    case = CASES / "fabric" / "12-cx7-single-port-healthy"
    files, _, _ = collect_bundle(case_sources(case, memreg=lambda: readings))
    assert json.loads(files["memreg.json"]) == readings
    bundle = tmp_path / "b.tar.gz"
    write_bundle(bundle, case_sources(case, memreg=lambda: readings))
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "memreg.json").write_text(json.dumps(readings))
    args = ["fabric", "--json", "--role", role]
    direct, replay = _gate(args + ["--snapshot", str(snap)]), _gate(args + ["--snapshot", str(bundle)])
    assert direct["verdict"] == replay["verdict"] == verdict
    assert direct["summary"] == replay["summary"]
    assert direct["facts"]["kinds"]["host"] == SPARK_DEVS


def test_snapshot_without_memreg_skips(tmp_path):
    (tmp_path / "env").write_text("AFD_ROLE=expert\n")
    v = _gate(["fabric", "--json", "--snapshot", str(tmp_path)])
    assert v["verdict"] == "SKIP" and "not captured" in v["summary"]
