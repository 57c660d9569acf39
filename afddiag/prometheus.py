"""Render a report for Prometheus' node_exporter textfile collector, and write reports to files.

Scheme (``--format prometheus``; point node_exporter's ``--collector.textfile.directory`` at the
folder and give ``--output DIR/afddiag.prom``; the file is replaced atomically):

- ``afddiag_gate_status{host,role,command,gate,verdict}``: one gauge per gate; the value codes the
  verdict, **0 PASS, 1 WARN, 2 FAIL, 3 ERROR, 4 SKIP** (the ``verdict`` label repeats it in words, so
  ``afddiag_gate_status >= 2`` alerts on FAIL and ERROR and a table reads without a legend);
- ``afddiag_gates{host,role,command,verdict}``: how many gates gave each verdict;
- ``afddiag_exit_code{host,role,command}``: the run's exit code (0 clean, 1 WARN, 2 FAIL, 3 ERROR);
- ``afddiag_last_run_timestamp_seconds{host,role,command}``: when the report was made (Unix time);
- ``afddiag_device_map_info{host,ip,device} 1``: one per entry of the device map;
- ``afddiag_build_info{version} 1``.

Label values are escaped as the exposition format asks (backslash, double quote, newline).
"""

from __future__ import annotations

import datetime as _dt
import io
import os
import time
from pathlib import Path
from typing import Any

STATUS = {"PASS": 0, "WARN": 1, "FAIL": 2, "ERROR": 3, "SKIP": 4}


def escape_label(value: Any) -> str:
    """A label value escaped for the text exposition format: ``\\`` → ``\\\\``, ``"`` → ``\\"``,
    newline → ``\\n``."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**kv: Any) -> str:
    return "{" + ",".join(f'{k}="{escape_label(v)}"' for k, v in kv.items()) + "}"


def _timestamp(report: dict[str, Any]) -> float:
    try:
        return _dt.datetime.fromisoformat(report["generated_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return time.time()


def render(report: dict[str, Any], command: str = "all") -> str:
    """The report (``afddiag/schema/report.schema.json`` shape) as textfile-collector text, ending
    with a newline. ``command`` is the afddiag command that made it (a label)."""
    host = report.get("host") or ""
    role = (report.get("inputs") or {}).get("role") or "generic"
    base = {"host": host, "role": role, "command": command}
    out: list[str] = []

    def family(name: str, help_: str, rows: list[tuple[dict[str, Any], float]]) -> None:
        out.append(f"# HELP {name} {help_}")
        out.append(f"# TYPE {name} gauge")
        for labels, value in rows:
            v = int(value) if float(value).is_integer() else value
            out.append(f"{name}{_labels(**labels)} {v}")

    family("afddiag_gate_status", "Verdict of one afddiag gate: 0 PASS, 1 WARN, 2 FAIL, 3 ERROR, 4 SKIP.",
           [({**base, "gate": g["id"], "verdict": g["verdict"]}, STATUS.get(g["verdict"], 3))
            for g in report.get("gates") or []])
    counts = report.get("counts") or {}
    family("afddiag_gates", "Number of gates of the last run that gave each verdict.",
           [({**base, "verdict": v}, counts.get(v, 0)) for v in STATUS])
    family("afddiag_exit_code", "Exit code of the last afddiag run: 0 clean, 1 WARN, 2 FAIL, 3 ERROR.",
           [(base, report.get("exit_code", 3))])
    family("afddiag_last_run_timestamp_seconds", "When the last afddiag run made its report (Unix time).",
           [(base, round(_timestamp(report), 3))])
    family("afddiag_device_map_info", "One entry of DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP: fabric IP -> RDMA device.",
           [({"host": host, "ip": ip, "device": dev}, 1) for ip, dev in (report.get("device_map") or {}).items()])
    family("afddiag_build_info", "afddiag version that made the report.",
           [({"version": report.get("afddiag_version", "")}, 1)])
    return "\n".join(out) + "\n"


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temporary file in the same folder, fsync, rename;
    mode 0644 so node_exporter's user reads it; an old file keeps its mode and owner; a character
    device the user named is written in place). Raises OSError when the folder cannot be written,
    :class:`afddiag.atomic.OutputTargetError` for a FIFO, socket or folder."""
    from afddiag.atomic import atomic_write

    with atomic_write(path, device_ok=True) as f:
        f.write(text)
    return Path(path)


def write_report(report: dict[str, Any], fmt: str, output: str | None, command: str) -> None:
    """Render ``report`` as ``fmt`` (``table``, ``json`` or ``prometheus``) to ``output`` (atomically),
    or to stdout when ``output`` is None. Raises OSError when ``output`` cannot be written."""
    import sys

    from afddiag import report as rpt

    if fmt == "prometheus":
        text = render(report, command)
    else:
        buf = io.StringIO()
        (rpt.write_json if fmt == "json" else rpt.write_table)(report, buf)
        text = buf.getvalue()
    if output:
        write_atomic(output, text)
    else:
        sys.stdout.write(text)
