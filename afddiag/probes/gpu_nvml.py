"""The GPU probe's NVML side: each device's NVML readings (:func:`read_nvml`, one worker thread of
:func:`afddiag.probes.gpu.read_gpu`) and the busy check before the load probe (:func:`read_busy`).
Every call goes through :func:`_nvml_call`: a value, ``"NOT_SUPPORTED"``, or None with a note."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from afddiag.model.gpu import NOT_SUPPORTED, clocks_event_reason_names
from afddiag.probes import nvml

NVML_VALUE_NOT_AVAILABLE_ULL = 2**64 - 1  # usedGpuMemory when the driver cannot tell


def text_value(v: Any) -> Any:
    """A driver's bytes answer as text (older pynvml bindings return bytes)."""
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


class GpuRead:
    """State shared between :func:`afddiag.probes.gpu.read_gpu` and its worker thread.

    The worker appends only finished pieces under ``lock``; the caller deep-copies under ``lock``,
    so a worker hung inside a driver call never holds it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_call: str | None = None  # the driver call in flight, for the timed-out note
        self.notes: list[str] = []
        self.nvml: dict[str, Any] = {"done": False, "why": None, "devices": []}
        self.cuda: dict[str, Any] = {"done": False, "why": None, "devices": []}

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(text)

    def snapshot(self) -> tuple[dict, dict, list[str], str | None]:
        with self.lock:
            return (
                copy.deepcopy(self.nvml),
                copy.deepcopy(self.cuda),
                list(self.notes),
                self.in_call,
            )



def _nvml_call(run: GpuRead, nv: Any, where: str, name: str, *args: Any) -> Any:
    """Call ``nv.<name>(*args)``: its value, ``"NOT_SUPPORTED"``, or None with a note."""
    run.in_call = f"{name} ({where})"
    try:
        fn = getattr(nv, name)
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - every failure becomes a note
        if getattr(e, "value", None) == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
            return NOT_SUPPORTED
        run.note(f"{where}: {name} failed: {type(e).__name__}: {e}")
        return None
    finally:
        run.in_call = None


def _nvml_device(run: GpuRead, nv: Any, i: int) -> dict[str, Any]:
    where = f"NVML device {i}"
    dev: dict[str, Any] = {"index": i, "name": None, "uuid": None, "pci_bus_id": None, "nvml": None}
    h = _nvml_call(run, nv, where, "nvmlDeviceGetHandleByIndex", i)
    if h is None or h == NOT_SUPPORTED:
        return dev
    call = lambda name, *a: _nvml_call(run, nv, where, name, h, *a)  # noqa: E731

    name = call("nvmlDeviceGetName")
    dev["name"] = text_value(name) if name != NOT_SUPPORTED else None
    uuid = call("nvmlDeviceGetUUID")
    dev["uuid"] = text_value(uuid) if uuid != NOT_SUPPORTED else None
    pci = call("nvmlDeviceGetPciInfo")
    dev["pci_bus_id"] = text_value(getattr(pci, "busId", None)) if pci not in (None, NOT_SUPPORTED) else None

    cc = call("nvmlDeviceGetCudaComputeCapability") if hasattr(nv, "nvmlDeviceGetCudaComputeCapability") else None
    if isinstance(cc, (tuple, list)) and len(cc) == 2 and all(isinstance(x, int) for x in cc):
        cc = [cc[0], cc[1]]
    elif cc is not None and cc != NOT_SUPPORTED:
        run.note(f"{where}: nvmlDeviceGetCudaComputeCapability answered {cc!r}")
        cc = None

    attrs = call("nvmlDeviceGetAttributes")
    mp = attrs if attrs in (None, NOT_SUPPORTED) else getattr(attrs, "multiprocessorCount", None)

    mem = call("nvmlDeviceGetMemoryInfo")
    if mem not in (None, NOT_SUPPORTED):
        mem = {"total_bytes": mem.total, "used_bytes": mem.used, "free_bytes": mem.free}

    if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons"):
        reasons = call("nvmlDeviceGetCurrentClocksEventReasons")
    else:
        reasons = call("nvmlDeviceGetCurrentClocksThrottleReasons")

    util = call("nvmlDeviceGetUtilizationRates")
    if util not in (None, NOT_SUPPORTED):
        util = util.gpu

    clock_sm = getattr(nv, "NVML_CLOCK_SM", 1)
    dev["nvml"] = {
        "multiprocessor_count": mp,
        "compute_capability": cc,
        "memory_info": mem,
        "clock_sm_mhz": call("nvmlDeviceGetClockInfo", clock_sm),
        "clock_sm_max_mhz": call("nvmlDeviceGetMaxClockInfo", clock_sm),
        "power_mw": call("nvmlDeviceGetPowerUsage"),
        "power_limit_mw": call("nvmlDeviceGetEnforcedPowerLimit"),
        "pstate": call("nvmlDeviceGetPerformanceState"),
        "clocks_event_reasons": reasons,
        "clocks_event_reasons_names": clocks_event_reason_names(reasons),
        "temperature_c": call("nvmlDeviceGetTemperature", getattr(nv, "NVML_TEMPERATURE_GPU", 0)),
        "pcie": {
            "gen": call("nvmlDeviceGetCurrPcieLinkGeneration"),
            "width": call("nvmlDeviceGetCurrPcieLinkWidth"),
        },
        "utilization_pct": util,
        "ecc": _nvml_ecc(run, nv, where, h),
        "retired_pages": _nvml_retired_pages(run, nv, where, h),
        "remapped_rows": _nvml_remapped_rows(run, nv, where, h),
        "processes": _nvml_processes(run, nv, where, h),
    }
    return dev


def _count(run: GpuRead, where: str, v: Any) -> int | None:
    """An NVML counter as int; None (noted where it is NOT_SUPPORTED or not a number)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if v == NOT_SUPPORTED:
        run.note(f"{where}: NOT_SUPPORTED")
    elif v is not None:
        run.note(f"{where}: unexpected value {v!r}")
    return None


