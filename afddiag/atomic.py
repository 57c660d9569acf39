"""Atomic file writes: every file afddiag writes (reports, bundles, baselines, zipapps) appears
whole or not at all, and nothing but a regular file is ever replaced.

What is at the target decides how it is written:

- nothing, or a regular file (through a symbolic link too: the link is kept, its target replaced):
  a temporary file beside it, fsync, rename over it; an old file's mode and owner are kept;
- a character device the user named (``/dev/null``, ``/dev/stdout`` on a terminal): written in
  place, never replaced (``device_ok=True``; off for paths afddiag chose itself);
- anything else (a FIFO, a socket, a folder, a block device, a character device afddiag chose):
  refused with :class:`OutputTargetError` before a byte is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class OutputTargetError(OSError):
    """The target is not something afddiag writes: ``strerror`` says what it is and what to give instead."""


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"))


def target_kind(st: os.stat_result) -> str:
    """What a non-regular file is, in words ("a FIFO", "a folder", ...)."""
    return next((words for test, words in _KINDS if test(st.st_mode)), "not a regular file")


def _classify(p: Path, device_ok: bool) -> tuple[Path, os.stat_result | None]:
    """(path to write, its stat or None when absent); raises OutputTargetError for what is never replaced."""
    try:
        st = os.stat(p)  # follows a link: its target is what gets written
    except FileNotFoundError:
        return p, None
    if stat.S_ISREG(st.st_mode):
        return (Path(os.path.realpath(p)) if os.path.islink(p) else p), st
    if stat.S_ISCHR(st.st_mode) and device_ok:
        return p, st
    raise OutputTargetError(errno.EINVAL, f"is {target_kind(st)}, not a regular file (afddiag never replaces one): "
                            "give a file path")


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, binary: bool = False, mode: int = 0o644,
                 device_ok: bool = False) -> Iterator[IO]:
    """Write ``path`` whole or not at all (see the module docstring for what each kind of target gets).

    A new file gets ``mode``; a replaced regular file keeps its mode and (when the caller may set it,
    e.g. root) its owner and group. ``device_ok``: a character device at ``path`` (one the user named,
    ``--output /dev/null``) is opened and written in place. Raises :class:`OutputTargetError` (an
    OSError) for a FIFO, socket, folder, block device or an unasked-for character device, OSError
    when the folder cannot be written; the temporary file is removed on any error."""
    p, st = _classify(Path(path), device_ok)
    if st is not None and not stat.S_ISREG(st.st_mode):  # a character device the user named
        with (open(p, "wb") if binary else open(p, "w", encoding="utf-8", errors="backslashreplace")) as f:
            yield f
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent) if str(p.parent) else ".")
    try:
        # backslashreplace: a non-UTF-8 device name (a lone surrogate from sysfs) is written as an escape
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace")) as f:
            yield f
            f.flush()
            if st is not None:
                with contextlib.suppress(PermissionError):  # only root may give a file away
                    os.fchown(f.fileno(), st.st_uid, st.st_gid)
            os.fchmod(f.fileno(), stat.S_IMODE(st.st_mode) if st is not None else mode)
            os.fsync(f.fileno())
        # the target may have changed while we wrote: replace only a regular file or nothing
        try:
            now = os.lstat(p)
        except FileNotFoundError:
            now = None
        if now is not None and not stat.S_ISREG(now.st_mode):
            raise OutputTargetError(errno.EINVAL, f"became {target_kind(now)} while afddiag wrote it: "
                                    "not replaced; give a file path")
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def output_error(what: str, e: OSError) -> str:
    """One line for a failed write of ``what`` (``--output FILE``): the reason and the fix."""
    if isinstance(e, OutputTargetError):
        return f"{what}: {e.strerror}"
    if e.errno == errno.ENOSPC:
        return f"{what}: no space left on the device: free space or give another place"
    return f"{what}: {e.strerror or e}: give a writable place"


# --- reading a secret (a pair key) -----------------------------------------------------------------


class SecretFileError(ValueError):
    """A secret file afddiag will not read; the message is one line naming the path, why and the fix."""


def read_secret(path: str | os.PathLike, max_bytes: int = 4096) -> bytes:
    """The bytes of a secret file (``--pair-key``), read only when it is a regular file (a link is
    never followed: ``O_NOFOLLOW``; ``O_NONBLOCK`` so a FIFO cannot hang the open) owned by root or
    the invoking user (effective uid) that group and others can neither read nor write (ssh's rule for
    a private key), at most ``max_bytes``. Raises :class:`SecretFileError` otherwise."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SecretFileError(f"{p}: is a symbolic link (afddiag never reads a secret through one): give the "
                                  "file itself") from None
        raise SecretFileError(f"{p}: {e.strerror or e}: give a readable key file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SecretFileError(f"{p}: is {target_kind(st)}, not a regular file: give a key file")
        me = os.geteuid()
        if st.st_uid not in (0, me):
            raise SecretFileError(f"{p}: is owned by uid {st.st_uid}, not by root or you (uid {me}): another user "
                                  f"could have written it; chown {'root' if me == 0 else me} it")
        if st.st_mode & 0o077:
            raise SecretFileError(f"{p}: mode {stat.S_IMODE(st.st_mode):04o} lets group or others at it: chmod 600 it")
        data = b""
        while len(data) <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > max_bytes:
            raise SecretFileError(f"{p}: is over {max_bytes} bytes: not a key file")
        return data
    finally:
        os.close(fd)
