"""Fuzz targets over afddiag's parsers, shared by ``tests/test_fuzz.py`` (a CI-sized run) and
``tests/fuzz/run_fuzz.py`` (a long standalone run).

Each target takes ``bytes`` and checks afddiag's promise on that input: never a traceback, always
facts and verdicts (or, for what a user gives on the command line, a clear one-line usage error).
A broken promise raises :class:`Finding`; anything else a target raises is a crash too.

Targets:
  ip_addr      ``ip -j addr`` JSON → ``netlink.parse_ip_addr_json`` (list or ValueError), then the
               fabric gates on a sysfs tree with those addresses
  rdma_dev     ``rdma -j dev show`` JSON → ``netlink.parse_rdma_dev_json`` (list or ValueError)
  env          ``envvars.parse_env_file`` (never raises) and ``parse_launch_env`` (dict or
               LaunchEnvError naming the file and line), the device map and NCCL_IB_HCA parsers,
               then the fabric gates with that environment
  gpu          ``gpu.json`` → ``facts.gpu_facts_from_readings`` (never raises), then the GPU gates
  sysfs        a JSON list of edits to a real case's sysfs tree (replace a file's bytes, truncate,
               delete, make a directory, rename with spaces/unicode, inject EINVAL/EACCES/EIO on
               read) → ``fabric.probe_fabric`` with an injecting ``reader``, then the fabric gates
  snapshot     a JSON list of edits to a whole real case folder (sysfs and its JSON/env files) →
               ``afddiag all --json --snapshot`` through the CLI in-process: exit 0-3 with a JSON
               report on stdout, or 64 with one line on stderr
  pair_server  what a client sends to ``afddiag fabric --serve`` over loopback TCP (a fake RDMA rail):
               the server ends by its deadline, names every bad field, frees and caps what a session
               holds (``pairfuzz.py``)
  merge        a real per-host report with its types mutated (a gate without id, a list where a dict
               is expected, NaN, huge numbers, odd strings) → ``afddiag merge`` beside a healthy
               report, as JSON, table (plain and rich) and HTML: exit 0-3, never a traceback; the
               healthy host is judged; the mutant is judged or is an ERROR row naming its problem; the
               exit code is never lower than the accepted reports' own gates imply
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pairfuzz

REPO = Path(__file__).resolve().parents[2]


def find_cases() -> Path:
    """The shared cases, found from this file (never the working directory): ``$AFDDIAG_CASES``, else
    ``shared/cases`` beside this clone, else beside the main checkout of a git worktree (``.git`` is
    then a file naming ``<main>/.git/worktrees/<name>``). The first candidate when none exists."""
    if os.environ.get("AFDDIAG_CASES"):
        return Path(os.environ["AFDDIAG_CASES"])
    candidates = [REPO.parent / "shared" / "cases"]
    git = REPO / ".git"
    if git.is_file():
        line = git.read_text(errors="replace").strip()
        if line.startswith("gitdir:"):
            common = Path(line[7:].strip()).resolve().parents[1]  # <main>/.git
            candidates.append(common.parent.parent / "shared" / "cases")
    return next((c for c in candidates if c.is_dir()), candidates[0])


CASES = find_cases()
CORPUS = Path(__file__).resolve().parent / "corpus"
BASE_FABRIC_CASE = "01-spark-fabric-ip-on-nonfirst-device"
BASE_GPU_CASE = "01-gb10-healthy-unified-memory"
VERDICTS = {"PASS", "WARN", "FAIL", "SKIP", "ERROR"}
FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # trees are written per input: use RAM
ERRNOS = {"EINVAL": errno.EINVAL, "EACCES": errno.EACCES, "EIO": errno.EIO, "ENOENT": errno.ENOENT,
          "ENODATA": errno.ENODATA, "EPERM": errno.EPERM}
ROLES = (None, "coordinator", "expert")
ODD_NAMES = ["mlx5 0", "rxe\u00e9", "dev\u2028x", "\u03bcdev", "a" * 200, "-", "0", "..x", "\U0001f600"]


class Finding(AssertionError):
    """An input on which afddiag broke its promise (the message says which)."""


# ---------------------------------------------------------------------------------------------
# checks shared by the targets


def _check_verdicts(verdicts: list) -> None:
    for v in verdicts:
        if v.verdict not in VERDICTS:
            raise Finding(f"{v.id}: verdict {v.verdict!r}")
        if v.verdict == "ERROR" and "gate failed on these facts" in v.summary:
            raise Finding(f"{v.id} raised inside the gate: {v.summary}")
        if not isinstance(v.summary, str) or not v.summary:
            raise Finding(f"{v.id}: empty summary")


def _render(verdicts: list, fabric=None, gpu=None) -> None:
    """The JSON report must build and serialise (the reporter's half of the promise)."""
    from afddiag import report

    rep = report.build(verdicts, "fuzz", "fuzz", {}, fabric, [], {"fabric": fabric, "gpu": gpu})
    json.dumps(rep, default=str)
    report.write_table(rep, io.StringIO())


def _gates(obs, families: set[str], fabric_ip: str | None = None, inputs=None) -> list:
    from afddiag.gates import Context, resolve_fabric_ip, run_gates
    from afddiag.model.run import Inputs

    inputs = inputs or Inputs(fabric_ip=fabric_ip, peers=["10.0.0.9"])
    verdicts = run_gates(Context(obs, inputs, resolve_fabric_ip(obs.fabric, inputs.fabric_ip)), families)
    _check_verdicts(verdicts)
    _render(verdicts, obs.fabric, obs.gpu)
    return verdicts


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None


# ---------------------------------------------------------------------------------------------
# targets


def target_ip_addr(data: bytes) -> None:
    """``ip -j addr`` output: parsed into netdevs or ValueError, then judged with a real sysfs tree."""
    from afddiag.model.fabric import QpFacts
    from afddiag.model.run import Observation
    from afddiag.probes.fabric import probe_fabric
    from afddiag.probes.netlink import parse_ip_addr_json

    raw = _json_or_none(data)
    try:
        addrs = parse_ip_addr_json(raw)
    except ValueError:
        return
    if not isinstance(addrs, dict):
        raise Finding(f"parse_ip_addr_json returned {type(addrs).__name__}")
    fab = probe_fabric(str(CASES / "fabric" / BASE_FABRIC_CASE), None, None, addrs, "ip-addr.json")
    obs = Observation(host="fuzz", source="fuzz", fabric=fab, qp=QpFacts(why="fuzz"), env={})
    _gates(obs, {"fabric"}, "192.168.100.10")
    _gates(obs, {"fabric"}, None)


def target_rdma_dev(data: bytes) -> None:
    """``rdma -j dev show`` output: ``[(name, index)]`` sorted by index, or ValueError."""
    from afddiag.probes.netlink import parse_rdma_dev_json

    raw = _json_or_none(data)
    try:
        rows = parse_rdma_dev_json(raw)
    except ValueError:
        return
    if not all(isinstance(n, str) and isinstance(i, int) for n, i in rows):
        raise Finding(f"parse_rdma_dev_json rows not (str, int): {rows[:3]!r}")
    if [i for _, i in rows] != sorted(i for _, i in rows):
        raise Finding("parse_rdma_dev_json rows not in index order")


def target_env(data: bytes) -> None:
    """A snapshot ``env`` and a ``--launch-env`` file: the lenient parser never raises, the strict one
    raises only LaunchEnvError (one line naming the file and line); the values feed the fabric gates."""
    from afddiag.envvars import (
        MAP_VAR,
        NCCL_HCA_VAR,
        LaunchEnvError,
        parse_device_map,
        parse_env_file,
        parse_launch_env,
        parse_nccl_hca,
    )
    from afddiag.model.fabric import QpFacts
    from afddiag.model.run import Inputs, Observation
    from afddiag.probes.fabric import probe_fabric

    text = data.decode("utf-8", errors="replace")
    env = parse_env_file(text)
    if not isinstance(env, dict):
        raise Finding("parse_env_file did not return a dict")
    launch = None
    try:
        launch = parse_launch_env(text, "fuzz.env", {"SITE_IP": "AFD_FABRIC_IP"})
    except LaunchEnvError as e:
        msg = str(e)
        if "\n" in msg or "fuzz.env" not in msg:
            raise Finding(f"LaunchEnvError is not one line naming the file: {msg!r}") from None
    for v in env.values():
        parse_device_map(v)
        with contextlib.suppress(ValueError):
            parse_nccl_hca(v)
    fab = probe_fabric(str(CASES / "fabric" / BASE_FABRIC_CASE))
    watched = {k: v for k, v in env.items() if k in (MAP_VAR, NCCL_HCA_VAR, "NCCL_IB_GID_INDEX")}
    obs = Observation(host="fuzz", source="fuzz", fabric=fab, qp=QpFacts(why="fuzz"), env=watched)
    fip = (launch or {}).get("AFD_FABRIC_IP") or "192.168.100.10"
    _gates(obs, {"fabric", "launch"}, inputs=Inputs(fabric_ip=fip, launch_env=launch, launch_env_path="fuzz.env"))


def target_gpu(data: bytes) -> None:
    """``gpu.json``: facts from anything JSON (never raises), then every GPU gate judges them."""
    from afddiag import playbook
    from afddiag.model.gpu import gpu_facts_from_readings
    from afddiag.model.run import Inputs, Observation

    raw = _json_or_none(data)
    facts = gpu_facts_from_readings(raw)
    obs = Observation(host="fuzz", source="fuzz", gpu=facts)
    for role in ROLES:  # the roles' GPU model, memory reservation and load expectations reach more code
        _gates(obs, {"gpu"}, inputs=Inputs(playbook=playbook.load(role) if role else None, expect_sm=132))


def _apply_edits(root: Path, edits: list) -> dict[str, str]:
    """Apply sysfs/snapshot edits under ``root``; returns ``{path: errno name}`` for read errors to inject.

    Each edit is ``[op, index, arg]``: ``index`` picks a file (modulo the list of files, sorted);
    ops: ``bytes`` (replace the content with ``arg``, latin-1 text), ``truncate`` (keep ``arg``
    bytes), ``delete``, ``dir`` (replace the file by an empty directory), ``rename`` (give the
    file's parent directory the odd name ``ODD_NAMES[arg]``), ``errno`` (reading it fails with
    ``arg``), ``dup`` (copy a device directory ``arg`` times under new names).
    """
    inject: dict[str, str] = {}
    for edit in edits if isinstance(edits, list) else []:
        if not (isinstance(edit, list) and len(edit) == 3 and isinstance(edit[0], str) and isinstance(edit[1], int)):
            continue
        op, idx, arg = edit
        files = sorted(p for p in root.rglob("*") if p.is_file())
        if not files:
            return inject
        f = files[idx % len(files)]
        if op == "bytes" and isinstance(arg, str):
            f.write_bytes(arg.encode("latin-1", errors="replace"))
        elif op == "truncate" and isinstance(arg, int):
            f.write_bytes(f.read_bytes()[: max(0, arg)])
        elif op == "delete":
            f.unlink()
        elif op == "dir":
            f.unlink()
            f.mkdir()
        elif op == "rename" and isinstance(arg, int):
            parent = f.parent
            if parent != root and parent.parent.exists():
                new = parent.parent / ODD_NAMES[arg % len(ODD_NAMES)]
                if not new.exists():
                    parent.rename(new)
        elif op == "errno" and isinstance(arg, str) and arg in ERRNOS:
            inject[str(f)] = arg
        elif op == "dup" and isinstance(arg, int):
            ib = root / "sys" / "class" / "infiniband"
            devs = sorted(p for p in ib.iterdir()) if ib.is_dir() else []
            if devs:
                src = devs[idx % len(devs)]
                for k in range(min(max(arg, 0), 50)):
                    dst = ib / f"{src.name}_{k}"
                    if not dst.exists() and not src.is_symlink():
                        shutil.copytree(src, dst, symlinks=True)
    return inject


def _injecting_reader(inject: dict[str, str]) -> Callable[[str], str]:
    from afddiag.probes.sysfs import read_text

    def read(path: str) -> str:
        name = inject.get(path)
        if name:
            raise OSError(ERRNOS[name], os.strerror(ERRNOS[name]), path)
        return read_text(path)

    return read


def _edits(data: bytes) -> list:
    raw = _json_or_none(data)
    return raw if isinstance(raw, list) else []


def target_sysfs(data: bytes) -> None:
    """Edits to a real case's sysfs tree → ``probe_fabric`` (never raises) → the fabric gates."""
    from afddiag.model.fabric import FabricFacts, QpFacts
    from afddiag.model.run import Observation
    from afddiag.probes.fabric import probe_fabric
    from afddiag.probes.netlink import parse_rdma_dev_json

    base = CASES / "fabric" / BASE_FABRIC_CASE
    with tempfile.TemporaryDirectory(prefix="afddiag-fuzz-", dir=FAST_TMP) as tmp:
        root = Path(tmp) / "case"
        shutil.copytree(base / "sys", root / "sys", symlinks=True)
        inject = _apply_edits(root, _edits(data))
        order = parse_rdma_dev_json(json.loads((base / "rdma-dev.json").read_text()))
        fab = probe_fabric(str(root), order, "rdma-dev.json", None, None, reader=_injecting_reader(inject))
        if not isinstance(fab, FabricFacts):
            raise Finding("probe_fabric did not return FabricFacts")
        obs = Observation(host="fuzz", source="fuzz", fabric=fab, qp=QpFacts(why="fuzz"), env={})
        _gates(obs, {"fabric"}, "192.168.100.10")


def target_snapshot(data: bytes) -> None:
    """Edits to a whole case folder → ``afddiag all --json --snapshot`` in-process: exit 0-3 and a JSON
    report, or exit 64 and one stderr line; never a traceback."""
    from afddiag import cli

    with tempfile.TemporaryDirectory(prefix="afddiag-fuzz-", dir=FAST_TMP) as tmp:
        root = Path(tmp) / "case"
        shutil.copytree(CASES / "fabric" / BASE_FABRIC_CASE, root, symlinks=True)
        shutil.copy(CASES / "gpu" / BASE_GPU_CASE / "gpu.json", root / "gpu.json")
        (root / "env").write_text("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1\n")
        _apply_edits(root, _edits(data))  # read errors cannot be injected through the CLI: edits only
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.run(["all", "--json", "--snapshot", str(root), "--fabric-ip", "192.168.100.10", "--timeout", "20"])
        if rc == 64:
            lines = err.getvalue().strip().splitlines()
            if not lines or not lines[0].startswith("afddiag:"):
                raise Finding(f"usage error without a one-line message: {err.getvalue()!r}")
            return
        if rc not in (0, 1, 2, 3):
            raise Finding(f"exit code {rc!r}; stderr {err.getvalue()[-500:]!r}")
        rep = json.loads(out.getvalue())
        for g in rep["gates"]:
            if g["verdict"] == "ERROR" and "gate failed on these facts" in g["summary"]:
                raise Finding(f"{g['id']} raised inside the gate: {g['summary']}")


def _cli_promise(argv: list[str]) -> int:
    """``afddiag argv`` in-process: exit 0-3, or 64 with a one-line ``afddiag:`` message; never a traceback."""
    from afddiag import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.run(argv)
    e = err.getvalue()
    if "Traceback" in e:
        raise Finding(f"traceback on stderr: {e[-500:]!r}")
    if rc == 64:
        lines = e.strip().splitlines()
        if not lines or not lines[0].startswith("afddiag:") or len(lines) > 2:
            raise Finding(f"usage error without a one-line message: {e[-500:]!r}")
    elif rc not in (0, 1, 2, 3):
        raise Finding(f"exit code {rc!r}; stderr {e[-500:]!r}")
    return rc


_BUNDLE: list[bytes] = []


def base_bundle() -> bytes:
    """A real capture-format bundle of the base fabric case plus a GPU reading (built once)."""
    if not _BUNDLE:
        from afddiag.bundle import write_tar_gz

        files = {}
        for d, _, names in os.walk(CASES / "fabric" / BASE_FABRIC_CASE):
            for n in names:
                p = Path(d) / n
                files[str(p.relative_to(CASES / "fabric" / BASE_FABRIC_CASE))] = p.read_bytes()
        files["gpu.json"] = (CASES / "gpu" / BASE_GPU_CASE / "gpu.json").read_bytes()
        with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
            _BUNDLE.append(write_tar_gz(Path(tmp) / "b.tar.gz", files, top="afddiag-capture-h").read_bytes())
    return _BUNDLE[0]


def _no_leftovers(tmpdir: str) -> None:
    left = os.listdir(tmpdir)
    if left:
        raise Finding(f"temporary tree left behind: {left[:3]}")


def target_bundle(data: bytes) -> None:
    """Bytes of a ``.tar.gz`` (byte flips of a real capture) → ``afddiag all --snapshot X.tar.gz``:
    the promise of the CLI, and no ``afddiag-bundle-*`` left in TMPDIR."""
    with tempfile.TemporaryDirectory(prefix="afddiag-fuzz-", dir=FAST_TMP) as tmp:
        b = Path(tmp) / "x.tar.gz"
        b.write_bytes(data)
        t = Path(tmp) / "t"
        t.mkdir()
        old = tempfile.tempdir
        tempfile.tempdir = str(t)
        try:
            _cli_promise(["all", "--json", "--no-history", "--snapshot", str(b), "--timeout", "20"])
        finally:
            tempfile.tempdir = old
        _no_leftovers(str(t))


def target_tar(data: bytes) -> None:
    """A JSON list of hostile tar members ``[name, type, size, data, long]`` (types: file, dir, sym,
    lnk, chr, fifo; sizes that lie; GNU long names) → a .tar.gz → :func:`target_bundle`."""
    import tarfile

    spec = _json_or_none(data)
    if not isinstance(spec, list):
        spec = []
    buf = io.BytesIO()
    kinds = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "lnk": tarfile.LNKTYPE,
             "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as tar:
        for m in spec[:200]:
            if not isinstance(m, list) or len(m) < 2:
                continue
            name = str(m[0])[:5000] or "x"
            ti = tarfile.TarInfo(name)
            ti.type = kinds.get(str(m[1]), tarfile.REGTYPE)
            body = str(m[3] if len(m) > 3 else "").encode("utf-8", "replace")[:100000]
            ti.size = len(body) if ti.type == tarfile.REGTYPE else 0
            if ti.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                ti.linkname = str(m[2]) if len(m) > 2 else "/etc/passwd"
            try:
                tar.addfile(ti, io.BytesIO(body) if ti.type == tarfile.REGTYPE else None)
            except (ValueError, OverflowError, UnicodeError):
                continue
    target_bundle(buf.getvalue())


def target_nested(data: bytes) -> None:
    """Bytes as one snapshot JSON part (the first byte picks which) and as a merge input: deep
    nesting, huge numbers, odd UTF-8 → the bounded reader; the CLI keeps its promise."""
    parts = ["gpu.json", "rdma-dev.json", "ip-addr.json", "limits.json", "image.json", "versions.json",
             "ip-route-get.json", "cpu.json", "case.json"]
    part = parts[data[0] % len(parts)] if data else parts[0]
    body = data[1:]
    with tempfile.TemporaryDirectory(prefix="afddiag-fuzz-", dir=FAST_TMP) as tmp:
        root = Path(tmp) / "case"
        shutil.copytree(CASES / "fabric" / BASE_FABRIC_CASE, root, symlinks=True)
        (root / part).write_bytes(body)
        _cli_promise(["all", "--json", "--no-history", "--snapshot", str(root), "--peer", "10.0.0.9",
                      "--timeout", "20"])
        m = Path(tmp) / "merge.json"
        m.write_bytes(body)
        _cli_promise(["merge", "--json", str(m)])


def target_inventory(data: bytes) -> None:
    """Bytes as a fleet inventory → ``load_inventory``: an Inventory or InventoryError naming the
    file, never another exception; then ``afddiag merge --inventory`` keeps the CLI's promise."""
    from afddiag.fleet import InventoryError, load_inventory

    with tempfile.TemporaryDirectory(prefix="afddiag-fuzz-", dir=FAST_TMP) as tmp:
        inv = Path(tmp) / "inv.toml"
        inv.write_bytes(data)
        try:
            load_inventory(str(inv))
        except InventoryError as e:
            if str(inv) not in str(e) or "\n" in str(e):
                raise Finding(f"inventory error not one line naming the file: {e!r}") from e
        rep = Path(tmp) / "r.json"
        rep.write_text("[]")
        _cli_promise(["merge", "--json", "--inventory", str(inv), str(rep)])


_REPORTS: list[dict] = []


def base_reports() -> list[dict]:
    """Real per-host reports (``afddiag all --json`` of three fabric cases with a GPU reading and a
    launch env), built once per process."""
    if not _REPORTS:
        from afddiag.check import diagnose
        from afddiag.inputs import make_inputs

        with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
            env = Path(tmp) / "rank.env"
            env.write_text("AFD_ROLE=expert\nAFD_EXPERT_CAPACITY=256\nAFD_FABRIC_IP=192.168.100.11\n")
            for case in ("02-spark-map-set-healthy", BASE_FABRIC_CASE, "10-spark-mtu-1500-vs-peer-9000"):
                root = Path(tmp) / case
                shutil.copytree(CASES / "fabric" / case, root, symlinks=True)
                shutil.copy(CASES / "gpu" / BASE_GPU_CASE / "gpu.json", root / "gpu.json")
                le = str(env) if case.startswith("02-") else None
                inputs = make_inputs(snapshot=str(root), role="expert" if le else None, launch_env_path=le,
                                     peers=("192.168.100.10",))
                with contextlib.redirect_stderr(io.StringIO()):
                    _REPORTS.append(diagnose(inputs, {"fabric", "gpu", "host", "launch"})[0])
    return _REPORTS


def _worst_code(rep: Any) -> int:
    """The exit code a report's own gates imply (2 FAIL, 3 ERROR, 1 WARN, 0), whatever its exit_code says."""
    vs = {g.get("verdict") for g in rep.get("gates") or [] if isinstance(g, dict)} if isinstance(rep, dict) else set()
    return 2 if "FAIL" in vs else 3 if "ERROR" in vs else 1 if "WARN" in vs else 0


def target_merge(data: bytes) -> None:
    """A mutated report beside a healthy one → ``afddiag merge`` (JSON, plain and rich tables, HTML)."""
    from afddiag.fleet import judge, load_reports, write_fleet_table
    from afddiag.html import render

    good = dict(base_reports()[0], host="good-host")
    with tempfile.TemporaryDirectory(prefix="afddiag-fuzz-", dir=FAST_TMP) as tmp:
        g, b = Path(tmp) / "good.json", Path(tmp) / "bad.json"
        g.write_text(json.dumps(good))
        b.write_bytes(data)
        page = Path(tmp) / "fleet.html"
        rc = _cli_promise(["merge", "--json", str(g), str(b), "--html", str(page)])
        if rc == 64:
            return
        hosts = load_reports([str(g), str(b)])
        fr = judge(hosts)
        rows = {r["target"]: r for r in fr["hosts"]}
        if rows.get(str(g), {}).get("status") != "ok":
            raise Finding(f"the healthy report was not judged: {rows.get(str(g))!r}")
        for r in fr["hosts"]:
            if r["status"] != "ok" and (not isinstance(r["error"], str) or not r["error"] or "\n" in r["error"]):
                raise Finding(f"ERROR row without a one-line reason: {r!r}")
        want = max((_worst_code(h.report) for h in hosts if h.ok), default=0)
        if want == 2 and fr["exit_code"] != 2 or fr["exit_code"] < want:
            raise Finding(f"fleet exit {fr['exit_code']} though an accepted report's gates imply {want}")
        json.dumps(fr, allow_nan=False)
        write_fleet_table(fr, io.StringIO())
        write_fleet_table(fr, io.StringIO(), width=80)
        render(fr, {h.name: h.report for h in hosts if h.ok and h.report})


TARGETS: dict[str, Callable[[bytes], None]] = {
    "ip_addr": target_ip_addr,
    "rdma_dev": target_rdma_dev,
    "env": target_env,
    "gpu": target_gpu,
    "sysfs": target_sysfs,
    "snapshot": target_snapshot,
    "bundle": target_bundle,
    "tar": target_tar,
    "nested": target_nested,
    "inventory": target_inventory,
    "pair_server": pairfuzz.target_pair_server,
    "merge": target_merge,
}


# ---------------------------------------------------------------------------------------------
# inputs: seeds from the real cases, and a mutator


def seeds(target: str) -> list[bytes]:
    """Starting inputs of ``target``: the real cases' files of that kind, and the stored corpus."""
    out: list[bytes] = []
    fab, gpu = sorted((CASES / "fabric").iterdir()), sorted((CASES / "gpu").iterdir())
    if target == "ip_addr":
        out += [p.read_bytes() for c in fab if (p := c / "ip-addr.json").is_file()]
    elif target == "rdma_dev":
        out += [p.read_bytes() for c in fab if (p := c / "rdma-dev.json").is_file()]
    elif target == "env":
        out += [p.read_bytes() for c in fab if (p := c / "env").is_file()]
    elif target == "gpu":
        out += [p.read_bytes() for c in gpu if (p := c / "gpu.json").is_file()]
    elif target == "bundle":
        out.append(base_bundle())
    elif target == "tar":
        out += [json.dumps(x).encode() for x in (
            [["top/sys/x", "file", 0, "1"], ["top/" + "d/" * 40 + "f", "file", 0, "x"]],
            [["top/a", "sym", "/etc/passwd"], ["top/a/b", "file", 0, "x"]],
            [["../../escape", "file", 0, "x"], ["top/dev", "chr"], ["top/p", "fifo"], ["top/h", "lnk", "top/x"]],
            [["top/" + "n" * 3000, "file", 0, "x"], ["top/x", "file", 0, "1"], ["top/x", "file", 0, "2"]])]
    elif target == "nested":
        out += [bytes([i]) + b for i, b in enumerate([b"[" * 1000 + b"]" * 1000, b'{"a":' * 500 + b"1" + b"}" * 500,
                                                      b"9" * 5000, b'"\\ud800"', b"\xff\xfe", b"[1e999, -0.0]"])]
    elif target == "merge":
        out += [json.dumps(r).encode() for r in base_reports()]
        r = base_reports()[0]
        out += [json.dumps(x).encode() for x in (
            dict(r, gates=[{k: v for k, v in g.items() if k != "id"} for g in r["gates"]]),
            dict(r, facts=[r["facts"]]), dict(r, summary=[]), dict(r, counts={"PASS": float("nan")}),
            dict(r, exit_code=0, gates=[dict(g, verdict="FAIL") for g in r["gates"]]), dict(r, exit_code=None),
            dict(r, gates=[dict(g, id=["x"]) for g in r["gates"]]), dict(r, host=["spark"]),
            dict(r, inputs={"env": ["x"]}), dict(r, diagnosis={"gate": "x"}))]
    elif target == "inventory":
        out += [b"fleet = 5\n", b"host = 5\n", b'[expect]\nmtu = 4096.5\n[[host]]\nname = "a"\n',
                b'[fleet]\nconcurrency = "abc"\n[[host]]\nname = "a"\n', b'[[host]]\nname = "\xff"\n',
                b'[fleet]\ntimeout_s = 1e999\n[[host]]\nname = "a"\nfabric_ip = "1.2.3.4"\n']
    elif target == "pair_server":
        out += pairfuzz.seeds()
    else:
        out.append(b"[]")
    d = CORPUS / target
    if d.is_dir():
        out += [p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()]
    return out


def _mutate_json(obj: Any, rng: random.Random, depth: int = 0) -> Any:
    """Structure-aware mutation: swap a value's type, drop or duplicate a key or item, odd strings."""
    odd = [None, True, -1, 0, 2**63, 1e308, float("nan"), "", "NOT_SUPPORTED", "\u0000", "x" * 1000,
           [], {}, [None], {"": None}, rng.choice(ODD_NAMES)]
    if depth > 6 or rng.random() < 0.15:
        return rng.choice(odd)
    if isinstance(obj, dict) and obj:
        obj = dict(obj)
        k = rng.choice(list(obj))
        r = rng.random()
        if r < 0.2:
            del obj[k]
        elif r < 0.3:
            obj[rng.choice(ODD_NAMES)] = obj[k]
        else:
            obj[k] = _mutate_json(obj[k], rng, depth + 1)
        return obj
    if isinstance(obj, list) and obj:
        obj = list(obj)
        i = rng.randrange(len(obj))
        r = rng.random()
        if r < 0.2:
            del obj[i]
        elif r < 0.35:
            obj.extend([obj[i]] * rng.choice([1, 2, 50]))
        else:
            obj[i] = _mutate_json(obj[i], rng, depth + 1)
        return obj
    return rng.choice(odd)


def _mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.25 and b:
            del b[rng.randrange(len(b)):]  # truncate
        elif r < 0.5 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif r < 0.75:
            b[rng.randrange(len(b) + 1):0] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif b:
            i = rng.randrange(len(b))
            b[i:i] = b[i: i + rng.randint(1, 64)]  # duplicate a chunk
    return bytes(b)


def _random_edits(rng: random.Random, snapshot: bool) -> list:
    ops = ["bytes", "truncate", "delete", "dir", "rename", "errno", "dup"]
    contents = ["", "\x00\xff\xfe", "4: ACTIVE", "1: DOWN", "RoCE v2", "IB/RoCE v1", "9000", "-1",
                "0000:0000:0000:0000:0000:ffff:c0a8:640a", "fe80::1", "\u00e9\u00e9", "x" * 5000, "1: \n2:",
                "[{\"ifname\": 1}]", "{}", "null", "[", "export = \"", "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP==,=x"]
    edits = []
    for _ in range(rng.randint(1, 6)):
        op = rng.choice(ops)
        arg: Any = {"bytes": rng.choice(contents), "truncate": rng.randint(0, 40), "delete": 0, "dir": 0,
                    "rename": rng.randrange(len(ODD_NAMES)), "errno": rng.choice(list(ERRNOS)),
                    "dup": rng.choice([1, 3, 20])}[op]
        edits.append([op, rng.randrange(10000), arg])
    return edits


def mutate(target: str, data: bytes, rng: random.Random) -> bytes:
    """One new input for ``target`` derived from ``data``."""
    if target in ("sysfs", "snapshot"):
        base = _edits(data)
        if rng.random() < 0.5 or not base:
            return json.dumps(base + _random_edits(rng, target == "snapshot")).encode()
        return json.dumps(_random_edits(rng, target == "snapshot")).encode()
    if target == "nested" and rng.random() < 0.3:
        depth = rng.choice([63, 64, 65, 200, 5000])
        nested = b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a":' * depth + b"0" + b"}" * depth
        return bytes([rng.randrange(9)]) + nested
    if target == "tar" and rng.random() < 0.7:
        raw = _json_or_none(data)
        if isinstance(raw, list):
            return json.dumps(_mutate_json(raw, rng)).encode()
    if target == "merge" and rng.random() < 0.9:
        raw = _json_or_none(data)
        if isinstance(raw, dict):
            for _ in range(rng.randint(1, 4)):
                raw = _mutate_json(raw, rng)
            return json.dumps(raw).encode()
    if target in ("ip_addr", "rdma_dev", "gpu", "pair_server") and rng.random() < 0.7:
        raw = _json_or_none(data)
        if raw is not None:
            return json.dumps(_mutate_json(raw, rng)).encode()
    return _mutate_bytes(data, rng)


def run_one(target: str, data: bytes) -> str | None:
    """Run ``target`` on ``data``: None when afddiag kept its promise, else the finding (one line)."""
    try:
        TARGETS[target](data)
    except Finding as e:
        return f"finding: {e}"
    except RecursionError as e:
        return f"crash: RecursionError: {e}"
    except Exception as e:  # noqa: BLE001 - every other exception is a crash
        import traceback

        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "afddiag" in f.filename), "?")
        return f"crash: {type(e).__name__} at {where}: {e}"
    return None


def save(target: str, data: bytes, tag: str = "crash") -> Path:
    """Keep ``data`` in the corpus (``tests/fuzz/corpus/<target>/<tag>-<hash>``)."""
    import hashlib

    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{tag}-{hashlib.sha1(data).hexdigest()[:12]}"
    p.write_bytes(data)
    return p
