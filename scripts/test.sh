#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian 12 machine (as root, or with sudo): installs afddiag
# (scripts/setup.sh), sets up the soft-RoCE lab (lab/setup.sh: QEMU, Debian's 6.1 kernel and
# trixie-backports' newest kernel with rdma_rxe, virtme-ng), then runs pytest, the lab tests included
# (one guest boot per lab test module). Extra arguments go to pytest.
#
#   ./scripts/test.sh          (as root; otherwise it calls sudo for the installs only)
#   ./scripts/test.sh --plan   say what it would install and change on this host, and change nothing
#
# Before changing anything it says what it will change: the missing packages (installed with
# --no-install-recommends --no-upgrade; never `apt-get upgrade`; an installed package is upgraded only
# where a new one requires it, and that is named first), the lab kernels and their modules in
# /lib/modules, the two venvs. apt's and pip's output go to a log; a summary line each; on a failure,
# the log's tail.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
PLAN=0; if [ "${1:-}" = --plan ]; then PLAN=1; shift; fi
CACHE="${AFDDIAG_LAB_CACHE:-$REPO/.lab-cache}"
say() { echo "test.sh: $*" >&2; }

# What is missing: the packages both set-up scripts install (each lists its own), the kernels, the venvs.
mapfile -t PKGS < <({ bash scripts/setup.sh --packages; bash lab/setup.sh --packages; } | awk '!seen[$0]++')
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
kernels_ready() {  # both lab kernels unpacked in the cache, their modules installed (lab/setup.sh's test)
  [ -f "$CACHE/kernel.env" ] || return 1
  local kv kb; kv="$(sed -n 's/^LAB_KVER=//p' "$CACHE/kernel.env")"; kb="$(sed -n 's/^LAB_KVER_BPO=//p' "$CACHE/kernel.env")"
  [ -n "$kv" ] && [ -n "$kb" ] && [ -f "/lib/modules/$kv/modules.dep" ] && [ -f "/lib/modules/$kb/modules.dep" ]
}

{
  echo "test.sh: this run changes this host as follows (--plan: says it and stops):"
  if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null; then
    echo "  apt: refresh the package lists, then install ${#missing[@]} missing packages and what they need"
    echo "       (--no-install-recommends --no-upgrade; no apt-get upgrade): ${missing[*]}"
    services=""
    for p in "${missing[@]}"; do
      case "$p" in openssh-server) services+=" sshd (:22)";; prometheus) services+=" prometheus (:9090)";;
                   prometheus-node-exporter) services+=" node_exporter (:9100)";; munge) services+=" munged";;
                   slurmctld) services+=" slurmctld (:6817)";; slurmd) services+=" slurmd (:6818)";; esac
    done
    [ -z "$services" ] || echo "       where the host's init starts services, their packages start:$services"
  else
    echo "  apt: nothing (every package it needs is installed)"
  fi
  if kernels_ready; then
    echo "  kernels: nothing (both lab kernels are in $CACHE and /lib/modules)"
  else
    echo "  kernels: download Debian 12's kernel and trixie-backports' newest into $CACHE and copy their"
    echo "           modules into /lib/modules/<version> (about 0.5 GB); the host's own kernel is not touched"
  fi
  echo "  python: .venv in the repository (afddiag and its test extras, pip) and virtme-ng in $CACHE/vng-venv"
} >&2
[ "$PLAN" = 0 ] || exit 0

LOG="$(mktemp "${TMPDIR:-/tmp}/afddiag-test-setup.XXXXXX")"
failed() { say "$1 failed; the end of its log ($LOG):"; tail -n 40 "$LOG" >&2; exit 1; }

if [ "${#missing[@]}" -gt 0 ] && command -v apt-get >/dev/null; then
  apt=($SUDO env DEBIAN_FRONTEND=noninteractive apt-get -qq -o Dpkg::Use-Pty=0)
  "${apt[@]}" update >>"$LOG" 2>&1 || failed "apt-get update"
  sim="$("${apt[@]}" -s install --no-install-recommends --no-upgrade "${missing[@]}" 2>>"$LOG")" ||
    failed "apt-get install (simulated)"
  new="$(grep -c '^Inst [^ ]* (' <<<"$sim" || true)"
  upgraded="$(sed -n 's/^Inst \([^ ]*\) \[\([^]]*\)\] (\([^ ]*\).*/\1 \2 -> \3/p' <<<"$sim" | paste -sd, - | sed 's/,/, /g')"
  [ -z "$upgraded" ] || say "apt: the new packages require upgrading installed ones: $upgraded"
  t0=$SECONDS
  "${apt[@]}" install -y --no-install-recommends --no-upgrade "${missing[@]}" >>"$LOG" 2>&1 || failed "apt-get install"
  say "apt: installed ${#missing[@]} packages and $((new - ${#missing[@]} < 0 ? 0 : new - ${#missing[@]})) dependencies" \
      "in $((SECONDS - t0)) s${upgraded:+ (and upgraded the ones named above)}"
fi

t0=$SECONDS
AFDDIAG_NO_APT=1 bash scripts/setup.sh >>"$LOG" 2>&1 || failed "scripts/setup.sh"
say "$(grep '^setup: ready' "$LOG" | tail -n 1) in $((SECONDS - t0)) s"
t0=$SECONDS
kernels="$($SUDO bash lab/setup.sh 2>>"$LOG")" || failed "lab/setup.sh"
say "lab: kernels ${kernels/ / and } ready in $((SECONDS - t0)) s; set-up log: $LOG"
exec .venv/bin/python -m pytest -ra "$@"
