#!/usr/bin/env bash
# Set up the soft-RoCE lab on a Debian 12 host (as root, non-interactive, idempotent).
#
# - apt packages the lab needs (installed only when missing);
# - two kernels, each unpacked into $AFDDIAG_LAB_CACHE (default <repo>/.lab-cache; vmlinuz kept in
#   kroot-<ver>/boot/), its modules copied to /lib/modules/<ver> and depmod run (virtme-ng boots it with
#   the host root shared, and the guest loads modules from the host's /lib/modules):
#   - "6.1": the package the host's linux-image-amd64 depends on (Debian 12: linux-image-6.1.0-NN-amd64).
#     Its rxe keeps its UDP socket in the initial network namespace only;
#   - "bpo": the newest kernel of Debian's trixie-backports suite (linux-image-amd64's dependency there),
#     whose rxe has per-namespace sockets: RoCE traffic between network namespaces. Resolved and
#     downloaded with a private sources list and lists directory (<cache>/apt): the host's apt
#     configuration and lists are not touched;
# - virtme-ng (pinned) in its own venv, <cache>/vng-venv.
#
# Prints both kernel versions at the end; writes <cache>/kernel.env (LAB_KVER, LAB_VMLINUZ: 6.1;
# LAB_KVER_BPO, LAB_VMLINUZ_BPO: trixie-backports; LAB_VNG) for lab/boot.sh.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${AFDDIAG_LAB_CACHE:-$REPO/.lab-cache}"
VNG_VERSION="${AFDDIAG_LAB_VNG_VERSION:-1.42}"
BPO_SUITE="${AFDDIAG_LAB_BPO_SUITE:-trixie-backports}"
BPO_MIRROR="${AFDDIAG_LAB_BPO_MIRROR:-http://deb.debian.org/debian}"
export DEBIAN_FRONTEND=noninteractive

log() { echo "lab/setup: $*" >&2; }

# 1. apt packages, only those missing (`lab/setup.sh --packages` lists them and changes nothing).
PKGS=(qemu-system-x86 python3-pyverbs rdma-core ibverbs-providers ibverbs-utils kmod iproute2
      busybox-static python3-venv openssh-server openssh-sftp-server openssh-client  # sshd/ssh-keygen/sftp-server: fleet tests
      prometheus                                # promtool check metrics/rules: tests/test_prometheus.py, test_alert_rules.py
      prometheus-node-exporter                  # scrapes afddiag's textfiles: tests/test_textfile_collector.py
      munge slurmctld slurmd slurm-client       # a real Slurm cluster in network namespaces: tests/test_slurm_cluster.py
      chromium fonts-dejavu-core)               # headless page test: tests/test_html.py
if [ "${1:-}" = --packages ]; then printf '%s\n' "${PKGS[@]}"; exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "lab/setup.sh: run as root (it installs packages and writes /lib/modules)" >&2
  exit 1
fi
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
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
  apt-get install -y -qq --no-install-recommends --no-upgrade "${missing[@]}" >&2
fi

# 2. Kernels. A kernel already in the cache with its modules installed is left alone (no download);
#    modules already in /lib/modules are not rewritten (another worktree's guest may be using them).
APTD="$CACHE/apt"
BPO_APT=(-o "Dir::Etc::SourceList=$APTD/sources.list" -o "Dir::Etc::SourceParts=$APTD/empty"
         -o "Dir::State::Lists=$APTD/lists" -o "Dir::Cache=$APTD/cache" -o "Dir::Etc::Preferences=/dev/null"
         -o "Dir::Etc::PreferencesParts=$APTD/empty" -o APT::Architecture=amd64 -o "APT::Architectures::=amd64"
         -o Acquire::Languages=none -o Debug::NoLocking=1)
