#!/usr/bin/env python3
"""Multi-host lab on the trixie-backports kernel (its rxe has per-namespace UDP sockets, so RoCE moves
between network namespaces): every host is a network namespace with its own veths, addresses, rxe
devices and sshd. Runs as root in the VM that ``AFDDIAG_LAB_KERNEL=bpo AFDDIAG_LAB_SCRIPT=
lab/scenario-hosts.py lab/boot.sh OUTDIR`` starts; ``python lab/scenario-hosts.py OUTDIR``.

Topology (bridges in the initial namespace stand for the switches)::

    init ns:  brm 10.8.0.1/24 (management)   br0 (rail 0, 10.9.0.0/24)   br1 (rail 1, 10.9.1.0/24)
                 |                               |                           |
    coord    m0 10.8.0.10   sshd           f0 10.9.0.10  rxe rxco0
    spark-a  m0 10.8.0.11   sshd           f0 10.9.0.11  rxe rxsa0     f1 10.9.1.11  rxe rxsa1
    spark-b  m0 10.8.0.12   sshd           f0 10.9.0.12  rxe rxsb0     f1 10.9.1.12  rxe rxsb1

rxsa1 is created first: kernel device index 0, so an engine that opens "the first device" on spark-a
opens its rail-1 device, which does not carry the fabric IP 10.9.0.11 (the incident). The RDMA
subsystem is in shared netns mode (the default; in exclusive mode ``rdma link add`` inside a namespace
still puts the rxe device in the initial namespace), so every host sees all five devices, each GID's
netdev in its own namespace.

Scenarios (each ``afddiag`` run in-process, in a forked child that entered the host's namespace, or in
this process for ``afddiag fleet``):
  incident-no-map  on spark-a: ``all --fabric-ip 10.9.0.11 --peer 10.9.0.10``, map unset → first device
                   rxsa1: fabric.first-device and fabric.qp-rtr FAIL (EINVAL: link-local source GID)
  incident-map     the same with DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=10.9.0.11=rxsa0 → PASS
  pair             ``fabric --serve`` on coord (rxco0), ``fabric --pair 10.9.0.10`` on spark-a with the
                   mapped device's fabric IP (rxsa0): SEND and WRITE 64 B … 64 KiB across namespaces,
                   bytes verified; hw_counters deltas of every device around it
  pair-rail1       ``--serve`` on spark-b rail 1 (rxsb1), ``--pair`` from spark-a rail 1 (rxsa1)
  fleet-faults     ``afddiag fleet --json`` over SSH (management addresses) to the three hosts, each
                   with its launch env (role, capacity 256, its own device map, AFD_ENGINE_PORTS 29500:
                   launch.control-plane connects to the peers the inventory gives, nothing listening, so
                   "refused" is an answer), with spark-a's f0 at MTU 9000 (RoCE MTU 4096 against 1024),
                   spark-b's AFD_EXPERT_CAPACITY 128, spark-b's map cloned from spark-a's, and spark-b
                   dropping what it sends from TCP port 29500 (``ip rule ipproto tcp sport 29500
                   blackhole``: its RST/SYN-ACK never leaves, as a firewall dropping inbound connects
                   looks from outside) → coord's connect to spark-b times out, spark-b's to coord is
                   refused: fleet.control-plane names the pair asymmetric
  fleet-link-down  faults undone (the cross-host gates agree again: the healthy baseline), spark-b's f0
                   (its fabric IP's link) down. Two runs, not three: each costs 2.5-4 min under TCG.

Each host also has its own UTS namespace (hostname = its name), so its reports name it.

Writes OUTDIR/results.json (every run's exit code, JSON, timings; counters; captures),
OUTDIR/fleet-<name>.json (the fleet reports, per-host reports embedded), OUTDIR/inventory.toml,
OUTDIR/run.log. Exit 0 when every step ran (whatever the verdicts).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labkit import (  # noqa: E402
    MAP_VAR,
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

# name: (role, short name for the init-side veth ends, management IP, [(netdev, fabric IP, rxe device)])
HOSTS = {
    "coord": ("coordinator", "co", "10.8.0.10", [("f0", "10.9.0.10", "rxco0")]),
    "spark-a": ("expert", "sa", "10.8.0.11", [("f0", "10.9.0.11", "rxsa0"), ("f1", "10.9.1.11", "rxsa1")]),
    "spark-b": ("expert", "sb", "10.8.0.12", [("f0", "10.9.0.12", "rxsb0"), ("f1", "10.9.1.12", "rxsb1")]),
}
RXE_ORDER = ["rxsa1", "rxco0", "rxsa0", "rxsb0", "rxsb1"]  # rxsa1 first: index 0
CAPACITY = 256
ENGINE_PORT = 29500  # AFD_ENGINE_PORTS in every launch env: launch.control-plane connects to it
DROP_RULE = ["rule", "add", "ipproto", "tcp", "sport", str(ENGINE_PORT), "blackhole"]
FLEET_DIR = "/tmp/lab-fleet"  # the guest's /tmp (tmpfs), seen from every namespace
HOST_ARGS = ["--no-history", "--timeout", "120", "--qp-timeout", "20"]


def fip(host: str) -> str:
    return HOSTS[host][3][0][1]


def own_map(host: str) -> str:
    return f"{fip(host)}={HOSTS[host][3][0][2]}"


def build() -> None:
    """Bridges, namespaces, veths, addresses, then the rxe devices in RXE_ORDER (each created inside its
    host's namespace: ``rdma link add`` resolves the netdev there)."""
    sh(["modprobe", "-a", "rdma_rxe", "rdma_ucm", "bridge", "veth"])
    init = ["link set lo up"]
    for br, addr in (("brm", "10.8.0.1/24"), ("br0", None), ("br1", None)):
        init += [f"link add {br} type bridge", f"link set {br} up"] + ([f"addr add {addr} dev {br}"] if addr else [])
    for host, (_, short, _, rails) in HOSTS.items():
        init.append(f"netns add {host}")
        for nd, br in [("m0", "brm")] + [(nd, f"br{nd[1]}") for nd, _, _ in rails]:
            init += [f"link add {short}-{nd} type veth peer name {nd} netns {host}",
                     f"link set {short}-{nd} master {br}", f"link set {short}-{nd} up"]
    sh(["ip", "-batch", "-"], stdin="\n".join(init) + "\n")
    for host, (_, _, mgmt, rails) in HOSTS.items():
        cmds = ["link set lo up", f"addr add {mgmt}/24 dev m0", "link set m0 up"]
        for nd, ip, _ in rails:
            cmds += [f"addr add {ip}/24 dev {nd}", f"link set {nd} up"]
        sh(["ip", "-n", host, "-batch", "-"], stdin="\n".join(cmds) + "\n")
    where = {dev: (host, nd) for host, (_, _, _, rails) in HOSTS.items() for nd, _, dev in rails}
    for dev in RXE_ORDER:
        host, nd = where[dev]
        sh(["ip", "netns", "exec", host, "rdma", "link", "add", dev, "type", "rxe", "netdev", nd])


def _incident() -> dict:
    args = ["all", "--json", "--no-history", "--timeout", "60", "--fabric-ip", fip("spark-a"), "--peer", fip("coord")]
    return {"incident-no-map": run_cli("incident-no-map", args, None),
            "incident-map": run_cli("incident-map", args, own_map("spark-a"))}


def _serve(name: str, ip: str, port: int, peer: str) -> dict:
    return run_cli(name, ["fabric", "--serve", "--json", "--timeout", "60", "--fabric-ip", ip, "--port", str(port),
                          "--pair-timeout", "240", "--peer", peer])


def _pair(name: str, server_ip: str, client_ip: str, port: int) -> dict:
    time.sleep(2.0)  # the server's listen socket first (the client also retries refusals)
    return run_cli(name, ["fabric", "--pair", f"{server_ip}:{port}", "--json", "--timeout", "60", "--fabric-ip",
                          client_ip, "--pair-timeout", "240"])


def pair_across(results: dict, outdir: str, tag: str, server: tuple[str, str], client: tuple[str, str],
                port: int) -> None:
    """One pair session between two namespace hosts: ``server``/``client`` = (host, fabric IP); results
    under scenarios pair[-tag]-{server,client}, hw_counters deltas under counters[tag]."""
    before = hw_counters()
    t = time.monotonic()
    s_out, c_out = os.path.join(outdir, f"{tag}-server.json"), os.path.join(outdir, f"{tag}-client.json")
    s_pid = fork_in_netns(server[0], s_out, _serve, f"{tag}-server", server[1], port, client[1])
    c_pid = fork_in_netns(client[0], c_out, _pair, f"{tag}-client", server[1], client[1], port)
    results["scenarios"][f"{tag}-client"] = join_forked(c_pid, c_out, 300)
    results["scenarios"][f"{tag}-server"] = join_forked(s_pid, s_out, 60)
    results["counters"][tag] = {"elapsed_s": round(time.monotonic() - t, 3),
                                "delta": counter_deltas(before, hw_counters())}
    log(f"{tag}: counters {json.dumps(results['counters'][tag])}")


# ---------------------------------------------------------------- the fleet over SSH

def write_env(host: str, capacity: int = CAPACITY, device_map: str | None = None) -> None:
    role = HOSTS[host][0]
    key = "AFD_PREFILL_CAPACITY" if role == "coordinator" else "AFD_EXPERT_CAPACITY"
    with open(f"{FLEET_DIR}/{host}.env", "w") as f:
        f.write(f"AFD_ROLE={role}\nAFD_FABRIC_IP={fip(host)}\n{key}={capacity}\n"
                f"{MAP_VAR}={device_map or own_map(host)}\nAFD_ENGINE_PORTS={ENGINE_PORT}\n")


def start_fleet(outdir: str) -> dict:
    """Keys (ssh-keygen), one sshd per host namespace on its management address, launch env
    files and the inventory. Returns {"inventory": path, "sshd": {host: rc}, "keygen_s": seconds}."""
    os.makedirs(FLEET_DIR, exist_ok=True)
    os.makedirs("/run/sshd", exist_ok=True)
    # virtme-ng locks every account in its /etc/shadow (a tmpfs copy bound over the host's, "!"); sshd
    # without PAM refuses public-key logins to locked accounts. "*": no password, not locked.
    with open("/etc/shadow") as f:
        lines = f.read().splitlines()
    with open("/etc/shadow", "w") as f:
        f.write("\n".join("root:*:::::::" if ln.startswith("root:") else ln for ln in lines) + "\n")
    t = time.monotonic()
    for key in ("hostkey", "client"):
        for old in (f"{FLEET_DIR}/{key}", f"{FLEET_DIR}/{key}.pub"):
            if os.path.exists(old):
                os.unlink(old)
        sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{FLEET_DIR}/{key}"])
    with open(f"{FLEET_DIR}/authorized_keys", "w") as f, open(f"{FLEET_DIR}/client.pub") as pubf:
        f.write(pubf.read())
    with open(f"{FLEET_DIR}/hostkey.pub") as pubf:
        pub = " ".join(pubf.read().split()[:2])
    with open(f"{FLEET_DIR}/known_hosts", "w") as f:
        f.write("".join(f"{mgmt} {pub}\n" for _, _, mgmt, _ in HOSTS.values()))
    keygen_s = round(time.monotonic() - t, 3)
    rcs = {}
    for host, (_, _, mgmt, _) in HOSTS.items():
        cfg = f"{FLEET_DIR}/sshd-{host}.conf"
        with open(cfg, "w") as f:
            f.write("\n".join([f"ListenAddress {mgmt}", "Port 22", f"HostKey {FLEET_DIR}/hostkey",
                               f"PidFile {FLEET_DIR}/sshd-{host}.pid",
                               f"AuthorizedKeysFile {FLEET_DIR}/authorized_keys",
                               "StrictModes no", "UsePAM no", "PasswordAuthentication no",
                               "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
                               "MaxStartups 50", "LogLevel VERBOSE"]) + "\n")
        # its own UTS namespace too: `afddiag all` reports the host's name as its hostname
        rcs[host] = sh(["ip", "netns", "exec", host, "unshare", "--uts", "sh", "-c",
                        f'hostname {host} && exec /usr/sbin/sshd -f {cfg} -E {outdir}/sshd-{host}.log'],
                       check=False).returncode
        write_env(host)
    afd = f"{sys.executable} -m afddiag"
    lines = ["[fleet]", 'user = "root"', f'known_hosts = "{FLEET_DIR}/known_hosts"', f'identity = "{FLEET_DIR}/client"',
             f'afddiag = "{afd}"', "concurrency = 3", "timeout_s = 400", "connect_timeout_s = 30", "",
             "[expect]", f"capacity = {CAPACITY}",
             "mtu = 1024  # the lab's veths run at MTU 1500: RoCE MTU 1024 is this site's target", ""]
    for host, (role, _, mgmt, _) in HOSTS.items():
        lines += ["[[host]]", f'name = "{host}"', f'role = "{role}"', f'ssh = "root@{mgmt}"',
                  f'fabric_ip = "{fip(host)}"', f'launch_env = "{FLEET_DIR}/{host}.env"',
                  "args = [" + ", ".join(f'"{a}"' for a in HOST_ARGS) + "]", ""]
    inv = os.path.join(outdir, "inventory.toml")
    with open(inv, "w") as f:
        f.write("\n".join(lines))
    return {"inventory": inv, "sshd": rcs, "keygen_s": keygen_s}


def fleet_run(results: dict, outdir: str, name: str, inv: str) -> None:
    before = hw_counters()
    res = run_cli(name, ["fleet", "--inventory", inv, "--json"])
    results["scenarios"][name] = res
    results["counters"][name] = {"delta": counter_deltas(before, hw_counters())}
    if isinstance(res["json"], dict):
        with open(os.path.join(outdir, f"{name}.json"), "w") as f:
            json.dump(res["json"], f, indent=2)
        log(f"{name}: exit {res['json'].get('exit_code')}; " + "; ".join(
            f"{g['id']} {g['verdict']}: {g['summary'][:200]}" for g in res["json"]["gates"]))


def stop_fleet() -> None:
    for host in HOSTS:
        pid = read(f"{FLEET_DIR}/sshd-{host}.pid")
        if pid and pid.isdigit():
            try:
                os.kill(int(pid), 15)
            except OSError:
                pass


def teardown() -> None:
    stop_fleet()
    for dev in RXE_ORDER:
        sh(["rdma", "link", "delete", dev], check=False)
    sh(["ip", "-batch", "-"], stdin="".join(f"netns del {h}\n" for h in HOSTS)
       + "link del brm\nlink del br0\nlink del br1\n", check=False)


def main() -> int:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-lab"
    os.makedirs(outdir, exist_ok=True)
    results: dict = {"pid": os.getpid(), "kernel": os.uname().release, "scenarios": {}, "counters": {},
                     "captures": {}, "timings": {}, "errors": []}
    try:
        t = time.monotonic()
        build()
        results["ready"] = wait_rocev2({dev: ip for _, _, _, rails in HOSTS.values() for _, ip, dev in rails}, 90.0)
        results["timings"]["build_s"] = round(time.monotonic() - t, 3)
        results["captures"]["rdma_dev"] = sh_json(["rdma", "-j", "dev", "show"])
        results["captures"]["rdma_system"] = sh(["rdma", "system", "show"], check=False).stdout.strip()
        t = time.monotonic()
        import afddiag.cli  # noqa: F401 - once, before the forks, so every child starts warm
        import afddiag.fleet  # noqa: F401
        import afddiag.probes.pair  # noqa: F401
        results["timings"]["import_s"] = round(time.monotonic() - t, 3)

        t = time.monotonic()
        out = os.path.join(outdir, "incident.json")
        inc = join_forked(fork_in_netns("spark-a", out, _incident), out, 300)
        results["incident_child_exit"] = inc.pop("child_exit")
        if "exception" in inc:
            results["errors"].append(f"incident: {inc['exception']}")
        results["scenarios"].update(inc)
        results["timings"]["incident_s"] = round(time.monotonic() - t, 3)

        pair_across(results, outdir, "pair", ("coord", fip("coord")), ("spark-a", fip("spark-a")), 18515)
        pair_across(results, outdir, "pair-rail1", ("spark-b", "10.9.1.12"), ("spark-a", "10.9.1.11"), 18516)

        t = time.monotonic()
        fl = start_fleet(outdir)
        results["fleet"] = fl
        results["timings"]["fleet_setup_s"] = round(time.monotonic() - t, 3)
        inv = fl["inventory"]
        for name, apply in (
            ("fleet-faults", lambda: (sh(["ip", "-n", "spark-a", "link", "set", "f0", "mtu", "9000"]),
                                      write_env("spark-b", capacity=128, device_map=own_map("spark-a")),
                                      sh(["ip", "-n", "spark-b", *DROP_RULE]))),
            ("fleet-link-down", lambda: (sh(["ip", "-n", "spark-a", "link", "set", "f0", "mtu", "1500"]),
                                         write_env("spark-b"),
                                         sh(["ip", "-n", "spark-b", "rule", "del", *DROP_RULE[2:]]),
                                         sh(["ip", "-n", "spark-b", "link", "set", "f0", "down"]))),
        ):
            t = time.monotonic()
            apply()
            fleet_run(results, outdir, name, inv)
            results["timings"][f"{name}_s"] = round(time.monotonic() - t, 3)
        capture_resources(results, ("qp",))
    except Exception:
        results["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        teardown()
        results["captures"]["rdma_dev_after_cleanup"] = sh_json(["rdma", "-j", "dev", "show"])
        shutil.rmtree(FLEET_DIR, ignore_errors=True)
        finish(outdir, results)
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
