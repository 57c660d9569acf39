"""PCIe AER probe: the AER counters (``aer_dev_correctable``, ``aer_dev_nonfatal``, ``aer_dev_fatal``)
of every Mellanox function (vendor ``0x15b3``: the ConnectX NIC's PFs and VFs) and every NVIDIA
display or 3D controller (vendor ``0x10de``, class ``0x03xxxx``: the GPUs) under
``<root>/sys/bus/pci/devices``, and ``<root>/proc/sys/kernel/random/boot_id``. The devices are found
from sysfs itself, not from the NIC or GPU probe, so a ``host`` run reads them without the fabric or
GPU probes. Reads only, bounded (:data:`MAX_FUNCTIONS` functions looked at); never raises. A capture
keeps ``aer.json``; a replay reads it back. Command-line equivalent: ``lspci -vvv`` (UESta, CESta).
"""

from __future__ import annotations

import os
from typing import Any

from afddiag.model.aer import AER_KINDS, AerFacts, parse_aer
from afddiag.model.nic import MELLANOX_VENDOR
from afddiag.probes.registry import Artifact, Probe, Run
from afddiag.probes.sysfs import entry_names

NVIDIA_VENDOR = "0x10de"
MAX_FUNCTIONS = 4096  # PCI functions looked at
MAX_DEVICES = 256  # AER readings kept
BOOT_ID = "proc/sys/kernel/random/boot_id"


def _kind(run: Run, base: str) -> str | None:
    vendor = (run.try_read(f"{base}/vendor") or "").lower()
    if vendor == MELLANOX_VENDOR:
        return "nic"
    if vendor == NVIDIA_VENDOR and (run.try_read(f"{base}/class") or "").lower().startswith("0x03"):
        return "gpu"
    return None


def read_aer(run: Run, root: str) -> dict[str, Any] | None:
    """``{"boot_id", "devices": [{"bdf", "kind", "correctable", "nonfatal", "fatal"}], "notes"}`` under
    ``root``; each attribute the raw text (None: absent or unreadable); None when the tree has no
    ``sys/bus/pci/devices`` (a snapshot folder without it: not captured). Never raises."""
    pci = os.path.join(root, "sys", "bus", "pci", "devices")
    if not os.path.isdir(pci):
        return None
    notes: list[str] = []
    boot = run.try_read(os.path.join(root, BOOT_ID))
    names = entry_names(pci)
    if len(names) > MAX_FUNCTIONS:
        notes.append(f"{pci}: {len(names)} functions; the first {MAX_FUNCTIONS} looked at")
    devices: list[dict[str, Any]] = []
    for bdf in names[:MAX_FUNCTIONS]:
        base = f"{pci}/{bdf}"
        kind = _kind(run, base)
        if kind is None:
            continue
        if len(devices) >= MAX_DEVICES:
            notes.append(f"more than {MAX_DEVICES} NIC and GPU functions; the first {MAX_DEVICES} read")
            break
        devices.append({"bdf": bdf, "kind": kind} | {k: run.try_read(f"{base}/aer_dev_{k}") for k in AER_KINDS})
    return {"boot_id": boot.strip()[:64] if boot else None, "devices": devices, "notes": notes}


def aer_facts(raw: Any) -> AerFacts:
    """Facts from ``aer.json`` (a capture's, so untrusted: every field checked and bounded). Pure."""
    if not isinstance(raw, dict):
        return AerFacts(captured=False, notes=["AER counters not captured (no aer.json in the snapshot)"])
    devices: list[dict[str, Any]] = []
    listed = raw.get("devices")
    for d in listed if isinstance(listed, list) else []:
        if not isinstance(d, dict) or d.get("kind") not in ("nic", "gpu"):
            continue
        devices.append({"bdf": str(d.get("bdf"))[:64], "kind": d["kind"]} | {k: parse_aer(d.get(k)) for k in AER_KINDS})
        if len(devices) >= MAX_DEVICES:
            break
    boot = raw.get("boot_id")
    return AerFacts(boot_id=boot[:64] if isinstance(boot, str) else None, devices=devices,
                    notes=[n[:300] for n in raw.get("notes") or [] if isinstance(n, str)][:50])


def _read(run: Run, progress: Any) -> dict[str, Any]:
    root = run.src.root
    progress.doing = "reading PCIe AER counters (/sys/bus/pci/devices/<bdf>/aer_dev_*)"
    return {"aer.json": read_aer(run, root) if root is not None else None}


PROBE = Probe("aer", "PCIe AER probe (sysfs)", "fabric_s", (Artifact("aer.json"),), _read,
              lambda run, r, progress: {"aer": aer_facts(r.get("aer.json"))},
              lambda why: {"aer": AerFacts(captured=False, failed=why, notes=[why])})
