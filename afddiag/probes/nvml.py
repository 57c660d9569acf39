"""The one NVML wrapper (``pynvml``, the nvidia-ml-py package) for the package.

:func:`open_nvml` imports ``pynvml`` lazily (a run that needs no GPU never imports it; tests put a
fake module in ``sys.modules["pynvml"]``) and calls ``nvmlInit``; :func:`close_nvml` calls
``nvmlShutdown``. Each caller pairs them (the GPU probe, its busy check, the load probe's sampler)
and keeps its own time bound (each runs NVML in a worker thread it waits on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LIBNVML = "libnvidia-ml.so.1"


class NvmlUnavailable(Exception):
    """NVML could not be opened; the message says why (package missing, no driver, nvmlInit failed)."""


def open_nvml(in_call: Callable[[str | None], None] | None = None) -> Any:
    """``import pynvml`` and ``nvmlInit()`` → the pynvml module, ready for device calls.

    ``in_call`` (optional) is told the call in flight (``"import pynvml"``, ``"nvmlInit"``, then
    None), so a caller that times out can say which call hung. Raises :class:`NvmlUnavailable`
    with a one-line reason: the package not importable, ``libnvidia-ml.so.1`` not found (no NVIDIA
    driver), or ``nvmlInit`` failing."""
    mark = in_call or (lambda _name: None)
    try:
        mark("import pynvml")
        import pynvml as nv
    except Exception as e:  # noqa: BLE001 - ImportError, or a broken install
        raise NvmlUnavailable(f"python package nvidia-ml-py (pynvml) not importable: {e}") from None
    finally:
        mark(None)
    try:
        mark("nvmlInit")
        nv.nvmlInit()
    except Exception as e:  # noqa: BLE001 - pynvml raises NVMLError subclasses; fakes anything
        if getattr(e, "value", None) == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            raise NvmlUnavailable(f"{LIBNVML} not found ({e}; is the NVIDIA driver installed?)") from None
        raise NvmlUnavailable(f"nvmlInit failed: {type(e).__name__}: {e}") from None
    finally:
        mark(None)
    return nv


def close_nvml(nv: Any) -> str | None:
    """``nvmlShutdown()`` on a module :func:`open_nvml` returned → None, or why it failed (never raises)."""
    try:
        nv.nvmlShutdown()
    except Exception as e:  # noqa: BLE001
        return f"nvmlShutdown failed: {type(e).__name__}: {e}"
    return None
