"""The engine-log probe: the NCCL net evidence lines of the engine's own log (``--engine-log FILE``:
its output with ``NCCL_DEBUG=INFO``), read bounded (the file's last :data:`MAX_BYTES`, regular files
only, never blocking), kept as ``engine.log`` in a capture and read back from it (or from
``--engine-log`` given to the replay). The parsing is :func:`afddiag.model.engine.parse`. Never raises."""

from __future__ import annotations

import os
import stat
from typing import Any

from afddiag.model.engine import EngineFacts, is_evidence, parse
from afddiag.probes.registry import Artifact, Probe, Run

ENGINE_LOG = "engine.log"  # what a capture keeps: the evidence lines only
MAX_BYTES = 32 << 20  # the log's tail read at most
MAX_LINES = 2000  # evidence lines kept (the last ones)


def read_engine_log(path: str, max_bytes: int = MAX_BYTES) -> tuple[list[str] | None, list[str]]:
    """The NCCL evidence lines (:func:`afddiag.model.engine.is_evidence`) of the log at ``path``, from
    its last ``max_bytes``: ``(lines, notes)``; ``(None, [why])`` when it is not a readable regular file."""
    notes: list[str] = []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return None, [f"engine log {path}: {e.strerror or e}"]
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, [f"engine log {path}: not a regular file"]
        start = max(0, st.st_size - max_bytes)
        if start:
            os.lseek(fd, start, os.SEEK_SET)
            notes.append(f"engine log {path} is {st.st_size} bytes: read its last {max_bytes}")
        data, left = [], max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            data.append(chunk)
            left -= len(chunk)
    except OSError as e:
        return None, [f"engine log {path}: {e.strerror or e}"]
    finally:
        os.close(fd)
    text = b"".join(data).decode("utf-8", "replace")
    rows = text.splitlines()[1 if start else 0:]  # a cut first line is dropped
    lines = [x[:4096] for x in rows if is_evidence(x)]
    if len(lines) > MAX_LINES:
        notes.append(f"engine log {path}: {len(lines)} NCCL lines; the last {MAX_LINES} kept")
        lines = lines[-MAX_LINES:]
    return lines, notes


def _wanted(run: Run) -> bool:
    return not run.live or bool(run.inputs.engine_log)


def _read(run: Run, progress: Any) -> dict[str, Any]:
    path = run.inputs.engine_log
    if not path:
        return {ENGINE_LOG: None, "notes": []}
    progress.doing = f"reading the engine log {path}"
    lines, notes = read_engine_log(path)
    return {ENGINE_LOG: "".join(f"{x}\n" for x in lines) if lines is not None else None, "lines": lines,
            "source": path, "notes": notes}


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    notes = list(r.get("notes") or [])
    if run.live:
        lines, source = r.get("lines"), r.get("source")
    elif run.inputs.engine_log:
        lines, more = read_engine_log(run.inputs.engine_log)
        source, notes = run.inputs.engine_log, notes + more
    else:
        text = r.get(ENGINE_LOG)
        if not isinstance(text, str):  # captured without --engine-log: as the live run, no engine facts
            return {"engine": None}
        lines = [x for x in text.splitlines() if is_evidence(x)][-MAX_LINES:]
        source = f"snapshot {ENGINE_LOG}"
    if lines is None:
        why = notes[-1] if notes else "no engine log given (--engine-log FILE)"
        return {"engine": EngineFacts(source=source, notes=[why])}
    facts = parse(lines, source)
    facts.notes = notes
    return {"engine": facts}


def _report(f: EngineFacts) -> dict[str, Any]:
    """The report's facts: the parsed choices, not the raw lines (their count instead)."""
    return {k: v for k, v in vars(f).items() if k != "lines"} | {
        "lines_read": None if f.lines is None else len(f.lines)}


PROBE = Probe("engine", "engine-log probe (NCCL NET lines)", "fabric_s", (Artifact(ENGINE_LOG, "text", MAX_BYTES),),
              _read, _facts, lambda why: {"engine": EngineFacts(failed=why, notes=[why])}, _wanted, report=_report)
