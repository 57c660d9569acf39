"""afddiag against the tools operators run by hand, start-up, scaling and memory (issue 8).

    .venv/bin/python benchmarks/fabric_bench.py [--repeat N] [--out FILE]

Prints one table; every ratio is measured in this one run. Anchors:
- a show_gids-style walk (the Mellanox/NVIDIA `show_gids` script's loop: one `cat` process per GID
  slot and per attribute) over the same 4-HCA Spark snapshot with 255 GID slots a port;
- `afddiag fabric --snapshot` cold (a new process, as an operator runs it), and in-process;
- `afddiag --version` and `afddiag all --snapshot` cold start (time to first output);
- snapshot replay with 1, 16, 256 devices × 8, 128, 1024 GID slots (in-process, per slot);
- peak RSS of `afddiag fabric` and `afddiag all` (no load probe).
`ibv_devinfo -v` and `rdma link show` need real devices: lab/scenario-bench.py measures them in the
soft-RoCE lab (benchmarks/results/lab-bench.txt).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

from snapgen import make_snapshot, spark_snapshot  # noqa: E402

CASES = Path(os.environ.get("AFDDIAG_CASES", REPO.parent / "shared" / "cases"))
AFDDIAG = [sys.executable, "-m", "afddiag"]

# The loop of the show_gids script (rdma-core/mlnx-tools), reading a sysfs root given as $1: one
# process per file read, which is what makes it slow on real-size tables.
SHOW_GIDS = r'''
root="$1"
printf "DEV\tPORT\tINDEX\tGID\t\t\t\t\tIPv4\t\tVER\tDEV\n"
for d in $(ls "$root/sys/class/infiniband"); do
  for p in $(ls "$root/sys/class/infiniband/$d/ports"); do
    P="$root/sys/class/infiniband/$d/ports/$p"
    for g in $(ls "$P/gids"); do
      gid=$(cat "$P/gids/$g")
      if [ "$gid" = "0000:0000:0000:0000:0000:0000:0000:0000" ]; then continue; fi
      if [ "$gid" = "fe80:0000:0000:0000:0000:0000:0000:0000" ]; then continue; fi
      ver=$(cat "$P/gid_attrs/types/$g" 2>/dev/null)
      ndev=$(cat "$P/gid_attrs/ndevs/$g" 2>/dev/null)
      printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$d" "$p" "$g" "$gid" "$ver" "$ndev"
    done
  done
done
'''


def wall(cmd: list[str], repeat: int, first_output: bool = False, env: dict | None = None) -> float:
    """Median wall seconds of ``cmd`` over ``repeat`` runs (to the first byte of stdout if asked)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        if first_output:
            p.stdout.read(1)
            t1 = time.perf_counter()
            p.stdout.read()
        p.wait()
        times.append((t1 if first_output else time.perf_counter()) - t0)
    return statistics.median(times)


def peak_rss_mb(cmd: list[str]) -> float:
    """Peak RSS (MB) of one run of ``cmd``, from wait4's rusage."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, ru = os.wait4(p.pid, 0)
    return ru.ru_maxrss / 1024


def in_process(snap: Path, repeat: int) -> float:
    from afddiag.check import diagnose
    from afddiag.model.run import Inputs

    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        diagnose(Inputs(snapshot=str(snap), run_qp=False), {"fabric"})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows: list[tuple[str, str, str]] = []
    env = dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        spark = spark_snapshot(CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device", td / "spark")
        slots = sum(1 for _ in spark.glob("sys/class/infiniband/*/ports/*/gids/*"))
        show = wall(["bash", "-c", SHOW_GIDS, "show_gids", str(spark)], max(1, args.repeat // 2))
        cold = wall(AFDDIAG + ["fabric", "--no-history", "--snapshot", str(spark)], args.repeat, env=env)
        warm = in_process(spark, args.repeat)
        rows += [
            ("snapshot", f"4-HCA Spark (case 01), {slots} GID slots", ""),
            ("show_gids-style walk (bash, a process per file)", f"{show:.3f} s", "anchor"),
            ("afddiag fabric --snapshot, new process", f"{cold:.3f} s",
             f"{show / cold:.1f}x faster (goal >= 10x); {'PASS' if cold <= 0.25 else 'MISS'} goal <= 0.25 s"),
            ("afddiag fabric, in-process (probe + gates)", f"{warm * 1000:.1f} ms", f"{show / warm:.0f}x faster"),
        ]
        ver = wall(AFDDIAG + ["--version"], args.repeat, first_output=True, env=env)
        allc = wall(AFDDIAG + ["all", "--no-history", "--snapshot", str(spark)], args.repeat, first_output=True,
                    env=env)
        bare = wall([sys.executable, "-c", "print(1)"], args.repeat, first_output=True, env=env)
        rows += [
            ("python -c print(1) (interpreter floor)", f"{bare * 1000:.0f} ms", "anchor"),
            ("afddiag --version, to first output", f"{ver * 1000:.0f} ms",
             f"{'PASS' if ver <= 0.150 else 'MISS'} goal <= 150 ms ({(ver - bare) * 1000:.0f} ms above the floor)"),
            ("afddiag all --snapshot, to first output", f"{allc * 1000:.0f} ms",
             f"{'PASS' if allc <= 0.150 else 'MISS'} goal <= 150 ms"),
        ]
        base = None
        for devs in (1, 16, 256):
            for nslots in (8, 128, 1024):
                if devs * nslots > 70000:
                    continue
                snap = make_snapshot(td / f"s{devs}x{nslots}", devs, nslots)
                t = in_process(snap, max(1, args.repeat // 2))
                per = t / (devs * nslots) * 1e6
                base = base or per
                rows.append((f"replay {devs} devices x {nslots} slots", f"{t * 1000:.1f} ms",
                             f"{per:.1f} us/slot ({per / base:.2f}x the smallest's per-slot cost)"))
        for label, cmd in (("afddiag fabric", AFDDIAG + ["fabric", "--no-history", "--snapshot", str(spark)]),
                           ("afddiag all (no load probe)",
                            AFDDIAG + ["all", "--no-history", "--snapshot", str(spark)])):
            mb = peak_rss_mb(cmd)
            rows.append((f"peak RSS, {label}", f"{mb:.1f} MB", f"{'PASS' if mb <= 80 else 'MISS'} goal <= 80 MB"))
    w = max(len(r[0]) for r in rows)
    text = "\n".join(f"{a:<{w}}  {b:>14}  {c}" for a, b, c in rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
