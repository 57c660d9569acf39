#!/usr/bin/env python3
"""One rail's bandwidth run and the port counters around it, between two namespace hosts on the
trixie-backports kernel (its rxe has per-namespace UDP sockets, so RoCE moves between namespaces). Runs
as root in the VM that ``AFDDIAG_LAB_KERNEL=bpo AFDDIAG_LAB_SCRIPT=lab/scenario-rail.py lab/boot.sh
OUTDIR`` starts; ``python lab/scenario-rail.py OUTDIR``.

Topology (one veth pair, MTU 9000, so the RoCE path MTU is 4096)::

    netns ra:  r0 10.9.0.21/24 -- rxe rxra   <==veth==>   netns rb:  r0 10.9.0.22/24 -- rxe rxrb

Scenarios (each afddiag run in-process in a forked child that entered its host's namespaces; the lab's
role is lab/playbook-rxe.toml):
  bw        ``fabric --serve --json --fabric-ip 10.9.0.22`` on rb; on ra ``fabric --pair 10.9.0.22
            --bandwidth 5 --json --fabric-ip 10.9.0.21``: 4 QPs x 8 deep x 1 MiB RDMA WRITEs for 5 s,
            judged by fabric.rail-bandwidth and fabric.port-counters against the lab band
  bw-fault  the same for 8 s; once rxra has sent 2 MB of it, rb's address is removed (``ip -n rb addr del
            10.9.0.22/24 dev r0``): no more ACKs, the client's WRITEs end with retry exceeded (WC status
            12), the run stops and its counters show it
Also every rxe device's hw_counters from the initial namespace before and after each run (the cross
check of what the pair test's own readings say), the names in hw_counters/ and counters/, and
``rdma -j resource`` after the runs (nothing left behind).

Writes OUTDIR/results.json and OUTDIR/<scenario>-{client,server}.json (the pair test's JSON: a snapshot
replays it as pair.json), OUTDIR/run.log. Exit 0 when every step ran (whatever the verdicts).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labkit import (  # noqa: E402
    REPO,
    capture_resources,
    counter_deltas,
    finish,
    fork_in_netns,
    hw_counters,
    join_forked,
    log,
    read,
    run_cli,
    sh,
    sh_json,
    wait_rocev2,
)

HOSTS = {"ra": ("10.9.0.21", "rxra"), "rb": ("10.9.0.22", "rxrb")}
PLAYBOOK = os.path.join(REPO, "lab", "playbook-rxe.toml")
PORT = 18520
COMMON = ["--json", "--timeout", "60", "--playbook", PLAYBOOK]


def build() -> None:
    sh(["modprobe", "-a", "rdma_rxe", "rdma_ucm", "veth"])
    sh(["ip", "-batch", "-"],
       stdin="netns add ra\nnetns add rb\nlink add r0 netns ra type veth peer name r0 netns rb\n")
    for ns, (ip, dev) in HOSTS.items():
        sh(["ip", "-n", ns, "-batch", "-"], stdin=f"link set lo up\nlink set r0 mtu 9000\naddr add {ip}/24 dev r0\n"
           "link set r0 up\n")
        sh(["ip", "netns", "exec", ns, "rdma", "link", "add", dev, "type", "rxe", "netdev", "r0"])


def _serve(name: str, ip: str, timeout_s: int) -> dict:
    return run_cli(name, ["fabric", "--serve", "--fabric-ip", ip, "--port", str(PORT), "--pair-timeout", str(timeout_s),
                          "--peer", HOSTS["ra"][0]] + COMMON)


def _client(name: str, server_ip: str, client_ip: str, seconds: float, timeout_s: int) -> dict:
    time.sleep(2.0)  # the server's listen socket first (the client also retries refusals)
    return run_cli(name, ["fabric", "--pair", f"{server_ip}:{PORT}", "--bandwidth", str(seconds), "--fabric-ip",
                          client_ip, "--pair-timeout", str(timeout_s)] + COMMON)


def sent_bytes(dev: str) -> int:
    v = read(f"/sys/class/infiniband/{dev}/ports/1/hw_counters/sent_bytes")
    return int(v) if v and v.isdigit() else -1


def bw_run(results: dict, outdir: str, tag: str, seconds: float, timeout_s: int, fault: bool = False) -> None:
    """One bandwidth session rb (server) <- ra (client); with ``fault``, rb's address is removed once the
    client's device has sent 2 MB of the run."""
    before = hw_counters()
    t = time.monotonic()
    s_out, c_out = os.path.join(outdir, f"{tag}-server.json"), os.path.join(outdir, f"{tag}-client.json")
    s_pid = fork_in_netns("rb", s_out + ".run", _serve, f"{tag}-server", HOSTS["rb"][0], timeout_s + 5)
    c_pid = fork_in_netns("ra", c_out + ".run", _client, f"{tag}-client", HOSTS["rb"][0], HOSTS["ra"][0], seconds,
                          timeout_s)
    info: dict = {}
    if fault:
        start = sent_bytes("rxra")
        until = time.monotonic() + timeout_s
        while time.monotonic() < until and sent_bytes("rxra") - start < 2_000_000:
            time.sleep(0.1)
        info["fault_after_s"] = round(time.monotonic() - t, 3)
        info["sent_bytes_at_fault"] = sent_bytes("rxra") - start
        sh(["ip", "-n", "rb", "addr", "del", f"{HOSTS['rb'][0]}/24", "dev", "r0"], check=False)
        log(f"{tag}: removed rb's address after {info['fault_after_s']} s, {info['sent_bytes_at_fault']} B sent")
    c = join_forked(c_pid, c_out + ".run", timeout_s + 60)
    s = join_forked(s_pid, s_out + ".run", timeout_s + 60)
    results["scenarios"][f"{tag}-client"], results["scenarios"][f"{tag}-server"] = c, s
    for res, path in ((c, c_out), (s, s_out)):
        if isinstance(res.get("json"), dict):  # the pair test's JSON, as a snapshot's pair.json
            import json

            with open(path, "w") as f:
                json.dump({k: v for k, v in res["json"].items() if k != "report"}, f, indent=2)
    results["counters"][tag] = {"elapsed_s": round(time.monotonic() - t, 3),
                                "delta": counter_deltas(before, hw_counters()), **info}
    bw = ((c.get("json") or {}).get("bandwidth") or {})
    log(f"{tag}: client rc {c.get('rc')}, {bw.get('gbps')} Gb/s, error {bw.get('error')}; server rc {s.get('rc')}")


