"""GPU facts: the CUDA driver's and NVML's view of each GPU, joined by UUID, and the load figures.

Data only (no I/O); :func:`gpu_facts_from_readings` normalises the GPU probe's readings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from afddiag.baseline import THROUGHPUT_NAMES

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


READING_MAX = 1 << 64  # NVML, CUDA and /proc/meminfo report at most 64-bit values: beyond is garbage


def _num(v: Any) -> Any:
    """A recorded reading to a number or None ("NOT_SUPPORTED", null, NaN, infinity, integers beyond
    64 bits, garbage → None)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if -READING_MAX < v < READING_MAX else None
    if isinstance(v, float) and math.isfinite(v):
        return v
    return None


def _int(v: Any) -> int | None:
    """A recorded integer reading (a bitmask, a P-state) or None (floats, booleans, integers beyond
    64 bits, garbage)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and -READING_MAX < v < READING_MAX else None


def _typed(src: Mapping[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    """``src[key]`` when it is an instance of ``kinds``, else None (missing, null, another type): how
    a recorded reading whose shape is not trusted is read field by field."""
    v = src.get(key)
    return v if isinstance(v, kinds) else None


def _meminfo(raw: Any) -> dict[str, int] | None:
    """``host_meminfo_kb`` (``/proc/meminfo`` fields in kB) with only the values a kernel can print:
    non-negative integers below 2**64; anything else is left out (None when nothing is left)."""
    if not isinstance(raw, dict):
        return None
    kept = {k: v for k, v in raw.items() if isinstance(k, str) and _int(v) is not None and v >= 0}
    return kept or None


BUSY_UTILIZATION_PCT = 10.0  # GPU utilization at or above this while afddiag runs no kernel: another job


def is_own_process(p: Any, own_pids: set[int] | frozenset[int] = frozenset()) -> bool:
    """True when an NVML process entry (``{pid, name, ...}``) is afddiag itself: its pid is one of
    ``own_pids`` (the probing process, ``GpuFacts.probe_pid``) or its name starts with ``afddiag``
    (the CUDA context afddiag opens to read the SM count shows in ``nvidia-smi`` like any other)."""
    return isinstance(p, dict) and (p.get("pid") in own_pids or str(p.get("name") or "").startswith("afddiag"))


def other_compute(processes: Any, own_pids: set[int] | frozenset[int] = frozenset()) -> list[dict[str, Any]]:
    """The compute processes in an NVML process list (``[{pid, name, used_bytes, type}]``) that are
    not afddiag: ``type`` "graphics" (a display server) and afddiag's own (:func:`is_own_process`)
    are left out. A list without ``type`` counts as compute."""
    if not isinstance(processes, list):
        return []
    return [p for p in processes if isinstance(p, dict) and p.get("type", "compute") != "graphics"
            and not is_own_process(p, own_pids)]


def busy_evidence(processes: Any, utilization_pct: Any, own_pids: set[int] | frozenset[int] = frozenset(),
                  when: str = "just before the load probe") -> list[str]:
    """Why a GPU counts as busy with another job: ``["pid 443, python3", "utilization 97 % <when>"]``;
    [] when neither another compute process (:func:`other_compute`) nor utilization at or above
    :data:`BUSY_UTILIZATION_PCT` was seen."""
    out = [f"pid {p.get('pid')}, {p.get('name') or 'name unknown'}" for p in other_compute(processes, own_pids)]
    u = _num(utilization_pct)
    if isinstance(u, (int, float)) and not isinstance(u, bool) and u >= BUSY_UTILIZATION_PCT:
        out.append(f"utilization {u:g} % {when}")
    return out


#: The load probe's throughput figures (fields of :class:`UnderLoad`) with their units, and every figure a
#: GPU is compared by under load (the SM clock first): the one list the gates, the summary and the
#: baseline refusals read.
THROUGHPUT_FIGURES: tuple[tuple[str, str], ...] = tuple(zip(THROUGHPUT_NAMES, ("TFLOP/s", "TFLOP/s", "GB/s", "GB/s"),
                                                             strict=True))
LOAD_FIGURES: tuple[tuple[str, str], ...] = (("clock_sm_mhz", "MHz"), *THROUGHPUT_FIGURES)


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
    busy_before: dict[str, Any] | None = None  # the load probe's pre-check: {utilization_pct, processes, ...}
    busy_after: dict[str, Any] | None = None  # compute processes seen right after the load probe


@dataclass
class GpuDevice:
    """One GPU: the CUDA driver's view and NVML's, joined by UUID."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    sm_count: int | None = None  # CUDA attribute 16 (CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    compute_capability: tuple[int, int] | None = None  # CUDA attributes 75/76, else nvmlDeviceGetCudaComputeCapability
    integrated: bool | None = None  # CUDA attribute 18
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_source: str | None = None  # "nvml" or "meminfo, unified memory"
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
    load_busy_before: dict[str, Any] | None = None  # a skipped load probe's busy check (under_load.busy_before)
    utilization_pct: float | None = None  # nvmlDeviceGetUtilizationRates().gpu at the GPU probe's read (%)
    ecc: dict[str, Any] | str | None = None  # {"mode_current", "volatile": {...}, "aggregate": {...}} or NOT_SUPPORTED
    retired_pages: dict[str, Any] | str | None = None
    remapped_rows: dict[str, Any] | str | None = None
    processes: list[dict[str, Any]] | str | None = None  # other processes holding GPU memory
    nvml_read: bool = True  # False: NVML gave no readings for it (its handle failed, e.g. GPU_IS_LOST; or CUDA-only)
    notes: list[str] = field(default_factory=list)


