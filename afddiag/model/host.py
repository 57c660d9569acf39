"""Host facts: the container image the launcher runs, process limits, RDMA device nodes.

Data only (no I/O). Sources: ``docker|podman image inspect``, ``getrlimit``, ``access(2)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from afddiag.textnum import digits


@dataclass
class ImageFacts:
    """The container image the launcher runs (``docker|podman image inspect``, live or replayed)."""

    ref: str | None = None
    source: str | None = None  # "docker", "podman", or the snapshot file
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the image's Config.Env
    why: str | None = None  # why nothing was read
    failed: str | None = None  # the image probe timed out or crashed (gpu.image-arch says ERROR)


@dataclass
class DeviceNode:
    """A character device the engine opens (``/dev/infiniband/uverbs0``, ``rdma_cm``)."""

    path: str
    exists: bool = False
    readable: bool = False
    writable: bool = False


@dataclass
class HostLimits:
    """Process limits and RDMA device-node access of the launching user (``getrlimit``, ``access``)."""

    captured: bool = True
    memlock_soft_bytes: int | None = None  # -1: unlimited (RLIM_INFINITY)
    memlock_hard_bytes: int | None = None
    device_nodes: list[DeviceNode] = field(default_factory=list)
    in_container: bool = False
    user: str | None = None
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the limits probe timed out or crashed (launch.memlock/uverbs-access say ERROR)


@dataclass
class PcieLink:
    """One PCI function's negotiated link (``/sys/bus/pci/devices/<bdf>/``; ``lspci -vv`` LnkSta/LnkCap)."""

    bdf: str
    kind: str  # "nic" (an RDMA device's function) or "gpu" (bound to the nvidia driver)
    names: list[str] = field(default_factory=list)  # HCA and netdev names, or "nvidia"
    current_speed_gts: float | None = None  # GT/s per lane (2.5, 5, 8, 16, 32, 64)
    current_width: int | None = None  # lanes
    max_speed_gts: float | None = None
    max_width: int | None = None
    vendor: str | None = None  # "0x15b3" Mellanox, "0x10de" NVIDIA
    device: str | None = None
    upstream_bdf: str | None = None  # the root or switch port the function's link goes to (None: not read)
    upstream_max_speed_gts: float | None = None  # that port's LnkCap speed, GT/s per lane
    upstream_max_width: int | None = None  # that port's LnkCap width, lanes


@dataclass
class PcieFacts:
    """The PCIe links of the host's RDMA NICs and GPUs (None where unreadable, notes say why)."""

    captured: bool = True
    links: list[PcieLink] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the PCIe probe timed out or crashed (host.pcie says ERROR)


PCIE_MAX_GTS = 256.0  # GT/s: PCIe 7.0 runs 128; a figure above this is not a link speed
PCIE_MAX_LANES = 32  # the widest link the PCIe specification defines


def _gts(text: object) -> float | None:
    """``"16.0 GT/s PCIe"`` / ``"8 GT/s"`` → 16.0 / 8.0; ``"Unknown"``, 0 and garbage (``nan``, ``inf``,
    above :data:`PCIE_MAX_GTS`) → None."""
    if not isinstance(text, str):
        return None
    head = text.strip().split(" ", 1)[0]
    if not re.fullmatch(r"[0-9]{1,4}(\.[0-9]{1,4})?", head):  # the kernel prints "%u.%u GT/s" or "2.5 GT/s"
        return None
    v = float(head)
    return v if 0 < v <= PCIE_MAX_GTS else None


def _lanes(text: object) -> int | None:
    """``"16"`` (or ``"x16"``) → 16; ``"0"``, more than :data:`PCIE_MAX_LANES`, garbage → None."""
    if not isinstance(text, str):
        return None
    t = text.strip().lstrip("xX")
    return int(t) if digits(t) and len(t) <= 3 and 0 < int(t) <= PCIE_MAX_LANES else None


