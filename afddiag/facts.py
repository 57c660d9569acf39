"""Plain facts that probes produce and gates judge.

Everything here is data: no I/O. Units are in field names (``_mhz``, ``_mw``, ``_bytes``). A value
the probe could not read is ``None`` and the reason is in the owning object's ``notes``.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from typing import Any

ROCE_V2 = "RoCE v2"
ROCE_V1 = "IB/RoCE v1"


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
    def is_rocev2(self) -> bool:
        return self.type == ROCE_V2


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

    def holds_ipv4(self, ip: str) -> bool:
        return any(a.split("/")[0] == ip for a in self.ipv4)


@dataclass
class FabricFacts:
    """What the fabric probe read: RDMA devices in enumeration order and the netdevs."""

    captured: bool = True  # False: nothing was read (no sysfs tree in a snapshot)
    devices: list[RdmaDevice] = field(default_factory=list)
    order_source: str = "unknown"  # "netlink", "rdma-dev.json", "name (device index unknown)"
    netdevs: dict[str, Netdev] = field(default_factory=dict)
    addresses_source: str = "unknown"
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the probe timed out or crashed: what it was doing (its gates say ERROR)


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


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, lists and dicts to plain JSON types."""
    if hasattr(obj, "__dataclass_fields__"):  # field by field: asdict() deep-copies first
        return {k: to_jsonable(getattr(obj, k)) for k in obj.__dataclass_fields__}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj


NOT_SUPPORTED = "NOT_SUPPORTED"

# NVML clocks event reasons (nvml.h ``nvmlClocksEventReason*``), bit -> name.
CLOCKS_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def clocks_event_reason_names(mask: Any) -> Any:
    """Names of the bits set in an NVML clocks-event-reasons ``mask`` (lowest bit first).

    Unknown bits are named ``unknown_0x...``. A non-int ``mask`` (``None``, ``"NOT_SUPPORTED"``) is
    returned unchanged.
    """
    if not isinstance(mask, int) or isinstance(mask, bool):
        return mask
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCKS_EVENT_REASONS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return names


def _num(v: Any) -> Any:
    """A recorded reading to a number or None ("NOT_SUPPORTED", null, NaN, infinity, garbage → None)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int) or (isinstance(v, float) and math.isfinite(v)):
        return v
    return None


def _int(v: Any) -> int | None:
    """A recorded integer reading (a bitmask, a P-state) or None (floats, booleans, garbage)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass
class UnderLoad:
    """Readings taken while the GPU was busy (a load probe or a recorded serving load)."""

    clock_sm_mhz: float | None = None
    power_mw: float | None = None
    utilization_pct: float | None = None
    clocks_event_reasons: int | None = None
    pstate: int | None = None
    fp32_tflops: float | None = None
    bf16_tflops: float | None = None
    gemv_gbps: float | None = None
    copy_gbps: float | None = None  # read+write bytes


