"""What ``afddiag fleet`` and ``afddiag merge`` share after collection: per-host reports read and
checked (:func:`parse_report`, :func:`load_reports`), the fleet gates run over them and the fleet
report built (:func:`judge`). The fleet table that renders it is :mod:`afddiag.fleet.table`."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from afddiag import __version__, summary
from afddiag.diagnosis import entries
from afddiag.envvars import redact_report, redact_text
from afddiag.gates.fleet import HostResult, run_fleet_gates
from afddiag.reader import InputError, check_depth, parse_json, read_each
from afddiag.schema.validate import report_check, report_problem
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


def _not_a_report(obj: Any, check_nan: bool = True) -> str | None:
    """Why ``obj`` cannot be judged as one host's report (one line naming its first problem), else None:
    not an object, a fleet report, or a report that breaks ``report.schema.json`` (types, required
    fields, gate ids) or holds NaN (:func:`afddiag.schema.validate.report_problem`; with ``check_nan``
    False the schema alone: :func:`load_reports` finds NaN in the encoding it digests)."""
    if not isinstance(obj, dict):
        return f"JSON {type(obj).__name__}, not an afddiag report object"
    if obj.get("kind") == "fleet" or obj.get("schema") == FLEET_SCHEMA:
        return "a fleet report (afddiag fleet|merge --json), not one host's report: give the per-host reports"
    if not isinstance(obj.get("gates"), list) or "schema_version" not in obj:
        return "JSON object without schema_version/gates: not an afddiag report"
    why = report_problem(obj) if check_nan else report_check()(obj, "report")
    return f"not a valid afddiag report: {why}" if why else None


MAX_MERGE_FILE_BYTES = 256 << 20  # one merge input (10,000 reports of ~25 KiB as JSON lines)
_WS = " \t\r\n"


def brief_of(rep: dict[str, Any]) -> dict[str, Any]:
    """What a host's row takes from its report (:func:`_host_row`): ``{"gates": [[id, verdict], ...],
    "exit_code", "afddiag_version"}`` (the report's own exit code is kept only to be shown beside the
    one worked out from its gates)."""
    gates = [[str(g.get("id")), g.get("verdict")] for g in rep.get("gates") or [] if isinstance(g, dict)]
    return {"gates": gates, "exit_code": rep.get("exit_code"), "afddiag_version": rep.get("afddiag_version")}


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in _WS:
        pos += 1
    return pos


def _not_json(where: str, text: str, pos: int, e: Exception) -> str:
    why = "JSON nested too deep" if isinstance(e, RecursionError) else f"not JSON ({e})"
    return f"{where}: {why} (starts {text[pos:pos + 60]!r})"


def _array_values(text: str, path: str) -> Iterator[tuple[str, Any, str | None]]:
    """The elements of the JSON array ``text`` one at a time (``raw_decode``: never the whole list at
    once), each as ``(path, value, None)``; a syntax error ends the file with ``(path, None, why)``."""
    dec = json.JSONDecoder()
    pos = _skip_ws(text, 1)
    if text.startswith("]", pos):
        return
    while True:
        try:
            obj, end = dec.raw_decode(text, pos)
        except (ValueError, RecursionError) as e:
            yield path, None, _not_json(path, text, pos, e)
            return
        yield path, obj, None
        pos = _skip_ws(text, end)
        if text.startswith(",", pos):
            pos = _skip_ws(text, pos + 1)
            continue
        if text.startswith("]", pos) and _skip_ws(text, pos + 1) == len(text):
            return
        yield path, None, f"{path}: not JSON (expected ',' or ']' at char {pos}) (starts {text[pos:pos + 60]!r})"
        return


def _line_values(text: str, path: str) -> Iterator[tuple[str, Any, str | None]]:
    """One report, or JSON lines: each value as ``(where, value, None)`` or ``(where, None, why)``
    for a line that is not JSON (the reading goes on at the next line). ``where`` is ``path`` when
    the file holds one value, else ``path:i`` (the i-th value or unreadable line)."""
    dec = json.JSONDecoder()
    pos, n, i = _skip_ws(text, 0), len(text), 0
    first: tuple[Any, str | None] | None = None
    while pos < n:
        i += 1
        try:
            obj, end = dec.raw_decode(text, pos)
            why = None
        except (ValueError, RecursionError) as e:
            obj, why = None, e
            end = text.find("\n", pos)
            end = n if end < 0 else end
        item = (obj, None if why is None else _not_json(f"{path}:{i}", text, pos, why))
        nxt = _skip_ws(text, end)
        if i == 1 and nxt >= n:  # the file's only value: named after the file
            yield path, obj, None if why is None else _not_json(path, text, pos, why)
            return
        if i == 1:
            first = item
        else:
            if first is not None:
                yield f"{path}:1", *first
                first = None
            yield f"{path}:{i}", *item
        pos = nxt


def _file_values(data: bytes, path: str) -> Iterator[tuple[str, Any, str | None]]:
    """Each value of one merge input (one report, a JSON array, JSON lines), decoded one at a time.
    The nesting depth of the whole file is bounded first (:func:`afddiag.reader.check_depth`: a byte
    scan, no regex; a file deeper than the cap raises :class:`afddiag.reader.DepthError`)."""
    check_depth(data, path)
    text = data.decode("utf-8", "replace")
    del data
    start = _skip_ws(text, 0)
    if start >= len(text):
        yield path, None, f"{path}: empty output"
    elif text.startswith("[", start):
        yield from _array_values(text[start:] if start else text, path)
    else:
        yield from _line_values(text, path)


def _reduce(rep: dict[str, Any], keep: bool) -> tuple[dict[str, Any] | None, dict[str, Any], Any]:
    """A checked report → ``(the report redacted if keep else None, brief, summary)``: the summary the
    fleet gates read (:func:`afddiag.summary.of`) and the row's brief (:func:`brief_of`), both
    redacted; the whole report is redacted only when it is kept (the costly part of a merge)."""
    summ = summary.of(rep)  # redacted there
    brief = brief_of(rep)
    brief.update(redact_report({k: brief[k] for k in ("exit_code", "afddiag_version")}))  # ids: schema-checked
    return (redact_report(rep) if keep else None), brief, summ


def load_reports(paths: list[str], notes: list[str] | None = None, keep_reports: bool = True) -> list[HostResult]:
    """Per-host report files → one :class:`HostResult` per report. A file holds one report, a JSON
    array of reports, or one report per line (JSON lines), decoded one report at a time. Each report
    is checked (:func:`_not_a_report`: the schema, NaN) before anything reads it: a bad one is an
    ERROR row named after it (its host, else its place) and the others go on; a file that does not
    parse is an ERROR row named after the file (a line of JSON lines: ``file:i``). A report identical
    to one already read (the same file named twice, a copy: same host, same ``generated_at``, same
    content) is the same run, not a second host: it is skipped and ``notes`` gets a line naming both
    places. Another run of a host already seen (other content) gets ``#2``, ``#3`` appended to its
    name. Files are read through :mod:`afddiag.reader` (:func:`~afddiag.reader.read_each`): a device,
    FIFO, a file over :data:`MAX_MERGE_FILE_BYTES` or JSON nested deeper than its cap raises
    :class:`afddiag.reader.InputError` (the CLI's usage error).

    With ``keep_reports`` False each report is reduced as soon as it is checked to its row's brief
    and its per-host summary (:func:`_reduce`; ``HostResult.report`` None, ``brief`` set), so the
    memory a merge holds grows with the summaries, not with the reports."""
    out: list[HostResult] = []
    names: dict[str, int] = {}
    seen: dict[str, str] = {}  # digest of a report's canonical JSON -> where it was first read

    def add(where: str, rep: Any, err: str | None) -> None:
        if err is None:
            why = _not_a_report(rep, check_nan=False)
            err = f"{where}: {why}" if why else None
        digest = None
        if err is None:
            try:  # one encoding: the duplicate check's digest, and NaN or infinity refused (JSON has neither)
                digest = hashlib.sha256(json.dumps(rep, sort_keys=True, allow_nan=False).encode()).hexdigest()
            except ValueError:
                err = f"{where}: not a valid afddiag report: {report_problem(rep)}"
        if err is not None:
            host = rep.get("host") if isinstance(rep, dict) else None
            name = host if isinstance(host, str) and host else Path(where).name
            out.append(HostResult(name=name, target=where, error=err))
            return
        name = str(redact_text(str(rep.get("host") or Path(where).stem))[0])
        if digest in seen:
            if notes is not None:
                first = "named twice" if seen[digest] == where else f"the same report as {seen[digest]}"
                when = redact_text(str(rep.get("generated_at") or "at an unknown time"))[0]
                notes.append(f"{where}: {first} ({name}, generated {when}): a duplicate input, skipped")
            return
        seen[str(digest)] = where
        n = names.get(name, 0) + 1
        names[name] = n
        kept, brief, summ = _reduce(rep, keep_reports)
        out.append(HostResult(name=name if n == 1 else f"{name}#{n}", target=where, report=kept, brief=brief,
                              _summary=summ))

    for path, data in read_each(list(paths), max_bytes=MAX_MERGE_FILE_BYTES):
        if isinstance(data, FileNotFoundError):
            out.append(HostResult(name=Path(path).name, target=path, error=f"{path}: {data.strerror}"))
            continue
        values = _file_values(data, path)
        del data  # the bytes go once decoded to text (_file_values): one file's bytes and text never outlive it
        for where, rep, err in values:
            add(where, rep, err)
    return out


# ---------------------------------------------------------------- judging and rendering

def _host_row(h: HostResult) -> dict[str, Any]:
    """One host's row. Its exit code and counts are worked out from its gates' verdicts (as
    :func:`afddiag.verdict.exit_code` does), never taken from the report: a report whose
    ``exit_code`` says 0 beside a FAIL gate exits 2 here (``reported_exit_code`` keeps what it said)."""
    rep = h.brief or brief_of(h.report or {})
    verdicts = [v for _, v in rep["gates"]]
    failing = [gid for gid, v in rep["gates"] if v in (FAIL, ERROR)]
    warned = [gid for gid, v in rep["gates"] if v == WARN]
    counts = {v: verdicts.count(v) for v in VERDICTS}
    code = (EXIT_FAIL if FAIL in verdicts else EXIT_ERROR if ERROR in verdicts else EXIT_WARN if WARN in verdicts
            else EXIT_OK)
    return {"name": h.name, "role": h.host_role if h.ok else h.role, "target": h.target,
            "fabric_ip": h.fip if h.ok else h.fabric_ip, "status": "ok" if h.ok else "ERROR", "error": h.error,
            "exit_code": code if h.ok else EXIT_ERROR, "reported_exit_code": rep.get("exit_code") if h.ok else None,
            "counts": counts if h.ok else None, "failing": failing, "warning": warned, "elapsed_s": h.elapsed_s,
            "afddiag_version": rep.get("afddiag_version"), "summary": h.summary if h.ok else None}


def write_fleet_json(fr: dict[str, Any], out: Any) -> None:
    """The fleet report as JSON on the text stream ``out``: indented, except that each host row
    (``hosts``), fleet gate (``gates``: their facts name every host) and embedded report
    (``reports``) is written compact on one line of its own (the C encoder: ``json.dump`` with an
    indent encodes in Python, and 10,000 rows took seconds)."""
    out.write("{\n")
    last = len(fr) - 1
    for i, (k, v) in enumerate(fr.items()):
        sep = ",\n" if i < last else "\n"
        if k in ("hosts", "gates") and isinstance(v, list) and v:
            rows = ",\n".join("    " + json.dumps(r, default=str) for r in v)
            out.write(f"  {json.dumps(k)}: [\n{rows}\n  ]{sep}")
        elif k == "reports" and isinstance(v, dict) and v:
            reps = ",\n".join(f"    {json.dumps(name)}: {json.dumps(r, default=str)}" for name, r in v.items())
            out.write(f"  {json.dumps(k)}: {{\n{reps}\n  }}{sep}")
        else:
            out.write(f"  {json.dumps(k)}: " + json.dumps(v, indent=2, default=str).replace("\n", "\n  ") + sep)
    out.write("}\n")


def judge(hosts: list[HostResult], expect: dict[str, Any] | None = None, source: str = "merge",
          keep_reports: bool = False) -> dict[str, Any]:
    """Run the fleet gates over ``hosts`` and build the fleet report (``schema_version`` 1,
    ``afddiag/schema/fleet.schema.json``; ``schema`` "afddiag-fleet/1" is kept for older readers).

    Exit code: 2 if any host's gates FAIL or a fleet gate FAILs; else 3 if a host has no report (or an
    invalid one), a host's gate or a fleet gate ERRORs; else 1 on any WARN; else 0. Hosts' codes come
    from their gates (:func:`_host_row`), never from the reports' own ``exit_code``. Each host's row
    carries its per-host summary (``summary``, what the fleet gates judged). ``keep_reports`` embeds
    each per-host report under ``reports`` (``fleet --json``, ``merge --json --full-reports``)."""
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
