"""``afddiag fleet``'s collection: every host's ``afddiag all --json`` over OpenSSH, fanned out by
ClusterShell (one task, a sliding window of ``fanout`` ssh processes), bounded per host, with live
progress; and the zipapp ``--push`` copies to hosts (ClusterShell's copy: scp under the same options).

Host keys are checked against the one known_hosts file afddiag names, whatever ``~/.ssh/config`` or
``/etc/ssh/ssh_config`` say: ssh runs with ``-F`` a per-run config that afddiag writes (each host's
HostName, Port, User, IdentityFile; nothing of the user's is read) and the checking options on its
command line (:data:`FORCED_OPTIONS`). The per-run config lives in a private temporary folder that is
removed when the collection ends, however it ends.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import shutil
import stat
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import afddiag
from afddiag.atomic import atomic_write
from afddiag.fleet.inventory import Inventory, InvHost, parse_target, remote_args
from afddiag.fleet.judge import parse_report
from afddiag.gates.fleet import HostResult
from afddiag.packaged import data_dir
from afddiag.termsafe import clean

MAX_OUTPUT_MIB = 32  # a host's stdout past this is an ERROR row (a 10k-device report is ~10 MiB)
REMOTE_DIR = ".cache/afddiag"  # --push: where the zipapp lands, relative to the login directory
# Always on ssh's (and scp's) command line, where they win over any config file: host keys checked
# strictly against afddiag's file (and only it), no agent or X11 forwarding, no prompts, no shared
# master connection, no local command, no DNS or known_hosts updates. LogLevel VERBOSE makes ssh say
# "Authenticated to ..." on stderr: the moment a host moves from connecting to running.
FORCED_OPTIONS = ("-oStrictHostKeyChecking=yes", "-oGlobalKnownHostsFile=/dev/null", "-oForwardAgent=no",
                  "-oForwardX11=no", "-oClearAllForwardings=yes", "-oBatchMode=yes", "-oControlMaster=no",
                  "-oControlPath=none", "-oPermitLocalCommand=no", "-oUpdateHostKeys=no", "-oVerifyHostKeyDNS=no",
                  "-oCheckHostIP=no", "-oRequestTTY=no", "-oLogLevel=VERBOSE")
_SSH_NOISE = (b"Authenticated to ", b"Transferred: ", b"Bytes per second", b"Connection to ", b"Warning: ")
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,253}$")  # a HostName ssh's config takes literally
_USER_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.\-]{0,63}$")
_ALIAS_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,252}$")  # a ClusterShell node name and ssh Host alias


# ---------------------------------------------------------------- options and the per-run ssh config

@dataclass
class SshOptions:
    """How :func:`collect` reaches the hosts. ``known_hosts``: the one file host keys are checked
    against (None: ``~/.ssh/known_hosts``); ``concurrency``: ClusterShell's fan-out window (ssh
    processes at once); seconds throughout; ``timeout_s`` bounds each host from its ssh start to its
    last byte, every step (the --push check, copy and run) inside it."""

    known_hosts: str | None = None
    identity: str | None = None
    user: str | None = None
    concurrency: int = 16
    timeout_s: float = 120.0
    connect_timeout_s: float = 10.0
    push: str | None = None  # local path of the zipapp to copy and run (None: run the installed afddiag)
    max_output_mib: int = MAX_OUTPUT_MIB  # a host's stdout past this is its ERROR row
    ssh_path: str = "ssh"
    scp_path: str = "scp"


class SshSetupError(ValueError):
    """Options afddiag refuses before contacting any host (one line: the file or value, and why)."""


def check_identity(path: str) -> str:
    """``path`` expanded, if it names a regular file (a link is followed); else SshSetupError."""
    p = os.path.expanduser(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise SshSetupError(f"identity {path}: {e.strerror}: give --identity a private key file") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise SshSetupError(f"identity {path}: {kind}: give --identity a private key file")
    return p


def _cfg_path(what: str, p: str) -> str:
    """``p`` as one double-quoted ssh config argument (``%`` kept literal); SshSetupError where it cannot be."""
    if '"' in p or any(ord(c) < 32 for c in p):
        raise SshSetupError(f"{what} {p!r}: a path with a double quote or a control character cannot be given to ssh")
    return '"' + p.replace("%", "%%") + '"'


@dataclass
class _Target:
    """One host as ssh reaches it: the alias on ssh's command line and its config block."""

    alias: str
    host: str
    port: int
    user: str | None