bpo_updated=0
bpo_update() {
  if [ "$bpo_updated" = 0 ]; then
    mkdir -p "$APTD/lists/partial" "$APTD/cache/archives/partial" "$APTD/empty"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $BPO_MIRROR $BPO_SUITE main" \
      >"$APTD/sources.list"
    apt-get "${BPO_APT[@]}" update -qq >&2
    bpo_updated=1
  fi
}
apt_opts() {  # the apt options for kernel $1: none (the host's apt) for 6.1, the private ones for bpo
  APT_OPTS=()
  if [ "$1" = bpo ]; then APT_OPTS=("${BPO_APT[@]}"); fi
}
kpkg() {  # the kernel package linux-image-amd64 depends on, for kernel $1 (empty when unresolved)
  apt_opts "$1"
  if [ "$1" = bpo ] && [ ! -f "$APTD/sources.list" ]; then return 0; fi
  apt-cache "${APT_OPTS[@]}" depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
kdebs() {  # what to download for kernel $1's package $2: it and its linux-*-<ver> dependencies
  local ver="${2#linux-image-}"
  apt_opts "$1"
  echo "$2"
  # Split layout (Debian 13 and later): linux-image-<ver> depends on linux-binary-<ver> (vmlinuz),
  # linux-modules-<ver> and linux-base-<ver> (modules.builtin, modules.order, config).
  apt-cache "${APT_OPTS[@]}" depends "$2" 2>/dev/null | awk -v suf="-$ver" '
    $1 ~ /Depends:$/ && $2 ~ /^linux-[a-z]+-/ && substr($2, length($2) - length(suf) + 1) == suf {print $2}'
}
modules_ready() {  # $1 = kernel version: modules (with rdma_rxe) installed and depmod'ed
  [ -f "/lib/modules/$1/modules.dep" ] &&
    ls "/lib/modules/$1/kernel/drivers/infiniband/sw/rxe/"rdma_rxe.ko* >/dev/null 2>&1
}
kernel_ready() { [ -s "$CACHE/kroot-$1/boot/vmlinuz-$1" ] && modules_ready "$1"; }
install_kernel() {  # $1 = 6.1|bpo: resolve, download and install when missing; sets KV and KZ
  local which="$1" pkg ver kroot tmp mods vmlinuz d
  pkg="$(kpkg "$which")"
  if [ -z "$pkg" ] || ! kernel_ready "${pkg#linux-image-}"; then
    # Cold path: refresh the lists first, so the name resolved is one the mirror still serves.
    if [ "$which" = bpo ]; then bpo_update; else apt_update; fi
    pkg="$(kpkg "$which")"
  fi
  [ -n "$pkg" ] || { echo "lab/setup.sh: cannot resolve linux-image-amd64's kernel package ($which)" >&2; exit 1; }
  ver="${pkg#linux-image-}"
  kroot="$CACHE/kroot-$ver"  # keeps boot/ only; the modules live in /lib/modules/$ver
  if ! kernel_ready "$ver"; then
    tmp="$kroot.tmp"
    rm -rf "$CACHE/deb" "$tmp"
    mkdir -p "$CACHE/deb" "$tmp"
    local debs=()
    mapfile -t debs < <(kdebs "$which" "$pkg" | sort -u)
    log "fetching ${debs[*]}"
    apt_opts "$which"
    # apt's sandbox user may not write here; apt then downloads as root (a warning, not an error).
    (cd "$CACHE/deb" && apt-get "${APT_OPTS[@]}" download -q "${debs[@]}" >&2)
    for d in "${debs[@]}"; do
      dpkg -x "$(ls "$CACHE/deb/${d}"_*.deb)" "$tmp"
    done
    # Old layout: boot/vmlinuz-<ver> and lib/modules/<ver>; split layout: usr/lib/modules/<ver>/vmlinuz.
    mods="$tmp/lib/modules/$ver"
    [ -d "$mods" ] || mods="$tmp/usr/lib/modules/$ver"
    vmlinuz="$tmp/boot/vmlinuz-$ver"
    [ -s "$vmlinuz" ] || vmlinuz="$mods/vmlinuz"
    [ -s "$vmlinuz" ] || { echo "lab/setup.sh: $pkg has no vmlinuz" >&2; exit 1; }
    ls "$mods/kernel/drivers/infiniband/sw/rxe/"rdma_rxe.ko* >/dev/null 2>&1 ||
      { echo "lab/setup.sh: $pkg has no rdma_rxe module" >&2; exit 1; }
    mkdir -p "$tmp/keep"
    mv "$vmlinuz" "$tmp/keep/vmlinuz-$ver"
    if ! modules_ready "$ver"; then
      # 3. Modules where the guest (host root shared) looks for them; indexed in the unpacked tree
      #    first, then moved in whole.
      log "installing modules to /lib/modules/$ver"
      depmod -b "${mods%/lib/modules/$ver}" "$ver"
      mkdir -p /lib/modules
      rm -rf "/lib/modules/$ver.new" "/lib/modules/$ver"
      cp -a "$mods" "/lib/modules/$ver.new"
      mv "/lib/modules/$ver.new" "/lib/modules/$ver"
    fi
    rm -rf "$kroot" && mkdir -p "$kroot" && mv "$tmp/keep" "$kroot/boot" && rm -rf "$tmp" "$CACHE/deb"
  fi
  KV="$ver"
  KZ="$kroot/boot/vmlinuz-$ver"
}
install_kernel 6.1
KVER="$KV" VMLINUZ="$KZ"
install_kernel bpo
KVER_BPO="$KV" VMLINUZ_BPO="$KZ"

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
LAB_KVER_BPO=$KVER_BPO
LAB_VMLINUZ_BPO=$VMLINUZ_BPO
LAB_VNG=$VENV/bin/vng
EOF
log "ready: kernels $KVER ($VMLINUZ) and $KVER_BPO ($VMLINUZ_BPO), $("$VENV/bin/vng" --version)"
echo "$KVER $KVER_BPO"
