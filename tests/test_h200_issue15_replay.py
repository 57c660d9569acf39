"""Replay of the issue-15 readings recorded on a real H200 (tests/fixtures/gpu/h200-issue15: copies of
benchmarks/results/h200-2026-12-01/issue15-*, made by benchmarks/h200/issue15.sh).

The folder goes through the path every replay takes (the registry's artifacts → facts, the runner, the
gates), as the coordinator with the launch env the live run had. What the H200 run printed
(summary.txt) is the reference: the verdicts of fabric.mem-registration, gpu.memory, gpu.headroom,
host.pcie and launch.memory-plan, every figure with its unit in their summaries, and the readings it
listed (CUDA attributes, the dma-buf export, the driver flavour, meminfo, NVML free memory).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from afddiag.cli import diagnose_full, make_inputs
from conftest import REPO

FIX = Path(__file__).resolve().parent / "fixtures" / "gpu" / "h200-issue15"
ORIG = REPO / "benchmarks" / "results" / "h200-2026-12-01"
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


def test_fixtures_are_the_recorded_files():
    for fix, orig in (("gpu.json", "issue15-gpu.json"), ("memreg.json", "issue15-memreg.json"),
                      ("pcie.json", "issue15-pcie.json"), ("summary.txt", "issue15-summary.txt")):
        assert (FIX / fix).read_bytes() == (ORIG / orig).read_bytes(), fix


def test_summary_lists_every_gate_compared():
    verdicts, _ = _printed()
    assert set(verdicts) == set(GATES)


@pytest.mark.parametrize("gid", GATES)
def test_verdict_and_figures_as_the_h200_printed(replay, gid):
    rep, _, gates = replay
    want_verdict, want_summary = _printed()[0][gid]
    g = gates[gid]
    assert g["verdict"] == want_verdict, (gid, g["summary"])
    # every figure with its unit (and each count) the H200 printed is in the replay's summary
    figures = re.findall(r"\d[\d,.]*\s?(?:GiB|GT/s|M tokens|%|full)|x\d+|\b\d+ SMs|\d+ link", want_summary)
    assert figures or want_verdict == "SKIP", want_summary
    if want_verdict == "SKIP":  # no figure: the reason is the claim
        assert g["summary"] == want_summary
    for f in figures:
        assert f in g["summary"], (gid, f, g["summary"])


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
    pool = re.search(r"KV pool ([\d.]+) GiB = ([\d.]+) M tokens = (\d+) full", _printed()[0]["launch.memory-plan"][1])
    assert (f"{plan['pool_bytes'] / GIB:.2f}", f"{plan['pool_tokens'] / 1e6:.2f}", str(plan["full_contexts"])) == \
        pool.groups()
    assert plan["total_bytes"] == mem["total_bytes"] and plan["capacity"] == 1024 and plan["drafter"] is True
    link = gates["host.pcie"]["facts"]["links"][0]
    assert (link["bdf"], link["kind"], link["current_width"], link["current_speed_gts"]) == \
        ("0000:00:06.0", "gpu", link["max_width"], link["max_speed_gts"])
