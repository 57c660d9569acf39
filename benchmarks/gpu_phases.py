"""Where `afddiag gpu` (no load) spends its time, in one fresh process: per-phase wall times.

Usage (from the repository root; on an H200 host with only python3, click, rich, pynvml, psutil)::

    PYTHONPATH=$PWD python3 benchmarks/gpu_phases.py          # one JSON line on stdout

Phases (ms): ``interpreter`` (process start to this script's first line, from ``/proc/self/stat``
start time), ``import_cli`` (``import afddiag.cli``: click and afddiag's modules), ``read_gpu`` (the
GPU probe alone as `afddiag gpu` without an expected SM count runs it: NVML only, the kernel log
meanwhile; its own ``timings_ms`` split: ``nvml_ms``, ``xid_ms``), ``read_gpu_cuda`` (then the probe
again with the CUDA driver too, as a run with ``--expect-sm`` does: ``cuda_ms`` is ``cuInit`` and the
attributes; NVML is warm by then), ``cli_gpu_json`` (a second, warm
``afddiag gpu --json --no-history`` in the same process: gates, report, JSON; drivers already loaded,
so this is afddiag's own overhead), ``history_append`` (``record_run`` into a fresh SQLite store).
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import time

T_START = time.monotonic()


def _since_process_start_ms() -> float | None:
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return round((uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")) * 1e3, 1)
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    out: dict = {"interpreter_ms": _since_process_start_ms()}
    t = time.monotonic()
    import afddiag.cli as cli  # noqa: F401

    out["import_cli_ms"] = round((time.monotonic() - t) * 1e3, 1)
    from afddiag.probes.gpu import read_gpu

    t = time.monotonic()
    r = read_gpu(timeout_s=30, cuda=False, cuda_why="gpu_phases: as `afddiag gpu` without an expected SM count")
    out["read_gpu_ms"] = round((time.monotonic() - t) * 1e3, 1)
    out["read_gpu_parts_ms"] = r.get("timings_ms")
    t = time.monotonic()
    rc = read_gpu(timeout_s=30, cuda=True, cuda_why="gpu_phases: as a run with --expect-sm")
    out["read_gpu_cuda_ms"] = round((time.monotonic() - t) * 1e3, 1)
    out["read_gpu_cuda_parts_ms"] = rc.get("timings_ms")
    out["gpus"] = len(r.get("devices") or [])
    out["processes_listed"] = sum(len(d["nvml"]["processes"]) for d in r.get("devices") or []
                                  if isinstance(d.get("nvml"), dict) and isinstance(d["nvml"].get("processes"), list))
    out["xid_source"] = r.get("xid_source")
    buf, real = io.StringIO(), sys.stdout
    t = time.monotonic()
    sys.stdout = buf
    try:
        code = cli.run(["gpu", "--json", "--no-history"])
    finally:
        sys.stdout = real
    out["cli_gpu_json_warm_ms"] = round((time.monotonic() - t) * 1e3, 1)
    out["exit_code"] = code
    rep = json.loads(buf.getvalue())
    from afddiag.history import record_run

    with tempfile.TemporaryDirectory() as d:
        os.environ["AFDDIAG_STATE_DIR"] = d
        t = time.monotonic()
        record_run(rep, "gpu", enabled=True)
        out["history_append_ms"] = round((time.monotonic() - t) * 1e3, 1)
    out["total_ms"] = round((time.monotonic() - T_START) * 1e3, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
