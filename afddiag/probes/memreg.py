"""Memory-registration probe: which memory the NIC can register on this host.

Reads, each part recording why it could not instead of raising:

- the NVIDIA driver: ``/proc/driver/nvidia/version`` (its first line; "Open Kernel Module" means the
  open GPU kernel module, which dma-buf export needs), whether ``nvidia_peermem`` is loaded
  (``/sys/module/nvidia_peermem``);
- the Spark registration-bug signature (NVIDIA NV-Kernels PR 591): ``CmaTotal``/``CmaFree`` from
  ``/proc/meminfo`` (kB) and whether ``/proc/cmdline`` holds ``kho=off``; the kernel release;
- RLIMIT_MEMLOCK (an ENOMEM from the registration count means nothing when the limit is what stopped it);
- CUDA (``libcuda.so.1``): per device ``CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`` (116),
  ``CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`` (124), ``CU_DEVICE_ATTRIBUTE_INTEGRATED`` (18); on the
  first device, a 2 MiB ``cuMemAlloc`` buffer exported as a dma-buf fd with
  ``cuMemGetHandleForAddressRange(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)``;
- verbs (pyverbs), per RDMA device: a 1 MiB host ``MR`` (``ibv_reg_mr``), a bounded count of N x 1 MiB
  host registrations held at once (how far it got, and the errno that stopped it), the CUDA buffer
  registered by address (``ibv_reg_mr`` on a device pointer: the nvidia-peermem path, "Bad address"
  EFAULT without GPUDirect RDMA) and its dma-buf fd as a ``DmaBufMR`` (``ibv_reg_dmabuf_mr``) when the
  export worked.

Every MR, PD and device context is closed in reverse order, the dma-buf fd closed, the CUDA buffer
freed and the primary context released. EOPNOTSUPP (95) is recorded as "this device cannot", never as
a breakage. The readings are plain JSON (a capture holds them as the registry names them);
:func:`afddiag.model.fabric.memreg_facts` makes facts of them.

``python -m afddiag.probes.memreg`` prints the readings as JSON.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from afddiag.model.fabric import MemRegFacts, memreg_facts
from afddiag.probes import cudadrv
from afddiag.probes.cudadrv import (
    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
    CU_DEVICE_ATTRIBUTE_INTEGRATED,
)
from afddiag.probes.qp import _err_code
from afddiag.probes.registry import LIVE, Artifact, Probe, Run
from afddiag.textnum import digits

CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1
EXPORT_BYTES = 2 << 20  # one 2 MiB buffer: cuMemAlloc's granularity, page aligned as the export needs
HOST_MR_BYTES = 1 << 20
COUNT_DEFAULT = 64  # N x 1 MiB held at once (64 MiB)


def _read_first_line(path: Path) -> tuple[str | None, str | None]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip(), None
    except OSError as e:
        return None, f"{path}: {e.strerror or e}"


def read_driver(root: str = "/") -> dict[str, Any]:
    """The NVIDIA kernel driver as ``/proc/driver/nvidia/version`` and ``/sys/module`` show it:
    ``{"version": first line | None, "open_kernel_module": bool | None, "peermem_loaded": bool,
    "notes": [...]}`` (``cat /proc/driver/nvidia/version; lsmod | grep nvidia_peermem``)."""
    r = Path(root)
    out: dict[str, Any] = {"notes": []}
    line, why = _read_first_line(r / "proc/driver/nvidia/version")
    out["version"] = line
    out["open_kernel_module"] = None if line is None else ("Open Kernel Module" in line)
    if why:
        out["notes"].append(f"{why} (no NVIDIA kernel driver loaded?)")
    out["peermem_loaded"] = (r / "sys/module/nvidia_peermem").is_dir()
    return out


def read_cma(root: str = "/") -> dict[str, Any]:
    """The Spark registration-bug signature: ``{"cma_total_kb", "cma_free_kb", "kho_off": bool | None,
    "kernel_release", "notes"}`` from ``/proc/meminfo``, ``/proc/cmdline`` and
    ``/proc/sys/kernel/osrelease`` (``grep Cma /proc/meminfo; cat /proc/cmdline``)."""
    r = Path(root)
    out: dict[str, Any] = {"cma_total_kb": None, "cma_free_kb": None, "kho_off": None, "kernel_release": None,
                           "notes": []}
    try:
        for line in (r / "proc/meminfo").read_text(encoding="ascii", errors="replace").splitlines():
            key, _, rest = line.partition(":")
            if key in ("CmaTotal", "CmaFree") and rest.split() and digits(rest.split()[0]):
                out["cma_total_kb" if key == "CmaTotal" else "cma_free_kb"] = int(rest.split()[0])
    except OSError as e:
        out["notes"].append(f"{r / 'proc/meminfo'}: {e.strerror or e}")
    cmdline, why = _read_first_line(r / "proc/cmdline")
    if cmdline is not None:
        out["kho_off"] = "kho=off" in cmdline.split()
    elif why:
        out["notes"].append(why)
    out["kernel_release"], _ = _read_first_line(r / "proc/sys/kernel/osrelease")
    return out


def read_memlock() -> int | None:
    """RLIMIT_MEMLOCK soft limit in bytes; -1 for unlimited; None when it cannot be read."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (OSError, ValueError):
        return None
    return -1 if soft == resource.RLIM_INFINITY else int(soft)