def _targets(hosts: list[InvHost], default_user: str | None) -> list[_Target]:
    """Each host's ssh target checked and given an alias (its name where that is a plain node name)."""
    out = []
    for i, h in enumerate(hosts):
        user, host, port = parse_target(h.ssh, default_user)
        if not _HOST_RE.match(host) or (user is not None and not _USER_RE.match(user)):
            raise SshSetupError(f"host {h.name}: ssh target {h.ssh!r:.80} is not [user@]host[:port] "
                                "(letters, digits, . _ - :)")
        alias = h.name if _ALIAS_RE.match(h.name) else f"afddiag-host-{i}"
        out.append(_Target(alias, host, port, user))
    return out


def ssh_config(targets: list[_Target], identity: str | None) -> str:
    """The per-run ssh config: one ``Host`` block per alias; ``-F`` keeps every other config out."""
    lines = ["# written by afddiag fleet for one run; removed when it ends"]
    for t in targets:
        lines += [f"Host {t.alias}", f"  HostName {t.host}", f"  Port {t.port}"]
        if t.user:
            lines.append(f"  User {t.user}")
        if identity:
            lines += [f"  IdentityFile {_cfg_path('identity', identity)}", "  IdentitiesOnly yes",
                      "  IdentityAgent none"]
    return "\n".join(lines) + "\n"


def ssh_options(config: str, known_hosts: str, connect_timeout_s: float) -> str:
    """ClusterShell's ``ssh_options`` (and ``scp_options``): ``-F config`` and :data:`FORCED_OPTIONS`."""
    opts = ["-F", config, f"-oUserKnownHostsFile={_cfg_path('known_hosts', known_hosts)}",
            f"-oConnectTimeout={max(1, math.ceil(connect_timeout_s))}", *FORCED_OPTIONS]
    return " ".join(shlex.quote(o) for o in opts)


# ---------------------------------------------------------------- progress

class Progress:
    """Live per-host progress on stderr: one line per state change, elapsed seconds first."""

    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.t0 = time.monotonic()

    def __call__(self, host: str, state: str) -> None:
        """Write ``[  12.3s] host: state`` (nothing with ``quiet``)."""
        if not self.quiet:
            self.stream.write(clean(f"[{time.monotonic() - self.t0:6.1f}s] {host}: {state}", keep_newlines=False)
                              + "\n")
            self.stream.flush()


# ---------------------------------------------------------------- one host's steps

def ssh_error(lines: list[str], connect_timeout_s: float) -> str | None:
    """What ssh's own stderr ``lines`` (exit 255) say went wrong, in afddiag's words; None if not ssh's."""
    text = "\n".join(lines)
    last = lines[-1][:200] if lines else ""
    if "Host key verification failed" in text or "IDENTIFICATION HAS CHANGED" in text:
        why = "it differs from the one in known_hosts" if "CHANGED" in text else "not in known_hosts"
        return f"host key not verified ({why}): add the host's key to known_hosts (--known-hosts FILE)"
    if "Connection refused" in text:
        return "unreachable: connection refused (no sshd listening)"
    if "timed out" in text:
        return f"unreachable: connect timed out after {max(1, math.ceil(connect_timeout_s))} s"
    if "Permission denied" in text:
        return f"permission denied ({last}): install the client key on the host or give --identity"
    if "Could not resolve" in text or "No route" in text or "Network is unreachable" in text:
        return f"unreachable: {last}"
    if lines and (last.startswith("ssh:") or "kex_exchange" in text or "Connection closed" in text):
        return f"ssh failed: {last}"
    return None


