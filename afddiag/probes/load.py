"""GPU load probe: four calibrated kernels, written as PTX text, run through the CUDA driver alone.

:func:`run_load_probe` puts a short, bounded load on one GPU and returns what it achieved and what NVML
read meanwhile, in the shape of a case's ``under_load`` object (``cases/README.md``). It needs no
PyTorch and no CUDA toolkit: the kernels below are PTX text that the driver JIT-compiles
(``cuModuleLoadDataEx``), driven through ctypes on ``libcuda.so.1``; NVML through ``pynvml``
(package ``nvidia-ml-py``), imported lazily.

The four figures:

- ``fp32_tflops``: ``afd_fp32_fma``, a register-resident loop of ``FP32_CHAINS`` independent
  ``fma.rn.f32`` chains per thread, unrolled ``FP32_UNROLL`` times; 2 FLOP per FMA. The peak it is
  measured against is SMs x 128 lanes x 2 x SM clock (66.9 TFLOP/s on an H200 at 1980 MHz).
- ``bf16_tflops``: ``afd_mma_bf16``, ``MMA_CHAINS`` independent accumulators per warp, each fed by
  ``mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`` (4096 FLOP per warp instruction). PTX
  ``.target sm_80``: skipped, with a note, on GPUs of compute capability below 8.0. This is the
  warp-level tensor-core path; Hopper's ``wgmma`` (what cuBLAS uses there) is faster.
- ``gemv_gbps``: ``afd_gemv_bf16``, y = A.x with A a bf16 matrix of ``GEMV_K`` columns filling one
  buffer, one warp per row, 16-byte loads; bytes read (A and x) plus written (y), 10^9 B/GB.
- ``copy_gbps``: ``afd_copy_v4``, a grid-stride device-to-device copy of one buffer into another with
  16-byte accesses, ``COPY_UNROLL`` loads in flight per thread; bytes read + bytes written.

Sizing: grids are SMs x the blocks per SM that ``cuOccupancyMaxActiveBlocksPerMultiprocessor``
allows (one full wave); the two buffers are at most ``MAX_BUFFER_BYTES`` each and together at most
``FREE_FRACTION`` of the free memory (plain ``cuMemAlloc``, never managed memory). Timing: CUDA events,
after a warm-up launch; a calibration launch sets the iteration count (:func:`pick_iterations`) that
fills each kernel's slice of the budget (:func:`split_budget`) left after setup.

While the kernels run, a thread samples NVML every ``SAMPLE_PERIOD_S`` (SM clock, power,
utilization, P-state, clocks event reasons). The CUDA work runs in a daemon thread: a driver call
that hangs is left behind in it, and the probe returns after ``budget_s`` + ``JOIN_GRACE_S``.

Run ``python -m afddiag.probes.load [device_index] [budget_s]`` to print the result as JSON.
"""

from __future__ import annotations

import ctypes
import json
import math
import statistics
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from afddiag.probes import cudadrv, nvml
from afddiag.probes.cudadrv import CUDA_SUCCESS, LIBCUDA, Cuda, CudaError
from afddiag.probes.gpu import (
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    uuid_from_bytes,
)

# --- tuning -----------------------------------------------------------------------------------

BLOCK = 256  # threads per block, every kernel
FP32_CHAINS = 16  # independent FMA accumulators per thread
FP32_UNROLL = 8  # FMAs per chain per loop trip
MMA_CHAINS = 8  # independent m16n8k16 accumulators per warp
MMA_UNROLL = 4  # mma.sync per chain per loop trip
COPY_UNROLL = 4  # 16-byte loads in flight per thread before its stores
COPY_LOAD = ".nc"  # ld.global qualifier of the copy's loads
COPY_STORE = ""  # st.global qualifier of the copy's stores (".cs": streaming)
GEMV_K = 8192  # columns of A (bf16): 16 KiB a row
GEMV_UNROLL = 4  # 16-byte loads of A in flight per lane
GEMV_ROWS_PER_BLOCK = BLOCK // 32  # one warp per row

MAX_BUFFER_BYTES = 1 << 30  # each of the two large buffers
MIN_BUFFER_BYTES = 64 << 20  # below this a buffer sits in a large L2: no memory figure
FREE_FRACTION = 0.125  # both large buffers together, of cuMemGetInfo's free bytes

SAMPLE_PERIOD_S = 0.1
JOIN_GRACE_S = 0.5  # the caller waits budget_s + this for the CUDA thread
CLEANUP_RESERVE_S = 0.3  # budget kept back for synchronise/free/unload/release
MIN_KERNEL_SLICE_S = 0.02  # below this a kernel still gets its calibration launch, nothing more
CALIBRATE_MIN_S = 0.002  # a calibration launch must last this long to be trusted
MAX_LAUNCHES = 4096  # memory kernels: launches in one timed run
MAX_LOOP_ITERS = (1 << 31) - 1  # compute kernels: u32 loop counter

# Order the kernels run in and the share of the budget each gets (memory first: the SM clock ramps up
# during their warm-up; compute last, so NVML's trailing power average ends on the compute load).
KERNEL_ORDER = ("copy", "gemv", "fp32", "bf16")
BUDGET_WEIGHTS = {"copy": 0.22, "gemv": 0.22, "fp32": 0.26, "bf16": 0.30}

