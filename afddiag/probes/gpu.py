"""Live GPU probe: what NVML and the CUDA driver say about each NVIDIA GPU on this host.

:func:`read_gpu` returns a plain dict in the shape of a case's GPU readings (see
``cases/README.md``), without ``expect``. Every fact names its source under "The readings" below.
Nothing here raises: whatever could not be read is ``None`` (or ``"NOT_SUPPORTED"`` where NVML said
so) and the reason is a line in ``notes``.

CUDA is read through ctypes on ``libcuda.so.1`` without creating a context; NVML through ``pynvml``
(package ``nvidia-ml-py``), imported lazily. NVML and CUDA devices are joined by UUID, never by
index: CUDA's ordinals follow ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``, NVML's do not.

Run ``python -m afddiag.probes.gpu`` to print the readings as JSON.

The readings
------------

- ``driver_version`` (str): ``nvmlSystemGetDriverVersion``, e.g. ``"580.159.04"``.
- ``cuda_driver_version`` (int): ``cuDriverGetVersion``, 1000*major + 10*minor (13000 = 13.0);
  ``nvmlSystemGetCudaDriverVersion_v2`` (same encoding) when CUDA is not read or did not answer.
- ``cuda_view``: ``{"read": bool, "why": str | None}``: whether the CUDA driver was asked, and why
  (or why not).
- ``versions``: ``kernel`` (``uname(2)`` release, as ``platform.release()``), ``bios``
  (``/sys/class/dmi/id/bios_version``), ``nvml`` (``nvmlSystemGetNVMLVersion``).
- ``devices`` (list), NVML index order, NVML and CUDA joined by UUID:

  - ``index`` (NVML index; the CUDA ordinal for a device NVML did not list), ``name``
    (``nvmlDeviceGetName``, else ``cuDeviceGetName``), ``uuid`` (``nvmlDeviceGetUUID``;
    ``GPU-`` + the 16 bytes of ``cuDeviceGetUuid_v2``), ``pci_bus_id``
    (``nvmlDeviceGetPciInfo().busId``).
  - ``cuda`` (None when CUDA does not see it or was not read): ``sm_count`` (``cuDeviceGetAttribute``
    MULTIPROCESSOR_COUNT = 16), ``compute_capability`` ``[major, minor]`` (attributes 75, 76),
    ``integrated`` (bool, attribute 18).
  - ``nvml`` (None when NVML does not see it): ``multiprocessor_count``
    (``nvmlDeviceGetAttributes``; NOT_SUPPORTED outside MIG on most boards),
    ``compute_capability`` ``[major, minor]`` (``nvmlDeviceGetCudaComputeCapability``), ``memory_info``
    ``{total_bytes, used_bytes, free_bytes}`` in bytes (``nvmlDeviceGetMemoryInfo``;
    NOT_SUPPORTED on unified-memory GB10), ``clock_sm_mhz`` (``nvmlDeviceGetClockInfo`` SM, MHz),
    ``clock_sm_max_mhz`` (``nvmlDeviceGetMaxClockInfo`` SM, MHz), ``power_mw``
    (``nvmlDeviceGetPowerUsage``, mW), ``power_limit_mw`` (``nvmlDeviceGetEnforcedPowerLimit``,
    mW), ``pstate`` (``nvmlDeviceGetPerformanceState``, 0 = P0 ... 15, 32 = unknown),
    ``clocks_event_reasons`` (bitmask, ``nvmlDeviceGetCurrentClocksEventReasons``, or
    ``...ThrottleReasons`` with older bindings) and ``clocks_event_reasons_names``,
    ``temperature_c`` (``nvmlDeviceGetTemperature`` GPU, °C), ``pcie`` ``{gen, width}``
    (``nvmlDeviceGetCurrPcieLinkGeneration`` / ``...Width``, current link), ``utilization_pct``
    (``nvmlDeviceGetUtilizationRates().gpu``, %, over the driver's last sample period),
    ``ecc`` ``{mode_current, volatile: {corrected, uncorrected}, aggregate: {...}}``
    (``nvmlDeviceGetEccMode`` current == enabled; ``nvmlDeviceGetTotalEccErrors`` CORRECTED /
    UNCORRECTED x VOLATILE / AGGREGATE) or NOT_SUPPORTED (no ECC, e.g. GB10), ``retired_pages``
    ``{single_bit, double_bit, pending}`` (page counts of ``nvmlDeviceGetRetiredPages`` per
    cause; ``nvmlDeviceGetRetiredPagesPendingStatus``) or NOT_SUPPORTED (row-remapping GPUs),
    ``remapped_rows`` ``{correctable, uncorrectable, pending, failure}``
    (``nvmlDeviceGetRemappedRows``) or NOT_SUPPORTED, ``processes``: ``[{pid, name, used_bytes,
    type}]`` (``nvmlDeviceGetComputeRunningProcesses`` as ``"compute"``, then
    ``...GraphicsRunningProcesses`` as ``"graphics"``; ``name`` from ``psutil``, None when the
    process is gone or not visible; ``used_bytes`` None when NVML cannot tell), NOT_SUPPORTED,
    or None when a list failed. Inner values NVML could not give are None, with a note.
  - ``under_load``: None (this probe puts no load on the GPU).

- ``host_meminfo_kb``: ``{MemTotal, MemAvailable, MemFree, Cached, ...}`` in kB from ``meminfo_path``
  (:func:`read_meminfo`).
- ``xid_events``: ``[{xid, pci, text}]`` (:func:`parse_xid_lines`) from the kernel log, read
  non-blocking from ``kmsg_path`` (or the saved log ``xid_log`` when given), within the time
  bound; None when it could not be read. ``xid_source``: the path read, else why not
  (``"not readable: /dev/kmsg: Permission denied (run as root or give --xid-log)"``).
- ``timings_ms``: wall time of each part, ms: ``nvml_ms`` (nvmlInit to nvmlShutdown), ``cuda_ms``
  (dlopen, cuInit, attributes; absent when CUDA is not read), ``xid_ms`` (the kernel log); NVML and
  CUDA run in parallel threads.
- ``notes`` (list of str): what could not be read, and why.
- ``why`` (str): present only when no GPU was seen at all (``devices == []``: no libnvidia-ml,
  no libcuda, no devices), or when the read took longer than ``timeout_s`` (then ``devices``
  holds what was read before the hang and a note names the call in flight).
- ``failed`` (str): present only when the read timed out or crashed: why, and the call in flight
  (the GPU gates then say ERROR, not SKIP).
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from typing import Any, cast

from afddiag import expect, reader
from afddiag.model.gpu import GpuFacts, GpuReadings, gpu_facts_from_readings
from afddiag.model.run import Inputs, Observation, wants_load
from afddiag.probes import cudadrv
from afddiag.probes.cudadrv import (
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
    CU_DEVICE_ATTRIBUTE_INTEGRATED,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    CUDA_SUCCESS,
    LIBCUDA,
    uuid_from_bytes,
)
from afddiag.probes.gpu_nvml import GpuRead, read_nvml
from afddiag.probes.registry import Artifact, Probe, Run, read_source
from afddiag.probes.xid import KMSG_PATH, boots_text, parse_xid_lines, read_uptime_s, read_xid_events
from afddiag.textnum import digits

BIOS_VERSION_PATH = "/sys/class/dmi/id/bios_version"


_PREINIT: list[threading.Thread] = []


def preinit_cuda() -> None:
    """Start ``cuInit(0)`` in a daemon thread and return at once, so the CUDA driver's initialisation
    (the slowest step of a GPU read on a discrete GPU: every device is set up) overlaps the imports
    and work that come before :func:`read_gpu`; its own ``cuInit`` then returns at once. Idempotent;
    never raises (a missing libcuda is :func:`read_gpu`'s to report). Creates no context."""
    if _PREINIT:
        return

    def init() -> None:
        try:
            cudadrv.load_libcuda().cuInit(0)
        except Exception:  # noqa: BLE001 - read_gpu calls it again and records why
            pass

    t = threading.Thread(target=init, name="afddiag-cuinit", daemon=True)
    _PREINIT.append(t)
    t.start()


MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "Shmem", "CmaTotal", "CmaFree")


