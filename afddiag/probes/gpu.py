"""Live GPU probe: what NVML and the CUDA driver say about each NVIDIA GPU on this host.

:func:`read_gpu` returns a plain dict in the shape of a case's GPU readings (see
``cases/README.md``), without ``expect``. Every fact names its source in :func:`read_gpu`'s docstring.
Nothing here raises: whatever could not be read is ``None`` (or ``"NOT_SUPPORTED"`` where NVML said
so) and the reason is a line in ``notes``.

CUDA is read through ctypes on ``libcuda.so.1`` without creating a context; NVML through ``pynvml``
(package ``nvidia-ml-py``), imported lazily. NVML and CUDA devices are joined by UUID, never by
index: CUDA's ordinals follow ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``, NVML's do not.

Run ``python -m afddiag.probes.gpu`` to print the readings as JSON.
"""

from __future__ import annotations

import copy
import ctypes
import errno
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterable
from typing import Any

from afddiag.model.gpu import NOT_SUPPORTED, clocks_event_reason_names
from afddiag.probes import cudadrv, nvml
from afddiag.probes.cudadrv import CUDA_SUCCESS, LIBCUDA
from afddiag.textnum import digits

# CUdevice_attribute values (cuda.h).
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_INTEGRATED = 18
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

BIOS_VERSION_PATH = "/sys/class/dmi/id/bios_version"
KMSG_PATH = "/dev/kmsg"
XID_MAX_BYTES = 4 << 20  # read at most this much kernel log (the kmsg ring is usually far smaller)
XID_MAX_EVENTS = 1000  # keep at most this many Xid events (a note counts the rest)
NVML_VALUE_NOT_AVAILABLE_ULL = 2**64 - 1  # usedGpuMemory when the driver cannot tell


def uuid_from_bytes(raw: bytes) -> str:
    """NVML's text form ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` of a 16-byte CUDA ``CUuuid``."""
    h = bytes(raw[:16]).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


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


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


