"""The GPU load probe (afddiag.probes.load): PTX text, sizing, a simulated driver, and a real GPU."""

from __future__ import annotations

import ctypes
import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from afddiag.probes import cudadrv, load
from afddiag.probes.cudadrv import uuid_from_bytes


def _lib_loads(name: str) -> bool:
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


HAVE_LIBCUDA = _lib_loads("libcuda.so.1")
KINDS = ("fp32", "bf16", "gemv", "copy")


# --- PTX text, checked without a GPU -------------------------------------------------------------

ENTRY_RE = re.compile(r"\.visible\s+\.entry\s+(\w+)\s*\((.*?)\)\s*\{", re.S)
PARAM_RE = re.compile(r"\.param\s+\.(\w+)\s+(\w+)")
REG_DECL_RE = re.compile(r"\.reg\s+\.\w+\s+%(\w+?)<(\d+)>;")
REG_USE_RE = re.compile(r"%([a-z]+)(\d+)\b")
SPECIAL = {"tid", "ntid", "ctaid", "nctaid", "laneid", "warpid"}


def entries(ptx: str) -> dict[str, list[tuple[str, str]]]:
    """Entry name -> [(type, name)] of its parameters."""
    return {m.group(1): PARAM_RE.findall(m.group(2)) for m in ENTRY_RE.finditer(ptx)}


def kernel_bodies(ptx: str) -> dict[str, str]:
    out = {}
    for m in ENTRY_RE.finditer(ptx):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(ptx[i], 0)
            i += 1
        out[m.group(1)] = ptx[m.end() : i - 1]
    return out


def ptx_of(kind: str) -> str:
    return {"fp32": load.ptx_fp32, "bf16": load.ptx_mma, "gemv": load.ptx_gemv, "copy": load.ptx_copy}[kind]()


@pytest.mark.parametrize("kind", KINDS)
def test_ptx_header(kind):
    lines = ptx_of(kind).splitlines()
    directives = [ln for ln in lines if ln.startswith(".")]
    assert re.fullmatch(r"\.version \d+\.\d+", directives[0])
    assert re.fullmatch(r"\.target sm_\d+", directives[1])
    assert directives[2] == ".address_size 64"
    version = tuple(int(x) for x in directives[0].split()[1].split("."))
    target = int(directives[1].split("_")[1])
    if kind == "bf16":  # mma.m16n8k16 with .bf16: PTX ISA 7.0, sm_80
        assert version >= (7, 0) and target == 80
    else:  # shfl.sync needs PTX 6.0; these run on any GPU the driver still supports
        assert version >= (6, 0) and target <= 70


@pytest.mark.parametrize("kind", KINDS)
def test_ptx_entry_and_params_match_the_launcher(kind):
    ptx = ptx_of(kind)
    found = entries(ptx)
    assert list(found) == [load.ENTRY[kind]]
    params = found[load.ENTRY[kind]]
    assert tuple(t for t, _ in params) == load.PARAMS[kind]
    # every parameter is read, by its own name
    body = kernel_bodies(ptx)[load.ENTRY[kind]]
    for t, name in params:
        assert f"ld.param.{t} " in body and f"[{name}]" in body
    # the launcher's argument tuple has one value per parameter
    plan = load.plan_sizes(132, {k: 8 for k in KINDS}, 140 << 30)
    ptrs = {k: 0x7F0000000000 + i * (1 << 32) for i, k in enumerate(("a", "b", "out", "x", "y"))}
    assert len(load.launch_args(kind, plan, ptrs, 10)) == len(params)


