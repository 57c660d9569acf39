"""Replay of the issue-15 readings recorded on a real H200 (tests/fixtures/gpu/h200-issue15: copies of
benchmarks/results/h200-2026-12-01/issue15-*, made by benchmarks/h200/issue15.sh).

The folder goes through the path every replay takes (the registry's artifacts → facts, the runner, the
gates), as the coordinator with the launch env the live run had. The readings the H200 run listed
(CUDA attributes, the dma-buf export, the driver flavour, meminfo, NVML free memory; summary.txt) must
be the facts the replay reads; the verdicts are asserted from what those readings imply, not compared
with the verdicts that run printed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from afddiag.check import diagnose as diagnose_full
from afddiag.inputs import make_inputs
from conftest import REPO

FIX = Path(__file__).resolve().parent / "fixtures" / "gpu" / "h200-issue15"
GATES = ("fabric.mem-registration", "gpu.memory", "gpu.headroom", "host.pcie", "launch.memory-plan")
GIB = 2**30


def _printed() -> tuple[dict[str, tuple[str, str]], list[str]]:
    """summary.txt → ({gate: (verdict, summary)}, the reading lines before the verdicts)."""
    verdicts, readings = {}, []
    for line in (FIX / "summary.txt").read_text().splitlines():
        m = re.match(r"^([a-z]+\.[a-z-]+): (PASS|WARN|FAIL|SKIP|ERROR): (.*)$", line)
        if m:
            verdicts[m.group(1)] = (m.group(2), m.group(3))
        elif line.strip():
            readings.append(line)
    return verdicts, readings


@pytest.fixture(scope="module")
def replay():
    inputs = make_inputs(snapshot=str(FIX), role="coordinator", launch_env_path=str(FIX / "coord.env"))
    rep, obs = diagnose_full(inputs, {"fabric", "gpu", "host", "launch"})
    return rep, obs, {g["id"]: g for g in rep["gates"]}


# What the readings imply, per gate (written from the readings, not taken from the verdicts the H200 printed):
# no pyverbs there (nothing registered); 140.4 GiB of NVML memory with 139.8 free covers the coordinator's
# 97 % reservation (136.2 GiB); a discrete GPU's reservation is gpu.memory's, not gpu.headroom's; the GPU's
# link trained x16 at 32 GT/s, its maximum; the launch env's capacity 1024 with the drafter on leaves a pool.
EXPECTED = {"fabric.mem-registration": ("SKIP", ["no registration tried: pyverbs is not installed"]),
            "gpu.memory": ("PASS", ["140.4 GiB (nvml)"]),
            "gpu.headroom": ("SKIP", ["discrete GPU: gpu.memory judges NVML free memory against the 97% reservation"]),
            "host.pcie": ("PASS", ["1 link(s) at their maximum width", "x16 32 GT/s"]),
            "launch.memory-plan": ("PASS", ["140.40 GiB", "reservation 97% (role coordinator)",
                                            "AFD_PREFILL_CAPACITY=1024", "AFD_DRAFTER=1"])}


@pytest.mark.parametrize("gid", GATES)
def test_verdict_and_figures_follow_from_the_readings(replay, gid):
    _, _, gates = replay
    verdict, words = EXPECTED[gid]
    assert gates[gid]["verdict"] == verdict, (gid, gates[gid]["summary"])
    for w in words:
        assert w in gates[gid]["summary"], (gid, w, gates[gid]["summary"])


def test_registration_readings_as_printed(replay, report_schema):
    import jsonschema

    rep, obs, gates = replay
    jsonschema.validate(rep, report_schema)
    _, lines = _printed()
    text = "\n".join(lines)
    m = obs.memreg
    (gpu,) = m.gpus
    printed = re.search(r"GPU 0 NVIDIA H200: GPUDirect RDMA supported (\w+), dma-buf supported (\w+), integrated (\w+)",
                        text)
    assert printed, text
    assert (str(gpu["gpu_direct_rdma_supported"]), str(gpu["dma_buf_supported"]), str(gpu["integrated"])) == \
        printed.groups() == ("True", "True", "False")
    ex = re.search(r"dma-buf export of (\d+) MiB on GPU 0: ok=(\w+) error=(\w+)", text)
    assert (m.dmabuf_export["bytes"] // 2**20, str(m.dmabuf_export["ok"]), str(m.dmabuf_export["error"])) == \
        (int(ex.group(1)), ex.group(2), ex.group(3)) == (2, "True", "None")
    drv = re.search(r"driver open kernel module (\w+), nvidia_peermem loaded (\w+)", text)
    assert (str(m.open_kernel_module), str(m.peermem_loaded)) == drv.groups() == ("True", "False")
    assert m.devices == [] and "pyverbs is not installed" in m.verbs_why  # no MR was tried on the H200
    # the report keeps that CUDA side although nothing was registered (SKIP)
    f = gates["fabric.mem-registration"]["facts"]
    assert f["gpus"][0]["dma_buf_supported"] is True and f["gpus"][0]["gpu_direct_rdma_supported"] is True
    assert f["dmabuf_export"]["ok"] is True and f["open_kernel_module"] is True and f["peermem_loaded"] is False


def test_memory_readings_as_printed(replay):
    _, _, gates = replay
    _, lines = _printed()
    text = "\n".join(lines)
    mi = gates["gpu.headroom"]["facts"]["host_meminfo_kb"]
    for k, gib in re.findall(r"(\w+) (\d+\.\d) GiB", text.split("meminfo: ", 1)[1].splitlines()[0]):
        assert f"{mi[k] / 2**20:.1f}" == gib, k
    free, total = re.search(r"GPU 0: NVML free ([\d.]+) GiB of ([\d.]+) GiB", text).groups()
    mem = gates["gpu.memory"]["facts"]["0"]
    assert (f"{mem['free_bytes'] / GIB:.2f}", f"{mem['total_bytes'] / GIB:.2f}") == (free, total)
    assert mem["source"] == "nvml" and mem["unified"] is False  # discrete: gpu.headroom leaves it to gpu.memory
    plan = gates["launch.memory-plan"]["facts"]
    # pool = reservation x GPU memory - headroom - weights - drafter - fit offset - activation x capacity, from the
    # coordinator playbook's [plan] constants (docs/MEMORY-PLAN.md), computed here, not read from a printout
    import tomllib

    c = tomllib.loads((REPO / "playbooks" / "coordinator.toml").read_text())["plan"]
    want = (0.97 * mem["total_bytes"] - c["runtime_headroom_bytes"] - c["weights_bytes"] - c["drafter_bytes"]
            - c["fit_offset_bytes"] - c["activation_bytes_per_capacity"] * 1024)
    assert abs(plan["pool_bytes"] - want) <= 1
    assert plan["pool_tokens"] == int(plan["pool_bytes"] // c["kv_bytes_per_token"])
    assert plan["full_contexts"] == plan["pool_tokens"] // c["max_context_tokens"] > 0
    assert plan["total_bytes"] == mem["total_bytes"] and plan["capacity"] == 1024 and plan["drafter"] is True
    link = gates["host.pcie"]["facts"]["links"][0]
    assert (link["bdf"], link["kind"], link["current_width"], link["current_speed_gts"]) == \
        ("0000:00:06.0", "gpu", link["max_width"], link["max_speed_gts"])
