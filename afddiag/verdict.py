"""Verdicts: what a gate says about the host, and the exit code they add up to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from afddiag.exitcodes import EXIT_ERROR, EXIT_FAIL, EXIT_OK, EXIT_USAGE, EXIT_WARN
from afddiag.model.found import Found

__all__ = ["ERROR", "EXIT_ERROR", "EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "EXIT_WARN", "FAIL", "PASS", "SKIP",
           "VERDICTS", "WARN", "Verdict", "exit_code"]  # the exit codes re-exported, with the verdicts they sum

PASS, WARN, FAIL, SKIP, ERROR = "PASS", "WARN", "FAIL", "SKIP", "ERROR"
VERDICTS = (PASS, WARN, FAIL, SKIP, ERROR)


@dataclass
class Verdict:
    """One gate's verdict for the host: ``summary`` names the subject first, ``remedy`` says what
    to do in prose, ``commands`` are the remedy's complete shell commands in the order to run them (the
    host's values quoted, :mod:`afddiag.shellcmd`; none where no safe command exists), ``facts`` holds
    what was seen per device, ``action`` is the remedy's type from the closed set in ``checks/gates.toml``
    ``[actions]`` (NONE, SET_ENV, FIX_LINK, RESET_GPU, ...); "" means the catalog's default for the gate
    (:func:`afddiag.diagnosis.fill_actions` fills it in). ``found``: what the gate worked out, typed, for the
    summary and ``preflight --export`` (:mod:`afddiag.model.found`; not in the JSON report)."""

    id: str
    verdict: str
    summary: str
    remedy: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    action: str = ""
    commands: list[str] = field(default_factory=list)
    found: Found | None = field(default=None, compare=False, metadata={"json": False})


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
