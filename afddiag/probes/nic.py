"""The NIC probe: a DGX Spark's ConnectX-7 hot-plug state (sysfs under a root path, read only: the
``pcie_hotplug`` attributes are never written, ``debug_state`` emulates a cable event), the Mellanox PCI
functions present, and the NIC's kernel-log lines (mlx5 and the hot-plug driver), read as the Xid lines
are: ``/dev/kmsg`` non-blocking (or the saved log ``--xid-log``) live, ``kernel-nic.log`` in a capture,
that file (or a saved ``dmesg``/``journalctl -k`` log in the snapshot) in a replay. Never raises."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from typing import Any

from afddiag import reader
from afddiag.model.nic import HOTPLUG_PLATFORM, MELLANOX_VENDOR, NicFacts
from afddiag.probes.registry import LIVE, Artifact, Probe, Run
from afddiag.probes.sysfs import entry_names
from afddiag.probes.xid import BOOT_MARKERS, JOURNAL_BOOT, KERNEL_BOOT, read_uptime_s
from afddiag.textnum import digits

KMSG_PATH = "/dev/kmsg"
NIC_LOG = "kernel-nic.log"  # what a capture keeps of the kernel log: the NIC's lines
SAVED_LOGS = ("dmesg.txt", "dmesg.log", "kmsg.txt", "kern.log", "journalctl-k.txt")  # a snapshot's saved logs
LOG_MAX_BYTES = 4 << 20  # kernel log read live at most (the kmsg ring is usually far smaller)
SAVED_MAX_BYTES = 16 << 20  # a saved log's cap in a replay
MAX_LINES = 2000  # NIC lines kept (the last ones; a note counts the rest)
MAX_FUNCTIONS = 4096  # PCI functions looked at
#: What makes a kernel-log line the NIC's: mlx5's device prefix, the hot-plug driver's name or ACPI id.
NIC_MARKS = (b"mlx5", b"cx7-pcie-hotplug", b"MTKP0001")
#: What a read keeps: the NIC's lines and the lines that start a boot (:func:`this_boot` splits on them).
KEEP_MARKS = NIC_MARKS + tuple(m.encode() for m in BOOT_MARKERS)
_DMESG_TS_RE = re.compile(r"^\s*(?:<\d+>)?\[\s*(\d+\.\d+)\]")


def is_nic_line(line: str) -> bool:
    """True when a kernel-log line is the NIC's (:data:`NIC_MARKS`). Pure."""
    return any(m.decode() in line for m in NIC_MARKS)


def _kept(line: str) -> bool:
    return any(m.decode() in line for m in KEEP_MARKS)


def this_boot(lines: list[str], uptime_s: float | None = None) -> tuple[list[str], int]:
    """``(the NIC lines of the log's last boot, how many NIC lines earlier boots had)``: a log spanning
    reboots (journalctl's "-- Boot" lines, the kernel's banner, dmesg timestamps that go back: the Xid
    reader's rules) is judged on the boot that is running, never on what an earlier boot printed.
    ``uptime_s`` (a live read of a saved log: this boot's /proc/uptime): a last boot whose timestamps
    pass it is an earlier boot too. Pure."""
    boots: list[list[str]] = [[]]
    last_ts: float | None = None
    last_boot_ts = 0.0
    said = False  # a journal line started this boot and no NIC line came since: the banner is that boot
    for line in lines:
        m = _DMESG_TS_RE.match(line)
        ts = float(m.group(1)) if m else None
        journal = any(b in line for b in JOURNAL_BOOT)
        banner = any(b in line for b in KERNEL_BOOT)
        if journal or ((banner or (ts is not None and last_ts is not None and ts < last_ts)) and not said):
            boots.append([])
            last_boot_ts = 0.0
        nic = is_nic_line(line) and not journal and not banner
        said = journal or (said and not nic)
        if ts is not None:
            last_ts = ts
            last_boot_ts = max(last_boot_ts, ts)
        if nic:
            boots[-1].append(line)
    current, earlier = boots[-1], sum(len(b) for b in boots[:-1])
    if uptime_s is not None and last_boot_ts > uptime_s:
        current, earlier = [], earlier + len(current)
    return current, earlier


def _boot_note(earlier: int) -> str:
    return f"; {earlier} NIC line(s) of earlier boots not judged" if earlier else ""


def _int_attr(run: Run, path: str) -> int | None:
    text = run.try_read(path)
    return int(text) if text is not None and digits(text.strip()) else None