# --- CUDA ----------------------------------------------------------------------------------------


class _State:
    in_call: str | None = None


def _cuda() -> Any:
    """The package's typed libcuda binding (:class:`afddiag.probes.cudadrv.Cuda`), or raises OSError."""
    cu = cudadrv.Cuda(cudadrv.load_libcuda(), _State())
    fn = getattr(cu.lib, "cuMemGetHandleForAddressRange", None)
    if fn is not None:
        try:
            fn.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_ulonglong)
            fn.restype = ctypes.c_int
        except (AttributeError, TypeError):
            pass
    return cu


def read_cuda(export: bool = True, cuda_factory: Any = None) -> tuple[dict[str, Any], Any]:
    """CUDA attributes per device and, with ``export``, a dma-buf export of a 2 MiB ``cuMemAlloc``
    buffer on device 0. Returns ``(readings, held)``: ``held`` is ``None`` or the live buffer with
    ``ptr``, ``fd`` (the exported dma-buf fd, still open; -1 when the export was refused), ``size``
    and ``release()`` (closes the fd, frees the buffer, releases the context); the caller registers
    them, then calls ``release()``.

    ``readings``: ``{"devices": [{"ordinal", "name", "integrated", "gpu_direct_rdma_supported",
    "dma_buf_supported"}], "dmabuf_export": {"ordinal", "bytes", "ok", "error"} | None, "why"?}``.
    Never raises."""
    out: dict[str, Any] = {"devices": [], "dmabuf_export": None}
    try:
        cu = (cuda_factory or _cuda)()
        cu("cuInit", 0)
        n = ctypes.c_int()
        cu("cuDeviceGetCount", ctypes.byref(n))
    except Exception as e:  # noqa: BLE001 - no driver, no GPU: a fact
        out["why"] = f"CUDA not usable: {e}"
        return out, None
    for i in range(n.value):
        d: dict[str, Any] = {"ordinal": i}
        try:
            dev = ctypes.c_int()
            cu("cuDeviceGet", ctypes.byref(dev), i)
            name = ctypes.create_string_buffer(256)
            cu("cuDeviceGetName", name, 256, dev.value)
            d["name"] = name.value.decode("utf-8", "replace")
            for key, attr in (("integrated", CU_DEVICE_ATTRIBUTE_INTEGRATED),
                              ("gpu_direct_rdma_supported", CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED),
                              ("dma_buf_supported", CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)):
                try:
                    d[key] = bool(cu.attr(attr, dev.value))
                except Exception as e:  # noqa: BLE001 - an older driver lacks the attribute
                    d[key] = None
                    d.setdefault("notes", []).append(f"attribute {attr}: {e}")
        except Exception as e:  # noqa: BLE001
            d["why"] = str(e)
        out["devices"].append(d)
    if not export or not out["devices"]:
        return out, None
    return out, _export(cu, out)


