"""Safe file writes, as logrotate and systemd-tmpfiles do them: every file afddiag writes (reports,
bundles, baselines, zipapps) appears whole or not at all, nothing but a regular file is ever replaced,
and nothing another user planted is followed or replaced.

The folder comes first (:func:`check_folder`): every folder on the way must be owned by root or by
the user running afddiag, and none may be writable by others (world-writable, or group-writable by a
group other than root's or the user's) unless it is sticky like /tmp. A link on the way must be owned
by root or the user. The target's own folder, when it is sticky and others can write it, takes new
files only: afddiag creates the file (``link(2)`` of a finished temporary file: it fails rather than
replace anything) and replaces only a file of the user's own.

Then what is at the target decides how it is written (looked at without following it, ``O_NOFOLLOW``):

- nothing, or a regular file owned by root or the user: a temporary file beside it (``O_EXCL``),
  fsync, rename over it; an old file's mode and owner are kept;
- a regular file of another user: refused (afddiag never replaces another user's file);
- a symbolic link: refused (afddiag never writes through a link), except that with ``device_ok`` a
  link owned by root or the user that leads to a character device (``/dev/stdout`` on a terminal) is
  written in place;
- a character device the user named (``/dev/null``): written in place, never replaced
  (``device_ok=True``; off for paths afddiag chose itself);
- anything else (a FIFO, a socket, a folder, a block device, a character device afddiag chose):
  refused with :class:`OutputTargetError` before a byte is written.

Every refusal is one line naming the path and why (:func:`output_error`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO


class OutputTargetError(OSError):
    """The target is not something afddiag writes: ``strerror`` says what it is and what to give instead."""


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"), (stat.S_ISLNK, "a symbolic link"))


def target_kind(st: os.stat_result) -> str:
    """What a non-regular file is, in words ("a FIFO", "a folder", ...)."""
    return next((words for test, words in _KINDS if test(st.st_mode)), "not a regular file")


def trusted_uid(uid: int) -> bool:
    """Whether ``uid`` is root or the user running afddiag (the effective uid): the owners whose
    files and folders afddiag writes in."""
    return uid == 0 or uid == os.geteuid()


def others_can_write(st: os.stat_result) -> bool:
    """Whether users other than the owner may write ``st`` (world-writable, or group-writable by a
    group other than root's or the user's own, as logrotate judges a folder)."""
    return bool(st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and st.st_gid not in (0, os.getegid())))


def _refuse(why: str) -> OutputTargetError:
    return OutputTargetError(errno.EPERM, why)


def _owner(uid: int) -> str:
    return "root" if uid == 0 else f"uid {uid}"


def folder_problem(st: os.stat_result, where: str, sticky_ok: bool) -> str | None:
    """Why the folder ``where`` (its stat ``st``) is no place for afddiag's files, or None: owned by
    another user, or writable by others (unless ``sticky_ok`` and it is sticky)."""
    if not stat.S_ISDIR(st.st_mode):
        return f"{where} is {target_kind(st)}, not a folder"
    if not trusted_uid(st.st_uid):
        return (f"folder {where} is owned by {_owner(st.st_uid)}, not by root or you: that user could swap "
                "the file; give a folder root or you own")
    if others_can_write(st) and not (sticky_ok and st.st_mode & stat.S_ISVTX):
        return (f"folder {where} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): give a "
                "folder only root or you can write")
    return None


def check_folder(folder: str | os.PathLike, sticky_ok: bool = True) -> tuple[str, bool]:
    """Check the folder a file is written in → (its real path, whether it is shared: sticky and
    writable by others, so only new files may be created in it). Every link on the way to it must
    be owned by root or the user; every folder of its real path must pass :func:`folder_problem`
    (folders above it may be sticky, as /tmp; the folder itself only when ``sticky_ok``). Raises
    :class:`OutputTargetError` naming the folder and why, FileNotFoundError when it is absent."""
    given = os.path.abspath(os.fspath(folder) or ".")
    parts = given.split(os.sep)
    for i in range(2, len(parts) + 1):
        prefix = os.sep.join(parts[:i]) or os.sep
        st = os.lstat(prefix)
        if stat.S_ISLNK(st.st_mode) and not trusted_uid(st.st_uid):
            raise _refuse(f"{prefix} is a link owned by {_owner(st.st_uid)}, not by root or you: "
                          "afddiag never follows another user's link; give the real path")
    real = os.path.realpath(given)
    rparts = real.split(os.sep)
    shared = False
    for i in range(1, len(rparts) + 1):
        here = os.sep.join(rparts[:i]) or os.sep
        st = os.stat(here)
        last = i == len(rparts)
        why = folder_problem(st, here, sticky_ok=sticky_ok or not last)
        if why:
            raise _refuse(why)
        if last:
            shared = others_can_write(st)
    return real, shared


def written_by_others(p: str | os.PathLike, sticky_ok: bool) -> str | None:
    """Why users other than root and the one running afddiag could have written the input ``p`` (a
    baseline, a playbook: the file, or a folder above it, another user owns or can write; a sticky
    folder counts as safe with ``sticky_ok``), or None (also when absent). Read it only when None.
    A link at ``p`` counts as written by its owner (they can swap it after this look), and the folders of
    the file it leads to are checked as well as its own."""
    try:
        lst = os.lstat(p)
        st = os.stat(p)
    except OSError:
        return None
    if stat.S_ISLNK(lst.st_mode) and not trusted_uid(lst.st_uid):
        return f"it is a link owned by {_owner(lst.st_uid)}, not by root or you"
    if not stat.S_ISREG(st.st_mode):
        return None  # not read at all (afddiag.reader names what it is)
    if not trusted_uid(st.st_uid):
        return f"it is owned by uid {st.st_uid}, not by root or you"
    if others_can_write(st):
        return f"others can write it (mode {stat.S_IMODE(st.st_mode):04o})"
    for folder in dict.fromkeys((os.path.dirname(os.path.abspath(p)), os.path.dirname(os.path.realpath(p)))):
        try:
            check_folder(folder, sticky_ok=sticky_ok)
        except OutputTargetError as e:
            return str(e.strerror)
        except OSError:
            continue
    return None


def private_folder(folder: str | os.PathLike, create: bool = True) -> Path:
    """The state folder (baseline, history): created 0700 (with its parents) when ``create``, and
    refused (:class:`OutputTargetError`, one line) when another user owns it or others can write it
    (sticky or not: the history store puts its journal files beside it by name). Returns the path."""
    p = Path(folder)
    if create and not p.is_dir():
        try:
            os.makedirs(p, mode=0o700, exist_ok=True)
        except FileExistsError:
            pass  # a file in the way: said below
    try:
        check_folder(p, sticky_ok=False)
    except OutputTargetError as e:
        raise _refuse(f"state {e.strerror} (set AFDDIAG_STATE_DIR to a folder of yours)") from None
    return p


def _no_follow_open(name: str, dfd: int, flags: int, mode: int = 0o600) -> int:
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY, mode, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse("is a symbolic link: afddiag never writes through a link; give the file's own path") from None
        raise


def _device_through_link(full: str, st: os.stat_result, flags: int) -> int:
    """An fd open on the character device a trusted link at ``full`` leads to (``/dev/stdout`` on a
    terminal); refused for a link of another user or one that leads elsewhere."""
    if not trusted_uid(st.st_uid):
        raise _refuse(f"is a symbolic link owned by {_owner(st.st_uid)}: afddiag never writes through "
                      "another user's link; give the file's own path")
    real = os.path.realpath(full)
    try:
        fd = os.open(real, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        fd = -1
    if fd >= 0 and stat.S_ISCHR(os.fstat(fd).st_mode):
        return fd
    if fd >= 0:
        os.close(fd)
    raise _refuse(f"is a symbolic link (to {real}): afddiag never writes through a link to a file; "
                  "give the file's own path")


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, binary: bool = False, mode: int = 0o644,
                 device_ok: bool = False) -> Iterator[IO]:
    """Write ``path`` whole or not at all (see the module docstring for what each kind of target gets).

    A new file gets ``mode``; a replaced regular file keeps its mode and (when the caller may set it,
    e.g. root) its owner and group. ``device_ok``: a character device at ``path`` (one the user named,
    ``--output /dev/null``) is opened and written in place. Raises :class:`OutputTargetError` (an
    OSError, one line) for a folder another user owns or can write, a link, another user's file, a
    FIFO, socket, folder, block device or an unasked-for character device; OSError when the folder
    cannot be written; the temporary file is removed on any error."""
    p = Path(path)
    name = p.name
    if not name or name in (".", ".."):
        raise _refuse("is a folder, not a file: give a file path")
    real_dir, shared = check_folder(p.parent)
    dfd = os.open(real_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    enc = {} if binary else {"encoding": "utf-8", "errors": "backslashreplace"}
    try:
        why = folder_problem(os.fstat(dfd), real_dir, sticky_ok=True)  # the folder opened is the one checked
        if why:
            raise _refuse(why)
        try:
            st: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            if device_ok and (stat.S_ISCHR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                if stat.S_ISLNK(st.st_mode):
                    fd = _device_through_link(os.path.join(real_dir, name), st, os.O_WRONLY)
                else:
                    fd = _no_follow_open(name, dfd, os.O_WRONLY)
                    if not stat.S_ISCHR(os.fstat(fd).st_mode):  # swapped since the look
                        os.close(fd)
                        raise _refuse("changed while afddiag opened it: not written; give a file path")
                with os.fdopen(fd, "wb" if binary else "w", **enc) as f:  # type: ignore[call-overload]
                    yield f
                return
            if stat.S_ISLNK(st.st_mode):
                raise _refuse(f"is a symbolic link (to {os.readlink(name, dir_fd=dfd)}): afddiag never writes "
                              "through a link; give the file's own path")
            raise _refuse(f"is {target_kind(st)}, not a regular file (afddiag never replaces one): give a file path")
        if st is not None and not trusted_uid(st.st_uid):
            raise _refuse(f"is owned by {_owner(st.st_uid)}, not by root or you: afddiag never replaces "
                          "another user's file; remove it or give another path")
        if st is not None and shared and st.st_uid != os.geteuid():
            raise _refuse(f"is owned by {_owner(st.st_uid)} in {real_dir}, a folder others can write: afddiag "
                          "only creates new files there or replaces its own; give another path")
        yield from _write_beside(name, dfd, binary, mode, st, shared)
    finally:
        os.close(dfd)


def _write_beside(name: str, dfd: int, binary: bool, mode: int, st: os.stat_result | None,
                  shared: bool) -> Iterator[IO]:
    """Write a temporary file beside ``name`` (in the folder ``dfd``), then put it in place: a new
    file by ``link(2)`` in a shared folder (never replaces what appeared meanwhile), else rename."""
    tmp = ""
    for _ in range(100):
        tmp = f".{name[:200]}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 32 random bits
        raise OSError(errno.EEXIST, "no free temporary name")
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
        # the target may have changed while we wrote: replace only what was looked at
        try:
            now: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        if now is not None and not stat.S_ISREG(now.st_mode):
            raise _refuse(f"became {target_kind(now)} while afddiag wrote it: not replaced; give a file path")
        if now is not None and (not trusted_uid(now.st_uid) or (shared and now.st_uid != os.geteuid())):
            raise _refuse(f"became a file of {_owner(now.st_uid)} while afddiag wrote it: not replaced; "
                          "give another path")
        if now is None and shared:
            try:
                os.link(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)
            except FileExistsError:
                raise _refuse("appeared while afddiag wrote it, in a folder others can write: not replaced; "
                              "give another path") from None
            os.unlink(tmp, dir_fd=dfd)
        else:
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
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
