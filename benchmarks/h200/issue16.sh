#!/usr/bin/env bash
# Issue 16: `afddiag gpu` (no load) against `nvidia-smi -q` on an H200, side by side, with a
# per-phase breakdown of afddiag's run. Runs from the repository root on the GPU host (python3 with
# click, rich, pynvml, psutil; nothing installed), writes under $OUT/issue16/, bounded to ~3 minutes.
#
#   OUT=/tmp/out bash benchmarks/h200/issue16.sh
#
# Files: runs.tsv (command, run, wall ms, exit code), phases.jsonl (benchmarks/gpu_phases.py, one line a
# run), summary.txt (median and min per command, the ratio afddiag / nvidia-smi -q, the goal <= 2x),
# importtime.txt (python -X importtime of one run), env.txt (GPU, driver, python, persistence mode,
# whether the image ships bytecode for the modules afddiag imports).
#
# Three ways of running the same code, each beside nvidia-smi -q in its own loop: "as the image ships
# it" (the CUDA image's python3; when the image sets PYTHONDONTWRITEBYTECODE and ships no .pyc for
# nvidia-ml-py, every run compiles pynvml.py and afddiag from source); "[bytecode]" (then the .pyc
# files compiled once in place, as `pip install` leaves them: pip byte-compiles every file it
# installs, and scripts/setup.sh compiles afddiag); "[venv]" (that plus a venv of its own, as
# scripts/setup.sh installs afddiag, so that the image's site-packages .pth hooks, numba's among them,
# do not run at every interpreter start; the venv sees the image's click, rich, pynvml and psutil
# through one .pth naming a directory of links to only those).
set -u
OUT="${OUT:-/tmp}"
D="$OUT/issue16"
mkdir -p "$D"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export AFDDIAG_STATE_DIR="$D/state"   # the history store of the default run lands here, not in ~
RUNS="${RUNS:-7}"
T_END=$(( $(date +%s) + ${BUDGET_S:-170} ))

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  python3 --version 2>&1
  nvidia-smi --query-gpu=name,driver_version,persistence_mode,pstate --format=csv 2>&1
  python3 -c 'import click, rich, pynvml, psutil; print("click", click.__version__, "psutil", psutil.__version__)' 2>&1
  nproc
} > "$D/env.txt"

ms() { date +%s%N; }
printf 'command\trun\tms\trc\n' > "$D/runs.tsv"
run_one() {  # name, run index, command...
  local name="$1" i="$2"; shift 2
  local t0 t1 rc
  t0=$(ms)
  timeout 60 "$@" > /dev/null 2>>"$D/stderr.txt"
  rc=$?
  t1=$(ms)
  printf '%s\t%s\t%s\t%s\n' "$name" "$i" "$(( (t1 - t0) / 1000000 ))" "$rc" >> "$D/runs.tsv"
}

# one warm-up of each (page cache, driver load), not counted
nvidia-smi -q > /dev/null 2>&1
python3 -m afddiag gpu --json --no-history > "$D/gpu-report.json" 2>>"$D/stderr.txt"
python3 -m afddiag.probes.gpu > "$D/gpu-probe.json" 2>>"$D/stderr.txt"

for i in $(seq 1 "$RUNS"); do
  [ "$(date +%s)" -ge "$T_END" ] && { echo "stopped at run $i: time budget" >> "$D/env.txt"; break; }
  run_one "nvidia-smi -q" "$i" nvidia-smi -q
  run_one "afddiag gpu --json" "$i" python3 -m afddiag gpu --json
  run_one "afddiag gpu --json --no-history" "$i" python3 -m afddiag gpu --json --no-history
  run_one "afddiag gpu (table)" "$i" python3 -m afddiag gpu --no-history
  run_one "afddiag gpu --json --expect-sm 132" "$i" python3 -m afddiag gpu --json --no-history --expect-sm 132
  run_one "python3 -m afddiag.probes.gpu" "$i" python3 -m afddiag.probes.gpu
  run_one "python3 -c pass" "$i" python3 -c pass
  timeout 60 python3 benchmarks/gpu_phases.py >> "$D/phases.jsonl" 2>>"$D/stderr.txt"
done

# bytecode: what the image ships, then compile once in place (the "[bytecode]" and "[venv]" loop)
python3 - >> "$D/env.txt" 2>&1 <<'PY'
import importlib.util, os, sys
print("PYTHONDONTWRITEBYTECODE", os.environ.get("PYTHONDONTWRITEBYTECODE"), "dont_write_bytecode", sys.dont_write_bytecode)
for name in ("pynvml", "click", "rich", "psutil", "afddiag.cli"):
    spec = importlib.util.find_spec(name)
    pyc = spec.cached if spec else None
    print(f"bytecode shipped {name}: {spec.origin if spec else None} exists={bool(pyc and os.path.exists(pyc))}")
