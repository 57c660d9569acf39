"""Atomic file writes: every file afddiag writes (reports, bundles, baselines, zipapps) appears
whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, binary: bool = False, mode: int = 0o644) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on a clean exit fsync it, chmod it to ``mode`` and
    rename it over ``path``; on an error remove it and re-raise. Raises OSError when the folder
    cannot be written."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent) if str(p.parent) else ".")
    try:
        with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