def _flag(run: GpuRead, where: str, v: Any, enabled: int = 1) -> bool | None:
    if isinstance(v, int):
        return v == enabled
    if v == NOT_SUPPORTED:
        run.note(f"{where}: NOT_SUPPORTED")
    elif v is not None:
        run.note(f"{where}: unexpected value {v!r}")
    return None


def _nvml_ecc(run: GpuRead, nv: Any, where: str, h: Any) -> Any:
    """``{mode_current, volatile: {corrected, uncorrected}, aggregate: {...}}`` or NOT_SUPPORTED."""
    mode = _nvml_call(run, nv, where, "nvmlDeviceGetEccMode", h)
    if mode == NOT_SUPPORTED:  # GB10 and boards without ECC: N/A, not a fault
        return NOT_SUPPORTED
    enabled = getattr(nv, "NVML_FEATURE_ENABLED", 1)
    current = None
    if mode is not None:
        try:
            current = _flag(run, f"{where}: ecc.mode_current", mode[0], enabled)
        except (TypeError, IndexError, KeyError):
            run.note(f"{where}: nvmlDeviceGetEccMode answered {mode!r}")
    out: dict[str, Any] = {"mode_current": current}
    kinds = (
        ("corrected", getattr(nv, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)),
        ("uncorrected", getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)),
    )
    for counter, counter_type in (
        ("volatile", getattr(nv, "NVML_VOLATILE_ECC", 0)),
        ("aggregate", getattr(nv, "NVML_AGGREGATE_ECC", 1)),
    ):
        out[counter] = {
            kind: _count(
                run,
                f"{where}: ecc.{counter}.{kind}",
                _nvml_call(run, nv, f"{where} ({counter} {kind})", "nvmlDeviceGetTotalEccErrors",
                           h, error_type, counter_type),
            )
            for kind, error_type in kinds
        }
    return out


