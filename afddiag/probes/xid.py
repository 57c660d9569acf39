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


# A line where the kernel log starts a boot: journalctl's "-- Boot <id> --" (older: "-- Reboot --") between
# boots, the kernel's "Linux version" banner; a dmesg timestamp lower than the one before is one too.
JOURNAL_BOOT = ("-- Boot ", "-- Reboot --")  # journalctl's line between two boots: each one is a boot
KERNEL_BOOT = ("Linux version ", "Booting Linux ")  # the kernel's first lines: a boot unless a journal line said it
BOOT_MARKERS = JOURNAL_BOOT + KERNEL_BOOT
REBOOT_LINE = "-- Reboot --"  # what a capture writes between Xid lines of different boots (journalctl's own)
_DMESG_TS_RE = re.compile(r"^\s*(?:<\d+>)?\[\s*(\d+\.\d+)\]")


def _keep(line: bytes) -> bool:
    """A kernel-log line :func:`parse_xid_lines` needs: an Xid, or a line that starts a boot."""
    return b"Xid" in line or any(m.encode() in line for m in BOOT_MARKERS)


def parse_xid_lines(lines: Iterable[str], uptime_s: float | None = None) -> list[dict[str, Any]]:
    """The NVIDIA Xid events in kernel log lines, in order: ``[{xid, pci, text, boots_ago}]``.

    Each line may be a ``/dev/kmsg`` record (``prio,seq,ts,flags;message``), a ``dmesg`` line
    (``[  12.345678] NVRM: ...``), a ``journalctl -k`` line or a bare message; what matters is
    ``NVRM: Xid (<where>): <xid>, <details>``. ``pci`` is the PCI address inside the parentheses as
    the driver printed it (``PCI:0000:01:00`` gives ``"0000:01:00"``), None if there is none;
    ``text`` is the message from ``NVRM: Xid`` to the end of the line. Other lines are ignored but
    the ones that start a boot (:data:`BOOT_MARKERS`, or a dmesg timestamp that goes back): ``boots_ago``
    is how many boots the log shows after the event's (0: the log's last boot, the one running when it
    was read). ``uptime_s`` (a live read of a saved log: this boot's /proc/uptime) puts a last boot whose
    dmesg timestamps pass it one boot further back: this boot has not run that long.
    """
    events: list[dict[str, Any]] = []
    boot = 0  # boots started before the current line
    last_ts: float | None = None
    last_boot_ts = 0.0  # the largest dmesg timestamp seen in the last boot
    said = False  # a journal line started this boot and no Xid came since: the kernel's banner is that boot
    for line in lines:
        if not isinstance(line, str):
            continue
        line = line.split("\n", 1)[0]  # a kmsg record's continuation lines (" KEY=value") follow
        ts_m = _DMESG_TS_RE.match(line)
        ts = float(ts_m.group(1)) if ts_m else None
        journal = any(m in line for m in JOURNAL_BOOT)
        kernel = any(m in line for m in KERNEL_BOOT) or (ts is not None and last_ts is not None and ts < last_ts)
        marker = journal or any(m in line for m in KERNEL_BOOT)
        if journal or (kernel and not said):
            boot += 1
            last_boot_ts = 0.0
        said = journal or (said and "Xid" not in line)
        if ts is not None:
            last_ts = ts
            last_boot_ts = max(last_boot_ts, ts)
        if marker or "Xid" not in line:
            continue
        m = _XID_RE.search(line)
        if m is None:
            continue
        pci = _PCI_RE.search(m.group(1))
        events.append({
            "xid": int(m.group(2)),
            "pci": pci.group(0) if pci else None,
            "text": line[m.start():].rstrip(),
            "boot": boot,
        })
    stale = 1 if uptime_s is not None and last_boot_ts > uptime_s else 0
    for e in events:
        e["boots_ago"] = boot - e.pop("boot") + stale
    return events


def boots_text(events: list[dict[str, Any]]) -> str:
    """The Xid lines of ``events`` as a kernel log a replay parses back the same: the message of each,
    a :data:`REBOOT_LINE` wherever the boot changes (and after the last event when it is from an
    earlier boot), so a capture keeps which boot each Xid came from."""
    out: list[str] = []
    prev: int | None = None
    for e in events:
        if not isinstance(e, dict) or not e.get("text"):
            continue
        ago = e["boots_ago"] if isinstance(e.get("boots_ago"), int) else 0
        if prev is not None:
            out += [REBOOT_LINE] * max(0, prev - ago)
        out.append(str(e["text"]))
        prev = ago
    out += [REBOOT_LINE] * (prev or 0)
    return "".join(f"{x}\n" for x in out)


def _hint(path: str, e: OSError) -> str:
    """What to do when the kernel log at ``path`` cannot be opened: root, or a saved log (--xid-log)."""
    if path != KMSG_PATH:
        return ""
    return " (run as root or give --xid-log)" if e.errno in (errno.EACCES, errno.EPERM) else " (give --xid-log)"


def read_uptime_s(path: str = "/proc/uptime") -> float | None:
    """Seconds since this boot (the first figure of /proc/uptime); None when unreadable."""
    try:
        with open(path, encoding="ascii") as f:
            return float(f.read(64).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def read_xid_events(
    path: str = KMSG_PATH, deadline: float | None = None, max_bytes: int = XID_MAX_BYTES,
    uptime_s: float | None = None,
) -> tuple[list[dict[str, Any]] | None, str, list[str]]:
    """Read the kernel log at ``path`` non-blocking: ``(events, source, notes)``; never raises.

    ``path`` is ``/dev/kmsg`` (one record per read, until EAGAIN: this boot only) or a saved log (``dmesg``,
    ``journalctl -k``, which may span boots; its last ``max_bytes`` are read; ``uptime_s``, this boot's,
    dates its last boot: :func:`parse_xid_lines`). Stops at ``max_bytes`` or at ``deadline``
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
            xid_lines.extend(p.decode("utf-8", "replace") for p in pieces if _keep(p))
        if partial and _keep(partial):
            xid_lines.append(partial.decode("utf-8", "replace"))
        if lost:
            notes.append(f"xid: {path}: {lost} times records were overwritten while reading")
    finally:
        os.close(fd)
    events = parse_xid_lines(xid_lines, None if path == KMSG_PATH else uptime_s)
    if len(events) > XID_MAX_EVENTS:
        notes.append(f"xid: {len(events)} Xid events; the last {XID_MAX_EVENTS} kept")
        events = events[-XID_MAX_EVENTS:]
    return events, path, notes
