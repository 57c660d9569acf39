"""NIC platform facts: the DGX Spark's ConnectX-7 hot-plug state and the NIC's kernel-log lines.

Since DGX OS's February 2026 kernels a Spark's CX-7 is hot-plugged: the ``cx7-pcie-hotplug`` platform
driver (ACPI ``MTKP0001``; NVIDIA NV-Kernels PR 271, ``drivers/platform/arm64/nvidia/mtk-pcie-hotplug.c``)
removes the CX-7's PCI functions and powers the NIC off when no cable is in its QSFP cage, and powers it
on and rescans the bus when one is plugged in. Its sysfs group ``pcie_hotplug/`` holds
``hotplug_enabled`` (``1``/``0``) and ``debug_state`` (``1``: a cable was present when the driver
started, ``0``: none; only a write changes it afterwards, and a write emulates a cable event, so afddiag
only ever reads it); older kernels had ``cx7_dbg/plugin`` (NV-Kernels PR 228). The driver logs
``Cable plugin`` / ``Cable removal``; mlx5 logs ``Port module event: module <n>, Cable plugged``.
Data only: the probe is :mod:`afddiag.probes.nic`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MELLANOX_VENDOR = "0x15b3"  # PCI vendor id of every ConnectX function (/sys/bus/pci/devices/<bdf>/vendor)
HOTPLUG_PLATFORM = "sys/devices/platform/MTKP0001:00"  # the CX-7 hot-plug driver's ACPI device, under a root

# Kernel-log timestamps: a /dev/kmsg record's third field (microseconds) or dmesg's "[  12.345678]".
_KMSG_TS = re.compile(r"^\d+,\d+,(\d+),[^;]*;")
_DMESG_TS = re.compile(r"^\s*\[\s*(\d+\.\d+)\]")


@dataclass
class NicFacts:
    """What the NIC probe saw. ``hotplug_driver``: the ``MTKP0001:00`` platform device exists (None:
    not read); ``hotplug_enabled``/``debug_state``/``legacy_plugin``: the attributes' integers (None:
    absent or unreadable); ``functions``: ``[{"bdf", "device", "driver"}]`` of every PCI function with
    the Mellanox vendor id (None: ``/sys/bus/pci/devices`` not listed); ``kernel_lines``: the NIC's
    kernel-log lines in order (None: the log was not read; ``kernel_source`` says where from or why not)."""

    captured: bool = True
    hotplug_driver: bool | None = None
    hotplug_enabled: int | None = None
    debug_state: int | None = None
    legacy_plugin: int | None = None
    functions: list[dict[str, Any]] | None = None
    kernel_lines: list[str] | None = None
    kernel_source: str | None = None
    failed: str | None = None
    notes: list[str] = field(default_factory=list)


def line_seconds(line: str) -> float | None:
    """Seconds since boot a kernel-log line carries (a kmsg record's microseconds, dmesg's
    ``[  12.345678]``); None for a line without one (``journalctl -k``, ``dmesg -T``). Pure."""
    m = _KMSG_TS.match(line)
    if m:
        return int(m.group(1)) / 1e6
    m = _DMESG_TS.match(line)
    return float(m.group(1)) if m else None


def message(line: str) -> str:
    """The message of a kernel-log line without its kmsg/dmesg prefix. Pure."""
    m = _KMSG_TS.match(line)
    if m:
        return line[m.end():]
    m = _DMESG_TS.match(line)
    return line[m.end():].lstrip() if m else line


# The hot-plug lines as the drivers print them: mtk-pcie-hotplug.c's dev_info "Cable plugin" / "Cable
# removal" (device "cx7-pcie-hotplug MTKP0001:00"), mlx5 events.c's "Port module event: module %u, %s".
_HOTPLUG_EVENTS = (
    ("plugin", re.compile(r"(?:cx7-pcie-hotplug|MTKP0001)\S*\s*(?:MTKP0001:\d+)?:?\s*Cable plugin\b")),
    ("removal", re.compile(r"(?:cx7-pcie-hotplug|MTKP0001)\S*\s*(?:MTKP0001:\d+)?:?\s*Cable removal\b")),
    ("module-plugged", re.compile(r"Port module event: module \d+, Cable plugged")),
    ("module-unplugged", re.compile(r"Port module event: module \d+, Cable unplugged")),
)


def hotplug_events(lines: list[str] | None) -> list[dict[str, Any]]:
    """The cable events in kernel-log ``lines``, in order: ``[{"event", "seconds", "text"}]``, ``event``
    one of "plugin", "removal" (the hot-plug driver), "module-plugged", "module-unplugged" (mlx5). Pure."""
    out: list[dict[str, Any]] = []
    for line in lines or ():
        for name, rx in _HOTPLUG_EVENTS:
            if rx.search(line):
                out.append({"event": name, "seconds": line_seconds(line), "text": message(line)[:300]})
                break
    return out


def at_seconds(ev: dict[str, Any]) -> str:
    """`` at 812.3 s`` for an event that carries seconds since boot, else "". Pure."""
    return f" at {ev['seconds']:.1f} s" if isinstance(ev.get("seconds"), float) else ""


def driver_events(nic: NicFacts) -> list[dict[str, Any]]:
    """The hot-plug driver's own cable events ("plugin", "removal"), in order."""
    return [e for e in hotplug_events(nic.kernel_lines) if e["event"] in ("plugin", "removal")]


def no_cable_evidence(nic: NicFacts | None) -> str | None:
    """Why the CX-7's functions are absent for want of a cable, in words, or None when the facts do not
    show it: the hot-plug driver present and enabled, no Mellanox PCI function listed, and either its last
    cable event in the kernel log is "Cable removal", or it logged none and ``debug_state`` (or the older
    ``cx7_dbg/plugin``) is 0, which the driver sets from the cage's presence pin when it starts. Pure."""
    if nic is None or not nic.captured or nic.failed or not nic.hotplug_driver or nic.hotplug_enabled != 1:
        return None
    if nic.functions is None or nic.functions:
        return None
    events = driver_events(nic)
    if events:
        last = events[-1]
        return (f"the hot-plug driver logged \"Cable removal\"{at_seconds(last)} and no \"Cable plugin\" since"
                if last["event"] == "removal" else None)
    boot_state = nic.debug_state if nic.debug_state is not None else nic.legacy_plugin
    if boot_state == 0:
        seen = "logged no cable event since" if nic.kernel_lines is not None else "kernel log not read"
        return f"no cable was in the cage when the hot-plug driver started: debug_state 0, {seen}"
    return None


def no_cable_stop(fabric: Any, nic: NicFacts | None) -> str | None:
    """The pair test's local stop on a host whose fabric was looked at and lists no RDMA device while the
    NIC facts show a Spark's CX-7 powered off for want of a cable (:func:`no_cable_evidence`): the sentence
    naming that root and its cabling remedy; None otherwise (the pair test's own "no RDMA device" stop then
    applies). ``fabric``: :class:`afddiag.model.fabric.FabricFacts` or None. Pure."""
    if fabric is None or not fabric.captured or fabric.failed or fabric.devices:
        return None
    cable = no_cable_evidence(nic)
    return None if cable is None else ("no RDMA device on this host: its CX-7 is powered off by the hot-plug driver "
                                       f"because no cable is in its QSFP cage ({cable}): plug the cable in "
                                       "(fabric.cx7-hotplug)")