def main() -> int:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-lab"
    os.makedirs(outdir, exist_ok=True)
    results: dict = {"pid": os.getpid(), "kernel": os.uname().release, "scenarios": {}, "counters": {},
                     "captures": {}, "timings": {}, "errors": []}
    try:
        t = time.monotonic()
        build()
        results["ready"] = wait_rocev2({dev: ip for ip, dev in HOSTS.values()}, 90.0)
        results["timings"]["build_s"] = round(time.monotonic() - t, 3)
        base = "/sys/class/infiniband/rxra/ports/1"
        results["captures"]["counter_files"] = {g: sorted(os.listdir(f"{base}/{g}")) if os.path.isdir(f"{base}/{g}")
                                                else None for g in ("hw_counters", "counters")}
        results["captures"]["nproc"] = os.cpu_count()
        # what the pair test falls back to inside a namespace host (sysfs there has no hw_counters/)
        results["captures"]["rdma_statistic"] = sh_json(["rdma", "-j", "statistic", "show", "link", "rxra/1"])
        results["captures"]["ns_counter_files"] = sh(
            ["ip", "netns", "exec", "ra", "sh", "-c", "ls /sys/class/infiniband/rxra/ports/1/"],
            check=False).stdout.split()
        t = time.monotonic()
        import afddiag.cli  # noqa: F401 - once, before the forks, so every child starts warm
        import afddiag.probes.pair  # noqa: F401
        results["timings"]["import_s"] = round(time.monotonic() - t, 3)
        for tag, seconds, timeout_s, fault in (("bw", 5.0, 90, False), ("bw-fault", 8.0, 45, True)):
            t = time.monotonic()
            bw_run(results, outdir, tag, seconds, timeout_s, fault)
            results["timings"][f"{tag}_s"] = round(time.monotonic() - t, 3)
        capture_resources(results, ("qp", "mr"))
    except Exception:
        results["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        for _, dev in HOSTS.values():
            sh(["rdma", "link", "delete", dev], check=False)
        sh(["ip", "-batch", "-"], stdin="netns del ra\nnetns del rb\n", check=False)
        finish(outdir, results)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