# Entry names and their parameters, in order ("u64" device pointer or "u32").
ENTRY = {"fp32": "afd_fp32_fma", "bf16": "afd_mma_bf16", "gemv": "afd_gemv_bf16", "copy": "afd_copy_v4"}
PARAMS = {
    "fp32": ("u64", "u32"),  # out (one f32 a thread), loop trips
    "bf16": ("u64", "u32"),  # out (one f32 a thread), loop trips
    "gemv": ("u64", "u64", "u64", "u32"),  # A, x, y, K
    "copy": ("u64", "u64", "u32"),  # src, dst, rounds
}
MODULE_OF = {"fp32": "base", "gemv": "base", "copy": "base", "bf16": "mma"}
MMA_MIN_CC = (8, 0)
MMA_FLOP = 2 * 16 * 8 * 16  # one m16n8k16 per warp

# CUjit_option (cuda.h)
CU_JIT_WALL_TIME = 2
CU_JIT_INFO_LOG_BUFFER = 3
CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
JIT_LOG_BYTES = 8192


# --- PTX --------------------------------------------------------------------------------------


def _f32(x: float) -> str:
    """A PTX single-precision immediate (``0f3F800000`` = 1.0)."""
    return "0f%08X" % struct.unpack("<I", struct.pack("<f", x))[0]


def _header(version: str, target: str) -> list[str]:
    return [
        "// afddiag load probe kernels (generated by afddiag/probes/load.py)",
        f".version {version}",
        f".target {target}",
        ".address_size 64",
        "",
    ]


def _entry(kind: str) -> list[str]:
    name = ENTRY[kind]
    params = [f"\t.param .{t} {name}_param_{i}" for i, t in enumerate(PARAMS[kind])]
    return [f".visible .entry {name}(", ",\n".join(params), ")", "{"]


def _gtid() -> list[str]:
    """%r1..%r4 = tid, ctaid, ntid, global thread index."""
    return [
        "\tmov.u32 %r1, %tid.x;",
        "\tmov.u32 %r2, %ctaid.x;",
        "\tmov.u32 %r3, %ntid.x;",
        "\tmad.lo.u32 %r4, %r2, %r3, %r1;",
    ]


def _store_per_thread(src_f32: str) -> list[str]:
    """out[gtid] = src (out in %rd0, gtid in %r4): keeps the loop's result alive."""
    return [
        "\tcvta.to.global.u64 %rd1, %rd0;",
        "\tmul.wide.u32 %rd2, %r4, 4;",
        "\tadd.s64 %rd3, %rd1, %rd2;",
        f"\tst.global.f32 [%rd3], {src_f32};",
    ]


def _countdown_loop(counter: str, body: list[str], label: str) -> list[str]:
    """``while (counter--) body``, skipped when counter is 0."""
    return [
        f"\tsetp.eq.u32 %p0, {counter}, 0;",
        f"\t@%p0 bra {label}_done;",
        f"{label}_loop:",
        *body,
        f"\tsub.u32 {counter}, {counter}, 1;",
        f"\tsetp.ne.u32 %p0, {counter}, 0;",
        f"\t@%p0 bra {label}_loop;",
        f"{label}_done:",
    ]


def ptx_fp32(chains: int | None = None, unroll: int | None = None) -> str:
    """``afd_fp32_fma(out, iters)``: ``chains`` independent a = a*x + y chains per thread."""
    chains = chains or FP32_CHAINS
    unroll = unroll or FP32_UNROLL
    body = [
        f"\tfma.rn.f32 %acc{c}, %acc{c}, %f1, %f2;" for _ in range(unroll) for c in range(chains)
    ]
    lines = _header("6.0", "sm_52") + _entry("fp32") + [
        "\t.reg .pred %p<2>;",
        "\t.reg .b32 %r<8>;",
        "\t.reg .b64 %rd<4>;",
        "\t.reg .f32 %f<4>;",
        f"\t.reg .f32 %acc<{chains}>;",
        "",
        f"\tld.param.u64 %rd0, [{ENTRY['fp32']}_param_0];",
        f"\tld.param.u32 %r0, [{ENTRY['fp32']}_param_1];",
        *_gtid(),
        "\tcvt.rn.f32.u32 %f0, %r4;",
        f"\tmul.rn.f32 %f0, %f0, {_f32(2.0 ** -24)};",
        f"\tmov.f32 %f1, {_f32(0.999999)};",
        f"\tmov.f32 %f2, {_f32(0.001)};",
        *[f"\tadd.rn.f32 %acc{c}, %f0, {_f32(float(c + 1))};" for c in range(chains)],
        *_countdown_loop("%r0", body, "$L_fp32"),
        "\tmov.f32 %f3, %acc0;",
        *[f"\tadd.rn.f32 %f3, %f3, %acc{c};" for c in range(1, chains)],
        *_store_per_thread("%f3"),
        "\tret;",
        "}",
        "",
    ]
    return "\n".join(lines)


