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

The probe is three modules: :mod:`afddiag.probes.load_ptx` (the kernels as PTX text),
:mod:`afddiag.probes.load_plan` (sizes, iterations, the summary of samples; pure) and this one (the
run: CUDA driver and NVML). The public names of the other two are re-exported here.
"""

from __future__ import annotations

import ctypes
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from afddiag import collect
from afddiag.model.gpu import busy_evidence, gpu_facts_from_readings
from afddiag.probes import cudadrv, nvml
from afddiag.probes.cudadrv import (
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    CUDA_SUCCESS,
    LIBCUDA,
    Cuda,
    CudaError,
    uuid_from_bytes,
)
from afddiag.probes.gpu import gpu_readings
from afddiag.probes.gpu_nvml import read_busy
from afddiag.probes.load_plan import (
    BUDGET_WEIGHTS,
    FREE_FRACTION,
    KERNEL_ORDER,
    MAX_BUFFER_BYTES,
    MAX_LAUNCHES,
    MAX_LOOP_ITERS,
    MIN_BUFFER_BYTES,
    Plan,
    launch_args,
    pick_iterations,
    plan_sizes,
    split_budget,
    summarize_samples,
    work_per_iteration,
)
from afddiag.probes.load_ptx import (
    BLOCK,
    COPY_LOAD,
    COPY_STORE,
    COPY_UNROLL,
    ENTRY,
    FP32_CHAINS,
    FP32_UNROLL,
    GEMV_K,
    GEMV_ROWS_PER_BLOCK,
    GEMV_UNROLL,
    MMA_CHAINS,
    MMA_FLOP,
    MMA_MIN_CC,
    MMA_UNROLL,
    MODULE_OF,
    PARAMS,
    module_sources,
    ptx_copy,
    ptx_fp32,
    ptx_gemv,
    ptx_mma,
)
from afddiag.probes.registry import Artifact, Probe, Run, load_probe_runs
from afddiag.progress import steps

# --- timing and sampling ------------------------------------------------------------------------

SAMPLE_PERIOD_S = 0.1
JOIN_GRACE_S = 0.5  # the caller waits budget_s + this for the CUDA thread
CLEANUP_RESERVE_S = 0.3  # budget kept back for synchronise/free/unload/release
MIN_KERNEL_SLICE_S = 0.02  # below this a kernel still gets its calibration launch, nothing more
CALIBRATE_MIN_S = 0.002  # a calibration launch must last this long to be trusted

# CUjit_option (cuda.h)
CU_JIT_INFO_LOG_BUFFER = 3
CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4
CU_JIT_ERROR_LOG_BUFFER = 5
CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6
JIT_LOG_BYTES = 8192


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
        reasons_fn = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
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
        vals = [ctypes_of[t](a) for t, a in zip(types, args, strict=True)]
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


def _identify(cu: Cuda, st: _State, dev: Any) -> tuple[int, Any, tuple[Any, Any]] | None:
    """Initialise CUDA and read device ``st.device_index`` into ``st`` (name, UUID, SM count, compute
    capability; ``st.uuid_ready`` set whatever happens) → ``(handle, sm_count, (major, minor))``,
    None when there is no such device (``st.why`` says so). Raises CudaError."""
    try:
        cu("cuInit", 0)
        count = ctypes.c_int()
        cu("cuDeviceGetCount", ctypes.byref(count))
        if not 0 <= st.device_index < count.value:
            st.why = f"CUDA: no device {st.device_index} ({count.value} visible)"
            return None
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
        return d, sm, cc
    finally:
        st.uuid_ready.set()


def _load_kernels(cu: Cuda, st: _State, cc: tuple[Any, Any], modules: list[Any]) -> tuple[list[str], dict[str, Any]]:
    """The PTX modules loaded (appended to ``modules`` for the cleanup) → ``(kernels to run, their
    functions)``; bf16 only from compute capability 8.0. Each kernel's occupancy into ``st``. Raises CudaError."""
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
    return kinds, funcs


def _allocate(cu: Cuda, plan: Plan, ptrs: dict[str, int], events: list[Any]) -> _Timer:
    """The plan's buffers (filled; into ``ptrs`` for the cleanup) and two events → the timer. Raises CudaError."""
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
    return _Timer(cu, events[0], events[1])


