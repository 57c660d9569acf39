#!/usr/bin/env python3
"""Standalone fuzzer over afddiag's parsers (the long run; ``tests/test_fuzz.py`` is the CI-sized one).

    .venv/bin/python tests/fuzz/run_fuzz.py [--seconds 300] [--targets ip_addr,gpu,...] [--seed 1] [--save]

Mutation fuzzing from the real cases' files and the stored corpus (``tests/fuzz/corpus/<target>/``):
byte mutations (truncate, flip, insert, duplicate), JSON-structure mutations (type swaps, dropped and
duplicated keys and items, odd strings) and tree edits for the sysfs and snapshot targets (odd
names, deleted and truncated files, directories where files belong, EINVAL/EACCES/EIO on read,
hundreds of duplicated devices). Time is split evenly across targets. Every finding (a traceback, a
gate that raised, an exit code other than 0-3/64, a usage error that is not one line, an execution
over 30 s: a hang) is printed
with its input, and with ``--save`` kept in the corpus as ``crash-<hash>``. Prints the executions
per target and exits 1 when anything was found.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzlib  # noqa: E402

HANG_S = 30.0  # one execution longer than this is reported as a hang


def main(argv: list[str] | None = None) -> int:
    """Fuzz for ``--seconds`` and report executions and findings."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="total time, split across targets")
    ap.add_argument("--targets", default=",".join(fuzzlib.TARGETS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--save", action="store_true", help="keep findings in tests/fuzz/corpus")
    a = ap.parse_args(argv)
    if not (fuzzlib.CASES / "fabric").is_dir():
        print(f"run_fuzz: shared cases not found at {fuzzlib.CASES}: set AFDDIAG_CASES to the cases folder",
              file=sys.stderr)
        return 2
    state = tempfile.TemporaryDirectory(prefix="afddiag-fuzz-state-")  # removed when main returns
    os.environ.setdefault("AFDDIAG_STATE_DIR", state.name)
    rng = random.Random(a.seed)
    targets = [t for t in a.targets.split(",") if t]
    per = a.seconds / max(1, len(targets))
    total, found = 0, 0
    for target in targets:
        pool = fuzzlib.seeds(target)
        n, bad, t_end, slowest = 0, 0, time.monotonic() + per, 0.0
        for data in list(pool):  # the seeds and corpus first
            n += 1
            t0 = time.monotonic()
            why = fuzzlib.run_one(target, data)
            slowest = max(slowest, time.monotonic() - t0)
            if why:
                bad += 1
                print(f"[{target}] corpus input fails: {why}\n  input: {data[:300]!r}", flush=True)
        while time.monotonic() < t_end:
            data = fuzzlib.mutate(target, rng.choice(pool), rng)
            n += 1
            t0 = time.monotonic()
            why = fuzzlib.run_one(target, data)
            took = time.monotonic() - t0
            slowest = max(slowest, took)
            if took > HANG_S:
                why = why or f"hang: one execution took {took:.1f}s"
            if why:
                bad += 1
                print(f"[{target}] {why}\n  input: {data[:300]!r}", flush=True)
                if a.save:
                    print(f"  saved {fuzzlib.save(target, data)}", flush=True)
            elif rng.random() < 0.05 and len(pool) < 500:
                pool.append(data)  # a passing mutant seeds further mutation
        print(f"{target}: {n} executions, {bad} findings, slowest execution {slowest:.2f} s, {per:.0f} s",
              flush=True)
        total += n
        found += bad
    print(f"total: {total} executions, {found} findings", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