def ptx_mma(chains: int | None = None, unroll: int | None = None) -> str:
    """``afd_mma_bf16(out, iters)``: ``chains`` independent m16n8k16 bf16 accumulators per warp.

    Fragments of m16n8k16 .bf16 with .f32 accumulators (PTX ISA, "Matrix fragments for mma.m16n8k16"):
    A is four .b32 registers (two bf16 each), B two, C and D four .f32. The values do not matter to
    the rate; A and B are small bf16 numbers varied by thread so nothing is constant-folded.
    """
    chains = chains or MMA_CHAINS
    unroll = unroll or MMA_UNROLL
    body = []
    for _ in range(unroll):
        for c in range(chains):
            d = ", ".join(f"%d{4 * c + j}" for j in range(4))
            body.append(
                "\tmma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                f"{{{d}}}, {{%a0, %a1, %a2, %a3}}, {{%b0, %b1}}, {{{d}}};"
            )
    lines = _header("7.0", "sm_80") + _entry("bf16") + [
        "\t.reg .pred %p<2>;",
        "\t.reg .b32 %r<8>;",
        "\t.reg .b64 %rd<4>;",
        "\t.reg .b32 %a<4>;",
        "\t.reg .b32 %b<2>;",
        "\t.reg .f32 %f<2>;",
        f"\t.reg .f32 %d<{4 * chains}>;",
        "",
        f"\tld.param.u64 %rd0, [{ENTRY['bf16']}_param_0];",
        f"\tld.param.u32 %r0, [{ENTRY['bf16']}_param_1];",
        *_gtid(),
        "\tand.b32 %r5, %r4, 7;",  # 0..7, in the low mantissa bits of each bf16
        "\tshl.b32 %r6, %r5, 16;",
        "\tor.b32 %r7, %r5, %r6;",
        "\tor.b32 %a0, %r7, 0x3C003C00;",  # 2^-7 each
        "\tor.b32 %a1, %r7, 0x3C803C80;",
        "\tor.b32 %a2, %r7, 0x3D003D00;",
        "\tor.b32 %a3, %r7, 0x3D803D80;",
        "\tor.b32 %b0, %r7, 0x3F803F80;",  # 1.0 each
        "\tor.b32 %b1, %r7, 0x3F003F00;",
        *[f"\tmov.f32 %d{i}, 0f00000000;" for i in range(4 * chains)],
        *_countdown_loop("%r0", body, "$L_mma"),
        "\tmov.f32 %f0, %d0;",
        *[f"\tadd.rn.f32 %f0, %f0, %d{i};" for i in range(1, 4 * chains)],
        *_store_per_thread("%f0"),
        "\tret;",
        "}",
        "",
    ]
    return "\n".join(lines)


def ptx_copy(unroll: int | None = None, load: str | None = None, store: str | None = None) -> str:
    """``afd_copy_v4(src, dst, rounds)``: each round, every thread copies ``unroll`` 16-byte words.

    Word k of a round is at thread + k * (all threads): the warp's accesses are coalesced, and the
    buffers hold exactly rounds * threads * unroll words (the launcher sizes them so), no tail.
    """
    unroll = unroll or COPY_UNROLL
    load = COPY_LOAD if load is None else load
    store = COPY_STORE if store is None else store
    n = ENTRY["copy"]
    body: list[str] = []
    # source addresses %rd8.., destination %rd(8+unroll)..
    src = [f"%rd{8 + k}" for k in range(unroll)]
    dst = [f"%rd{8 + unroll + k}" for k in range(unroll)]
    body.append(f"\tmov.u64 {src[0]}, %rd0;")
    for k in range(1, unroll):
        body.append(f"\tadd.s64 {src[k]}, {src[k - 1]}, %rd3;")
    for k in range(unroll):
        v = ", ".join(f"%v{4 * k + j}" for j in range(4))
        body.append(f"\tld.global{load}.v4.u32 {{{v}}}, [{src[k]}];")
    body.append(f"\tmov.u64 {dst[0]}, %rd1;")
    for k in range(1, unroll):
        body.append(f"\tadd.s64 {dst[k]}, {dst[k - 1]}, %rd3;")
    for k in range(unroll):
        v = ", ".join(f"%v{4 * k + j}" for j in range(4))
        body.append(f"\tst.global{store}.v4.u32 [{dst[k]}], {{{v}}};")
    body += ["\tadd.s64 %rd0, %rd0, %rd4;", "\tadd.s64 %rd1, %rd1, %rd4;"]
    lines = _header("6.0", "sm_52") + _entry("copy") + [
        "\t.reg .pred %p<2>;",
        "\t.reg .b32 %r<8>;",
        f"\t.reg .b64 %rd<{8 + 2 * unroll}>;",
        f"\t.reg .b32 %v<{4 * unroll}>;",
        "",
        f"\tld.param.u64 %rd0, [{n}_param_0];",
        f"\tld.param.u64 %rd1, [{n}_param_1];",
        f"\tld.param.u32 %r0, [{n}_param_2];",
        "\tcvta.to.global.u64 %rd0, %rd0;",
        "\tcvta.to.global.u64 %rd1, %rd1;",
        *_gtid(),
        "\tmov.u32 %r5, %nctaid.x;",
        "\tmul.lo.u32 %r6, %r5, %r3;",  # threads in the grid
        "\tmul.wide.u32 %rd2, %r4, 16;",  # this thread's first byte
        "\tmul.wide.u32 %rd3, %r6, 16;",  # bytes between word k and k+1
        f"\tmul.lo.u64 %rd4, %rd3, {unroll};",  # bytes a round
        "\tadd.s64 %rd0, %rd0, %rd2;",
        "\tadd.s64 %rd1, %rd1, %rd2;",
        *_countdown_loop("%r0", body, "$L_copy"),
        "\tret;",
        "}",
        "",
    ]
    return "\n".join(lines)


