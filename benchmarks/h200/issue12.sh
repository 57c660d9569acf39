#!/usr/bin/env bash
# Issue 12: a busy GPU is "inconclusive", never a power cycle. On an H200: record this host's baseline
# (idle), then `afddiag gpu --load --json` while a competing torch bf16 matmul loop runs (expect
# gpu.slow-state WARN "inconclusive: GPU busy (pid ..., python3)", no AC_POWER_CYCLE anywhere), the
# expert playbook's own load probe on the busy GPU (expect it skipped: "not run: GPU busy"), and
# `baseline record` on the busy GPU (expect a refusal, exit 2); then the idle `gpu --load --json`
# again (expect PASS). Runs from the repository root (python3 with torch, click, rich, pynvml, psutil;
# nothing installed), writes under $OUT/issue12/, bounded to ~3 minutes.
#
#   OUT=/tmp/out bash benchmarks/h200/issue12.sh
#
# Files (the lead keeps the JSON as fixtures under tests/fixtures/gpu/h200-issue12/):
#   env.txt                   date, GPU, driver, versions
#   baseline-record.txt       `baseline record` on the idle GPU (stdout+stderr, exit code); baseline.json
#   gpu-probe-busy.json       `python3 -m afddiag.probes.gpu` while the competitor runs (a snapshot's gpu.json)
#   gpu-load-busy.json        `afddiag gpu --load --json --baseline baseline.json` while the competitor runs
#   gpu-expert-busy.json      `afddiag gpu --playbook <load_probe = true> --json --baseline ...` (the load probe
#                             turned on by a playbook, as the expert role does: not forced, so skipped when busy)
#   baseline-record-busy.txt  `baseline record` while the competitor runs (a refusal is right)
#   competitor.log            the torch loop's own log (TFLOP/s it got), killed after
#   gpu-load-idle.json        `afddiag gpu --load --json --baseline baseline.json` once the GPU is idle again
#   summary.txt               gpu.slow-state's verdict, summary and action of each run, and each exit code
set -u
OUT="${OUT:-/tmp}"
D="$OUT/issue12"
mkdir -p "$D"
TMP="$(mktemp -d)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export AFDDIAG_STATE_DIR="$TMP/state"   # no history or baseline lands in ~
BASE="$TMP/baseline.json"
PY=python3

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(hostname)"
  $PY --version 2>&1
  nvidia-smi --query-gpu=name,uuid,driver_version,pstate,utilization.gpu --format=csv 2>&1
  $PY -c 'import torch, pynvml, click, psutil; print("torch", torch.__version__, "psutil", psutil.__version__)' 2>&1
} > "$D/env.txt"

rc_of() { echo "exit $1" >> "$2"; }

# 1. the idle baseline (refused figures are written down; --force then keeps the later steps comparable)
timeout 60 $PY -m afddiag baseline record --path "$BASE" > "$D/baseline-record.txt" 2>&1
rc=$?; rc_of $rc "$D/baseline-record.txt"
if [ $rc -ne 0 ]; then
  echo "--- refused on the idle GPU: recording with --force so the next steps have a baseline" >> "$D/baseline-record.txt"
  timeout 60 $PY -m afddiag baseline record --path "$BASE" --force >> "$D/baseline-record.txt" 2>&1
  rc_of $? "$D/baseline-record.txt"
fi
cp "$BASE" "$D/baseline.json" 2>/dev/null

# 2. a competing job: torch bf16 8192^3 matmuls back to back, bounded to 90 s, killed when done
$PY benchmarks/h200/competitor.py 90 > "$D/competitor.log" 2>&1 &
CPID=$!
for _ in $(seq 1 60); do grep -q running "$D/competitor.log" 2>/dev/null && break; sleep 0.5; done
sleep 3   # utilization settles at 100 %

timeout 30 $PY -m afddiag.probes.gpu > "$D/gpu-probe-busy.json" 2>"$TMP/probe.err"
timeout 60 $PY -m afddiag gpu --load --json --no-history --baseline "$BASE" > "$D/gpu-load-busy.json" 2>"$TMP/busy.err"
echo "$?" > "$TMP/busy.rc"
# a playbook that turns the load probe on, as the expert role does (the expert role itself expects a GB10)
printf 'name = "h200-load"\ndescription = "the load probe on by playbook (issue 12)"\ngates = ["gpu.*"]\n[gpu]\nload_probe = true\n' \
  > "$TMP/h200-load.toml"
timeout 60 $PY -m afddiag gpu --playbook "$TMP/h200-load.toml" --json --no-history --baseline "$BASE" \
  > "$D/gpu-expert-busy.json" 2>"$TMP/expert.err"
echo "$?" > "$TMP/expert.rc"
timeout 60 $PY -m afddiag baseline record --path "$TMP/busy-baseline.json" > "$D/baseline-record-busy.txt" 2>&1
rc_of $? "$D/baseline-record-busy.txt"

kill "$CPID" 2>/dev/null
wait "$CPID" 2>/dev/null
sleep 3   # the competitor's context is gone and NVML's utilization window has passed

# 3. idle again
timeout 60 $PY -m afddiag gpu --load --json --no-history --baseline "$BASE" > "$D/gpu-load-idle.json" 2>"$TMP/idle.err"
echo "$?" > "$TMP/idle.rc"

# 4. what each run said
$PY - "$D" "$TMP" > "$D/summary.txt" 2>&1 <<'EOF'
import json, sys
d, tmp = sys.argv[1], sys.argv[2]
for name, rc in (("gpu-load-busy", "busy"), ("gpu-expert-busy", "expert"), ("gpu-load-idle", "idle")):
    try:
        rep = json.load(open(f"{d}/{name}.json"))
    except Exception as e:  # noqa: BLE001
        print(f"{name}: no report ({e}); stderr: {open(f'{tmp}/{rc}.err').read()[-400:]}")
        continue
    code = open(f"{tmp}/{rc}.rc").read().strip()
    slow = next((g for g in rep["gates"] if g["id"] == "gpu.slow-state"), {})
    print(f"{name}: exit {code}; gpu.slow-state {slow.get('verdict')} [{slow.get('action')}]: {slow.get('summary')}")
    for x in rep.get("diagnosis", []):
        print(f"    diagnosis: {x['verdict']} {x['gate']} [{x['action']}{', drain' if x.get('drain') else ''}]")
    bad = [x["gate"] for x in rep.get("diagnosis", []) if x["action"] == "AC_POWER_CYCLE"]
    print(f"    AC_POWER_CYCLE advised: {bad or 'no'}")
print("baseline record (idle):", open(f"{d}/baseline-record.txt").read().strip().splitlines()[-1])
print("baseline record (busy):", open(f"{d}/baseline-record-busy.txt").read().strip().splitlines()[-1])
EOF
cat "$D/summary.txt"
rm -rf "$TMP"
