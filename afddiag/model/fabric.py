"""Fabric facts: RDMA devices in enumeration order, ports, GID tables, netdevs, the QP walk, routes.

Data only (no I/O). Sources: ``/sys/class/infiniband``, ``/sys/class/net``, NETLINK_RDMA, the QP
probe (pyverbs), ``ip route get`` and the ARP sysctls.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from afddiag.model import ROCE_V2
from afddiag.model import is_link_local_v4 as is_link_local_v4  # re-exported: the gates import it from here

# What a verbs errno from ibv_modify_qp means on RoCE (the QP probe records the errno, gates say it).
ERRNO_WORDS = {
    110: "address resolution timed out (no ARP reply from the peer on this port)",
    101: "network unreachable from this GID's netdev",
    22: "invalid attribute (this GID cannot reach that destination: no IPv4 on this port?)",
    61: "the GID slot is empty",
    113: "no route to host",
    19: "no such device",
    95: "operation not supported by this device",
}


def errno_words(err: int) -> str:
    """Words for a verbs errno, sign ignored (call sites differ): the RoCE meaning when known, else
    ``os.strerror``."""
    import os

    n = abs(int(err))
    if n in ERRNO_WORDS:
        return ERRNO_WORDS[n]
    try:
        return os.strerror(n)
    except (ValueError, OverflowError):
        return f"errno {n}"


def ipv4_from_gid(gid: str) -> str | None:
    """Return the dotted IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None.

    ``gid`` is the kernel's form (8 groups of 4 hex digits, as ``ports/N/gids/I`` prints it) or any
    textual IPv6 form. Returns None for anything that does not parse.
    """
    try:
        addr = ipaddress.IPv6Address(gid.strip())
    except ValueError:
        return None
    mapped = addr.ipv4_mapped
    return str(mapped) if mapped is not None else None


def gid_for_ipv4(ip: str) -> str:
    """Return the kernel's 8-group form of the IPv4-mapped GID for ``ip`` (``0000:…:ffff:c0a8:640a``).

    Raises ValueError when ``ip`` is not an IPv4 address.
    """
    v4 = ipaddress.IPv4Address(ip)
    return ipaddress.IPv6Address("::ffff:" + str(v4)).exploded


def is_empty_gid(gid: str) -> bool:
    """True for an unused GID slot: all zeros (the kernel prints zeros for empty slots)."""
    return all(c in "0:" for c in gid.strip())


@dataclass
class Gid:
    """One populated GID table entry of a port (``/sys/class/infiniband/<hca>/ports/<p>/gids/<i>``)."""

    index: int
    gid: str
    type: str | None = None  # gid_attrs/types/<i>: "RoCE v2" or "IB/RoCE v1"
    netdev: str | None = None  # gid_attrs/ndevs/<i>
    ipv4: str | None = None  # decoded from an IPv4-mapped GID

    @property
    def empty(self) -> bool:
        """An unused slot (all zeros): :func:`is_empty_gid`."""
        return is_empty_gid(self.gid)


@dataclass
class Port:
    """One port of an HCA (``/sys/class/infiniband/<hca>/ports/<num>/``)."""

    num: int
    state: str | None = None  # "ACTIVE", "DOWN", ... (text after "4: ")
    phys_state: str | None = None  # "LinkUp", "Disabled", ...
    link_layer: str | None = None  # "Ethernet" or "InfiniBand"
    rate: str | None = None  # "200 Gb/sec (2X NDR)"
    gids: list[Gid] = field(default_factory=list)  # populated slots only, by index
    gid_slots: int = 0  # slots in the table (populated or not)
    notes: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass
class RdmaDevice:
    """One RDMA device (HCA), in libibverbs enumeration order within :class:`FabricFacts`."""

    name: str
    index: int | None = None  # kernel device index (rdma dev / netlink); None when unknown
    node_guid: str | None = None
    node_type: str | None = None
    hca_type: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None  # sysfs board_id: the board's PSID on mlx5 (MT_0000000838); None: not read
    ports: list[Port] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class Netdev:
    """One network interface (``/sys/class/net/<name>/`` and its addresses)."""

    name: str
    mtu: int | None = None  # bytes
    operstate: str | None = None  # "up", "down", "unknown"
    ipv4: list[str] = field(default_factory=list)  # "a.b.c.d/len"
    ipv6: list[str] = field(default_factory=list)  # "addr/len"
    speed_mbps: int | None = None  # negotiated speed, Mb/s (/sys/class/net/<if>/speed); None: not read, -1: unknown
    speed_errno: int | None = None  # why speed was not read: the read's errno (EINVAL: the kernel refuses it
    # while the link is down; ENOENT: no such file, in a snapshot: not captured); None when it was read
    link_type: str | None = None  # "ether", "infiniband" (IPoIB), "loopback", ... as `ip link` names it; None: not read
    hw_address: str | None = None  # /sys/class/net/<if>/address (an IPoIB one: 4 bytes of QPN, then the port GID)

    @property
    def ipoib(self) -> bool:
        """True for an IPoIB netdev: its port runs the InfiniBand link layer, not Ethernet (no RoCE GID)."""
        return self.link_type == "infiniband"

    def holds_ipv4(self, ip: str) -> bool:
        return any(a.split("/")[0] == ip for a in self.ipv4)


@dataclass
class FabricFacts:
    """What the fabric probe read: RDMA devices in enumeration order and the netdevs."""

    captured: bool = True  # False: nothing was read (no sysfs tree in a snapshot)
    devices: list[RdmaDevice] = field(default_factory=list)
    order_source: str = "unknown"  # "netlink (RDMA_NLDEV_CMD_GET)", the snapshot's file, "name (device index unknown)"
    netdevs: dict[str, Netdev] = field(default_factory=dict)
    addresses_source: str = "unknown"
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the probe timed out or crashed: what it was doing (its gates say ERROR)

    # The inventory queries, on the facts themselves: a caller that holds fabric facts reaches them without
    # importing this module (afddiag.endpoint runs on every run; a run without fabric facts never loads it).

    def ipv4_entries(self) -> list[Entry]:
        """:func:`ipv4_entries` of these facts."""
        return ipv4_entries(self)

    def carriers(self, ip: str) -> list[Entry]:
        """:func:`carriers` of ``ip`` in these facts."""
        return carriers(self, ip)

    def usable_rocev2(self) -> list[Entry]:
        """:func:`usable_rocev2` of these facts."""
        return usable_rocev2(self)

    def rocev2_carriers(self, active_first: bool = True) -> list[Entry]:
        """:func:`rocev2_carriers` of these facts."""
        return rocev2_carriers(self, active_first)


@dataclass
class Entry:
    """A (device, port, GID) triple that carries an IPv4 address: one row of the inventory."""

    ip: str
    device: str
    port: int
    gid_index: int
    gid_type: str | None
    netdev: str | None
    port_state: str | None
    netdev_holds_ip: bool


def ipv4_entries(facts: FabricFacts) -> list[Entry]:
    """Every IPv4-mapped GID on every port, in enumeration order (device, port, GID index)."""
    out: list[Entry] = []
    for dev in facts.devices:
        for port in dev.ports:
            for g in port.gids:
                if g.ipv4 is None:
                    continue
                nd = facts.netdevs.get(g.netdev or "")
                out.append(
                    Entry(
                        ip=g.ipv4,
                        device=dev.name,
                        port=port.num,
                        gid_index=g.index,
                        gid_type=g.type,
                        netdev=g.netdev,
                        port_state=port.state,
                        netdev_holds_ip=bool(nd and nd.holds_ipv4(g.ipv4))
                        or facts.addresses_source == "none",
                    )
                )
    return out


def carriers(facts: FabricFacts, ip: str) -> list[Entry]:
    """Entries whose GID is ``ip``'s IPv4-mapped form and whose netdev holds ``ip`` (any GID type)."""
    return [e for e in ipv4_entries(facts) if e.ip == ip and e.netdev_holds_ip]


