"""Verdicts: what a gate says about the host, and the exit code they add up to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PASS, WARN, FAIL, SKIP, ERROR = "PASS", "WARN", "FAIL", "SKIP", "ERROR"
VERDICTS = (PASS, WARN, FAIL, SKIP, ERROR)

EXIT_OK, EXIT_WARN, EXIT_FAIL, EXIT_ERROR, EXIT_USAGE = 0, 1, 2, 3, 64


@dataclass
class Verdict:
    """One gate's verdict for the host: ``summary`` names the subject first, ``remedy`` says what
    to do, ``facts`` holds what was seen per device."""

    id: str
    verdict: str
    summary: str
    remedy: str = ""
    facts: dict[str, Any] = field(default_factory=dict)


def exit_code(verdicts: list[Verdict]) -> int:
    """2 if any FAIL, else 3 if any ERROR, else 1 if any WARN, else 0."""
    seen = {v.verdict for v in verdicts}
    if FAIL in seen:
        return EXIT_FAIL
    if ERROR in seen:
        return EXIT_ERROR
    if WARN in seen:
        return EXIT_WARN
    return EXIT_OK
