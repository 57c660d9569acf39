"""Capture bundles on disk: write a ``.tar.gz`` atomically, extract one safely.

A bundle is a gzip'd tar of a snapshot directory (the artifacts of
:data:`afddiag.probes.registry.PROBES`), usually under one top folder. Extraction trusts nothing in the archive:
only plain files and folders with relative names that stay inside the target are written, each file
and the whole bundle under a size cap, and anything else refuses the whole bundle with one line
(:class:`BundleError`) before a byte of that member is written.
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING

from afddiag.atomic import atomic_write

if TYPE_CHECKING:
    import tarfile

MAX_FILE_BYTES = 64 << 20  # one member (GPU readings with Xid events are ~100 KiB; sysfs files are bytes)
MAX_TOTAL_BYTES = 256 << 20  # every member together, as extracted (a gzip bomb stops here)
# a real capture holds ~2,000 (case 17: 2,086); 50,000 extract within the time bound on a loaded 2-core machine
MAX_MEMBERS = 50_000

BUNDLE_SUFFIXES = (".tar.gz", ".tgz")


class BundleError(ValueError):
    """A bundle that is refused or unreadable; the message is one line naming the bundle and why."""


def is_bundle(path: str | os.PathLike) -> bool:
    """True when ``path`` names a capture bundle (``.tar.gz``/``.tgz``) rather than a directory."""
    return str(path).endswith(BUNDLE_SUFFIXES)


def write_tar_gz(target: str | os.PathLike, files: dict[str, bytes], top: str = "") -> Path:
    """Write ``files`` (relative POSIX path → content) as a gzip'd tar at ``target``, atomically:
    a temporary file in the target's folder, fsync, then ``os.replace``. Members are regular files
    (mode 0644, owner 0, mtime now) under ``top/`` when given, sorted by name. Returns the path.
    Raises OSError when the folder cannot be written (the temporary file is removed)."""
    import tarfile  # the tar module only when a bundle is written or read (start-up)

    p = Path(target)

    now = int(time.time())
    with atomic_write(p, binary=True, device_ok=True) as raw:
        with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
            dirs: set[str] = set()
            for name in sorted(files):
                full = posixpath.join(top, name) if top else name
                parent = posixpath.dirname(full)
                chain = []
                while parent and parent not in dirs:
                    chain.append(parent)
                    dirs.add(parent)
                    parent = posixpath.dirname(parent)
                for d in reversed(chain):
                    ti = tarfile.TarInfo(d)
                    ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, now
                    tar.addfile(ti)
                data = files[name]
                ti = tarfile.TarInfo(full)
                ti.size, ti.mode, ti.mtime = len(data), 0o644, now
                tar.addfile(ti, io.BytesIO(data))
    return p


def _member_path(name: str) -> list[str]:
    """A member's name → its path components; raises BundleError for absolute or escaping names."""
    if not name or "\0" in name:
        raise BundleError(f"member {name!r} has an empty or NUL name")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":") or name.startswith("\\"):
        raise BundleError(f"member {name!r} has an absolute path")
    parts = [c for c in name.split("/") if c not in ("", ".")]
    if any(c == ".." for c in parts):
        raise BundleError(f"member {name!r} climbs out of the bundle ('..')")
    if any("\\" in c for c in parts):
        raise BundleError(f"member {name!r} has a backslash in its name")
    return parts


MAX_HEADER_BYTES = 1 << 20  # one tar header record: a GNU long name or pax header (real ones: < 1 KiB)
# path components of a member (a capture's deepest: top/sys/class/infiniband/d/ports/1/gid_attrs/types/0)
MAX_DEPTH = 32
EXTRACT_TIMEOUT_S = 60.0  # the whole extraction (case 17, 2,086 members: 1.5-3 s on a loaded 2-core machine)


