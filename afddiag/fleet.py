"""``afddiag fleet`` (collect every host's report over SSH) and ``afddiag merge`` (reports collected
by any other engine), then the cross-host gates (:mod:`afddiag.gates.fleet`) and one fleet table.

Both commands share everything after collection: :func:`judge` turns a list of
:class:`~afddiag.gates.fleet.HostResult` into the fleet report, :func:`write_fleet_table` renders it.

Inventory (TOML)::

    [fleet]                       # all optional
    user = "root"                 # SSH user when a target names none
    known_hosts = "~/.ssh/known_hosts"   # host keys are always verified (default: ~/.ssh/known_hosts)
    identity = "~/.ssh/id_ed25519"       # client key (default: ssh-agent and ~/.ssh/id_*)
    concurrency = 16              # hosts collected at once
    timeout_s = 120               # per host, connect to last byte
    connect_timeout_s = 10
    max_output_mib = 32           # a host printing more is an ERROR row ("output over 32 MiB")
    afddiag = "afddiag"           # the remote command (per host too)
    python = "python3"            # the remote interpreter for --push
    peers = "coordinator"         # --peer given to each host: "coordinator" (ranks get the
                                  # coordinators' fabric IPs, coordinators every rank's), "all", "none"

    [expect]                      # fleet-wide expectations for the fleet gates
    capacity = 256                # every rank's capacity flag and the coordinator's batch flag
    gid_index = 3                 # a stack forces this GID index everywhere
    mtu = 4096                    # RoCE path MTU, bytes

    [[host]]
    name = "spark-a"
    role = "expert"               # --role on that host
    ssh = "root@10.0.0.11:22"     # SSH target (default: name)
    fabric_ip = "192.168.100.10"  # --fabric-ip
    launch_env = "/etc/afd/expert.env"   # --launch-env, a path on that host
    args = ["--load"]             # extra arguments for `afddiag all`
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import ipaddress
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from afddiag import __version__
from afddiag.gates.fleet import HostResult, run_fleet_gates
from afddiag.verdict import ERROR, EXIT_ERROR, EXIT_FAIL, EXIT_OK, EXIT_WARN, FAIL, WARN, Verdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

FLEET_SCHEMA = "afddiag-fleet/1"  # kept in "schema" for readers of the first fleet reports
FLEET_SCHEMA_VERSION = 1  # afddiag/schema/fleet.schema.json
PEER_POLICIES = ("coordinator", "all", "none")
MAX_OUTPUT_MIB = 32  # a host's stdout past this is an ERROR row (a 10k-device report is ~10 MiB)
_NAME_RE = __import__("re").compile(r"^[A-Za-z0-9_.:@\[\]\-]{1,253}$")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _spec(kind: str, lo: float | None = None, hi: float | None = None, choices: tuple | None = None):
    """One key's type: (check(value) -> bool, what is allowed in words)."""
    if kind == "str":
        return (lambda v: isinstance(v, str) and v != "" and "\0" not in v and len(v) <= 4096), "a non-empty string"
    if kind == "name":
        return (lambda v: isinstance(v, str) and bool(_NAME_RE.match(v))), \
            "a host name (letters, digits, . _ - : @ [ ], at most 253)"
    if kind == "choice":
        return (lambda v: v in choices), "one of " + ", ".join(map(str, choices))
    if kind == "ipv4":
        def ok(v: Any) -> bool:
            try:
                ipaddress.IPv4Address(v)
                return isinstance(v, str)
            except ValueError:
                return False
        return ok, "an IPv4 address in dotted form (e.g. \"192.168.100.10\")"
    if kind == "args":
        return (lambda v: isinstance(v, list) and all(isinstance(a, str) and "\0" not in a for a in v)), \
            "a list of strings"
    if kind == "int":
        return (lambda v: _is_int(v) and lo <= v <= hi), f"an integer {lo}..{hi}"
    return (lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and lo <= v <= hi),
            f"a number {lo:g}..{hi:g}")  # "number"


