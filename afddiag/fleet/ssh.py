"""``afddiag fleet``'s collection: every host's ``afddiag all --json`` over SSH (asyncssh, host keys
always verified), bounded per host, with live progress; and the zipapp ``--push`` copies to hosts."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from dataclasses import dataclass
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
                res.error = (why or "not an afddiag report") + (f"; stderr: {err[-1][:200]}" if err else "")
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
            z.writestr("__main__.py", main)
            for p, arc in files:
                z.write(p, arc)
    return dest
