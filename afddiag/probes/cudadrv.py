"""The one binding of the CUDA driver (``libcuda.so.1``, through ctypes) for the package.

:func:`load_libcuda` is the only place that opens the library (lazily: a run that needs no CUDA
never calls it; tests replace it with a fake having the same methods). :func:`error_name` turns a
``CUresult`` into its name (``cuGetErrorName``). :class:`Cuda` is the typed binding the load and
memory-registration probes drive: the prototypes of :data:`PROTOTYPES` are set on the library, and
a call that does not return ``CUDA_SUCCESS`` raises :class:`CudaError` naming the call and the error.
The time bound is the caller's (each probe runs its CUDA work in a worker thread it waits on).
"""

from __future__ import annotations

import ctypes
from typing import Any

LIBCUDA = "libcuda.so.1"
CUDA_SUCCESS = 0

# CUdevice_attribute values (cuda.h).
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_DEVICE_ATTRIBUTE_INTEGRATED = 18
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116
CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124


def uuid_from_bytes(raw: bytes) -> str:
    """NVML's text form ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` of a 16-byte CUDA ``CUuuid``."""
    h = bytes(raw[:16]).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

_P = ctypes.POINTER
_VP = ctypes.c_void_p
PROTOTYPES: dict[str, tuple] = {
    "cuInit": (ctypes.c_uint,),
    "cuDeviceGetCount": (_P(ctypes.c_int),),
    "cuDeviceGet": (_P(ctypes.c_int), ctypes.c_int),
    "cuDeviceGetName": (ctypes.c_char_p, ctypes.c_int, ctypes.c_int),
    "cuDeviceGetAttribute": (_P(ctypes.c_int), ctypes.c_int, ctypes.c_int),
    "cuDeviceGetUuid_v2": (_VP, ctypes.c_int),
    "cuDeviceGetUuid": (_VP, ctypes.c_int),
    "cuDevicePrimaryCtxRetain": (_P(_VP), ctypes.c_int),
    "cuDevicePrimaryCtxRelease_v2": (ctypes.c_int,),
    "cuDevicePrimaryCtxRelease": (ctypes.c_int,),
    "cuCtxSetCurrent": (_VP,),
    "cuCtxSynchronize": (),
    "cuModuleLoadDataEx": (_P(_VP), ctypes.c_char_p, ctypes.c_uint, _P(ctypes.c_int), _P(_VP)),
    "cuModuleGetFunction": (_P(_VP), _VP, ctypes.c_char_p),
    "cuModuleUnload": (_VP,),
    "cuOccupancyMaxActiveBlocksPerMultiprocessor": (_P(ctypes.c_int), _VP, ctypes.c_int, ctypes.c_size_t),
    "cuMemGetInfo_v2": (_P(ctypes.c_size_t), _P(ctypes.c_size_t)),
    "cuMemAlloc_v2": (_P(ctypes.c_uint64), ctypes.c_size_t),
    "cuMemFree_v2": (ctypes.c_uint64,),
    "cuMemsetD8_v2": (ctypes.c_uint64, ctypes.c_ubyte, ctypes.c_size_t),
    "cuLaunchKernel": (
        _VP, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
        ctypes.c_uint, _VP, _P(_VP), _P(_VP),
    ),
    "cuEventCreate": (_P(_VP), ctypes.c_uint),
    "cuEventRecord": (_VP, _VP),
    "cuEventSynchronize": (_VP,),
    "cuEventElapsedTime_v2": (_P(ctypes.c_float), _VP, _VP),
    "cuEventElapsedTime": (_P(ctypes.c_float), _VP, _VP),
    "cuEventDestroy_v2": (_VP,),
    "cuGetErrorName": (ctypes.c_int, _P(ctypes.c_char_p)),
}


def load_libcuda() -> Any:
    """A fresh handle on the CUDA driver library ``libcuda.so.1`` (ctypes.CDLL; the seam tests
    replace). Raises OSError when the library cannot be loaded (no NVIDIA driver)."""
    return ctypes.CDLL(LIBCUDA)


def error_name(lib: Any, rc: int) -> str:
    """``"CUDA_ERROR_OUT_OF_MEMORY (2)"`` for ``CUresult`` ``rc`` (``cuGetErrorName``), or
    ``"CUresult 2"`` when the driver cannot name it. Never raises."""
    try:
        s = ctypes.c_char_p()
        if lib.cuGetErrorName(rc, ctypes.byref(s)) == CUDA_SUCCESS and s.value:
            return f"{s.value.decode()} ({rc})"
    except Exception:  # noqa: BLE001 - a fake or an old driver; the number still says it
        pass
    return f"CUresult {rc}"


class CudaError(Exception):
    """A driver call that did not return CUDA_SUCCESS (the message says which and why)."""


class Cuda:
    """Typed calls into libcuda (``lib``, from :func:`load_libcuda`); each failure raises
    :class:`CudaError` with the call and error name. ``state.in_call`` names the call in flight
    (so a caller that times out can say which call hung)."""

    def __init__(self, lib: Any, state: Any) -> None:
        self.lib = lib
        self.state = state
        for name, argtypes in PROTOTYPES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                continue
            try:
                fn.argtypes = argtypes
                fn.restype = ctypes.c_int
            except (AttributeError, TypeError):
                pass

    def has(self, name: str) -> bool:
        """Whether the driver exports ``name``."""
        try:
            return getattr(self.lib, name, None) is not None
        except Exception:  # noqa: BLE001 - ctypes raises AttributeError; fakes may raise anything
            return False

    def first(self, *names: str) -> str:
        """The first of ``names`` the driver exports (a ``_v2`` before its older form); raises
        :class:`CudaError` when none is."""
        for n in names:
            if self.has(n):
                return n
        raise CudaError(f"{LIBCUDA} exports none of {', '.join(names)}")

    def error_name(self, rc: int) -> str:
        """:func:`error_name` on this library."""
        return error_name(self.lib, rc)

    def __call__(self, name: str, *args: Any) -> None:
        """Call ``name(*args)``; raises :class:`CudaError` unless it returns CUDA_SUCCESS."""
        self.state.in_call = name
        try:
            rc = getattr(self.lib, name)(*args)
        finally:
            self.state.in_call = None
        if rc != CUDA_SUCCESS:
            raise CudaError(f"{name} returned {self.error_name(rc)}")

    def attr(self, attr: int, dev: int) -> int:
        """``cuDeviceGetAttribute(attr, dev)`` → the int value; raises :class:`CudaError`."""
        v = ctypes.c_int()
        self("cuDeviceGetAttribute", ctypes.byref(v), attr, dev)
        return v.value
