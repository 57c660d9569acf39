"""Local run history: every fabric/gpu/all/preflight report in an SQLite store, and ``afddiag history``.

The store is ``<state dir>/history.sqlite3`` (:func:`afddiag.baseline.state_dir`:
``$AFDDIAG_STATE_DIR``, else ``$XDG_STATE_HOME/afddiag``, else ``~/.local/state/afddiag``;
``$AFDDIAG_HISTORY`` names the file itself). It runs in WAL mode with ``synchronous=NORMAL``: a
writer killed mid-transaction leaves the earlier runs intact (its own run is rolled back), and
concurrent runs wait for each other (``busy_timeout``, ``BEGIN IMMEDIATE``) instead of failing.
It is bounded: after each append the oldest runs are pruned past :data:`MAX_RUNS` runs or
:data:`MAX_BYTES` bytes of report text (``$AFDDIAG_HISTORY_MAX_RUNS``, ``$AFDDIAG_HISTORY_MAX_MB``).

A run whose history cannot be written still reports; the first failure in a process says so on
stderr, once. Every run is recorded with its host, command, role and source (``live`` or
``snapshot <path>``). ``afddiag history`` keeps them apart: by default it shows this node's live runs
only (a replayed bundle is another host's past, not this node's: ``--replays`` shows those, marked),
and per host it compares runs of one command and role (a ``preflight --role expert`` followed by a
generic ``all`` is no repair of the gates the role skips), and lists the gates whose verdict changed.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import math
import os
import sqlite3
import stat
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from afddiag.atomic import OutputTargetError, check_folder, private_folder, target_kind, trusted_uid
from afddiag.baseline import THROUGHPUT_NAMES, state_dir
from afddiag.envvars import redact_report
from afddiag.render import COLORS, console_for
from afddiag.termsafe import one_line

SCHEMA_VERSION = 1
MAX_RUNS = 5000
MAX_BYTES = 64 << 20
BUSY_TIMEOUT_S = 10.0
FIGURES = ("clock_sm_mhz", "power_mw", *THROUGHPUT_NAMES)
_warned = False

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,              -- Unix time the run was recorded
    generated_at TEXT,             -- the report's generated_at (ISO 8601, UTC)
    host TEXT NOT NULL,
    command TEXT NOT NULL,         -- fabric, gpu, all, preflight
    role TEXT,
    source TEXT,                   -- live, or snapshot <path>
    exit_code INTEGER,
    report TEXT NOT NULL           -- the JSON report (afddiag/schema/report.schema.json)
);
CREATE TABLE IF NOT EXISTS verdicts (
    run_id INTEGER NOT NULL,
    gate TEXT NOT NULL,
    verdict TEXT NOT NULL,
    PRIMARY KEY (run_id, gate)
);
CREATE INDEX IF NOT EXISTS runs_host ON runs (host, id);
"""


def default_path() -> Path:
    """The store: ``$AFDDIAG_HISTORY``, else ``<state dir>/history.sqlite3``."""
    return Path(os.environ["AFDDIAG_HISTORY"]) if os.environ.get("AFDDIAG_HISTORY") else state_dir() / "history.sqlite3"


class SettingError(ValueError):
    """A numeric environment setting that is not a finite positive number (one line naming it)."""


def env_number(env: str, default: float, low: float = 1.0, high: float = 1e12) -> float:
    """The number in the environment variable ``env`` (unset or empty: ``default``), finite and
    within ``low..high``. Raises :class:`SettingError` naming the variable for anything else
    (``inf``, ``nan``, ``1e400``, words)."""
    raw = os.environ.get(env, "").strip()
    if not raw:
        return default
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not math.isfinite(v) or not low <= v <= high:
        raise SettingError(f"{env}={raw[:20]!r} is not a number within {low:g}..{high:g}: "
                           "give a finite number or unset it")
    return v


def _limit(env: str, default: int, scale: int = 1) -> int:
    return max(1, int(env_number(env, default / scale) * scale))


