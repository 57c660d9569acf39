"""The host name probe: uname(2)'s nodename live (as ``socket.gethostname()``), the ``host`` file or
``case.json``'s ``host`` in a snapshot (else the snapshot folder's name stays)."""

from __future__ import annotations

import os
from typing import Any

from afddiag.probes.registry import LIVE, Artifact, Probe, Run


def _read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "gethostname"
    src = run.src.hostname
    if src is None:
        return {"host": None}
    name = os.uname().nodename if src is LIVE else src()
    return {"host": (name or "").strip() or "unknown"}


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    case = r.get("case.json")
    if isinstance(case, dict) and isinstance(case.get("host"), str):
        return {"host": case["host"][:253]}
    if r.get("host"):
        return {"host": r["host"].strip()[:253] or run.obs.host}
    if any(n.startswith("host refused") for n in r.get("notes") or []):
        return {"notes": ["the snapshot folder's name is used as the host name"]}
    return {}


PROBE = Probe("host", "hostname", "limits_s", (Artifact("host", "text", 4096), Artifact("case.json")),
              _read, _facts, lambda why: {})