def read_meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """The lines of ``/proc/meminfo`` named in :data:`MEMINFO_KEYS`, in kB as the kernel prints them:
    ``MemTotal`` and ``MemAvailable`` always, ``MemFree``, ``Buffers``, ``Cached`` (unified-memory
    headroom: on a GB10 the CUDA free figure follows MemFree, so page cache counts as used) and
    ``CmaTotal``/``CmaFree`` (the Spark registration bug signature) where the kernel prints them.
    Raises OSError/ValueError when the file cannot be read or lacks MemTotal/MemAvailable
    (``grep -E 'Mem|Cached|Cma' /proc/meminfo``)."""
    out: dict[str, int] = {}
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in MEMINFO_KEYS and rest.split() and digits(rest.split()[0]):
                out[key] = int(rest.split()[0])
    missing = {"MemTotal", "MemAvailable"} - out.keys()
    if missing:
        raise ValueError(f"no {', '.join(sorted(missing))} line")
    return out


# --- CUDA driver ----------------------------------------------------------------------------


def _cu_call(run: GpuRead, lib: Any, where: str, name: str, *args: Any) -> bool:
    """Call ``lib.<name>(*args)``; True on CUDA_SUCCESS, else a note and False."""
    run.in_call = f"{name} ({where})"
    try:
        rc = getattr(lib, name)(*args)
    except Exception as e:  # noqa: BLE001
        run.note(f"{where}: {name} failed: {type(e).__name__}: {e}")
        return False
    finally:
        run.in_call = None
    if rc != CUDA_SUCCESS:
        run.note(f"{where}: {name} returned {cudadrv.error_name(lib, rc)}")
        return False
    return True


