#!/usr/bin/env python3
"""Issue 13's figures: hostile-input tries, tracebacks, hangs, files written outside, fuzz
executions, the worst bounded wall time with every probe hung, peak RSS on a 10k-device snapshot.

    .venv/bin/python benchmarks/hostile_bench.py [--fuzz-seconds 180] [--devices 10000] [--out FILE]

1. Fuzz (``tests/fuzz/run_fuzz.py``, every target) in a fresh working directory with a fresh
   TMPDIR: executions, findings (tracebacks, exit codes, non-one-line usage errors) and hangs (one
   execution over 30 s); then whatever is left in that TMPDIR, that working directory, or /dev/shm
   (``afddiag-*``) is "written outside".
2. Every probe hung: ``afddiag all --json --timeout T`` as a subprocess with a pynvml whose
   ``nvmlInit`` never returns and ``ip``, ``rdma``, ``docker``, ``podman``, ``dpkg-query`` that
   hang (each starting a grandchild); wall time, exit code, and whether any grandchild outlived it.
3. A snapshot of ``--devices`` HCAs (benchmarks/snapgen.py, 4 GID slots) judged by ``afddiag
   fabric --json`` in a subprocess: wall time and peak RSS (``ru_maxrss`` of the child).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

HUNG_NVML = "import threading\nNVML_ERROR_NOT_SUPPORTED = 3\nclass NVMLError(Exception):\n    pass\n" \
            "def nvmlInit(*a, **k):\n    threading.Event().wait()\nnvmlInit_v2 = nvmlInit\n" \
            "def nvmlShutdown():\n    threading.Event().wait()\n"


def fuzz(seconds: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hostile-bench-"))
    cwd, tmp = work / "cwd", work / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(REPO / "tests/fuzz/run_fuzz.py"), "--seconds", str(seconds), "--seed", "13"],
                       cwd=cwd, env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True,
                       timeout=seconds * 3 + 300)
    wall = time.monotonic() - t0
    per = {}
    for line in p.stdout.splitlines():
        if ": " in line and "executions" in line and not line.startswith("total"):
            name, rest = line.split(": ", 1)
            per[name] = int(rest.split()[0])
    total = next((int(ln.split()[1]) for ln in p.stdout.splitlines() if ln.startswith("total:")), None)
    findings = [ln for ln in p.stdout.splitlines() if ln.startswith("[")]
    shm_after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    outside = sorted(os.listdir(cwd)) + sorted(os.listdir(tmp)) + sorted(
        n for n in shm_after - shm_before if n.startswith("afddiag-fuzz"))
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": round(wall, 1), "rc": p.returncode, "executions": total, "per_target": per,
            "findings": len(findings), "tracebacks": sum("crash" in f for f in findings),
            "hangs": sum("hang" in f for f in findings), "written_outside": outside,
            "findings_text": findings[:20]}


def all_hung(timeout_s: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hostile-hung-"))
    (work / "pynvml.py").write_text(HUNG_NVML)
    bindir = work / "bin"
    bindir.mkdir()
    for tool in ("ip", "rdma", "docker", "podman", "dpkg-query", "sinfo", "scontrol"):
        f = bindir / tool
        f.write_text(f"#!/bin/sh\nsleep 600 &\necho $! >> {work}/children\nsleep 600\n")
        f.chmod(0o755)
    env_file = work / "rank.env"
    env_file.write_text("AFD_ROLE=expert\nAFD_FABRIC_IP=192.168.100.10\nAFD_IMAGE=registry.example/afd:1\n"
                        "AFD_PEER_FABRIC_IPS=192.168.100.11\n")
    env = {**os.environ, "PYTHONPATH": f"{work}{os.pathsep}{REPO}", "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
           "AFDDIAG_STATE_DIR": str(work / "state")}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "afddiag", "all", "--json", "--timeout", str(timeout_s),
                        "--launch-env", str(env_file), "--peer", "192.168.100.11"],
                       capture_output=True, text=True, env=env, timeout=600)
    wall = time.monotonic() - t0
    time.sleep(0.5)
    pids = [int(x) for x in (work / "children").read_text().split()] if (work / "children").exists() else []
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if ") Z" not in f.read():
                    alive.append(pid)
        except FileNotFoundError:
            pass
    for pid in alive:  # ours: the hung fakes' grandchildren that outlived the run
        os.kill(pid, signal.SIGKILL)
    try:
        rep = json.loads(p.stdout)
        verdicts = {}
        for g in rep["gates"]:
            verdicts[g["verdict"]] = verdicts.get(g["verdict"], 0) + 1
    except ValueError:
        verdicts = {"no report": p.stderr[-300:]}
    shutil.rmtree(work, ignore_errors=True)
    return {"timeout_s": timeout_s, "wall_s": round(wall, 2), "rc": p.returncode, "verdicts": verdicts,
            "hung_children_started": len(pids), "children_left": len(alive), "traceback": "Traceback" in p.stderr}


def big_snapshot(devices: int) -> dict:
    from snapgen import make_snapshot

    root = Path(tempfile.mkdtemp(prefix="hostile-snap-")) / "snap"
    t0 = time.monotonic()
    make_snapshot(root, devices, slots=4)
    gen = time.monotonic() - t0
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "afddiag", "fabric", "--json", "--no-history", "--no-qp",
                          "--snapshot", str(root), "--timeout", "600", "--fabric-ip", "10.0.0.1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out, err = p.communicate(timeout=1200)
    wall = time.monotonic() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        n = len(json.loads(out)["facts"]["fabric"]["devices"])
    except (ValueError, KeyError, TypeError):
        n = None
    shutil.rmtree(root.parent, ignore_errors=True)
    return {"devices": devices, "gid_slots": 4, "generate_s": round(gen, 1), "wall_s": round(wall, 1), "rc": p.returncode,
            "devices_read": n, "peak_rss_mib": round(ru.ru_maxrss / 1024, 1), "stderr_tail": err[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz-seconds", type=float, default=180)
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--hung-timeout", type=float, default=2.0)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/hostile-bench.json"))
    a = ap.parse_args()
    res = {"machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
           "all_probes_hung": all_hung(a.hung_timeout), "snapshot_10k": big_snapshot(a.devices),
           "fuzz": fuzz(a.fuzz_seconds)}
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
