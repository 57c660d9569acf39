"""What every lab guest script shares: logging, helper commands, the incident host and an in-process
afddiag run. Imported by lab/run-scenario.py and the lab/scenario-*.py scripts (run as root in the
guest, `python lab/<script>.py OUTDIR`: starting a process under QEMU's emulation costs seconds, so
a script is one Python process that runs afddiag in-process).

The incident host (:func:`build`)::

    host side                                   netns "peer"
    va (no IPv4, fe80 only) -- rxe zrxe0 <==veth==> vb (up, no address)
    vc 10.9.0.2/24          -- rxe arxe1 <==veth==> vd 10.9.0.1/24

``zrxe0`` is created first, so it has the lowest kernel device index and libibverbs enumerates it
first, although its name sorts after ``arxe1``. The peer needs no rxe device: RTR only resolves the
peer's address (ARP); it does not talk to a remote QP.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

MAP_VAR = "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP"
FABRIC_IP = "10.9.0.2"
PEER_IP = "10.9.0.1"
FIRST_DEV = "zrxe0"  # created first: lowest index, sorts last by name
SECOND_DEV = "arxe1"
UNCHANGED = object()

T0 = time.monotonic()
LOG: list[str] = []


def log(msg: str) -> None:
    """One timestamped line (seconds since start, pid) to stderr and to :data:`LOG`."""
    line = f"[{time.monotonic() - T0:7.2f}s] [{os.getpid()}] {msg}"
    LOG.append(line)
    print(line, file=sys.stderr, flush=True)


def sh(args: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run one helper command, log it, and raise RuntimeError on failure when ``check``."""
    t = time.monotonic()
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120)
    log(f"$ {' '.join(args)} -> rc {p.returncode} ({time.monotonic() - t:.2f}s)"
        + (f"\n  stderr: {p.stderr.strip()}" if p.stderr.strip() else ""))
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (rc {p.returncode}): {p.stderr.strip()}")
    return p


def sh_json(args: list[str]) -> object:
    """A command's JSON output (``rdma -j``, ``ip -j``), or what it printed when that is not JSON."""
    p = sh(args, check=False)
    try:
        return json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        return {"unparsed": p.stdout, "stderr": p.stderr, "rc": p.returncode}


def capture_resources(results: dict, kinds: tuple[str, ...], tag: str = "after_runs") -> None:
    """``rdma -j resource show <kind>`` for each of ``kinds`` and the whole ``rdma -j resource show``
    into ``results["captures"]["resource_<kind>_<tag>"]`` and ``["resource_<tag>"]``: what is left
    behind (every QP, PD, MR afddiag made must be gone)."""
    for kind in kinds:
        results["captures"][f"resource_{kind}_{tag}"] = sh_json(["rdma", "-j", "resource", "show", kind])
    results["captures"][f"resource_{tag}"] = sh_json(["rdma", "-j", "resource", "show"])


