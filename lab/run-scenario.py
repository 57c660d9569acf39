#!/usr/bin/env python3
"""Build the incident host inside the lab VM and run afddiag against it (runs as root, in the VM).

Usage (inside the VM that lab/boot.sh starts): ``python lab/run-scenario.py OUTDIR``

Topology (one process, few helper processes: starting a process under QEMU without KVM is slow):

    host side                                   netns "peer"
    va (no IPv4, fe80 only) -- rxe zrxe0 <==veth==> vb (up, no address)
    vc 10.9.0.2/24          -- rxe arxe1 <==veth==> vd 10.9.0.1/24

``zrxe0`` is created first, so it has the lowest kernel device index and libibverbs enumerates it
first, although its name sorts after ``arxe1``. That is the incident: an engine that opens "the
first device" opens ``zrxe0``, whose only RoCE v2 GID is link-local, and RTR toward the peer's
IPv4 GID fails with EINVAL. The peer needs no rxe device: RTR only resolves the peer's address
(ARP), it does not talk to a remote QP.

Scenarios (each one ``afddiag all --json --fabric-ip 10.9.0.2 --peer 10.9.0.1``, in-process):
  no-map    DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP unset
  map       DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=10.9.0.2=arxe1
  peer-gone map set, 10.9.0.1 removed from the peer and the neighbour cache flushed (ETIMEDOUT)

Writes OUTDIR/<scenario>.json (afddiag's stdout), OUTDIR/results.json (exit codes, timings, direct
probe_qp results, captures of ``rdma -j dev``, ``ip -j addr``, ``rdma -j resource`` before and after
cleanup) and OUTDIR/run.log. Exit status 0 when every step ran (whatever the verdicts).
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
CLI_ARGS = ["all", "--json", "--fabric-ip", FABRIC_IP, "--peer", PEER_IP]

T0 = time.monotonic()
LOG: list[str] = []


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.2f}s] {msg}"
    LOG.append(line)
    print(line, file=sys.stderr, flush=True)


def sh(args: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run one helper command, log it, and raise on failure when ``check``."""
    t = time.monotonic()
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120)
    log(f"$ {' '.join(args)} -> rc {p.returncode} ({time.monotonic() - t:.2f}s)"
        + (f"\n  stderr: {p.stderr.strip()}" if p.stderr.strip() else ""))
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (rc {p.returncode}): {p.stderr.strip()}")
    return p


def sh_json(args: list[str]) -> object:
    p = sh(args, check=False)
    try:
        return json.loads(p.stdout) if p.stdout.strip() else None
    except ValueError:
        return {"unparsed": p.stdout, "stderr": p.stderr, "rc": p.returncode}


def read(path: str) -> str | None:
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


def wait_ready(timeout_s: float = 60.0) -> dict:
    """Wait until both ports are ACTIVE, arxe1 has the RoCE v2 GID of 10.9.0.2 and zrxe0 has a
    RoCE v2 GID (its fe80 one). Returns the GID tables seen."""
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


def build() -> None:
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


def run_cli(name: str, env_map: str | None) -> dict:
    """Run afddiag's CLI in this process; return exit code, parsed JSON and timing."""
    if env_map is None:
        os.environ.pop(MAP_VAR, None)
    else:
        os.environ[MAP_VAR] = env_map
    out = io.StringIO()
    err = io.StringIO()
    t = time.monotonic()
    rc: object = None
    exc_text = None
    try:
        import afddiag.cli as cli  # noqa: PLC0415 - the CLI may not exist yet

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                if hasattr(cli, "run"):  # returns the exit code, no sys.exit
                    rc = cli.run(list(CLI_ARGS))
                else:
                    cli.main(list(CLI_ARGS))
                    rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception:
        exc_text = traceback.format_exc()
    elapsed = time.monotonic() - t
    text = out.getvalue()
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = None
    log(f"afddiag {name}: rc={rc} in {elapsed:.2f}s" + (f"\n{exc_text}" if exc_text else ""))
    return {"name": name, "map": env_map, "rc": rc, "elapsed_s": round(elapsed, 3),
            "json": parsed, "stdout": None if parsed is not None else text,
            "stderr": err.getvalue()[-4000:], "exception": exc_text}


def run_direct(name: str) -> dict:
    """probe_fabric + probe_qp called directly (works without the CLI): the raw QP facts."""
    t = time.monotonic()
    try:
        from afddiag.facts import to_jsonable
        from afddiag.probes.qp import probe_qp

        fabric = None
        try:
            from afddiag.probes.netlink import device_order, netdev_addresses
            from afddiag.probes.sysfs import probe_fabric

            order, src, _notes = device_order()
            fabric = probe_fabric("/", order, src, netdev_addresses(), "netlink")
        except Exception:
            log("direct: fabric probe unavailable, building FabricFacts from sysfs here\n"
                + traceback.format_exc())
            fabric = fallback_fabric()
        qp = probe_qp(fabric, FABRIC_IP, [PEER_IP], timeout_s=10.0)
        res = {"order": [(d.name, d.index) for d in fabric.devices], "qp": to_jsonable(qp)}
    except Exception:
        res = {"exception": traceback.format_exc()}
    res["elapsed_s"] = round(time.monotonic() - t, 3)
    log(f"direct {name}: {json.dumps(res)[:2000]}")
    return res


