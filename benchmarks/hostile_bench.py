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
4. Hostile merges (issue 22), each ``afddiag merge --json FILE --html PAGE`` in a subprocess: wall
   time, peak RSS, page size, exit code. ``claimed``: one file of ``--merge-hosts`` coordinators and as
   many ranks (small valid reports whose summaries claim control-plane connects); ``gate_ids``: hosts
   that each carry 30 gate ids no other host has (the page used to grow as hosts² × ids).

    .venv/bin/python benchmarks/hostile_bench.py --only merge [--merge-hosts 3000]
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
    p = subprocess.run([sys.executable, str(REPO / "tests/fuzz/run_fuzz.py"), "--seconds", str(seconds),
                        "--seed", "13"],
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
    return {"devices": devices, "gid_slots": 4, "generate_s": round(gen, 1), "wall_s": round(wall, 1),
            "rc": p.returncode, "devices_read": n, "peak_rss_mib": round(ru.ru_maxrss / 1024, 1),
            "stderr_tail": err[-300:]}


def _claimed_report(i: int, role: str, peer_ip: str) -> dict:
    """A small schema-valid report of host ``i`` that claims one control-plane connect to ``peer_ip``."""
    ip = f"10.{64 + i // 65000}.{i // 250 % 260 % 256}.{i % 250 + 1}"
    return {"schema_version": 1, "afddiag_version": "0.1.0", "host": f"{role[:5]}{i:05d}", "source": "live",
            "gates": [{"id": "launch.control-plane", "verdict": "PASS", "summary": "connected", "remedy": "",
                       "facts": {}}],
            "device_map": {}, "counts": {"PASS": 1, "WARN": 0, "FAIL": 0, "SKIP": 0, "ERROR": 0}, "exit_code": 0,
            "inputs": {"fabric_ip": ip, "role": role},
            "summary": {"summary_version": 1, "role": role, "fabric_ip": ip,
                        "control_plane": {"verdict": "PASS", "source": ip, "peers": [peer_ip], "ports": [29500],
                                          "attempts": [{"peer": peer_ip, "port": 29500, "outcome": "connected"}],
                                          "not_tried": [], "advertised_bad": []}}}


def _merge_run(path: Path, page: Path) -> dict:
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "afddiag", "merge", "--json", str(path), "--html", str(page)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    out, err = p.communicate(timeout=1800)
    wall = time.monotonic() - t0
    return {"wall_s": round(wall, 1), "rc": p.returncode, "input_kib": round(path.stat().st_size / 1024),
            "page_kib": round(page.stat().st_size / 1024) if page.exists() else None,
            "stdout_kib": round(len(out) / 1024), "stderr_tail": err.decode("utf-8", "replace")[-300:]}


def hostile_merge(hosts: int) -> dict:
    """Peak RSS of each hostile merge, in a child of its own (``ru_maxrss`` of RUSAGE_CHILDREN after
    each: the largest child so far, so the runs go smallest first)."""
    work = Path(tempfile.mkdtemp(prefix="hostile-merge-"))
    out: dict = {}
    reps = []
    for i in range(120):
        r = _claimed_report(i, "expert", "10.64.0.1")
        r["gates"] += [{"id": f"fabric.forged-{i}-{k}", "verdict": "PASS", "summary": "s" * 40, "remedy": "",
                        "facts": {}} for k in range(30)]
        reps.append(r)
    (work / "ids.json").write_text(json.dumps(reps))
    out["gate_ids_120_hosts_x_30"] = _merge_run(work / "ids.json", work / "ids.html")
    out["gate_ids_120_hosts_x_30"]["peak_rss_mib_so_far"] = round(
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    coord_ips = [f"10.{64 + i // 65000}.{i // 250 % 260 % 256}.{i % 250 + 1}" for i in range(hosts)]
    reps = [_claimed_report(i, "coordinator", coord_ips[(i + 1) % hosts]) for i in range(hosts)]
    reps += [_claimed_report(hosts + i, "expert", coord_ips[i % hosts]) for i in range(hosts)]
    (work / "claimed.json").write_text(json.dumps(reps))
    key = f"claimed_{hosts}_coordinators_{hosts}_ranks"
    out[key] = _merge_run(work / "claimed.json", work / "claimed.html")
    out[key]["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz-seconds", type=float, default=180)
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--hung-timeout", type=float, default=2.0)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/hostile-bench.json"))
    ap.add_argument("--merge-hosts", type=int, default=3000,
                    help="coordinators (and as many ranks) in the claimed merge")
    ap.add_argument("--only", choices=["merge"], help="run only the hostile merges (printed, not written to --out)")
    a = ap.parse_args()
    if a.only == "merge":
        print(json.dumps(hostile_merge(a.merge_hosts), indent=2))
        return 0
    res = {"machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
           "all_probes_hung": all_hung(a.hung_timeout), "snapshot_10k": big_snapshot(a.devices),
           "fuzz": fuzz(a.fuzz_seconds)}
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