@dataclass
class GpuFacts:
    """What the GPU probe read (live, or replayed from a snapshot)."""

    captured: bool = True  # False: a snapshot without the GPU readings
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
    cuda_view: dict[str, Any] | None = None  # {"read": bool, "why": str}: was the CUDA driver asked, and why (not)
    probe_pid: int | None = None  # the afddiag process that read NVML (its own CUDA context is not "another job")
    notes: list[str] = field(default_factory=list)
    readings: GpuReadings | None = None  # the raw readings (afddiag.probes.gpu.read_gpu's shape, not trusted)
    failed: str | None = None  # the GPU probe timed out or crashed: what it was doing (gpu.* say ERROR)
    load_failed: str | None = None  # the load probe timed out or crashed (gpu.slow-state says ERROR)


def gpu_device_from_reading(i: int, d: dict[str, Any], meminfo: dict[str, int] | None) -> GpuDevice:
    """The :class:`GpuDevice` of one entry ``d`` of the readings' ``devices`` (the ``i``-th): CUDA's and
    NVML's figures, its memory (:func:`_read_memory`), its under-load figures (:func:`_read_under_load`)
    and notes."""
    cuda = _typed(d, "cuda", dict) or {}
    nvml = _typed(d, "nvml", dict) or {}
    cc = cuda.get("compute_capability")
    if not isinstance(cc, (list, tuple)):  # CUDA not read (or silent): NVML's view of the same fact
        cc = nvml.get("compute_capability")
    dev = GpuDevice(
        index=d.get("index", i) if isinstance(d.get("index", i), int) else i,
        name=_typed(d, "name", str),
        uuid=_typed(d, "uuid", str),
        pci_bus_id=_typed(d, "pci_bus_id", str),
        sm_count=_num(cuda.get("sm_count")),
        compute_capability=(int(cc[0]), int(cc[1]))
        if isinstance(cc, (list, tuple)) and len(cc) == 2 and all(isinstance(x, int) for x in cc)
        else None,
        integrated=_typed(cuda, "integrated", bool),
        clock_sm_mhz=_num(nvml.get("clock_sm_mhz")),
        clock_sm_max_mhz=_num(nvml.get("clock_sm_max_mhz")),
        power_mw=_num(nvml.get("power_mw")),
        power_limit_mw=_num(nvml.get("power_limit_mw")),
        pstate=_int(nvml.get("pstate")),
        clocks_event_reasons=_int(nvml.get("clocks_event_reasons")),
        clocks_event_reason_counters_us=_typed(nvml, "clocks_event_reason_counters_us", dict),
        temperature_c=_num(nvml.get("temperature_c")),
        utilization_pct=_num(nvml.get("utilization_pct")),
        ecc=_typed(nvml, "ecc", (dict, str)),
        retired_pages=_typed(nvml, "retired_pages", (dict, str)),
        remapped_rows=_typed(nvml, "remapped_rows", (dict, str)),
        processes=_typed(nvml, "processes", (list, str)),
        nvml_read=isinstance(d.get("nvml"), dict),
    )
    _read_memory(dev, nvml.get("memory_info"), meminfo)
    _read_under_load(dev, d.get("under_load"))
    for note in _typed(d, "notes", list) or []:
        if isinstance(note, str):
            dev.notes.append(note)
    return dev


def _read_memory(dev: GpuDevice, mem: Any, meminfo: dict[str, int] | None) -> None:
    """Set ``dev``'s memory figures from NVML's ``memory_info`` reading ``mem``; an integrated GPU whose
    NVML says NOT_SUPPORTED reads ``meminfo`` (/proc/meminfo, KiB) as unified memory. Notes what is unread."""
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
            dev.memory_source = "meminfo, unified memory"
            dev.notes.append("NVML memory info NOT_SUPPORTED: unified memory, read /proc/meminfo")
    else:
        dev.notes.append(f"memory not read (NVML memory_info: {mem!r})")