def _cuda_device(run: GpuRead, lib: Any, ordinal: int) -> dict[str, Any]:
    where = f"CUDA device {ordinal}"
    dev: dict[str, Any] = {"ordinal": ordinal, "uuid": None, "name": None, "cuda": None}
    handle = ctypes.c_int()
    if not _cu_call(run, lib, where, "cuDeviceGet", ctypes.pointer(handle), ordinal):
        return dev
    d = handle.value

    name = ctypes.create_string_buffer(256)
    if _cu_call(run, lib, where, "cuDeviceGetName", name, 256, d):
        dev["name"] = name.value.decode("utf-8", "replace")

    uuid_fn = next(
        (n for n in ("cuDeviceGetUuid_v2", "cuDeviceGetUuid") if getattr(lib, n, None) is not None),
        None,
    )
    raw = (ctypes.c_ubyte * 16)()
    if uuid_fn is None:
        run.note(f"{where}: neither cuDeviceGetUuid_v2 nor cuDeviceGetUuid is exported")
    elif _cu_call(run, lib, where, uuid_fn, raw, d):
        dev["uuid"] = uuid_from_bytes(bytes(raw))

    def attr(a: int) -> int | None:
        v = ctypes.c_int()
        return v.value if _cu_call(run, lib, where, "cuDeviceGetAttribute", ctypes.pointer(v), a, d) else None

    major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
    minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    integrated = attr(CU_DEVICE_ATTRIBUTE_INTEGRATED)
    dev["cuda"] = {
        "sm_count": attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "compute_capability": [major, minor] if major is not None and minor is not None else None,
        "integrated": bool(integrated) if integrated is not None else None,
    }
    return dev


