"""The load probe's pure planning: buffer sizes and grids for one GPU (:func:`plan_sizes`), each
kernel's arguments and work (:func:`launch_args`, :func:`work_per_iteration`), the iteration count
that fills a slice of the budget (:func:`pick_iterations`, :func:`split_budget`), and the
``under_load`` summary of NVML samples (:func:`summarize_samples`). No CUDA, no NVML.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from afddiag.probes.load_ptx import (
    BLOCK,
    COPY_UNROLL,
    FP32_CHAINS,
    FP32_UNROLL,
    GEMV_K,
    GEMV_ROWS_PER_BLOCK,
    MMA_CHAINS,
    MMA_FLOP,
    MMA_UNROLL,
)

# --- limits -------------------------------------------------------------------------------------

MAX_BUFFER_BYTES = 1 << 30  # each of the two large buffers
MIN_BUFFER_BYTES = 64 << 20  # below this a buffer sits in a large L2: no memory figure
FREE_FRACTION = 0.125  # both large buffers together, of cuMemGetInfo's free bytes
MAX_LAUNCHES = 4096  # memory kernels: launches in one timed run
MAX_LOOP_ITERS = (1 << 31) - 1  # compute kernels: u32 loop counter

# Order the kernels run in and the share of the budget each gets (memory first: the SM clock ramps up
# during their warm-up; compute last, so NVML's trailing power average ends on the compute load).
KERNEL_ORDER = ("copy", "gemv", "fp32", "bf16")
BUDGET_WEIGHTS = {"copy": 0.22, "gemv": 0.22, "fp32": 0.26, "bf16": 0.30}


# --- pure sizing ------------------------------------------------------------------------------


def pick_iterations(
    calib_iters: int,
    calib_s: float,
    target_s: float,
    *,
    min_iters: int = 1,
    max_iters: int = MAX_LOOP_ITERS,
) -> int:
    """Iterations that fill ``target_s`` at the rate ``calib_iters`` in ``calib_s`` showed.

    Clamped to ``[min_iters, max_iters]``. A target of 0 or less gives ``min_iters``; a calibration
    that took no measurable time (``calib_s <= 0``) gives 16 x ``calib_iters`` (clamped), a bounded
    step up rather than an unbounded guess; a non-finite input gives ``min_iters``.
    """
    if max_iters < min_iters:
        raise ValueError("max_iters < min_iters")
    if not all(math.isfinite(v) for v in (calib_s, target_s)) or calib_iters <= 0 or target_s <= 0:
        return min_iters
    if calib_s <= 0:
        return max(min_iters, min(max_iters, 16 * calib_iters))
    n = math.floor(calib_iters * target_s / calib_s)
    return max(min_iters, min(max_iters, n))


def split_budget(remaining_s: float, weights: dict[str, float]) -> dict[str, float]:
    """Share ``remaining_s`` (clamped at 0) among the kernels in proportion to ``weights``."""
    total = sum(w for w in weights.values() if w > 0)
    rem = max(0.0, remaining_s) if math.isfinite(remaining_s) else 0.0
    return {k: (rem * w / total if total > 0 and w > 0 else 0.0) for k, w in weights.items()}


@dataclass
class Plan:
    """Buffer sizes, grids and loop shapes for one GPU (see :func:`plan_sizes`)."""

    buffer_bytes: int  # each of the two large buffers (copy source/destination; A of the GEMV)
    copy_rounds: int
    gemv_rows: int
    gemv_k: int
    grids: dict[str, int]  # blocks per kernel (block size BLOCK)
    out_bytes: int  # per-thread outputs of fp32/bf16
    x_bytes: int
    y_bytes: int

    @property
    def copy_bytes(self) -> int:
        """Bytes one copy launch moves, read + write."""
        return 2 * self.buffer_bytes

    @property
    def gemv_bytes(self) -> int:
        """Bytes one GEMV launch reads (A, x) and writes (y)."""
        return self.gemv_rows * self.gemv_k * 2 + self.gemv_k * 2 + self.gemv_rows * 4


def plan_sizes(
    sm_count: int,
    blocks_per_sm: dict[str, int],
    free_bytes: int,
    *,
    max_buffer_bytes: int | None = None,
    min_buffer_bytes: int | None = None,
    free_fraction: float | None = None,
) -> Plan | str:
    """Sizes from the SM count, each kernel's resident blocks per SM, and the free memory.

    Returns a :class:`Plan`, or a string saying why nothing fits. Both large buffers together take
    at most ``free_fraction`` of ``free_bytes``; each is a whole number of copy rounds (no tail). The
    keyword limits default to ``MAX_BUFFER_BYTES``, ``MIN_BUFFER_BYTES`` and ``FREE_FRACTION``.
    """
    max_buffer_bytes = MAX_BUFFER_BYTES if max_buffer_bytes is None else max_buffer_bytes
    min_buffer_bytes = MIN_BUFFER_BYTES if min_buffer_bytes is None else min_buffer_bytes
    free_fraction = FREE_FRACTION if free_fraction is None else free_fraction
    if sm_count <= 0:
        return f"SM count {sm_count} is not positive"
    grids = {k: sm_count * max(1, int(blocks_per_sm.get(k) or 1)) for k in KERNEL_ORDER}
    round_bytes = grids["copy"] * BLOCK * 16 * COPY_UNROLL
    each = min(max_buffer_bytes, int(max(0, free_bytes) * free_fraction) // 2)
    rounds = each // round_bytes
    buf = rounds * round_bytes
    if rounds < 1 or buf < min_buffer_bytes:
        return (
            f"too little free GPU memory: {free_bytes} B free, {free_fraction:g} of it gives "
            f"{each} B a buffer, under the {max(min_buffer_bytes, round_bytes)} B needed"
        )
    k = GEMV_K
    rows = (buf // (k * 2)) // GEMV_ROWS_PER_BLOCK * GEMV_ROWS_PER_BLOCK
    grids["gemv"] = rows // GEMV_ROWS_PER_BLOCK
    out = max(grids["fp32"], grids["bf16"]) * BLOCK * 4
    return Plan(
        buffer_bytes=buf,
        copy_rounds=rounds,
        gemv_rows=rows,
        gemv_k=k,
        grids=grids,
        out_bytes=out,
        x_bytes=k * 2,
        y_bytes=rows * 4,
    )


def launch_args(kind: str, plan: Plan, ptrs: dict[str, int], iters: int = 1) -> tuple[int, ...]:
    """The kernel arguments, in the order of ``PARAMS[kind]`` (buffers by name in ``ptrs``)."""
    if kind == "fp32" or kind == "bf16":
        return (ptrs["out"], iters)
    if kind == "gemv":
        return (ptrs["a"], ptrs["x"], ptrs["y"], plan.gemv_k)
    if kind == "copy":
        return (ptrs["a"], ptrs["b"], plan.copy_rounds)
    raise ValueError(f"unknown kernel {kind!r}")


def work_per_iteration(kind: str, plan: Plan) -> float:
    """FLOP (fp32, bf16: per loop trip of the whole grid) or bytes (gemv, copy: per launch)."""
    threads = plan.grids[kind] * BLOCK
    if kind == "fp32":
        return threads * FP32_CHAINS * FP32_UNROLL * 2.0
    if kind == "bf16":
        return (threads // 32) * MMA_CHAINS * MMA_UNROLL * float(MMA_FLOP)
    if kind == "gemv":
        return float(plan.gemv_bytes)
    if kind == "copy":
        return float(plan.copy_bytes)
    raise ValueError(f"unknown kernel {kind!r}")


# --- summarising samples -----------------------------------------------------------------------


def _nums(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def _median(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def summarize_samples(samples: list[dict], phases: tuple[str, ...] = KERNEL_ORDER) -> dict[str, Any]:
    """``under_load`` readings from the NVML samples taken while a kernel in ``phases`` ran.

    Clock and utilization: medians. Power: median of the later half of the samples (NVML's power on
    Hopper is a trailing ~1 s average, so the early samples still carry the idle draw). Clocks event
    reasons: OR of the samples. P-state: the most common (the lowest number on a tie).
    """
    rows = [s for s in samples if s.get("phase") in phases]
    power = _nums(rows, "power_mw")
    reasons = None
    for r in rows:
        v = r.get("clocks_event_reasons")
        if isinstance(v, int) and not isinstance(v, bool):
            reasons = (reasons or 0) | v
    pstates = Counter(int(v) for v in _nums(rows, "pstate"))
    pstate = min(pstates, key=lambda p: (-pstates[p], p)) if pstates else None
    as_num = lambda v: (round(v, 1) if v is not None else None)  # noqa: E731
    return {
        "clock_sm_mhz": as_num(_median(_nums(rows, "clock_sm_mhz"))),
        "power_mw": as_num(_median(power[len(power) // 2 :])),
        "utilization_pct": as_num(_median(_nums(rows, "utilization_pct"))),
        "clocks_event_reasons": reasons,
        "pstate": pstate,
        "samples_under_load": len(rows),
    }
