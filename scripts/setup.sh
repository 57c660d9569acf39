#!/usr/bin/env bash
# Install afddiag on this host: Debian/Ubuntu packages it reads the host with, then a venv (.venv)
# on the distro Python made with --system-site-packages, so that the distro's python3-pyverbs
# (which matches the host's rdma-core) is importable, and afddiag installed into it.
#
#   ./scripts/setup.sh && .venv/bin/afddiag all     (as root; otherwise it calls sudo for apt only)
#
# Idempotent; installs only what is missing. AFDDIAG_NO_APT=1 skips the package step (no root).
# Shell completion (scripts/completion.sh): a normal user's own ~/.local/share/bash-completion (no sudo);
# root's the system locations under /usr/local/share; AFDDIAG_NO_COMPLETION=1 skips it.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PKGS=(python3 python3-venv python3-pip python3-pyverbs rdma-core ibverbs-providers iproute2 openssh-client)  # ssh/scp: fleet
if [ "${1:-}" = --packages ]; then printf '%s\n' "${PKGS[@]}"; exit 0; fi  # the list alone (scripts/test.sh)

if [ "${AFDDIAG_NO_APT:-0}" != 1 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    echo "setup: installing ${missing[*]}" >&2
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-upgrade "${missing[@]}" >&2
  fi
fi

PY=/usr/bin/python3  # the distro Python: python3-pyverbs is built for it
if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(0 if sys.base_prefix == "/usr" else 1)' 2>/dev/null; then
  rm -rf .venv
  "$PY" -m venv --system-site-packages .venv
fi
# compat mode: the editable install is a plain path entry (.pth), not an import hook that every start
# of every Python in .venv would load (about 13 ms: pathlib, importlib.util, ...); checks/ and playbooks/
# are then read from the source tree (afddiag/packaged.py).
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]' --config-settings editable_mode=compat 2>&1 | grep -v "^WARNING: Location" >&2 || true
.venv/bin/python -c 'import afddiag, click, rich, psutil, pynvml, ClusterShell.Task' || { echo "setup: afddiag did not install into .venv" >&2; exit 1; }
# pip byte-compiles what it installs, but not an editable install's sources: compile afddiag once, so
# that a run does not compile ~60 modules from source (about 40 ms here, more on a GPU host's Python;
# PYTHONDONTWRITEBYTECODE, set in many images, stops the interpreter from caching them itself).
.venv/bin/python -m compileall -q afddiag >/dev/null || true
"$REPO/scripts/completion.sh" "$REPO/.venv/bin/afddiag" || echo "setup: shell completion not installed" >&2
if .venv/bin/python -c 'import pyverbs' 2>/dev/null; then
  echo "setup: ready (.venv/bin/afddiag; pyverbs available)" >&2
else
  echo "setup: ready (.venv/bin/afddiag; pyverbs NOT importable: the QP gate will SKIP)" >&2
fi