def ptx_gemv(unroll: int | None = None) -> str:
    """``afd_gemv_bf16(A, x, y, K)``: y[row] = sum_k A[row, k] * x[k], bf16 in, f32 out.

    One warp a row (row = block * warps-per-block + warp); each lane loads 16 bytes (8 bf16) of A and
    of x at a time, ``unroll`` loads in flight, the warp stepping 512 bytes a load; a butterfly
    shuffle sums the lanes and lane 0 stores. K must be a multiple of 256 * ``unroll``.
    A bf16 becomes an f32 by shifting it into the high half of a 32-bit word.
    """
    unroll = unroll or GEMV_UNROLL
    n = ENTRY["gemv"]
    words = 4 * unroll
    body: list[str] = []
    for k in range(unroll):
        v = ", ".join(f"%va{4 * k + j}" for j in range(4))
        body.append(f"\tld.global.nc.v4.u32 {{{v}}}, [%rd10+{512 * k}];")
    for k in range(unroll):
        v = ", ".join(f"%vx{4 * k + j}" for j in range(4))
        body.append(f"\tld.global.nc.v4.u32 {{{v}}}, [%rd11+{512 * k}];")
    for w in range(words):
        acc = f"%acc{w % 4}"
        body += [
            f"\tshl.b32 %t0, %va{w}, 16;",
            f"\tand.b32 %t1, %va{w}, 0xFFFF0000;",
            f"\tshl.b32 %t2, %vx{w}, 16;",
            f"\tand.b32 %t3, %vx{w}, 0xFFFF0000;",
            "\tmov.b32 %fa0, %t0;",
            "\tmov.b32 %fa1, %t1;",
            "\tmov.b32 %fx0, %t2;",
            "\tmov.b32 %fx1, %t3;",
            f"\tfma.rn.f32 {acc}, %fa0, %fx0, {acc};",
            f"\tfma.rn.f32 {acc}, %fa1, %fx1, {acc};",
        ]
    body += [f"\tadd.s64 %rd10, %rd10, {512 * unroll};", f"\tadd.s64 %rd11, %rd11, {512 * unroll};"]
    shuffle: list[str] = []
    for off in (16, 8, 4, 2, 1):
        shuffle += [
            "\tmov.b32 %t0, %s0;",
            f"\tshfl.sync.bfly.b32 %t1, %t0, {off}, 31, 0xFFFFFFFF;",
            "\tmov.b32 %s1, %t1;",
            "\tadd.rn.f32 %s0, %s0, %s1;",
        ]
    lines = _header("6.0", "sm_52") + _entry("gemv") + [
        "\t.reg .pred %p<2>;",
        "\t.reg .b32 %r<12>;",
        "\t.reg .b64 %rd<16>;",
        f"\t.reg .b32 %va<{words}>;",
        f"\t.reg .b32 %vx<{words}>;",
        "\t.reg .b32 %t<4>;",
        "\t.reg .f32 %fa<2>;",
        "\t.reg .f32 %fx<2>;",
        "\t.reg .f32 %acc<4>;",
        "\t.reg .f32 %s<2>;",
        "",
        f"\tld.param.u64 %rd0, [{n}_param_0];",
        f"\tld.param.u64 %rd1, [{n}_param_1];",
        f"\tld.param.u64 %rd2, [{n}_param_2];",
        f"\tld.param.u32 %r0, [{n}_param_3];",
        "\tcvta.to.global.u64 %rd0, %rd0;",
        "\tcvta.to.global.u64 %rd1, %rd1;",
        "\tcvta.to.global.u64 %rd2, %rd2;",
        *_gtid(),
        "\tand.b32 %r5, %r1, 31;",  # lane
        "\tshr.u32 %r6, %r1, 5;",  # warp in block
        "\tshr.u32 %r7, %r3, 5;",  # warps a block
        "\tmad.lo.u32 %r8, %r2, %r7, %r6;",  # row
        "\tshl.b32 %r9, %r0, 1;",  # bytes a row
        "\tmul.wide.u32 %rd3, %r8, %r9;",
        "\tmul.wide.u32 %rd4, %r5, 16;",
        "\tadd.s64 %rd5, %rd0, %rd3;",
        "\tadd.s64 %rd10, %rd5, %rd4;",  # A[row, 8 * lane]
        "\tadd.s64 %rd11, %rd1, %rd4;",  # x[8 * lane]
        f"\tshr.u32 %r10, %r0, {8 + (unroll.bit_length() - 1)};",  # trips: K / (256 * unroll)
        *[f"\tmov.f32 %acc{i}, 0f00000000;" for i in range(4)],
        *_countdown_loop("%r10", body, "$L_gemv"),
        "\tadd.rn.f32 %acc0, %acc0, %acc1;",
        "\tadd.rn.f32 %acc2, %acc2, %acc3;",
        "\tadd.rn.f32 %s0, %acc0, %acc2;",
        *shuffle,
        "\tsetp.ne.u32 %p1, %r5, 0;",
        "\t@%p1 bra $L_gemv_end;",
        "\tmul.wide.u32 %rd6, %r8, 4;",
        "\tadd.s64 %rd7, %rd2, %rd6;",
        "\tst.global.f32 [%rd7], %s0;",
        "$L_gemv_end:",
        "\tret;",
        "}",
        "",
    ]
    if unroll & (unroll - 1):
        raise ValueError("GEMV unroll must be a power of two")
    return "\n".join(lines)


def module_sources() -> dict[str, str]:
    """PTX text of each module: ``base`` (fp32, gemv, copy; sm_52 and newer) and ``mma`` (sm_80)."""
    return {"base": "\n".join([ptx_fp32(), _body_only(ptx_gemv()), _body_only(ptx_copy())]), "mma": ptx_mma()}


def _body_only(ptx: str) -> str:
    """A kernel's PTX without its module header (to append it to another kernel's module)."""
    return "\n".join(l for l in ptx.splitlines() if not l.startswith((".version", ".target", ".address_size", "//")))


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


# --- CUDA driver through ctypes ----------------------------------------------------------------


_VP = ctypes.c_void_p


