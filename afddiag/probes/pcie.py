"""PCIe link probe: the negotiated link of each RDMA NIC function and each NVIDIA GPU.

Finds the devices through sysfs device links, under an injectable root:

- NICs: ``/sys/class/infiniband/<hca>/device`` (and the netdevs whose ``/sys/class/net/<if>/device``
  points at the same function) → the PCI address (``0000:01:00.0``);
- GPUs: the functions bound to the ``nvidia`` driver (``/sys/bus/pci/drivers/nvidia/<bdf>``);

then reads ``/sys/bus/pci/devices/<bdf>/{current_link_speed,current_link_width,max_link_speed,
max_link_width,vendor,device}`` as the kernel prints them (``16.0 GT/s PCIe``, ``16``; ``lspci -vv``
LnkSta vs LnkCap), and the same ``max_link_*`` of the port upstream of the function (the parent
folder of the function's real sysfs path, ``/sys/devices/pci0000:00/<port>/<bdf>``: a root port or a
switch's downstream port). A link trains to what *both* ends support: a Gen5 x4 NIC in a slot whose
port is Gen4 or wired x2 trains Gen4 or x2 with nothing wrong with the card.
Reads only; never raises: what could not be read is None and a note says why.
The readings are plain JSON; :func:`afddiag.model.host.pcie_facts` makes facts of them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from afddiag.model.host import PcieFacts, pcie_facts
from afddiag.probes import sysfs
from afddiag.probes.registry import LIVE, Artifact, Probe, Run

BDF_RE = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
LINK_ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width", "vendor", "device")


def _bdf_of(link: str) -> str | None:
    """The PCI address a sysfs ``device`` link points at (its last component), or None (a virtual
    device: rxe, virtio, a platform device)."""
    try:
        target = os.readlink(link)
    except OSError:
        return None
    name = os.path.basename(target.rstrip("/"))
    return name if BDF_RE.match(name) else None


def _list(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def read_pcie(root: str = "/", reader: Callable[[str], str] | None = None) -> dict[str, Any]:
    """``{"devices": {bdf: {"kind": "nic"|"gpu", "names": [hca and netdev names, or "nvidia"],
    <LINK_ATTRS>: text | None}}, "notes": [...]}``. ``reader`` reads one sysfs file (default
    :func:`afddiag.probes.sysfs.read_text`; raises OSError as the kernel answers). Never raises."""
    read = reader or sysfs.read_text
    sys_root = os.path.join(root, "sys")
    devices: dict[str, dict[str, Any]] = {}
    notes: list[str] = []

    def add(bdf: str, kind: str, name: str) -> None:
        d = devices.setdefault(bdf, {"kind": kind, "names": []})
        if name not in d["names"]:
            d["names"].append(name)

    ib = os.path.join(sys_root, "class", "infiniband")
    for hca in _list(ib):
        bdf = _bdf_of(os.path.join(ib, hca, "device"))
        if bdf:
            add(bdf, "nic", hca)
        else:
            notes.append(f"{hca}: not a PCI function (no device link to one): a virtual RDMA device, no PCIe link")
    nic_bdfs = {b for b, d in devices.items() if d["kind"] == "nic"}
    net = os.path.join(sys_root, "class", "net")
    for nd in _list(net):
        bdf = _bdf_of(os.path.join(net, nd, "device"))
        if bdf in nic_bdfs:
            add(bdf, "nic", nd)
    for name in _list(os.path.join(sys_root, "bus", "pci", "drivers", "nvidia")):
        if BDF_RE.match(name):
            add(name, "gpu", "nvidia")
    for bdf, d in devices.items():
        base = os.path.join(sys_root, "bus", "pci", "devices", bdf)
        for a in LINK_ATTRS:
            try:
                d[a] = read(os.path.join(base, a)).strip()
            except (OSError, UnicodeError, ValueError) as e:
                d[a] = None
                err = getattr(e, "strerror", None) or str(e)
                notes.append(f"{base}/{a}: {err}")
        d["upstream"] = _upstream(base, read, notes)
    return {"devices": devices, "notes": notes}


def _upstream(base: str, read: Callable[[str], str], notes: list[str]) -> dict[str, Any] | None:
    """``{"bdf", "max_link_speed", "max_link_width"}`` of the port the function ``base`` hangs off
    (the parent folder of its real sysfs path when that is a PCI address), or None when the function
    sits on a host bridge (``pci0000:00``) or its path cannot be resolved. Never raises."""
    try:
        real = os.path.realpath(base)
    except (OSError, ValueError):
        return None
    parent = os.path.dirname(real)
    pbdf = os.path.basename(parent)
    if not BDF_RE.match(pbdf):
        return None
    up: dict[str, Any] = {"bdf": pbdf}
    for a in ("max_link_speed", "max_link_width"):
        try:
            up[a] = read(os.path.join(parent, a)).strip()
        except (OSError, UnicodeError, ValueError) as e:
            up[a] = None
            notes.append(f"{parent}/{a}: {getattr(e, 'strerror', None) or e}")
    return up


# ---------------------------------------------------------------------------------------------
# the probe


def _read(run: Run, progress: Any) -> dict[str, Any]:
    src = run.src.pcie
    if src is None:
        return {"pcie.json": None}
    if src is not LIVE:
        return {"pcie.json": src()}
    progress.doing = "reading PCIe links (/sys/bus/pci/devices/<bdf>/*_link_*)"
    return {"pcie.json": read_pcie(run.src.root or "/", reader=run.read)}


PROBE = Probe("pcie", "PCIe link probe (sysfs)", "fabric_s", (Artifact("pcie.json"),), _read,
              lambda run, r, progress: {"pcie": pcie_facts(r.get("pcie.json"))},
              lambda why: {"pcie": PcieFacts(captured=False, failed=why, notes=[why])})


def main() -> None:
    """``python -m afddiag.probes.pcie``: the readings as JSON."""
    import json
    import sys

    json.dump(read_pcie(), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
