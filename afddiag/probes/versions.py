"""rdma-core's version, for the versions probe (kernel, BIOS, rdma-core; ``fleet.versions``). Apart
from the route probe so that a `gpu` run reads it without loading the fabric models."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

from afddiag import proc

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
