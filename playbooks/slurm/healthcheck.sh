#!/usr/bin/env bash
# Slurm HealthCheckProgram for sites WITHOUT LBNL NHC: drain this node when afddiag finds it unfit and
# resume it when it is fit again. A site that runs NHC keeps NHC in the one HealthCheckProgram slot and
# adds playbooks/slurm/nhc/afddiag.nhc to it instead (see README.md).
#
# slurm.conf:   HealthCheckProgram=/usr/local/sbin/afddiag-healthcheck   (this file, mode 0755, root)
#               HealthCheckInterval=300
#               HealthCheckNodeState=ANY,CYCLE
#
# slurmd runs it as root every HealthCheckInterval seconds, IGNORES its exit code and kills it after
# 60 s, so the drain is done here and everything fits in 60 s: each sinfo and scontrol call gets
# AFDDIAG_STEP (4 s) + 1 s grace, the afddiag run AFDDIAG_TIMEOUT (default 35 s, at most 40) + 2 s
# grace; the longest path (sinfo, a run that hits its bound, sinfo, scontrol) is 5 + 42 + 5 + 5 = 57 s.
# One `afddiag preflight` run:
#   --drain   unfit: scontrol update nodename=$SLURMD_NODENAME state=drain reason="afddiag: <gate>: <summary>"
#             (one line, at most 80 characters; a node someone else drained or downed is left as it is)
#   --resume  fit: scontrol update nodename=$SLURMD_NODENAME state=resume, only when the reason starts
#             with "afddiag:" (afddiag drained it)
#   --prom    the same run's verdicts for node_exporter's textfile collector, when AFDDIAG_PROM is set
#   --no-load on a node running jobs (sinfo says allocated, mixed or completing): the GPU load probe
#             would compete with them, so gpu.slow-state is judged without it
# A run that does not finish within its bound (or cannot start, or dies of a signal) judged nothing:
# the node is drained with reason "afddiag: healthcheck: <what happened>" (never over someone else's
# drain, nor over afddiag's own), and the next run that finishes fit resumes it. Every line afddiag
# prints and what this script does go to syslog (logger -t afddiag) and stderr.
# A HealthCheckProgram gets no SLURM_CONF: AFDDIAG_SLURM_CONF, else /etc/slurm/slurm.conf when it
# exists, is exported for sinfo and scontrol.
#
# Environment: AFDDIAG, AFDDIAG_ROLE, AFDDIAG_ARGS, AFDDIAG_STRICT as in prolog.sh; AFDDIAG_TIMEOUT
# (seconds, 1-40); AFDDIAG_PROM=/var/lib/node_exporter/textfile/afddiag.prom also writes the metrics;
# AFDDIAG_SCONTROL / AFDDIAG_SINFO override the scontrol / sinfo commands (e.g. "sudo -n scontrol").
set -u
AFDDIAG="${AFDDIAG:-afddiag}"
SINFO="${AFDDIAG_SINFO:-sinfo}"
SCONTROL="${AFDDIAG_SCONTROL:-scontrol}"
STEP="${AFDDIAG_STEP:-4}"
MAX_BOUND=40
node="${SLURMD_NODENAME:-$(hostname -s)}"

say() {  # one line to syslog and stderr
  logger -t afddiag -- "$*" 2>/dev/null
  echo "afddiag healthcheck: $*" >&2
}

if [ -n "${AFDDIAG_SLURM_CONF:-}" ]; then
  export SLURM_CONF="$AFDDIAG_SLURM_CONF"
elif [ -z "${SLURM_CONF:-}" ] && [ -r /etc/slurm/slurm.conf ]; then
  export SLURM_CONF=/etc/slurm/slurm.conf
fi

case "$STEP" in
  [1-5]) ;;
  *) STEP=4 ;;
esac
bound="${AFDDIAG_TIMEOUT:-35}"
case "$bound" in
  ''|*[!0-9]*|0) say "AFDDIAG_TIMEOUT=$bound is no whole number of seconds: using 35"; bound=35 ;;
esac
if [ "$bound" -gt "$MAX_BOUND" ]; then
  say "AFDDIAG_TIMEOUT=$bound would outlive Slurm's 60 s kill: using $MAX_BOUND"
  bound=$MAX_BOUND
fi

# shellcheck disable=SC2086  # SINFO and SCONTROL are word lists on purpose
node_line() { timeout -k 1 "$STEP" $SINFO -h -N -n "$node" -o '%T|%E' 2>/dev/null | head -n1; }

# Drain for a run that judged nothing, unless the node is already out of service (anyone's reason,
# afddiag's own included: a drain for a real fault keeps its reason).
drain_unjudged() {
  local why="$1" line state
  local reason="afddiag: healthcheck: $why"
  line="$(node_line)"
  if [ -z "$line" ] || [ "${line#*|}" = "$line" ]; then
    say "node $node's state not read ($SINFO): NOT drained ($reason)"
    return
  fi
  state="${line%%|*}"
  case "$state" in
    *drain*|*down*|*fail*|*maint*|*reboot*)
      say "node $node is already $state (reason: ${line#*|}): left as it is; $why"
      return ;;
  esac
  # shellcheck disable=SC2086
  if timeout -k 1 "$STEP" $SCONTROL update nodename="$node" state=drain reason="$reason" >/dev/null 2>&1; then
    say "drained $node (reason=$reason)"
  else
    say "$SCONTROL update nodename=$node state=drain failed: NOT drained ($reason)"
  fi
}

args=(preflight --drain --resume)
[ -n "${AFDDIAG_ROLE:-}" ] && args+=(--role "$AFDDIAG_ROLE")
[ "${AFDDIAG_STRICT:-0}" = 1 ] && args+=(--strict)
[ -n "${AFDDIAG_PROM:-}" ] && args+=(--prom "$AFDDIAG_PROM")
case "$(node_line)" in
  alloc*|mix*|completing*) args+=(--no-load) ;;
esac

out="$(mktemp -t afddiag-hc.XXXXXX 2>/dev/null)" || out=""
trap '[ -n "$out" ] && rm -f -- "$out"' EXIT
# timeout runs afddiag in its own process group and signals the whole group: nothing outlives the bound.
# shellcheck disable=SC2086  # AFDDIAG and AFDDIAG_ARGS are word lists on purpose
timeout -k 2 "$bound" $AFDDIAG "${args[@]}" ${AFDDIAG_ARGS:-} >"${out:-/dev/null}" 2>&1
rc=$?
if [ -n "$out" ]; then  # afddiag's own lines (verdict, faults, what it drained or resumed), bounded
  head -n 40 -- "$out" | cut -c1-400 | logger -t afddiag 2>/dev/null
  head -n 40 -- "$out" | cut -c1-400 >&2
fi
case "$rc" in
  124|137) drain_unjudged "run not finished in ${bound} s" ;;
  126|127) drain_unjudged "afddiag not runnable (exit $rc)" ;;
  64) drain_unjudged "afddiag refused its arguments (exit 64): check AFDDIAG_ARGS" ;;
  0|1|2|3) ;;  # judged: preflight drained or resumed as its verdict needs
  *) if [ "$rc" -gt 128 ]; then drain_unjudged "afddiag killed by signal $((rc - 128))"; fi ;;
esac
say "node $node: afddiag preflight exit $rc"
exit 0
