#!/usr/bin/env bash
# Slurm HealthCheckProgram example: drain this node when afddiag finds it unfit, as LBNL NHC does.
#
# slurm.conf:   HealthCheckProgram=/usr/local/sbin/afddiag-healthcheck   (this file, mode 0755, root)
#               HealthCheckInterval=300
#               HealthCheckNodeState=ANY,CYCLE
#
# slurmd runs it as root every HealthCheckInterval seconds and IGNORES its exit code, so the drain is
# done here: `afddiag preflight --drain` runs
#   scontrol update nodename=$SLURMD_NODENAME state=drain reason="afddiag: <failing gates>"
# when the host is not fit (AFDDIAG_SCONTROL overrides the scontrol command, e.g. "sudo -n scontrol").
# Resume a fixed node by hand: scontrol update nodename=<node> state=resume
#
# Environment: AFDDIAG, AFDDIAG_ROLE, AFDDIAG_ARGS, AFDDIAG_STRICT, AFDDIAG_TIMEOUT as in prolog.sh;
# AFDDIAG_PROM=/var/lib/node_exporter/textfile/afddiag.prom also writes the verdicts for Prometheus
# (`afddiag all --format prometheus`; this second run adds a few seconds).
set -u
AFDDIAG="${AFDDIAG:-afddiag}"
args=(preflight --drain)
[ -n "${AFDDIAG_ROLE:-}" ] && args+=(--role "$AFDDIAG_ROLE")
[ "${AFDDIAG_STRICT:-0}" = 1 ] && args+=(--strict)
# shellcheck disable=SC2086
timeout "${AFDDIAG_TIMEOUT:-120}" $AFDDIAG "${args[@]}" ${AFDDIAG_ARGS:-}
rc=$?
if [ -n "${AFDDIAG_PROM:-}" ]; then
  role=()
  [ -n "${AFDDIAG_ROLE:-}" ] && role=(--role "$AFDDIAG_ROLE")
  # shellcheck disable=SC2086
  timeout "${AFDDIAG_TIMEOUT:-120}" $AFDDIAG all "${role[@]}" --no-history --format prometheus \
    --output "$AFDDIAG_PROM" ${AFDDIAG_ARGS:-} || true
fi
[ "$rc" -eq 124 ] && echo "afddiag healthcheck: preflight timed out; node not judged" >&2
exit 0