def _read_cuda(run: GpuRead) -> None:
    run.in_call = f"dlopen {LIBCUDA}"
    try:
        lib = cudadrv.load_libcuda()
    except Exception as e:  # noqa: BLE001
        run.cuda["why"] = f"CUDA: {LIBCUDA} not loadable ({e})"
        return
    finally:
        run.in_call = None

    version = ctypes.c_int()
    if _cu_call(run, lib, "CUDA", "cuDriverGetVersion", ctypes.pointer(version)):
        with run.lock:
            run.cuda["driver_version"] = version.value
    if not _cu_call(run, lib, "CUDA", "cuInit", 0):
        run.cuda["why"] = "CUDA: cuInit failed (see notes)"
        return
    count = ctypes.c_int()
    if not _cu_call(run, lib, "CUDA", "cuDeviceGetCount", ctypes.pointer(count)):
        run.cuda["why"] = "CUDA: cuDeviceGetCount failed (see notes)"
        return
    if count.value == 0:
        run.cuda["why"] = "CUDA: 0 devices"
    for ordinal in range(count.value):
        dev = _cuda_device(run, lib, ordinal)
        with run.lock:
            run.cuda["devices"].append(dev)


# --- join -----------------------------------------------------------------------------------


def _worker(run: GpuRead, side: str, read: Any, part: dict[str, Any], timings: dict[str, float]) -> None:
    """One side of the probe (``side`` "nvml": :func:`read_nvml`, "cuda": :func:`_read_cuda`) in its own
    thread: the two driver libraries initialise independently, so NVML's init and device reads overlap
    ``cuInit`` (the slowest step on a discrete GPU) instead of following it. Records the side's wall time in
    ``timings`` (ms)."""
    t0 = time.monotonic()
    try:
        read(run)
    except Exception as e:  # noqa: BLE001 - a bug here must not kill the probe
        run.note(f"GPU probe: {read.__name__} raised {type(e).__name__}: {e}")
    part["done"] = True
    timings[side + "_ms"] = round((time.monotonic() - t0) * 1e3, 1)


def _join(nvml: dict, cuda: dict, notes: list[str]) -> list[dict[str, Any]]:
    """NVML devices in NVML order, each with its CUDA view matched by UUID; then CUDA-only ones."""
    by_uuid = {c["uuid"]: c for c in cuda["devices"] if c["uuid"]}
    used: set[int] = set()
    devices = []
    for n in nvml["devices"]:
        c = by_uuid.get(n["uuid"]) if n["uuid"] else None
        if c is not None:
            used.add(c["ordinal"])
        elif cuda["done"] and cuda["devices"]:
            notes.append(
                f"NVML device {n['index']} ({n['uuid']}): no CUDA device with this UUID "
                "(hidden by CUDA_VISIBLE_DEVICES, MIG mode, or its UUID unreadable)"
            )
        devices.append(
            {
                "index": n["index"],
                "name": n["name"] or (c or {}).get("name"),
                "uuid": n["uuid"],
                "pci_bus_id": n["pci_bus_id"],
                "cuda": c["cuda"] if c else None,
                "cuda_ordinal": c["ordinal"] if c else None,
                "nvml": n["nvml"],
                "under_load": None,
            }
        )
    for c in cuda["devices"]:
        if c["ordinal"] in used:
            continue
        if nvml["done"] and nvml["devices"]:
            notes.append(
                f"CUDA device {c['ordinal']} ({c['uuid']}): no NVML device with this UUID; "
                "index is the CUDA ordinal"
            )
        devices.append(
            {
                "index": c["ordinal"],
                "name": c["name"],
                "uuid": c["uuid"],
                "pci_bus_id": None,
                "cuda": c["cuda"],
                "cuda_ordinal": c["ordinal"],
                "nvml": None,
                "under_load": None,
            }
        )
    return devices


