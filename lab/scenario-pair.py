#!/usr/bin/env python3
"""Pair test and route/ARP gates in the soft-RoCE lab (runs as root, in the VM that lab/boot.sh starts
with ``AFDDIAG_LAB_SCRIPT=lab/scenario-pair.py``).

Usage (inside the VM): ``python lab/scenario-pair.py OUTDIR``

Topology (one Python process; each pair server is a fork of it):

    host side                                      netns "peer"
    pa 10.9.0.2/24 -- rxe rxa   <==veth==>   pb 10.9.0.1/24 -- rxe rxb
    pc 10.9.0.3/24 -- rxe rxc   <==veth==>   pd (up, no address)

Two rails (pa, pc) on one subnet: the fabric gates' multi-rail case.

Scenarios:
  route-wrong  ``ip route add 10.9.0.1/32 dev pc`` (the peer is routed by the other rail), ARP sysctls
               at their defaults: ``afddiag fabric --json --fabric-ip 10.9.0.2 --peer 10.9.0.1 --no-qp``
               → fabric.route FAIL (leaves by pc), fabric.arp FAIL (arp_ignore 0)
  route-fixed  the /32 route deleted, arp_ignore=1 arp_announce=2 rp_filter=2 on pa and pc → both PASS
  pair-netns   the forked server enters netns peer (setns) and runs ``afddiag fabric --serve --json
               --fabric-ip 10.9.0.1``; this process runs ``afddiag fabric --pair 10.9.0.1:18515 --json
               --fabric-ip 10.9.0.2``. Handshake and RTS work; no RoCE packet reaches rxb on Linux 6.1
               (rxe's UDP socket and route lookups are in init_net only), so it times out (25 s): what
               a 6.1 host shows. The pair test with data across namespaces runs on the trixie-backports
               kernel (lab/scenario-hosts.py), whose rxe has per-namespace sockets.

Writes OUTDIR/results.json (exit codes, JSON outputs, captures of ``rdma -j resource`` after the
runs and after cleanup) and OUTDIR/run.log. Exit 0 when every step ran (whatever the verdicts).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labkit import LOG, capture_resources, finish, log, run_cli, sh, sh_json, wait_rocev2  # noqa: E402

HOST_IP, PEER_IP, RAIL2_IP = "10.9.0.2", "10.9.0.1", "10.9.0.3"
PORT = 18515
CLONE_NEWNET = 0x40000000
def build() -> None:
    sh(["modprobe", "-a", "rdma_rxe", "rdma_ucm"])
    sh(["ip", "netns", "add", "peer"])
    sh(["ip", "-batch", "-"], stdin="\n".join([
        "link set lo up",
        "link add pa type veth peer name pb",
        "link add pc type veth peer name pd",
        "link set pb netns peer",
        "link set pd netns peer",
        f"addr add {HOST_IP}/24 dev pa",
        "link set pa up",
        f"addr add {RAIL2_IP}/24 dev pc",
        "link set pc up",
    ]) + "\n")
    sh(["ip", "-n", "peer", "-batch", "-"], stdin="\n".join([
        "link set lo up", f"addr add {PEER_IP}/24 dev pb", "link set pb up", "link set pd up"]) + "\n")
    sh(["rdma", "link", "add", "rxa", "type", "rxe", "netdev", "pa"])
    sh(["rdma", "link", "add", "rxc", "type", "rxe", "netdev", "pc"])
    sh(["ip", "netns", "exec", "peer", "rdma", "link", "add", "rxb", "type", "rxe", "netdev", "pb"])


def wait_ready(timeout_s: float = 60.0) -> dict:
    """Until rxa, rxb, rxc are ACTIVE and carry the RoCE v2 GIDs of their addresses."""
    return wait_rocev2({"rxa": HOST_IP, "rxb": PEER_IP, "rxc": RAIL2_IP}, timeout_s)


def set_arp(netdevs: list[str]) -> None:
    for nd in netdevs:
        for k, v in (("arp_ignore", 1), ("arp_announce", 2), ("rp_filter", 2)):
            with open(f"/proc/sys/net/ipv4/conf/{nd}/{k}", "w") as f:
                f.write(f"{v}\n")
    log(f"arp sysctls set on {netdevs}")


def serve_forked(outdir: str, name: str, ip: str, port: int, timeout_s: int, netns: str | None, peer: str) -> int:
    """Fork; the child (optionally moved into ``netns`` with setns) serves one pair session on
    ``ip:port`` to the client at ``peer`` and writes OUTDIR/<name>.json; returns the child's pid."""
    pid = os.fork()
    if pid:
        return pid
    rc = 99
    try:
        if netns:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns({netns})")
            os.close(fd)
        res = run_cli(name, ["fabric", "--serve", "--json", "--timeout", "60", "--fabric-ip", ip, "--port", str(port),
                             "--pair-timeout", str(timeout_s), "--peer", peer])
        rc = 0
        with open(os.path.join(outdir, f"{name}.json"), "w") as f:
            json.dump(res, f, indent=2)
    except BaseException:
        with open(os.path.join(outdir, f"{name}.json"), "w") as f:
            json.dump({"exception": traceback.format_exc()}, f)
    finally:
        with open(os.path.join(outdir, f"{name}.log"), "w") as f:
            f.write("\n".join(LOG) + "\n")
        os._exit(rc)