class _Held:
    """A live dma-buf export: the fd, and what ``release`` undoes (in reverse order)."""

    def __init__(self, cu: Any, dev: int, ctx: Any, ptr: int, fd: int, size: int) -> None:
        self.cu, self.dev, self.ctx, self.ptr, self.fd, self.size = cu, dev, ctx, ptr, fd, size
        self.released: list[str] = []

    def release(self) -> list[str]:
        """Close the fd, free the buffer, release the primary context; returns what failed (words)."""
        failed = []
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError as e:
                failed.append(f"close dma-buf fd: {e}")
            self.fd = -1
        steps = ([("cuMemFree_v2", (self.ptr,))] if self.ptr else []) + (
            [("cuCtxSetCurrent", (None,))] if self.ctx is not None else [])
        for name, args in steps:
            try:
                self.cu(name, *args)
            except Exception as e:  # noqa: BLE001
                failed.append(f"{name}: {e}")
        if self.ctx is not None:
            try:
                self.cu(self.cu.first("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), self.dev)
            except Exception as e:  # noqa: BLE001
                failed.append(f"cuDevicePrimaryCtxRelease: {e}")
        self.ptr, self.ctx = 0, None
        return failed


def _export(cu: Any, out: dict[str, Any]) -> _Held | None:
    """Allocate the buffer on device 0 and export it as a dma-buf. Returns the held buffer (its
    ``fd`` -1 when the export was refused: the buffer still serves the nvidia-peermem test), or
    None when not even the allocation worked (everything already released)."""
    ex: dict[str, Any] = {"ordinal": 0, "bytes": EXPORT_BYTES, "ok": False, "error": None}
    out["dmabuf_export"] = ex
    held = _Held(cu, 0, None, 0, -1, EXPORT_BYTES)
    try:
        ctx = ctypes.c_void_p()
        cu("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
        held.ctx = ctx
        cu("cuCtxSetCurrent", ctx)
        p = ctypes.c_uint64()
        cu("cuMemAlloc_v2", ctypes.byref(p), EXPORT_BYTES)
        held.ptr = p.value
    except Exception as e:  # noqa: BLE001
        ex["error"] = f"no buffer to export: {e}"
        failed = held.release()
        if failed:
            ex["release_failed"] = failed
        return None
    try:
        if not cu.has("cuMemGetHandleForAddressRange"):
            ex["error"] = "libcuda has no cuMemGetHandleForAddressRange (driver older than CUDA 11.7)"
            return held
        fd = ctypes.c_int(-1)
        cu("cuMemGetHandleForAddressRange", ctypes.byref(fd), p.value, EXPORT_BYTES,
           CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0)
        held.fd = fd.value if isinstance(fd.value, int) else -1
        ex["ok"] = held.fd >= 0
        if not ex["ok"]:
            ex["error"] = f"cuMemGetHandleForAddressRange gave fd {fd.value}"
    except Exception as e:  # noqa: BLE001 - CUDA_ERROR_NOT_SUPPORTED and the like are the fact
        ex["error"] = str(e)
    return held


# --- verbs ---------------------------------------------------------------------------------------


def _err(exc: BaseException) -> tuple[int | None, str]:
    return _err_code(exc), f"{type(exc).__name__}: {exc}"


def _import_pyverbs() -> dict[str, Any] | None:
    try:
        import pyverbs.device as device
        import pyverbs.enums as enums
        import pyverbs.mr as mr
        import pyverbs.pd as pd
    except Exception:  # noqa: BLE001 - ImportError, or a pyverbs built for another Python/rdma-core
        return None
    return {"device": device, "enums": enums, "mr": mr, "pd": pd}


def _access(e: Any) -> int:
    return e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def _hold_host_mrs(pv: dict[str, Any], pd: Any, acc: int, count: int, deadline: float) -> dict[str, Any]:
    """``count`` x 1 MiB host MRs on ``pd`` held at once, until the first error or ``deadline``
    (``time.monotonic()``); all closed before returning: ``{"wanted", "registered", "bytes_each",
    "errno", "error", "stopped_by_deadline", "elapsed_ms"}``."""
    held: list[Any] = []
    cnt: dict[str, Any] = {"wanted": count, "registered": 0, "bytes_each": HOST_MR_BYTES, "errno": None,
                           "error": None, "stopped_by_deadline": False}
    t0 = time.monotonic()
    try:
        for _ in range(count):
            if time.monotonic() > deadline:
                cnt["stopped_by_deadline"] = True
                break
            try:
                held.append(pv["mr"].MR(pd, HOST_MR_BYTES, acc))
            except Exception as exc:  # noqa: BLE001
                cnt["errno"], cnt["error"] = _err(exc)
                break
        cnt["registered"] = len(held)
    finally:
        for m in reversed(held):
            try:
                m.close()
            except Exception:  # noqa: BLE001 - the PD close below reports leaks
                pass
        cnt["elapsed_ms"] = round((time.monotonic() - t0) * 1000, 1)
    return cnt


def register_on_device(pv: dict[str, Any], name: str, count: int, deadline: float,
                       gpu: _Held | None) -> dict[str, Any]:
    """On RDMA device ``name``: a 1 MiB host MR (``host_mr``), ``count`` x 1 MiB host MRs held at once
    (``host_mr_count``: stops at the first error or ``deadline``, a ``time.monotonic()`` value), the
    GPU buffer of ``gpu`` registered by address (``gpu_mr``: the nvidia-peermem path; EFAULT without
    GPUDirect RDMA) and its dma-buf fd as a DmaBufMR (``dmabuf_mr``, when the export worked).
    Everything created is closed in reverse order. Never raises."""
    e = pv["enums"]
    res: dict[str, Any] = {"name": name, "host_mr": None, "host_mr_count": None, "gpu_mr": None,
                           "dmabuf_mr": None, "destroyed": False}
    created: list[Any] = []
    try:
        try:
            ctx = pv["device"].Context(name=name)
            created.append(ctx)
            pd = pv["pd"].PD(ctx)
            created.append(pd)
        except Exception as exc:  # noqa: BLE001
            n, text = _err(exc)
            res["open_error"] = {"errno": n, "error": f"open {name} / alloc PD: {text}"}
            return res
        acc = _access(e)
        try:
            mr = pv["mr"].MR(pd, HOST_MR_BYTES, acc)
            mr.close()
            res["host_mr"] = {"ok": True, "bytes": HOST_MR_BYTES}
        except Exception as exc:  # noqa: BLE001
            n, text = _err(exc)
            res["host_mr"] = {"ok": False, "bytes": HOST_MR_BYTES, "errno": n, "error": text}
        res["host_mr_count"] = _hold_host_mrs(pv, pd, acc, count, deadline) if count else None
        if gpu is not None and gpu.ptr:
            g: dict[str, Any] = {"gpu_ordinal": gpu.dev, "bytes": gpu.size}
            try:  # what engines do with nvidia-peermem: ibv_reg_mr on a cuMemAlloc pointer
                m = pv["mr"].MR(pd, gpu.size, acc, address=gpu.ptr)
                m.close()
                g["ok"] = True
            except Exception as exc:  # noqa: BLE001 - EFAULT (14) "Bad address" without GPUDirect RDMA
                n, text = _err(exc)
                g.update(ok=False, errno=n, error=text)
            res["gpu_mr"] = g
        if gpu is not None and gpu.fd >= 0:
            dmabuf = gpu
            d: dict[str, Any] = {"gpu_ordinal": dmabuf.dev, "bytes": dmabuf.size}
            try:
                m = pv["mr"].DmaBufMR(pd, dmabuf.size, acc, dmabuf=dmabuf.fd, offset=0)
                m.close()
                d["ok"] = True
            except TypeError as exc:  # an older pyverbs takes only its own DmaBuf objects
                d.update(ok=None, errno=None, error=f"this pyverbs cannot register an external dma-buf fd ({exc})")
            except Exception as exc:  # noqa: BLE001
                n, text = _err(exc)
                d.update(ok=False, errno=n, error=text)
            res["dmabuf_mr"] = d
    finally:
        fails = []
        for obj in reversed(created):
            try:
                obj.close()
            except Exception as exc:  # noqa: BLE001
                fails.append(f"{type(obj).__name__}: {exc}")
        res["destroyed"] = not fails
        if fails:
            res["destroy_failed"] = fails
    return res


def read_memreg(root: str = "/", timeout_s: float = 10.0, count: int = COUNT_DEFAULT, cuda: bool = True,
                verbs: bool = True, cuda_factory: Any = None, pyverbs: Any = None,
                device_names: list[str] | None = None) -> dict[str, Any]:
    """Everything the module docstring lists, as JSON-shaped readings:
    ``{"driver", "cma", "memlock_soft_bytes", "cuda", "verbs": {"devices": [...], "why"?}, "notes"}``.
    ``root`` is where /proc and /sys are read (a test points it at a fake tree); ``cuda_factory``
    and ``pyverbs`` replace libcuda and pyverbs (tests); ``device_names`` the RDMA devices (default:
    ``<root>/sys/class/infiniband``). The registration count stops at ``timeout_s`` / 2. Never raises."""
    deadline = time.monotonic() + max(0.5, timeout_s / 2)
    out: dict[str, Any] = {"driver": read_driver(root), "cma": read_cma(root), "memlock_soft_bytes": read_memlock(),
                           "cuda": None, "verbs": {"devices": []}, "count_wanted": count, "notes": []}
    held = None
    try:
        if cuda:
            out["cuda"], held = read_cuda(export=verbs, cuda_factory=cuda_factory)
        if not verbs:
            out["verbs"]["why"] = "not asked"
            return out
        pv = pyverbs if pyverbs is not None else _import_pyverbs()
        if pv is None:
            out["verbs"]["why"] = "pyverbs is not installed: apt install python3-pyverbs"
            return out
        names = device_names
        if names is None:
            try:
                names = sorted(os.listdir(Path(root) / "sys/class/infiniband"))
            except OSError:
                names = []
        if not names:
            out["verbs"]["why"] = "no RDMA device on this host"
        for name in names:
            out["verbs"]["devices"].append(register_on_device(pv, name, count, deadline, held))
    except Exception as e:  # noqa: BLE001 - a bug here must not stop the run
        out["notes"].append(f"memory-registration probe stopped: {type(e).__name__}: {e}")
    finally:
        if held is not None:
            failed = held.release()
            if failed and out["cuda"] and out["cuda"].get("dmabuf_export"):
                out["cuda"]["dmabuf_export"]["release_failed"] = failed
    return out


# ---------------------------------------------------------------------------------------------
# the probe


def _wanted(run: Run) -> bool:
    # --no-qp skips every verbs object a run would create; a capture records the registrations
    return run.capturing or not run.live or run.inputs.run_qp


def _bound(run: Run) -> float:
    return run.inputs.timeout("qp_s") * 2 + 5.0  # CUDA initialisation takes seconds on a large GPU


def _read(run: Run, progress: Any) -> dict[str, Any]:
    src = run.src.memreg
    if src is None:
        return {"memreg.json": None}
    progress.doing = "registering host and GPU memory (pyverbs MR, DmaBufMR; CUDA dma-buf export)"
    if src is LIVE:
        return {"memreg.json": read_memreg(run.src.root or "/", timeout_s=_bound(run) - 3.0)}
    return {"memreg.json": src()}


PROBE = Probe("memreg", "memory-registration probe (pyverbs MR, CUDA dma-buf)", _bound, (Artifact("memreg.json"),),
              _read, lambda run, r, progress: {"memreg": memreg_facts(r.get("memreg.json"))},
              lambda why: {"memreg": MemRegFacts(captured=False, failed=why, notes=[why])}, _wanted)


def main(argv: list[str] | None = None) -> None:
    """``python -m afddiag.probes.memreg [--no-verbs] [--count N] [--timeout S]``: the readings as JSON."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m afddiag.probes.memreg")
    ap.add_argument("--no-verbs", action="store_true", help="CUDA attributes and the export only")
    ap.add_argument("--no-cuda", action="store_true")
    ap.add_argument("--count", type=int, default=COUNT_DEFAULT, help="N x 1 MiB host registrations held at once")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds")
    a = ap.parse_args(argv)
    r = read_memreg(timeout_s=a.timeout, count=max(0, a.count), cuda=not a.no_cuda, verbs=not a.no_verbs)
    json.dump(r, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