_FLEET_SPEC = {"user": _spec("str"), "known_hosts": _spec("str"), "identity": _spec("str"),
               "concurrency": _spec("int", 1, 1024), "timeout_s": _spec("number", 1, 3600),
               "connect_timeout_s": _spec("number", 0.5, 600), "afddiag": _spec("str"), "python": _spec("str"),
               "peers": _spec("choice", choices=PEER_POLICIES), "max_output_mib": _spec("int", 1, 4096)}
_EXPECT_SPEC = {"capacity": _spec("int", 1, 1 << 20), "gid_index": _spec("int", 0, 65535),
                "mtu": _spec("choice", choices=(256, 512, 1024, 2048, 4096))}
_HOST_SPEC = {"name": _spec("name"), "role": _spec("name"), "ssh": _spec("str"), "fabric_ip": _spec("ipv4"),
              "launch_env": _spec("str"), "args": _spec("args"), "afddiag": _spec("str"), "python": _spec("str")}
_FLEET_KEYS, _EXPECT_KEYS, _HOST_KEYS = set(_FLEET_SPEC), set(_EXPECT_SPEC), set(_HOST_SPEC)


def _check_table(where: str, table: Any, spec: dict[str, Any], label: str) -> dict[str, Any]:
    """``table`` checked against ``spec`` (key → (check, allowed)); raises InventoryError naming
    ``where``, the key, the value and what is allowed."""
    if not isinstance(table, dict):
        raise InventoryError(f"{where}: {label} must be a table, not {type(table).__name__} {table!r:.40}")
    bad = set(table) - set(spec)
    if bad:
        raise InventoryError(f"{where}: {label} unknown key(s) {', '.join(sorted(map(str, bad)))} "
                             f"(known: {', '.join(sorted(spec))})")
    for k, v in table.items():
        check, allowed = spec[k]
        if not check(v):
            raise InventoryError(f"{where}: {label} {k} must be {allowed}, not {v!r:.60}")
    return table


class InventoryError(ValueError):
    """An inventory that cannot be used (the message names the file, the entry and the fix)."""


@dataclass
class InvHost:
    """One ``[[host]]`` of the inventory."""

    name: str
    ssh: str
    role: str | None = None
    fabric_ip: str | None = None
    launch_env: str | None = None
    args: list[str] = field(default_factory=list)
    afddiag: str | None = None
    python: str | None = None


@dataclass
class Inventory:
    """The parsed inventory: hosts in file order, the ``[fleet]`` settings, the ``[expect]`` table."""

    hosts: list[InvHost]
    settings: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)
    path: str = ""


def load_inventory(path: str) -> Inventory:
    """Parse the inventory TOML at ``path``.

    Raises :class:`InventoryError` (naming the file and the entry) for an unreadable file, TOML
    errors, unknown keys, a host without a name, duplicate names, or a fabric IP that is not IPv4.
    """
    from afddiag.reader import InputError, read_text

    try:
        data = tomllib.loads(read_text(path))
    except FileNotFoundError as e:
        raise InventoryError(f"inventory {path}: {e.strerror}: give the fleet's inventory file")
    except InputError as e:
        raise InventoryError(f"inventory {e}")
    except tomllib.TOMLDecodeError as e:
        raise InventoryError(f"inventory {path}: not TOML ({e})")
    extra = set(data) - {"fleet", "expect", "host"}
    if extra:
        raise InventoryError(f"inventory {path}: unknown table(s) {', '.join(sorted(extra))} (known: fleet, expect, host)")
    settings = _check_table(f"inventory {path}", data.get("fleet", {}), _FLEET_SPEC, "[fleet]")
    expect = _check_table(f"inventory {path}", data.get("expect", {}), _EXPECT_SPEC, "[expect]")
    raw_hosts = data.get("host", [])
    if not isinstance(raw_hosts, list):
        raise InventoryError(f"inventory {path}: host = {raw_hosts!r:.40}: write each host as a [[host]] table")
    hosts: list[InvHost] = []
    seen: set[str] = set()
    for i, h in enumerate(raw_hosts):
        where = f"inventory {path}: host #{i + 1}"
        if not isinstance(h, dict) or "name" not in h:
            raise InventoryError(f"{where}: every [[host]] needs a name")
        _check_table(where, h, _HOST_SPEC, "[[host]]")
        name = h["name"]
        if name in seen:
            raise InventoryError(f"{where}: name {name!r} used twice")
        seen.add(name)
        hosts.append(InvHost(name=name, ssh=h.get("ssh") or name, role=h.get("role"), fabric_ip=h.get("fabric_ip"),
                             launch_env=h.get("launch_env"), args=list(h.get("args") or []),
                             afddiag=h.get("afddiag"), python=h.get("python")))
    if not hosts:
        raise InventoryError(f"inventory {path}: no [[host]] entries")
    return Inventory(hosts=hosts, settings=dict(settings), expect=dict(expect), path=path)


