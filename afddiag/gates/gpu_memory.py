"""Who holds the GPU memory a role's reservation finds short, so that ``gpu.memory`` and ``gpu.headroom``
never give a remedy ``gpu.processes`` contradicts for the same reading: a display server (graphics
processes) is no tenant there, so it is not a process to stop here either. Pure functions over the GPU
facts."""

from __future__ import annotations

from typing import Any

from afddiag.gates.gpu_load import own_pids
from afddiag.model.gpu import GpuDevice, GpuFacts, is_own_process, other_compute

GIB = 2**30


def display_only(d: GpuDevice, g: GpuFacts) -> list[dict[str, Any]]:
    """The graphics processes (a display server: Xorg, gnome-shell) on ``d`` when they are all that holds
    its memory besides afddiag: the process list was read and holds no compute tenant (what
    ``gpu.processes`` passes as "not tenants"). [] otherwise (a tenant, no display, or the list unread)."""
    if not isinstance(d.processes, list):
        return []
    own = own_pids(d, g)
    if other_compute(d.processes, own):
        return []
    return [p for p in d.processes
            if isinstance(p, dict) and p.get("type") == "graphics" and not is_own_process(p, own)]


def display_remedy(shown: list[dict[str, Any]], free_bytes: int, total_bytes: int | None) -> str:
    """The remedy for a reservation a display server leaves short (``shown``: its processes; the GPU's free
    and total bytes): lower the reservation to what is free, or a GPU without a display; never "stop the
    processes" gpu.processes counts as no tenant."""
    names = ", ".join(f"pid {p.get('pid')} {p.get('name') or '?'}"
                      + (f" {p['used_bytes'] / GIB:.2f} GiB" if isinstance(p.get("used_bytes"), int) else "")
                      for p in shown)
    most = (f" (at most {int(free_bytes / total_bytes * 100) / 100:.2f} of this GPU's memory)"
            if total_bytes else f" (at most {free_bytes / GIB:.2f} GiB)")
    return (f"the display server holds the rest ({names}), which gpu.processes counts as no tenant: it is not a "
            f"process to stop; lower the role's reservation to what is free{most} in its playbook ([gpu] "
            "reserve_fraction / reserve_bytes) and the engine's memory flag together, or run the role on a GPU "
            "that drives no display")
