"""ruff and mypy, as configured in pyproject.toml, find nothing.

Both run from this interpreter's environment (``python -m ruff`` / ``python -m mypy``; the ``test`` extra
installs them, so ``scripts/setup.sh`` does). mypy keeps its cache in the repository's ``.mypy_cache``
(git ignores it), so a second run checks only what changed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from conftest import REPO


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed in {sys.prefix}: run ./scripts/setup.sh (the test extra installs it)")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing():
    p = _run("ruff", "check", "--no-fix", "--output-format", "concise", ".")
    assert p.returncode == 0, p.stdout + p.stderr


def test_mypy_finds_nothing():
    p = _run("mypy", "--cache-dir", str(REPO / ".mypy_cache"))  # files and flags: [tool.mypy]
    assert p.returncode == 0, p.stdout + p.stderr
