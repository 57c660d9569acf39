"""Who holds the GPU memory a role's reservation finds short, so that ``gpu.memory`` and ``gpu.headroom``
never give a remedy ``gpu.processes`` contradicts for the same reading: a display server (graphics
processes) is no tenant there, so it is not a process to stop here either. Pure functions over the GPU
facts."""

from __future__ import annotations

from typing import Any

from afddiag.gates.gpu_load import own_pids
from afddiag.model.gpu import GpuDevice, GpuFacts, is_own_process, other_compute
from afddiag.model.shm import ShmFacts
from afddiag.shellcmd import command

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


SHM_NOTABLE_BYTES = 256 * 2**20  # a /dev/shm entry at least this large is named as a holder


def shm_holders_text(shm: ShmFacts | None, short_bytes: int,
                     other_remedy: str) -> tuple[str, str, str, list[str]] | None:
    """For unified memory (GB10) whose MemAvailable is ``short_bytes`` below the plan: the shared memory in
    ``/dev/shm`` that holds it, named with path and owner, as ``(summary tail, remedy, action, commands)``; None
    when /dev/shm holds nothing notable or was not read. Files no live process maps or holds open (every process
    read) are an exited engine's leftovers: CLEAN_SHM when they cover the shortfall, never "stop the processes"
    for them; when the processes could not all be read, the remedy says to check first (``fuser``)."""
    if shm is None or not shm.captured:
        return None
    big = [f for f in shm.files if f.bytes >= SHM_NOTABLE_BYTES]
    if not big:
        return None
    gib = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    orphans = [f for f in shm.orphaned() if f.bytes >= SHM_NOTABLE_BYTES]
    named = lambda fs: ", ".join(f"{f.path} (owner {f.owner}, {gib(f.bytes)})" for f in fs[:8])  # noqa: E731
    if orphans:
        held = sum(f.bytes for f in orphans)
        tail = f"; shared memory no live process maps or holds open: {gib(held)} in {named(orphans)}"
        fix = ("remove the shared memory an exited engine left behind, no process to stop for it (the command "
               "below; afddiag read every process's maps and open files and none uses these files), or reboot")
        rm = [command("sudo", "rm", "--", *(f.path for f in orphans[:8]))]
        if held >= short_bytes:
            return tail, fix, "CLEAN_SHM", rm
        return tail, f"{fix}; and {other_remedy}", "STOP_PROCESSES", rm
    used = [f for f in big if f.holders]
    if used and shm.holders_read:  # live processes hold them: stopping those is the remedy, by name
        pids = ", ".join(f"{f.path}: pid {', '.join(map(str, f.holders or []))}" for f in used[:8])
        return f"; shared memory held by live processes: {named(used)}", f"{other_remedy} (/dev/shm: {pids})", \
            "STOP_PROCESSES", []
    return (f"; shared memory in /dev/shm: {named(big)} (whether a live process still uses it was not read: "
            "not root)", "check /dev/shm first: the command below names the processes using each file; a file no "
            f"process uses is an exited engine's leftover to remove; then {other_remedy}", "STOP_PROCESSES",
            [command("sudo", "fuser", "-v", "--", *(f.path for f in big[:8]))])
