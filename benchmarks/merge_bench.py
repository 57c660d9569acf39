#!/usr/bin/env python3
"""Wall time and peak RSS of `afddiag merge` over N realistic per-host reports (issue 25's goal:
10,000 reports within 10 s and 1 GB peak RSS on a 2-core machine).

    .venv/bin/python benchmarks/merge_bench.py [--hosts 1000 10000] [--repeat 3] [--form files|jsonl|array]
                                               [--json] [--out FILE]

The reports are real `afddiag all --json` output: each shared case of fabric facts
(``../shared/cases/fabric``) is laid beside a GPU case's readings (``../shared/cases/gpu``) in one
snapshot, replayed with a role and a launch env (a capacity, the case's device map), and printed as
`afddiag all --json` prints (``indent=2``; about 30 KB each). Host ``i`` takes one of those base
reports in turn, its own name, fabric IP (``10.64.0.0/16``, its netdev's address and every mention of
the case's address rewritten), ``generated_at`` and GPU UUIDs; even hosts carry the per-host
``summary`` the host's afddiag builds (:func:`afddiag.summary.from_report` of the rewritten report),
odd ones none (an older afddiag: merge builds it). Host 0 is the coordinator.

Each run is ``python -m afddiag merge [--json] FILES`` in a fresh process (interpreter start,
imports, reading, checking, the fleet gates, the output written to a file; its own rusage):
wall seconds, CPU seconds (user + system: less swayed by a shared machine's load than wall time)
and peak RSS (MiB). ``--form``: one file per host (Slurm's ``--output=%N.json``), or
all in one JSON-lines file, or one JSON array. The figure is the median of ``--repeat`` runs; the
load average (1 min) is printed beside each run, since the machine may be shared.
Not a test: tests/test_merge.py checks the verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CASES = Path(os.environ.get("AFDDIAG_CASES", REPO.parent / "shared" / "cases"))
#: (fabric case, GPU case) pairs that make the base reports: healthy and faulty hosts of both kinds
BASES: Path | None = None  # --bases: the base reports from a file (another machine, no cases there)
PAIRS = [("02-spark-map-set-healthy", "01-gb10-healthy-unified-memory"),
         ("12-cx7-single-port-healthy", "06-h200-healthy-measured"),
         ("01-spark-fabric-ip-on-nonfirst-device", "02-gb10-class-a-stuck-low-clock"),
         ("10-spark-mtu-1500-vs-peer-9000", "07-gb10-thermal-event-bits"),
         ("13-spark-env-map-wrong-device", "01-gb10-healthy-unified-memory"),
         ("14-nccl-gid-index-forced-linklocal", "01-gb10-healthy-unified-memory")]


def base_reports(tmp: Path) -> list[tuple[dict, str]]:
    """One `afddiag all` report per :data:`PAIRS` entry (expert role, launch env with a capacity and
    the case's env), with the fabric IP each was judged at."""
    from afddiag.check import diagnose
    from afddiag.inputs import make_inputs

    out = []
    for k, (fab, gpu) in enumerate(PAIRS):
        snap = tmp / f"snap{k}"
        shutil.copytree(CASES / "fabric" / fab, snap, copy_function=shutil.copyfile)  # writable: removed after
        for d, _, _ in os.walk(snap):
            os.chmod(d, 0o755)
        shutil.copy(CASES / "gpu" / gpu / "gpu.json", snap / "gpu.json")
        meta = json.loads((snap / "case.json").read_text())
        env = tmp / f"expert{k}.env"
        env.write_text("AFD_ROLE=expert\nAFD_EXPERT_CAPACITY=256\n"
                       + "".join(f"{key}={val}\n" for key, val in (meta.get("env") or {}).items()))
        ip = meta.get("fabric_ip")
        inputs = make_inputs(snapshot=str(snap), fabric_ip=ip, role="expert", launch_env_path=str(env),
                             peers=tuple(meta.get("peer_fabric_ips") or ()))
        rep = diagnose(inputs, {"fabric", "gpu", "host", "launch"})[0]
        out.append((json.loads(json.dumps(rep, default=str)), ip or ""))
    return out


def host_ip(i: int) -> str:
    """Host ``i``'s fabric IP on 10.64.0.0/16."""
    return f"10.64.{(i + 10) // 250}.{(i + 10) % 250 + 1}"


def host_report(i: int, base: dict, base_ip: str) -> dict:
    """Host ``i``'s report: ``base`` renamed, readdressed (see the module docstring), its summary built."""
    from afddiag import summary

    name, ip = f"spark{i:05d}", host_ip(i)
    text = json.dumps(base)
    if base_ip:
        for suffix in ("/24", "/16", ""):  # the netdev's address with its prefix, then every mention
            text = text.replace(f'"{base_ip}{suffix}"', f'"{ip}/16"' if suffix else f'"{ip}"')
        text = text.replace(base_ip, ip)
    text = text.replace(str(base.get("host")), name).replace("GPU-", f"GPU-{i:05d}-")
    r = json.loads(text)
    r["host"] = name
    r["generated_at"] = f"2026-12-02T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}+00:00"
    if i == 0:
        r["inputs"]["role"] = "coordinator"
    r.pop("summary", None)
    if i % 2 == 0:
        r["summary"] = summary.from_report(r)
    return r


def make_reports(n: int, out: Path, form: str = "files") -> list[Path]:
    """Write ``n`` host reports under ``out`` as ``form``: ``files`` (``host-00000.json`` …),
    ``jsonl`` (one ``reports.jsonl``) or ``array`` (one ``reports.json``). Returns the paths to merge."""
    out.mkdir(parents=True, exist_ok=True)
    bases = [tuple(b) for b in json.loads(BASES.read_text())] if BASES else base_reports(out)
    reps = (host_report(i, *bases[i % len(bases)]) for i in range(n))
    if form == "files":
        paths = []
        for i, r in enumerate(reps):
            p = out / f"host-{i:05d}.json"
            p.write_text(json.dumps(r, indent=2))
            paths.append(p)
        return paths
    p = out / ("reports.jsonl" if form == "jsonl" else "reports.json")
    with p.open("w") as f:
        if form == "jsonl":
            for r in reps:
                f.write(json.dumps(r) + "\n")
        else:
            f.write("[\n" + ",\n".join(json.dumps(r, indent=2) for r in reps) + "\n]\n")
    return [p]


def run_merge(paths: list[Path], as_json: bool, work: Path) -> dict:
    """One `afddiag merge` in a fresh process: wall s, CPU s (user + system), peak RSS MiB (that
    child's own rusage, ``os.wait4``), exit code, the load average as it started."""
    out = work / "fleet.out"
    cmd = [sys.executable, "-m", "afddiag", "merge", *(["--json"] if as_json else []), *map(str, paths)]
    load = os.getloadavg()[0]
    t = time.monotonic()
    with out.open("wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.DEVNULL, cwd=REPO)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    row = {"wall_s": round(wall, 2), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
           "peak_rss_mib": round(ru.ru_maxrss / 1024, 1), "rc": os.waitstatus_to_exitcode(status),
           "load_1min": round(load, 2), "out_mib": round(out.stat().st_size / 2**20, 1)}
    if as_json:
        fr = json.loads(out.read_text())
        row["hosts_ok"] = fr["hosts_ok"]
    return row


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--form", choices=["files", "jsonl", "array"], default="files")
    ap.add_argument("--json", action="store_true", help="merge --json (the fleet report) instead of the table")
    ap.add_argument("--out", help="append the result as one JSON line to this file")
    ap.add_argument("--save-bases", help="write the base reports ([[report, fabric_ip], ...]) to this file and stop")
    ap.add_argument("--bases", help="take the base reports from a --save-bases file instead of the cases")
    a = ap.parse_args(argv)
    if a.save_bases:
        with tempfile.TemporaryDirectory(prefix="afddiag-merge-bases-") as d:
            Path(a.save_bases).write_text(json.dumps(base_reports(Path(d))))
        return 0
    global BASES
    BASES = Path(a.bases) if a.bases else None
    for n in a.hosts:
        work = Path(tempfile.mkdtemp(prefix="afddiag-merge-bench-"))
        try:
            paths = make_reports(n, work / "reports", a.form)
            mib = sum(p.stat().st_size for p in paths) / 2**20
            runs = [run_merge(paths, a.json, work) for _ in range(a.repeat)]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        res = {"hosts": n, "form": a.form, "json": a.json, "input_mib": round(mib, 1), "cores": os.cpu_count(),
               "median_wall_s": statistics.median(r["wall_s"] for r in runs),
               "median_cpu_s": statistics.median(r["cpu_s"] for r in runs),
               "median_peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs),
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": runs}
        print(json.dumps(res))
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
