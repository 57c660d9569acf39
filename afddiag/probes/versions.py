"""The versions probe: kernel, BIOS, board, rdma-core, HCA firmware, GPU driver (``fleet.versions``
compares them). Every run reads it; it loads no fabric model."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from typing import Any

from afddiag import __version__, proc
from afddiag.probes.registry import LIVE, Artifact, Probe, Run
from afddiag.probes.sysfs import entry_names

_IBV_RE = re.compile(r"libibverbs\.so\.1\.\d+\.(\d+(?:\.\d+)?)\.0$")


def rdma_core_version(timeout_s: float = 5.0) -> dict[str, str | None]:
    """rdma-core's version → ``{"version", "source"}``: the libibverbs file name
    (``libibverbs.so.1.14.44.0`` → "44.0", as ``fleet.versions`` compares it), else ``dpkg-query``
    (rdma-core, libibverbs1), else pyverbs' package metadata; ``{}`` when none answers. Never raises."""
    # /usr/lib*/ and one level below (multiarch, lib64): a recursive glob of /usr/lib* takes minutes
    found = glob.glob("/usr/lib*/libibverbs.so.1.*.*.0") + glob.glob("/usr/lib*/*/libibverbs.so.1.*.*.0")
    for path in sorted(found):
        m = _IBV_RE.search(os.path.basename(path))
        if m:
            return {"version": m.group(1), "source": "libibverbs file name"}
    exe = shutil.which("dpkg-query")
    if exe:
        for pkg in ("rdma-core", "libibverbs1"):
            try:
                p = proc.run([exe, "-W", "-f=${Version}", pkg], timeout_s)
            except (OSError, subprocess.SubprocessError):
                break
            if p.returncode == 0 and p.stdout.strip():
                return {"version": p.stdout.strip(), "source": f"dpkg {pkg}"}
    try:
        from importlib.metadata import version

        return {"version": version("pyverbs"), "source": "pyverbs"}
    except Exception:  # noqa: BLE001 - absent is fine
        return {}


# ---------------------------------------------------------------------------------------------
# the probe


def _dmi(run: Run, root: str, name: str) -> str | None:
    return run.try_read(os.path.join(root, "sys", "class", "dmi", "id", name)) or None


def _read(run: Run, progress: Any) -> dict[str, Any]:
    src = run.src
    progress.doing = "reading the kernel, BIOS and rdma-core versions"
    if src.rdma_core is LIVE:
        rdma = rdma_core_version()
    else:
        rdma = (src.rdma_core() if src.rdma_core is not None else None) or {}
    gpu = (run.obs.gpu.readings if run.obs.gpu is not None else None) or {}  # the GPU probe ran before this one
    root = src.root
    if root is None:  # no tree read: what the other probes hand over only
        return {"versions.json": {"rdma_core": rdma.get("version"), "rdma_core_source": rdma.get("source"),
                                  "driver": gpu.get("driver_version"), "cuda_driver": gpu.get("cuda_driver_version"),
                                  "afddiag": __version__, "python": "{}.{}.{}".format(*sys.version_info[:3])},
                "proc/sys/kernel/osrelease": None}
    ib = os.path.join(root, "sys", "class", "infiniband")
    fw = {h: v for h in entry_names(ib) if (v := run.try_read(f"{ib}/{h}/fw_ver")) is not None}
    osrel = run.try_read(os.path.join(root, "proc", "sys", "kernel", "osrelease"))
    return {"versions.json": {
        "kernel": osrel or (os.uname().release if root == "/" else None),
        "bios": _dmi(run, root, "bios_version"),
        "rdma_core": rdma.get("version"),
        "rdma_core_source": rdma.get("source"),
        "driver": gpu.get("driver_version"),
        "cuda_driver": gpu.get("cuda_driver_version"),
        "bios_vendor": _dmi(run, root, "bios_vendor"),
        "bios_date": _dmi(run, root, "bios_date"),
        "board": {k: _dmi(run, root, k) for k in ("sys_vendor", "product_name", "board_name")},
        "hca_firmware": fw,
        "afddiag": __version__,
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
    }, "proc/sys/kernel/osrelease": osrel}


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    out: dict[str, str | None] = {"kernel": None, "bios": None, "rdma_core": None}
    raw = r.get("versions.json")
    if isinstance(raw, dict):
        out.update({k: str(v)[:200] for k, v in raw.items() if k in out and v is not None})
    for key, name in (("kernel", "proc/sys/kernel/osrelease"), ("bios", "sys/class/dmi/id/bios_version")):
        v = r.get(name)
        if not out[key] and isinstance(v, str) and v.strip():
            out[key] = v.strip()
    return {"versions": out}


PROBE = Probe("versions", "version probe (kernel, BIOS, rdma-core)", "fabric_s",
              (Artifact("versions.json"), Artifact("proc/sys/kernel/osrelease", "text", 4096),
               Artifact("sys/class/dmi/id/bios_version", "text", 4096)),
              _read, _facts, lambda why: {"versions": None})
