#!/usr/bin/env bash
# Example coordinator launcher with the afddiag preflight hook.
#
#   playbooks/launch-coordinator.sh ENV_FILE [engine args...]
#
# Refuses to start (non-zero exit, reason on stderr) without a fabric address or when afddiag finds
# the host unfit (any FAIL or ERROR; WARN passes unless AFDDIAG_STRICT=1). On success it exports the
# device map and the NCCL/UCX device selection afddiag prints, then starts the engine.
# AFDDIAG (default: afddiag) is the command to run; AFDDIAG_ARGS adds flags (e.g. --expect-capacity 256);
# AFD_ENGINE_CMD is the engine (default: print what would start).
set -euo pipefail
ENV_FILE="${1:?usage: launch-coordinator.sh ENV_FILE [engine args...]}"
shift
AFDDIAG="${AFDDIAG:-afddiag}"
# The file is sourced only after afddiag has read it: afddiag refuses any line the shell would not
# set literally (a metacharacter, $(...), backticks, CR), so sourcing first could run its commands.
if ! grep -Eq '^[[:space:]]*(export[[:space:]]+)?AFD_FABRIC_IP=[^[:space:]#]' "$ENV_FILE"; then
  echo "launch-coordinator: AFD_FABRIC_IP is not set in $ENV_FILE: refusing to start" >&2
  exit 78
fi
strict=(); [ "${AFDDIAG_STRICT:-0}" = 1 ] && strict=(--strict)
# shellcheck disable=SC2086
rc=0
exports="$($AFDDIAG preflight --role coordinator --launch-env "$ENV_FILE" --export "${strict[@]}" ${AFDDIAG_ARGS:-})" || rc=$?
if [ "$rc" != 0 ]; then
  echo "launch-coordinator: afddiag preflight says this host is not fit (exit $rc): refusing to start" >&2
  exit "$rc"
fi
set -a
# shellcheck disable=SC1090
. "$ENV_FILE"
set +a
if [ -z "${AFD_FABRIC_IP:-}" ]; then
  echo "launch-coordinator: AFD_FABRIC_IP is not set in $ENV_FILE: refusing to start" >&2
  exit 78
fi
eval "$exports"
echo "launch-coordinator: ${DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP:-no device map} NCCL_IB_HCA=${NCCL_IB_HCA:-} batch=${AFD_PREFILL_CAPACITY:-1024}" >&2
exec ${AFD_ENGINE_CMD:-echo would start: coordinator} --batch "${AFD_PREFILL_CAPACITY:-1024}" --fabric-ip "$AFD_FABRIC_IP" "$@"