@dataclass
class GpuDevice:
    """One GPU: the CUDA driver's view and NVML's, joined by UUID."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    sm_count: int | None = None  # CUDA attribute 16 (CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    compute_capability: tuple[int, int] | None = None  # CUDA attributes 75/76
    integrated: bool | None = None  # CUDA attribute 18
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_source: str | None = None  # "nvml" or "meminfo (unified memory)"
    unified: bool = False
    clock_sm_mhz: float | None = None
    clock_sm_max_mhz: float | None = None
    power_mw: float | None = None
    power_limit_mw: float | None = None
    pstate: int | None = None
    clocks_event_reasons: int | None = None  # nvmlDeviceGetCurrentClocksEventReasons bitmask
    clocks_event_reason_counters_us: dict[str, int] | None = None
    temperature_c: float | None = None
    under_load: UnderLoad | None = None
    load_why: str | None = None  # why the load probe gave no figures
    ecc: dict[str, Any] | str | None = None  # {"mode_current", "volatile": {...}, "aggregate": {...}} or NOT_SUPPORTED
    retired_pages: dict[str, Any] | str | None = None
    remapped_rows: dict[str, Any] | str | None = None
    processes: list[dict[str, Any]] | str | None = None  # other processes holding GPU memory
    notes: list[str] = field(default_factory=list)


@dataclass
class GpuFacts:
    """What the GPU probe read (live, or a snapshot's ``gpu.json``)."""

    captured: bool = True  # False: a snapshot without gpu.json
    available: bool = False  # NVML or CUDA answered and at least one GPU was seen
    why: str | None = None  # why no GPU was seen
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    devices: list[GpuDevice] = field(default_factory=list)
    host_meminfo_kb: dict[str, int] | None = None
    versions: dict[str, Any] = field(default_factory=dict)
    expect_image_sm_count: int | None = None
    baseline: dict[str, float] | None = None
    xid_events: list[dict[str, Any]] | None = None  # NVRM Xid lines from the kernel log; None: not read
    xid_source: str | None = None
    notes: list[str] = field(default_factory=list)
    readings: dict[str, Any] | None = None  # the raw gpu.json-shaped readings
    failed: str | None = None  # the GPU probe timed out or crashed: what it was doing (gpu.* say ERROR)
    load_failed: str | None = None  # the load probe timed out or crashed (gpu.slow-state says ERROR)


def gpu_facts_from_readings(r: dict[str, Any]) -> GpuFacts:
    """Normalise ``gpu.json``-shaped readings (the GPU probe's output, or a snapshot) into facts.

    ``"NOT_SUPPORTED"`` and nulls become None; NVML memory NOT_SUPPORTED on an integrated GPU falls
    back to ``host_meminfo_kb`` (``/proc/meminfo`` MemTotal/MemAvailable, KiB) with ``unified=True``.
    Never raises on odd values: what cannot be used is left None and noted.
    """
    if not isinstance(r, dict):
        return GpuFacts(available=False, why="gpu readings are not a JSON object", readings=None)
    meminfo = r.get("host_meminfo_kb") if isinstance(r.get("host_meminfo_kb"), dict) else None
    expect = r.get("expect") if isinstance(r.get("expect"), dict) else {}
    devices: list[GpuDevice] = []
    for i, d in enumerate(r.get("devices") if isinstance(r.get("devices"), list) else []):
        if not isinstance(d, dict):
            continue
        cuda = d.get("cuda") if isinstance(d.get("cuda"), dict) else {}
        nvml = d.get("nvml") if isinstance(d.get("nvml"), dict) else {}
        cc = cuda.get("compute_capability")
        dev = GpuDevice(
            index=d.get("index", i) if isinstance(d.get("index", i), int) else i,
            name=d.get("name") if isinstance(d.get("name"), str) else None,
            uuid=d.get("uuid") if isinstance(d.get("uuid"), str) else None,
            pci_bus_id=d.get("pci_bus_id") if isinstance(d.get("pci_bus_id"), str) else None,
            sm_count=_num(cuda.get("sm_count")),
            compute_capability=(int(cc[0]), int(cc[1]))
            if isinstance(cc, (list, tuple)) and len(cc) == 2 and all(isinstance(x, int) for x in cc)
            else None,
            integrated=cuda.get("integrated") if isinstance(cuda.get("integrated"), bool) else None,
            clock_sm_mhz=_num(nvml.get("clock_sm_mhz")),
            clock_sm_max_mhz=_num(nvml.get("clock_sm_max_mhz")),
            power_mw=_num(nvml.get("power_mw")),
            power_limit_mw=_num(nvml.get("power_limit_mw")),
            pstate=_int(nvml.get("pstate")),
            clocks_event_reasons=_int(nvml.get("clocks_event_reasons")),
            clocks_event_reason_counters_us=nvml.get("clocks_event_reason_counters_us")
            if isinstance(nvml.get("clocks_event_reason_counters_us"), dict)
            else None,
            temperature_c=_num(nvml.get("temperature_c")),
            ecc=nvml.get("ecc") if isinstance(nvml.get("ecc"), (dict, str)) else None,
            retired_pages=nvml.get("retired_pages") if isinstance(nvml.get("retired_pages"), (dict, str)) else None,
            remapped_rows=nvml.get("remapped_rows") if isinstance(nvml.get("remapped_rows"), (dict, str)) else None,
            processes=nvml.get("processes") if isinstance(nvml.get("processes"), (list, str)) else None,
        )
        mem = nvml.get("memory_info")
        if isinstance(mem, dict) and _num(mem.get("total_bytes")):
            dev.memory_total_bytes = _num(mem.get("total_bytes"))
            dev.memory_used_bytes = _num(mem.get("used_bytes"))
            dev.memory_free_bytes = _num(mem.get("free_bytes"))
            dev.memory_source = "nvml"
        elif mem == NOT_SUPPORTED and (dev.integrated or dev.integrated is None) and meminfo:
            total = _num(meminfo.get("MemTotal"))
            avail = _num(meminfo.get("MemAvailable"))
            if total:
                dev.unified = True
                dev.memory_total_bytes = int(total) * 1024
                dev.memory_free_bytes = int(avail) * 1024 if avail is not None else None
                dev.memory_source = "meminfo (unified memory)"
                dev.notes.append("NVML memory info NOT_SUPPORTED: unified memory, read /proc/meminfo")
        else:
            dev.notes.append(f"memory not read (NVML memory_info: {mem!r})")
        ul = d.get("under_load")
        if isinstance(ul, dict) and isinstance(ul.get("why"), str):
            dev.load_why = ul["why"]
        elif isinstance(ul, dict):
            ach = ul.get("achieved") if isinstance(ul.get("achieved"), dict) else {}
            dev.under_load = UnderLoad(
                clock_sm_mhz=_num(ul.get("clock_sm_mhz")),
                power_mw=_num(ul.get("power_mw")),
                utilization_pct=_num(ul.get("utilization_pct")),
                clocks_event_reasons=_int(ul.get("clocks_event_reasons")),
                pstate=_int(ul.get("pstate")),
                fp32_tflops=_num(ach.get("fp32_tflops")),
                bf16_tflops=_num(ach.get("bf16_tflops")),
                gemv_gbps=_num(ach.get("gemv_gbps")),
                copy_gbps=_num(ach.get("copy_gbps")),
            )
        for note in d.get("notes") if isinstance(d.get("notes"), list) else []:
            if isinstance(note, str):
                dev.notes.append(note)
        devices.append(dev)
    why = r.get("why") if isinstance(r.get("why"), str) else None
    return GpuFacts(
        available=bool(devices),
        why=why if not devices else None,
        driver_version=r.get("driver_version") if isinstance(r.get("driver_version"), str) else None,
        cuda_driver_version=_num(r.get("cuda_driver_version")),
        devices=devices,
        host_meminfo_kb=meminfo,
        versions=r.get("versions") if isinstance(r.get("versions"), dict) else {},
        expect_image_sm_count=_num(expect.get("image_sm_count")),
        baseline={str(k): v for k, v in expect["baseline"].items() if _num(v) is not None and not isinstance(v, bool)}
        if isinstance(expect.get("baseline"), dict) else None,
        notes=[n for n in r.get("notes") if isinstance(n, str)] if isinstance(r.get("notes"), list) else [],
        xid_events=r.get("xid_events") if isinstance(r.get("xid_events"), list) else None,
        xid_source=r.get("xid_source") if isinstance(r.get("xid_source"), str) else None,
        readings=r,
        failed=r.get("failed") if isinstance(r.get("failed"), str) else None,
        load_failed=r.get("load_failed") if isinstance(r.get("load_failed"), str) else None,
    )


@dataclass
class ImageFacts:
    """The container image the launcher runs (``docker|podman image inspect``, or a snapshot's image.json)."""

    ref: str | None = None
    source: str | None = None  # "docker", "podman", "image.json"
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