def parse_target(target: str, default_user: str | None = None) -> tuple[str | None, str, int]:
    """``[user@]host[:port]`` (``[v6]:port`` for IPv6) → ``(user, host, port)``; port 22 by default."""
    user, _, rest = target.rpartition("@")
    user = user or default_user
    port = 22
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":") and tail[1:].isdigit():
            port = int(tail[1:])
    elif rest.count(":") == 1:
        host, _, p = rest.partition(":")
        if p.isdigit():
            port = int(p)
        else:
            host = rest
    else:
        host = rest
    return user, host, port


def peers_for(h: InvHost, inv: Inventory) -> list[str]:
    """The ``--peer`` addresses ``h`` is given under the inventory's ``peers`` policy."""
    policy = inv.settings.get("peers", "coordinator")
    others = [o for o in inv.hosts if o is not h and o.fabric_ip and o.fabric_ip != h.fabric_ip]
    if policy == "none":
        return []
    if policy == "all":
        return [o.fabric_ip for o in others]
    if h.role == "coordinator":
        return [o.fabric_ip for o in others if o.role != "coordinator"]
    return [o.fabric_ip for o in others if o.role == "coordinator"]


def remote_args(h: InvHost, inv: Inventory) -> list[str]:
    """The arguments of ``afddiag all --json`` on ``h`` (role, launch env, fabric IP, peers, args)."""
    args = ["all", "--json"]
    if h.role:
        args += ["--role", h.role]
    if h.launch_env:
        args += ["--launch-env", h.launch_env]
    if h.fabric_ip:
        args += ["--fabric-ip", h.fabric_ip]
    for p in peers_for(h, inv):
        args += ["--peer", p]
    return args + list(h.args)


# ---------------------------------------------------------------- report parsing

def parse_report(text: str, where: str) -> tuple[dict[str, Any] | None, str | None]:
    """One host's stdout → ``(report, None)``, or ``(None, why)`` when it is not an afddiag report
    (not JSON, not an object, no ``schema_version``/``gates``)."""
    from afddiag.reader import InputError, parse_json

    s = text.strip()
    if not s:
        return None, f"{where}: empty output"
    try:
        obj = parse_json(s, where)
    except InputError as e:
        return None, f"{e} (starts {s[:60]!r})"
    why = _not_a_report(obj)
    return (None, f"{where}: {why}") if why else (obj, None)


def _not_a_report(obj: Any) -> str | None:
    if not isinstance(obj, dict):
        return f"JSON {type(obj).__name__}, not an afddiag report object"
    if obj.get("kind") == "fleet" or obj.get("schema") == FLEET_SCHEMA:
        return "a fleet report (afddiag fleet|merge --json), not one host's report: give the per-host reports"
    if not isinstance(obj.get("gates"), list) or "schema_version" not in obj:
        return "JSON object without schema_version/gates: not an afddiag report"
    return None


MAX_MERGE_FILE_BYTES = 256 << 20  # one merge input (1,000 reports of ~100 KiB in one JSON array)