def test_modules_hold_the_entries_the_probe_looks_up():
    mods = load.module_sources()
    for kind in KINDS:
        assert load.ENTRY[kind] in entries(mods[load.MODULE_OF[kind]])
    # one header a module
    for text in mods.values():
        assert sum(ln.startswith(".version") for ln in text.splitlines()) == 1
        assert sum(ln.startswith(".target") for ln in text.splitlines()) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_ptx_registers_declared_labels_defined_statements_terminated(kind):
    ptx = ptx_of(kind)
    body = kernel_bodies(ptx)[load.ENTRY[kind]]
    declared = {name: int(n) for name, n in REG_DECL_RE.findall(body)}
    for m in REG_USE_RE.finditer(body):
        name, idx = m.group(1), int(m.group(2))
        if name in SPECIAL:
            continue
        assert name in declared, f"%{name}{idx} used but no .reg %{name}<N>"
        assert idx < declared[name], f"%{name}{idx} beyond .reg %{name}<{declared[name]}>"
    labels = set(re.findall(r"^(\$\w+):", body, re.M))
    for target in re.findall(r"\bbra(?:\.uni)?\s+(\$\w+);", body):
        assert target in labels
    for line in body.splitlines():
        s = line.strip()
        if s and not s.startswith("//") and not s.endswith(":"):
            assert s.endswith(";"), s
    assert ptx.count("{") == ptx.count("}")


def test_mma_operands_have_the_m16n8k16_bf16_fragment_sizes():
    ptx = load.ptx_mma(chains=3, unroll=2)
    mmas = re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32\s+(.*);", ptx)
    assert len(mmas) == 6
    for ops in mmas:
        groups = re.findall(r"\{([^}]*)\}", ops)
        assert [len(g.split(",")) for g in groups] == [4, 4, 2, 4]  # D f32x4, A b32x4, B b32x2, C f32x4
        assert groups[0] == groups[3]  # accumulate in place
    assert len({g for ops in mmas for g in re.findall(r"\{(%d[^}]*)\}", ops)}) == 3  # independent chains


def test_fp32_loop_has_the_advertised_fma_count():
    ptx = load.ptx_fp32(chains=8, unroll=3)
    loop = ptx.split("$L_fp32_loop:")[1].split("$L_fp32_done:")[0]
    assert loop.count("fma.rn.f32") == 24
    assert len(set(re.findall(r"fma\.rn\.f32 (%acc\d+),", loop))) == 8


