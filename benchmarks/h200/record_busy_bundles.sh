#!/usr/bin/env bash
# Issue 12 fixtures: capture bundles (with the load probe) of one H200 busy with a competing torch job and
# of the same H200 idle, plus this host's idle baseline, so that CI (no GPU) replays real readings:
# tests/test_h200_busy_replay.py. Runs from the repository root on the GPU host (python3 with torch,
# click, rich, pynvml, psutil; nothing installed); writes $OUT/busy/{baseline.json,busy.tar.gz,
# idle.tar.gz,competitor.log,log.txt}; bounded to ~2 minutes.
#
#   OUT=/tmp/out bash benchmarks/h200/record_busy_bundles.sh
set -u
D="${OUT:?set OUT}/busy"
mkdir -p "$D"
TMP="$(mktemp -d)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" AFDDIAG_STATE_DIR="$TMP/state"
log() { echo "$(date -u +%T) $*" >> "$D/log.txt"; }

log "baseline record (idle)"
timeout 60 python3 -m afddiag baseline record --path "$D/baseline.json" >> "$D/log.txt" 2>&1; log "exit $?"

python3 benchmarks/h200/competitor.py 60 > "$D/competitor.log" 2>&1 &
CPID=$!
for _ in $(seq 1 60); do grep -q running "$D/competitor.log" 2>/dev/null && break; sleep 0.5; done
sleep 3
log "capture --load (busy)"
timeout 60 python3 -m afddiag capture --load -o "$D/busy.tar.gz" >> "$D/log.txt" 2>&1; log "exit $?"
kill "$CPID" 2>/dev/null; wait "$CPID" 2>/dev/null
sleep 3
log "capture --load (idle)"
timeout 60 python3 -m afddiag capture --load -o "$D/idle.tar.gz" >> "$D/log.txt" 2>&1; log "exit $?"
nvidia-smi --query-gpu=name,uuid,driver_version --format=csv >> "$D/log.txt" 2>&1
rm -rf "$TMP"
cat "$D/log.txt"