def read(path: str) -> str | None:
    """A sysfs attribute as stripped text, or None when it cannot be read."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def port_gids(dev: str, port: int = 1) -> list[tuple[int, str, str | None]]:
    """Populated (index, gid, type) of one port; empty slots skipped (their type read fails)."""
    base = f"/sys/class/infiniband/{dev}/ports/{port}"
    out = []
    try:
        n = len(os.listdir(f"{base}/gids"))
    except OSError:
        return out
    for i in range(n):
        g = read(f"{base}/gids/{i}")
        if not g or all(c in "0:" for c in g):
            continue
        out.append((i, g, read(f"{base}/gid_attrs/types/{i}")))
    return out


def build() -> None:
    """The incident host (module docstring): two veth pairs, the peer namespace, two rxe devices."""
    sh(["modprobe", "-a", "rdma_rxe", "rdma_ucm"])  # rdma_ucm: /dev/infiniband/rdma_cm, as on a real host
    sh(["ip", "netns", "add", "peer"])
    sh(["ip", "-batch", "-"], stdin="\n".join([
        "link set lo up",
        "link add va type veth peer name vb",
        "link add vc type veth peer name vd",
        "link set vb netns peer",
        "link set vd netns peer",
        "link set va up",
        f"addr add {FABRIC_IP}/24 dev vc",
        "link set vc up",
    ]) + "\n")
    sh(["ip", "-n", "peer", "-batch", "-"], stdin="\n".join([
        "link set lo up",
        "link set vb up",
        f"addr add {PEER_IP}/24 dev vd",
        "link set vd up",
    ]) + "\n")
    # Order matters: the first one created gets the lowest device index.
    sh(["rdma", "link", "add", FIRST_DEV, "type", "rxe", "netdev", "va"])
    sh(["rdma", "link", "add", SECOND_DEV, "type", "rxe", "netdev", "vc"])


def wait_ready(timeout_s: float = 60.0) -> dict:
    """Wait until both ports are ACTIVE, arxe1 has the RoCE v2 GID of 10.9.0.2 and zrxe0 has a
    RoCE v2 GID (its fe80 one). Returns the GID tables seen and ``ready``."""
    want = "0000:0000:0000:0000:0000:ffff:0a09:0002"
    deadline = time.monotonic() + timeout_s
    while True:
        a = port_gids(SECOND_DEV)
        z = port_gids(FIRST_DEV)
        states = {d: read(f"/sys/class/infiniband/{d}/ports/1/state") for d in (FIRST_DEV, SECOND_DEV)}
        ok = (
            all(s and "ACTIVE" in s for s in states.values())
            and any(g == want and t == "RoCE v2" for _, g, t in a)
            and any(t == "RoCE v2" for _, _, t in z)
        )
        if ok or time.monotonic() > deadline:
            seen = {"states": states, FIRST_DEV: z, SECOND_DEV: a, "ready": ok}
            log(f"ready={ok}: {json.dumps(seen)}")
            return seen
        time.sleep(0.5)


def teardown() -> None:
    """Remove the incident host: both rxe devices, the namespace, the veths."""
    for dev in (SECOND_DEV, FIRST_DEV):
        sh(["rdma", "link", "delete", dev], check=False)
    sh(["ip", "netns", "del", "peer"], check=False)
    for nd in ("va", "vc"):  # gone with the namespace that held their peers, normally
        if os.path.exists(f"/sys/class/net/{nd}"):
            sh(["ip", "link", "del", nd], check=False)


def finish(outdir: str, results: dict) -> None:
    """The end of every guest script: ``elapsed_s`` set, OUTDIR/results.json and OUTDIR/run.log written."""
    results["elapsed_s"] = round(time.monotonic() - T0, 3)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(results, f, indent=2, default=str)
    with open(os.path.join(outdir, "run.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    log(f"done in {results['elapsed_s']}s; results in {outdir}")


def run_cli(name: str, args: list[str], env_map: object = UNCHANGED) -> dict:
    """afddiag's CLI in this process (``afddiag.cli.run``): exit code, parsed JSON, output, timing.
    ``env_map`` sets (str) or unsets (None) the device map in the environment first."""
    if env_map is None:
        os.environ.pop(MAP_VAR, None)
    elif env_map is not UNCHANGED:
        os.environ[MAP_VAR] = str(env_map)
    out, err = io.StringIO(), io.StringIO()
    t = time.monotonic()
    rc, exc = None, None
    try:
        import afddiag.cli as cli

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.run(list(args))
    except Exception:
        exc = traceback.format_exc()
    elapsed = time.monotonic() - t
    text = out.getvalue()
    try:
        parsed = json.loads(text) if text.strip().startswith(("{", "[")) else None
    except ValueError:
        parsed = None
    log(f"afddiag {name}: rc={rc} in {elapsed:.2f}s" + (f"\n{exc}" if exc else ""))
    return {"name": name, "args": list(args), "map": None if env_map is UNCHANGED else env_map, "rc": rc,
            "elapsed_s": round(elapsed, 3), "json": parsed, "stdout": None if parsed is not None else text[-4000:],
            "stderr": err.getvalue()[-4000:], "exception": exc}


# ---------------------------------------------------------------- namespace hosts (Linux ≥ 6.x rxe)

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
_MS_REC, _MS_SLAVE, _MNT_DETACH = 0x4000, 0x80000, 2


def enter_netns(ns: str) -> None:
    """Move this process into network namespace ``ns`` (/run/netns/<ns>) as ``ip netns exec`` does: also a
    private mount namespace with sysfs mounted again, so /sys/class/net shows that namespace's netdevs,
    and a UTS namespace whose hostname is ``ns`` (reports name their host). Raises OSError naming the call
    that failed."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({ns})")
    finally:
        os.close(fd)
    if libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rslave /")
    libc.umount2(b"/sys", _MNT_DETACH)
    if libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None) != 0:
        raise OSError(ctypes.get_errno(), "mount sysfs")
    if libc.unshare(CLONE_NEWUTS) != 0 or libc.sethostname(ns.encode(), len(ns.encode())) != 0:
        raise OSError(ctypes.get_errno(), f"unshare(CLONE_NEWUTS) / sethostname({ns})")