def test_gemv_unroll_must_be_a_power_of_two():
    with pytest.raises(ValueError):
        load.ptx_gemv(unroll=3)


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
@pytest.mark.parametrize("module,arch", [("base", "sm_75"), ("base", "sm_90"), ("mma", "sm_80"), ("mma", "sm_90")])
def test_ptxas_assembles_each_module(tmp_path, module, arch):
    src = tmp_path / f"{module}.ptx"
    src.write_text(load.module_sources()[module])
    r = subprocess.run(["ptxas", f"-arch={arch}", "-v", str(src), "-o", str(tmp_path / "out.cubin")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "spill" not in r.stderr or "0 bytes spill stores, 0 bytes spill loads" in r.stderr


# --- pure sizing ---------------------------------------------------------------------------------


def test_pick_iterations_scales_to_the_target():
    assert load.pick_iterations(100, 0.01, 0.1) == 1000
    assert load.pick_iterations(3, 0.3, 1.0) == 10  # floor, never over the target
    assert load.pick_iterations(7, 1.0, 1.0) == 7


@pytest.mark.parametrize(
    "args,kw,want",
    [
        ((100, 0.01, 0.0), {}, 1),  # no time left: the minimum
        ((100, 0.01, -1.0), {"min_iters": 5}, 5),
        ((100, 0.0, 1.0), {}, 1600),  # too fast to time: 16x, not a guess to infinity
        ((100, -0.5, 1.0), {"max_iters": 1000}, 1000),
        ((0, 0.01, 1.0), {"min_iters": 2}, 2),
        ((100, math.nan, 1.0), {}, 1),
        ((100, 0.01, math.inf), {}, 1),
        ((1, 1e-9, 10.0), {}, load.MAX_LOOP_ITERS),  # clamped to the u32 loop counter
        ((1, 1e-9, 10.0), {"max_iters": 4096}, 4096),
        ((1000, 1.0, 1e-6), {"min_iters": 3}, 3),  # rounds down to 0: the minimum
        ((1, 0.5, 1.0), {"min_iters": 2, "max_iters": 2}, 2),
    ],
)
def test_pick_iterations_boundaries(args, kw, want):
    assert load.pick_iterations(*args, **kw) == want


def test_pick_iterations_rejects_an_empty_range():
    with pytest.raises(ValueError):
        load.pick_iterations(1, 1.0, 1.0, min_iters=5, max_iters=4)


def test_split_budget():
    s = load.split_budget(2.0, {"a": 1.0, "b": 3.0})
    assert s == pytest.approx({"a": 0.5, "b": 1.5})
    assert load.split_budget(-1.0, {"a": 1.0}) == {"a": 0.0}
    assert load.split_budget(math.nan, {"a": 1.0}) == {"a": 0.0}
    assert load.split_budget(1.0, {"a": 0.0, "b": 0.0}) == {"a": 0.0, "b": 0.0}
    assert sum(load.split_budget(2.4, load.BUDGET_WEIGHTS).values()) == pytest.approx(2.4)


def test_plan_sizes_h200():
    plan = load.plan_sizes(132, {"fp32": 8, "bf16": 5, "gemv": 8, "copy": 8}, 140 << 30)
    assert isinstance(plan, load.Plan)
    round_bytes = 132 * 8 * load.BLOCK * 16 * load.COPY_UNROLL
    assert plan.buffer_bytes % round_bytes == 0
    assert plan.copy_rounds * round_bytes == plan.buffer_bytes
    assert load.MIN_BUFFER_BYTES <= plan.buffer_bytes <= load.MAX_BUFFER_BYTES
    assert plan.grids["fp32"] == 132 * 8 and plan.grids["bf16"] == 132 * 5 and plan.grids["copy"] == 132 * 8
    assert plan.gemv_rows % load.GEMV_ROWS_PER_BLOCK == 0
    assert plan.gemv_rows * plan.gemv_k * 2 <= plan.buffer_bytes
    assert plan.grids["gemv"] * load.GEMV_ROWS_PER_BLOCK == plan.gemv_rows
    assert plan.gemv_k % (256 * load.GEMV_UNROLL) == 0
    assert plan.out_bytes == 132 * 8 * load.BLOCK * 4
    assert plan.y_bytes == plan.gemv_rows * 4 and plan.x_bytes == plan.gemv_k * 2


def test_plan_sizes_takes_at_most_the_free_fraction():
    free = 3 << 30
    plan = load.plan_sizes(48, {"copy": 6}, free)
    assert isinstance(plan, load.Plan)
    assert 2 * plan.buffer_bytes <= free * load.FREE_FRACTION


@pytest.mark.parametrize("sm,free", [(132, 0), (132, 500 << 20), (0, 140 << 30), (-1, 1 << 40)])
def test_plan_sizes_says_why_nothing_fits(sm, free):
    why = load.plan_sizes(sm, {"copy": 8}, free)
    assert isinstance(why, str) and why


def test_plan_sizes_minimum_boundary():
    # exactly enough free memory for two minimum-size buffers of whole copy rounds
    round_bytes = 16 * 8 * load.BLOCK * 16 * load.COPY_UNROLL
    rounds = -(-load.MIN_BUFFER_BYTES // round_bytes)
    free = math.ceil(2 * rounds * round_bytes / load.FREE_FRACTION)
    assert isinstance(load.plan_sizes(16, {"copy": 8}, free), load.Plan)
    assert isinstance(load.plan_sizes(16, {"copy": 8}, free - round_bytes * 20), str)


def test_work_per_iteration():
    plan = load.plan_sizes(132, {k: 8 for k in KINDS}, 140 << 30)
    threads = 132 * 8 * load.BLOCK
    assert load.work_per_iteration("fp32", plan) == threads * load.FP32_CHAINS * load.FP32_UNROLL * 2
    assert load.work_per_iteration("bf16", plan) == threads // 32 * load.MMA_CHAINS * load.MMA_UNROLL * 4096
    assert load.work_per_iteration("copy", plan) == 2 * plan.buffer_bytes
    assert load.work_per_iteration("gemv", plan) == plan.gemv_rows * 8192 * 2 + 8192 * 2 + plan.gemv_rows * 4


def test_summarize_samples():
    samples = [
        {"phase": "setup", "clock_sm_mhz": 345, "power_mw": 70000, "utilization_pct": 0, "pstate": 8,
         "clocks_event_reasons": 1},
        {"phase": "copy", "clock_sm_mhz": 1980, "power_mw": 100000, "utilization_pct": 100, "pstate": 0,
         "clocks_event_reasons": 0},
        {"phase": "fp32", "clock_sm_mhz": 1980, "power_mw": 300000, "utilization_pct": 100, "pstate": 0,
         "clocks_event_reasons": 0},
        {"phase": "bf16", "clock_sm_mhz": 1700, "power_mw": 600000, "utilization_pct": 90, "pstate": 0,
         "clocks_event_reasons": 4},
        {"phase": "bf16", "clock_sm_mhz": None, "power_mw": 700000, "utilization_pct": 100, "pstate": 2,
         "clocks_event_reasons": None},
        {"phase": "cleanup", "clock_sm_mhz": 1980, "power_mw": 1, "utilization_pct": 0, "pstate": 0,
         "clocks_event_reasons": 1},
    ]
    s = load.summarize_samples(samples)
    assert s["clock_sm_mhz"] == 1980  # median of 1980, 1980, 1700
    assert s["power_mw"] == 650000  # later half of 100000, 300000, 600000, 700000
    assert s["utilization_pct"] == 100
    assert s["clocks_event_reasons"] == 4  # idle bit of setup/cleanup not counted
    assert s["pstate"] == 0
    assert s["samples_under_load"] == 4
    assert load.summarize_samples(samples, ("bf16",))["clock_sm_mhz"] == 1700
    empty = load.summarize_samples([{"phase": "setup", "clock_sm_mhz": 345}])
    assert empty["clock_sm_mhz"] is None and empty["clocks_event_reasons"] is None and empty["pstate"] is None


def test_summarize_power_is_the_later_half():
    rows = [{"phase": "fp32", "power_mw": p} for p in (100, 200, 300, 400, 500, 600)]
    assert load.summarize_samples(rows)["power_mw"] == 500  # median of 400, 500, 600
    assert load.summarize_samples(rows[:1])["power_mw"] == 100


# --- a simulated CUDA driver ---------------------------------------------------------------------


def _obj(arg):
    """The ctypes object behind byref(x) (fakes get what the probe passes, unconverted)."""
    return getattr(arg, "_obj", arg)


def _handle(h) -> int:
    return h.value if hasattr(h, "value") else h


class FakeCuda:
    """Enough of libcuda for the probe: handles, memory, and a GPU clock that launches advance.

    Each loop trip of a compute kernel costs ``us_per_trip`` microseconds; each memory-kernel launch
    ``ms_per_launch``. Launch checks: the function was looked up in a loaded module whose PTX has that
    entry, the argument array has one slot per ``.param``, and every u64 argument is a live allocation.
    """

    def __init__(self, *, sm=132, cc=(9, 0), free=140 << 30, jit_error=None, init_gate=None,
                 us_per_trip=1.0, ms_per_launch=0.5, fail_launch_of=None):
        self.sm, self.cc, self.free = sm, cc, free
        self.jit_error = jit_error
        self.init_gate = init_gate
        self.us_per_trip, self.ms_per_launch = us_per_trip, ms_per_launch
        self.fail_launch_of = fail_launch_of
        self.calls: Counter = Counter()
        self.next = 0x1000
        self.modules: dict[int, str] = {}
        self.funcs: dict[int, str] = {}
        self.mem: dict[int, int] = {}
        self.events: dict[int, float] = {}
        self.retained = 0
        self.clock_ms = 0.0
        self.launches: list[tuple[str, int, int, tuple]] = []
        self.errors: list[str] = []

    def _new(self) -> int:
        self.next += 0x1000
        return self.next

    def __getattr__(self, name):
        raise AttributeError(name)

    def cuGetErrorName(self, rc, pstr):
        _obj(pstr).value = {218: b"CUDA_ERROR_INVALID_PTX", 2: b"CUDA_ERROR_OUT_OF_MEMORY",
                            719: b"CUDA_ERROR_LAUNCH_FAILED"}.get(rc, b"CUDA_ERROR_UNKNOWN")
        return 0

    def cuInit(self, flags):
        self.calls["cuInit"] += 1
        if self.init_gate is not None:
            self.init_gate.wait(10)
        return 0

    def cuDeviceGetCount(self, p):
        _obj(p).value = 1
        return 0

    def cuDeviceGet(self, p, i):
        _obj(p).value = i
        return 0

    def cuDeviceGetName(self, buf, n, d):
        buf.value = b"Fake H200"
        return 0

    def cuDeviceGetUuid_v2(self, raw, d):
        raw[:] = list(range(16))
        return 0

    def cuDeviceGetAttribute(self, p, attr, d):
        _obj(p).value = {16: self.sm, 75: self.cc[0], 76: self.cc[1]}[attr]
        return 0

    def cuDevicePrimaryCtxRetain(self, p, d):
        self.retained += 1
        _obj(p).value = 0xC0
        return 0

    def cuDevicePrimaryCtxRelease_v2(self, d):
        self.retained -= 1
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.calls["cuCtxSetCurrent"] += 1
        return 0

    def cuCtxSynchronize(self):
        return 0

    def cuModuleLoadDataEx(self, pmod, image, n, opts, vals):
        ptx = ctypes.cast(image, ctypes.c_char_p).value.decode()
        assert list(opts[:n]) == [5, 6, 3, 4]
        if self.jit_error:
            msg = self.jit_error.encode()
            ctypes.memmove(vals[0], msg, len(msg) + 1)
            return 218
        h = self._new()
        self.modules[h] = ptx
        _obj(pmod).value = h
        return 0

    def cuModuleGetFunction(self, pfn, mod, name):
        ptx = self.modules[_handle(mod)]
        if name.decode() not in entries(ptx):
            return 500  # CUDA_ERROR_NOT_FOUND
        h = self._new()
        self.funcs[h] = (name.decode(), entries(ptx)[name.decode()])
        _obj(pfn).value = h
        return 0

    def cuModuleUnload(self, mod):
        del self.modules[_handle(mod)]
        return 0

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, p, fn, block, smem):
        _obj(p).value = 5 if self.funcs[_handle(fn)][0] == "afd_mma_bf16" else 8
        return 0

    def cuMemGetInfo_v2(self, pfree, ptotal):
        _obj(pfree).value, _obj(ptotal).value = self.free, 141 << 30
        return 0

    def cuMemAlloc_v2(self, p, size):
        if size > self.free:
            return 2
        h = self._new() << 32
        self.mem[h] = size
        _obj(p).value = h
        return 0

    def cuMemsetD8_v2(self, ptr, value, size):
        assert self.mem[ptr] == size
        return 0

    def cuMemFree_v2(self, ptr):
        del self.mem[ptr]
        return 0

    def cuEventCreate(self, p, flags):
        h = self._new()
        self.events[h] = 0.0
        _obj(p).value = h
        return 0

    def cuEventDestroy_v2(self, ev):
        del self.events[_handle(ev)]
        return 0

    def cuEventRecord(self, ev, stream):
        self.events[_handle(ev)] = self.clock_ms
        return 0

    def cuEventSynchronize(self, ev):
        return 0

    def cuEventElapsedTime_v2(self, pms, a, b):
        _obj(pms).value = self.events[_handle(b)] - self.events[_handle(a)]
        return 0

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        name, decl = self.funcs[_handle(fn)]
        if len(params) != len(decl):
            self.errors.append(f"{name}: {len(params)} args for {len(decl)} params")
            return 1
        args = []
        for (t, _), addr in zip(decl, params, strict=True):
            c = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32}[t]
            args.append(c.from_address(addr).value)
            if t == "u64" and args[-1] not in self.mem:
                self.errors.append(f"{name}: pointer {args[-1]:#x} not allocated")
                return 1
        if name == self.fail_launch_of:
            return 719
        self.launches.append((name, gx, bx, tuple(args)))
        if name in ("afd_fp32_fma", "afd_mma_bf16"):
            self.clock_ms += args[1] * self.us_per_trip / 1e3
        else:
            self.clock_ms += self.ms_per_launch
        return 0

    def assert_all_released(self):
        assert self.errors == []
        assert self.retained == 0
        assert self.modules == {}
        assert self.mem == {}
        assert self.events == {}


@pytest.fixture
def fake(monkeypatch):
    holder = {}

    def use(**kw):
        holder["lib"] = FakeCuda(**kw)
        monkeypatch.setattr(cudadrv, "load_libcuda", lambda: holder["lib"])
        return holder["lib"]

    return use


def test_simulated_gpu_gives_all_four_figures_and_releases_everything(fake):
    lib = fake()
    r = load.run_load_probe(0, budget_s=3.0)
    assert "why" not in r, r
    lib.assert_all_released()
    plan = load.plan_sizes(132, {"fp32": 8, "bf16": 5, "gemv": 8, "copy": 8}, 140 << 30)
    a = r["achieved"]
    # rates follow from the simulated costs: 1 us a loop trip, 0.5 ms a memory launch
    assert a["fp32_tflops"] == pytest.approx(load.work_per_iteration("fp32", plan) / 1e-6 / 1e12, rel=1e-3)
    assert a["bf16_tflops"] == pytest.approx(load.work_per_iteration("bf16", plan) / 1e-6 / 1e12, rel=1e-3)
    assert a["copy_gbps"] == pytest.approx(2 * plan.buffer_bytes / 0.5e-3 / 1e9, rel=1e-3)
    assert a["gemv_gbps"] == pytest.approx(plan.gemv_bytes / 0.5e-3 / 1e9, rel=1e-3)
    assert r["device"]["uuid"] == uuid_from_bytes(bytes(range(16)))
    assert r["device"]["sm_count"] == 132 and r["device"]["blocks_per_sm"]["bf16"] == 5
    assert r["kernels"]["copy"]["launches"] <= load.MAX_LAUNCHES
    assert r["kernels"]["fp32"]["loop_iters"] <= load.MAX_LOOP_ITERS
    names = [n for n, *_ in lib.launches]
    assert [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n] == [
        load.ENTRY[k] for k in load.KERNEL_ORDER
    ]
    for _name, _grid, block, _args in lib.launches:
        assert block == load.BLOCK
    assert set(r) >= {"clock_sm_mhz", "power_mw", "utilization_pct", "clocks_event_reasons", "pstate",
                      "achieved", "samples", "elapsed_s", "notes"}
    json.dumps(r)


def test_simulated_old_gpu_skips_bf16_with_a_reason(fake):
    lib = fake(cc=(7, 5))
    r = load.run_load_probe(0, budget_s=2.0)
    assert "why" not in r
    assert r["achieved"]["bf16_tflops"] is None and r["achieved"]["fp32_tflops"] > 0
    assert any("bf16: skipped" in n and "7.5" in n for n in r["notes"])
    assert len(lib.modules) == 0 and not any(n == "afd_mma_bf16" for n, *_ in lib.launches)
    lib.assert_all_released()


def test_ptx_jit_error_is_reported_in_words(fake):
    lib = fake(jit_error="ptxas fatal   : Unresolved extern function 'oops'")
    r = load.run_load_probe(0, budget_s=1.0)
    assert "CUDA_ERROR_INVALID_PTX" in r["why"] and "Unresolved extern function" in r["why"]
    assert "base" in r["why"]
    lib.assert_all_released()


def test_too_little_memory_says_so(fake):
    lib = fake(free=100 << 20)
    r = load.run_load_probe(0, budget_s=1.0)
    assert "too little free GPU memory" in r["why"]
    lib.assert_all_released()


def test_a_failing_kernel_keeps_the_other_figures(fake):
    lib = fake(fail_launch_of="afd_gemv_bf16")
    r = load.run_load_probe(0, budget_s=2.0)
    assert "why" not in r
    assert r["achieved"]["gemv_gbps"] is None and r["achieved"]["copy_gbps"] > 0
    assert any(n.startswith("gemv:") and "CUDA_ERROR_LAUNCH_FAILED" in n for n in r["notes"])
    lib.assert_all_released()


def test_missing_device_index(fake):
    fake()
    r = load.run_load_probe(3, budget_s=1.0)
    assert "no device 3" in r["why"]


def test_a_hung_driver_call_is_bounded(fake):
    gate = threading.Event()
    lib = fake(init_gate=gate)
    t = time.monotonic()
    r = load.run_load_probe(0, budget_s=0.2)
    took = time.monotonic() - t
    gate.set()
    assert took < 0.2 + load.JOIN_GRACE_S + 0.5
    assert "timed out" in r["why"] and "cuInit" in r["why"]
    assert r["elapsed_s"] <= 0.2 + load.JOIN_GRACE_S + 0.5
    assert lib.calls["cuInit"] == 1


@pytest.mark.parametrize("budget", [0, -1, float("nan"), "soon"])
def test_bad_budget_is_a_why_not_an_exception(budget):
    r = load.run_load_probe(0, budget_s=budget)
    assert "budget_s" in r["why"]


def test_libcuda_missing_is_a_why(monkeypatch):
    def missing():
        raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cudadrv, "load_libcuda", missing)
    r = load.run_load_probe()
    assert "libcuda.so.1" in r["why"]
    assert r["achieved"] == {"fp32_tflops": None, "bf16_tflops": None, "gemv_gbps": None, "copy_gbps": None}


