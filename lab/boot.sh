#!/usr/bin/env bash
# Boot the lab kernel once under QEMU (virtme-ng, host root shared read-only) and run every scenario
# of lab/run-scenario.py inside it. Results land in OUTDIR (default <repo>/.lab-cache/out):
# no-map.json, map.json, peer-gone.json, results.json, run.log; the console goes to OUTDIR/console.log.
#
#   bash lab/setup.sh          # once per machine (as root)
#   bash lab/boot.sh [OUTDIR]
#
# Environment: AFDDIAG_LAB_KERNEL (which kernel: "6.1", the default, Debian 12's kernel; "bpo", the
# trixie-backports kernel whose rxe moves data between network namespaces; or a path to a vmlinuz whose
# modules are installed in /lib/modules/<ver>, <ver> taken from its name vmlinuz-<ver> or its folder
# .../modules/<ver>/vmlinuz), AFDDIAG_LAB_PYTHON (the guest's Python; default <repo>/.venv/bin/python, which must
# see Debian's python3-pyverbs: a venv made with --system-site-packages), AFDDIAG_LAB_KVM=1 to use
# KVM (default off: nested KVM does not work on the CI machines), AFDDIAG_LAB_TIMEOUT (seconds, 540),
# AFDDIAG_LAB_SCRIPT (the guest script, default lab/run-scenario.py; it gets OUTDIR as its argument and
# must write OUTDIR/results.json). Boots are serialised with flock on /tmp/afddiag-lab.lock: two QEMU
# guests under TCG on a 2-core machine would each run past their time.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${AFDDIAG_LAB_CACHE:-$REPO/.lab-cache}"
OUTDIR="${1:-$CACHE/out}"
TIMEOUT="${AFDDIAG_LAB_TIMEOUT:-540}"

if [ ! -f "$CACHE/kernel.env" ]; then
  echo "lab/boot.sh: lab not set up ($CACHE/kernel.env missing): run lab/setup.sh as root" >&2
  exit 3
fi
# shellcheck disable=SC1091
. "$CACHE/kernel.env"
KERNEL="${AFDDIAG_LAB_KERNEL:-6.1}"
case "$KERNEL" in
  6.1) ;;
  bpo)
    if [ -z "${LAB_VMLINUZ_BPO:-}" ]; then
      echo "lab/boot.sh: no trixie-backports kernel in $CACHE/kernel.env: run lab/setup.sh (as root) again" >&2
      exit 3
    fi
    LAB_KVER="$LAB_KVER_BPO" LAB_VMLINUZ="$LAB_VMLINUZ_BPO" ;;
  */*)
    LAB_VMLINUZ="$KERNEL"
    case "$(basename "$KERNEL")" in
      vmlinuz-*) LAB_KVER="$(basename "$KERNEL")"; LAB_KVER="${LAB_KVER#vmlinuz-}" ;;
      *) LAB_KVER="$(basename "$(dirname "$KERNEL")")" ;;
    esac
    [ -f "/lib/modules/$LAB_KVER/modules.dep" ] ||
      { echo "lab/boot.sh: AFDDIAG_LAB_KERNEL=$KERNEL: no /lib/modules/$LAB_KVER/modules.dep (name it vmlinuz-<ver>)" >&2; exit 64; }
    ;;
  *) echo "lab/boot.sh: AFDDIAG_LAB_KERNEL=$KERNEL: give 6.1, bpo or a path to a vmlinuz" >&2; exit 64 ;;
esac
[ -s "$LAB_VMLINUZ" ] || { echo "lab/boot.sh: $LAB_VMLINUZ missing: run lab/setup.sh" >&2; exit 3; }
[ -x "$LAB_VNG" ] || { echo "lab/boot.sh: $LAB_VNG missing: run lab/setup.sh" >&2; exit 3; }

PY="${AFDDIAG_LAB_PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY=/usr/bin/python3

mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
rm -f "$OUTDIR"/*.json "$OUTDIR"/run.log "$OUTDIR"/console.log

KVM_OPT=(--disable-kvm)
[ "${AFDDIAG_LAB_KVM:-0}" = 1 ] && KVM_OPT=()

export PATH="$(dirname "$LAB_VNG"):$PATH"
start=$(date +%s)
rc=0
cd "$REPO"
SCRIPT="${AFDDIAG_LAB_SCRIPT:-$REPO/lab/run-scenario.py}"
exec 9>/tmp/afddiag-lab.lock
flock 9
timeout "$TIMEOUT" "$LAB_VNG" --run "$LAB_VMLINUZ" "${KVM_OPT[@]}" --user root \
  --memory 2G --cpus "$(nproc 2>/dev/null | awk '{print ($1>4)?4:$1}')" \
  --rwdir "$OUTDIR" \
  --exec "$PY $SCRIPT $OUTDIR" >"$OUTDIR/console.log" 2>&1 || rc=$?
echo "lab/boot.sh: kernel $LAB_KVER, vng exit $rc, $(( $(date +%s) - start ))s; results in $OUTDIR" >&2
if [ ! -f "$OUTDIR/results.json" ]; then
  echo "lab/boot.sh: no results.json: the guest did not finish; console tail:" >&2
  tail -40 "$OUTDIR/console.log" >&2 || true
  exit 4
fi
exit "$rc"