class _Capped:
    """The decompressed tar stream, counted: every byte tarfile reads or skips (headers, GNU long
    names, pax records, member data) counts against ``max_total``; one read past ``max_read`` (a
    header record that large) or past the deadline refuses the bundle before tarfile holds it.
    gzip/zlib errors become :class:`BundleError`."""

    def __init__(self, raw, max_total: int, max_read: int, deadline: float, timeout_s: float) -> None:
        self.raw, self.max_total, self.max_read = raw, max_total, max_read
        self.deadline, self.timeout_s = deadline, timeout_s
        self.name = getattr(raw, "name", None)
        self.mode = "rb"

    def _check(self) -> None:
        if time.monotonic() > self.deadline:
            raise BundleError(f"not extracted within {self.timeout_s:g} s (too many or too large members)")
        if self.raw.tell() > self.max_total:
            raise BundleError(f"bundle is over the {self.max_total}-byte cap (headers and data, uncompressed)")

    def _guard(self, fn, *a):
        import zlib

        try:
            out = fn(*a)
        except (zlib.error, EOFError, OSError) as e:
            raise BundleError(f"corrupt compressed data ({type(e).__name__}: {e})") from None
        self._check()
        return out

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.max_read:
            raise BundleError(f"a tar record of {'unbounded' if n is None or n < 0 else n} bytes (a GNU long name or "
                              f"pax header over the {self.max_read}-byte cap)")
        return self._guard(self.raw.read, n)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0 and offset > self.max_total:
            raise BundleError(f"bundle is over the {self.max_total}-byte cap (headers and data, uncompressed)")
        return self._guard(self.raw.seek, offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()


def _accepted_member_path(m: tarfile.TarInfo) -> list[str]:
    """The path components of the tar member ``m`` (``[]`` for the bundle's root); BundleError when ``m``
    is a link, a device, FIFO or other non-file, or deeper than :data:`MAX_DEPTH`."""
    parts = _member_path(m.name)
    if len(parts) > MAX_DEPTH:
        raise BundleError(f"member {m.name[:80]!r}... is {len(parts)} folders deep (cap {MAX_DEPTH})")
    if m.issym() or m.islnk():
        raise BundleError(f"member {m.name!r} is a {'symbolic' if m.issym() else 'hard'} link "
                          f"(to {m.linkname!r}); a bundle holds plain files only")
    if not (m.isreg() or m.isdir()):
        raise BundleError(f"member {m.name!r} is not a plain file or folder (device, FIFO or other)")
    return parts


def _write_member(tar: tarfile.TarFile, m: tarfile.TarInfo, root: Path, parts: list[str], max_file_bytes: int) -> None:
    """Copy the regular member ``m`` of ``tar`` into the new file ``root/parts...`` (``O_EXCL|O_NOFOLLOW``,
    mode 0644; its folders made by :func:`_mkdirs`), at most ``max_file_bytes`` (its header's size and the
    bytes read both); BundleError when over or when the file exists (the member appears twice)."""
    if m.size > max_file_bytes:
        raise BundleError(f"member {m.name!r} is {m.size} bytes, over the {max_file_bytes}-byte cap")
    parent = _mkdirs(root, parts[:-1])
    src = tar.extractfile(m)
    if src is None:  # pragma: no cover - isreg() members always have data
        raise BundleError(f"member {m.name!r} has no data")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(parent / parts[-1], flags, 0o644)
    except FileExistsError:
        raise BundleError(f"member {m.name!r} appears twice") from None
    with os.fdopen(fd, "wb") as out:
        written = 0
        while chunk := src.read(1 << 16):
            written += len(chunk)
            if written > max_file_bytes:
                raise BundleError(f"member {m.name!r} is over the {max_file_bytes}-byte cap")
            out.write(chunk)


def safe_extract(bundle: str | os.PathLike, dest: str | os.PathLike, max_file_bytes: int | None = None,
                 max_total_bytes: int | None = None, max_members: int | None = None,
                 timeout_s: float | None = None) -> Path:
    """Extract the ``.tar.gz`` ``bundle`` into the existing, empty folder ``dest`` and return the
    snapshot root inside it (``dest``, or its single top folder).

    Only regular files and folders are accepted. Refused, with :class:`BundleError` naming the member:
    absolute names, ``..``, symbolic and hard links, device files, FIFOs, a path deeper than
    :data:`MAX_DEPTH` components, a member over ``max_file_bytes`` (default :data:`MAX_FILE_BYTES`), a
    bundle whose uncompressed stream (headers, GNU long names and pax records included) passes
    ``max_total_bytes`` (counted as tarfile reads, so a lying header or a gzip bomb stops there), a
    header record over :data:`MAX_HEADER_BYTES`, more than ``max_members``, an extraction past
    ``timeout_s`` (default :data:`EXTRACT_TIMEOUT_S`), a duplicate file, corrupt gzip/deflate data.
    Files are created with ``O_EXCL|O_NOFOLLOW`` under folders this function made, so nothing is
    written outside ``dest``. What was extracted before a refusal stays in ``dest`` (the caller
    removes it: :func:`remove_tree`). Raises BundleError too when the file is not a readable gzip'd tar.
    (Python 3.11.2's tarfile has no ``filter="data"``; these checks are a superset of it.)
    """
    import gzip
    import tarfile  # the tar module only when a bundle is written or read (start-up)

    max_file_bytes = max_file_bytes or MAX_FILE_BYTES
    max_total_bytes = max_total_bytes or MAX_TOTAL_BYTES
    max_members = max_members or MAX_MEMBERS
    timeout_s = timeout_s or EXTRACT_TIMEOUT_S
    deadline = time.monotonic() + timeout_s
    root = Path(dest)
    count = 0
    try:
        raw = gzip.GzipFile(bundle, mode="rb")
        stream = _Capped(raw, max_total_bytes, MAX_HEADER_BYTES, deadline, timeout_s)
        tar = tarfile.open(fileobj=stream, mode="r:")  # type: ignore[call-overload]
    except BundleError as e:
        raise BundleError(f"not a readable .tar.gz ({e})") from None
    except (OSError, tarfile.TarError, EOFError) as e:
        raise BundleError(f"not a readable .tar.gz ({e})") from None
    try:
        with tar:
            for m in tar:
                count += 1
                if count > max_members:
                    raise BundleError(f"more than {max_members} members")
                parts = _accepted_member_path(m)
                if not parts:
                    continue
                if m.isdir():
                    _mkdirs(root, parts)
                    continue
                _write_member(tar, m, root, parts, max_file_bytes)
            while stream.read(1 << 16):  # to the gzip trailer: its CRC catches a corrupt stream zlib let by
                pass
    except BundleError:
        raise
    except (tarfile.TarError, EOFError, OSError, UnicodeError) as e:
        raise BundleError(f"unreadable ({e})") from None
    entries = [e for e in root.iterdir()]
    if len(entries) == 1 and entries[0].is_dir() and entries[0].name != "sys":
        return entries[0]
    return root


def remove_tree(top: str | os.PathLike) -> None:
    """Remove the folder ``top`` and everything under it, iteratively (no recursion, whatever the
    depth) and through folder descriptors (no path grows past PATH_MAX; links are removed, never
    followed). Best effort: never raises; what could not be removed stays."""
    import contextlib

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        stack: list[tuple[int, str, set[str]]] = [(os.open(top, flags), "", set())]
    except OSError:
        return
    while stack:
        fd, _, tried = stack[-1]
        child = None
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name not in tried:  # a folder that would not go is not tried twice
                            child = entry.name
                            break
                        continue
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=fd)
        except OSError:
            pass
        if child is not None:
            tried.add(child)
            try:
                stack.append((os.open(child, flags, dir_fd=fd), child, set()))
            except OSError:  # cannot descend (too many open files?): leave it
                pass
            continue
        name = stack.pop()[1]
        os.close(fd)
        if stack:
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=stack[-1][0])
    with contextlib.suppress(OSError):
        os.rmdir(top)


def _mkdirs(root: Path, parts: list[str]) -> Path:
    """Make ``root/parts...`` folder by folder, refusing any component that exists as a non-folder
    or a link (so a later member cannot be steered out of ``root``)."""
    cur = root
    for c in parts:
        cur = cur / c
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise BundleError(f"path {'/'.join(parts)!r} passes through a file")
    return cur