def usable_rocev2(facts: FabricFacts) -> list[Entry]:
    """Entries a device map may name: IPv4 RoCE v2 GIDs on ACTIVE ports whose netdev holds the IP."""
    return [
        e
        for e in ipv4_entries(facts)
        if e.gid_type == ROCE_V2 and e.port_state == "ACTIVE" and e.netdev_holds_ip
    ]


def rocev2_carriers(facts: FabricFacts, active_first: bool = True) -> list[Entry]:
    """Entries a device map may name whatever the link does: IPv4 RoCE v2 GIDs whose netdev holds
    the IP, ACTIVE ports first unless ``active_first`` is False (then enumeration order). A map naming
    the device that carries an address is right even while its cable is out; ``fabric.link`` judges
    the link."""
    out = [e for e in ipv4_entries(facts) if e.gid_type == ROCE_V2 and e.netdev_holds_ip]
    return sorted(out, key=lambda e: e.port_state != "ACTIVE") if active_first else out


ORDER_UNKNOWN_PREFIX = "name"  # FabricFacts.order_source when no source gave the device index order


def order_known(facts: FabricFacts) -> bool:
    """True when the devices are in libibverbs' enumeration order (pyverbs, netlink, a captured order),
    False when they are only listed by name (no source of the order was available)."""
    return bool(facts.devices) and not facts.order_source.startswith(ORDER_UNKNOWN_PREFIX) and \
        facts.order_source not in ("unknown", "failed")


@dataclass
class QpStep:
    """One state transition of the QP walk (``ibv_modify_qp``)."""

    to: str  # "INIT", "RTR", "RTS"
    ok: bool
    errno: int | None = None
    message: str | None = None
    elapsed_ms: float = 0.0


@dataclass
class QpResult:
    """The RC QP walk RESET→INIT→RTR→RTS on one device/port."""

    device: str
    port: int | None = None
    sgid_index: int | None = None
    sgid: str | None = None
    sgid_choice: str | None = None  # "fabric IP", "first RoCE v2 GID (fallback)", or why none
    target: str | None = None  # peer IP, or "loopback"
    dgid: str | None = None
    path_mtu: int | None = None  # bytes
    steps: list[QpStep] = field(default_factory=list)
    reached: str = "RESET"
    errno: int | None = None
    error: str | None = None  # what failed, in words
    elapsed_ms: float = 0.0
    destroyed: bool = True  # every QP/CQ/PD/context created was destroyed


