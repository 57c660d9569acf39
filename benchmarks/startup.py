"""Start-up: `afddiag --version` against a bare interpreter, and `afddiag all --snapshot` to first output (issue 11).

    .venv/bin/python benchmarks/startup.py [--repeat N] [--out FILE]

Targets on the 2-core development machine: `afddiag --version` at most 3x the system `python3 -c pass` (the
interpreter the venv was made from, so the venv's own start-up cost counts against afddiag), and
`afddiag all --snapshot <case>` at most 150 ms to its first byte of output. Each figure is the
median of N cold processes (a new interpreter each time, as an operator runs it), taken
interleaved so that load from other work on the machine hits every figure alike; the minimum is
shown beside it. Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CASES = Path(os.environ.get("AFDDIAG_CASES", REPO.parent / "shared" / "cases"))
CASE = CASES / "fabric" / "02-spark-map-set-healthy"
VERSION_RATIO_MAX = 3.0
ALL_SNAPSHOT_MAX_S = 0.150


SYSTEM_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")  # the venv's base interpreter


def afddiag_cmd() -> list[str]:
    """The installed console script beside this interpreter, else ``python -m afddiag``."""
    exe = Path(sys.executable).with_name("afddiag")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "afddiag"]


def first_output_s(cmd: list[str]) -> float:
    """Seconds from spawning ``cmd`` to its first byte on stdout (the process is then waited for)."""
    env = dict(os.environ, NO_COLOR="1", AFDDIAG_STATE_DIR=os.environ.get("AFDDIAG_STATE_DIR", "/tmp/afddiag-bench"))
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    first = p.stdout.read(1)
    dt = time.perf_counter() - t
    p.stdout.read()
    p.wait()
    return dt if first or p.returncode == 0 else float("nan")


def exit_s(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, check=True)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    af = afddiag_cmd()
    runs: dict[str, list[float]] = {"python -c pass": [], "afddiag --version": [], "afddiag all --snapshot": []}
    for cmd in ([SYSTEM_PYTHON, "-c", "pass"], af + ["--version"],
                af + ["all", "--snapshot", str(CASE), "--no-history"]):
        first_output_s(cmd)  # warm the page cache and the bytecode caches
    for _ in range(args.repeat):
        runs["python -c pass"].append(exit_s([SYSTEM_PYTHON, "-c", "pass"]))
        runs["afddiag --version"].append(first_output_s(af + ["--version"]))
        runs["afddiag all --snapshot"].append(first_output_s(af + ["all", "--snapshot", str(CASE), "--no-history"]))
    med = {k: statistics.median(v) for k, v in runs.items()}
    low = {k: min(v) for k, v in runs.items()}
    ratio = med["afddiag --version"] / med["python -c pass"]
    ok_ver = ratio <= VERSION_RATIO_MAX
    ok_all = med["afddiag all --snapshot"] <= ALL_SNAPSHOT_MAX_S
    lines = [f"afddiag start-up, {args.repeat} cold runs each, {os.cpu_count()} CPUs ({' '.join(af)})",
             f"{'':<26} {'median':>8} {'min':>8}"]
    for k in runs:
        lines.append(f"{k:<26} {med[k] * 1000:7.1f}ms {low[k] * 1000:7.1f}ms")
    lines.append(f"--version / python -c pass: {ratio:.2f}x (target <= {VERSION_RATIO_MAX:g}x): "
                 + ("met" if ok_ver else "MISSED"))
    lines.append(f"all --snapshot to first output: {med['afddiag all --snapshot'] * 1000:.0f} ms (target <= "
                 f"{ALL_SNAPSHOT_MAX_S * 1000:.0f} ms): " + ("met" if ok_all else "MISSED"))
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0 if ok_ver and ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
