#!/usr/bin/env bash
# Slurm HealthCheckProgram example: drain this node when afddiag finds it unfit and resume it when it
# is fit again, as LBNL NHC does.
#
# slurm.conf:   HealthCheckProgram=/usr/local/sbin/afddiag-healthcheck   (this file, mode 0755, root)
#               HealthCheckInterval=300
#               HealthCheckNodeState=ANY,CYCLE
#
# slurmd runs it as root every HealthCheckInterval seconds and IGNORES its exit code, so the drain is
# done here. One `afddiag preflight` run:
#   --drain   unfit: scontrol update nodename=$SLURMD_NODENAME state=drain reason="afddiag: <failing gates>"
#             (a node someone else drained or downed is left as it is: their reason is never overwritten)
#   --resume  fit: scontrol update nodename=$SLURMD_NODENAME state=resume, only when the reason starts
#             with "afddiag:" (afddiag drained it)
#   --prom    the same run's verdicts for node_exporter's textfile collector, when AFDDIAG_PROM is set
#   --no-load on a node running jobs (sinfo says allocated, mixed or completing): the GPU load probe
#             would compete with them, so gpu.slow-state is judged without it
# AFDDIAG_SCONTROL / AFDDIAG_SINFO override the scontrol / sinfo commands (e.g. "sudo -n scontrol").
#
# Environment: AFDDIAG, AFDDIAG_ROLE, AFDDIAG_ARGS, AFDDIAG_STRICT, AFDDIAG_TIMEOUT as in prolog.sh;
# AFDDIAG_PROM=/var/lib/node_exporter/textfile/afddiag.prom also writes the metrics.
set -u
AFDDIAG="${AFDDIAG:-afddiag}"
SINFO="${AFDDIAG_SINFO:-sinfo}"
node="${SLURMD_NODENAME:-$(hostname -s)}"
args=(preflight --drain --resume)
[ -n "${AFDDIAG_ROLE:-}" ] && args+=(--role "$AFDDIAG_ROLE")
[ "${AFDDIAG_STRICT:-0}" = 1 ] && args+=(--strict)
[ -n "${AFDDIAG_PROM:-}" ] && args+=(--prom "$AFDDIAG_PROM")
# shellcheck disable=SC2086  # SINFO is a word list on purpose
state="$($SINFO -h -N -n "$node" -o %T 2>/dev/null | head -n1)"
case "$state" in
  alloc*|mix*|completing*) args+=(--no-load) ;;
esac
# shellcheck disable=SC2086  # AFDDIAG and AFDDIAG_ARGS are word lists on purpose
timeout "${AFDDIAG_TIMEOUT:-120}" $AFDDIAG "${args[@]}" ${AFDDIAG_ARGS:-}
rc=$?
[ "$rc" -eq 124 ] && echo "afddiag healthcheck: preflight timed out; node not judged" >&2
exit 0