def load_reports(paths: list[str]) -> list[HostResult]:
    """Per-host report files → one :class:`HostResult` per report. A file holds one report, a JSON
    array of reports, or one report per line (JSON lines). A file that does not parse is an ERROR
    row named after the file; a host name seen twice gets ``#2``, ``#3`` appended. Files are read
    through :mod:`afddiag.reader`: a device, FIFO, a file over :data:`MAX_MERGE_FILE_BYTES` or JSON
    nested deeper than its cap raises :class:`afddiag.reader.InputError` (the CLI's usage error)."""
    from afddiag.reader import DepthError, InputError, parse_json, read_bytes

    out: list[HostResult] = []
    names: dict[str, int] = {}

    def add(rep: dict[str, Any] | None, path: str, err: str | None = None) -> None:
        name = str(rep.get("host") or Path(path).stem) if rep else Path(path).name
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
                    add(rep, f"{path}:{i}", why)
                continue
            add(None, path, parse_report(text, path)[1])
            continue
        for rep in obj if isinstance(obj, list) else [obj]:
            why = _not_a_report(rep)
            add(None if why else rep, path, f"{path}: {why}" if why else None)
    return out


# ---------------------------------------------------------------- judging and rendering

def _host_row(h: HostResult) -> dict[str, Any]:
    rep = h.report or {}
    failing = [g["id"] for g in rep.get("gates") or [] if isinstance(g, dict) and g.get("verdict") in (FAIL, ERROR)]
    warned = [g["id"] for g in rep.get("gates") or [] if isinstance(g, dict) and g.get("verdict") == WARN]
    return {"name": h.name, "role": h.host_role if h.ok else h.role, "target": h.target,
            "fabric_ip": h.fip if h.ok else h.fabric_ip, "status": "ok" if h.ok else "ERROR", "error": h.error,
            "exit_code": rep.get("exit_code") if h.ok else EXIT_ERROR, "counts": rep.get("counts"),
            "failing": failing, "warning": warned, "elapsed_s": h.elapsed_s,
            "afddiag_version": rep.get("afddiag_version")}


def judge(hosts: list[HostResult], expect: dict[str, Any] | None = None, source: str = "merge",
          keep_reports: bool = False) -> dict[str, Any]:
    """Run the fleet gates over ``hosts`` and build the fleet report (``schema_version`` 1,
    ``afddiag/schema/fleet.schema.json``; ``schema`` "afddiag-fleet/1" is kept for older readers).

    Exit code: 2 if any host exited 2 or a fleet gate FAILs; else 3 if a host has no report, exited
    3, or a fleet gate ERRORs; else 1 on any WARN; else 0. ``keep_reports`` embeds each per-host
    report under ``reports`` (for ``fleet --json``)."""
    from afddiag.facts import to_jsonable

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
    counts = {v: 0 for v in ("PASS", "WARN", "FAIL", "SKIP", "ERROR")}
    for v in verdicts:
        counts[v.verdict] += 1
    out = {"schema_version": FLEET_SCHEMA_VERSION, "kind": "fleet", "schema": FLEET_SCHEMA, "afddiag_version": __version__, "source": source,
           "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "expect": dict(expect or {}), "hosts": rows, "gates": [to_jsonable(v) for v in verdicts],
           "counts": counts, "hosts_ok": sum(1 for r in rows if r["status"] == "ok"),
           "hosts_error": sum(1 for r in rows if r["status"] != "ok"), "exit_code": code}
    if keep_reports:
        out["reports"] = {h.name: h.report for h in hosts if h.ok}
    return out


