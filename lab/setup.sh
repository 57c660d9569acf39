#!/usr/bin/env bash
# Set up the soft-RoCE lab on a Debian 12 host (as root, non-interactive, idempotent).
#
# - apt packages the lab needs (installed only when missing);
# - Debian's 6.1 kernel (the package linux-image-amd64 depends on), unpacked into
#   $AFDDIAG_LAB_CACHE (default <repo>/.lab-cache), its modules copied to /lib/modules/<ver> and
#   depmod run (it ships rdma_rxe.ko; virtme-ng boots it with the host root shared, and the guest
#   loads modules from the host's /lib/modules);
# - virtme-ng (pinned) in its own venv, <cache>/vng-venv.
#
# Prints the kernel version at the end; writes <cache>/kernel.env (LAB_KVER, LAB_VMLINUZ, LAB_VNG)
# for lab/boot.sh.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${AFDDIAG_LAB_CACHE:-$REPO/.lab-cache}"
VNG_VERSION="${AFDDIAG_LAB_VNG_VERSION:-1.42}"
export DEBIAN_FRONTEND=noninteractive

log() { echo "lab/setup: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "lab/setup.sh: run as root (it installs packages and writes /lib/modules)" >&2
  exit 1
fi
mkdir -p "$CACHE"

# 1. apt packages, only those missing.
PKGS=(qemu-system-x86 python3-pyverbs rdma-core ibverbs-providers ibverbs-utils kmod iproute2
      busybox-static python3-venv openssh-server openssh-client)  # sshd/ssh-keygen: tests/test_fleet_ssh.py
missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
apt_updated=0
apt_update() { if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi; }
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  apt_update
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# 2. The kernel package linux-image-amd64 depends on (linux-image-6.1.0-NN-amd64).
kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
kernel_ready() {  # $1 = kernel version: vmlinuz kept and modules (with rdma_rxe) installed
  [ -s "$CACHE/kroot-$1/boot/vmlinuz-$1" ] && [ -f "/lib/modules/$1/modules.dep" ] &&
    ls "/lib/modules/$1/kernel/drivers/infiniband/sw/rxe/"rdma_rxe.ko* >/dev/null 2>&1
}
KPKG="$(kpkg || true)"
if [ -z "$KPKG" ] || ! kernel_ready "${KPKG#linux-image-}"; then
  # Cold path: refresh the lists first, so the name resolved is one the mirror still serves.
  apt_update
  KPKG="$(kpkg || true)"
fi
[ -n "$KPKG" ] || { echo "lab/setup.sh: cannot resolve linux-image-amd64's kernel package" >&2; exit 1; }
KVER="${KPKG#linux-image-}"
KROOT="$CACHE/kroot-$KVER"  # keeps boot/ only; the modules live in /lib/modules/$KVER
VMLINUZ="$KROOT/boot/vmlinuz-$KVER"
if ! kernel_ready "$KVER"; then
  log "fetching $KPKG"
  rm -rf "$CACHE/deb" "$KROOT.tmp"
  mkdir -p "$CACHE/deb"
  # apt's sandbox user may not write here; apt then downloads as root (a warning, not an error).
  (cd "$CACHE/deb" && apt-get download -q "$KPKG")
  dpkg -x "$CACHE"/deb/"$KPKG"_*.deb "$KROOT.tmp"
  ls "$KROOT.tmp/lib/modules/$KVER/kernel/drivers/infiniband/sw/rxe/"rdma_rxe.ko* >/dev/null 2>&1 ||
    { echo "lab/setup.sh: $KPKG has no rdma_rxe module" >&2; exit 1; }
  # 3. Modules where the guest (host root shared) looks for them.
  log "installing modules to /lib/modules/$KVER"
  depmod -b "$KROOT.tmp" "$KVER"  # index in the unpacked tree, then move it in whole
  mkdir -p /lib/modules
  rm -rf "/lib/modules/$KVER.new" "/lib/modules/$KVER"
  cp -a "$KROOT.tmp/lib/modules/$KVER" "/lib/modules/$KVER.new"
  mv "/lib/modules/$KVER.new" "/lib/modules/$KVER"
  rm -rf "$KROOT.tmp/lib" "$KROOT.tmp/usr" "$KROOT" && mv "$KROOT.tmp" "$KROOT"
  rm -rf "$CACHE/deb"
fi

# 4. virtme-ng in its own venv (vng calls virtme-run from PATH: boot.sh puts this bin first).
VENV="$CACHE/vng-venv"
if [ ! -x "$VENV/bin/vng" ] || ! "$VENV/bin/vng" --version 2>/dev/null | grep -q "$VNG_VERSION"; then
  log "installing virtme-ng==$VNG_VERSION into $VENV"
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "virtme-ng==$VNG_VERSION" >&2
fi

cat >"$CACHE/kernel.env" <<EOF
LAB_KVER=$KVER
LAB_VMLINUZ=$VMLINUZ
LAB_VNG=$VENV/bin/vng
EOF
log "ready: kernel $KVER ($VMLINUZ), $("$VENV/bin/vng" --version)"
echo "$KVER"
