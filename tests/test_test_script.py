"""scripts/test.sh says what it will change on the host before changing it, installs only what is
missing without upgrading unrelated packages, and keeps its output short (issue 23). Run against stub
apt-get, dpkg-query, set-up scripts and pytest in a copy of the repository's scripts: nothing here
touches this machine's packages."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

APT = r"""#!/usr/bin/env bash
echo "apt-get $*" >>"$CALLS"
case " $* " in
  *" -s "*)  # the simulation: each named package new, one dependency new, one installed package upgraded
    for p in "$@"; do case "$p" in -*|install|*=*) ;; *) echo "Inst $p (1.0 Debian:12 [amd64])";; esac; done
    echo "Inst libnew0 (2.0 Debian:12 [amd64])"
    echo "Inst openssh-client [1:9.2p1-2+deb12u6] (1:9.2p1-2+deb12u10 Debian:12 [amd64])";;
  *" install "*)
    for i in $(seq 200); do echo "Unpacking package-$i (1.0) ..."; done
    if [ -n "${FAIL_INSTALL:-}" ]; then echo "E: Unable to fetch some archives (stub)" >&2; exit 100; fi;;
  *" update "*) for i in $(seq 30); do echo "Get:$i http://deb.debian.org/debian bookworm InRelease"; done;;
esac
"""
STUB_SETUP = r"""#!/usr/bin/env bash
if [ "${1:-}" = --packages ]; then exec bash "$REAL" --packages; fi
echo "$NAME $*" >>"$CALLS"
for i in $(seq 50); do echo "noise $i" >&2; done
echo "$READY"
"""


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A copy of scripts/test.sh beside stub set-up scripts (the real package lists) and a stub pytest."""
    r = tmp_path / "repo"
    (r / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "test.sh", r / "scripts" / "test.sh")
    _exe(r / "scripts" / "setup.sh", STUB_SETUP.replace("$REAL", str(REPO / "scripts" / "setup.sh"))
         .replace("$NAME", "setup.sh").replace("echo \"$READY\"", "echo 'setup: ready (stub)' >&2"))
    _exe(r / "lab" / "setup.sh", STUB_SETUP.replace("$REAL", str(REPO / "lab" / "setup.sh"))
         .replace("$NAME", "lab/setup.sh").replace("$READY", "6.1.0-99-amd64 6.12.99+bpo-amd64"))
    _exe(r / ".venv" / "bin" / "python", '#!/usr/bin/env bash\necho "python $*" >>"$CALLS"\n')
    _exe(tmp_path / "bin" / "apt-get", APT)
    _exe(tmp_path / "bin" / "dpkg-query", "#!/usr/bin/env bash\nexit 1\n")  # nothing installed: a fresh machine
    _exe(tmp_path / "bin" / "sudo", '#!/usr/bin/env bash\necho "sudo $*" >>"$CALLS"\nexec "$@"\n')
    return r


def _run(repo: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = repo.parent / "calls"
    calls.write_text("")
    e = {**os.environ, "PATH": f"{repo.parent / 'bin'}:{os.environ['PATH']}", "CALLS": str(calls),
         "TMPDIR": str(repo.parent), "AFDDIAG_LAB_CACHE": str(repo / ".lab-cache"), **env}
    p = subprocess.run(["bash", str(repo / "scripts" / "test.sh"), *args], capture_output=True, text=True, env=e,
                       timeout=60)
    return p, calls.read_text().splitlines()


def _packages() -> list[str]:
    out: list[str] = []
    for s in ("scripts/setup.sh", "lab/setup.sh"):
        out += subprocess.run(["bash", str(REPO / s), "--packages"], capture_output=True, text=True,
                              check=True).stdout.split()
    return list(dict.fromkeys(out))


def test_plan_names_every_change_and_makes_none(repo):
    p, calls = _run(repo, "--plan")
    assert p.returncode == 0, p.stderr
    assert calls == []  # no apt, no set-up script, no pytest
    assert "this run changes this host" in p.stderr
    assert " ".join(_packages()) in p.stderr.replace("\n       ", " ")
    assert "/lib/modules" in p.stderr and "no apt-get upgrade" in p.stderr and ".venv" in p.stderr


def test_fresh_machine_installs_only_what_is_missing_quietly_then_runs_pytest(repo):
    p, calls = _run(repo, "-k", "x")
    assert p.returncode == 0, p.stderr
    apt = [c for c in calls if c.startswith("apt-get")]
    assert [c.split()[-1] if "update" in c else None for c in apt[:1]] == ["update"]
    sim, install = apt[1], apt[2]
    assert " -s install " in sim and len(apt) == 3
    assert install.split()[-len(_packages()):] == _packages()
    assert "--no-upgrade" in install.split() and "--no-install-recommends" in install.split()
    assert not any(w in c.split() for c in apt for w in ("upgrade", "dist-upgrade", "full-upgrade"))
    assert [c.split()[0] for c in calls if not c.startswith("apt-get")] == ["setup.sh", "lab/setup.sh", "python"]
    assert calls[-1] == "python -m pytest -ra -k x"
    lines = p.stderr.splitlines()
    assert lines[0].startswith("test.sh: this run changes this host")  # said before anything changed
    assert "Unpacking" not in p.stderr and "noise" not in p.stderr and "Get:" not in p.stderr
    assert len(lines) <= 16, p.stderr
    assert any("require upgrading installed ones: openssh-client 1:9.2p1-2+deb12u6 -> 1:9.2p1-2+deb12u10" in x
               for x in lines)
    assert any(x.startswith(f"test.sh: apt: installed {len(_packages())} packages and 1 dependencies") for x in lines)
    assert any("kernels 6.1.0-99-amd64 and 6.12.99+bpo-amd64 ready" in x for x in lines)


def test_a_failed_install_shows_the_logs_tail_and_stops(repo):
    p, calls = _run(repo, FAIL_INSTALL="1")
    assert p.returncode == 1
    assert "apt-get install failed" in p.stderr and "E: Unable to fetch some archives (stub)" in p.stderr
    assert len(p.stderr.splitlines()) <= 60
    assert not any(c.startswith(("setup.sh", "lab/setup.sh", "python")) for c in calls)


def test_nothing_missing_means_no_apt_at_all(repo):
    _exe(repo.parent / "bin" / "dpkg-query", "#!/usr/bin/env bash\necho -n 'install ok installed'\n")
    p, calls = _run(repo)
    assert p.returncode == 0, p.stderr
    assert not any(c.startswith("apt-get") for c in calls)
    assert "apt: nothing" in p.stderr