def _read_under_load(dev: GpuDevice, ul: Any) -> None:
    """Set ``dev``'s under-load figures (or why the load probe did not run) from its ``under_load`` reading."""
    if isinstance(ul, dict) and isinstance(ul.get("why"), str):
        dev.load_why = ul["why"]
        dev.load_busy_before = _typed(ul, "busy_before", dict)
    elif isinstance(ul, dict):
        ach = _typed(ul, "achieved", dict) or {}
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
            busy_before=_typed(ul, "busy_before", dict),
            busy_after=_typed(ul, "busy_after", dict),
        )


class CudaView(TypedDict):
    """Whether the GPU probe asked the CUDA driver (``read``) and why, or why not."""

    read: bool
    why: str | None


class CudaReading(TypedDict, total=False):
    """One device as the CUDA driver sees it (``cuDeviceGetAttribute``)."""

    ordinal: int
    sm_count: int | None
    compute_capability: list[int] | None  # [major, minor]
    integrated: bool | None


class UnderLoadReading(TypedDict, total=False):
    """The load probe's readings of one device (``why`` alone when it gave no figures)."""

    why: str
    clock_sm_mhz: float | None
    power_mw: float | None
    utilization_pct: float | None
    clocks_event_reasons: int | None
    pstate: int | None
    achieved: dict[str, float | None]  # THROUGHPUT_FIGURES keys
    busy_before: dict[str, Any] | None
    busy_after: dict[str, Any] | None


class GpuDeviceReading(TypedDict, total=False):
    """One device of the GPU readings: NVML and CUDA joined by UUID (``nvml``: the NVML readings, by the
    names in :mod:`afddiag.probes.gpu`'s docstring; a value NVML refused is ``"NOT_SUPPORTED"``)."""

    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    cuda: CudaReading | None
    nvml: dict[str, Any] | None
    under_load: UnderLoadReading
    notes: list[str]


class GpuReadings(TypedDict, total=False):
    """The GPU probe's readings: what :func:`afddiag.probes.gpu.read_gpu` returns and a snapshot holds (fields and
    sources: that module's docstring, "The readings"); :func:`gpu_facts_from_readings` reads it, never
    trusting its shape (a snapshot may hold anything)."""

    driver_version: str | None
    cuda_driver_version: int | None
    versions: dict[str, str | None]  # kernel, bios, nvml
    devices: list[GpuDeviceReading]
    host_meminfo_kb: dict[str, int] | None
    xid_events: list[dict[str, Any]] | None
    xid_source: str | None
    probe_pid: int | None
    cuda_view: CudaView
    notes: list[str]
    why: str
    failed: str
    load_failed: str
    expect: dict[str, Any]  # a snapshot's expectations: image_sm_count, baseline


def gpu_facts_from_readings(r: GpuReadings | Mapping[str, Any]) -> GpuFacts:
    """Normalise the GPU probe's readings (:func:`afddiag.probes.gpu.read_gpu`'s shape, live or from a
    snapshot) into facts.

    ``"NOT_SUPPORTED"`` and nulls become None; NVML memory NOT_SUPPORTED on an integrated GPU falls
    back to ``host_meminfo_kb`` (``/proc/meminfo`` MemTotal/MemAvailable, KiB) with ``unified=True``.
    Never raises on odd values: what cannot be used is left None and noted.
    """
    if not isinstance(r, dict):
        return GpuFacts(available=False, why="gpu readings are not a JSON object", readings=None)
    meminfo = _meminfo(r.get("host_meminfo_kb"))
    expect = _typed(r, "expect", dict) or {}
    devices: list[GpuDevice] = []
    for i, d in enumerate(_typed(r, "devices", list) or []):
        if not isinstance(d, dict):
            continue
        devices.append(gpu_device_from_reading(i, d, meminfo))
    why = _typed(r, "why", str)
    baseline = _typed(expect, "baseline", dict)
    return GpuFacts(
        available=bool(devices),
        why=why if not devices else None,
        driver_version=_typed(r, "driver_version", str),
        cuda_driver_version=_num(r.get("cuda_driver_version")),
        devices=devices,
        host_meminfo_kb=meminfo,
        versions=_typed(r, "versions", dict) or {},
        expect_image_sm_count=_num(expect.get("image_sm_count")),
        baseline={str(k): v for k, v in baseline.items() if _num(v) is not None and not isinstance(v, bool)}
        if baseline is not None else None,
        notes=[n for n in _typed(r, "notes", list) or [] if isinstance(n, str)],
        xid_events=_typed(r, "xid_events", list),
        xid_source=_typed(r, "xid_source", str),
        probe_pid=_int(r.get("probe_pid")),
        cuda_view=_typed(r, "cuda_view", dict),
        readings=cast(GpuReadings, r),
        failed=_typed(r, "failed", str),
        load_failed=_typed(r, "load_failed", str),
    )