def fork_in_netns(ns: str, outpath: str, fn, *args) -> int:
    """Fork; the child enters ``ns`` (:func:`enter_netns`), runs ``fn(*args)`` and writes its result (or
    the traceback under ``exception``) as JSON to ``outpath``, its log lines to ``outpath``.log. Returns
    the child's pid (collect it with :func:`join_forked`)."""
    pid = os.fork()
    if pid:
        return pid
    rc = 99
    try:
        enter_netns(ns)
        res = fn(*args)
        rc = 0
    except BaseException:
        res = {"exception": traceback.format_exc()}
    try:
        with open(outpath, "w") as f:
            json.dump(res, f, indent=2, default=str)
        with open(outpath + ".log", "w") as f:
            f.write("\n".join(LOG) + "\n")
    finally:
        os._exit(rc)


def join_forked(pid: int, outpath: str, timeout_s: float) -> dict:
    """Wait up to ``timeout_s`` for a :func:`fork_in_netns` child (killed past it) and return what it
    wrote, with ``child_exit`` added."""
    t = time.monotonic()
    code = None
    while time.monotonic() - t < timeout_s:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.2)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    try:
        with open(outpath) as f:
            res = json.load(f)
    except (OSError, ValueError) as e:
        res = {"exception": f"{outpath}: {e}"}
    res["child_exit"] = code
    return res


def wait_rocev2(want: dict[str, str], timeout_s: float = 60.0) -> dict:
    """Until every device of ``want`` (rxe device → IPv4 address) has port 1 ACTIVE and the RoCE v2 GID
    of its address among its first 16 slots. Returns per device ``{state, v4_rocev2_gid: [index...]}``
    and ``ready`` (False when ``timeout_s`` seconds passed first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen: dict = {}
        for dev, ip in want.items():
            base = f"/sys/class/infiniband/{dev}/ports/1"
            v4 = "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}".format(*(int(x) for x in ip.split(".")))
            idx = [i for i in range(16) if read(f"{base}/gids/{i}") == v4
                   and read(f"{base}/gid_attrs/types/{i}") == "RoCE v2"]
            seen[dev] = {"state": read(f"{base}/state"), "v4_rocev2_gid": idx}
        ok = all(s["v4_rocev2_gid"] and "ACTIVE" in (s["state"] or "") for s in seen.values())
        if ok or time.monotonic() > deadline:
            seen["ready"] = ok
            log(f"ready={ok}: {json.dumps(seen)}")
            return seen
        time.sleep(0.5)


def hw_counters() -> dict[str, dict[str, int]]:
    """Every RDMA device's port-1 hw_counters (/sys/class/infiniband/<dev>/ports/1/hw_counters/*) as
    integers: rxe's sent_pkts, rcvd_pkts, retry_exceeded_err, rcvd_seq_err, out_of_seq_request,
    link_downed, ... (all devices are visible in the RDMA subsystem's shared netns mode)."""
    out: dict[str, dict[str, int]] = {}
    base = "/sys/class/infiniband"
    for dev in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        d = f"{base}/{dev}/ports/1/hw_counters"
        vals = {}
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            v = read(f"{d}/{name}")
            if v is not None and v.lstrip("-").isdigit():
                vals[name] = int(v)
        out[dev] = vals
    return out


def counter_deltas(before: dict, after: dict) -> dict[str, dict[str, int]]:
    """``after - before`` per device and counter, non-zero deltas only."""
    return {dev: {k: v - before.get(dev, {}).get(k, 0) for k, v in vals.items()
                  if v != before.get(dev, {}).get(k, 0)} for dev, vals in after.items()}
