"""NVIDIA Xid events from the kernel log: ``/dev/kmsg`` read non-blocking, or a saved log (``dmesg``,
``journalctl -k``); the GPU probe reads them live, a replay from the snapshot's kernel log.
Never raises: what cannot be read is None and a note."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Iterable
from typing import Any

KMSG_PATH = "/dev/kmsg"
XID_MAX_BYTES = 4 << 20  # read at most this much kernel log (the kmsg ring is usually far smaller)
XID_MAX_EVENTS = 1000  # keep at most this many Xid events (a note counts the rest)

_XID_RE = re.compile(r"NVRM: Xid \(([^)]*)\):\s*(\d+)")
_PCI_RE = re.compile(r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?")


def parse_xid_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The NVIDIA Xid events in kernel log lines, in order: ``[{xid, pci, text}]``.

    Each line may be a ``/dev/kmsg`` record (``prio,seq,ts,flags;message``), a ``dmesg`` line
    (``[  12.345678] NVRM: ...``), a ``journalctl -k`` line or a bare message; what matters is
    ``NVRM: Xid (<where>): <xid>, <details>``. ``pci`` is the PCI address inside the parentheses as
    the driver printed it (``PCI:0000:01:00`` gives ``"0000:01:00"``), None if there is none;
    ``text`` is the message from ``NVRM: Xid`` to the end of the line. Other lines are ignored.
    """
    events: list[dict[str, Any]] = []
    for line in lines:
        if not isinstance(line, str) or "Xid" not in line:
            continue
        line = line.split("\n", 1)[0]  # a kmsg record's continuation lines (" KEY=value") follow
        m = _XID_RE.search(line)
        if m is None:
            continue
        pci = _PCI_RE.search(m.group(1))
        events.append({
            "xid": int(m.group(2)),
            "pci": pci.group(0) if pci else None,
            "text": line[m.start():].rstrip(),
        })
    return events


def _hint(path: str, e: OSError) -> str:
    """What to do when the kernel log at ``path`` cannot be opened: root, or a saved log (--xid-log)."""
    if path != KMSG_PATH:
        return ""
    return " (run as root or give --xid-log)" if e.errno in (errno.EACCES, errno.EPERM) else " (give --xid-log)"


def read_xid_events(
    path: str = KMSG_PATH, deadline: float | None = None, max_bytes: int = XID_MAX_BYTES
) -> tuple[list[dict[str, Any]] | None, str, list[str]]:
    """Read the kernel log at ``path`` non-blocking: ``(events, source, notes)``; never raises.

    ``path`` is ``/dev/kmsg`` (one record per read, until EAGAIN) or a saved log (``dmesg``,
    ``journalctl -k``; its last ``max_bytes`` are read). Stops at ``max_bytes`` or at ``deadline``
    (``time.monotonic()``), with a note. ``source`` is ``path`` when it was read; otherwise
    ``events`` is None and ``source`` says why (``not readable: <path>: <error> (<hint>)``).
    """
    notes: list[str] = []
    if deadline is None:
        deadline = time.monotonic() + 5.0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return None, f"not readable: {path}: {e.strerror or e}{_hint(path, e)}", notes
    xid_lines: list[str] = []
    total = 0
    partial: bytes | None = b""
    regular = False
    try:
        try:
            st = os.fstat(fd)
            regular = stat.S_ISREG(st.st_mode)
            if regular and st.st_size > max_bytes:
                os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
                notes.append(f"xid: {path} is {st.st_size} bytes; read its last {max_bytes}")
                partial = None  # drop the first, cut line
        except OSError:
            pass
        lost = 0
        while True:
            if time.monotonic() > deadline:
                notes.append(f"xid: stopped reading {path} at the time bound after {total} bytes")
                break
            if total >= max_bytes:
                if not regular:  # a regular file's cut is noted above
                    notes.append(f"xid: stopped reading {path} after {total} bytes (the limit)")
                break
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:  # EAGAIN: no more kmsg records
                break
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EPIPE and lost < 1000:  # records overwritten while reading
                    lost += 1
                    continue
                notes.append(f"xid: reading {path} stopped: {e.strerror or e}")
                break
            if not chunk:
                break
            total += len(chunk)
            pieces = chunk.split(b"\n")
            if partial is None:
                if len(pieces) == 1:
                    continue
                pieces[0] = b""
            else:
                pieces[0] = partial + pieces[0]
            partial = pieces.pop()
            xid_lines.extend(p.decode("utf-8", "replace") for p in pieces if b"Xid" in p)
        if partial and b"Xid" in partial:
            xid_lines.append(partial.decode("utf-8", "replace"))
        if lost:
            notes.append(f"xid: {path}: {lost} times records were overwritten while reading")
    finally:
        os.close(fd)
    events = parse_xid_lines(xid_lines)
    if len(events) > XID_MAX_EVENTS:
        notes.append(f"xid: {len(events)} Xid events; the last {XID_MAX_EVENTS} kept")
        events = events[-XID_MAX_EVENTS:]
    return events, path, notes