@dataclass
class _Push:
    """The zipapp --push copies: its local path, its name on the hosts (``afddiag-<sha256[:16]>.pyz``:
    another content never has this name) and its whole sha256, checked on the host before it runs."""

    local: str
    name: str
    digest: str

    @classmethod
    def of(cls, local: str) -> _Push:
        h = hashlib.sha256()
        with open(local, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return cls(local, f"afddiag-{h.hexdigest()[:16]}.pyz", h.hexdigest())

    def check_command(self) -> str:
        """Step ``check``: make the folder (0700), print the sha256 of the file of this name there, if any."""
        f = shlex.quote(f"{REMOTE_DIR}/{self.name}")
        return "sh -c " + shlex.quote(f"mkdir -p {REMOTE_DIR} && chmod 700 {REMOTE_DIR} && "
                                      f"{{ if [ -f {f} ]; then sha256sum < {f}; fi; }}")

    def run_command(self, python: str, args: list[str], fresh_copy: bool) -> str:
        """Step ``run``: (after a copy, move ``.part`` into place,) check that the file hashes to
        :attr:`digest`, then run it; a file with other content is never run (exit 97, stderr says why)."""
        script = (f"f={shlex.quote(REMOTE_DIR + '/' + self.name)}; "
                  + ('mv -f "$f.part" "$f" || exit 97; ' if fresh_copy else "")
                  + 'set -- $(sha256sum < "$f" 2>/dev/null); '
                  + f'if [ "${{1:-}}" != {self.digest} ]; then echo "afddiag-push: $f: content differs from '
                  + f'the zipapp pushed (sha256 ${{1:-unreadable}}, want {self.digest[:16]}...): not run" >&2; '
                  + 'exit 97; fi; '
                  + " ".join(["exec", shlex.quote(python), '"$f"', *map(shlex.quote, args)]))
        return "sh -c " + shlex.quote(script)


@dataclass
class _Host:
    """One host's collection: its steps (``check`` and ``copy`` with --push, then ``run``), what ssh
    printed in the current one, and its result. Driven by ClusterShell's events (:func:`_events`)."""

    inv: InvHost
    target: _Target
    res: HostResult
    steps: list[str]
    run_argv: list[str]  # the remote command (plain) or [python, *args] (--push)
    t0: float = 0.0  # monotonic seconds when its first ssh started; 0: not yet
    step: str = ""
    out: bytearray = field(default_factory=bytearray)
    err: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    rc: int | None = None
    timed_out: bool = False
    over: bool = False
    authenticated: bool = False
    copied: bool = False


STAGES = {"check": "checking the pushed zipapp", "copy": "copying the zipapp", "run": "running afddiag"}


class _Driver:
    """Schedules each host's steps on one ClusterShell task and turns their events into results."""

    def __init__(self, task: Any, hosts: list[_Host], opts: SshOptions, progress: Progress,
                 push: _Push | None) -> None:
        self.task, self.opts, self.progress, self.push = task, opts, progress, push
        self.by_alias = {h.target.alias: h for h in hosts}
        self.cap = opts.max_output_mib << 20

    def command(self, h: _Host) -> str:
        """The remote command of ``h``'s current step."""
        if self.push and h.step == "check":
            return self.push.check_command()
        if self.push:
            return self.push.run_command(h.run_argv[0], h.run_argv[1:], h.copied)
        return " ".join(map(shlex.quote, h.run_argv))

    def shown(self, h: _Host) -> str:
        """What ``h`` runs, for its progress line (--push: the interpreter, the zipapp's path, the arguments)."""
        argv = h.run_argv
        if self.push:
            argv = [argv[0], f"{REMOTE_DIR}/{self.push.name}", *argv[1:]]
        return " ".join(map(shlex.quote, argv))

    def start(self, h: _Host) -> None:
        """Schedule ``h``'s next step with the time it has left, or finish it when none is left."""
        if not h.steps:
            return self.finish(h)
        h.step = h.steps.pop(0)
        h.out.clear()
        h.err.clear()
        h.rc, h.authenticated = None, False
        left = self.opts.timeout_s - (time.monotonic() - h.t0 if h.t0 else 0.0)
        if left <= 0:
            h.timed_out = True
            return self.finish(h)
        ev = _events(self)
        if h.step == "copy":
            assert self.push is not None
            self.progress(h.res.name, "copying the zipapp (scp)")
            self.task.copy(self.push.local, f"{REMOTE_DIR}/{self.push.name}.part", nodes=h.target.alias,
                           handler=ev, timeout=left, stderr=True, tree=False)
        else:
            self.task.shell(self.command(h), nodes=h.target.alias, handler=ev, timeout=left, stderr=True,
                            stdin=False, tree=False)
        return None

    def step_done(self, h: _Host) -> None:
        """``h``'s current step ended: the next one, or its result."""
        if h.timed_out or h.over or h.rc != 0 or h.step == "run":
            return self.finish(h)
        if h.step == "check":
            assert self.push is not None
            there = h.out.decode("ascii", "replace").split()[:1]
            if there == [self.push.digest]:
                h.steps.remove("copy")
                self.progress(h.res.name, f"the zipapp is there ({REMOTE_DIR}/{self.push.name}, same sha256)")
        elif h.step == "copy":
            h.copied = True
        return self.start(h)

    def finish(self, h: _Host) -> None:
        """``h``'s result from its last step, and its progress line."""
        res = h.res
        res.elapsed_s = round(time.monotonic() - h.t0, 3) if h.t0 else 0.0
        res.error = self.verdict(h)
        if res.ok:
            self.progress(res.name, f"done: exit {(res.report or {}).get('exit_code')} ({res.elapsed_s:.1f} s)")
        else:
            self.progress(res.name, f"ERROR: {res.error}")

    def verdict(self, h: _Host) -> str | None:
        """The error of ``h``'s last step, or None with its report in ``h.res.report``."""
        o = self.opts
        if h.over:
            return (f"output over {o.max_output_mib} MiB: stopped reading and closed the session "
                    "(the host's afddiag or its wrapper prints without end)")
        stage = STAGES.get(h.step, h.step) if h.authenticated else "connecting"
        if h.timed_out:
            return f"timed out after {o.timeout_s:g} s while {stage}"
        err = list(h.err)
        tail = f"; stderr: {err[-1][:200]}" if err else ""
        if h.rc == 255 and (why := ssh_error(err, o.connect_timeout_s)):
            return why
        if h.step != "run":
            return f"{stage} failed (exit {h.rc}){tail}"
        rep, why = parse_report(h.out.decode("utf-8", "replace"), f"exit {h.rc}")
        h.res.report = rep
        return None if rep is not None else (why or "not an afddiag report") + tail


def _events(driver: _Driver) -> Any:
    """A ClusterShell event handler for one step of one host (ClusterShell is imported when used)."""
    from ClusterShell.Event import EventHandler

    class Events(EventHandler):
        def ev_pickup(self, worker: Any, node: Any) -> None:
            h = driver.by_alias[str(node)]
            if not h.t0:
                h.t0 = time.monotonic()
                driver.progress(h.res.name, f"connecting to {h.target.host}:{h.target.port}")

        def ev_read(self, worker: Any, node: Any, sname: str, msg: bytes) -> None:
            h = driver.by_alias[str(node)]
            if sname == worker.SNAME_STDERR:
                if msg.startswith(b"Authenticated to "):
                    h.authenticated = True
                    if h.step == "run":
                        driver.progress(h.res.name, "running " + driver.shown(h))
                elif not msg.startswith(_SSH_NOISE):
                    h.err.append(msg[:1024].decode("utf-8", "replace").rstrip("\r"))
            elif len(h.out) + len(msg) + 1 > driver.cap:
                h.over = True
                worker.abort()
            else:
                h.out += msg
                h.out += b"\n"

        def ev_hup(self, worker: Any, node: Any, rc: int) -> None:
            driver.by_alias[str(node)].rc = rc

        def ev_close(self, worker: Any, timedout: bool) -> None:
            for node in worker.nodes:
                h = driver.by_alias[str(node)]
                h.timed_out = bool(timedout) and h.rc is None and not h.over
                driver.step_done(h)

    return Events()


def _capped_worker(cap: int) -> Any:
    """ClusterShell's ssh worker whose clients hand on a partial line once it passes ``cap`` bytes: a
    host printing without a newline reaches the output cap instead of growing the read buffer forever."""
    from ClusterShell.Worker.Ssh import SshClient, WorkerSsh

    class CappedClient(SshClient):
        def _readlines(self, sname: str) -> Any:
            yield from SshClient._readlines(self, sname)
            rfile = self.streams.get(sname)
            if rfile is not None and len(rfile.rbuf) > cap:
                line, rfile.rbuf = rfile.rbuf, b""
                yield line

    class CappedWorker(WorkerSsh):
        SHELL_CLASS = CappedClient

    return CappedWorker


def _host(h: InvHost, t: _Target, inv: Inventory, push: _Push | None) -> _Host:
    args = remote_args(h, inv)
    res = HostResult(name=h.name, role=h.role, target=h.ssh, fabric_ip=h.fabric_ip)
    if push:
        return _Host(h, t, res, ["check", "copy", "run"], [h.python or inv.settings.get("python", "python3"), *args])
    return _Host(h, t, res, ["run"], shlex.split(h.afddiag or inv.settings.get("afddiag", "afddiag")) + args)


def collect(inv: Inventory, opts: SshOptions, progress: Progress | None = None) -> list[HostResult]:
    """Collect every host of ``inv`` through one ClusterShell task (at most ``opts.concurrency`` ssh
    processes at once, each host bounded by ``opts.timeout_s``); results in inventory order. Never
    raises for a host (its error is in its row); raises SshSetupError for what is refused up front (no
    ssh/scp, an identity that is not a regular file, an ssh target ssh's config cannot take literally)."""
    progress = progress or Progress()
    for tool in (opts.ssh_path, opts.scp_path) if opts.push else (opts.ssh_path,):
        if shutil.which(tool) is None:
            raise SshSetupError(f"{tool}: not found: afddiag fleet runs OpenSSH's client (install openssh-client)")
    identity = check_identity(opts.identity) if opts.identity else None
    known = os.path.expanduser(opts.known_hosts or "~/.ssh/known_hosts")
    targets = _targets(inv.hosts, opts.user or inv.settings.get("user"))
    push = _Push.of(opts.push) if opts.push else None
    hosts = [_host(h, t, inv, push) for h, t in zip(inv.hosts, targets, strict=True)]
    tmp = tempfile.mkdtemp(prefix="afddiag-fleet-")  # 0700: the per-run ssh config
    try:
        cfg = os.path.join(tmp, "ssh_config")
        with atomic_write(cfg, mode=0o600) as f:
            f.write(ssh_config(targets, identity))
        _run(hosts, opts, progress, push, ssh_options(cfg, known, opts.connect_timeout_s))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [h.res for h in hosts]


def _run(hosts: list[_Host], opts: SshOptions, progress: Progress, push: _Push | None, options: str) -> None:
    """One ClusterShell task over ``hosts``: fan-out window, ssh/scp with ``options``; every ssh it
    started is killed if this returns by an exception."""
    from ClusterShell.Task import task_self

    task = task_self()
    for key, value in (("fanout", max(1, opts.concurrency)), ("ssh_path", opts.ssh_path),
                       ("scp_path", opts.scp_path), ("ssh_options", options), ("scp_options", options),
                       ("ssh_user", None), ("scp_user", None), ("connect_timeout", 0)):
        task.set_info(key, value)
    task.set_default("stdout_msgtree", False)
    task.set_default("stderr_msgtree", False)
    task.set_default("distant_worker", _capped_worker(opts.max_output_mib << 20))
    driver = _Driver(task, hosts, opts, progress, push)
    for h in hosts:
        driver.start(h)
    done = False
    try:
        task.resume()
        done = True
    finally:
        if not done:
            task.abort(kill=True)


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


    pkg = Path(afddiag.__file__).resolve().parent
    files: list[tuple[Path, str]] = []

    def tree(src: Path, arc: str) -> None:
        for p in sorted(src.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".so"):
                files.append((p, f"{arc}/{p.relative_to(src).as_posix()}"))

    tree(pkg, "afddiag")
    for sub in ("checks", "playbooks"):
        src = data_dir(sub)  # installed beside the package, or the source tree's (an editable install)
        if src is None:
            raise ImportError(f"afddiag.{sub} is not a directory here (run from a zipapp?): "
                              "build the zipapp from an install")
        if src.resolve() != (pkg / sub).resolve():
            tree(src, f"afddiag/{sub}")
    for mod in VENDORED:
        spec = importlib.util.find_spec(mod)
        if spec is None:
            raise ImportError(f"{mod} is not installed here: it is vendored into the zipapp")
        if spec.submodule_search_locations:
            tree(Path(list(spec.submodule_search_locations)[0]), mod)
        elif spec.origin:
            files.append((Path(spec.origin), Path(spec.origin).name))
        else:
            raise ImportError(f"{mod} has no source file here (built in?): it is vendored into the zipapp")
    main = "import sys\nfrom afddiag.cli import main\nmain()\n"
    Path(dest).parent.mkdir(parents=True, exist_ok=True)

    with atomic_write(dest, binary=True, mode=0o755) as f:
        f.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as z:
            # the same afddiag makes the same bytes (the name on the hosts is their sha256): fixed times
            for arc, data in [("__main__.py", main.encode())] + [(a, p.read_bytes()) for p, a in files]:
                z.writestr(zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
    return dest
