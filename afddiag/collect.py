"""Bounded execution of probes, and opening a snapshot (a folder, or a capture bundle extracted safely).

Each probe runs under a time bound (:func:`guarded`); a probe that fails or times out records why
and the run goes on (its gates then say SKIP or ERROR with the reason). The probes themselves are
in :mod:`afddiag.probes.registry`, the loop over them in :mod:`afddiag.runner`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from afddiag.bundle import BundleError, is_bundle, remove_tree, safe_extract
from afddiag.reader import RefusedRead

T = TypeVar("T")


class ProbeTimeout(Exception):
    """A bounded probe ran past its time bound (the message names the probe and what it was doing)."""


class Progress:
    """What a bounded probe is doing now: the probe sets ``doing``; a timeout message quotes it."""

    def __init__(self) -> None:
        self.doing = ""

    def tracking(self, read: Callable[[str], str]) -> Callable[[str], str]:
        """``read`` (a sysfs reader) that first records ``reading <path>`` as what is being done."""

        def wrapped(path: str) -> str:
            self.doing = f"reading {path}"
            return read(path)

        return wrapped


def bounded(fn: Callable[[], T], timeout_s: float, what: str, progress: Progress | None = None) -> T:
    """Run ``fn`` in a daemon thread; raise :class:`ProbeTimeout` naming ``what`` (and what
    ``progress`` says it was doing) after ``timeout_s`` seconds (the thread is abandoned, the run
    goes on). Re-raises ``fn``'s error."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, name=f"afddiag-{what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ProbeTimeout(f"{what} did not finish within {timeout_s:g} s"
                           + (f" (stuck {progress.doing})" if progress and progress.doing else ""))
    if "error" in box:
        raise box["error"]
    return box["value"]


def guarded(fn: Callable[[], T], timeout_s: float, what: str,
            progress: Progress | None = None) -> tuple[T | None, str | None]:
    """:func:`bounded`, never raising: ``(value, None)``, or ``(None, why)`` when ``fn`` timed out or
    raised; ``why`` names the probe, the time bound or the error, and what it was doing."""
    try:
        return bounded(fn, timeout_s, what, progress), None
    except ProbeTimeout as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a crashed probe becomes its gates' ERROR
        if isinstance(e, RefusedRead):  # a snapshot file that is a device, FIFO or a link out of it
            return None, f"{what} refused {e}"
        doing = f" while {progress.doing}" if progress and progress.doing else ""
        return None, f"{what} crashed{doing} ({type(e).__name__}: {e})"


class SnapshotError(ValueError):
    """A snapshot directory that cannot be used at all (message names the path and the fix)."""


@contextlib.contextmanager
def opened_snapshot(path: str, timeout_s: float | None = None):
    """Yield the snapshot folder for ``path``: the folder itself, or for a capture bundle
    (``.tar.gz``) the folder it was extracted to safely (:func:`afddiag.bundle.safe_extract`, within
    ``timeout_s`` seconds) under a temporary directory that is removed on exit, on an error and on
    SIGTERM (which then ends the run with exit 143; SIGINT ends it as KeyboardInterrupt), iteratively
    (:func:`afddiag.bundle.remove_tree`). Raises :class:`SnapshotError` when the bundle is missing,
    unreadable or refused (one line naming the bundle and the member)."""
    import tempfile

    if not is_bundle(path):
        yield str(path)
        return
    if not os.path.isfile(path):
        raise SnapshotError(f"snapshot {path}: no such file (give a bundle written by `afddiag capture`)")
    with _terminate_as_exit():
        tmp = tempfile.mkdtemp(prefix="afddiag-bundle-")
        try:
            try:
                root = safe_extract(path, tmp, timeout_s=timeout_s)
            except BundleError as e:
                raise SnapshotError(f"snapshot {path}: refused: {e}") from None
            yield str(root)
        finally:
            remove_tree(tmp)


@contextlib.contextmanager
def _terminate_as_exit():
    """While inside, SIGTERM raises SystemExit(143) in the main thread, so ``finally`` blocks (the
    bundle's temporary tree) run; the previous handler comes back on exit. Elsewhere: nothing."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):  # noqa: ARG001 - signal handler signature
        raise SystemExit(128 + signum)

    try:
        old = signal.signal(signal.SIGTERM, stop)
    except (ValueError, OSError):  # pragma: no cover - not settable here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def relabel(obj: Any, root: str, bundle: str) -> Any:
    """``obj`` (report JSON, lists, strings) with the extracted folder ``root`` named as ``bundle``."""
    if isinstance(obj, str):
        return obj.replace(root, bundle)
    if isinstance(obj, dict):
        return {k: relabel(v, root, bundle) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relabel(v, root, bundle) for v in obj]
    return obj