def read_hotplug(run: Run, root: str) -> dict[str, Any] | None:
    """The hot-plug state under ``root``: ``{"hotplug_driver", "hotplug_enabled", "debug_state",
    "legacy_plugin", "functions", "notes"}`` (see :class:`afddiag.model.nic.NicFacts`); None when the
    tree has neither the hot-plug device nor ``sys/bus/pci`` (a snapshot folder without them: not
    captured). Reads only (``cat /sys/devices/platform/MTKP0001:00/pcie_hotplug/*``, ``lspci -d 15b3:``)."""
    plat = os.path.join(root, HOTPLUG_PLATFORM)
    pci = os.path.join(root, "sys", "bus", "pci", "devices")
    if not os.path.isdir(plat) and not os.path.isdir(pci):
        return None
    out: dict[str, Any] = {"hotplug_driver": os.path.isdir(plat), "hotplug_enabled": None, "debug_state": None,
                           "legacy_plugin": None, "functions": None, "notes": []}
    if out["hotplug_driver"]:
        out["hotplug_enabled"] = _int_attr(run, f"{plat}/pcie_hotplug/hotplug_enabled")
        out["debug_state"] = _int_attr(run, f"{plat}/pcie_hotplug/debug_state")
        out["legacy_plugin"] = _int_attr(run, f"{plat}/cx7_dbg/plugin")
    if not os.path.isdir(pci):
        out["notes"].append(f"{pci}: not listed")
        return out
    names = entry_names(pci)
    if len(names) > MAX_FUNCTIONS:
        out["notes"].append(f"{pci}: {len(names)} functions; the first {MAX_FUNCTIONS} looked at")
    funcs = []
    for bdf in names[:MAX_FUNCTIONS]:
        if (run.try_read(f"{pci}/{bdf}/vendor") or "").lower() != MELLANOX_VENDOR:
            continue
        drv = f"{pci}/{bdf}/driver"
        funcs.append({"bdf": bdf, "device": run.try_read(f"{pci}/{bdf}/device"),
                      "driver": os.path.basename(os.readlink(drv)) if os.path.islink(drv) else None})
    out["functions"] = funcs
    return out


def read_kernel_lines(path: str = KMSG_PATH, deadline: float | None = None,
                      max_bytes: int = LOG_MAX_BYTES) -> tuple[list[str] | None, str, list[str]]:
    """The NIC's lines (:func:`is_nic_line`) and boot-start lines of the kernel log at ``path``
    (:func:`this_boot` splits them), non-blocking: ``(lines,
    source, notes)``; ``path`` is ``/dev/kmsg`` (records until EAGAIN) or a saved log (its last
    ``max_bytes``). Stops at ``max_bytes`` or ``deadline`` (``time.monotonic()``) with a note. Never
    raises: an unreadable log gives ``(None, "not readable: <path>: <error>", notes)``."""
    notes: list[str] = []
    deadline = time.monotonic() + 5.0 if deadline is None else deadline
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        denied = path == KMSG_PATH and e.errno in (errno.EACCES, errno.EPERM)
        hint = " (run as root or give --xid-log)" if denied else ""
        return None, f"not readable: {path}: {e.strerror or e}{hint}", notes
    kept: list[bytes] = []
    total, lost, partial, cut = 0, 0, b"", False
    try:
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
                os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
                notes.append(f"nic: {path} is {st.st_size} bytes; read its last {max_bytes}")
                cut = True  # the first line read is a cut one: dropped
        except OSError:
            pass
        while total < max_bytes:
            if time.monotonic() > deadline:
                notes.append(f"nic: stopped reading {path} at the time bound after {total} bytes")
                break
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:  # EAGAIN: no more kmsg records
                break
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EPIPE and lost < 1000:  # kmsg records overwritten while reading
                    lost += 1
                    continue
                notes.append(f"nic: reading {path} stopped: {e.strerror or e}")
                break
            if not chunk:
                break
            total += len(chunk)
            *whole, partial = (partial + chunk).split(b"\n")
            if cut and whole:
                whole, cut = whole[1:], False
            kept.extend(p for p in whole if any(m in p for m in KEEP_MARKS))
        if partial and any(m in partial for m in KEEP_MARKS):
            kept.append(partial)
    finally:
        os.close(fd)
    lines = [p.decode("utf-8", "replace") for p in kept]
    if len(lines) > MAX_LINES:
        notes.append(f"nic: {len(lines)} NIC kernel-log lines; the last {MAX_LINES} kept")
        lines = lines[-MAX_LINES:]
    return lines, path, notes


