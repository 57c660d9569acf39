"""``playbooks/slurm/nhc/afddiag.nhc``, the LBNL NHC check module (issue 25).

NHC sources every ``*.nhc`` in its scripts folder and runs the ``nhc.conf`` lines that match the host;
a check fails by calling ``die <code> "<message>"``, which (under Slurm) runs NHC's node-mark-offline
helper: ``scontrol update ... Reason="NHC: <message>"``. Debian does not package NHC, so by default the
module is sourced by a minimal NHC-compatible harness (``die`` records its arguments and returns, as NHC
does with ``-a``; ``dbg`` prints nothing). Where the real NHC is installed (``nhc`` on PATH with its
``common.nhc``, or ``AFDDIAG_TEST_NHC=/path/to/nhc`` with ``AFDDIAG_TEST_NHC_SCRIPTS`` naming the folder
of its ``common.nhc``), it runs the module itself with a test ``nhc.conf`` and a node-mark-offline that
records what it was asked to do.

The afddiag the module runs is this checkout's, judging a recorded case as this node's data: a shim
runs ``afddiag all --snapshot <case>`` for the module's ``all`` call and marks the report live (the seam
``tests/test_slurm.py`` uses too: the CLI refuses to act on a snapshot as this node).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODULE = REPO / "playbooks" / "slurm" / "nhc" / "afddiag.nhc"
CASES = Path(os.environ.get("AFDDIAG_CASES", REPO.parent / "shared" / "cases"))
EXE = Path(sys.executable).with_name("afddiag")
NHC_TIMEOUT_S = 30  # NHC's default watchdog

HARNESS = """set -u
die() {{ printf 'DIE %s|%s\\n' "$1" "${{*:2}}" >> {log}; return 0; }}
dbg() {{ :; }}
. {module}
for area in {areas}; do
  check_afddiag "$area"
  printf 'RC %s %s\\n' "$area" "$?" >> {log}
done
"""


def _exe(path: Path, text: str) -> Path:
    path.write_text("#!/usr/bin/env bash\n" + text)
    path.chmod(0o755)
    return path


def shim(tmp: Path, case: str | None, body: str | None = None) -> Path:
    """An ``afddiag`` for the module: ``all`` judges ``case`` as this node (or runs ``body``); every
    other subcommand (``npd``) is this checkout's afddiag as it is. Counts its ``all`` runs."""
    runs = tmp / "all-runs"
    mark = (f'{sys.executable} -c "import json,sys; p=sys.argv[1]; r=json.load(open(p)); r[\'source\']=\'live\'; '
            f'json.dump(r, open(p, \'w\'))" "$out"')
    default = (f'out=""; prev=""; for a in "$@"; do [ "$prev" = --output ] && out="$a"; prev="$a"; done\n'
               f'"{EXE}" "$@" --snapshot "{CASES / case}"\nrc=$?\n[ -f "$out" ] && {mark}\nexit $rc\n') if case else ""
    return _exe(tmp / "afddiag", f'if [ "$1" = all ]; then\necho run >> {runs}\n{body or default}\nfi\n'
                f'exec "{EXE}" "$@"\n')


def harness(tmp: Path, cmd: Path, areas: str = "fabric gpu launch", **env: str) -> tuple[list[str], float]:
    """Source the module in the harness and run ``check_afddiag`` for each area → (the log lines, wall s)."""
    log = tmp / "nhc.log"
    script = tmp / "harness.sh"
    script.write_text(HARNESS.format(log=log, module=MODULE, areas=areas))
    b = tmp / "bin"
    b.mkdir(exist_ok=True)
    for tool in ("scontrol", "sinfo"):  # must never run: NHC's helpers own the drain
        _exe(b / tool, f'echo "{tool} $*" >> {tmp}/slurm-calls\nexit 1\n')
    full = {"PATH": f"{b}:/usr/bin:/bin", "HOME": str(tmp), "AFDDIAG_NHC_CMD": str(cmd),
            "AFDDIAG_NHC_STATE": str(tmp / "run"), "AFDDIAG_STATE_DIR": str(tmp / "state"), **env}
    t0 = time.monotonic()
    subprocess.run(["bash", str(script)], env=full, timeout=NHC_TIMEOUT_S * 2, check=True)
    wall = time.monotonic() - t0
    assert not (tmp / "slurm-calls").exists(), (tmp / "slurm-calls").read_text()
    return log.read_text().splitlines(), wall


def _dies(lines: list[str]) -> list[str]:
    return [ln[4:] for ln in lines if ln.startswith("DIE ")]


def test_a_fault_that_needs_a_person_dies_with_gate_and_summary_once_per_area(tmp_path):
    lines, wall = harness(tmp_path, shim(tmp_path, "fabric/07-ipv6-only-no-ipv4-gid"))
    dies = _dies(lines)
    assert len(dies) == 1 and dies[0].startswith("1|fabric.rocev2-ipv4: ")
    assert len(dies[0].split("|", 1)[1].encode()) <= 80  # NHC adds "NHC: ": the Slurm reason stays short
    assert "RC fabric 1" in lines and "RC gpu 0" in lines and "RC launch 0" in lines
    assert (tmp_path / "all-runs").read_text().count("run") == 1  # gathered once, judged three times
    print(f"nhc harness, case 07, 3 checks: {wall:.2f} s; {dies}")


def test_a_gpu_that_needs_a_power_cycle_dies_in_the_gpu_check(tmp_path):
    lines, _ = harness(tmp_path, shim(tmp_path, "gpu/02-gb10-class-a-stuck-low-clock"), areas="gpu")
    assert [d.split(":")[0] for d in _dies(lines)] == ["1|gpu.slow-state"]


