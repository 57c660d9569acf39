#!/usr/bin/env bash
# Example expert-rank launcher with the afddiag preflight hook. Ranks start worker-first: 3, 2, 1, 0.
#
#   playbooks/launch-expert.sh ENV_FILE RANK [engine args...]
#
# Refuses to start (non-zero exit, reason on stderr) without a fabric address or when afddiag finds
# the host unfit (any FAIL or ERROR; WARN passes unless AFDDIAG_STRICT=1). On success it exports the
# device map and the NCCL/UCX device selection afddiag prints, then starts the engine.
# AFDDIAG, AFDDIAG_ARGS, AFD_ENGINE_CMD as in launch-coordinator.sh.
set -euo pipefail
ENV_FILE="${1:?usage: launch-expert.sh ENV_FILE RANK [engine args...]}"
RANK="${2:?usage: launch-expert.sh ENV_FILE RANK [engine args...]}"
shift 2
case "$RANK" in 0|1|2|3) ;; *) echo "launch-expert: RANK must be 0..3, not $RANK" >&2; exit 64 ;; esac
AFDDIAG="${AFDDIAG:-afddiag}"
# The file is sourced only after afddiag has read it: afddiag refuses any line the shell would not
# set literally (a metacharacter, $(...), backticks, CR), so sourcing first could run its commands.
if ! grep -Eq '^[[:space:]]*(export[[:space:]]+)?AFD_FABRIC_IP=[^[:space:]#]' "$ENV_FILE"; then
  echo "launch-expert: rank $RANK: AFD_FABRIC_IP is not set in $ENV_FILE: refusing to start" >&2
  exit 78
fi
strict=(); [ "${AFDDIAG_STRICT:-0}" = 1 ] && strict=(--strict)
# shellcheck disable=SC2086
rc=0
exports="$($AFDDIAG preflight --role expert --launch-env "$ENV_FILE" --export "${strict[@]}" ${AFDDIAG_ARGS:-})" || rc=$?
if [ "$rc" != 0 ]; then
  echo "launch-expert: rank $RANK: afddiag preflight says this host is not fit (exit $rc): refusing to start" >&2
  exit "$rc"
fi
set -a
# shellcheck disable=SC1090
. "$ENV_FILE"
set +a
if [ -z "${AFD_FABRIC_IP:-}" ]; then
  echo "launch-expert: rank $RANK: AFD_FABRIC_IP is not set in $ENV_FILE: refusing to start" >&2
  exit 78
fi
eval "$exports"
echo "launch-expert: rank $RANK: ${DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP:-no device map} NCCL_IB_HCA=${NCCL_IB_HCA:-} capacity=${AFD_EXPERT_CAPACITY:-1024}" >&2
exec ${AFD_ENGINE_CMD:-echo would start: expert} --rank "$RANK" --capacity "${AFD_EXPERT_CAPACITY:-1024}" --fabric-ip "$AFD_FABRIC_IP" "$@"