def _open_store(p: Path, create: bool) -> None:
    """Check the store before SQLite opens it: its folder passes the state-folder rules (root's or
    yours, writable by no one else: SQLite puts its journal files beside it by name), and the store
    itself is opened without following a link (``O_NOFOLLOW``), created 0600, a regular file of
    root's or yours (an older store readable by others is made 0600). Raises OSError (one line)."""
    try:
        if create:
            private_folder(p.parent)
        else:
            check_folder(p.parent, sticky_ok=False)
    except FileNotFoundError:
        if create:
            raise
        raise FileNotFoundError(f"no history yet ({p})") from None
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK
    try:
        fd = os.open(p, flags | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        raise FileNotFoundError(f"no history yet ({p})") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OutputTargetError(errno.EPERM, "is a symbolic link: afddiag never opens its history through a "
                                    "link; remove it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OutputTargetError(errno.EPERM, f"is {target_kind(st)}, not a regular file: give a file path")
        if not trusted_uid(st.st_uid):
            raise OutputTargetError(errno.EPERM, f"is owned by uid {st.st_uid}, not by root or you: afddiag "
                                    "never uses another user's history; move it aside")
        if create and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)  # the reports in it hold host details: the owner's alone
    finally:
        os.close(fd)


def connect(path: str | os.PathLike | None = None, create: bool = True,
            busy_s: float | None = None) -> sqlite3.Connection:
    """Open the store (made with its folder when ``create``), in WAL mode with a busy timeout
    (``busy_s``, default :data:`BUSY_TIMEOUT_S`: how long a held lock is waited for), in autocommit
    mode (callers ``BEGIN IMMEDIATE`` themselves); the store is checked first (:func:`_open_store`).
    Raises sqlite3.Error or OSError (FileNotFoundError without ``create`` when there is none)."""
    busy = BUSY_TIMEOUT_S if busy_s is None else max(0.05, min(BUSY_TIMEOUT_S, busy_s))
    p = Path(path) if path else default_path()
    _open_store(p, create)
    con = sqlite3.connect(str(p), timeout=busy, isolation_level=None)
    try:
        con.execute(f"PRAGMA busy_timeout = {int(busy * 1000)}")
        if create:
            deadline = time.monotonic() + busy
            while True:  # switching to WAL needs a moment alone with the file
                try:
                    con.execute("PRAGMA journal_mode = WAL")
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) and "busy" not in str(e):
                        break  # no WAL on this filesystem (9p, some NFS): keep the rollback journal
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            con.execute("PRAGMA synchronous = NORMAL")
            con.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _SCHEMA.split(";"):
                    if stmt.strip():
                        con.execute(stmt)
                con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise
    except BaseException:
        con.close()
        raise
    return con


def insert_run(con: sqlite3.Connection, report: Mapping[str, Any], command: str) -> int:
    """Insert one run (the report and its per-gate verdicts) in the caller's transaction → run id.
    The stored report has every credential redacted (:func:`afddiag.envvars.redact_report`)."""
    report = redact_report(report)
    cur = con.execute(
        "INSERT INTO runs (ts, generated_at, host, command, role, source, exit_code, report) VALUES (?,?,?,?,?,?,?,?)",
        (time.time(), report.get("generated_at"), str(report.get("host") or ""), command,
         (report.get("inputs") or {}).get("role"), report.get("source"), report.get("exit_code"),
         json.dumps(report, separators=(",", ":"), default=str)))
    rid = cur.lastrowid
    assert rid is not None  # an INSERT sets it
    con.executemany("INSERT OR REPLACE INTO verdicts (run_id, gate, verdict) VALUES (?,?,?)",
                    [(rid, g["id"], g["verdict"]) for g in report.get("gates") or []])
    return rid


def prune(con: sqlite3.Connection, max_runs: int | None = None, max_bytes: int | None = None) -> int:
    """Delete the oldest runs past ``max_runs`` runs or ``max_bytes`` bytes of report text (in the
    caller's transaction) → how many were deleted. The newest run is always kept."""
    max_runs = max_runs or _limit("AFDDIAG_HISTORY_MAX_RUNS", MAX_RUNS)
    max_bytes = max_bytes or _limit("AFDDIAG_HISTORY_MAX_MB", MAX_BYTES, 1 << 20)
    rows = con.execute("SELECT id, length(report) FROM runs ORDER BY id DESC").fetchall()
    keep, total = 0, 0
    for _, size in rows:
        if keep >= max_runs or (keep >= 1 and total + size > max_bytes):
            break
        keep += 1
        total += size
    if keep >= len(rows):
        return 0
    cutoff = rows[keep - 1][0]
    con.execute("DELETE FROM verdicts WHERE run_id < ?", (cutoff,))
    con.execute("DELETE FROM runs WHERE id < ?", (cutoff,))
    return len(rows) - keep


