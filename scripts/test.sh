#!/usr/bin/env bash
# Run the whole test suite on a fresh Debian 12 machine (as root, or with sudo): installs afddiag
# (scripts/setup.sh), sets up the soft-RoCE lab (lab/setup.sh: QEMU, Debian's 6.1 kernel and
# trixie-backports' newest kernel with rdma_rxe, virtme-ng), then runs pytest, the lab tests included
# (one guest boot per lab test module). Extra arguments go to pytest.
#
#   ./scripts/test.sh      (as root; otherwise it calls sudo for the installs only)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
bash scripts/setup.sh
$SUDO bash lab/setup.sh >/dev/null
exec .venv/bin/python -m pytest -ra "$@"
