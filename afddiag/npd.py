"""``afddiag npd``: a node-problem-detector (NPD) custom plugin that answers from the last full report.

NPD runs a custom plugin every ``invoke_interval`` (30 s), three at once, kills it after ``timeout``
(5 s) and keeps the first ``max_output_length`` (80) bytes of its stdout as the condition's message;
exit 0 is OK, 1 a problem, anything else unknown (``pkg/custompluginmonitor/plugin/plugin.go``). A
full afddiag run takes longer than that, so this mode never probes: a full run on its own cadence (the
systemd timer in ``deploy/systemd/``, the DaemonSet's loop in ``deploy/kubernetes/``) writes

    afddiag all --json --output <state dir>/last.json

(:func:`afddiag.report.emit` writes it atomically), and ``afddiag npd --area fabric|gpu|launch|all``
reads that file and answers for one area in one line:

- exit 2 (unknown) when the report is missing, unreadable, written by another user, a replay of a
  snapshot, older than ``--max-age`` (default :data:`DEFAULT_MAX_AGE_S`: three 5-minute cadences) or
  dated in the future, or holds no gate of the area; also when the area's only faults are ERROR (a
  probe that could not look: nothing was judged);
- exit 1 (problem) when a FAIL of the report's diagnosis (``--strict``: a WARN too) is the area's, or
  is the root cause that explains one of the area's gates: the message is that root,
  ``<gate>: <summary>`` (``(+N)`` when N more faults are the area's); with ``--exit-for drain`` only a
  fault whose typed action needs the node drained counts (an NHC check's rule);
- exit 0 otherwise: ``OK: <n> pass, <m> skip of <k> <area> gates`` (and the first WARN's gate, if any).

Areas are gate-id prefixes: ``fabric.*``; ``gpu.*`` and ``host.*`` (CPU clock and PCIe links bound the
node's compute: the message names which); ``launch.*``; ``all`` is every gate. The message is one
line of at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes, host text escaped (:func:`afddiag.termsafe.line`:
no control, bidi or newline character survives). Start-up is the cost that matters here (three plugins
every 30 s): ``afddiag npd`` is answered by :mod:`afddiag.entry` without loading click, and this module
loads only the bounded reader, the escape path and ``argparse``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from afddiag.atomic import written_by_others
from afddiag.baseline import state_dir
from afddiag.reader import InputError, load_json
from afddiag.termsafe import bounded_line

OK, PROBLEM, UNKNOWN = 0, 1, 2
MAX_MESSAGE_BYTES = 80  # NPD's default max_output_length: it cuts stdout at this many bytes
DEFAULT_MAX_AGE_S = 900.0  # three of the full run's 5-minute cadences
FUTURE_SLACK_S = 300.0  # a report dated further ahead than this: a clock is wrong, not a fresh report
READ_TIMEOUT_S = 2.0  # well inside NPD's 5 s: a hung state mount answers unknown, not NPD's timeout
MAX_REPORT_BYTES = 32 << 20
AREAS: dict[str, tuple[str, ...]] = {"fabric": ("fabric.",), "gpu": ("gpu.", "host."), "launch": ("launch.",),
                                     "all": ("",)}
REPORT_NAME = "last.json"


@dataclass(frozen=True)
class Condition:
    """One plugin answer: ``code`` (0 OK, 1 problem, 2 unknown, NPD's plugin protocol) and ``message``
    (one line, at most :data:`MAX_MESSAGE_BYTES` bytes)."""

    code: int
    message: str


def default_report() -> Path:
    """Where the full run writes and this mode reads: ``<state dir>/last.json``
    (:func:`afddiag.baseline.state_dir`: ``$AFDDIAG_STATE_DIR``, else the user's state folder)."""
    return state_dir() / REPORT_NAME


def fit(text: str, keep: str = "") -> str:
    """``text`` as one escaped line of at most :data:`MAX_MESSAGE_BYTES` bytes, ``keep`` whole at its end."""
    return bounded_line(text, MAX_MESSAGE_BYTES, keep)


def _age(seconds: float) -> str:
    s = int(abs(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def _unknown(why: str) -> Condition:
    return Condition(UNKNOWN, fit(f"unknown: {why}"))


def _in_area(gate: object, prefixes: tuple[str, ...]) -> bool:
    return isinstance(gate, str) and gate.startswith(prefixes)


def _freshness(report: Mapping[str, Any], now: float, max_age_s: float) -> Condition | None:
    """Unknown when the report is not this node's live run or not within ``max_age_s`` of ``now``."""
    if report.get("source") != "live":
        return _unknown(f"last report is a replay ({report.get('source')!s:.30}), not this node's run")
    stamp = report.get("generated_at")
    try:
        when = _dt.datetime.fromisoformat(str(stamp))
        if when.tzinfo is None:
            raise ValueError("no time zone")
        age = now - when.timestamp()
    except (ValueError, TypeError, OverflowError):
        return _unknown(f"last report's generated_at {stamp!s:.30} is no ISO 8601 time")
    if age > max_age_s:
        return _unknown(f"last report {_age(age)} old (limit {_age(max_age_s)}): is the full run going?")
    if age < -FUTURE_SLACK_S:
        return _unknown(f"last report dated {_age(age)} ahead of this clock")
    return None


def _faults(report: Mapping[str, Any], prefixes: tuple[str, ...], verdicts: tuple[str, ...],
            drain_only: bool) -> list[Mapping[str, Any]]:
    """The diagnosis entries of ``verdicts`` that are the area's or explain one of its gates, in the
    diagnosis's order (the order to fix them)."""
    out = []
    for d in report.get("diagnosis") or []:
        if not isinstance(d, Mapping) or d.get("verdict") not in verdicts:
            continue
        if drain_only and d.get("drain") is not True:
            continue
        explains = d.get("explains")
        explains = explains if isinstance(explains, list) else []
        if _in_area(d.get("gate"), prefixes) or any(_in_area(g, prefixes) for g in explains):
            out.append(d)
    return out


def _named(d: Mapping[str, Any], more: int, lead: str = "") -> str:
    return fit(f"{lead}{d.get('gate')}: {d.get('summary')}", keep=f" (+{more})" if more else "")


def judge(report: Any, area: str, now: float | None = None, max_age_s: float = DEFAULT_MAX_AGE_S,
          strict: bool = False, exit_for: str = "any") -> Condition:
    """A report (the dict ``afddiag all --json`` writes) → the :class:`Condition` of ``area`` (a key of
    :data:`AREAS`) at ``now`` (Unix time; default the clock). Pure but for the clock."""
    prefixes = AREAS[area]
    if not isinstance(report, Mapping) or not isinstance(report.get("gates"), list):
        return _unknown("last report has no gates list (not an afddiag report)")
    stale = _freshness(report, time.time() if now is None else now, max_age_s)
    if stale:
        return stale
    gates = [g for g in report["gates"] if isinstance(g, Mapping) and _in_area(g.get("id"), prefixes)]
    if not gates:
        return _unknown(f"last report has no {area} gate (run afddiag all, not a narrower command)")
    drain_only = exit_for == "drain"
    problems = _faults(report, prefixes, ("FAIL", "WARN") if strict else ("FAIL",), drain_only)
    if problems:
        return Condition(PROBLEM, _named(problems[0], len(problems) - 1))
    if not drain_only:
        errors = _faults(report, prefixes, ("ERROR",), False)
        if errors:
            return Condition(UNKNOWN, _named(errors[0], len(errors) - 1, "ERROR "))
    passed, skipped = (sum(1 for g in gates if g.get("verdict") == v) for v in ("PASS", "SKIP"))
    warned = next((g for g in gates if g.get("verdict") == "WARN"), None)
    note = f"; WARN {warned.get('id')}" if warned else ""
    return Condition(OK, fit(f"OK: {passed} pass, {skipped} skip of {len(gates)} {area} gates{note}"))


def read(path: str | os.PathLike) -> Any:
    """The report at ``path`` → the parsed JSON, or a :class:`Condition` (unknown) saying why not:
    absent, written by another user (or in a folder others can write), unreadable, not JSON."""
    p = os.fspath(path)
    unsafe = written_by_others(p, sticky_ok=False)
    if unsafe:
        return _unknown(f"report not read, {unsafe}: {p}")
    try:
        return load_json(p, max_bytes=MAX_REPORT_BYTES, timeout_s=READ_TIMEOUT_S)
    except FileNotFoundError:
        return _unknown(f"no report yet ({p})")
    except InputError as e:  # its text starts with the path: the reason first, so the 80 bytes keep it
        why = str(e)
        return _unknown(f"{why[len(p) + 2:] if why.startswith(p + ': ') else why}: {p}")
    except OSError as e:
        return _unknown(f"{e.strerror or e}: {p}")


def answer(area: str, report_path: str | os.PathLike | None = None, max_age_s: float = DEFAULT_MAX_AGE_S,
           strict: bool = False, exit_for: str = "any", now: float | None = None) -> Condition:
    """Read the last report (default :func:`default_report`) and judge ``area`` → :class:`Condition`."""
    got = read(report_path or default_report())
    if isinstance(got, Condition):
        return got
    return judge(got, area, now, max_age_s, strict, exit_for)


def _positive(text: str) -> float:
    v = float(text)
    if not 0 < v < 1e9:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return v


def parser() -> argparse.ArgumentParser:
    """The options of ``afddiag npd`` (argparse: no click on this path)."""
    p = argparse.ArgumentParser(
        prog="afddiag npd", description="Answer a node-problem-detector custom plugin from the last full report "
        "(never probes): exit 0 OK, 1 problem, 2 unknown; one line of at most 80 bytes on stdout.")
    p.add_argument("--area", required=True, choices=sorted(AREAS), help="fabric, gpu (with host), launch, or all.")
    p.add_argument("--report", help="The full run's JSON report (default: <state dir>/last.json, written by "
                   "`afddiag all --json --output <state dir>/last.json`).")
    p.add_argument("--max-age", type=_positive, default=DEFAULT_MAX_AGE_S,
                   help=f"Seconds a report stays fresh (default {DEFAULT_MAX_AGE_S:g}); older is unknown (exit 2).")
    p.add_argument("--strict", action="store_true", help="A WARN is a problem too.")
    p.add_argument("--exit-for", choices=("any", "drain"), default="any",
                   help="drain: a problem only when a fault's action needs the node drained (ERROR never is).")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, answer, print the message → the exit code (a usage error is 2, unknown, as NPD reads it)."""
    try:
        ns = parser().parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:  # --help (0) or a usage error (2): argparse has printed it
        return e.code if isinstance(e.code, int) else UNKNOWN
    c = answer(ns.area, ns.report, ns.max_age, ns.strict, ns.exit_for)
    try:
        sys.stdout.write(c.message + "\n")
        sys.stdout.flush()
    except OSError:
        return UNKNOWN
    return c.code
