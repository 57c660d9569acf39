"""``playbooks/slurm/healthcheck.sh``, the HealthCheckProgram for sites without NHC (issue 25).

slurmd kills a HealthCheckProgram after 60 s and ignores its exit code. The script is run here as
slurmd runs it (bash, root's environment without SLURM_CONF) with fake ``scontrol``, ``sinfo`` and
``logger`` on PATH recording their arguments, and an ``afddiag`` stub standing for a run that hangs,
cannot start, or finishes. (The drains ``afddiag preflight --drain`` makes itself are tested on recorded
cases in ``tests/test_slurm.py``.)
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HC = REPO / "playbooks" / "slurm" / "healthcheck.sh"
SLURM_KILL_S = 60
NODE = "gpu-node-7"


def _exe(path: Path, text: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(0o755)
    return path


@pytest.fixture
def node(tmp_path):
    """A node's tools: fake scontrol (argv and SLURM_CONF, one call a block ending with '--'), sinfo
    (prints sinfo.out), logger (its stdin and argv lines), and an afddiag stub whose body a test sets."""
    b = tmp_path / "bin"
    b.mkdir()
    log = tmp_path / "log"
    _exe(b / "scontrol", f'{{ echo "SLURM_CONF=${{SLURM_CONF:-}}"; printf "%s\\n" "$@"; echo --; }} '
         f'>> {log}/scontrol\n')
    _exe(b / "sinfo", f'printf "%s\\n" "$*" >> {log}/sinfo.argv\n[ -n "${{FAKE_SINFO_SLEEP:-}}" ] && sleep '
         f'"$FAKE_SINFO_SLEEP"\ncat {tmp_path}/sinfo.out\n')
    _exe(b / "logger", f'{{ printf "ARGV %s\\n" "$*"; [ "$#" -le 3 ] && cat; }} >> {log}/logger\n')
    log.mkdir()
    (tmp_path / "sinfo.out").write_text("idle|none\n")

    class Node:
        bin, logs, root = b, log, tmp_path

        def afddiag(self, body: str) -> Path:
            return _exe(b / "afddiag", f'printf "%s\\n" "$*" >> {log}/afddiag.argv\n' + body)

        def run(self, **env: str) -> tuple[subprocess.CompletedProcess, float]:
            base = {"PATH": f"{b}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURMD_NODENAME": NODE,
                    "AFDDIAG": str(b / "afddiag"), "AFDDIAG_STEP": "2"}
            t0 = time.monotonic()
            p = subprocess.run(["bash", str(HC)], capture_output=True, text=True, timeout=SLURM_KILL_S,
                               env={**base, **env})
            return p, time.monotonic() - t0

        def read(self, name: str) -> str:
            p = log / name
            return p.read_text() if p.exists() else ""

        def scontrol_calls(self) -> list[list[str]]:
            blocks = self.read("scontrol").split("--\n")
            return [b.splitlines() for b in blocks if b.strip()]

    return Node()


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_hung_run_drains_the_node_within_its_bound_and_leaves_nothing_running(node):
    pids = node.root / "pids"
    node.afddiag(f"sleep 300 & echo $! >> {pids}\necho $$ >> {pids}\nwait\n")  # hangs, with a child
    p, wall = node.run(AFDDIAG_TIMEOUT="3")
    assert p.returncode == 0  # slurmd ignores it; the drain is what counts
    reason = "afddiag: healthcheck: run not finished in 3 s"
    assert node.scontrol_calls() == [["SLURM_CONF=", "update", f"nodename={NODE}", "state=drain", f"reason={reason}"]]
    assert f"drained {NODE} (reason={reason})" in node.read("logger")
    assert "ARGV -t afddiag" in node.read("logger")
    assert wall < 3 + 2 + 3 * 2 + 5  # the bound, timeout's grace, three 2 s steps, start-up
    left = list(map(int, pids.read_text().split()))
    for _ in range(50):  # a signalled process may take a moment to go under load
        left = [pid for pid in left if _alive(pid)]
        if not left:
            break
        time.sleep(0.1)
    assert left == []


@pytest.mark.parametrize("line", ["drained|bad DIMM", "down*|Not responding", "drained|afddiag: fabric.link: DOWN"])
def test_a_hung_run_never_replaces_a_drain_already_there(node, line):
    (node.root / "sinfo.out").write_text(line + "\n")
    node.afddiag("sleep 300\n")
    node.run(AFDDIAG_TIMEOUT="2")
    assert node.scontrol_calls() == []
    assert "left as it is; run not finished in 2 s" in node.read("logger")


def test_unreadable_state_drains_nothing_and_says_so(node):
    node.afddiag("sleep 300\n")
    p, wall = node.run(AFDDIAG_TIMEOUT="2", FAKE_SINFO_SLEEP="30")  # sinfo hangs too: each call cut at 2 s
    assert node.scontrol_calls() == []
    assert f"node {NODE}'s state not read" in node.read("logger")
    assert wall < 2 + 2 + 3 * 3 + 5


def test_afddiag_that_cannot_start_drains(node):
    p, _ = node.run(AFDDIAG=str(node.root / "no-such-afddiag"))
    assert node.scontrol_calls()[0][-1] == "reason=afddiag: healthcheck: afddiag not runnable (exit 127)"


def test_a_finished_run_is_left_to_preflight_and_its_lines_go_to_syslog(node):
    node.afddiag('echo "afddiag preflight: generic on gpu-node-7: OK (9 pass, 0 warn, 20 skip)"\nexit 0\n')
    node.run()
    assert node.scontrol_calls() == []
    assert "afddiag preflight: generic on gpu-node-7: OK" in node.read("logger")
    assert node.read("afddiag.argv").split()[:3] == ["preflight", "--drain", "--resume"]


def test_a_busy_node_is_judged_without_the_load_probe(node):
    (node.root / "sinfo.out").write_text("mixed|none\n")
    node.afddiag("exit 0\n")
    node.run()
    assert "--no-load" in node.read("afddiag.argv").split()


def test_scontrol_gets_a_slurm_conf(node, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lab\n")
    node.afddiag("exec sleep 300\n")
    node.run(AFDDIAG_TIMEOUT="1", AFDDIAG_SLURM_CONF=str(conf))
    assert node.scontrol_calls()[0][0] == f"SLURM_CONF={conf}"
    # preflight's own scontrol and sinfo calls inherit it: the stub sees it in its environment
    node.afddiag(f'echo "$SLURM_CONF" > {tmp_path}/seen\nexit 0\n')
    node.run(AFDDIAG_SLURM_CONF=str(conf))
    assert (tmp_path / "seen").read_text().strip() == str(conf)


@pytest.mark.parametrize("asked,used", [(None, 35), ("20", 20), ("120", 40), ("junk", 35)])
def test_the_worst_case_path_fits_under_slurms_kill(node, asked, used):
    """Every bounded call on the longest path (sinfo, afddiag timed out, sinfo, scontrol), summed with
    each `timeout -k` grace, stays under 60 s; an AFDDIAG_TIMEOUT that would not is cut and said."""
    tlog = node.logs / "timeout"
    # a `timeout` that records its bound and, for afddiag, answers as a run that hit it (no waiting)
    _exe(node.bin / "timeout", f'printf "%s\\n" "$*" >> {tlog}\nargs=("$@")\n'
         'while [ "${1:-}" != "${1#-}" ]; do [ "$1" = -k ] && shift; shift; done\nshift\n'
         f'case "$1" in */afddiag) exit 124 ;; esac\nexec /usr/bin/timeout "${{args[@]}}"\n')
    node.afddiag("exit 0\n")
    node.run(**({} if asked is None else {"AFDDIAG_TIMEOUT": asked}), AFDDIAG_STEP="4")
    total = 0.0
    for call in tlog.read_text().splitlines():
        m = re.match(r"-k (\d+) (\d+) (\S+)", call)
        assert m, call
        total += int(m.group(1)) + int(m.group(2))
        if m.group(3).endswith("afddiag"):
            assert int(m.group(2)) == used
    assert len(tlog.read_text().splitlines()) == 4  # sinfo, afddiag, sinfo, scontrol
    assert total < SLURM_KILL_S, tlog.read_text()
    if asked == "120":
        assert "would outlive Slurm's 60 s kill: using 40" in node.read("logger")

