"""Where the GPU probe's NVML time goes, call by call, and where a warm `afddiag gpu --json` spends the
rest (issue 16): one JSON document on stdout.

Usage (from the repository root, on a GPU host)::

    PYTHONPATH=$PWD python3 benchmarks/gpu_calls.py > calls.json

Fields: ``import_pynvml_ms``, ``nvml_init_ms`` (cold, this process), ``calls`` (every NVML call the
probe makes in one NVML-only ``read_gpu``, in order: ``{"call", "ms"}``, timed around
``afddiag.probes.gpu._nvml_call``), ``read_gpu_ms`` and its ``timings_ms``, ``xid`` (the kernel-log
read alone: ms and source), and ``profile_top`` (cProfile of a second, warm
``afddiag gpu --json --no-history`` in this process: the 30 functions with the most own time,
``{"fn", "calls", "own_ms", "cum_ms"}``; probes run in worker threads, so their time shows there as
a lock wait: ``probes_first_ms`` / ``probes_warm_ms`` give each probe's wall time in the first and the
profiled run).
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time


def main() -> None:
    out: dict = {}
    t = time.perf_counter()
    import pynvml  # noqa: F401

    out["import_pynvml_ms"] = round((time.perf_counter() - t) * 1e3, 2)
    t = time.perf_counter()
    try:
        pynvml.nvmlInit()
        out["nvml_init_ms"] = round((time.perf_counter() - t) * 1e3, 2)
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as e:
        out["nvml_init_ms"] = f"nvmlInit failed: {e}"

    import afddiag.cli as cli
    import afddiag.probes.gpu as g

    calls: list[dict] = []
    real = g._nvml_call

    def timed(run, nv, where, name, *args):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        try:
            return real(run, nv, where, name, *args)
        finally:
            calls.append({"call": name, "ms": round((time.perf_counter() - t0) * 1e3, 3)})

    g._nvml_call = timed
    t = time.perf_counter()
    r = g.read_gpu(timeout_s=30, cuda=False, cuda_why="gpu_calls")
    out["read_gpu_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    g._nvml_call = real
    out["timings_ms"] = r.get("timings_ms")
    out["calls"] = calls
    out["calls_total_ms"] = round(sum(c["ms"] for c in calls), 1)
    out["slowest_calls"] = sorted(calls, key=lambda c: -c["ms"])[:8]

    t = time.perf_counter()
    g.read_xid_events()
    out["xid_ms"] = round((time.perf_counter() - t) * 1e3, 1)

    import afddiag.collect as collect

    probes: list[dict] = []
    guarded = collect.guarded

    def timed_probe(fn, timeout_s, what, progress=None):  # noqa: ANN001, ANN202
        t0 = time.perf_counter()
        try:
            return guarded(fn, timeout_s, what, progress)
        finally:
            probes.append({"probe": what, "ms": round((time.perf_counter() - t0) * 1e3, 2)})

    collect.guarded = timed_probe
    buf, stdout = io.StringIO(), sys.stdout
    sys.stdout = buf
    try:
        cli.run(["gpu", "--json", "--no-history"])  # warm-up: imports done, drivers loaded
        buf.seek(0), buf.truncate()
        pr = cProfile.Profile()
        t = time.perf_counter()
        pr.enable()
        cli.run(["gpu", "--json", "--no-history"])
        pr.disable()
        out["warm_cli_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    finally:
        sys.stdout = stdout
        collect.guarded = guarded
    out["probes_warm_ms"] = probes[len(probes) // 2:]  # the profiled (second) run's probes
    out["probes_first_ms"] = probes[: len(probes) // 2]
    st = pstats.Stats(pr)
    rows = []
    for (fn_file, line, fn), (_cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append({"fn": f"{fn_file.rsplit('/', 2)[-1]}:{line}({fn})", "calls": nc,
                     "own_ms": round(tt * 1e3, 2), "cum_ms": round(ct * 1e3, 2)})
    out["profile_top"] = sorted(rows, key=lambda r: -r["own_ms"])[:30]
    out["profile_cum"] = sorted(rows, key=lambda r: -r["cum_ms"])[:30]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