def append(report: Mapping[str, Any], command: str, path: str | os.PathLike | None = None,
           busy_s: float | None = None) -> int:
    """Append one run to the store and prune it, in one transaction → the run id. ``busy_s``: how
    long a lock held by another run is waited for. Raises sqlite3.Error or OSError when the store
    cannot be written, :class:`SettingError` for a size limit that is no finite number."""
    _limit("AFDDIAG_HISTORY_MAX_RUNS", MAX_RUNS)  # a bad setting is said before the store is touched
    _limit("AFDDIAG_HISTORY_MAX_MB", MAX_BYTES, 1 << 20)
    con = connect(path, busy_s=busy_s)
    try:
        con.execute("BEGIN IMMEDIATE")
        try:
            rid = insert_run(con, report, command)
            prune(con)
            con.execute("COMMIT")
        except BaseException:
            try:  # a full disk can end the transaction itself: the original error is the one to say
                con.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        return rid
    finally:
        con.close()


def record_run(report: Mapping[str, Any], command: str, enabled: bool = True,
               busy_s: float | None = None) -> int | None:
    """:func:`append`, never raising: the run id, or None when disabled or the store could not be
    written (said on stderr the first time in this process). ``busy_s`` (the run's --timeout) bounds
    the wait for a lock another run holds."""
    global _warned
    if not enabled:
        return None
    try:
        return append(report, command, busy_s=busy_s)
    except (sqlite3.Error, OSError, SettingError) as e:
        if not _warned:
            _warned = True
            why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
            if (isinstance(e, sqlite3.OperationalError) and "full" in why) or getattr(e, "errno", None) == 28:
                why = "no space left on the device"
            elif isinstance(e, sqlite3.OperationalError) and "locked" in why:
                why = f"held by another run for over {busy_s if busy_s is not None else BUSY_TIMEOUT_S:g} s"
            print(f"afddiag: history not written ({default_path()}: {why}); the report is unaffected "
                  "(--no-history skips it)", file=sys.stderr)
        return None