def _load_module(cu: Cuda, name: str, ptx: str) -> tuple[Any, str | None]:
    """``cuModuleLoadDataEx`` with error and info log buffers; (module, info log) or CudaError with the log."""
    err = ctypes.create_string_buffer(JIT_LOG_BYTES)
    info = ctypes.create_string_buffer(JIT_LOG_BYTES)
    opts = (ctypes.c_int * 4)(
        CU_JIT_ERROR_LOG_BUFFER,
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        CU_JIT_INFO_LOG_BUFFER,
        CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
    )
    vals = (_VP * 4)(
        ctypes.cast(err, _VP), _VP(JIT_LOG_BYTES), ctypes.cast(info, _VP), _VP(JIT_LOG_BYTES)
    )
    mod = _VP()
    image = ctypes.create_string_buffer(ptx.encode("ascii"))
    try:
        cu("cuModuleLoadDataEx", ctypes.byref(mod), ctypes.cast(image, ctypes.c_char_p), 4, opts, vals)
    except CudaError as e:
        log = err.value.decode("utf-8", "replace").strip()
        raise CudaError(f"PTX JIT of module {name!r} failed: {e}" + (f": {log}" if log else "")) from None
    text = info.value.decode("utf-8", "replace").strip()
    return mod, (text or None)


# --- the probe ---------------------------------------------------------------------------------


class _State:
    """What the CUDA thread, the NVML sampler and the caller share."""

    def __init__(self, device_index: int, budget_s: float) -> None:
        self.t0 = time.monotonic()
        self.device_index = device_index
        self.budget_s = budget_s
        self.lock = threading.Lock()
        self.in_call: str | None = None
        self.phase = "setup"
        self.notes: list[str] = []
        self.why: str | None = None
        self.device: dict[str, Any] = {"ordinal": device_index}
        self.kernels: dict[str, Any] = {}
        self.achieved: dict[str, float | None] = {
            "fp32_tflops": None,
            "bf16_tflops": None,
            "gemv_gbps": None,
            "copy_gbps": None,
        }
        self.samples: list[dict[str, Any]] = []
        self.uuid: str | None = None
        self.uuid_ready = threading.Event()  # set once the CUDA thread knows the UUID (or gave up)
        self.stop_sampling = threading.Event()
        self.released = False

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(text)


def _nvml_sampler(st: _State) -> None:
    """Sample NVML every SAMPLE_PERIOD_S until ``stop_sampling``, on the GPU the CUDA thread names."""
    try:
        nv = nvml.open_nvml()
    except nvml.NvmlUnavailable as e:
        st.note(f"NVML: {e}; no samples")
        return
    try:
        while not st.uuid_ready.wait(0.01):
            if st.stop_sampling.is_set():
                return
        handle = None
        if st.uuid:
            try:
                handle = nv.nvmlDeviceGetHandleByUUID(st.uuid)
            except Exception as e:  # noqa: BLE001
                st.note(f"NVML: no device with UUID {st.uuid} ({e}); sampling NVML index {st.device_index}")
        if handle is None:
            if st.uuid is None and st.why:
                return  # CUDA never reached the device: nothing runs, nothing to sample
            handle = nv.nvmlDeviceGetHandleByIndex(st.device_index)
        clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
        try:
            st.device["clock_sm_max_mhz"] = nv.nvmlDeviceGetMaxClockInfo(handle, clock_sm)
        except Exception as e:  # noqa: BLE001
            st.note(f"NVML: nvmlDeviceGetMaxClockInfo failed: {e}")
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nv, "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        reads: dict[str, Callable[[], Any]] = {
            "clock_sm_mhz": lambda: nv.nvmlDeviceGetClockInfo(handle, clock_sm),
            "power_mw": lambda: nv.nvmlDeviceGetPowerUsage(handle),
            "utilization_pct": lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu,
            "pstate": lambda: nv.nvmlDeviceGetPerformanceState(handle),
            "clocks_event_reasons": lambda: reasons_fn(handle),
        }
        failed: set[str] = set()
        while not st.stop_sampling.is_set():
            t = time.monotonic()
            s: dict[str, Any] = {"t_ms": round((t - st.t0) * 1e3, 1), "phase": st.phase}
            for key, fn in reads.items():
                try:
                    s[key] = fn()
                except Exception as e:  # noqa: BLE001
                    s[key] = None
                    if key not in failed:
                        failed.add(key)
                        st.note(f"NVML: reading {key} failed: {type(e).__name__}: {e}")
            with st.lock:
                st.samples.append(s)
            st.stop_sampling.wait(max(0.0, SAMPLE_PERIOD_S - (time.monotonic() - t)))
    except Exception as e:  # noqa: BLE001
        st.note(f"NVML sampler failed: {type(e).__name__}: {e}")
    finally:
        nvml.close_nvml(nv)


class _Timer:
    """Two CUDA events around a piece of GPU work."""

    def __init__(self, cu: Cuda, start: Any, end: Any) -> None:
        self.cu, self.start, self.end = cu, start, end
        self.elapsed_fn = cu.first("cuEventElapsedTime_v2", "cuEventElapsedTime")

    def time(self, work: Callable[[], None]) -> float:
        """Seconds of GPU time ``work``'s launches took."""
        self.cu("cuEventRecord", self.start, None)
        work()
        self.cu("cuEventRecord", self.end, None)
        self.cu("cuEventSynchronize", self.end)
        ms = ctypes.c_float()
        self.cu(self.elapsed_fn, ctypes.byref(ms), self.start, self.end)
        return ms.value / 1e3


