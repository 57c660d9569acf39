"""Shell completion (issue 23): scripts/completion.sh (run by scripts/setup.sh) installs click's bash
completion into a normal user's own files without sudo, and only as root into the system location; the
installed script completes afddiag's commands and options."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "completion.sh"
NOBODY = 65534


def _wrapper(tmp_path):
    """An ``afddiag`` that any user can run: this Python on this checkout."""
    w = tmp_path / "bin" / "afddiag"
    w.parent.mkdir(parents=True)
    w.write_text(f"#!/bin/sh\ncd {REPO} && exec {sys.executable} -m afddiag \"$@\"\n")
    w.chmod(0o755)
    w.parent.chmod(0o755)
    return w


def _completes(script, afd, words: str, cword: int) -> list[str]:
    cmd = (f"source {script}; PATH={afd.parent}:$PATH; COMP_WORDS=({words}); COMP_CWORD={cword}; "
           "_afddiag_completion afddiag; printf '%s\\n' \"${COMPREPLY[@]}\"")
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60).stdout.split()


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.skipif(os.geteuid() != 0, reason="the system location is root's")
def test_root_installs_in_the_system_location_and_says_so(tmp_path):
    afd, home, prefix = _wrapper(tmp_path), tmp_path / "home", tmp_path / "usr-local"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "AFDDIAG_COMPLETION_PREFIX": str(prefix), "PATH": "/usr/bin:/bin"}
    p = subprocess.run(["bash", str(SCRIPT), str(afd)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "running as root" in p.stderr and str(prefix / "share") in p.stderr
    target = prefix / "share" / "bash-completion" / "completions" / "afddiag"
    assert target.is_file() and _files(home) == []
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert _completes(target, afd, "afddiag al", 1) == ["all"]
    assert "--gate" in _completes(target, afd, "afddiag all --ga", 2)


@pytest.fixture
def open_tmp():
    """A temporary folder every user can traverse (pytest's are 0700: no other user could reach a home there)."""
    d = Path(tempfile.mkdtemp(prefix="afddiag-completion-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() == 0 and not shutil.which("setpriv"), reason="needs a normal user")
def test_a_normal_user_gets_it_in_their_own_files_without_sudo(open_tmp):
    afd, home, prefix = _wrapper(open_tmp), open_tmp / "home", open_tmp / "usr-local"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "AFDDIAG_COMPLETION_PREFIX": str(prefix), "PATH": "/usr/bin:/bin",
           "XDG_DATA_HOME": "", "XDG_CONFIG_HOME": ""}
    env.pop("XDG_DATA_HOME")
    env.pop("XDG_CONFIG_HOME")
    argv = ["bash", str(SCRIPT), str(afd)]
    if os.geteuid() == 0:  # run it as nobody, in a home that is nobody's
        os.chown(home, NOBODY, NOBODY)
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "sudo" not in p.stderr and "root" not in p.stderr
    target = home / ".local" / "share" / "bash-completion" / "completions" / "afddiag"
    assert target.is_file() and not prefix.exists()  # nothing outside the user's own files
    assert [f for f in _files(home) if not f.startswith(".config/fish/")] == [
        ".local/share/bash-completion/completions/afddiag"]
    assert _completes(target, afd, "afddiag pre", 1) == ["preflight"]


def test_setup_runs_it_and_it_can_be_skipped(tmp_path):
    assert 'scripts/completion.sh" "$REPO/.venv/bin/afddiag"' in (REPO / "scripts" / "setup.sh").read_text()
    env = {**os.environ, "AFDDIAG_NO_COMPLETION": "1", "HOME": str(tmp_path), "AFDDIAG_COMPLETION_PREFIX":
           str(tmp_path / "p")}
    p = subprocess.run(["bash", str(SCRIPT), "/nonexistent/afddiag"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "not installed (AFDDIAG_NO_COMPLETION=1)" in p.stderr and _files(tmp_path) == []