def _measure_all(cu: Cuda, st: _State, kinds: list[str], funcs: dict[str, Any], timer: _Timer, plan: Plan,
                 ptrs: dict[str, int]) -> None:
    """Each kernel in its slice of what the budget leaves after setup; a kernel's CUDA error is a note."""
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


def _run_on_gpu(cu: Cuda, st: _State) -> None:
    ctx = _VP()
    dev = ctypes.c_int()
    retained = False
    modules: list[Any] = []
    ptrs: dict[str, int] = {}
    events: list[Any] = []
    try:
        found = _identify(cu, st, dev)
        if found is None:
            return
        d, sm, cc = found
        cu("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), d)
        retained = True
        cu("cuCtxSetCurrent", ctx)
        kinds, funcs = _load_kernels(cu, st, cc, modules)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        cu("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        st.device["memory_free_bytes"] = free.value
        plan = plan_sizes(sm, st.device["blocks_per_sm"], free.value)
        if isinstance(plan, str):
            st.why = plan
            return
        st.device["buffer_bytes"] = plan.buffer_bytes
        timer = _allocate(cu, plan, ptrs, events)
        cu("cuCtxSynchronize")
        _measure_all(cu, st, kinds, funcs, timer, plan, ptrs)
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


def _collect(out: dict[str, Any], st: _State) -> None:
    """What the CUDA worker and the NVML sampler recorded in ``st`` into the result ``out``."""
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
        _collect(out, st)
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

    Just before each device's probe, :func:`afddiag.probes.gpu_nvml.read_busy` samples its utilization
    and lists other compute processes (``under_load.busy_before``); right after, the processes again
    (``busy_after``). With ``skip_busy`` (the playbook turned the probe on; an explicit ``--load``
    forces it) a busy device is not loaded: ``under_load`` is ``{"why": "not run: GPU busy ...",
    "busy_before": ...}`` and gpu.slow-state says inconclusive."""

    devs = readings["devices"]
    by_uuid = {d.get("uuid"): d for d in devs}
    by_ordinal = {d.get("cuda_ordinal"): d for d in devs if isinstance(d.get("cuda_ordinal"), int)}
    with steps("GPU load probe", len(devs)) as bar:  # ~budget_s a GPU, one after the other
        for ordinal in range(len(devs)):
            bar.step(f"GPU {ordinal} {devs[ordinal].get('name') or ''}".rstrip())
            pre = by_ordinal.get(ordinal) or (devs[ordinal] if not by_ordinal else None)
            before = read_busy(pre.get("uuid"), pre.get("index"), 0.5) if pre is not None else None
            own_pid = (before or {}).get("own_pid")
            busy = busy_evidence((before or {}).get("processes"), (before or {}).get("utilization_pct"),
                                 {own_pid} if isinstance(own_pid, int) else set())
            if skip_busy and busy and pre is not None:
                pre["under_load"] = {"why": f"not run: GPU busy ({'; '.join(busy)}); "
                                            "`afddiag gpu --load` runs it anyway",
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


# --- the registry's entry: the figures laid on the GPU probe's readings -------------------------

#: What a capture keeps of the load probe: ``{"devices": [{"index", "uuid", "under_load"}], "load_failed"}``
#: (a bundle of an older afddiag kept ``under_load`` in the GPU probe's readings: it replays as it did).
LOAD_ARTIFACT = "gpu-load.json"


def _bound(run: Run) -> float:
    devices = (gpu_readings(run) or {}).get("devices")
    return run.inputs.timeout("load_s") * max(1, len(devices) if isinstance(devices, list) else 0) + 5.0


def _read(run: Run, progress: Any) -> dict[str, Any]:
    """Run the load probe on every GPU of the GPU probe's readings (:func:`attach_load`, bounded by the
    ``load_s`` timeout per GPU); a failure is recorded on every device (``why``) and as ``load_failed``."""
    raw = gpu_readings(run)
    if raw is None or not raw.get("devices"):
        return {LOAD_ARTIFACT: None}
    progress.doing = "running the GPU load probe"
    t = run.inputs.timeout("load_s") * len(raw["devices"])
    # the playbook's load probe stays off a GPU another job computes on; an explicit --load forces it
    _, failed = collect.guarded(lambda: attach_load(raw, run.inputs.load_budget_s, skip_busy=not run.inputs.load),
                                t, "GPU load probe")
    if failed:
        raw["load_failed"] = failed
        for d in raw["devices"]:
            if not isinstance(d.get("under_load"), dict):
                d["under_load"] = {"why": failed}
    record: dict[str, Any] = {"devices": [{"index": d.get("index"), "uuid": d.get("uuid"),
                                           "under_load": d.get("under_load")} for d in raw["devices"]]}
    if failed:
        record["load_failed"] = failed
    return {LOAD_ARTIFACT: record}


def lay(raw: dict[str, Any], record: dict[str, Any]) -> None:
    """Put the load probe's ``record`` (:data:`LOAD_ARTIFACT`'s shape) on the GPU readings ``raw``: each
    device's ``under_load`` on the device of the same UUID, else of the same index; ``load_failed``.
    Never raises on odd content (a snapshot may hold anything)."""
    devs = [d for d in raw.get("devices") or [] if isinstance(d, dict)] if isinstance(raw.get("devices"), list) else []
    by_uuid = {d["uuid"]: d for d in devs if isinstance(d.get("uuid"), str)}
    by_index = {d["index"]: d for d in devs if isinstance(d.get("index"), int)}
    found = record.get("devices")
    for rec in found if isinstance(found, list) else []:
        if not isinstance(rec, dict):
            continue
        uuid, index = rec.get("uuid"), rec.get("index")
        target = (by_uuid.get(uuid) if isinstance(uuid, str) else None) or \
            (by_index.get(index) if isinstance(index, int) else None)
        if target is not None:
            target["under_load"] = rec.get("under_load")
    if isinstance(record.get("load_failed"), str):
        raw["load_failed"] = record["load_failed"]


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    """The GPU facts again, from the GPU probe's readings with the load figures laid on (:func:`lay`);
    nothing when there is no record (not run, or an older bundle that keeps them in the GPU readings) or no
    GPU facts."""
    record, raw, gpu = r.get(LOAD_ARTIFACT), gpu_readings(run), run.obs.gpu
    if not isinstance(record, dict) or raw is None or gpu is None or gpu.failed or not gpu.available:
        return {}
    lay(raw, record)
    return {"gpu": gpu_facts_from_readings(raw)}


def _failed(why: str) -> dict[str, Any]:
    return {"notes": [f"GPU load probe: {why}"]}


PROBE = Probe("load", "GPU load probe", _bound, (Artifact(LOAD_ARTIFACT),), _read, _facts, _failed,
              wanted=load_probe_runs)


def main() -> None:
    """``python -m afddiag.probes.load [device_index] [budget_s]``: print :func:`run_load_probe` as JSON."""
    import sys

    idx = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    print(json.dumps(run_load_probe(idx, budget), indent=2))


__all__ = [  # this module's API and what it re-exports from load_ptx and load_plan
    "run_load_probe", "attach_load", "lay", "main", "PROBE", "LOAD_ARTIFACT",
    "CudaError", "SAMPLE_PERIOD_S", "JOIN_GRACE_S", "CLEANUP_RESERVE_S",
    "MIN_KERNEL_SLICE_S", "CALIBRATE_MIN_S", "JIT_LOG_BYTES", "CUDA_SUCCESS",
    "BLOCK", "COPY_LOAD", "COPY_STORE", "COPY_UNROLL", "ENTRY", "FP32_CHAINS", "FP32_UNROLL", "GEMV_K",
    "GEMV_ROWS_PER_BLOCK", "GEMV_UNROLL", "MMA_CHAINS", "MMA_FLOP", "MMA_MIN_CC", "MMA_UNROLL", "MODULE_OF", "PARAMS",
    "module_sources", "ptx_copy", "ptx_fp32", "ptx_gemv", "ptx_mma",
    "BUDGET_WEIGHTS", "FREE_FRACTION", "KERNEL_ORDER", "MAX_BUFFER_BYTES", "MAX_LAUNCHES", "MAX_LOOP_ITERS",
    "MIN_BUFFER_BYTES", "Plan", "launch_args", "pick_iterations", "plan_sizes", "split_budget", "summarize_samples",
    "work_per_iteration",
]


if __name__ == "__main__":
    main()