def read_gpu(
    timeout_s: float = 10.0,
    meminfo_path: str = "/proc/meminfo",
    kmsg_path: str = KMSG_PATH,
    xid_log: str | None = None,
    cuda: bool = True,
    cuda_why: str | None = None,
) -> GpuReadings:
    """Read every NVIDIA GPU on this host through NVML and (when ``cuda``) the CUDA driver, within
    ``timeout_s``.

    ``cuda=False`` leaves the CUDA driver alone (no dlopen of libcuda, no ``cuInit``: 0.2 s on an
    H200): the devices' ``cuda`` is None and ``cuda_view`` says why (``cuda_why``, from the runner:
    nothing in the run needs an SM count). ``cuda_why`` with ``cuda=True`` is why it is read.

    Returns the readings dict (its fields and their sources: the module docstring, "The readings").

    An NVML call that answers NVML_ERROR_NOT_SUPPORTED records ``"NOT_SUPPORTED"``; any other failure
    records None and a note. No CUDA context is created. NVML and CUDA are read in two daemon threads
    at once (the kernel log meanwhile in this one); a driver call that hangs is left behind in its
    thread. Never raises.
    """
    out: dict[str, Any] = {
        "driver_version": None,
        "cuda_driver_version": None,
        "versions": {"kernel": None, "bios": None, "nvml": None},
        "devices": [],
        "host_meminfo_kb": None,
        "xid_events": None,
        "xid_source": None,
        "probe_pid": os.getpid(),
        "cuda_view": {"read": bool(cuda), "why": cuda_why},
        "notes": [],
    }
    try:
        _read_host(out, meminfo_path)
        _read_drivers(out, timeout_s, cuda, xid_log or kmsg_path)
    except Exception as e:  # noqa: BLE001 - the probe never raises
        out["notes"].append(f"GPU probe failed: {type(e).__name__}: {e}")
        out.setdefault("why", f"GPU probe failed: {type(e).__name__}: {e}")
        out["failed"] = f"GPU probe failed: {type(e).__name__}: {e}"
    return cast(GpuReadings, out)  # built field by field by the readers above


def _read_host(out: dict[str, Any], meminfo_path: str) -> None:
    """The kernel release, BIOS version and ``/proc/meminfo`` figures into ``out`` (notes for what failed)."""
    out["versions"]["kernel"] = os.uname().release or None
    try:
        with open(BIOS_VERSION_PATH, encoding="utf-8", errors="replace") as f:
            out["versions"]["bios"] = f.read().strip() or None
    except OSError as e:
        out["notes"].append(f"versions.bios: {BIOS_VERSION_PATH} unreadable: {e.strerror or e}")
    try:
        out["host_meminfo_kb"] = read_meminfo(meminfo_path)
    except (OSError, ValueError) as e:
        out["notes"].append(f"host_meminfo_kb: {meminfo_path}: {e}")


