#!/usr/bin/env bash
# Re-check the GPU side on a lent H200 after a change: the GPU-marked tests, live `gpu`/`all` reports,
# host.cpu-clock across repeated runs (never a FAIL on a healthy host), the load probe's slow-state
# verdicts, and `afddiag gpu` against `nvidia-smi -q` (issue 16's <= 2x). Runs from the repository root
# with the image's python3 (click, rich, pynvml, psutil, pytest; nothing installed); every step bounded.
#
#   OUT=/some/dir bash benchmarks/h200/recheck.sh
#
# Writes $OUT/recheck/: env.txt, pytest-gpu.txt, gpu.json, all.json, cpu-clock.tsv, load-*.json,
# timing.tsv and summary.txt (one line per check).
set -u
OUT="${OUT:?set OUT to the folder to write into}"
D="$OUT/recheck"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export AFDDIAG_STATE_DIR="$D/state"
PY="${PYTHON:-python3}"
AFD=("$PY" -m afddiag)
S="$D/summary.txt"
{
  date -u +%FT%TZ; nproc; uptime
  nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
  "$PY" -c 'import sys, click, rich, pynvml, psutil; print(sys.version.split()[0], click.__version__)'
  "$PY" -m pytest --version 2>&1
  git log --oneline -1 2>/dev/null || true
} >"$D/env.txt" 2>&1
"$PY" -m compileall -q afddiag >/dev/null 2>&1   # as scripts/setup.sh leaves an install
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_probe.py tests/test_load_probe.py >"$D/pytest-gpu.txt" 2>&1
echo "pytest -m gpu: $(tail -1 "$D/pytest-gpu.txt")" >>"$S"
verdict() {  # verdict FILE GATE: "<verdict> <action>: <summary>" of GATE in report FILE
  "$PY" - "$1" "$2" <<'PY'
import json, sys
try:
    rep = json.load(open(sys.argv[1]))
    rep = rep.get("report", rep)
    g = next(g for g in rep["gates"] if g["id"] == sys.argv[2])
    print(f'{g["verdict"]} {g.get("action")}: {g["summary"][:160]}')
except Exception as e:  # noqa: BLE001
    print(f"unreadable ({e})")
PY
}
timeout 60 "${AFD[@]}" gpu --json >"$D/gpu.json" 2>"$D/gpu.err"; echo "gpu rc=$?" >>"$S"
timeout 120 "${AFD[@]}" all --json >"$D/all.json" 2>"$D/all.err"; echo "all rc=$?" >>"$S"
for g in gpu.present gpu.memory gpu.clock-events gpu.errors host.pcie host.cpu-clock; do
  echo "all $g: $(verdict "$D/all.json" "$g")" >>"$S"
done
# host.cpu-clock: a baseline, then repeated runs; none may FAIL on this healthy host
timeout 60 "${AFD[@]}" baseline record --force >"$D/baseline.txt" 2>&1; echo "baseline record rc=$?" >>"$S"
printf 'run\tverdict\n' >"$D/cpu-clock.tsv"
for i in 1 2 3 4 5 6; do
  timeout 60 "${AFD[@]}" all --json >"$D/all-$i.json" 2>/dev/null
  printf '%s\t%s\n' "$i" "$(verdict "$D/all-$i.json" host.cpu-clock)" >>"$D/cpu-clock.tsv"
done
echo "host.cpu-clock over 6 runs: $(cut -f2 "$D/cpu-clock.tsv" | tail -n +2 | cut -d' ' -f1 | sort | uniq -c | tr '\n' ' ')" >>"$S"
# the load probe twice: an idle healthy H200 under bf16 load is PASS (clock near max; at its power limit or not)
for i in 1 2; do
  timeout 120 "${AFD[@]}" gpu --load --json >"$D/load-$i.json" 2>"$D/load-$i.err"
  echo "gpu --load $i: $(verdict "$D/load-$i.json" gpu.slow-state)" >>"$S"
done
# issue 16: afddiag gpu (no load) vs nvidia-smi -q, 7 runs each, median
printf 'cmd\tms\n' >"$D/timing.tsv"
for i in 1 2 3 4 5 6 7; do
  for c in "nvidia-smi -q" "$PY -m afddiag gpu --json --no-history"; do
    t0=$(date +%s%N); $c >/dev/null 2>&1; t1=$(date +%s%N)
    printf '%s\t%s\n' "$c" $(( (t1 - t0) / 1000000 )) >>"$D/timing.tsv"
  done
done
"$PY" - "$D/timing.tsv" >>"$S" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {c: statistics.median(int(r["ms"]) for r in rows if r["cmd"] == c) for c in {r["cmd"] for r in rows}}
smi = next(v for k, v in med.items() if k.startswith("nvidia-smi"))
for k, v in sorted(med.items()):
    print(f"median {k}: {v:.0f} ms ({v / smi:.2f}x nvidia-smi -q)")
PY
cat "$S"