def _launcher(cu: Cuda, fn: Any, kind: str, grid: int) -> Callable[[tuple[int, ...]], None]:
    types = PARAMS[kind]
    ctypes_of = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32}

    def launch(args: tuple[int, ...]) -> None:
        if len(args) != len(types):
            raise CudaError(f"{ENTRY[kind]}: {len(args)} arguments for {len(types)} parameters")
        vals = [ctypes_of[t](a) for t, a in zip(types, args)]
        params = (_VP * len(vals))(*[ctypes.addressof(v) for v in vals])
        cu("cuLaunchKernel", fn, grid, 1, 1, BLOCK, 1, 1, 0, None, params, None)

    return launch


def _measure(
    st: _State, kind: str, launch: Callable, timer: _Timer, plan: Plan, ptrs: dict[str, int], slice_s: float
) -> None:
    """Warm up, calibrate and time one kernel within ``slice_s``; record its figure."""
    compute = kind in ("fp32", "bf16")
    t_start = st.now_s()
    deadline = t_start + slice_s

    if compute:
        def work(n: int) -> Callable[[], None]:
            return lambda: launch(launch_args(kind, plan, ptrs, n))
    else:
        args = launch_args(kind, plan, ptrs)

        def work(n: int) -> Callable[[], None]:
            def go() -> None:
                for _ in range(n):
                    launch(args)
            return go

    st.phase = kind
    timer.time(work(8 if compute else 1))  # warm-up: lazy loading, clocks
    n = 64 if compute else 2
    t = timer.time(work(n))
    max_n = MAX_LOOP_ITERS if compute else MAX_LAUNCHES
    for _ in range(3):  # grow the calibration launch until it is long enough to trust
        if t >= CALIBRATE_MIN_S or n >= max_n or st.now_s() + 2 * CALIBRATE_MIN_S >= deadline:
            break
        n = pick_iterations(n, t, 2 * CALIBRATE_MIN_S, min_iters=n + 1, max_iters=max_n)
        t = timer.time(work(n))
    target = deadline - st.now_s()
    if target >= MIN_KERNEL_SLICE_S / 2:
        n2 = pick_iterations(n, t, target * 0.9, min_iters=1, max_iters=max_n)
        if n2 > n:
            n, t = n2, timer.time(work(n2))
    else:
        st.note(f"{kind}: budget slice too short ({slice_s * 1e3:.0f} ms); figure from the calibration launch")
    st.phase = "between"
    amount = work_per_iteration(kind, plan) * n
    rate = amount / t / 1e12 if compute else amount / t / 1e9
    key = {"fp32": "fp32_tflops", "bf16": "bf16_tflops", "gemv": "gemv_gbps", "copy": "copy_gbps"}[kind]
    st.achieved[key] = round(rate, 2 if compute else 1)
    st.kernels[kind] = {
        "entry": ENTRY[kind],
        "grid": plan.grids[kind],
        "block": BLOCK,
        ("loop_iters" if compute else "launches"): n,
        ("flop" if compute else "bytes"): amount,
        "gpu_ms": round(t * 1e3, 3),
        "wall_ms": round((st.now_s() - t_start) * 1e3, 1),
        "slice_ms": round(slice_s * 1e3, 1),
    }


def _cuda_worker(st: _State) -> None:
    """Everything on the GPU: set up, run the four kernels, release all in ``finally``."""
    try:
        st.in_call = f"dlopen {LIBCUDA}"
        try:
            lib = cudadrv.load_libcuda()
        except Exception as e:  # noqa: BLE001
            st.why = f"CUDA: {LIBCUDA} not loadable ({e})"
            return
        finally:
            st.in_call = None
        cu = Cuda(lib, st)
        _run_on_gpu(cu, st)
    except Exception as e:  # noqa: BLE001 - a bug here must not kill the caller
        if st.why is None:
            st.why = f"load probe failed: {type(e).__name__}: {e}"
    finally:
        st.phase = "done"
        st.uuid_ready.set()


