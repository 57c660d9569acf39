"""One bounded reader for every input file afddiag did not write itself: snapshot parts, bundle
members once extracted, ``merge`` reports, baselines, launch env files, inventories.

Each read is bounded four ways: a size cap per file (bytes read, not the size the file claims), a
JSON nesting-depth cap checked before the parser sees the text (a 2 KB file of 1,000 brackets would
otherwise be a RecursionError), a confinement check (a snapshot's file may not be a link out of the
snapshot, nor a device, FIFO or socket), and a time bound (the read runs in a daemon thread; a hung
NFS mount or a FIFO cannot hold the main thread). A breach is :class:`InputError`, one line naming the
file and why; a missing file stays :class:`FileNotFoundError` (callers treat it as "not captured").
"""

from __future__ import annotations

import json
import os
import queue
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any

from afddiag.atomic import target_kind
from afddiag.textnum import kernel_int

MAX_JSON_BYTES = 64 << 20  # GPU readings with Xid events are ~100 KiB; 10k netdev addresses ~10 MiB
MAX_TEXT_BYTES = 1 << 20  # env files, inventories, a host name, one sysctl
MAX_DEPTH = 64  # the deepest JSON afddiag writes (a report's facts) nests ~10 levels
TIMEOUT_S = 30.0  # one file; a capped regular file reads in well under a second


class InputError(ValueError):
    """An input file refused or unreadable: the message is one line naming the file and why."""


class RefusedRead(Exception):
    """A snapshot sysfs file refused by :func:`confined_reader`. Neither an OSError nor a ValueError
    on purpose: the fabric probe treats those as one absent attribute, this stops the probe (its
    gates say ERROR naming the file)."""


class DepthError(InputError):
    """JSON nested deeper than the cap (refused before parsing)."""


def _kind(mode: int) -> str:
    return target_kind(os.stat_result((mode,) + (0,) * 9))


def _confine(path: str, root: str | None) -> None:
    """Refuse ``path`` when it resolves (through links) outside ``root``."""
    if root is None:
        return
    real, base = os.path.realpath(path), os.path.realpath(root)
    if real != base and not real.startswith(base.rstrip(os.sep) + os.sep):
        raise InputError(f"{path}: a link out of the snapshot (to {real}); a snapshot's files stay inside it")