def _figures(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Load-probe figures per GPU in a report's facts: ``{uuid or index: {name, clock_sm_mhz, ...}}``."""
    out: dict[str, dict[str, Any]] = {}
    facts = report.get("facts")
    gpu = facts.get("gpu") if isinstance(facts, dict) else None
    devices = gpu.get("devices") if isinstance(gpu, dict) else None
    for d in devices if isinstance(devices, list) else []:
        ul = d.get("under_load") if isinstance(d, dict) else None
        if not isinstance(ul, dict):
            continue
        figs = {k: ul.get(k) for k in FIGURES if isinstance(ul.get(k), (int, float))}
        if figs:
            out[str(d.get("uuid") or d.get("index"))] = {"name": d.get("name"), **figs}
    return out


def _context(command: str | None, role: str | None) -> str:
    """A run's command and role as the operator types them: ``preflight --role expert``."""
    return f"{command or '?'}" + (f" --role {role}" if role else "")


def summarize(path: str | os.PathLike | None = None, gate: str | None = None,
              host: str | None = None, replays: bool = False, command: str | None = None,
              role: str | None = None, changed_only: bool = False) -> dict[str, Any]:
    """Read the store → ``{"path", "replays", "changed_only", "hosts": {host: {"runs", "first", "last",
    "command", "role", "gates": {gate: [segment]}, "unchanged", "other", "drift"}}}``.

    Live runs only (``source`` "live"), or with ``replays`` only the snapshot replays (another host's
    data judged here: never mixed into a live timeline). Per host, the runs compared are those of one
    command and role: ``command``/``role`` when given, else those of the host's latest run; ``other``
    lists the host's other command/role pairs (``{"command", "role", "runs", "last"}``) and ``runs``,
    ``first``, ``last`` count the compared runs only. A segment is a stretch of those runs with one
    verdict: ``{"verdict", "since" (generated_at of its first run), "first_run", "last_run", "runs"}``;
    a new segment is when the verdict changed. With ``changed_only`` a gate with one segment is left
    out of ``gates`` and counted in ``unchanged``. ``drift`` compares the latest run with load figures
    to the last earlier run whose ``gpu.slow-state`` was PASS (same kind of run, any command): per GPU,
    ``{figure: {"now", "pass", "change_pct"}}``. ``gate`` filters gate ids (exact or a glob such as
    ``fabric.*``). Raises FileNotFoundError when there is no store, sqlite3.Error when it cannot be read."""
    con = connect(path, create=False)
    try:
        q = "SELECT id, generated_at, host, command, role, source FROM runs WHERE " + (
            "source IS NOT 'live'" if replays else "source = 'live'")
        args: tuple = ()
        if host:
            q += " AND host = ?"
            args = (host,)
        runs, damage = _rows(con, q + " ORDER BY id", args)
        if damage:
            runs = _salvage_runs(con, q, args, runs)
        vrows, vdamage = _rows(con, "SELECT run_id, gate, verdict FROM verdicts ORDER BY run_id")
        if vdamage:
            vrows = [v for r in runs for v in _rows(con, "SELECT run_id, gate, verdict FROM verdicts "
                                                         "WHERE run_id = ?", (r[0],))[0]]
        damage = damage or vdamage
        verdicts: dict[int, dict[str, str]] = {}
        for rid, g, v in vrows:
            verdicts.setdefault(rid, {})[str(g)] = str(v)
        by_host: dict[str, list[tuple]] = {}
        for r in runs:
            by_host.setdefault(r[2], []).append(r)
        hosts: dict[str, Any] = {}
        for h, rows in by_host.items():
            pick = [r for r in rows if (command is None or r[3] == command) and (role is None or r[4] == role)]
            if not pick:
                continue
            want_cmd, want_role = pick[-1][3], pick[-1][4]
            mine = [r for r in rows if r[3] == want_cmd and r[4] == want_role]
            others: dict[tuple, dict[str, Any]] = {}
            for r in rows:
                if (r[3], r[4]) != (want_cmd, want_role):
                    o = others.setdefault((r[3], r[4]), {"command": r[3], "role": r[4], "runs": 0, "last": r[1]})
                    o["runs"] += 1
                    o["last"] = r[1]
            hs = hosts[h] = {"runs": len(mine), "first": mine[0][1], "last": mine[-1][1], "command": want_cmd,
                             "role": want_role, "gates": {}, "unchanged": 0, "other": list(others.values()),
                             "drift": None}
            for rid, gen, *_ in mine:
                for g, v in sorted(verdicts.get(rid, {}).items()):
                    if gate and not (g == gate or fnmatch.fnmatchcase(g, gate)):
                        continue
                    segs = hs["gates"].setdefault(g, [])
                    if segs and segs[-1]["verdict"] == v:
                        segs[-1]["last_run"] = rid
                        segs[-1]["runs"] += 1
                    else:
                        segs.append({"verdict": v, "since": gen, "first_run": rid, "last_run": rid, "runs": 1})
            if changed_only:
                kept = {g: s for g, s in hs["gates"].items() if len(s) > 1}
                hs["unchanged"] = len(hs["gates"]) - len(kept)
                hs["gates"] = kept
            try:
                hs["drift"] = _drift(con, h, replays)
            except sqlite3.DatabaseError as e:
                damage = damage or str(e)
        where = str(Path(path) if path else default_path())
        return {"path": where, "replays": replays, "changed_only": changed_only, "hosts": hosts,
                "damaged": (f"history {where} is damaged ({damage}): showing the {len(runs)} run(s) that could be "
                            "read; move the file aside and afddiag starts a new one") if damage else None}
    finally:
        con.close()


SALVAGE_IDS = 50000  # a damaged store: at most this many run ids are looked up one range at a time


def _rows(con: sqlite3.Connection, sql: str, args: tuple = ()) -> tuple[list[tuple], str | None]:
    """The rows of ``sql`` read until the store's damage stops the read → (rows, SQLite's words for
    the damage or None)."""
    out: list[tuple] = []
    try:
        cur = con.execute(sql, args)
        while batch := cur.fetchmany(256):
            out.extend(batch)
    except sqlite3.DatabaseError as e:
        return out, str(e)
    return out, None


def _salvage_runs(con: sqlite3.Connection, q: str, args: tuple, got: list[tuple]) -> list[tuple]:
    """The runs of a damaged store past the damage: ``q`` (a runs query) re-read by id ranges of 64,
    a range that fails read id by id, up to the highest id SQLite still knows (at most
    :data:`SALVAGE_IDS` ids past the last good one)."""
    top = None
    for sql in ("SELECT max(id) FROM runs", "SELECT seq FROM sqlite_sequence WHERE name = 'runs'"):
        rows, _ = _rows(con, sql)
        if rows and isinstance(rows[0][0], int):
            top = rows[0][0]
            break
    start = (got[-1][0] + 1) if got else 1
    if top is None:
        return got
    out = list(got)
    for lo in range(start, min(top, start + SALVAGE_IDS) + 1, 64):
        rows, bad = _rows(con, q + " AND id BETWEEN ? AND ? ORDER BY id", args + (lo, lo + 63))
        if bad:
            rows = [r for i in range(lo, lo + 64) for r in _rows(con, q + " AND id = ?", args + (i,))[0]]
        out.extend(r for r in rows if not out or r[0] > out[-1][0])
    return out


def _report_json(text: Any) -> dict[str, Any]:
    """A stored report's JSON, or {} when the text is damaged."""
    try:
        rep = json.loads(text)
    except (TypeError, ValueError, RecursionError):
        return {}
    return rep if isinstance(rep, dict) else {}


def _drift(con: sqlite3.Connection, host: str, replays: bool = False) -> dict[str, Any] | None:
    kind = "r.source IS NOT 'live'" if replays else "r.source = 'live'"
    latest = None
    for rid, gen, rep in con.execute(
            "SELECT r.id, r.generated_at, r.report FROM runs r JOIN verdicts v ON v.run_id = r.id "
            f"WHERE r.host = ? AND {kind} AND v.gate = 'gpu.slow-state' ORDER BY r.id DESC", (host,)):
        figs = _figures(_report_json(rep))
        if figs:
            latest = (rid, gen, figs)
            break
    if latest is None:
        return None
    ref = None
    for rid, gen, rep in con.execute(
            "SELECT r.id, r.generated_at, r.report FROM runs r JOIN verdicts v ON v.run_id = r.id "
            f"WHERE r.host = ? AND {kind} AND v.gate = 'gpu.slow-state' AND v.verdict = 'PASS' AND r.id < ? "
            "ORDER BY r.id DESC",
            (host, latest[0])):
        figs = _figures(_report_json(rep))
        if figs:
            ref = (rid, gen, figs)
            break
    out: dict[str, Any] = {"run": latest[0], "at": latest[1], "pass_run": ref[0] if ref else None,
                           "pass_at": ref[1] if ref else None, "gpus": {}}
    if ref is None:
        return out
    for key, now in latest[2].items():
        then = ref[2].get(key)
        if not then:
            continue
        rows = {}
        for f in FIGURES:
            a, b = now.get(f), then.get(f)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                rows[f] = {"now": a, "pass": b, "change_pct": round((a - b) / b * 100, 1) if b else None}
        out["gpus"][key] = {"name": now.get("name"), "figures": rows}
    return out


def _head(summary: dict[str, Any]) -> str:
    kind = ("snapshot replays (other hosts' data judged here, kept apart from live runs)" if summary.get("replays")
            else "live runs")
    what = "gates whose verdict changed" if summary.get("changed_only") else "every gate"
    return f"history {summary['path']}: {kind}, {what}"


def _host_line(h: str, hs: dict[str, Any]) -> str:
    return (f"host {h}: {hs['runs']} run(s) of `{_context(hs.get('command'), hs.get('role'))}`, "
            f"{hs['first']} .. {hs['last']}")


def _notes(hs: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """The lines under a host's gates: unchanged gates, the other command/role pairs not compared."""
    out = []
    if summary.get("changed_only"):
        n = hs.get("unchanged", 0)
        out.append(("  no gate changed its verdict" if not hs["gates"] else f"  {n} other gate(s) kept their verdict")
                   + " (--all-gates lists every gate)")
    for o in hs.get("other") or []:
        out.append(f"  not compared: {o['runs']} run(s) of `{_context(o['command'], o['role'])}`, last {o['last']} "
                   f"(--command {o['command']}" + (f" --role {o['role']}" if o["role"] else "") + ")")
    return out


def _none_recorded(summary: dict[str, Any]) -> str:
    """The line for a history with no runs of the kind asked."""
    return ("no snapshot replays recorded" if summary.get("replays") else
            "no live runs recorded (--replays shows snapshot replays)")


def _drift_lines(d: dict[str, Any] | None) -> list[str]:
    """The load-probe drift lines under a host's gates (:func:`_drift`'s result; none without it)."""
    if not d:
        return []
    if d["pass_run"] is None:
        return [f"  load figures of run {d['run']} ({d['at']}): no earlier gpu.slow-state PASS "
                "with figures to compare with"]
    lines = [f"  load-probe drift: run {d['run']} ({d['at']}) vs last PASS run {d['pass_run']} ({d['pass_at']})"]
    for key, gd in d["gpus"].items():
        figs = ", ".join(f"{f} {r['pass']:g} -> {r['now']:g}"
                         + (f" ({r['change_pct']:+.1f} %)" if r["change_pct"] is not None else "")
                         for f, r in gd["figures"].items())
        lines.append(f"    {gd.get('name') or 'GPU'} {key}: {figs}")
    return lines


def format_text(summary: dict[str, Any]) -> str:
    """:func:`summarize`'s result as lines for people (stored text escaped: :func:`afddiag.termsafe.one_line`)."""
    summary = one_line(summary)
    lines = [_head(summary)]
    for h, hs in summary["hosts"].items():
        lines.append(_host_line(h, hs))
        width = max((len(g) for g in hs["gates"]), default=10)
        for g, segs in hs["gates"].items():
            first = segs[0]
            lines.append(f"  {g:<{width}}  {first['verdict']:<5} since {first['since']} "
                         f"(run {first['first_run']}, {first['runs']} run(s))")
            for s in segs[1:]:
                lines.append(f"  {'':<{width}}  {s['verdict']:<5} since {s['since']} "
                             f"(run {s['first_run']}, {s['runs']} run(s))")
        lines.extend(_notes(hs, summary))
        lines.extend(_drift_lines(hs.get("drift")))
    if not summary["hosts"]:
        lines.append(_none_recorded(summary))
    if summary.get("damaged"):
        lines.append(summary["damaged"])
    return "\n".join(lines)


def write_history(summary: dict[str, Any], out: Any = None, width: int | None = None) -> None:
    """:func:`summarize`'s result for people: on a terminal (or at ``width``) one rich table per host
    (gate, verdict, since, first run, runs; cells fold at the width), the drift lines under it;
    elsewhere :func:`format_text`'s plain lines."""
    import sys


    out = out or sys.stdout
    con = console_for(out, width)
    if con is None:
        out.write(format_text(summary) + "\n")
        return
    summary = one_line(summary)  # what the store holds came from hosts and reports: never markup, no forged row
    from rich import box
    from rich.table import Table
    from rich.text import Text

    con.print(Text(_head(summary), overflow="fold"))
    if not summary["hosts"]:
        con.print(_none_recorded(summary))
    for h, hs in summary["hosts"].items():
        title = _host_line(h, hs)
        t = Table(title=Text(title), box=box.SIMPLE_HEAD, pad_edge=False)
        t.add_column("gate", overflow="fold")
        t.add_column("verdict", no_wrap=True)
        t.add_column("since", overflow="fold")
        t.add_column("first run", justify="right")
        t.add_column("runs", justify="right")
        for g, segs in hs["gates"].items():
            for i, seg in enumerate(segs):
                t.add_row(Text(g if i == 0 else ""), Text(seg["verdict"], style=COLORS.get(seg["verdict"], "")),
                          Text(str(seg["since"])), Text(str(seg["first_run"])), Text(str(seg["runs"])))
        if hs["gates"]:
            con.print(t)
        else:
            con.print(Text(title, overflow="fold"))
        for line in _notes(hs, summary) + _drift_lines(hs.get("drift")):
            con.print(Text(line, overflow="fold"))
    if summary.get("damaged"):
        con.print(Text(summary["damaged"], overflow="fold"))