def _table(x: object) -> dict[str, Any]:
    """A JSON object, or {} for anything else."""
    return x if isinstance(x, dict) else {}


def _of_type(x: object, kind: type[Any]) -> list[Any]:
    """The items of a JSON list that are ``kind`` (and not bool), [] for anything else."""
    return [v for v in x if isinstance(v, kind) and not isinstance(v, bool)] if isinstance(x, list) else []


def pcie_facts(r: object) -> PcieFacts:
    """:class:`PcieFacts` from :func:`afddiag.probes.pcie.read_pcie` readings (live, or a capture's;
    None: not captured). Odd values become None; never raises."""
    if not isinstance(r, dict):
        return PcieFacts(captured=False, notes=["PCIe links not captured (the snapshot holds no PCIe readings)"])
    links = []
    for bdf, d in sorted(_table(r.get("devices")).items()):
        if not isinstance(d, dict) or d.get("kind") not in ("nic", "gpu"):
            continue
        up = _table(d.get("upstream"))
        links.append(PcieLink(bdf=str(bdf), kind=d["kind"], names=_of_type(d.get("names"), str),
                              current_speed_gts=_gts(d.get("current_link_speed")),
                              current_width=_lanes(d.get("current_link_width")),
                              max_speed_gts=_gts(d.get("max_link_speed")), max_width=_lanes(d.get("max_link_width")),
                              vendor=d.get("vendor") if isinstance(d.get("vendor"), str) else None,
                              device=d.get("device") if isinstance(d.get("device"), str) else None,
                              upstream_bdf=up.get("bdf") if isinstance(up.get("bdf"), str) else None,
                              upstream_max_speed_gts=_gts(up.get("max_link_speed")),
                              upstream_max_width=_lanes(up.get("max_link_width"))))
    return PcieFacts(links=links, notes=_of_type(r.get("notes"), str))


@dataclass
class ReachFacts:
    """Bounded TCP connects from the fabric IP to the peers' engine ports (:mod:`afddiag.probes.reach`)."""

    captured: bool = True
    source: str | None = None  # the fabric IP the sockets were bound to
    peers: list[str] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # peer, port, ok, outcome, errno, error, elapsed_ms
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the probe timed out or crashed (launch.control-plane says ERROR)
    not_tried: list[tuple[str, int]] = field(default_factory=list)  # (peer, port) past the probe's time bound


#: A note of a capture made before the reach readings held ``not_tried``: ``"10.0.0.2:9000 not tried: ..."``.
_NOT_TRIED_NOTE = re.compile(r"^(\S+):(\d+) not tried")


def _not_tried(r: dict[str, Any]) -> list[tuple[str, int]]:
    """The (peer, port) pairs past the time bound: ``not_tried`` of the readings, else (a capture of an
    older afddiag) the notes that name them."""
    rows = r.get("not_tried")
    if isinstance(rows, list):
        return [(d["peer"], d["port"]) for d in rows if isinstance(d, dict) and isinstance(d.get("peer"), str)
                and isinstance(d.get("port"), int) and not isinstance(d.get("port"), bool)]
    found = (_NOT_TRIED_NOTE.match(n) for n in _of_type(r.get("notes"), str))
    return [(m.group(1), int(m.group(2))) for m in found if m]


def reach_facts(r: object) -> ReachFacts:
    """:class:`ReachFacts` from :func:`afddiag.probes.reach.read_reach` readings (None: not captured).
    Never raises."""
    if not isinstance(r, dict):
        return ReachFacts(captured=False, notes=["not captured in this snapshot"])
    att = [a for a in _of_type(r.get("attempts"), dict) if isinstance(a.get("peer"), str)
           and isinstance(a.get("port"), int)]
    return ReachFacts(source=r.get("source") if isinstance(r.get("source"), str) else None,
                      peers=_of_type(r.get("peers"), str), ports=_of_type(r.get("ports"), int), attempts=att,
                      notes=_of_type(r.get("notes"), str), not_tried=_not_tried(r))