@dataclass
class QpFacts:
    """QP probe results for every device (``results``) or why there are none (``why``)."""

    ran: bool = False
    why: str | None = None  # e.g. "pyverbs is not installed: apt install python3-pyverbs"
    results: list[QpResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the probe timed out or crashed: what it was doing (fabric.qp-rtr says ERROR)


@dataclass
class RouteResult:
    """Where the kernel sends packets for one peer (``ip route get``)."""

    peer: str
    dev: str | None = None  # the netdev the route leaves by
    src: str | None = None  # preferred source address
    via: str | None = None  # gateway, None when on-link
    error: str | None = None  # why there is no route ("Network is unreachable", ...)
    source: str = ""  # "ip route get", or the snapshot file it came from
    failed: bool = False  # the lookup itself failed (ip timed out, not installed): no evidence either way


@dataclass
class RouteFacts:
    """Routes to the peers and the ARP sysctls of the netdevs (``conf`` holds raw values per
    interface name, including ``all``; ``effective`` the max(all, netdev) the kernel applies)."""

    captured: bool = True
    fabric_ip: str | None = None
    routes: list[RouteResult] = field(default_factory=list)
    routes_captured: bool = False
    conf: dict[str, dict[str, int | None]] = field(default_factory=dict)
    effective: dict[str, dict[str, int | None]] = field(default_factory=dict)
    sysctl_captured: bool = False
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the route probe timed out or crashed (fabric.route/fabric.arp say ERROR)


@dataclass
class MemRegFacts:
    """What the memory-registration probe saw, normalised (units in names; None where unknown)."""

    captured: bool = True
    driver_version: str | None = None
    open_kernel_module: bool | None = None
    peermem_loaded: bool | None = None
    cma_total_kb: int | None = None
    cma_free_kb: int | None = None
    kho_off: bool | None = None
    kernel_release: str | None = None
    memlock_soft_bytes: int | None = None  # -1 unlimited
    cuda_why: str | None = None
    # per GPU: ordinal, name, integrated, gpu_direct_rdma_supported, dma_buf_supported
    gpus: list[dict[str, Any]] = field(default_factory=list)
    dmabuf_export: dict[str, Any] | None = None  # ordinal, bytes, ok, error
    verbs_why: str | None = None
    # per RDMA device: host_mr, host_mr_count, gpu_mr, dmabuf_mr
    devices: list[dict[str, Any]] = field(default_factory=list)
    count_wanted: int = 0
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the probe timed out or crashed (fabric.mem-registration says ERROR)


def memreg_facts(r: Any) -> MemRegFacts:
    """:class:`MemRegFacts` from :func:`afddiag.probes.memreg.read_memreg` readings (live, or a capture's;
    None: not captured). Odd values become None; never raises."""
    if not isinstance(r, dict):
        return MemRegFacts(captured=False, notes=["memory registration not captured "
                                                  "(the snapshot holds no memory-registration readings)"])

    def d(x: Any) -> dict[str, Any]:
        return x if isinstance(x, dict) else {}

    def i(x: Any) -> int | None:
        return x if isinstance(x, int) and not isinstance(x, bool) else None

    def b(x: Any) -> bool | None:
        return x if isinstance(x, bool) else None

    drv, cma, cu, vb = d(r.get("driver")), d(r.get("cma")), d(r.get("cuda")), d(r.get("verbs"))
    return MemRegFacts(
        driver_version=drv.get("version") if isinstance(drv.get("version"), str) else None,
        open_kernel_module=b(drv.get("open_kernel_module")),
        peermem_loaded=b(drv.get("peermem_loaded")),
        cma_total_kb=i(cma.get("cma_total_kb")), cma_free_kb=i(cma.get("cma_free_kb")),
        kho_off=b(cma.get("kho_off")),
        kernel_release=cma.get("kernel_release") if isinstance(cma.get("kernel_release"), str) else None,
        memlock_soft_bytes=i(r.get("memlock_soft_bytes")),
        cuda_why=(cu.get("why") if isinstance(cu.get("why"), str) else None) if r.get("cuda") is not None
        else "CUDA not probed",
        gpus=[g for g in cu.get("devices", []) if isinstance(g, dict)] if isinstance(cu.get("devices"), list) else [],
        dmabuf_export=cu.get("dmabuf_export") if isinstance(cu.get("dmabuf_export"), dict) else None,
        verbs_why=vb.get("why") if isinstance(vb.get("why"), str) else None,
        devices=[x for x in vb.get("devices", []) if isinstance(x, dict) and isinstance(x.get("name"), str)]
        if isinstance(vb.get("devices"), list) else [],
        count_wanted=i(r.get("count_wanted")) or 0,
        notes=[n for n in r.get("notes", []) if isinstance(n, str)] if isinstance(r.get("notes"), list) else [],
    )