def _read_drivers(out: dict[str, Any], timeout_s: float, cuda: bool, xid_path: str) -> None:
    """NVML and (when ``cuda``) the CUDA driver in two daemon threads, the kernel log at ``xid_path``
    in this one meanwhile, all within ``timeout_s``; the devices joined by UUID into ``out``."""
    notes: list[str] = out["notes"]
    run_nvml, run_cuda = GpuRead(), GpuRead()  # one per thread: each names its own call in flight
    timings: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    workers = [threading.Thread(target=_worker, args=(r, side, read, part, timings), name=f"afddiag-gpu-{side}",
                                daemon=True)
               for side, r, read, part in (("nvml", run_nvml, read_nvml, run_nvml.nvml),
                                           ("cuda", run_cuda, _read_cuda, run_cuda.cuda))
               if cuda or side == "nvml"]
    for w in workers:
        w.start()
    t_xid = time.monotonic()
    try:  # the kernel log, read here while the workers read NVML and CUDA
        out["xid_events"], out["xid_source"], xid_notes = read_xid_events(
            xid_path, deadline, uptime_s=None if xid_path == KMSG_PATH else read_uptime_s())
    except Exception as e:  # noqa: BLE001
        out["xid_events"], xid_notes = None, []
        out["xid_source"] = f"not read: {xid_path}: {type(e).__name__}: {e}"
    timings["xid_ms"] = round((time.monotonic() - t_xid) * 1e3, 1)
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
    timed_out = any(w.is_alive() for w in workers)
    nvml, _, nvml_notes, nvml_call = run_nvml.snapshot()
    _, cuda_part, cuda_notes, cuda_call = run_cuda.snapshot()
    out["timings_ms"] = dict(timings)
    out["driver_version"] = nvml.get("driver_version")
    out["versions"]["nvml"] = nvml.get("nvml_version")
    out["cuda_driver_version"] = cuda_part.get("driver_version") or nvml.get("cuda_driver_version")
    notes.extend(nvml_notes + cuda_notes)
    notes.extend(xid_notes)
    out["devices"] = _join(nvml, cuda_part, notes)
    whys = [w for w in (nvml["why"], cuda_part["why"]) if w]
    notes.extend(whys)
    if timed_out:
        in_call = "; ".join(c for c in (nvml_call, cuda_call) if c) or "unknown"
        out["why"] = f"GPU probe timed out after {timeout_s:g}s (NVML or CUDA driver call hung)"
        notes.append(f"GPU probe: call in flight at the timeout: {in_call}")
        out["failed"] = f"{out['why']}; call in flight: {in_call}"
        for side, part in (("NVML", nvml), ("CUDA", cuda_part)):
            if not part["done"] and (side == "NVML" or cuda):
                notes.append(f"GPU probe: {side} read not finished at the timeout")
    elif not out["devices"]:
        out["why"] = "no NVIDIA GPU seen: " + ("; ".join(whys) or "NVML and CUDA list no devices")


# ---------------------------------------------------------------------------------------------
# the probe: GPUs (NVML, the CUDA driver when needed), the kernel log's Xid lines (the load probe, its own
# registry entry right after this one, lays its figures on these readings: afddiag.probes.load)


KERNEL_XID_LOG = "kernel-xid.log"  # what `capture` keeps of the kernel log: its NVRM Xid lines
KERNEL_LOGS = (KERNEL_XID_LOG, "dmesg.txt", "dmesg.log", "kmsg.txt", "kern.log", "journalctl-k.txt")
KERNEL_LOG_MAX_BYTES = 16 << 20
CUDA_NOT_NEEDED = ("not read: nothing in this run needs it (no expected SM count: --expect-sm, the launch env's "
                   "AFD_IMAGE_SM_COUNT or the image label; no load probe; no dma-buf registration probe)")


def _bound(run: Run) -> float:
    return run.inputs.timeout("gpu_s") + 2.0  # read_gpu bounds its own NVML/CUDA worker; this catches a hang outside it


def cuda_reason(inputs: Inputs, obs: Observation | None = None, capturing: bool = False) -> str | None:
    """Why this run needs the CUDA driver's view of the GPUs (SM count, integrated), or None when
    nothing does: then the GPU probe reads NVML only and ``cuInit`` (0.2 s on an H200, every device
    set up) is skipped. Needed by an expected SM count from any source (:func:`afddiag.expect.sm_count`:
    ``--expect-sm``, the launch env's ``AFD_IMAGE_SM_COUNT``, the image label, a snapshot's expect;
    ``obs`` None: the inputs alone), the load probe, the memory-registration probe (its CUDA dma-buf
    export initialises CUDA anyway) and a capture (it keeps everything). Pure."""
    if capturing:
        return "a capture keeps everything"
    want = expect.sm_count(inputs, obs)
    if want is not None:
        return f"expected SM count {want.value} ({want.source})"
    if wants_load(inputs):
        return "the load probe runs"
    if "fabric" in inputs.families and inputs.run_qp:
        return "the memory-registration probe's dma-buf export initialises CUDA"
    return None


