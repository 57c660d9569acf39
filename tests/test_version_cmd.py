"""``afddiag version`` (issue 23): afddiag's version and commit, Python, rdma-core/pyverbs and the NVIDIA
driver, each with its source; ``--version`` stays the fast path that loads no CLI (tests/test_entry.py)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys

from afddiag import __version__
from afddiag.cli import run
from afddiag.probes.buildinfo import afddiag_build, driver_row
from conftest import REPO

NVRM = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 13:54:08 UTC 2025\n")


def _version_json() -> list[dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(["version", "--json"]) == 0
    return json.loads(out.getvalue())


def test_rows_name_each_part_with_its_source():
    rows = _version_json()
    assert [r["name"] for r in rows] == ["afddiag", "Python", "rdma-core", "pyverbs", "NVIDIA driver"]
    assert all(r["value"] and r["source"] for r in rows)
    assert rows[0]["value"].startswith(__version__ + " (commit ")
    assert rows[1]["value"] == "{}.{}.{}".format(*sys.version_info[:3])
    if (REPO / ".git").exists() and shutil.which("git"):  # a checkout: the commit is git's
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert head in rows[0]["value"] and rows[0]["source"] == f"git describe in {REPO}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert run(["version"]) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 5 and all(f"[{r['source']}]" in ln for r, ln in zip(rows, lines, strict=True))


def test_outside_a_checkout_the_installed_metadata_answers(tmp_path):
    pkg = tmp_path / "site-packages" / "afddiag"
    pkg.mkdir(parents=True)
    row = afddiag_build(pkg)
    assert "git describe" not in row["source"]
    assert row["source"].startswith(("installed metadata", "afddiag.__version__"))


def test_driver_from_nvml_then_proc_then_none(tmp_path):
    row = driver_row(str(tmp_path), nvml=lambda: ("580.95.05", ""))
    assert (row["value"], row["source"]) == ("580.95.05", "NVML nvmlSystemGetDriverVersion")
    none = driver_row(str(tmp_path), nvml=lambda: (None, "libnvidia-ml.so.1 not found"))
    assert none["value"] == "none" and "libnvidia-ml.so.1 not found" in none["source"]
    assert "proc/driver/nvidia/version" in none["source"]
    (tmp_path / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (tmp_path / "proc" / "driver" / "nvidia" / "version").write_text(NVRM)
    proc = driver_row(str(tmp_path), nvml=lambda: (None, "libnvidia-ml.so.1 not found"))
    assert proc["value"] == "580.95.05" and proc["source"].startswith(str(tmp_path / "proc/driver/nvidia/version"))
