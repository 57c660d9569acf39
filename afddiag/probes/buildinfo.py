"""What ``afddiag version`` prints: afddiag's version and commit, Python, rdma-core and pyverbs, the
NVIDIA driver, each ``{"name", "value", "source"}`` with where it came from. Read on demand (never
by a run: ``--version`` stays the fast path of :mod:`afddiag.entry`); every reading is bounded in
time and none raises.

Sources: ``git describe --always --dirty`` when afddiag runs from a checkout, else the installed
distribution's metadata (its PEP 610 ``direct_url.json`` commit when pip recorded one);
:data:`sys.version_info`; :func:`afddiag.probes.versions.rdma_core_version`; ``importlib.util.find_spec
("pyverbs")`` (found, not imported); NVML ``nvmlSystemGetDriverVersion`` when NVML loads, else the first
line of ``/proc/driver/nvidia/version``, else "none".
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from afddiag import __version__, proc
from afddiag.probes.nvml import NvmlUnavailable, close_nvml, open_nvml
from afddiag.probes.versions import rdma_core_version

BOUND_S = 5.0  # each reading: git, dpkg-query, NVML
DRIVER_RE = re.compile(r"\b(\d{2,4}\.\d+(?:\.\d+)?)\b")


def _row(name: str, value: str, source: str) -> dict[str, str]:
    return {"name": name, "value": value, "source": source}


def afddiag_build(package_dir: Path | None = None) -> dict[str, str]:
    """afddiag's version and commit: ``git describe`` of the checkout ``package_dir`` (default this
    package's folder) lies in, else the installed distribution's metadata."""
    pkg = package_dir or Path(__file__).resolve().parent.parent
    repo = pkg.parent
    git = shutil.which("git")
    if git and (repo / ".git").exists():
        try:
            p = proc.run([git, "-C", str(repo), "describe", "--always", "--dirty", "--abbrev=12"], BOUND_S)
            if p.returncode == 0 and p.stdout.strip():
                return _row("afddiag", f"{__version__} (commit {p.stdout.strip()})", f"git describe in {repo}")
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        dist = distribution("afddiag")
    except (ImportError, PackageNotFoundError):
        return _row("afddiag", f"{__version__} (commit unknown)", "afddiag.__version__ (no checkout, not installed)")
    commit = None
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
        commit = (direct.get("vcs_info") or {}).get("commit_id")
    except (ValueError, OSError, AttributeError):
        pass
    where = getattr(dist, "_path", None)
    return _row("afddiag", f"{dist.version} (commit {commit or 'not recorded'})",
                "installed metadata" + (f" {where}" if where else ""))


def pyverbs_row() -> dict[str, str]:
    """Whether pyverbs (rdma-core's Python binding) is importable, and from where; not imported."""
    try:
        spec = importlib.util.find_spec("pyverbs")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return _row("pyverbs", "not importable", "not found by importlib; the QP walk and the pair test need it: "
                    "apt install python3-pyverbs")
    return _row("pyverbs", "importable", f"importlib find_spec: {spec.origin or spec.submodule_search_locations}")


def _nvml_driver() -> tuple[str | None, str]:
    """``(version, why not)`` from NVML, within :data:`BOUND_S` (a hung nvmlInit is abandoned)."""
    box: dict[str, Any] = {}

    def read() -> None:
        try:
            nv = open_nvml()
        except NvmlUnavailable as e:
            box["why"] = str(e)
            return
        try:
            v = nv.nvmlSystemGetDriverVersion()
            box["value"] = v.decode() if isinstance(v, bytes) else str(v)
        except Exception as e:  # noqa: BLE001 - pynvml raises NVMLError subclasses
            box["why"] = f"nvmlSystemGetDriverVersion failed: {e}"
        finally:
            close_nvml(nv)

    t = threading.Thread(target=read, name="afddiag-version-nvml", daemon=True)
    t.start()
    t.join(BOUND_S)
    if t.is_alive():
        return None, f"NVML did not answer within {BOUND_S:g} s"
    return box.get("value"), box.get("why", "")


def driver_row(root: str = "/", nvml: Any = _nvml_driver) -> dict[str, str]:
    """The NVIDIA driver: NVML when it loads, else ``<root>/proc/driver/nvidia/version``, else "none"
    (the source then says why each was not read). ``nvml() -> (version | None, why)``."""
    version, why_nvml = nvml()
    if version:
        return _row("NVIDIA driver", version, "NVML nvmlSystemGetDriverVersion")
    path = os.path.join(root, "proc", "driver", "nvidia", "version")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            first = f.readline(4096).strip()
    except OSError as e:
        return _row("NVIDIA driver", "none", f"NVML: {why_nvml or 'no answer'}; {path}: {e.strerror or e}")
    m = DRIVER_RE.search(first)
    return _row("NVIDIA driver", m.group(1) if m else first[:120], f"{path} (NVML: {why_nvml or 'no answer'})")


def build_info() -> list[dict[str, str]]:
    """Every row ``afddiag version`` prints, in order: afddiag, Python, rdma-core, pyverbs, NVIDIA driver."""
    rdma = rdma_core_version(BOUND_S)
    return [
        afddiag_build(),
        _row("Python", "{}.{}.{}".format(*sys.version_info[:3]), sys.executable or "sys.version_info"),
        _row("rdma-core", rdma.get("version") or "none",
             rdma.get("source") or "no libibverbs.so.1.*, no dpkg rdma-core/libibverbs1, no pyverbs metadata"),
        pyverbs_row(),
        driver_row(),
    ]
