"""The shared-memory probe: the entries of ``/dev/shm`` (size in allocated blocks, owner, mtime; never
their contents) and the live processes that map or hold each (``/proc/<pid>/maps`` and ``fd`` links),
under a root path, bounded in entries and time; ``shm.json`` in a capture. Read-only; never raises."""

from __future__ import annotations

import os
import pwd
import stat
import time
from typing import Any

from afddiag.model.shm import ShmFacts, ShmFile
from afddiag.probes.registry import Artifact, Probe, Run

SHM_DIR = "dev/shm"
MAX_ENTRIES = 4096  # entries of /dev/shm looked at (a count notes the rest)
KEEP = 32  # the largest entries kept
SCAN_S = 1.0  # seconds for reading the processes' maps and fds


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def _size(path: str, st: os.stat_result, notes: list[str]) -> int:
    """Allocated bytes of a file, or of a directory's files one level down (links not followed)."""
    if not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0
    total = 0
    try:
        with os.scandir(path) as it:
            for n, e in enumerate(it):
                if n >= MAX_ENTRIES:
                    notes.append(f"shm: {path}: more than {MAX_ENTRIES} entries, the rest not counted")
                    break
                s = e.stat(follow_symlinks=False)
                if stat.S_ISREG(s.st_mode):
                    total += s.st_blocks * 512
    except OSError as e:
        notes.append(f"shm: {path}: {e.strerror or e}")
    return total


def list_shm(root: str) -> dict[str, Any] | None:
    """``{"files": [{path, bytes, owner, mtime}], "total_bytes", "entries", "notes"}`` of ``<root>/dev/shm``,
    the :data:`KEEP` largest; None when there is no such directory."""
    d = os.path.join(root, SHM_DIR)
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    try:
        with os.scandir(d) as it:
            for n, e in enumerate(it):
                if n >= MAX_ENTRIES:
                    notes.append(f"shm: more than {MAX_ENTRIES} entries in /dev/shm, the rest not read")
                    break
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                rows.append({"path": f"/dev/shm/{e.name}", "bytes": _size(e.path, st, notes),
                             "owner": _owner(st.st_uid), "mtime": round(st.st_mtime, 1)})
    except FileNotFoundError:
        return None
    except OSError as e:
        return {"files": [], "total_bytes": 0, "entries": 0, "notes": [f"shm: /dev/shm: {e.strerror or e}"]}
    rows.sort(key=lambda r: -r["bytes"])
    return {"files": rows[:KEEP], "total_bytes": sum(r["bytes"] for r in rows), "entries": len(rows), "notes": notes}


def shm_holders(root: str, paths: list[str], deadline: float) -> tuple[dict[str, list[int]], bool]:
    """``({path: [pid]}, complete)``: the live processes whose ``/proc/<pid>/maps`` maps or whose ``fd``
    links hold each of ``paths``; ``complete`` False when some process could not be read (not root) or
    the time ran out."""
    held: dict[str, list[int]] = {p: [] for p in paths}
    want = set(paths)
    complete = True
    proc = os.path.join(root, "proc")
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return held, False
    for pid in pids:
        if time.monotonic() > deadline:
            return held, False
        seen: set[str] = set()
        try:
            with open(os.path.join(proc, str(pid), "maps"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    i = line.find("/dev/shm/")
                    if i >= 0:
                        seen.add(line[i:].rstrip("\n").removesuffix(" (deleted)"))
            fd_dir = os.path.join(proc, str(pid), "fd")
            for fd in os.listdir(fd_dir):
                try:
                    seen.add(os.readlink(os.path.join(fd_dir, fd)))
                except OSError:
                    continue
        except FileNotFoundError:  # the process ended meanwhile
            continue
        except OSError:
            complete = False
            continue
        for p in seen & want:
            held[p].append(pid)
    return held, complete


def _read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "listing /dev/shm and the processes that map it"
    root = run.src.root
    if root is None:
        return {"shm.json": None}
    out = list_shm(root)
    if out is not None and out["files"]:
        held, complete = shm_holders(root, [f["path"] for f in out["files"]], time.monotonic() + SCAN_S)
        for f in out["files"]:
            f["holders"] = held.get(f["path"], [])
        out["holders_read"] = complete
    return {"shm.json": out}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get("shm.json")
    if not isinstance(raw, dict):
        why = "shared memory not captured (no shm.json in the snapshot)" if not run.live else "no /dev/shm"
        return {"shm": ShmFacts(captured=False, notes=[why])}
    files = []
    for f in raw.get("files") or []:
        if not isinstance(f, dict) or not isinstance(f.get("path"), str) or _int(f.get("bytes")) is None:
            continue
        holders = f.get("holders")
        files.append(ShmFile(path=f["path"][:300], bytes=f["bytes"], owner=str(f.get("owner") or "?")[:64],
                             mtime=f.get("mtime") if isinstance(f.get("mtime"), (int, float)) else None,
                             holders=[p for p in holders if _int(p) is not None][:64] if isinstance(holders, list)
                             else None))
    return {"shm": ShmFacts(files=files[:KEEP], total_bytes=_int(raw.get("total_bytes")) or 0,
                            entries=_int(raw.get("entries")) or 0, holders_read=raw.get("holders_read") is True,
                            notes=[str(n)[:300] for n in raw.get("notes") or []][:20])}


PROBE = Probe("shm", "shared-memory probe (/dev/shm, /proc/<pid>/maps)", "gpu_s", (Artifact("shm.json"),),
              _read, _facts, lambda why: {"shm": ShmFacts(captured=False, failed=why, notes=[why])})