def _run_on_gpu(cu: Cuda, st: _State) -> None:
    ctx = _VP()
    dev = ctypes.c_int()
    retained = False
    modules: list[Any] = []
    ptrs: dict[str, int] = {}
    events: list[Any] = []
    try:
        try:
            cu("cuInit", 0)
            count = ctypes.c_int()
            cu("cuDeviceGetCount", ctypes.byref(count))
            if not 0 <= st.device_index < count.value:
                st.why = f"CUDA: no device {st.device_index} ({count.value} visible)"
                return
            cu("cuDeviceGet", ctypes.byref(dev), st.device_index)
            d = dev.value
            name = ctypes.create_string_buffer(256)
            cu("cuDeviceGetName", name, 256, d)
            raw = (ctypes.c_ubyte * 16)()
            cu(cu.first("cuDeviceGetUuid_v2", "cuDeviceGetUuid"), raw, d)
            st.uuid = uuid_from_bytes(bytes(raw))
            sm = cu.attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d)
            cc = (cu.attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d),
                  cu.attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d))
            st.device.update(
                {"name": name.value.decode("utf-8", "replace"), "uuid": st.uuid, "sm_count": sm,
                 "compute_capability": list(cc)}
            )
        finally:
            st.uuid_ready.set()

        cu("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d)
        retained = True
        cu("cuCtxSetCurrent", ctx)

        sources = module_sources()
        mods: dict[str, Any] = {}
        mod, info = _load_module(cu, "base", sources["base"])
        modules.append(mod)
        mods["base"] = mod
        run_bf16 = cc >= MMA_MIN_CC
        if not run_bf16:
            st.note(f"bf16: skipped, mma.sync bf16 needs compute capability 8.0, this GPU is {cc[0]}.{cc[1]}")
        else:
            try:
                mod, _ = _load_module(cu, "mma", sources["mma"])
                modules.append(mod)
                mods["mma"] = mod
            except CudaError as e:
                run_bf16 = False
                st.note(f"bf16: skipped: {e}")
        kinds = [k for k in KERNEL_ORDER if k != "bf16" or run_bf16]

        funcs: dict[str, Any] = {}
        occupancy: dict[str, int] = {}
        for k in kinds:
            fn = _VP()
            cu("cuModuleGetFunction", ctypes.byref(fn), mods[MODULE_OF[k]], ENTRY[k].encode())
            funcs[k] = fn
            nb = ctypes.c_int()
            try:
                cu("cuOccupancyMaxActiveBlocksPerMultiprocessor", ctypes.byref(nb), fn, BLOCK, 0)
                occupancy[k] = max(1, nb.value)
            except CudaError as e:
                occupancy[k] = 4
                st.note(f"{k}: occupancy unknown ({e}); 4 blocks an SM")
        st.device["blocks_per_sm"] = occupancy

        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cu("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        st.device["memory_free_bytes"] = free.value
        plan = plan_sizes(sm, occupancy, free.value)
        if isinstance(plan, str):
            st.why = plan
            return
        st.device["buffer_bytes"] = plan.buffer_bytes
        for key, size, fill in (("a", plan.buffer_bytes, 0x3C), ("b", plan.buffer_bytes, 0),
                                ("out", plan.out_bytes, 0), ("x", plan.x_bytes, 0x3C),
                                ("y", plan.y_bytes, 0)):
            p = ctypes.c_uint64()
            try:
                cu("cuMemAlloc_v2", ctypes.byref(p), size)
            except CudaError as e:
                raise CudaError(f"allocating {size} B ({key}): {e}") from None
            ptrs[key] = p.value
            cu("cuMemsetD8_v2", p.value, fill, size)
        for _ in range(2):
            ev = _VP()
            cu("cuEventCreate", ctypes.byref(ev), 0)
            events.append(ev)
        timer = _Timer(cu, events[0], events[1])
        cu("cuCtxSynchronize")

        setup_s = st.now_s()
        st.device["setup_s"] = round(setup_s, 3)
        remaining = st.budget_s - setup_s - CLEANUP_RESERVE_S
        weights = {k: BUDGET_WEIGHTS[k] for k in kinds}
        if remaining < MIN_KERNEL_SLICE_S * len(kinds):
            st.note(f"setup took {setup_s:.2f} s of the {st.budget_s:g} s budget: each kernel gets only "
                    "its calibration launch")
        slices = split_budget(remaining, weights)
        failures: list[str] = []
        for k in kinds:
            launch = _launcher(cu, funcs[k], k, plan.grids[k])
            try:
                _measure(st, k, launch, timer, plan, ptrs, slices[k])
            except CudaError as e:
                st.phase = "between"
                failures.append(f"{k}: {e}")
                st.note(f"{k}: {e}")
        if failures and not any(v is not None for v in st.achieved.values()):
            st.why = f"no kernel ran: {failures[0]}"
    except CudaError as e:
        if st.why is None:
            st.why = f"CUDA: {e}"
    finally:
        st.phase = "cleanup"
        _release(cu, st, retained, dev, modules, ptrs, events)


def _release(cu: Cuda, st: _State, retained: bool, dev: Any, modules: list, ptrs: dict, events: list) -> None:
    """Free, unload and release what was created, in reverse; every failure becomes a note."""
    def quiet(name: str, *args: Any) -> None:
        try:
            cu(name, *args)
        except Exception as e:  # noqa: BLE001
            st.note(f"cleanup: {e}")

    if retained:
        quiet("cuCtxSynchronize")
    for ev in events:
        quiet("cuEventDestroy_v2", ev)
    for key in reversed(list(ptrs)):
        quiet("cuMemFree_v2", ptrs[key])
    for mod in reversed(modules):
        quiet("cuModuleUnload", mod)
    if retained:
        quiet("cuCtxSetCurrent", None)
        try:
            quiet(cu.first("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), dev.value)
        except CudaError as e:
            st.note(f"cleanup: {e}")
    st.released = True


def run_load_probe(device_index: int = 0, budget_s: float = 3.0) -> dict:
    """Load CUDA device ``device_index`` for about ``budget_s`` seconds; what it achieved and NVML read.

    Returns a dict in the shape of a case's ``under_load`` object:

    - ``clock_sm_mhz``, ``utilization_pct``: medians of the NVML samples taken while a kernel ran
      (``nvmlDeviceGetClockInfo`` SM, ``nvmlDeviceGetUtilizationRates().gpu``).
    - ``power_mw``: median of the later half of those samples (``nvmlDeviceGetPowerUsage``, a ~1 s
      trailing average on Hopper).
    - ``clocks_event_reasons``: OR of those samples' ``nvmlDeviceGetCurrentClocksEventReasons``.
    - ``pstate``: the most common ``nvmlDeviceGetPerformanceState`` among them.
    - ``achieved``: ``fp32_tflops``, ``bf16_tflops`` (None where skipped), ``gemv_gbps``,
      ``copy_gbps`` (read + write), 10^12 FLOP/s and 10^9 B/s.
    - ``samples``: every NVML sample (``t_ms`` since the start, ``phase``: the kernel running, or
      ``setup``/``between``/``cleanup``/``done``).
    - ``by_phase``: the same summary for each kernel's samples alone.
    - ``kernels``: per kernel, grid, block, iterations or launches, work, GPU ms and wall ms.
    - ``device``: CUDA ordinal, name, UUID, SM count, compute capability, NVML max SM clock, blocks
      per SM, free memory, buffer size, setup seconds.
    - ``elapsed_s``, ``notes`` (list of str), and ``why`` (str) only when nothing could be measured
      (no libcuda, no such device, PTX JIT error text, out of memory, a hung driver call...).

    Never raises. Every module, buffer, event and the primary-context retain is released before the
    CUDA thread ends; a driver call that hangs is left behind in that daemon thread.
    """
    out: dict[str, Any] = {
        "clock_sm_mhz": None,
        "power_mw": None,
        "utilization_pct": None,
        "clocks_event_reasons": None,
        "pstate": None,
        "achieved": {"fp32_tflops": None, "bf16_tflops": None, "gemv_gbps": None, "copy_gbps": None},
        "samples": [],
        "by_phase": {},
        "kernels": {},
        "device": {"ordinal": device_index},
        "elapsed_s": None,
        "notes": [],
    }
    t0 = time.monotonic()
    try:
        try:
            budget = float(budget_s)
        except (TypeError, ValueError):
            budget = math.nan
        if not math.isfinite(budget) or budget <= 0:
            raise ValueError(f"budget_s must be a positive number of seconds, not {budget_s!r}")
        st = _State(int(device_index), budget)
        st.t0 = t0
        worker = threading.Thread(target=_cuda_worker, args=(st,), name="afddiag-load-cuda", daemon=True)
        sampler = threading.Thread(target=_nvml_sampler, args=(st,), name="afddiag-load-nvml", daemon=True)
        sampler.start()
        worker.start()
        worker.join(max(0.0, budget - (time.monotonic() - t0)) + JOIN_GRACE_S)
        hung = worker.is_alive()
        in_call = st.in_call
        st.stop_sampling.set()
        st.uuid_ready.set()
        sampler.join(0.3)
        with st.lock:
            samples = [dict(s) for s in st.samples]
            notes = list(st.notes)
        out.update(summarize_samples(samples))
        out.pop("samples_under_load", None)
        out["achieved"] = dict(st.achieved)
        out["samples"] = samples
        out["by_phase"] = {k: summarize_samples(samples, (k,)) for k in KERNEL_ORDER if k in st.kernels}
        out["kernels"] = dict(st.kernels)
        out["device"] = dict(st.device)
        out["notes"] = notes
        if samples and not any(s.get("phase") in KERNEL_ORDER for s in samples) and st.kernels:
            out["notes"].append("NVML: no sample fell while a kernel ran (the kernels were too short)")
        if hung:
            out["why"] = (f"load probe timed out after {budget:g} s + {JOIN_GRACE_S:g} s "
                          f"(driver call in flight: {in_call or 'unknown'}; left behind in a daemon thread)")
        elif st.why:
            out["why"] = st.why
        if sampler.is_alive():
            out["notes"].append("NVML sampler still running at return (an NVML call hung)")
    except Exception as e:  # noqa: BLE001 - the probe never raises
        out["notes"].append(f"load probe failed: {type(e).__name__}: {e}")
        out["why"] = str(e) if isinstance(e, ValueError) else f"load probe failed: {type(e).__name__}: {e}"
    out["elapsed_s"] = round(time.monotonic() - t0, 3)
    return out


def attach_load(readings: dict[str, Any], budget_s: float, skip_busy: bool = False) -> None:
    """Run the load probe on every CUDA device and attach each result to the NVML device with the
    same UUID as its ``under_load`` (a failed probe leaves ``{"why": ...}``).

    Just before each device's probe, :func:`afddiag.probes.gpu.read_busy` samples its utilization
    and lists other compute processes (``under_load.busy_before``); right after, the processes again
    (``busy_after``). With ``skip_busy`` (the playbook turned the probe on; an explicit ``--load``
    forces it) a busy device is not loaded: ``under_load`` is ``{"why": "not run: GPU busy ...",
    "busy_before": ...}`` and gpu.slow-state says inconclusive."""
    from afddiag.model.gpu import busy_evidence
    from afddiag.probes.gpu import read_busy
    from afddiag.progress import steps

    devs = readings["devices"]
    by_uuid = {d.get("uuid"): d for d in devs}
    by_ordinal = {d.get("cuda_ordinal"): d for d in devs if isinstance(d.get("cuda_ordinal"), int)}
    with steps("GPU load probe", len(devs)) as bar:  # ~budget_s a GPU, one after the other
        for ordinal in range(len(devs)):
            bar.step(f"GPU {ordinal} {devs[ordinal].get('name') or ''}".rstrip())
            pre = by_ordinal.get(ordinal) or (devs[ordinal] if not by_ordinal else None)
            before = read_busy(pre.get("uuid"), pre.get("index"), 0.5) if pre is not None else None
            busy = busy_evidence((before or {}).get("processes"), (before or {}).get("utilization_pct"),
                                 {(before or {}).get("own_pid")})
            if skip_busy and busy and pre is not None:
                pre["under_load"] = {"why": f"not run: GPU busy ({'; '.join(busy)}); `afddiag gpu --load` runs it anyway",
                                     "busy_before": before}
                continue
            ul = run_load_probe(ordinal, budget_s)
            uuid = (ul.get("device") or {}).get("uuid")
            target = by_uuid.get(uuid) or pre or (devs[ordinal] if ordinal < len(devs) else None)
            if target is not None:
                if before is not None:
                    ul["busy_before"] = before
                    ul["busy_after"] = read_busy(target.get("uuid"), target.get("index"), 0.0)
                target["under_load"] = ul


def main() -> None:
    """``python -m afddiag.probes.load [device_index] [budget_s]``: print :func:`run_load_probe` as JSON."""
    import sys

    idx = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    print(json.dumps(run_load_probe(idx, budget), indent=2))


if __name__ == "__main__":
    main()
