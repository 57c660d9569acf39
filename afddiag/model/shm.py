"""Shared memory on the host: the files of ``/dev/shm`` (POSIX shared memory, a tmpfs) and which live
process maps or holds each. On unified memory (GB10) a segment a killed engine left behind holds memory
no process owns: ``gpu.headroom`` names it with its path and owner instead of "stop the processes".
Data only: the probe is :mod:`afddiag.probes.shm`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ShmFile:
    """One entry of ``/dev/shm``: ``bytes`` the memory it holds (allocated blocks, not its apparent size;
    a directory: its files' one level down), ``owner`` the user name (else the uid), ``holders`` the pids
    of live processes that map it or hold it open (None: not known, the processes could not all be read)."""

    path: str
    bytes: int
    owner: str
    mtime: float | None = None
    holders: list[int] | None = None


@dataclass
class ShmFacts:
    """``files``: the largest entries of ``/dev/shm`` (at most :data:`afddiag.probes.shm.KEEP`), largest first;
    ``total_bytes`` all of them together; ``holders_read``: whether every process's maps and open files were
    read (False: a file with no holder seen may still be used, say so)."""

    captured: bool = True
    files: list[ShmFile] = field(default_factory=list)
    total_bytes: int = 0
    entries: int = 0
    holders_read: bool = False
    failed: str | None = None
    notes: list[str] = field(default_factory=list)

    def orphaned(self) -> list[ShmFile]:
        """The files no live process maps or holds open (only when every process was read)."""
        return [f for f in self.files if f.holders == []] if self.holders_read else []