def _nvml_retired_pages(run: GpuRead, nv: Any, where: str, h: Any) -> Any:
    """``{single_bit, double_bit, pending}`` (page counts) or NOT_SUPPORTED (row-remapping GPUs)."""
    single = _nvml_call(run, nv, f"{where} (single bit)", "nvmlDeviceGetRetiredPages", h,
                        getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0))
    double = _nvml_call(run, nv, f"{where} (double bit)", "nvmlDeviceGetRetiredPages", h,
                        getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1))
    pending = _nvml_call(run, nv, where, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    if single == double == pending == NOT_SUPPORTED:
        return NOT_SUPPORTED

    def pages(label: str, v: Any) -> int | None:
        if isinstance(v, (list, tuple)):
            return len(v)
        return _count(run, f"{where}: retired_pages.{label}", v)

    return {
        "single_bit": pages("single_bit", single),
        "double_bit": pages("double_bit", double),
        "pending": _flag(run, f"{where}: retired_pages.pending", pending,
                         getattr(nv, "NVML_FEATURE_ENABLED", 1)),
    }


def _nvml_remapped_rows(run: GpuRead, nv: Any, where: str, h: Any) -> Any:
    """``{correctable, uncorrectable, pending, failure}`` or NOT_SUPPORTED (pre-Ampere, GB10)."""
    v = _nvml_call(run, nv, where, "nvmlDeviceGetRemappedRows", h)
    if v == NOT_SUPPORTED:
        return NOT_SUPPORTED
    out: dict[str, Any] = {"correctable": None, "uncorrectable": None, "pending": None, "failure": None}
    if v is None:
        return out
    try:
        corr, unc, pending, failure = v
    except (TypeError, ValueError):
        run.note(f"{where}: nvmlDeviceGetRemappedRows answered {v!r}")
        return out
    out["correctable"] = _count(run, f"{where}: remapped_rows.correctable", corr)
    out["uncorrectable"] = _count(run, f"{where}: remapped_rows.uncorrectable", unc)
    out["pending"] = bool(pending) if isinstance(pending, int) else None
    out["failure"] = bool(failure) if isinstance(failure, int) else None
    return out


def process_name(pid: int) -> str | None:
    """``psutil.Process(pid).name()``; ``/proc/<pid>/comm`` without psutil; None if gone or denied."""
    try:
        import psutil
    except Exception:  # noqa: BLE001 - psutil is a dependency, but the probe must not need it
        try:
            with open(f"/proc/{int(pid)}/comm", encoding="utf-8", errors="replace") as f:
                return f.read().strip() or None
        except (OSError, ValueError):
            return None
    try:
        return psutil.Process(pid).name() or None
    except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied, ZombieProcess
        return None


def _nvml_processes(run: GpuRead, nv: Any, where: str, h: Any) -> Any:
    """Compute then graphics processes on the device, or NOT_SUPPORTED; None if a list failed.

    A process that is both (nvidia-smi's ``C+G``) appears twice, once per ``type``.
    """
    answers = {
        kind: _nvml_call(run, nv, where, fn, h)
        for kind, fn in (
            ("compute", "nvmlDeviceGetComputeRunningProcesses"),
            ("graphics", "nvmlDeviceGetGraphicsRunningProcesses"),
        )
    }
    if all(v == NOT_SUPPORTED for v in answers.values()):
        return NOT_SUPPORTED
    if any(v is None for v in answers.values()):
        run.note(f"{where}: processes not listed (a process list could not be read)")
        return None
    procs: list[dict[str, Any]] = []
    for kind, plist in answers.items():
        if plist == NOT_SUPPORTED:
            continue
        try:
            items = list(plist)
        except TypeError:
            run.note(f"{where}: {kind} process list is {plist!r}")
            return None
        for p in items:
            pid = getattr(p, "pid", None)
            used = getattr(p, "usedGpuMemory", None)
            if not isinstance(used, int) or isinstance(used, bool) or used >= NVML_VALUE_NOT_AVAILABLE_ULL:
                used = None
            procs.append({
                "pid": pid if isinstance(pid, int) else None,
                "name": process_name(pid) if isinstance(pid, int) else None,
                "used_bytes": used,
                "type": kind,
            })
    return procs


def read_nvml(run: GpuRead) -> None:
    def mark(name: str | None) -> None:
        run.in_call = name

    try:
        nv = nvml.open_nvml(mark)
    except nvml.NvmlUnavailable as e:
        run.nvml["why"] = f"NVML: {e}"
        return
    try:
        driver = _nvml_call(run, nv, "NVML", "nvmlSystemGetDriverVersion")
        nvml_version = _nvml_call(run, nv, "NVML", "nvmlSystemGetNVMLVersion")
        cuda_fn = next((n for n in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion")
                        if hasattr(nv, n)), None)
        cuda_version = _nvml_call(run, nv, "NVML", cuda_fn) if cuda_fn else None
        with run.lock:
            run.nvml["driver_version"] = text_value(driver) if driver != NOT_SUPPORTED else None
            run.nvml["nvml_version"] = text_value(nvml_version) if nvml_version != NOT_SUPPORTED else None
            run.nvml["cuda_driver_version"] = (cuda_version if isinstance(cuda_version, int)
                                               and not isinstance(cuda_version, bool) else None)
        count = _nvml_call(run, nv, "NVML", "nvmlDeviceGetCount")
        if not isinstance(count, int):
            run.nvml["why"] = "NVML: device count unreadable"
            return
        if count == 0:
            run.nvml["why"] = "NVML: 0 devices"
        for i in range(count):
            dev = _nvml_device(run, nv, i)
            with run.lock:
                run.nvml["devices"].append(dev)
    finally:
        run.in_call = "nvmlShutdown"
        why = nvml.close_nvml(nv)
        if why:
            run.note(f"NVML: {why}")
        run.in_call = None


BUSY_SAMPLE_PERIOD_S = 0.1


def read_busy(uuid: str | None, index: int | None, window_s: float = 0.5,
              own_pids: Iterable[int] = ()) -> dict[str, Any]:
    """Is another job computing on this GPU? Read just before (or after) the load probe.

    Samples ``nvmlDeviceGetUtilizationRates().gpu`` (%, the share of the driver's last sample period,
    1/6 s to 1 s, in which a kernel ran) every 100 ms for ``window_s`` seconds (0: once, no
    utilization sample), and lists compute processes (``nvmlDeviceGetComputeRunningProcesses``)
    other than this process and ``own_pids``. The device is found by ``uuid``
    (``nvmlDeviceGetHandleByUUID``), else by NVML ``index``.

    Returns ``{"utilization_pct": max of the samples or None, "utilization_samples": [%...],
    "processes": [{pid, name, used_bytes, type: "compute"}] or None when not listed,
    "window_s", "own_pid"}`` plus ``"why"`` when NVML could not be asked. Never raises.
    (``nvidia-smi --query-gpu=utilization.gpu --format=csv -lms 100`` and
    ``nvidia-smi --query-compute-apps=pid,process_name --format=csv``.)
    """
    own = {os.getpid(), *[p for p in own_pids if isinstance(p, int)]}
    out: dict[str, Any] = {"utilization_pct": None, "utilization_samples": [], "processes": None,
                           "window_s": window_s, "own_pid": os.getpid()}
    try:
        nv = nvml.open_nvml()
    except nvml.NvmlUnavailable as e:
        out["why"] = str(e)
        return out
    try:
        h = None
        if uuid:
            try:
                h = nv.nvmlDeviceGetHandleByUUID(uuid)
            except Exception:  # noqa: BLE001 - fall back to the index
                h = None
        if h is None and isinstance(index, int):
            h = nv.nvmlDeviceGetHandleByIndex(index)
        if h is None:
            out["why"] = "no NVML handle (no UUID or index)"
            return out
        end = time.monotonic() + max(0.0, window_s)
        while window_s > 0:
            try:
                out["utilization_samples"].append(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception as e:  # noqa: BLE001
                out.setdefault("notes", []).append(f"nvmlDeviceGetUtilizationRates failed: {e}")
                break
            if time.monotonic() + BUSY_SAMPLE_PERIOD_S > end:
                break
            time.sleep(BUSY_SAMPLE_PERIOD_S)
        samples = [v for v in out["utilization_samples"] if isinstance(v, (int, float))]
        out["utilization_pct"] = max(samples) if samples else None
        try:
            plist = list(nv.nvmlDeviceGetComputeRunningProcesses(h))
        except Exception as e:  # noqa: BLE001
            out.setdefault("notes", []).append(f"nvmlDeviceGetComputeRunningProcesses failed: {e}")
        else:
            procs = []
            for p in plist:
                pid = getattr(p, "pid", None)
                if pid in own:
                    continue
                used = getattr(p, "usedGpuMemory", None)
                if not isinstance(used, int) or isinstance(used, bool) or used >= NVML_VALUE_NOT_AVAILABLE_ULL:
                    used = None
                procs.append({"pid": pid if isinstance(pid, int) else None,
                              "name": process_name(pid) if isinstance(pid, int) else None,
                              "used_bytes": used, "type": "compute"})
            out["processes"] = procs
    except Exception as e:  # noqa: BLE001 - the probe never raises
        out["why"] = f"busy check failed: {type(e).__name__}: {e}"
    finally:
        nvml.close_nvml(nv)
    return out
