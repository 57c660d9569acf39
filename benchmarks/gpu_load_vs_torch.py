"""The GPU load probe's four figures next to PyTorch's, on one GPU, in one run.

Usage (on a machine with an NVIDIA GPU, torch and pynvml; from the repository root)::

    PYTHONPATH=$PWD python3 benchmarks/gpu_load_vs_torch.py [--json PROBE.json] [--budget 3.0]
    PYTHONPATH=$PWD python3 benchmarks/gpu_load_vs_torch.py --sweep   # kernel variants, no torch

1. Runs ``python -m afddiag.probes.load 0 BUDGET`` in a fresh process first, before anything else
   touches the GPU (so its setup time is a cold start's), and keeps its JSON (``--json``).
2. Then, in this process, with torch on the same GPU:

   - FP32 peak = SMs x 128 FP32 lanes x 2 FLOP x the NVML maximum SM clock (66.9 TFLOP/s for an
     H200: 132 SMs at 1980 MHz);
   - ``torch.mm`` bf16 8192 x 8192 x 8192 on random data: 3 warm-ups, then 10 products timed with CUDA
     events (TFLOP/s = 2 N^3 x 10 / time);
   - ``Tensor.copy_`` device to device, at the probe's buffer size and at 4 GiB: 3 warm-ups, then
     timed; GB/s counts bytes read + written (10^9 B/GB); the reference is the faster of the two;
   - ``torch.mv`` bf16 on a matrix of the probe's GEMV shape (for reference; no goal).

3. Prints a table with ratios against the goals: FP32 >= 75 % of peak, BF16 >= 45 % of torch bf16,
   copy >= 85 % of torch copy, whole probe <= 3 s (its own ``elapsed_s``), PASS or MISS each.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOALS = {"fp32": 0.75, "bf16": 0.45, "copy": 0.85, "elapsed_s": 3.0}


def run_probe_subprocess(budget: float) -> tuple[dict, float]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-m", "afddiag.probes.load", "0", str(budget)],
        capture_output=True, text=True, env=env, timeout=120, cwd=REPO,
    )
    wall = time.monotonic() - t
    if p.returncode != 0:
        raise SystemExit(f"probe exited {p.returncode}: {p.stderr}")
    return json.loads(p.stdout), wall


def torch_references(probe: dict) -> dict:
    import torch

    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)
    ref: dict = {"torch": torch.__version__, "device": props.name, "sm_count": props.multi_processor_count}

    def timed(fn, iters: int) -> float:
        """Seconds per call of ``fn``, by CUDA events, after 3 warm-ups."""
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / iters

    n = 8192
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    z = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    s = timed(functools.partial(torch.mm, x, y, out=z), 10)
    ref["bf16_mm_tflops"] = 2 * n**3 / s / 1e12
    del x, y, z

    buf = int(probe.get("device", {}).get("buffer_bytes") or (1 << 30))
    copies = {}
    for size, iters in ((buf, 50), (4 << 30, 20)):
        src = torch.empty(size, device=dev, dtype=torch.uint8).fill_(1)
        dst = torch.empty_like(src)
        s = timed(functools.partial(dst.copy_, src), iters)
        copies[size] = 2 * size / s / 1e9
        del src, dst
    ref["copy_gbps_by_size"] = {str(k): round(v, 1) for k, v in copies.items()}
    ref["copy_gbps"] = max(copies.values())

    rows = buf // (8192 * 2) // 8 * 8
    a = torch.randn(rows, 8192, device=dev, dtype=torch.bfloat16)
    v = torch.randn(8192, device=dev, dtype=torch.bfloat16)
    s = timed(functools.partial(torch.mv, a, v), 50)
    ref["mv_gbps"] = (rows * 8192 * 2 + 8192 * 2 + rows * 2) / s / 1e9
    del a, v
    torch.cuda.empty_cache()
    return ref


def fmt(v, unit: str = "", nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}{unit}"


def report(probe: dict, wall: float, ref: dict) -> str:
    dev = probe.get("device", {})
    a = probe.get("achieved", {})
    sm = dev.get("sm_count") or ref.get("sm_count")
    max_mhz = dev.get("clock_sm_max_mhz")
    peak = sm * 128 * 2 * max_mhz * 1e6 / 1e12 if sm and max_mhz else None
    under = probe.get("clock_sm_mhz")
    rows = []

    def row(name, got, unit, refv, refname, goal, nd=1):
        ratio = got / refv if got is not None and refv else None
        if goal is None:
            verdict, goal_s = "-", "(none)"
        else:
            verdict = "PASS" if ratio is not None and ratio >= goal else "MISS"
            goal_s = f">= {goal:.0%}"
        rows.append((name, fmt(got, unit, nd), f"{fmt(refv, unit, nd)} {refname}",
                     f"{ratio:.1%}" if ratio is not None else "-", goal_s, verdict))

    row("FP32 FMA", a.get("fp32_tflops"), " TFLOP/s", peak, "(peak)", GOALS["fp32"])
    row("BF16 mma.sync", a.get("bf16_tflops"), " TFLOP/s", ref.get("bf16_mm_tflops"), "(torch.mm bf16 8192^3)",
        GOALS["bf16"])
    row("GEMV bf16", a.get("gemv_gbps"), " GB/s", ref.get("mv_gbps"), "(torch.mv bf16)", None)
    row("copy (r+w)", a.get("copy_gbps"), " GB/s", ref.get("copy_gbps"), "(torch copy_)", GOALS["copy"])
    el = probe.get("elapsed_s")
    rows.append(("whole probe", fmt(el, " s", 2), f"{GOALS['elapsed_s']:g} s budget", "-",
                 f"<= {GOALS['elapsed_s']:g} s", "PASS" if el is not None and el <= GOALS["elapsed_s"] else "MISS"))
    head = ("figure", "probe", "reference", "ratio", "goal", "result")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    out = [
        f"GPU: {dev.get('name')} ({dev.get('uuid')}), {sm} SMs, compute capability "
        f"{'.'.join(map(str, dev.get('compute_capability') or []))}, NVML max SM clock {max_mhz} MHz",
        f"torch {ref.get('torch')}; probe run first, in its own process (wall {wall:.2f} s with interpreter "
        f"start; probe elapsed_s {fmt(el, ' s', 3)}, of which setup {fmt(dev.get('setup_s'), ' s', 3)})",
        "",
        line(head),
        line(["-" * w for w in widths]),
        *[line(r) for r in rows],
        "",
        f"FP32 peak = {sm} SMs x 128 x 2 x {max_mhz} MHz = {fmt(peak, ' TFLOP/s')}"
        + (f"; at the median SM clock under load ({under:g} MHz): "
           f"{fmt(sm * 256 * under * 1e6 / 1e12, ' TFLOP/s')}" if under and sm else ""),
        f"torch copy_ by buffer size (B -> GB/s r+w): {ref.get('copy_gbps_by_size')}",
        "",
        "probe under load (NVML, samples while kernels ran): "
        f"SM clock {probe.get('clock_sm_mhz')} MHz, power {probe.get('power_mw')} mW (later-half median), "
        f"utilization {probe.get('utilization_pct')} %, P{probe.get('pstate')}, "
        f"clocks event reasons OR {probe.get('clocks_event_reasons')}",
    ]
    for k, ph in (probe.get("by_phase") or {}).items():
        kern = (probe.get("kernels") or {}).get(k, {})
        it = kern.get("loop_iters", kern.get("launches"))
        out.append(
            f"  {k:5s}: grid {kern.get('grid')} x {kern.get('block')}, "
            f"{'loop trips' if 'loop_iters' in kern else 'launches'} {it}, GPU {kern.get('gpu_ms')} ms, "
            f"wall {kern.get('wall_ms')} ms of a {kern.get('slice_ms')} ms slice; "
            f"{ph.get('samples_under_load')} samples: SM {ph.get('clock_sm_mhz')} MHz, "
            f"{ph.get('power_mw')} mW, util {ph.get('utilization_pct')} %, reasons {ph.get('clocks_event_reasons')}"
        )
    if probe.get("notes"):
        out.append("notes: " + " | ".join(probe["notes"]))
    if probe.get("why"):
        out.append(f"why: {probe['why']}")
    return "\n".join(out)


SWEEP = [
    {},
    {"COPY_UNROLL": 8, "MMA_CHAINS": 16, "MMA_UNROLL": 2, "GEMV_UNROLL": 8},
    {"COPY_UNROLL": 2, "MMA_CHAINS": 4, "MMA_UNROLL": 8, "GEMV_UNROLL": 2},
    {"COPY_LOAD": "", "COPY_STORE": ".cs", "MMA_CHAINS": 12, "MMA_UNROLL": 2},
    {"COPY_STORE": ".cs", "MAX_BUFFER_BYTES": 2 << 30, "FP32_CHAINS": 8, "FP32_UNROLL": 16},
]


def sweep(budget: float) -> None:
    """Run the probe in this process with each variant of the kernel constants; one line each."""
    from afddiag.probes import load, load_plan, load_ptx

    def put(k: str, v: object) -> None:
        """A constant lives in load_ptx (kernel shapes) or load_plan (limits); the modules that import it
        hold a copy of the name: set it in every one, so the PTX, the plan and the run agree."""
        for m in (load_ptx, load_plan, load):
            if k in vars(m):
                setattr(m, k, v)

    defaults = {k: getattr(load, k) for cfg in SWEEP for k in cfg}
    for cfg in SWEEP:
        for k, v in {**defaults, **cfg}.items():
            put(k, v)
        r = load.run_load_probe(0, budget)
        a = r["achieved"]
        print(
            f"{json.dumps(cfg) or '{}':90s} fp32 {a['fp32_tflops']} bf16 {a['bf16_tflops']} "
            f"gemv {a['gemv_gbps']} copy {a['copy_gbps']} elapsed {r['elapsed_s']} setup "
            f"{r['device'].get('setup_s')} occ {r['device'].get('blocks_per_sm')} clk {r['clock_sm_mhz']} "
            f"pwr {r['power_mw']} why {r.get('why')}",
            flush=True,
        )
    for k, v in defaults.items():
        put(k, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the probe's raw JSON here")
    ap.add_argument("--budget", type=float, default=3.0)
    ap.add_argument("--sweep", action="store_true", help="try kernel variants instead (no torch)")
    args = ap.parse_args()
    if args.sweep:
        sweep(args.budget)
        return
    probe, wall = run_probe_subprocess(args.budget)
    if args.json:
        Path(args.json).write_text(json.dumps(probe, indent=2) + "\n")
    ref = torch_references(probe)
    print(report(probe, wall, ref))


if __name__ == "__main__":
    main()
