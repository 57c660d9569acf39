"""Progress on stderr for the steps that can pass a second (the load probe per GPU, the QP walk per
device, the pair test's phases): a rich progress bar while a person watches, nothing otherwise.

stdout holds only the report. Progress shows only when stderr is a terminal (not in a pipe, a
file, slurmd's log or a CI run), and never with ``AFDDIAG_NO_PROGRESS`` set or after
:func:`disable`. A leaf module: probes call :func:`steps`, which costs nothing when progress is off
(rich is imported only when a bar is drawn). One live display per process; every bar is removed
when its steps end (transient), and :func:`stop` ends the display before the report is written, even
if a timed-out probe thread never finished its steps.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from afddiag.termsafe import line

_lock = threading.Lock()
_state: dict[str, Any] = {"progress": None, "users": 0, "off": False}


def enabled(stream: TextIO | None = None) -> bool:
    """True when progress may be drawn on ``stream`` (default stderr): a terminal, not disabled."""
    if _state["off"] or os.environ.get("AFDDIAG_NO_PROGRESS"):
        return False
    s = stream if stream is not None else sys.stderr
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):
        return False


def disable() -> None:
    """No progress for the rest of this process (``--quiet``, JSON consumers that share the terminal)."""
    _state["off"] = True
    stop()


class Steps:
    """One bar: ``total`` steps of ``what``; :meth:`step` names the item now running."""

    def __init__(self, progress: Any, what: str, total: int) -> None:
        self._p = progress
        self._what = what
        self._task = progress.add_task(what, total=total) if progress is not None else None
        self._started = False

    def step(self, label: str) -> None:
        """The next item begins (the previous one, if any, is counted done)."""
        if self._task is None:
            return
        if self._started:
            self._p.advance(self._task)
        self._started = True

        self._p.update(self._task, description=line(f"{self._what}: {label}"))

    def done(self) -> None:
        if self._task is None:
            return
        if self._started:
            self._p.advance(self._task)
        self._p.remove_task(self._task)
        self._task = None


class _Off(Steps):
    def __init__(self) -> None:  # noqa: D107 - nothing to draw
        self._task = None


@contextlib.contextmanager
def steps(what: str, total: int) -> Iterator[Steps]:
    """A bar of ``total`` steps on stderr while the block runs (``with steps("QP walk", 4) as s:
    s.step("mlx5_0")``); a do-nothing object when progress is off. Never raises for drawing."""
    if total < 1 or not enabled():
        yield _Off()
        return
    with _lock:
        if _state["progress"] is None:
            try:
                from rich.console import Console
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )

                bar = Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(), console=Console(file=sys.stderr),
                               transient=True)
                bar.start()
                _state["progress"] = bar
            except Exception:  # noqa: BLE001 - no bar rather than no run
                _state["progress"] = None
        progress = _state["progress"]
        _state["users"] += 1
    s = Steps(progress, what, total) if progress is not None else _Off()
    try:
        yield s
    finally:
        try:
            s.done()
        except Exception:  # noqa: BLE001
            pass
        with _lock:
            _state["users"] -= 1
            if _state["users"] <= 0:
                _stop_locked()


def _stop_locked() -> None:
    p, _state["progress"], _state["users"] = _state["progress"], None, 0
    if p is not None:
        try:
            p.stop()
        except Exception:  # noqa: BLE001
            pass


def stop() -> None:
    """End the live display now (before the report is written), whatever steps are still open."""
    with _lock:
        _stop_locked()