def _read(run: Run, progress: Any) -> dict[str, Any]:
    def live() -> Any:
        why = cuda_reason(run.inputs, run.obs, run.capturing)  # the image probe ran before this one
        return read_gpu(timeout_s=run.inputs.timeout("gpu_s"), xid_log=run.inputs.xid_log,
                        cuda=why is not None, cuda_why=why or CUDA_NOT_NEEDED)

    progress.doing = "reading GPUs (NVML, CUDA driver when needed)"
    readings = read_source(run.src.gpu, live)
    if not isinstance(readings, dict):
        return {"gpu.json": None}
    out: dict[str, Any] = {"gpu.json": readings}
    if isinstance(readings.get("xid_events"), list):
        # the kernel log's Xid lines, as the driver printed them: a replay judges them like --xid-log
        out[KERNEL_XID_LOG] = boots_text(readings["xid_events"])  # which boot each came from kept
    return out


def gpu_readings(run: Run) -> dict[str, Any] | None:
    """This run's GPU readings once this probe ran (live or replayed; what the load probe lays its
    figures on), None when there are none."""
    raw = (run.readings.get("gpu") or {}).get("gpu.json")
    return raw if isinstance(raw, dict) else None


def _snapshot_xids(run: Run, raw: dict[str, Any], r: dict[str, Any]) -> None:
    """The Xid events a replay judges, into ``raw["xid_events"]``/``["xid_source"]``: ``--xid-log``
    when given; else gpu.json's own ``xid_events``; else Xid lines gpu.json records as
    ``xid_lines``/``kernel_log`` (a list of lines or text); else a kernel log saved in the snapshot
    (:data:`KERNEL_LOGS`: what `capture` keeps, or dmesg / journalctl -k output)."""
    if run.inputs.xid_log:
        try:
            text = reader.read_text(run.inputs.xid_log, None, KERNEL_LOG_MAX_BYTES, errors="replace")
        except (OSError, reader.InputError) as e:
            raw["xid_source"] = f"not read: {run.inputs.xid_log}: {e}"
            raw["xid_events"] = None
            return
        raw["xid_events"], raw["xid_source"] = parse_xid_lines(text.splitlines()), run.inputs.xid_log
        return
    if isinstance(raw.get("xid_events"), list):
        return
    for key in ("xid_lines", "kernel_log"):
        lines = raw.get(key)
        if isinstance(lines, str):
            lines = lines.splitlines()
        if isinstance(lines, list):
            raw["xid_events"] = parse_xid_lines([x for x in lines if isinstance(x, str)])
            raw["xid_source"] = f"gpu.json {key}"
            return
    for name in KERNEL_LOGS:
        if isinstance(r.get(name), str):
            raw["xid_events"], raw["xid_source"] = parse_xid_lines(r[name].splitlines()), f"snapshot {name}"
            return


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get("gpu.json")
    if raw is None:
        return {"gpu": GpuFacts(captured=False, why="GPU not captured (no gpu.json in the snapshot)")}
    if not run.live and isinstance(raw, dict):
        _snapshot_xids(run, raw, r)
    try:
        return {"gpu": gpu_facts_from_readings(raw)}
    except Exception as e:  # noqa: BLE001 - odd readings must not stop the run
        why = f"GPU readings not usable ({type(e).__name__}: {e})"
        return {"gpu": GpuFacts(available=False, why=why, failed=why)}


def _failed(why: str) -> dict[str, Any]:
    return {"gpu": GpuFacts(available=False, why=why, failed=why)}


def _report(facts: GpuFacts) -> dict[str, Any]:
    """What the report's facts carry of the GPU facts: all but the raw readings."""
    return {k: v for k, v in vars(facts).items() if k != "readings"}


PROBE = Probe("gpu", "GPU probe (NVML, CUDA driver)", _bound,
              (Artifact("gpu.json"),) + tuple(Artifact(n, "text", KERNEL_LOG_MAX_BYTES) for n in KERNEL_LOGS),
              _read, _facts, _failed, report=_report)


def main() -> None:
    """``python -m afddiag.probes.gpu [timeout_s]``: print :func:`read_gpu` as JSON."""
    import sys

    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    print(json.dumps(read_gpu(timeout_s=timeout), indent=2))


if __name__ == "__main__":
    main()
