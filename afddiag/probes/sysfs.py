"""Reading sysfs attributes: one file's text (:func:`read_text`) and a reader that turns the kernel's
quiet refusals into None (:class:`QuietReader`). The fabric probe (:mod:`afddiag.probes.fabric`), the PCIe
and counter probes and a run's reads (:meth:`afddiag.probes.registry.Run.read`) go through it.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable

from afddiag.textnum import digits

Reader = Callable[[str], str]


def read_text(path: str) -> str:
    """Read one sysfs attribute (at most 64 KiB) as stripped text. Raises OSError as the kernel
    answers it. os.open/os.read: a sysfs attribute is one read, and a GID table is 255-1,024 files
    a port, so the file-object machinery of open() is most of the cost."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


class QuietReader:
    """Wraps a text reader: returns None for absent/EINVAL/ENODATA attributes, notes other errors."""

    QUIET = (errno.ENOENT, errno.EINVAL, errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTDIR)

    def __init__(self, read: Reader):
        self.read = read

    def __call__(self, path: str, notes: list[str] | None = None) -> str | None:
        try:
            return self.read(path)
        except OSError as e:
            if e.errno not in self.QUIET and notes is not None:
                notes.append(f"{path}: {os.strerror(e.errno) if e.errno else e}")
            return None
        except (UnicodeError, ValueError) as e:  # pragma: no cover - defensive
            if notes is not None:
                notes.append(f"{path}: {e}")
            return None

    def errno_of(self, path: str) -> tuple[str | None, int | None]:
        """``(text, None)`` when ``path`` reads, else ``(None, errno)`` (0 for an error without one):
        for an attribute whose refusal means something (``speed``: EINVAL while the link is down)."""
        try:
            return self.read(path), None
        except OSError as e:
            return None, e.errno or 0
        except (UnicodeError, ValueError):
            return None, 0


_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@\-]+$")  # sysfs entry names copied into the bundle


def entry_names(path: str, numeric: bool = False) -> list[str]:
    """The entries of folder ``path`` a bundle may name (``numeric``: the integer ones, in order); [] unreadable."""
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    if numeric:
        return sorted((n for n in names if digits(n)), key=int)
    return [n for n in names if _NAME_RE.match(n)]
