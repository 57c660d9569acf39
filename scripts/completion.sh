#!/usr/bin/env bash
# Install click's shell completion for afddiag (called by scripts/setup.sh; safe to run again).
#
#   scripts/completion.sh .venv/bin/afddiag
#
# As a normal user it writes only the user's own files, and calls no sudo:
#   bash: ${XDG_DATA_HOME:-~/.local/share}/bash-completion/completions/afddiag  (bash-completion loads it)
#   fish: ${XDG_CONFIG_HOME:-~/.config}/fish/completions/afddiag.fish          (when fish is installed)
# As root it writes the system locations under ${AFDDIAG_COMPLETION_PREFIX:-/usr/local} instead:
#   share/bash-completion/completions/afddiag, share/zsh/site-functions/_afddiag (zsh installed),
#   share/fish/vendor_completions.d/afddiag.fish (fish installed)
# and says so. AFDDIAG_NO_COMPLETION=1 skips it. Each file is written to a temporary name in its
# folder and renamed over the target (a link at the target is replaced, never followed).
set -euo pipefail
AFD="${1:?usage: scripts/completion.sh PATH/TO/afddiag}"
if [ "${AFDDIAG_NO_COMPLETION:-0}" = 1 ]; then
  echo "setup: shell completion not installed (AFDDIAG_NO_COMPLETION=1)" >&2
  exit 0
fi

install_one() {  # SHELL TARGET: click's completion script for SHELL, written to TARGET
  local shell=$1 target=$2 dir tmp
  dir=$(dirname "$target")
  mkdir -p "$dir"
  if [ "$(id -u)" != 0 ] && [ ! -O "$dir" ]; then
    echo "setup: $shell completion not installed: $dir is not yours" >&2
    return 0
  fi
  tmp=$(mktemp "$dir/.afddiag-completion.XXXXXX")
  if ! env "_AFDDIAG_COMPLETE=${shell}_source" "$AFD" > "$tmp" || [ ! -s "$tmp" ]; then
    rm -f "$tmp"
    echo "setup: $shell completion not installed: $AFD gave no completion script" >&2
    return 0
  fi
  chmod 0644 "$tmp"
  mv -f "$tmp" "$target"
  echo "setup: $shell completion installed: $target" >&2
}

if [ "$(id -u)" = 0 ]; then
  PREFIX="${AFDDIAG_COMPLETION_PREFIX:-/usr/local}"
  echo "setup: running as root: shell completion goes to the system locations under $PREFIX/share (every user)" >&2
  install_one bash "$PREFIX/share/bash-completion/completions/afddiag"
  if command -v zsh >/dev/null; then install_one zsh "$PREFIX/share/zsh/site-functions/_afddiag"; fi
  if command -v fish >/dev/null; then install_one fish "$PREFIX/share/fish/vendor_completions.d/afddiag.fish"; fi
else
  : "${HOME:?HOME is not set}"
  install_one bash "${XDG_DATA_HOME:-$HOME/.local/share}/bash-completion/completions/afddiag"
  if command -v fish >/dev/null; then install_one fish "${XDG_CONFIG_HOME:-$HOME/.config}/fish/completions/afddiag.fish"; fi
  if command -v zsh >/dev/null; then
    echo "setup: zsh: add 'eval \"\$(_AFDDIAG_COMPLETE=zsh_source afddiag)\"' to ~/.zshrc for completion" >&2
  fi
fi
