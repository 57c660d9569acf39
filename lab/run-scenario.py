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

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labkit import (  # noqa: E402,F401
    FABRIC_IP,
    FIRST_DEV,
    LOG,
    MAP_VAR,
    PEER_IP,
    SECOND_DEV,
    T0,
    build,
    capture_resources,
    log,
    port_gids,
    read,
    run_cli,
    sh,
    sh_json,
    teardown,
    wait_ready,
)

# --timeout 60: under TCG the first read of rxe's 1,024-slot GID tables can outrun the 10 s default
CLI_ARGS = ["all", "--json", "--no-history", "--timeout", "60", "--fabric-ip", FABRIC_IP, "--peer", PEER_IP]


def run_direct(name: str) -> dict:
    """probe_fabric + probe_qp called directly (works without the CLI): the raw QP facts."""
    t = time.monotonic()
    try:
        from afddiag.model import to_jsonable
        from afddiag.probes.fabric import probe_fabric
        from afddiag.probes.netlink import device_order, netdev_addresses
        from afddiag.probes.qp import probe_qp

        order, src, _notes = device_order()
        fabric = probe_fabric("/", order, src, netdev_addresses(), "netlink")
        qp = probe_qp(fabric, FABRIC_IP, [PEER_IP], timeout_s=10.0)
        res = {"order": [(d.name, d.index) for d in fabric.devices], "qp": to_jsonable(qp)}
    except Exception:
        res = {"exception": traceback.format_exc()}
    res["elapsed_s"] = round(time.monotonic() - t, 3)
    log(f"direct {name}: {json.dumps(res)[:2000]}")
    return res


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
            results["scenarios"][name] = run_cli(name, CLI_ARGS, env_map)
            results["direct"][name] = run_direct(name)

        # Peer address gone: no ARP reply any more. Flush the host's neighbour cache, or the entry
        # learnt in the previous scenarios would still resolve 10.9.0.1.
        sh(["ip", "-n", "peer", "addr", "del", f"{PEER_IP}/24", "dev", "vd"])
        sh(["ip", "neigh", "flush", "dev", "vc"])
        results["scenarios"]["peer-gone"] = run_cli("peer-gone", CLI_ARGS, f"{FABRIC_IP}={SECOND_DEV}")
        results["direct"]["peer-gone"] = run_direct("peer-gone")
        os.environ.pop(MAP_VAR, None)

        # For the record: what one extra process costs here (why everything runs in-process).
        t = time.monotonic()
        p = sh([sys.executable, "-m", "afddiag", "--help"], check=False)
        results["subprocess_afddiag_help_s"] = round(time.monotonic() - t, 3)
        results["subprocess_afddiag_help_rc"] = p.returncode

        # Leftovers from this process, while the devices still exist.
        capture_resources(results, ("qp", "pd"))
    except Exception:
        results["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        teardown()
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