def write_fleet_table(fr: dict[str, Any], out: TextIO | None = None, width: int | None = None) -> None:
    """The fleet table: one row per host (status, exit, counts, failing gates or the error), then
    one row per fleet gate with its remedy. Plain full-width text when ``out`` is not a terminal;
    on a terminal (or at ``width``) rich tables whose cells fold, so 80 columns cut nothing. Names
    and a remote's stderr are shown with control characters escaped (:mod:`afddiag.termsafe`)."""
    from afddiag.render import COLORS, console_for, gate_table, write_gate_lines
    from afddiag.termsafe import cleaned

    fr = cleaned(fr)
    out = out or sys.stdout

    con = console_for(out, width)
    w = max([len(r["name"]) for r in fr["hosts"]] + [4])
    if con is None:
        out.write(f"{'host':<{w}}  {'role':<12} {'collected':<9} exit  pass/warn/fail/skip/error  failing gates / error\n")
        for r in fr["hosts"]:
            c = r.get("counts") or {}
            cnt = "/".join(str(c.get(k, "-")) for k in ("PASS", "WARN", "FAIL", "SKIP", "ERROR")) if c else "-"
            what = r["error"] if r["status"] != "ok" else (", ".join(r["failing"]) or "-")
            out.write(f"{r['name']:<{w}}  {str(r.get('role') or '-'):<12} {r['status']:<9} {r['exit_code']!s:<5} "
                      f"{cnt:<26} {what}\n")
        out.write("\n")
        write_gate_lines(fr["gates"], out, 16)
    else:
        from rich import box
        from rich.table import Table
        from rich.text import Text

        t = Table(title=f"afddiag fleet — {len(fr['hosts'])} host(s) ({fr['source']})", box=box.SIMPLE_HEAD,
                  pad_edge=False)
        t.add_column("host", overflow="fold")
        t.add_column("role", overflow="fold")
        t.add_column("status", no_wrap=True)
        t.add_column("exit", no_wrap=True)
        t.add_column("p/w/f/s/e", overflow="fold")
        t.add_column("failing gates / error", overflow="fold", ratio=1)
        for r in fr["hosts"]:
            c = r.get("counts") or {}
            cnt = "/".join(str(c.get(k, "-")) for k in ("PASS", "WARN", "FAIL", "SKIP", "ERROR")) if c else "-"
            what = r["error"] if r["status"] != "ok" else (", ".join(r["failing"]) or "-")
            t.add_row(r["name"], str(r.get("role") or "-"), Text(r["status"], style="" if r["status"] == "ok"
                      else COLORS["ERROR"]), str(r["exit_code"]), cnt, what)
        con.print(t)
        con.print(gate_table(fr["gates"], "cross-host gates"))
    c = fr["counts"]
    out.write(f"{fr['hosts_ok']} host(s) reported, {fr['hosts_error']} without a report; fleet gates: {c['PASS']} "
              f"pass, {c['WARN']} warn, {c['FAIL']} fail, {c['SKIP']} skip, {c['ERROR']} error — exit "
              f"{fr['exit_code']}\n")


# ---------------------------------------------------------------- collection over SSH

@dataclass
class SshOptions:
    """How :func:`collect` reaches the hosts. ``known_hosts``: a file (None: asyncssh's default,
    ``~/.ssh/known_hosts``); host keys are always verified. Seconds throughout."""

    known_hosts: str | None = None
    identity: str | None = None
    user: str | None = None
    concurrency: int = 16
    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    push: str | None = None  # local path of the zipapp to copy and run (None: run the installed afddiag)
    max_output_mib: int = MAX_OUTPUT_MIB  # a host's stdout past this is its ERROR row


