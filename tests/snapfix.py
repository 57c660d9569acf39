"""Snapshot fixtures built for a test: a shared case (or an H200 recording) copied into tmp_path and
changed the way a real incident changes the host. Never edits ../shared."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from conftest import CASES

FIXTURES = Path(__file__).parent / "fixtures" / "gpu"


def fabric_case(prefix: str) -> Path:
    """The shared fabric case whose folder name starts with ``prefix`` ("02-")."""
    return next(p for p in sorted((CASES / "fabric").iterdir()) if p.name.startswith(prefix))


def derive(src: Path, dst: Path, edits: dict[str, str | None] | None = None) -> Path:
    """Copy snapshot ``src`` to ``dst`` and apply ``edits`` (relative path → new text, None deletes)."""
    shutil.copytree(src, dst)
    for rel, text in (edits or {}).items():
        p = dst / rel
        if text is None:
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
    return dst


def link_down(dst: Path) -> Path:
    """Case 02 (spark-b, map set to rocep1s0f1 for 192.168.100.11) with the cable of that port pulled:
    port DOWN/Disabled, netdev down, no carrier; the GID table keeps its entries (mlx5 does)."""
    port = "sys/class/infiniband/rocep1s0f1/ports/1"
    return derive(fabric_case("02-"), dst, {f"{port}/state": "1: DOWN\n", f"{port}/phys_state": "3: Disabled\n",
                                             "sys/class/net/enp1s0f1np1/operstate": "down\n",
                                             "sys/class/net/enp1s0f1np1/carrier": "0\n"})


def h200_readings(recording: str = "h200-live-load") -> dict:
    """The gpu.json an H200 recording holds (idle readings, and under_load/expect for the load one)."""
    return json.loads((FIXTURES / recording / "gpu.json").read_text())


def gpu_snapshot(dst: Path, readings: dict, files: dict[str, str] | None = None) -> Path:
    """A GPU-only snapshot folder: ``gpu.json`` = ``readings`` plus extra ``files`` (name → text)."""
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "gpu.json").write_text(json.dumps(readings))
    for name, text in (files or {}).items():
        (dst / name).write_text(text)
    return dst


def busy_h200(fraction: float = 0.54, processes=None, idle_util=None) -> dict:
    """The H200 load recording as a competing job leaves it: every throughput figure at ``fraction``
    of the host's own baseline, the SM clock at max (time slicing, not a slow GPU), and NVML's idle
    read listing ``processes`` / ``idle_util`` %."""
    r = copy.deepcopy(h200_readings())
    d = r["devices"][0]
    ul = d["under_load"]
    ul["clock_sm_mhz"] = 1980
    ul["achieved"] = {k: round(v * fraction, 1) if isinstance(v, (int, float)) else v
                      for k, v in ul["achieved"].items()}
    d["nvml"]["processes"] = processes if processes is not None else []
    d["nvml"]["utilization_pct"] = idle_util if idle_util is not None else 0
    return r


def healthy_h200(fraction: float = 1.0, processes=None) -> dict:
    """An H200 reading whose load figures are the load probe's own reference figures for the model
    (afddiag.baseline.REFERENCE) times ``fraction``: what `baseline record` sees on a healthy idle GPU."""
    from afddiag.baseline import REFERENCE

    r = busy_h200(1.0, processes)
    ref = REFERENCE["NVIDIA H200"]
    r["devices"][0]["under_load"]["achieved"] = {k: round(ref[k] * fraction, 1) for k in
                                                 ("fp32_tflops", "bf16_tflops", "gemv_gbps", "copy_gbps")}
    r.pop("expect", None)
    return r