MEMINFO_KEYS = ("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "CmaTotal", "CmaFree")


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


class _Run:
    """State shared between :func:`read_gpu` and its worker thread.

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


# --- NVML -----------------------------------------------------------------------------------


def _nvml_call(run: _Run, nv: Any, where: str, name: str, *args: Any) -> Any:
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


def _nvml_device(run: _Run, nv: Any, i: int) -> dict[str, Any]:
    where = f"NVML device {i}"
    dev: dict[str, Any] = {"index": i, "name": None, "uuid": None, "pci_bus_id": None, "nvml": None}
    h = _nvml_call(run, nv, where, "nvmlDeviceGetHandleByIndex", i)
    if h is None or h == NOT_SUPPORTED:
        return dev
    call = lambda name, *a: _nvml_call(run, nv, where, name, h, *a)  # noqa: E731

    name = call("nvmlDeviceGetName")
    dev["name"] = _text(name) if name != NOT_SUPPORTED else None
    uuid = call("nvmlDeviceGetUUID")
    dev["uuid"] = _text(uuid) if uuid != NOT_SUPPORTED else None
    pci = call("nvmlDeviceGetPciInfo")
    dev["pci_bus_id"] = _text(getattr(pci, "busId", None)) if pci not in (None, NOT_SUPPORTED) else None

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


def _count(run: _Run, where: str, v: Any) -> int | None:
    """An NVML counter as int; None (noted where it is NOT_SUPPORTED or not a number)."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if v == NOT_SUPPORTED:
        run.note(f"{where}: NOT_SUPPORTED")
    elif v is not None:
        run.note(f"{where}: unexpected value {v!r}")
    return None


def _flag(run: _Run, where: str, v: Any, enabled: int = 1) -> bool | None:
    if isinstance(v, int):
        return v == enabled
    if v == NOT_SUPPORTED:
        run.note(f"{where}: NOT_SUPPORTED")
    elif v is not None:
        run.note(f"{where}: unexpected value {v!r}")
    return None


def _nvml_ecc(run: _Run, nv: Any, where: str, h: Any) -> Any:
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


def _nvml_retired_pages(run: _Run, nv: Any, where: str, h: Any) -> Any:
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


def _nvml_remapped_rows(run: _Run, nv: Any, where: str, h: Any) -> Any:
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
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).name() or None
        except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied, ZombieProcess
            return None
    try:
        with open(f"/proc/{int(pid)}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except (OSError, ValueError):
        return None


def _nvml_processes(run: _Run, nv: Any, where: str, h: Any) -> Any:
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


def _read_nvml(run: _Run) -> None:
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
            run.nvml["driver_version"] = _text(driver) if driver != NOT_SUPPORTED else None
            run.nvml["nvml_version"] = _text(nvml_version) if nvml_version != NOT_SUPPORTED else None
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


# --- CUDA driver ----------------------------------------------------------------------------


def _cu_call(run: _Run, lib: Any, where: str, name: str, *args: Any) -> bool:
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


def _cuda_device(run: _Run, lib: Any, ordinal: int) -> dict[str, Any]:
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


def _read_cuda(run: _Run) -> None:
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


# --- Xid events from the kernel log --------------------------------------------------------

_XID_RE = re.compile(r"NVRM: Xid \(([^)]*)\):\s*(\d+)")
_PCI_RE = re.compile(r"(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?")


def parse_xid_lines(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The NVIDIA Xid events in kernel log lines, in order: ``[{xid, pci, text}]``.

    Each line may be a ``/dev/kmsg`` record (``prio,seq,ts,flags;message``), a ``dmesg`` line
    (``[  12.345678] NVRM: ...``), a ``journalctl -k`` line or a bare message; what matters is
    ``NVRM: Xid (<where>): <xid>, <details>``. ``pci`` is the PCI address inside the parentheses as
    the driver printed it (``PCI:0000:01:00`` gives ``"0000:01:00"``), None if there is none;
    ``text`` is the message from ``NVRM: Xid`` to the end of the line. Other lines are ignored.
    """
    events: list[dict[str, Any]] = []
    for line in lines:
        if not isinstance(line, str) or "Xid" not in line:
            continue
        line = line.split("\n", 1)[0]  # a kmsg record's continuation lines (" KEY=value") follow
        m = _XID_RE.search(line)
        if m is None:
            continue
        pci = _PCI_RE.search(m.group(1))
        events.append({
            "xid": int(m.group(2)),
            "pci": pci.group(0) if pci else None,
            "text": line[m.start():].rstrip(),
        })
    return events


def read_xid_events(
    path: str = KMSG_PATH, deadline: float | None = None, max_bytes: int = XID_MAX_BYTES
) -> tuple[list[dict[str, Any]] | None, str, list[str]]:
    """Read the kernel log at ``path`` non-blocking: ``(events, source, notes)``; never raises.

    ``path`` is ``/dev/kmsg`` (one record per read, until EAGAIN) or a saved log (``dmesg``,
    ``journalctl -k``; its last ``max_bytes`` are read). Stops at ``max_bytes`` or at ``deadline``
    (``time.monotonic()``), with a note. ``source`` is ``path`` when it was read; otherwise
    ``events`` is None and ``source`` says why (``not readable: <path>: <error> (<hint>)``).
    """
    notes: list[str] = []
    if deadline is None:
        deadline = time.monotonic() + 5.0
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        if path != KMSG_PATH:
            hint = ""
        elif e.errno in (errno.EACCES, errno.EPERM):
            hint = " (run as root or give --xid-log)"
        else:
            hint = " (give --xid-log)"
        return None, f"not readable: {path}: {e.strerror or e}{hint}", notes
    xid_lines: list[str] = []
    total = 0
    partial: bytes | None = b""
    regular = False
    try:
        try:
            st = os.fstat(fd)
            regular = stat.S_ISREG(st.st_mode)
            if regular and st.st_size > max_bytes:
                os.lseek(fd, st.st_size - max_bytes, os.SEEK_SET)
                notes.append(f"xid: {path} is {st.st_size} bytes; read its last {max_bytes}")
                partial = None  # drop the first, cut line
        except OSError:
            pass
        lost = 0
        while True:
            if time.monotonic() > deadline:
                notes.append(f"xid: stopped reading {path} at the time bound after {total} bytes")
                break
            if total >= max_bytes:
                if not regular:  # a regular file's cut is noted above
                    notes.append(f"xid: stopped reading {path} after {total} bytes (the limit)")
                break
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:  # EAGAIN: no more kmsg records
                break
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EPIPE and lost < 1000:  # records overwritten while reading
                    lost += 1
                    continue
                notes.append(f"xid: reading {path} stopped: {e.strerror or e}")
                break
            if not chunk:
                break
            total += len(chunk)
            pieces = chunk.split(b"\n")
            if partial is None:
                if len(pieces) == 1:
                    continue
                pieces[0] = b""
            else:
                pieces[0] = partial + pieces[0]
            partial = pieces.pop()
            xid_lines.extend(p.decode("utf-8", "replace") for p in pieces if b"Xid" in p)
        if partial and b"Xid" in partial:
            xid_lines.append(partial.decode("utf-8", "replace"))
        if lost:
            notes.append(f"xid: {path}: {lost} times records were overwritten while reading")
    finally:
        os.close(fd)
    events = parse_xid_lines(xid_lines)
    if len(events) > XID_MAX_EVENTS:
        notes.append(f"xid: {len(events)} Xid events; the last {XID_MAX_EVENTS} kept")
        events = events[-XID_MAX_EVENTS:]
    return events, path, notes


# --- join -----------------------------------------------------------------------------------


def _worker(run: _Run, read: Any, part: dict[str, Any], timings: dict[str, float]) -> None:
    """One side of the probe (``_read_nvml`` or ``_read_cuda``) in its own thread: the two driver
    libraries initialise independently, so NVML's init and device reads overlap ``cuInit`` (the
    slowest step on a discrete GPU) instead of following it. Records the side's wall time in
    ``timings`` (ms)."""
    t0 = time.monotonic()
    try:
        read(run)
    except Exception as e:  # noqa: BLE001 - a bug here must not kill the probe
        run.note(f"GPU probe: {read.__name__} raised {type(e).__name__}: {e}")
    part["done"] = True
    timings[read.__name__.removeprefix("_read_") + "_ms"] = round((time.monotonic() - t0) * 1e3, 1)


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
) -> dict:
    """Read every NVIDIA GPU on this host through NVML and (when ``cuda``) the CUDA driver, within
    ``timeout_s``.

    ``cuda=False`` leaves the CUDA driver alone (no dlopen of libcuda, no ``cuInit``: 0.2 s on an
    H200): the devices' ``cuda`` is None and ``cuda_view`` says why (``cuda_why``, from the runner:
    nothing in the run needs an SM count). ``cuda_why`` with ``cuda=True`` is why it is read.

    Returns a dict (a case's GPU readings' shape, without ``expect``):

    - ``driver_version`` (str): ``nvmlSystemGetDriverVersion``, e.g. ``"580.159.04"``.
    - ``cuda_driver_version`` (int): ``cuDriverGetVersion``, 1000*major + 10*minor (13000 = 13.0);
      ``nvmlSystemGetCudaDriverVersion_v2`` (same encoding) when CUDA is not read or did not answer.
    - ``cuda_view``: ``{"read": bool, "why": str | None}``: whether the CUDA driver was asked, and why
      (or why not).
    - ``versions``: ``kernel`` (``uname(2)`` release, as ``platform.release()``), ``bios`` (``/sys/class/dmi/id/bios_version``),
      ``nvml`` (``nvmlSystemGetNVMLVersion``).
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
      (dlopen, cuInit, attributes; absent when CUDA is not read), ``xid_ms`` (the kernel log); NVML and CUDA run in parallel threads.
    - ``notes`` (list of str): what could not be read, and why.
    - ``why`` (str): present only when no GPU was seen at all (``devices == []``: no libnvidia-ml,
      no libcuda, no devices), or when the read took longer than ``timeout_s`` (then ``devices``
      holds what was read before the hang and a note names the call in flight).
    - ``failed`` (str): present only when the read timed out or crashed: why, and the call in flight
      (the GPU gates then say ERROR, not SKIP).

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
    notes: list[str] = out["notes"]
    try:
        out["versions"]["kernel"] = os.uname().release or None
        try:
            with open(BIOS_VERSION_PATH, encoding="utf-8", errors="replace") as f:
                out["versions"]["bios"] = f.read().strip() or None
        except OSError as e:
            notes.append(f"versions.bios: {BIOS_VERSION_PATH} unreadable: {e.strerror or e}")
        try:
            out["host_meminfo_kb"] = read_meminfo(meminfo_path)
        except (OSError, ValueError) as e:
            notes.append(f"host_meminfo_kb: {meminfo_path}: {e}")

        run_nvml, run_cuda = _Run(), _Run()  # one per thread: each names its own call in flight
        timings: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        workers = [threading.Thread(target=_worker, args=(r, read, part, timings), name=f"afddiag-gpu-{side}",
                                    daemon=True)
                   for side, r, read, part in (("nvml", run_nvml, _read_nvml, run_nvml.nvml),
                                               ("cuda", run_cuda, _read_cuda, run_cuda.cuda))
                   if cuda or side == "nvml"]
        for w in workers:
            w.start()
        xid_path = xid_log or kmsg_path
        t_xid = time.monotonic()
        try:  # the kernel log, read here while the workers read NVML and CUDA
            out["xid_events"], out["xid_source"], xid_notes = read_xid_events(xid_path, deadline)
        except Exception as e:  # noqa: BLE001
            out["xid_events"], xid_notes = None, []
            out["xid_source"] = f"not read: {xid_path}: {type(e).__name__}: {e}"
        timings["xid_ms"] = round((time.monotonic() - t_xid) * 1e3, 1)
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))
        timed_out = any(w.is_alive() for w in workers)
        nvml, _, nvml_notes, nvml_call = run_nvml.snapshot()
        _, cuda, cuda_notes, cuda_call = run_cuda.snapshot()
        run_notes = nvml_notes + cuda_notes
        in_call = "; ".join(c for c in (nvml_call, cuda_call) if c) or None
        out["timings_ms"] = dict(timings)

        out["driver_version"] = nvml.get("driver_version")
        out["versions"]["nvml"] = nvml.get("nvml_version")
        out["cuda_driver_version"] = cuda.get("driver_version") or nvml.get("cuda_driver_version")
        notes.extend(run_notes)
        notes.extend(xid_notes)
        out["devices"] = _join(nvml, cuda, notes)
        whys = [w for w in (nvml["why"], cuda["why"]) if w]
        notes.extend(whys)
        if timed_out:
            out["why"] = (
                f"GPU probe timed out after {timeout_s:g}s (NVML or CUDA driver call hung)"
            )
            notes.append(f"GPU probe: call in flight at the timeout: {in_call or 'unknown'}")
            out["failed"] = f"{out['why']}; call in flight: {in_call or 'unknown'}"
            for side, part in (("NVML", nvml), ("CUDA", cuda)):
                if not part["done"] and (side == "NVML" or cuda):
                    notes.append(f"GPU probe: {side} read not finished at the timeout")
        elif not out["devices"]:
            out["why"] = "no NVIDIA GPU seen: " + ("; ".join(whys) or "NVML and CUDA list no devices")
    except Exception as e:  # noqa: BLE001 - the probe never raises
        notes.append(f"GPU probe failed: {type(e).__name__}: {e}")
        out.setdefault("why", f"GPU probe failed: {type(e).__name__}: {e}")
        out["failed"] = f"GPU probe failed: {type(e).__name__}: {e}"
    return out


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


def main() -> None:
    """``python -m afddiag.probes.gpu [timeout_s]``: print :func:`read_gpu` as JSON."""
    import sys

    timeout = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    print(json.dumps(read_gpu(timeout_s=timeout), indent=2))


if __name__ == "__main__":
    main()
