"""PCIe Advanced Error Reporting (AER) counters of the NIC functions and GPUs. Data only.

The kernel's PCIe AER driver keeps, per PCI function, three sysfs attributes under
``/sys/bus/pci/devices/<bdf>/``: ``aer_dev_correctable``, ``aer_dev_nonfatal`` and ``aer_dev_fatal``
(``Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats``), each a list of ``NAME count`` lines
(``RxErr 0``, ``BadTLP 0``, ... ``DLP 0``, ``SDES 0``) ending with a total (``TOTAL_ERR_COR``,
``TOTAL_ERR_NONFATAL``, ``TOTAL_ERR_FATAL``). The counts run from boot, so a comparison between runs
is meaningful only within one boot: the facts carry ``/proc/sys/kernel/random/boot_id``.
The probe is :mod:`afddiag.probes.aer`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

AER_KINDS = ("correctable", "nonfatal", "fatal")  # aer_dev_<kind>
TOTALS = {"correctable": "TOTAL_ERR_COR", "nonfatal": "TOTAL_ERR_NONFATAL", "fatal": "TOTAL_ERR_FATAL"}
MAX_NAMES = 64  # error names kept per attribute (the kernel prints about 20)
MAX_COUNT = 1 << 64  # a counter is a u64
_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_]{0,39})\s+([0-9]{1,20})$")


def parse_aer(text: object) -> dict[str, int] | None:
    """An ``aer_dev_*`` attribute's text → ``{error name: count}`` (its ``TOTAL_ERR_*`` line included);
    lines that are not ``NAME count`` are skipped; None when no line parses (not an AER attribute). Pure."""
    if not isinstance(text, str):
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m and len(out) < MAX_NAMES and int(m.group(2)) < MAX_COUNT:
            out[m.group(1)] = int(m.group(2))
    return out or None


def total(counts: dict[str, int] | None, kind: str) -> int | None:
    """The attribute's total: its ``TOTAL_ERR_*`` line, else the sum of its counts; None when unread. Pure."""
    if counts is None:
        return None
    t = counts.get(TOTALS[kind])
    return t if t is not None else sum(v for k, v in counts.items() if not k.startswith("TOTAL_ERR_"))


def nonzero(counts: dict[str, int] | None) -> list[str]:
    """``["BadTLP 3", ...]``: the error names with a count above 0, totals left out. Pure."""
    return [f"{k} {v}" for k, v in (counts or {}).items() if v and not k.startswith("TOTAL_ERR_")]


@dataclass
class AerFacts:
    """What the AER probe saw. ``boot_id``: ``/proc/sys/kernel/random/boot_id`` (None: unread);
    ``devices``: ``[{"bdf", "kind": "nic"|"gpu", "correctable"|"nonfatal"|"fatal": {name: count} | None}]``
    for every Mellanox function and NVIDIA display/3D function under ``/sys/bus/pci/devices`` (None where
    the attribute is absent: a kernel without AER statistics, or a function without the capability)."""

    captured: bool = True
    boot_id: str | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    failed: str | None = None
    notes: list[str] = field(default_factory=list)