def _read_capped(path: str, max_bytes: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise InputError(f"{path}: {st.st_size} bytes, over the {max_bytes}-byte cap")
        chunks, n = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - n)):
            chunks.append(chunk)
            n += len(chunk)
            if n > max_bytes:
                raise InputError(f"{path}: over the {max_bytes}-byte cap")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike, root: str | os.PathLike | None = None, max_bytes: int = MAX_JSON_BYTES,
               timeout_s: float = TIMEOUT_S) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``, read within ``timeout_s``
    seconds off the main thread. With ``root`` (a snapshot folder), ``path`` must resolve inside it.

    Raises FileNotFoundError when absent, :class:`InputError` (one line) when it is a link out of
    ``root``, not a regular file, over the cap, not read in time, or unreadable (EACCES, EIO)."""
    path = os.fspath(path)
    _confine(path, None if root is None else os.fspath(root))
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["data"] = _read_capped(path, max_bytes)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=work, name="afddiag-read", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise InputError(f"{path}: not read within {timeout_s:g} s (a hung mount?)")
    e = box.get("error")
    if isinstance(e, (FileNotFoundError, InputError)):
        raise e
    if isinstance(e, OSError):
        raise InputError(f"{path}: unreadable ({e.strerror or e})")
    if e is not None:
        raise e
    return box["data"]


def read_each(paths: list[str], max_bytes: int = MAX_JSON_BYTES, timeout_s: float = TIMEOUT_S,
              batch_files: int = 64, batch_bytes: int = 16 << 20) -> Iterator[tuple[str, bytes | FileNotFoundError]]:
    """``(path, bytes)`` of each regular file of ``paths`` in order, as :func:`read_bytes` reads
    one (same caps and refusals), read ahead by one worker thread in batches (up to ``batch_files``
    files or ``batch_bytes`` bytes, handed over together: a merge of 10,000 files starts one thread,
    not 10,000, and the two threads trade the interpreter lock once a batch, not once a file). A
    missing file is ``(path, FileNotFoundError)``; any other refusal raises :class:`InputError`, and
    so does a read that has not finished ``timeout_s`` seconds after the caller asked for its batch
    (naming the file being read; the worker is left behind as a daemon, as :func:`read_bytes`
    leaves its thread). A batch is handed over early when the next read would start over a second
    after the batch's first, so a hung read holds back at most a second's worth of files."""
    box: queue.Queue[list[tuple[str, Any]]] = queue.Queue(maxsize=2)
    stop = threading.Event()
    reading = [""]

    def work() -> None:
        batch: list[tuple[str, Any]] = []
        size, started = 0, time.monotonic()
        for path in paths:
            if stop.is_set():
                return
            if batch and (len(batch) >= batch_files or size >= batch_bytes or time.monotonic() - started > 1.0):
                box.put(batch)
                batch, size, started = [], 0, time.monotonic()
            reading[0] = path
            try:
                item: Any = _read_capped(path, max_bytes)
                size += len(item)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                item = e
            batch.append((path, item))
        if batch:
            box.put(batch)

    t = threading.Thread(target=work, name="afddiag-read-each", daemon=True)
    t.start()
    left = len(paths)
    try:
        while left:
            try:
                batch = box.get(timeout=timeout_s)
            except queue.Empty:
                raise InputError(f"{reading[0]}: not read within {timeout_s:g} s (a hung mount?)") from None
            left -= len(batch)
            batch.reverse()
            while batch:
                path, item = batch.pop()  # handed on, not held here: a 250 MB file is freed once parsed
                if isinstance(item, FileNotFoundError):
                    yield path, item
                elif isinstance(item, InputError):
                    raise item
                elif isinstance(item, OSError):
                    raise InputError(f"{path}: unreadable ({item.strerror or item})")
                elif isinstance(item, BaseException):
                    raise item
                else:
                    out, item = (path, item), None
                    yield out
    finally:
        stop.set()
        while True:  # let a worker blocked on a full queue see the stop
            try:
                box.get_nowait()
            except queue.Empty:
                break


def read_text(path: str | os.PathLike, root: str | os.PathLike | None = None, max_bytes: int = MAX_TEXT_BYTES,
              timeout_s: float = TIMEOUT_S, errors: str = "strict") -> str:
    """:func:`read_bytes` decoded as UTF-8. With ``errors="strict"`` a non-UTF-8 file is
    :class:`InputError` naming the byte offset."""
    data = read_bytes(path, root, max_bytes, timeout_s)
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        raise InputError(f"{os.fspath(path)}: not UTF-8 text (byte {e.start}): save it as UTF-8") from None


_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")  # both kinds of bracket as one: nesting is nesting
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'"[]{}')
_SCAN_CHUNK = 1 << 20


def _brackets(data: bytes) -> bytes:
    """The brackets of JSON ``data`` outside strings, ``{}`` as ``[]``, in order. Byte operations
    only (no regex, no loop per character), about 1 MiB at a time: escaped backslashes and quotes
    dropped (in JSON a backslash occurs only inside a string and escapes the next character), then
    everything but quotes and brackets; then every pair of adjacent quotes (an empty stretch of
    string, or a string's end and the next one's start with no bracket between: harmless either way,
    and the quotes' parity is kept), so only quotes that border a bracket inside a string are left
    to split on. A chunk never ends on a backslash, so no escape is cut in two; whether a chunk
    starts inside a string is carried over."""
    out: list[bytes] = []
    inside, pos, n = False, 0, len(data)
    while pos < n:
        end = min(pos + _SCAN_CHUNK, n)
        while end < n and data[end - 1] == 0x5C:
            end += 1
        chunk = data[pos:end]
        pos = end
        if 0x5C in chunk:
            chunk = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
        chunk = chunk.translate(_BRACKETS_ONLY, _NOT_STRUCTURE).replace(b'""', b"")
        if 0x22 in chunk or inside:
            parts = chunk.split(b'"')
            chunk = b"".join(parts[1::2] if inside else parts[0::2])
            inside ^= len(parts) % 2 == 0
        out.append(chunk)
    return b"".join(out)


def json_depth(text: str | bytes, limit: int = MAX_DEPTH) -> int:
    """The bracket nesting depth of JSON ``text`` (strings skipped), counted without recursion or a
    regex: the brackets outside strings (:func:`_brackets`), then each round removes every innermost
    ``[]`` pair (C-speed ``bytes.replace``), one round per level. Stops once past ``limit`` (returns
    ``limit + 1``). For unbalanced text (not JSON) the rounds plus the unmatched openers left bound
    the depth from above."""
    seq = _brackets(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text))
    depth = 0
    while seq:
        shorter = seq.replace(b"[]", b"")
        if len(shorter) == len(seq):  # unbalanced: only "]...][...[" is left
            return min(depth + seq.count(b"["), limit + 1)
        depth += 1
        if depth > limit:
            return depth
        seq = shorter
    return depth


def parse_json(text: str | bytes, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` of ``text`` with the depth checked first. Raises :class:`InputError` naming
    ``what`` for text that is not UTF-8, not JSON, or nested deeper than ``max_depth``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{what}: not UTF-8 (byte {e.start})") from None
    check_depth(text, what, max_depth)
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the depth check runs first
        raise InputError(f"{what}: JSON nested too deep") from None
    except ValueError as e:
        raise InputError(f"{what}: not JSON ({e})") from None


def check_depth(text: str | bytes, what: str, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`DepthError` naming ``what`` when JSON ``text`` nests deeper than ``max_depth``."""
    if json_depth(text, max_depth) > max_depth:
        raise DepthError(f"{what}: JSON nested deeper than {max_depth} levels")


def load_json(path: str | os.PathLike, root: str | os.PathLike | None = None, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_DEPTH, timeout_s: float = TIMEOUT_S) -> Any:
    """Read (:func:`read_bytes`) and parse (:func:`parse_json`) one JSON file. Raises
    FileNotFoundError when absent, :class:`InputError` for every other reason it cannot be used."""
    return parse_json(read_bytes(path, root, max_bytes, timeout_s), os.fspath(path), max_depth)


ERRNO_SUFFIX = ".errno"  # <attr>.errno in a capture: the attribute was there but its read failed with this errno


def confined_reader(root: str | os.PathLike, read=None, max_bytes: int = 65536):
    """A sysfs-style reader ``(path) -> stripped text`` for a snapshot folder. A path that resolves
    out of ``root`` or is not a regular file (a link to /dev/zero, a FIFO, a socket) raises
    :class:`RefusedRead`: the fabric probe does not take it for an absent attribute, it stops, and
    its gates say ERROR naming the file. ``read`` (default: a
    ``max_bytes`` read) reads what passes the check. An absent attribute beside an
    ``<attr>.errno`` file (a capture's record that the live read failed: ``22`` for a netdev's
    ``speed`` while its link was down) raises OSError with that errno, as the kernel answered the
    capture; without one, FileNotFoundError."""
    base = os.path.realpath(root)
    prefix = base.rstrip(os.sep) + os.sep

    def small(path: str) -> str:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
        try:
            return os.read(fd, max_bytes).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)

    inner = read or small

    def _recorded_errno(marker: str) -> int | None:
        """The errno a capture recorded for an unreadable attribute (a small regular file inside the
        snapshot holding 1-3 digits, 1..4095), or None."""
        try:
            st = os.lstat(marker)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 8 or not os.path.realpath(marker).startswith(prefix):
                return None
            text = small(marker)
        except (OSError, ValueError):
            return None
        return kernel_int(text, 1, 4095)
    real_dirs: dict[str, str] = {}  # folder -> its real path (a GID table is 1,000 files in one folder)

    def confined(path: str) -> str:
        try:
            st = os.lstat(path)  # FileNotFoundError etc. reach the caller as the kernel's answer would
        except FileNotFoundError:
            code = _recorded_errno(path + ERRNO_SUFFIX)
            if code:
                raise OSError(code, os.strerror(code), path) from None
            raise
        head, tail = os.path.split(path)
        real_dir = real_dirs.get(head)
        if real_dir is None:
            real_dir = real_dirs[head] = os.path.realpath(head)
        real = os.path.join(real_dir, tail)
        if stat.S_ISLNK(st.st_mode):  # one syscall for a plain file; a link is resolved and checked
            real = os.path.realpath(real)
            st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise RefusedRead(f"{path}: is {_kind(st.st_mode)}, not a regular file")
        if not real.startswith(prefix):
            raise RefusedRead(f"{path}: a link out of the snapshot (to {real})")
        return inner(path)

    return confined
