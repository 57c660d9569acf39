#!/usr/bin/env python3
"""Lab guest script for the capture round trip (runs as root inside the lab VM; see lab/README.md).

Usage (lab/boot.sh with ``AFDDIAG_LAB_SCRIPT=lab/scenario-capture.py``): ``python lab/scenario-capture.py OUTDIR``

Builds the incident host of lab/run-scenario.py (rxe ``zrxe0`` on va without IPv4, created first;
``arxe1`` on vc 10.9.0.2/24; the peer 10.9.0.1 in netns ``peer``), then, in this one process:

1. ``afddiag all --json --fabric-ip 10.9.0.2 --peer 10.9.0.1`` live (device map unset: the incident);
2. ``afddiag capture -o OUTDIR/capture.tar.gz`` (the bundle the host side replays);
3. ``afddiag fabric --no-qp --format prometheus --output OUTDIR/afddiag.prom``;
4. ``afddiag history --json``.

``SECRET_TOKEN`` is set in the environment to check that it does not leave the host;
``NCCL_SOCKET_IFNAME`` (allow-listed) to check that it does. Writes OUTDIR/results.json and run.log.
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

FABRIC_IP = "10.9.0.2"
PEER_IP = "10.9.0.1"
FIRST_DEV = "zrxe0"
SECOND_DEV = "arxe1"
T0 = time.monotonic()
LOG: list[str] = []


def log(msg: str) -> None:
    line = f"[{time.monotonic() - T0:7.2f}s] {msg}"
    LOG.append(line)
    print(line, file=sys.stderr, flush=True)


def sh(args: list[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    t = time.monotonic()
    p = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=120)
    log(f"$ {' '.join(args)} -> rc {p.returncode} ({time.monotonic() - t:.2f}s)"
        + (f"\n  stderr: {p.stderr.strip()}" if p.stderr.strip() else ""))
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (rc {p.returncode}): {p.stderr.strip()}")
    return p


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def build() -> None:
    """The incident host, as lab/run-scenario.py builds it (copied: that script is not importable)."""
    sh(["modprobe", "-a", "rdma_rxe", "rdma_ucm"])
    sh(["ip", "netns", "add", "peer"])
    sh(["ip", "-batch", "-"], stdin="\n".join([
        "link set lo up", "link add va type veth peer name vb", "link add vc type veth peer name vd",
        "link set vb netns peer", "link set vd netns peer", "link set va up",
        f"addr add {FABRIC_IP}/24 dev vc", "link set vc up"]) + "\n")
    sh(["ip", "-n", "peer", "-batch", "-"], stdin="\n".join([
        "link set lo up", "link set vb up", f"addr add {PEER_IP}/24 dev vd", "link set vd up"]) + "\n")
    sh(["rdma", "link", "add", FIRST_DEV, "type", "rxe", "netdev", "va"])
    sh(["rdma", "link", "add", SECOND_DEV, "type", "rxe", "netdev", "vc"])


def wait_ready(timeout_s: float = 60.0) -> bool:
    """Both ports ACTIVE and arxe1 holding the RoCE v2 GID of 10.9.0.2."""
    want = "0000:0000:0000:0000:0000:ffff:0a09:0002"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = [read(f"/sys/class/infiniband/{d}/ports/1/state") or "" for d in (FIRST_DEV, SECOND_DEV)]
        base = f"/sys/class/infiniband/{SECOND_DEV}/ports/1"
        gids = [(read(f"{base}/gids/{i}"), read(f"{base}/gid_attrs/types/{i}")) for i in range(4)]
        if all("ACTIVE" in s for s in states) and (want, "RoCE v2") in gids:
            log(f"ready: {states} {gids}")
            return True
        time.sleep(0.5)
    log("not ready in time")
    return False


def run_cli(name: str, args: list[str]) -> dict:
    """afddiag's CLI in this process → exit code, stdout (parsed when JSON), stderr, timing."""
    import afddiag.cli as cli

    out, err = io.StringIO(), io.StringIO()
    t = time.monotonic()
    rc: object = None
    exc = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.run(list(args))
    except Exception:
        exc = traceback.format_exc()
    text = out.getvalue()
    try:
        parsed = json.loads(text) if text.strip().startswith(("{", "[")) else None
    except ValueError:
        parsed = None
    log(f"afddiag {name}: rc={rc} in {time.monotonic() - t:.2f}s" + (f"\n{exc}" if exc else ""))
    return {"args": args, "rc": rc, "elapsed_s": round(time.monotonic() - t, 3), "json": parsed,
            "stdout": None if parsed is not None else text[-4000:], "stderr": err.getvalue()[-4000:],
            "exception": exc}


def main() -> int:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-lab"
    os.makedirs(outdir, exist_ok=True)
    os.environ["AFDDIAG_STATE_DIR"] = "/tmp/afddiag-state"  # the host root is shared read-only
    os.environ.pop("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", None)
    os.environ["SECRET_TOKEN"] = "must-not-leave"
    os.environ["NCCL_SOCKET_IFNAME"] = "vc"
    results: dict = {"kernel": os.uname().release, "runs": {}, "errors": []}
    try:
        build()
        results["ready"] = wait_ready()
        # --timeout 60: under TCG the first read of rxe's 1024-slot GID tables takes longer than the 10 s default
        live = ["all", "--json", "--timeout", "60", "--fabric-ip", FABRIC_IP, "--peer", PEER_IP]
        results["runs"]["live"] = run_cli("live", live)
        bundle = os.path.join(outdir, "capture.tar.gz")
        results["runs"]["capture"] = run_cli("capture", ["capture", "--timeout", "60", "-o", bundle])
        results["runs"]["prometheus"] = run_cli("prometheus", ["fabric", "--no-qp", "--fabric-ip", FABRIC_IP,
                                                               "--format", "prometheus", "--output",
                                                               os.path.join(outdir, "afddiag.prom")])
        results["runs"]["history"] = run_cli("history", ["history", "--json"])
    except Exception:
        results["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        for dev in (SECOND_DEV, FIRST_DEV):
            sh(["rdma", "link", "delete", dev], check=False)
        sh(["ip", "netns", "del", "peer"], check=False)
        results["elapsed_s"] = round(time.monotonic() - T0, 3)
        with open(os.path.join(outdir, "results.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
        with open(os.path.join(outdir, "run.log"), "w") as f:
            f.write("\n".join(LOG) + "\n")
        log(f"done in {results['elapsed_s']}s")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