# ---------------------------------------------------------------------------------------------
# the probe


def _live_log(run: Run) -> tuple[list[str] | None, str, list[str]]:
    src = run.src.kernel_log
    if src is None:
        return None, "not read", []
    if src is LIVE:
        lines, source, notes = read_kernel_lines(run.inputs.xid_log or KMSG_PATH,
                                                 time.monotonic() + run.inputs.timeout("fabric_s"))
        if lines is None:
            return lines, source, notes
        lines, earlier = this_boot(lines, read_uptime_s() if run.inputs.xid_log else None)
        return lines, source + _boot_note(earlier), notes
    lines, earlier = this_boot([x for x in src().splitlines() if _kept(x)])
    return lines, "given" + _boot_note(earlier), []


def _read(run: Run, progress: Any) -> dict[str, Any]:
    root = run.src.root
    progress.doing = "reading the CX-7 hot-plug state and Mellanox PCI functions"
    state = read_hotplug(run, root) if root is not None else None
    progress.doing = "reading the NIC's kernel-log lines"
    lines, source, notes = _live_log(run)
    if state is not None:
        state = {**state, "kernel_source": source, "notes": state["notes"] + notes}
    return {"nic.json": state, NIC_LOG: "".join(f"{x}\n" for x in lines) if lines is not None else None,
            "lines": lines, "source": source, "log_notes": notes}


def _snapshot_lines(run: Run, r: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    """A replay's NIC lines: ``--xid-log`` when given, else ``kernel-nic.log``, else a saved log."""
    if run.inputs.xid_log:
        try:
            text = reader.read_text(run.inputs.xid_log, None, SAVED_MAX_BYTES, errors="replace")
        except (OSError, reader.InputError) as e:
            return None, f"not read: {run.inputs.xid_log}: {e}"
        lines, earlier = this_boot([x for x in text.splitlines() if _kept(x)])
        return lines, run.inputs.xid_log + _boot_note(earlier)
    for name in (NIC_LOG, *SAVED_LOGS):
        if isinstance(r.get(name), str):
            lines, earlier = this_boot([x for x in r[name].splitlines() if _kept(x)])
            return lines, f"snapshot {name}" + _boot_note(earlier)
    return None, "not captured: no kernel-nic.log or saved kernel log in the snapshot"


def _typed(raw: dict[str, Any], key: str, kind: type) -> Any:
    v = raw.get(key)
    return v if isinstance(v, kind) and not (kind is int and isinstance(v, bool)) else None


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get("nic.json")
    if run.live:
        lines, source = r.get("lines"), r.get("source")
    else:
        lines, source = _snapshot_lines(run, r)
    if not isinstance(raw, dict):
        why = "NIC hot-plug state not captured (no nic.json in the snapshot)" if not run.live else "sysfs not read"
        return {"nic": NicFacts(captured=False, kernel_lines=lines, kernel_source=source, notes=[why])}
    funcs = raw.get("functions")
    facts = NicFacts(
        hotplug_driver=_typed(raw, "hotplug_driver", bool), hotplug_enabled=_typed(raw, "hotplug_enabled", int),
        debug_state=_typed(raw, "debug_state", int), legacy_plugin=_typed(raw, "legacy_plugin", int),
        functions=[{"bdf": str(f.get("bdf"))[:64], "device": f.get("device"), "driver": f.get("driver")}
                   for f in funcs if isinstance(f, dict)][:MAX_FUNCTIONS] if isinstance(funcs, list) else None,
        kernel_lines=lines, kernel_source=source,
        notes=[str(n)[:300] for n in raw.get("notes") or [] if isinstance(n, str)][:50])
    return {"nic": facts}


def _failed(why: str) -> dict[str, Any]:
    return {"nic": NicFacts(captured=False, failed=why, notes=[why])}


def _report(facts: NicFacts) -> dict[str, Any]:
    """The report's facts: everything but the raw kernel lines (the gates name the ones that matter)."""
    return {k: v for k, v in vars(facts).items() if k != "kernel_lines"} | {
        "kernel_lines_read": None if facts.kernel_lines is None else len(facts.kernel_lines)}


PROBE = Probe("nic", "NIC probe (CX-7 hot-plug sysfs, kernel log)", "fabric_s",
              (Artifact("nic.json"), Artifact(NIC_LOG, "text", SAVED_MAX_BYTES))
              + tuple(Artifact(n, "text", SAVED_MAX_BYTES) for n in SAVED_LOGS),
              _read, _facts, _failed, report=_report)
