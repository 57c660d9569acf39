#!/usr/bin/env bash
# Slurm Prolog example: refuse to start a job on a node afddiag finds unfit.
#
# slurm.conf:   Prolog=/etc/slurm/prolog.d/afddiag.sh     (copy this file there, mode 0755, owned by root)
#               PrologFlags=Alloc                          (optional: run at allocation, not at the first step)
#
# slurmd runs the Prolog as root on every node of the allocation. A non-zero exit code makes Slurm
# drain the node (reason "Prolog error") and requeue the job, so here the exit code decides: this
# script exits with `afddiag preflight`'s code (0 fit; WARN passes unless AFDDIAG_STRICT=1; 2 FAIL,
# 3 ERROR, 64 usage error — a broken setup drains too, on purpose: fix the setup). The failing gates
# and their remedies go to stderr, which slurmd writes to its log; `scontrol show node` shows the drain.
#
# Environment (set in slurm.conf's PrologEpilogEnv... or edit the defaults below):
#   AFDDIAG       the afddiag command (default: afddiag on PATH)
#   AFDDIAG_ROLE  role playbook (coordinator, expert, generic; default: generic)
#   AFDDIAG_ARGS  extra arguments, e.g. "--launch-env /etc/afd/rank.env --no-qp"
#   AFDDIAG_STRICT=1  WARN fails too
#   AFDDIAG_TIMEOUT   seconds before the Prolog gives up (default 120; keep it below PrologEpilogTimeout)
set -u
AFDDIAG="${AFDDIAG:-afddiag}"
args=(preflight --exit-for drain)
[ -n "${AFDDIAG_ROLE:-}" ] && args+=(--role "$AFDDIAG_ROLE")
[ "${AFDDIAG_STRICT:-0}" = 1 ] && args+=(--strict)
# shellcheck disable=SC2086  # AFDDIAG and AFDDIAG_ARGS are word lists on purpose
timeout "${AFDDIAG_TIMEOUT:-120}" $AFDDIAG "${args[@]}" ${AFDDIAG_ARGS:-}
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "afddiag prolog: node ${SLURMD_NODENAME:-$(hostname -s)} not fit for job ${SLURM_JOB_ID:-?} (exit $rc): Slurm drains it" >&2
fi
exit "$rc"