class Progress:
    """Live per-host progress on stderr: one line per state change, elapsed seconds first."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.monotonic()

    def __call__(self, host: str, state: str) -> None:
        """Write ``[  12.3s] host: state`` (nothing with ``quiet``)."""
        if not self.quiet:
            from afddiag.termsafe import clean

            self.stream.write(clean(f"[{time.monotonic() - self.t0:6.1f}s] {host}: {state}", keep_newlines=False)
                              + "\n")
            self.stream.flush()


def _ssh_error(e: BaseException) -> str:
    import asyncssh

    if isinstance(e, asyncssh.HostKeyNotVerifiable):
        return f"host key not verified ({e.reason}): add the host's key to known_hosts (--known-hosts FILE)"
    if isinstance(e, asyncssh.PermissionDenied):
        return f"permission denied ({e.reason}): install the client key on the host or give --identity"
    if isinstance(e, asyncssh.DisconnectError):
        return f"ssh disconnected: {e.reason}"
    if isinstance(e, ConnectTimeout):
        return str(e)
    if isinstance(e, ConnectionRefusedError):
        return "unreachable: connection refused (no sshd listening)"
    if isinstance(e, OSError):
        return f"unreachable: {e.strerror or e}"
    return f"ssh failed: {type(e).__name__}: {e}"


async def _collect_one(h: InvHost, inv: Inventory, opts: SshOptions, sem: asyncio.Semaphore,
                       progress: Progress) -> HostResult:
    import asyncssh

    res = HostResult(name=h.name, role=h.role, target=h.ssh, fabric_ip=h.fabric_ip)
    user, host, port = parse_target(h.ssh, opts.user or inv.settings.get("user"))
    stage = ["waiting"]

    async def work() -> None:
        stage[0] = "connecting"
        progress(h.name, f"connecting to {host}:{port}")
        kw: dict[str, Any] = {"port": port, "connect_timeout": opts.connect_timeout_s}
        if user:
            kw["username"] = user
        if opts.known_hosts:
            kw["known_hosts"] = os.path.expanduser(opts.known_hosts)
        if opts.identity:
            kw["client_keys"] = [os.path.expanduser(opts.identity)]
            kw["agent_path"] = None
        try:
            conn_cm = await asyncio.wait_for(asyncssh.connect(host, **kw), opts.connect_timeout_s + 1)
        except asyncio.TimeoutError:
            raise ConnectTimeout(f"unreachable: connect timed out after {opts.connect_timeout_s:g} s") from None
        async with conn_cm as conn:
            args = remote_args(h, inv)
            if opts.push:
                stage[0] = "pushing"
                progress(h.name, "copying the zipapp (SFTP)")
                remote = await _push(conn, opts.push)
                cmd = [h.python or inv.settings.get("python", "python3"), remote] + args
            else:
                cmd = shlex.split(h.afddiag or inv.settings.get("afddiag", "afddiag")) + args
            stage[0] = "running afddiag"
            progress(h.name, "running " + " ".join(shlex.quote(c) for c in cmd))
            out, err_tail, status, over = await _run_capped(conn, " ".join(shlex.quote(c) for c in cmd),
                                                            opts.max_output_mib << 20)
            if over:
                res.error = (f"output over {opts.max_output_mib} MiB: stopped reading and closed the session "
                             "(the host's afddiag or its wrapper prints without end)")
                return
            rep, why = parse_report(out.decode("utf-8", "replace"), f"exit {status}")
            if rep is None:
                err = err_tail.decode("utf-8", "replace").strip().splitlines()
                res.error = why + (f"; stderr: {err[-1][:200]}" if err else "")
            res.report = rep

    async with sem:
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(work(), opts.timeout_s)
        except asyncio.TimeoutError:
            res.error = f"timed out after {opts.timeout_s:g} s while {stage[0]}"
        except Exception as e:  # noqa: BLE001 - one host's failure is that host's ERROR row
            res.error = _ssh_error(e)
        res.elapsed_s = round(time.monotonic() - t0, 3)
    if res.ok:
        rep = res.report or {}
        progress(h.name, f"done: exit {rep.get('exit_code')} ({res.elapsed_s:.1f} s)")
    else:
        progress(h.name, f"ERROR: {res.error}")
    return res


class ConnectTimeout(Exception):
    """The SSH connection was not up within the connect bound (the message says which bound)."""


async def _run_capped(conn: Any, command: str, cap: int) -> tuple[bytes, bytes, int | None, bool]:
    """Run ``command`` on ``conn`` reading its stdout as it comes, at most ``cap`` bytes, and the
    last 64 KiB of its stderr → ``(stdout, stderr tail, exit status, over)``. Past ``cap`` the
    channel is closed at once (``over`` True): a host that prints without end costs ``cap`` bytes."""
    proc = await conn.create_process(command, encoding=None)
    out = bytearray()
    err = bytearray()
    over = False
    done = False
    try:
        async def pump_out() -> None:
            nonlocal over
            while chunk := await proc.stdout.read(1 << 16):
                out.extend(chunk)
                if len(out) > cap:
                    over = True
                    proc.close()
                    return

        async def pump_err() -> None:
            while chunk := await proc.stderr.read(1 << 16):
                err.extend(chunk)
                del err[:-65536]
                if over:
                    return

        await asyncio.gather(pump_out(), pump_err(), return_exceptions=True)
        if over:
            return bytes(out[:cap]), bytes(err), None, True
        await proc.wait_closed()
        done = True
        return bytes(out), bytes(err), proc.exit_status, False
    finally:
        if not done:  # cancelled (the per-host bound) or over the cap: close, never wait for the host
            proc.close()


async def _push(conn: Any, local: str) -> str:
    """Copy the zipapp to ``~/.cache/afddiag/`` on the host unless a file of the same size is there;
    return its path relative to the login directory."""
    name = Path(local).name
    rdir = ".cache/afddiag"
    remote = f"{rdir}/{name}"
    async with conn.start_sftp_client() as sftp:
        await sftp.makedirs(rdir, exist_ok=True)
        try:
            if (await sftp.stat(remote)).size == os.path.getsize(local):
                return remote
        except Exception:  # noqa: BLE001 - not there yet
            pass
        await sftp.put(local, remote + ".part")
        try:
            await sftp.posix_rename(remote + ".part", remote)  # atomic replace (OpenSSH extension)
        except Exception:  # noqa: BLE001 - a server without the extension: remove, then rename
            try:
                await sftp.remove(remote)
            except Exception:  # noqa: BLE001 - not there
                pass
            await sftp.rename(remote + ".part", remote)
    return remote


async def collect_async(inv: Inventory, opts: SshOptions, progress: Progress) -> list[HostResult]:
    """Collect every host of ``inv`` in parallel (at most ``opts.concurrency`` at once, each bounded by
    ``opts.timeout_s``); results in inventory order. Never raises for a host: its error is in its row."""
    sem = asyncio.Semaphore(max(1, opts.concurrency))
    return list(await asyncio.gather(*(_collect_one(h, inv, opts, sem, progress) for h in inv.hosts)))


def collect(inv: Inventory, opts: SshOptions, progress: Progress | None = None) -> list[HostResult]:
    """Synchronous :func:`collect_async`."""
    return asyncio.run(collect_async(inv, opts, progress or Progress()))


# ---------------------------------------------------------------- zipapp for --push

VENDORED = ("click", "rich", "pynvml", "tomli", "prometheus_client")  # tomli: tomllib for Python 3.10 targets


def build_zipapp(dest: str) -> str:
    """Write a self-contained zipapp of this afddiag to ``dest`` (a file path); return ``dest``.

    Holds the ``afddiag`` package (with ``checks/gates.toml`` as ``afddiag.checks`` and the
    playbooks as ``afddiag.playbooks``) and the pure-Python dependencies click, rich, pynvml and tomli
    (vendored from this interpreter). Not vendored, because they are compiled: psutil (the target
    needs ``python3-psutil``; without it the CPU probe and netdev addresses are not read, the gates
    that need them SKIP) and pyverbs (``python3-pyverbs``, which must match the target's rdma-core;
    without it fabric.qp-rtr SKIPs). Runs on any Python ≥ 3.10, any architecture (DGX OS: Ubuntu
    24.04 aarch64, Python 3.12): ``python3 afddiag.pyz all --json``.
    Raises OSError when ``dest`` cannot be written, ImportError when a vendored package is missing.
    """
    import importlib.util
    import zipfile

    import afddiag

    pkg = Path(afddiag.__file__).resolve().parent
    files: list[tuple[Path, str]] = []

    def tree(src: Path, arc: str) -> None:
        for p in sorted(src.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so"):
                files.append((p, f"{arc}/{p.relative_to(src).as_posix()}"))

    tree(pkg, "afddiag")
    from importlib import resources

    for sub in ("checks", "playbooks"):
        src = Path(str(resources.files(f"afddiag.{sub}")))
        if src.resolve() != (pkg / sub).resolve():
            tree(src, f"afddiag/{sub}")
    for mod in VENDORED:
        spec = importlib.util.find_spec(mod)
        if spec is None:
            raise ImportError(f"{mod} is not installed here: it is vendored into the zipapp")
        if spec.submodule_search_locations:
            tree(Path(list(spec.submodule_search_locations)[0]), mod)
        else:
            files.append((Path(spec.origin), Path(spec.origin).name))
    main = "import sys\nfrom afddiag.cli import main\nmain()\n"
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    from afddiag.atomic import atomic_write

    with atomic_write(dest, binary=True, mode=0o755) as f:
        f.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("__main__.py", main)
            for p, arc in files:
                z.write(p, arc)
    return dest


__all__ = ["HostResult", "Inventory", "InventoryError", "SshOptions", "Verdict", "build_zipapp", "collect",
           "judge", "load_inventory", "load_reports", "parse_report", "write_fleet_table"]