def pair_run(results: dict, outdir: str, tag: str, server_ip: str, client_ip: str, port: int, timeout_s: int,
             netns: str | None) -> None:
    """One pair session: forked server, in-process client; results under scenarios pair-<tag>-{server,client}."""
    child = serve_forked(outdir, f"pair-{tag}-server", server_ip, port, timeout_s, netns, client_ip)
    results["scenarios"][f"pair-{tag}-client"] = run_cli(f"pair-{tag}-client", [
        "fabric", "--pair", f"{server_ip}:{port}", "--json", "--timeout", "60", "--fabric-ip", client_ip,
        "--pair-timeout", str(timeout_s)])
    t = time.monotonic()
    while time.monotonic() - t < 60:
        done, status = os.waitpid(child, os.WNOHANG)
        if done:
            results[f"pair-{tag}-server_exit"] = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.2)
    else:
        os.kill(child, 9)
        os.waitpid(child, 0)
        results["errors"].append(f"pair {tag} server did not exit within 60 s after the client")
    try:
        with open(os.path.join(outdir, f"pair-{tag}-server.json")) as f:
            results["scenarios"][f"pair-{tag}-server"] = json.load(f)
    except (OSError, ValueError) as e:
        results["errors"].append(f"pair-{tag}-server.json: {e}")


def main() -> int:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-lab"
    os.makedirs(outdir, exist_ok=True)
    results: dict = {"pid": os.getpid(), "kernel": os.uname().release, "scenarios": {}, "captures": {},
                     "errors": []}
    # --timeout 60: under TCG on a busy machine the first read of rxe's GID tables can outrun the 10 s default
    fabric_args = ["fabric", "--json", "--timeout", "60", "--fabric-ip", HOST_IP, "--peer", PEER_IP, "--no-qp"]
    try:
        build()
        results["ready"] = wait_ready()
        results["captures"]["rdma_dev"] = sh_json(["rdma", "-j", "dev", "show"])
        import afddiag.cli  # noqa: F401 - import once, before the fork, so the child starts warm
        import afddiag.probes.pair  # noqa: F401

        sh(["ip", "route", "add", f"{PEER_IP}/32", "dev", "pc"])
        results["captures"]["route_get_wrong"] = sh_json(["ip", "-j", "route", "get", PEER_IP, "from", HOST_IP])
        results["scenarios"]["route-wrong"] = run_cli("route-wrong", fabric_args)
        sh(["ip", "route", "del", f"{PEER_IP}/32", "dev", "pc"])
        set_arp(["pa", "pc"])
        results["captures"]["route_get_fixed"] = sh_json(["ip", "-j", "route", "get", PEER_IP, "from", HOST_IP])
        results["scenarios"]["route-fixed"] = run_cli("route-fixed", fabric_args)

        # Server in netns peer (rxb on pb there): handshake and RTS work; on Linux 6.1 no packet reaches
        # rxb (rxe's UDP socket lives in init_net only), so this one is expected to time out.
        pair_run(results, outdir, "netns", PEER_IP, HOST_IP, PORT, 25, "peer")
        capture_resources(results, ("qp", "pd", "mr"))
    except Exception:
        results["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        for dev in ("rxa", "rxc", "rxb"):
            sh(["rdma", "link", "delete", dev], check=False)
        sh(["ip", "netns", "del", "peer"], check=False)
        for nd in ("pa", "pc"):
            if os.path.exists(f"/sys/class/net/{nd}"):
                sh(["ip", "link", "del", nd], check=False)
        results["captures"]["rdma_dev_after_cleanup"] = sh_json(["rdma", "-j", "dev", "show"])
        finish(outdir, results)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
