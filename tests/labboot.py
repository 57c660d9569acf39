"""Boot the soft-RoCE lab once for a test module: lab/boot.sh with a guest script, results back.

Needs lab/setup.sh to have run (as root). Outside CI a missing QEMU or lab kernel skips with the
reason; with CI set it fails instead (under CI, as root, it first runs lab/setup.sh itself).
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

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("AFDDIAG_LAB_CACHE", REPO / ".lab-cache"))
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
BOOT_TIMEOUT_S = 600
LOCK_WAIT_S = 1800  # boots are serialised (flock in lab/boot.sh): another worktree's boot may go first


KERNEL_KEYS = {"6.1": ("LAB_KVER", "LAB_VMLINUZ"), "bpo": ("LAB_KVER_BPO", "LAB_VMLINUZ_BPO")}


def lab_missing(kernel: str = "6.1") -> str | None:
    """Why the lab cannot boot ``kernel`` ("6.1" or "bpo", as lab/boot.sh's AFDDIAG_LAB_KERNEL) here,
    or None when it can."""
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 not installed (run lab/setup.sh as root)"
    env = CACHE / "kernel.env"
    if not env.is_file():
        return f"lab kernel not set up ({env} missing: run lab/setup.sh as root)"
    kv = dict(line.split("=", 1) for line in env.read_text().splitlines() if "=" in line)
    kver, vmlinuz = KERNEL_KEYS[kernel]
    for key in (vmlinuz, "LAB_VNG"):
        if not kv.get(key) or not Path(kv[key]).exists():
            return f"{key}={kv.get(key)} missing (run lab/setup.sh as root)"
    if not Path(f"/lib/modules/{kv.get(kver, '')}/modules.dep").is_file():
        return f"/lib/modules/{kv.get(kver)} not installed (run lab/setup.sh as root)"
    return None


def boot(tmp_path_factory, name: str, script: str | None = None, kernel: str = "6.1",
         timeout_s: int = BOOT_TIMEOUT_S) -> dict:
    """Boot ``kernel`` ("6.1" or "bpo") once with ``lab/<script>`` (default lab/run-scenario.py) and
    return its results.json, with ``outdir``, ``boot_rc`` and ``boot_s`` (seconds, wall) added. Fails
    (CI) or skips (elsewhere) when the lab cannot boot; fails when the guest did not finish (within
    ``timeout_s`` seconds, lab/boot.sh's AFDDIAG_LAB_TIMEOUT) or reported errors."""
    reuse = os.environ.get("AFDDIAG_LAB_REUSE")  # a folder holding <name>/results.json from an earlier boot
    if reuse and (Path(reuse) / name / "results.json").is_file():
        r = json.loads((Path(reuse) / name / "results.json").read_text())
        r.update(outdir=Path(reuse) / name, boot_rc=0, boot_s=None)
        return r
    why = lab_missing(kernel)
    if why and IN_CI and os.geteuid() == 0:
        p = subprocess.run(["bash", str(REPO / "lab" / "setup.sh")], capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            pytest.fail(f"lab/setup.sh failed (rc {p.returncode}):\n{p.stderr[-4000:]}")
        why = lab_missing(kernel)
    if why:
        if IN_CI:
            pytest.fail(f"soft-RoCE lab cannot boot under CI: {why}")
        pytest.skip(f"soft-RoCE lab not available: {why}")
    out = tmp_path_factory.mktemp(name)
    env = dict(os.environ, AFDDIAG_LAB_PYTHON=sys.executable, AFDDIAG_LAB_KERNEL=kernel,
               AFDDIAG_LAB_TIMEOUT=str(timeout_s))
    if script:
        env["AFDDIAG_LAB_SCRIPT"] = str(REPO / "lab" / script)
    t0 = time.monotonic()
    try:
        p = subprocess.run(["bash", str(REPO / "lab" / "boot.sh"), str(out)], capture_output=True, text=True,
                           timeout=timeout_s + 60 + LOCK_WAIT_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"lab boot did not finish in {timeout_s + 60 + LOCK_WAIT_S}s (lock wait included)")
    results = out / "results.json"
    if not results.is_file():
        console = (out / "console.log").read_text()[-6000:] if (out / "console.log").exists() else ""
        pytest.fail(f"lab boot failed (rc {p.returncode}): {p.stderr[-3000:]}\nconsole:\n{console}")
    r = json.loads(results.read_text())
    assert r["errors"] == [], "\n".join(r["errors"])
    r["outdir"] = out
    r["boot_rc"] = p.returncode
    r["boot_s"] = round(time.monotonic() - t0, 1)
    return r