def fallback_fabric():
    """Minimal FabricFacts from sysfs + ``rdma -j dev`` order, for when the sysfs probe is absent."""
    from afddiag.facts import FabricFacts, Gid, Port, RdmaDevice, ipv4_from_gid

    devs = sh_json(["rdma", "-j", "dev", "show"]) or []
    facts = FabricFacts(order_source="rdma-dev.json")
    for d in sorted(devs, key=lambda d: d.get("ifindex", 0)):
        name = d["ifname"]
        port = Port(num=1, state=(read(f"/sys/class/infiniband/{name}/ports/1/state") or "").split(": ")[-1])
        for i, g, t in port_gids(name):
            port.gids.append(Gid(index=i, gid=g, type=t, ipv4=ipv4_from_gid(g),
                                 netdev=read(f"/sys/class/infiniband/{name}/ports/1/gid_attrs/ndevs/{i}")))
        facts.devices.append(RdmaDevice(name=name, index=d.get("ifindex"), ports=[port]))
    return facts


def main() -> int:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-lab"
    os.makedirs(outdir, exist_ok=True)
    results: dict = {"pid": os.getpid(), "kernel": os.uname().release, "scenarios": {},
                     "direct": {}, "captures": {}, "errors": []}
    try:
        build()
        results["ready"] = wait_ready()
        results["captures"]["rdma_dev"] = sh_json(["rdma", "-j", "dev", "show"])
        results["captures"]["ip_addr"] = sh_json(["ip", "-j", "addr", "show"])
        results["captures"]["ip_addr_peer"] = sh_json(["ip", "-n", "peer", "-j", "addr", "show"])

        for name, env_map in (("no-map", None), ("map", f"{FABRIC_IP}={SECOND_DEV}")):
            results["scenarios"][name] = run_cli(name, env_map)
            results["direct"][name] = run_direct(name)

        # Peer address gone: no ARP reply any more. Flush the host's neighbour cache, or the entry
        # learnt in the previous scenarios would still resolve 10.9.0.1.
        sh(["ip", "-n", "peer", "addr", "del", f"{PEER_IP}/24", "dev", "vd"])
        sh(["ip", "neigh", "flush", "dev", "vc"])
        results["scenarios"]["peer-gone"] = run_cli("peer-gone", f"{FABRIC_IP}={SECOND_DEV}")
        results["direct"]["peer-gone"] = run_direct("peer-gone")
        os.environ.pop(MAP_VAR, None)

        # For the record: what one extra process costs here (why everything runs in-process).
        t = time.monotonic()
        p = sh([sys.executable, "-m", "afddiag", "--help"], check=False)
        results["subprocess_afddiag_help_s"] = round(time.monotonic() - t, 3)
        results["subprocess_afddiag_help_rc"] = p.returncode

        # Leftovers from this process, while the devices still exist.
        results["captures"]["resource_qp_after_runs"] = sh_json(["rdma", "-j", "resource", "show", "qp"])
        results["captures"]["resource_pd_after_runs"] = sh_json(["rdma", "-j", "resource", "show", "pd"])
        results["captures"]["resource_after_runs"] = sh_json(["rdma", "-j", "resource", "show"])
    except Exception:
        results["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        for dev in (SECOND_DEV, FIRST_DEV):
            sh(["rdma", "link", "delete", dev], check=False)
        sh(["ip", "netns", "del", "peer"], check=False)
        for nd in ("va", "vc"):  # gone with the namespace that held their peers, normally
            if os.path.exists(f"/sys/class/net/{nd}"):
                sh(["ip", "link", "del", nd], check=False)
        results["captures"]["resource_after_cleanup"] = sh_json(["rdma", "-j", "resource", "show"])
        results["captures"]["rdma_dev_after_cleanup"] = sh_json(["rdma", "-j", "dev", "show"])
        results["elapsed_s"] = round(time.monotonic() - T0, 3)
        for name, sc in results["scenarios"].items():
            with open(os.path.join(outdir, f"{name}.json"), "w") as f:
                json.dump({"rc": sc["rc"], "output": sc["json"]}, f, indent=2)
        with open(os.path.join(outdir, "results.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
        with open(os.path.join(outdir, "run.log"), "w") as f:
            f.write("\n".join(LOG) + "\n")
        log(f"done in {results['elapsed_s']}s; results in {outdir}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