PY
DEPS=$(python3 -c 'import os, importlib
for n in ("pynvml", "click", "rich", "psutil", "markdown_it", "mdurl", "pygments"):
    try: m = importlib.import_module(n)
    except Exception: continue
    print(m.__file__ if n == "pynvml" else os.path.dirname(m.__file__))' 2>>"$D/stderr.txt")
VENV="$D/venv"
python3 -m venv --without-pip "$VENV" 2>>"$D/stderr.txt"
mkdir -p "$D/deps"
for f in $DEPS; do ln -sfn "$f" "$D/deps/$(basename "$f")"; done
echo "$D/deps" > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/afddiag-deps.pth"
python3 -m compileall -q afddiag $DEPS "$D/deps" > /dev/null 2>>"$D/stderr.txt"
python3 - >> "$D/env.txt" 2>&1 <<'PY'
import importlib.util, os
for name in ("pynvml", "afddiag.cli"):
    spec = importlib.util.find_spec(name)
    print(f"bytecode compiled {name}: exists={bool(spec and spec.cached and os.path.exists(spec.cached))}")
PY
"$VENV/bin/python" -c 'import click, rich, pynvml, psutil' >> "$D/env.txt" 2>&1 && echo "venv: ok ($VENV)" >> "$D/env.txt"
python3 -m afddiag gpu --json --no-history > /dev/null 2>>"$D/stderr.txt"
"$VENV/bin/python" -m afddiag gpu --json --no-history > /dev/null 2>>"$D/stderr.txt"

for i in $(seq 1 "$RUNS"); do
  [ "$(date +%s)" -ge "$T_END" ] && { echo "stopped at bytecode run $i: time budget" >> "$D/env.txt"; break; }
  run_one "nvidia-smi -q [2nd loop]" "$i" nvidia-smi -q
  run_one "afddiag gpu --json [bytecode]" "$i" python3 -m afddiag gpu --json
  run_one "afddiag gpu (table) [bytecode]" "$i" python3 -m afddiag gpu --no-history
  run_one "afddiag gpu --json --expect-sm 132 [bytecode]" "$i" python3 -m afddiag gpu --json --no-history --expect-sm 132
  run_one "afddiag gpu --json [venv]" "$i" "$VENV/bin/python" -m afddiag gpu --json
  run_one "afddiag gpu (table) [venv]" "$i" "$VENV/bin/python" -m afddiag gpu --no-history
  run_one "python3 -c pass [venv]" "$i" "$VENV/bin/python" -c pass
done

python3 -X importtime -m afddiag gpu --json --no-history > /dev/null 2> "$D/importtime.txt"
sort -t'|' -k2 -n -r <(sed -n 's/^import time: *\([0-9]*\) | *\([0-9]*\) | \(.*\)$/\3|\2/p' "$D/importtime.txt") \
  2>/dev/null | head -25 > "$D/importtime-top.txt"
"$VENV/bin/python" -X importtime -m afddiag gpu --json --no-history > /dev/null 2> "$D/importtime-venv.txt"
sort -t'|' -k2 -n -r <(sed -n 's/^import time: *\([0-9]*\) | *\([0-9]*\) | \(.*\)$/\3|\2/p' "$D/importtime-venv.txt") \
  2>/dev/null | head -25 > "$D/importtime-venv-top.txt"

python3 - "$D" <<'PY' > "$D/summary.txt"
import collections, json, statistics, sys
d = sys.argv[1]
rows = collections.defaultdict(list)
for line in open(f"{d}/runs.tsv").read().splitlines()[1:]:
    name, _, ms, rc = line.split("\t")
    rows[name].append((int(ms), int(rc)))
med = {k: statistics.median(m for m, _ in v) for k, v in rows.items()}
print(f"{'command':<46} {'runs':>4} {'median ms':>10} {'min ms':>8}  exit codes")
for k, v in rows.items():
    print(f"{k:<46} {len(v):>4} {med[k]:>10.0f} {min(m for m, _ in v):>8}  {sorted({rc for _, rc in v})}")
for k in ("afddiag gpu --json", "afddiag gpu --json --no-history", "afddiag gpu --json --expect-sm 132",
          "afddiag gpu --json [bytecode]", "afddiag gpu (table) [bytecode]",
          "afddiag gpu --json --expect-sm 132 [bytecode]", "afddiag gpu --json [venv]", "afddiag gpu (table) [venv]"):
    smi = med.get("nvidia-smi -q [2nd loop]" if "[" in k else "nvidia-smi -q")
    if smi and k in med:
        r = med[k] / smi
        print(f"{k} / nvidia-smi -q = {r:.2f}x (goal <= 2x: {'MET' if r <= 2 else 'MISSED'})")
try:
    ph = [json.loads(l) for l in open(f"{d}/phases.jsonl") if l.strip()]
except OSError:
    ph = []
if ph:
    print("\nphases (median ms over %d runs):" % len(ph))
    keys = ["interpreter_ms", "import_cli_ms", "read_gpu_ms", "read_gpu_cuda_ms", "cli_gpu_json_warm_ms",
            "history_append_ms", "total_ms"]
    for k in keys:
        vals = [p[k] for p in ph if isinstance(p.get(k), (int, float))]
        if vals:
            print(f"  {k:<24} {statistics.median(vals):8.1f}")
    for part in ("read_gpu_parts_ms", "read_gpu_cuda_parts_ms"):
        for k in ("nvml_ms", "cuda_ms", "xid_ms"):
            vals = [p[part][k] for p in ph if isinstance(p.get(part), dict) and isinstance(p[part].get(k), (int, float))]
            if vals:
                print(f"  {part.removesuffix('_parts_ms')}.{k:<10} {statistics.median(vals):8.1f}")
    print(f"  gpus {ph[-1].get('gpus')}, processes listed {ph[-1].get('processes_listed')}, "
          f"xid source {ph[-1].get('xid_source')!r}")
PY
cat "$D/summary.txt"
