"""The platform probe: the DGX OS release from ``/etc/dgx-release`` (only its version keys: the file also
holds the serial number) and the board's DMI ``product_name``, under a root path; ``platform.json`` in a
capture. Never raises. Feeds the known-bad matrix (:mod:`afddiag.gates.known_bad`)."""

from __future__ import annotations

import os
from typing import Any

from afddiag.model.platform import PlatformFacts
from afddiag.probes.registry import Artifact, Probe, Run

DGX_RELEASE = "etc/dgx-release"
#: The only keys read from /etc/dgx-release (``cat /etc/dgx-release``); DGX_SERIAL_NUMBER is never read.
DGX_KEYS = ("DGX_NAME", "DGX_SWBUILD_VERSION", "DGX_OTA_VERSION")


def parse_dgx_release(text: str) -> dict[str, str]:
    """``KEY="value"`` lines of ``/etc/dgx-release`` → ``{key: value}`` for :data:`DGX_KEYS` only. Pure."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in DGX_KEYS:
            out[key] = value.strip().strip('"').strip("'")[:100]
    return out


def read_platform(run: Run, root: str) -> dict[str, Any] | None:
    """``{"dgx_release": {key: value}, "board"}`` under ``root``; None when neither file is there (a
    snapshot folder without them: not captured)."""
    text = run.try_read(os.path.join(root, DGX_RELEASE))
    board = run.try_read(os.path.join(root, "sys", "class", "dmi", "id", "product_name"))
    if text is None and board is None:
        return None
    return {"dgx_release": parse_dgx_release(text) if text is not None else None, "board": board}


def _read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "reading /etc/dgx-release and the DMI product name"
    root = run.src.root
    return {"platform.json": read_platform(run, root) if root is not None else None}


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get("platform.json")
    if not isinstance(raw, dict):
        why = "platform not captured (no platform.json in the snapshot)" if not run.live else \
            "no /etc/dgx-release or DMI product name"
        return {"platform": PlatformFacts(captured=False, notes=[why])}
    rel: dict[str, Any] = raw["dgx_release"] if isinstance(raw.get("dgx_release"), dict) else {}
    key = next((k for k in ("DGX_OTA_VERSION", "DGX_SWBUILD_VERSION") if isinstance(rel.get(k), str) and rel[k]), None)
    board = raw.get("board")
    nccl = raw.get("nccl")
    return {"platform": PlatformFacts(
        dgx_os=rel[key][:100] if key else None, dgx_os_source=key,
        board=board[:200] if isinstance(board, str) and board else None,
        nccl=[n for n in nccl if isinstance(n, dict)][:50] if isinstance(nccl, list) else None)}


PROBE = Probe("platform", "platform probe (/etc/dgx-release, DMI)", "fabric_s", (Artifact("platform.json"),),
              _read, _facts, lambda why: {"platform": PlatformFacts(captured=False, failed=why, notes=[why])})