# --- this host -----------------------------------------------------------------------------------


@pytest.mark.skipif(HAVE_LIBCUDA, reason="this host has libcuda.so.1")
def test_without_a_gpu_the_probe_names_libcuda_and_does_not_raise():
    r = load.run_load_probe()
    assert "libcuda" in r["why"]
    assert r["elapsed_s"] < 3.0


@pytest.mark.skipif(HAVE_LIBCUDA, reason="this host has libcuda.so.1")
def test_module_main_prints_json():
    p = subprocess.run([sys.executable, "-m", "afddiag.probes.load"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert "libcuda" in json.loads(p.stdout)["why"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_LIBCUDA, reason="no NVIDIA GPU: libcuda.so.1 not loadable on this host")
def test_real_gpu_load_probe():
    budget = 3.0
    r = load.run_load_probe(0, budget_s=budget)
    if r.get("why", "").startswith("CUDA: cuInit returned CUDA_ERROR_NO_DEVICE"):
        pytest.skip(f"libcuda present but no GPU: {r['why']}")
    assert "why" not in r, r["why"]
    a = r["achieved"]
    assert a["fp32_tflops"] > 0 and a["gemv_gbps"] > 0 and a["copy_gbps"] > 0
    cc = r["device"]["compute_capability"]
    if tuple(cc) >= (8, 0):
        assert a["bf16_tflops"] > 0
    assert r["elapsed_s"] <= budget + 1.0
    assert r["device"]["sm_count"] > 0
    if r["samples"]:
        assert any(s["phase"] in load.KERNEL_ORDER for s in r["samples"])