@pytest.mark.parametrize("case", ["fabric/13-spark-env-map-wrong-device", "fabric/12-cx7-single-port-healthy",
                                  "gpu/04-rtx5090-image-exported-for-188-sms"])
def test_faults_no_drain_fixes_and_healthy_hosts_pass(tmp_path, case):
    """Case 13's map and case 04's image are the launcher's to fix (SET_ENV, REBUILD_IMAGE): no drain."""
    lines, _ = harness(tmp_path, shim(tmp_path, case), areas="fabric gpu launch all")
    assert _dies(lines) == [] and all(ln.endswith(" 0") for ln in lines)


def test_a_run_past_its_bound_dies_naming_it_within_nhcs_budget(tmp_path):
    lines, wall = harness(tmp_path, shim(tmp_path, None, body="sleep 300 &\nwait\nexit 0"), AFDDIAG_NHC_TIMEOUT="2")
    assert _dies(lines) == ["1|afddiag: run not finished in 2 s (nothing judged)"] * 3
    assert (tmp_path / "all-runs").read_text().count("run") == 1
    assert wall < 2 + 2 + 5


def test_a_run_that_leaves_no_report_dies(tmp_path):
    lines, _ = harness(tmp_path, shim(tmp_path, None, body="exit 64"), areas="fabric")
    assert _dies(lines)[0].startswith("1|afddiag: unknown: no report yet")
    sub = tmp_path / "second"
    sub.mkdir()
    lines, _ = harness(sub, sub / "no-such-afddiag", areas="fabric")
    assert _dies(lines) == [f"1|afddiag: {sub / 'no-such-afddiag'} not runnable (exit 127)"]


def test_a_report_left_by_an_earlier_run_is_not_judged(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    old = subprocess.run([str(EXE), "all", "--snapshot", str(CASES / "fabric/07-ipv6-only-no-ipv4-gid"), "--json",
                          "--no-history"], capture_output=True, text=True, timeout=120).stdout
    (run / "last.json").write_text(json.dumps(dict(json.loads(old), source="live")))
    lines, _ = harness(tmp_path, shim(tmp_path, None, body="exit 3"), areas="fabric")
    assert _dies(lines)[0].startswith("1|afddiag: unknown: no report yet")


def test_the_module_passes_only_passive_flags_and_fits_nhcs_budget():
    text = MODULE.read_text()
    call = next(ln for ln in text.splitlines() if "$AFDDIAG_NHC_CMD all" in ln)
    assert "--no-load" in call and "--no-qp" in call and "--no-history" in call
    default = int(text.split('AFDDIAG_NHC_TIMEOUT="${AFDDIAG_NHC_TIMEOUT:-')[1].split("}")[0])
    assert default + 2 + 3 < NHC_TIMEOUT_S  # the run, timeout's grace, three short reads of its report


def _real_nhc() -> tuple[Path, Path] | None:
    nhc = os.environ.get("AFDDIAG_TEST_NHC") or shutil.which("nhc")
    scripts = os.environ.get("AFDDIAG_TEST_NHC_SCRIPTS") or "/etc/nhc/scripts"
    if nhc and (Path(scripts) / "common.nhc").exists():
        return Path(nhc), Path(scripts)
    return None


@pytest.mark.skipif(_real_nhc() is None, reason="LBNL NHC is not installed (Debian has no nhc package; set "
                    "AFDDIAG_TEST_NHC and AFDDIAG_TEST_NHC_SCRIPTS to a checkout's nhc and scripts/)")
def test_real_nhc_marks_the_node_offline_with_the_gate_and_summary(tmp_path):
    found = _real_nhc()
    assert found
    nhc, scripts = found
    conf = tmp_path / "etc"
    (conf / "scripts").mkdir(parents=True)
    shutil.copy(scripts / "common.nhc", conf / "scripts" / "common.nhc")
    shutil.copy(MODULE, conf / "scripts" / "afddiag.nhc")
    (conf / "nhc.conf").write_text("* || check_afddiag fabric\n* || check_afddiag gpu\n* || check_afddiag launch\n")
    offline = _exe(tmp_path / "node-mark-offline", f'printf "%s\\n" "$@" > {tmp_path}/offline\n')
    online = _exe(tmp_path / "node-mark-online", f'printf "%s\\n" "$@" > {tmp_path}/online\n')
    cmd = shim(tmp_path, "fabric/07-ipv6-only-no-ipv4-gid")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AFDDIAG_NHC_CMD": str(cmd),
           "AFDDIAG_NHC_STATE": str(tmp_path / "run"), "AFDDIAG_STATE_DIR": str(tmp_path / "state")}
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(nhc), "-D", str(conf), "-c", str(conf / "nhc.conf"), "-l", "-",
                        "-t", str(NHC_TIMEOUT_S), "NHC_RM=slurm", f"OFFLINE_NODE={offline}", f"ONLINE_NODE={online}"],
                       capture_output=True, text=True, env=env, timeout=NHC_TIMEOUT_S * 2)
    wall = time.monotonic() - t0
    assert p.returncode == 1, p.stdout + p.stderr
    host, note = (tmp_path / "offline").read_text().splitlines()
    assert note.startswith("fabric.rocev2-ipv4: ") and not (tmp_path / "online").exists()
    assert wall < NHC_TIMEOUT_S
    print(f"real NHC {nhc}: exit {p.returncode}, {wall:.2f} s, node-mark-offline {host!r} {note!r}")
