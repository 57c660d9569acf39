"""What ``afddiag fleet`` and ``afddiag merge`` share after collection: per-host reports read and
checked (:func:`parse_report`, :func:`load_reports`), the fleet gates run over them and the fleet
report built (:func:`judge`). The fleet table that renders it is :mod:`afddiag.fleet.table`."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from afddiag import __version__
from afddiag.diagnosis import entries
from afddiag.envvars import redact_report
from afddiag.gates.fleet import HostResult, run_fleet_gates
from afddiag.reader import DepthError, InputError, parse_json, read_bytes
from afddiag.schema.validate import report_problem
from afddiag.verdict import ERROR, EXIT_ERROR, EXIT_FAIL, EXIT_OK, EXIT_WARN, FAIL, VERDICTS, WARN

FLEET_SCHEMA = "afddiag-fleet/1"  # kept in "schema" for readers of the first fleet reports
FLEET_SCHEMA_VERSION = 1  # afddiag/schema/fleet.schema.json


# ---------------------------------------------------------------- report parsing

def parse_report(text: str, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """One host's stdout → ``(report, None)``, or ``(None, why)`` when it is not an afddiag report
    (not JSON, not an object, no ``schema_version``/``gates``)."""
    s = text.strip()
    if not s:
        return None, f"{where}: empty output"
    try:
        obj = parse_json(s, where)
    except InputError as e:
        return None, f"{e} (starts {s[:60]!r})"
    why = _not_a_report(obj)
    if why:
        return None, f"{where}: {why}"
    return redact_report(obj), None


def _not_a_report(obj: Any) -> str | None:
    """Why ``obj`` cannot be judged as one host's report (one line naming its first problem), else None:
    not an object, a fleet report, or a report that breaks ``report.schema.json`` (types, required
    fields, gate ids) or holds NaN (:func:`afddiag.schema.validate.report_problem`)."""
    if not isinstance(obj, dict):
        return f"JSON {type(obj).__name__}, not an afddiag report object"
    if obj.get("kind") == "fleet" or obj.get("schema") == FLEET_SCHEMA:
        return "a fleet report (afddiag fleet|merge --json), not one host's report: give the per-host reports"
    if not isinstance(obj.get("gates"), list) or "schema_version" not in obj:
        return "JSON object without schema_version/gates: not an afddiag report"
    why = report_problem(obj)
    return f"not a valid afddiag report: {why}" if why else None


MAX_MERGE_FILE_BYTES = 256 << 20  # one merge input (1,000 reports of ~100 KiB in one JSON array)


def load_reports(paths: list[str], notes: list[str] | None = None) -> list[HostResult]:
    """Per-host report files → one :class:`HostResult` per report. A file holds one report, a JSON
    array of reports, or one report per line (JSON lines). A file that does not parse is an ERROR
    row named after the file. A report identical to one already read (the same file named twice, a
    copy: same host, same ``generated_at``, same content) is the same run, not a second host: it is
    skipped and ``notes`` gets a line naming both places. Another run of a host already seen (other
    content) gets ``#2``, ``#3`` appended to its name. Files are read
    through :mod:`afddiag.reader`: a device, FIFO, a file over :data:`MAX_MERGE_FILE_BYTES` or JSON
    nested deeper than its cap raises :class:`afddiag.reader.InputError` (the CLI's usage error)."""
    import hashlib
    import json

    out: list[HostResult] = []
    names: dict[str, int] = {}
    seen: dict[str, str] = {}  # digest of a report's canonical JSON -> where it was first read

    def add(rep: dict[str, Any] | None, path: str, err: str | None = None, host: Any = None) -> None:
        rep = redact_report(rep) if rep else rep  # a report from elsewhere may hold a credential
        name = str(rep.get("host") or Path(path).stem) if rep else (
            host if isinstance(host, str) and host else Path(path).name)
        if rep:
            digest = hashlib.sha256(json.dumps(rep, sort_keys=True, default=str).encode()).hexdigest()
            if digest in seen:
                if notes is not None:
                    first = "named twice" if seen[digest] == path else f"the same report as {seen[digest]}"
                    when = rep.get("generated_at") or "at an unknown time"
                    notes.append(f"{path}: {first} ({name}, generated {when}): a duplicate input, skipped")
                return
            seen[digest] = path
        n = names.get(name, 0) + 1
        names[name] = n
        out.append(HostResult(name=name if n == 1 else f"{name}#{n}", target=path, report=rep, error=err))

    for path in paths:
        try:
            text = read_bytes(path, max_bytes=MAX_MERGE_FILE_BYTES).decode("utf-8", "replace")
        except FileNotFoundError as e:
            add(None, path, f"{path}: {e.strerror}")
            continue
        try:
            obj = parse_json(text, path)
        except DepthError:
            raise
        except InputError:
            lines = [ln for ln in text.splitlines() if ln.strip()]
            if len(lines) > 1:
                for i, ln in enumerate(lines, 1):
                    rep, why = parse_report(ln, f"{path}:{i}")
                    add(rep, f"{path}:{i}", why)  # (an invalid line's host is not known here: named by place)
                continue
            add(None, path, parse_report(text, path)[1])
            continue
        for rep in obj if isinstance(obj, list) else [obj]:
            why = _not_a_report(rep)  # checked before judging: a bad report is an ERROR row, the others go on
            add(None if why else rep, path, f"{path}: {why}" if why else None,
                rep.get("host") if isinstance(rep, dict) else None)
    return out


# ---------------------------------------------------------------- judging and rendering

def _host_row(h: HostResult) -> dict[str, Any]:
    """One host's row. Its exit code and counts are worked out from its gates' verdicts (as
    :func:`afddiag.verdict.exit_code` does), never taken from the report: a report whose
    ``exit_code`` says 0 beside a FAIL gate exits 2 here (``reported_exit_code`` keeps what it said)."""
    rep = h.report or {}
    gates = [g for g in rep.get("gates") or [] if isinstance(g, dict)]
    verdicts = [g.get("verdict") for g in gates]
    failing = [str(g.get("id")) for g in gates if g.get("verdict") in (FAIL, ERROR)]
    warned = [str(g.get("id")) for g in gates if g.get("verdict") == WARN]
    counts = {v: verdicts.count(v) for v in VERDICTS}
    code = (EXIT_FAIL if FAIL in verdicts else EXIT_ERROR if ERROR in verdicts else EXIT_WARN if WARN in verdicts
            else EXIT_OK)
    return {"name": h.name, "role": h.host_role if h.ok else h.role, "target": h.target,
            "fabric_ip": h.fip if h.ok else h.fabric_ip, "status": "ok" if h.ok else "ERROR", "error": h.error,
            "exit_code": code if h.ok else EXIT_ERROR, "reported_exit_code": rep.get("exit_code") if h.ok else None,
            "counts": counts if h.ok else None, "failing": failing, "warning": warned, "elapsed_s": h.elapsed_s,
            "afddiag_version": rep.get("afddiag_version")}


def judge(hosts: list[HostResult], expect: dict[str, Any] | None = None, source: str = "merge",
          keep_reports: bool = False) -> dict[str, Any]:
    """Run the fleet gates over ``hosts`` and build the fleet report (``schema_version`` 1,
    ``afddiag/schema/fleet.schema.json``; ``schema`` "afddiag-fleet/1" is kept for older readers).

    Exit code: 2 if any host's gates FAIL or a fleet gate FAILs; else 3 if a host has no report (or an
    invalid one), a host's gate or a fleet gate ERRORs; else 1 on any WARN; else 0. Hosts' codes come
    from their gates (:func:`_host_row`), never from the reports' own ``exit_code``. ``keep_reports``
    embeds each per-host report under ``reports`` (for ``fleet --json``)."""
    verdicts = run_fleet_gates(hosts, expect or {})
    rows = [_host_row(h) for h in hosts]
    seen = {v.verdict for v in verdicts}
    codes = {r["exit_code"] for r in rows}
    if FAIL in seen or EXIT_FAIL in codes:
        code = EXIT_FAIL
    elif ERROR in seen or EXIT_ERROR in codes or any(r["status"] != "ok" for r in rows):
        code = EXIT_ERROR
    elif WARN in seen or EXIT_WARN in codes:
        code = EXIT_WARN
    else:
        code = EXIT_OK
    counts = {v: 0 for v in VERDICTS}
    for v in verdicts:
        counts[v.verdict] += 1
    out = {"schema_version": FLEET_SCHEMA_VERSION, "kind": "fleet", "schema": FLEET_SCHEMA,
           "afddiag_version": __version__, "source": source,
           "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "expect": dict(expect or {}), "hosts": rows, "gates": entries(verdicts),
           "counts": counts, "hosts_ok": sum(1 for r in rows if r["status"] == "ok"),
           "hosts_error": sum(1 for r in rows if r["status"] != "ok"), "exit_code": code}
    if keep_reports:
        out["reports"] = {h.name: h.report for h in hosts if h.ok}
    return out
