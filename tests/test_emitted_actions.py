"""Every action a gate emits is one its catalog entry lists (checks/gates.toml ``action``,
``warn_action``, ``also_actions``), for every gate family, with each gate driven through its verdicts on
recorded facts: the shared cases, snapshots derived from them the way an incident changes a host, the
readings the probes record (memory registration, PCIe, CPU, limits, reach, QP walk), and per-host
reports merged into fleets (the lab's recorded fleet runs among them).

The rule (stricter than "any listed action, or NONE/RERUN anywhere"): PASS and SKIP carry NONE, ERROR
carries RERUN, a FAIL or WARN carries the gate's ``action``, ``warn_action`` or one of its
``also_actions`` — so docs/GATES.md names every action a verdict of that gate can ask for."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

from click.testing import CliRunner

from afddiag.catalog import load
from afddiag.cli import cli
from afddiag.diagnosis import fill_actions
from afddiag.verdict import Verdict
from conftest import CASES, REPO, case_dirs, load_case
from snapfix import derive, fabric_case, link_down

GATES = load()["gates"]
ROLES = ("generic", "coordinator", "expert")


def allowed(gid: str, verdict: str) -> set[str]:
    """The actions a ``verdict`` of gate ``gid`` may carry according to the catalog."""
    c = GATES[gid]
    if verdict in ("PASS", "SKIP"):
        return {"NONE"}
    if verdict == "ERROR":
        return {"RERUN"}
    return {a for a in (c.get("action"), c.get("warn_action"), *c.get("also_actions", [])) if a}


class Seen:
    """Collects ``(gate, verdict, action)`` and checks each against :func:`allowed`."""

    def __init__(self) -> None:
        self.triples: set[tuple[str, str, str]] = set()
        self.bad: list[tuple] = []

    def add(self, gates: list[dict], where: str) -> None:
        for g in gates:
            if g["action"] not in allowed(g["id"], g["verdict"]):
                self.bad.append((where, g["id"], g["verdict"], g["action"], g["summary"][:160]))
            self.triples.add((g["id"], g["verdict"], g["action"]))

    def add_verdicts(self, verdicts: list[Verdict], where: str) -> None:
        fill_actions(verdicts)  # what a report does before it shows them
        self.add([{"id": v.id, "verdict": v.verdict, "action": v.action, "summary": v.summary}
                  for v in verdicts], where)

    def verdicts(self, family: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {g: set() for g, c in GATES.items() if c["family"] == family}
        for gid, verdict, _ in self.triples:
            if gid in out:
                out[gid].add(verdict)
        return out

    def check(self, family: str, want: set[tuple[str, str]]) -> None:
        """No mismatch; ``want`` (gate, action) pairs were emitted; every gate of ``family`` was driven
        through each verdict its catalog entry describes."""
        first = {b[1:4]: b for b in reversed(self.bad)}  # one line per (gate, verdict, action)
        assert not self.bad, "\n".join(map(str, first.values()))
        got = {(g, a) for g, _, a in self.triples}
        assert want <= got, sorted(want - got)
        for gid, verdicts in self.verdicts(family).items():
            missing = set(GATES[gid]["verdicts"]) - verdicts
            assert not missing, (gid, sorted(missing), sorted(verdicts))


def report(args: list[str]) -> dict:
    extra = ["--json"] if args[0] == "merge" else ["--json", "--no-history"]
    res = CliRunner().invoke(cli, [*args, *extra], standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout)


def envfile(tmp: Path, name: str, env: dict[str, str]) -> Path:
    p = tmp / name
    p.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    return p


# ---------------------------------------------------------------------------------------------- GPU


def test_every_gpu_gate_action_is_listed_in_the_catalog(tmp_path):
    """Moved here from tests/test_gpu_review.py (the GPU cases, busy and Xid variants, every role)."""
    from test_gpu_review import _variants, run

    seen = Seen()
    for case in _variants(tmp_path):
        for role in ROLES:
            rep, _ = run(["--snapshot", str(case), "--role", role])
            seen.add(rep["gates"], f"{case.name} {role}")
    assert not seen.bad, "\n".join(map(str, seen.bad))
    got = {(g, a) for g, _, a in seen.triples}
    assert ("gpu.present", "SET_ENV") in got and ("gpu.errors", "REBOOT") in got


# ---------------------------------------------------------------------------------------------- fabric, host, launch

UNLIMITED = {"memlock_soft_bytes": -1, "memlock_hard_bytes": -1, "user": "afd", "in_container": False,
             "device_nodes": [{"path": "/dev/infiniband/uverbs0", "readable": True, "writable": True},
                              {"path": "/dev/infiniband/rdma_cm", "readable": True, "writable": True}]}


def _case_runs(tmp: Path, seen: Seen) -> None:
    """Every shared case under every role: without a fabric IP, with the case's, and with the case's
    launch settings as a launch env file."""
    for case in case_dirs("fabric") + case_dirs("gpu"):
        meta = load_case(case)
        env = dict(meta.get("env") or {})
        for role in ROLES:
            seen.add(report(["all", "--snapshot", str(case), "--role", role])["gates"], f"{case.name} {role}")
            if meta.get("fabric_ip"):
                le = envfile(tmp, f"{case.name}.env", {**env, "AFD_FABRIC_IP": meta["fabric_ip"]})
                args = ["all", "--snapshot", str(case), "--role", role, "--launch-env", str(le)]
                for p in meta.get("peer_fabric_ips") or []:
                    args += ["--peer", p]
                seen.add(report(args)["gates"], f"{case.name} {role} launch env")


def _fabric_incidents(tmp: Path, seen: Seen) -> None:
    """Case 02 (two rails) and others changed the way incidents change a host."""
    c02, c12 = fabric_case("02-"), fabric_case("12-")
    down = link_down(tmp / "down")
    for args in (["--fabric-ip", "192.168.100.11"], [], ["--peer", "192.168.100.10"]):  # FIX_LINK; ambiguous: RERUN
        seen.add(report(["all", "--snapshot", str(down), "--role", "expert", *args])["gates"], f"link down {args}")
    seen.add(report(["all", "--snapshot", str(c02), "--peer", "192.168.100.10"])["gates"], "02 ambiguous, a peer")
    # a fabric IP this host does not hold: with RoCE addresses here (SET_ENV), and without any (FIX_ADDRESS)
    seen.add(report(["all", "--snapshot", str(c02), "--fabric-ip", "10.1.1.1"])["gates"], "02 wrong fabric IP")
    seen.add(report(["all", "--snapshot", str(fabric_case("07-")), "--fabric-ip", "10.1.1.1"])["gates"],
             "07 fabric IP on no host")
    # device order unknown (no rdma-dev.json): the engine's device cannot be told
    unordered = derive(c02, tmp / "unordered", {"rdma-dev.json": None, "env": None})
    seen.add(report(["all", "--snapshot", str(unordered), "--fabric-ip", "192.168.100.11"])["gates"], "order unknown")
    # the launch env's NCCL variables right and wrong, the map wrong
    for env in ({"NCCL_IB_HCA": "=rocep1s0f1:1", "NCCL_IB_GID_INDEX": "3"}, {"NCCL_IB_HCA": "=rocep1s0f0:1"},
                {"NCCL_IB_GID_INDEX": "1"}, {"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "192.168.100.11=rocep1s0f0"},
                {"NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1"}):
        le = envfile(tmp, "nccl.env", {"AFD_FABRIC_IP": "192.168.100.11", **env})
        seen.add(report(["all", "--snapshot", str(c02), "--launch-env", str(le)])["gates"], f"02 env {env}")
    # the map lacks the fabric IP while the first enumerated device (the engine's fallback) carries it: WARN
    le = envfile(tmp, "nomap.env", {"AFD_FABRIC_IP": "198.51.100.72",
                                    "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "198.51.100.73=mlx5_0"})
    seen.add(report(["all", "--snapshot", str(c12), "--launch-env", str(le)])["gates"], "12 map lacks the fabric IP")
    # negotiated link speed against the expert role's 200 Gb/s
    for speed in (200000, 150000, 100000):
        snap = derive(c12, tmp / f"speed{speed}", {"sys/class/net/ens3np0/speed": f"{speed}\n"})
        seen.add(report(["all", "--snapshot", str(snap), "--role", "expert", "--fabric-ip", "198.51.100.72"])["gates"],
                 f"speed {speed}")
    # routes and ARP sysctls: the peer's route on the other rail; two rails on one subnet
    snap = derive(c02, tmp / "route", {"ip-route-get.json": json.dumps({
        "192.168.100.10": [{"dst": "192.168.100.10", "from": "192.168.100.11", "dev": "enp1s0f1np1"}],
        "192.168.100.20": [{"dst": "192.168.100.20", "from": "192.168.100.11", "dev": "enP2p1s0f1np1"}]})})
    for peers in (["192.168.100.10"], ["192.168.100.10", "192.168.100.20"]):
        args = [x for p in peers for x in ("--peer", p)]
        seen.add(report(["all", "--snapshot", str(snap), "--fabric-ip", "192.168.100.11", *args])["gates"],
                 f"route {peers}")
    addrs = json.loads((c02 / "ip-addr.json").read_text())
    for x in addrs:
        for a in x.get("addr_info", []):
            if a.get("local") == "192.168.101.11":
                a["local"] = "192.168.100.21"
    for name, conf in (("arp0", {"arp_ignore": 0, "arp_announce": 0, "rp_filter": 0}),
                       ("arp-strict", {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 1}),
                       ("arp-ok", {"arp_ignore": 1, "arp_announce": 2, "rp_filter": 2})):
        edits = {"ip-addr.json": json.dumps(addrs)}
        edits.update({f"proc/sys/net/ipv4/conf/{nd}/{k}": f"{v}\n" for k, v in conf.items()
                      for nd in ("all", "enp1s0f1np1", "enP2p1s0f1np1")})
        snap = derive(c02, tmp / name, edits)
        seen.add(report(["all", "--snapshot", str(snap), "--fabric-ip", "192.168.100.11"])["gates"], name)


def _qp_runs(seen: Seen) -> None:
    """fabric.qp-rtr on QP walks as the probe records them (tests/test_gates.py's two-device host)."""
    from afddiag.gates import fabric
    from afddiag.model.fabric import QpFacts, QpResult, QpStep
    from test_gates import FE80, V4, ctx, host

    def walk(dev, errno=None, reached="RTS", error=None):
        steps = [QpStep("INIT", True), QpStep("RTR", errno is None, errno)]
        steps += [QpStep("RTS", True)] if errno is None else []
        return QpResult(dev, 1, 1 if dev == "arxe1" else 0, V4 if dev == "arxe1" else FE80, "fabric IP", "10.9.0.1",
                        reached=reached, errno=errno, error=error, steps=steps)

    m = {"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=arxe1"}
    for results, env in (([walk("arxe1")], m), ([walk("zrxe0", -22, "INIT")], {}), ([walk("arxe1", -110, "INIT")], m),
                         ([walk("arxe1", -95, "INIT")], m), ([walk("arxe1", None, "INIT", "timed out after 5 s")], m),
                         ([walk("arxe1")], {}), ([], {"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=gone9"})):
        qp = QpFacts(ran=True, results=results)
        seen.add_verdicts([fabric.qp_rtr(ctx(host(env=env, qp=qp), peers=["10.9.0.1"]))],
                          f"qp {[(r.device, r.errno, r.error) for r in results]} {env}")
    seen.add_verdicts([fabric.qp_rtr(ctx(host(qp=QpFacts(failed="QP walk timed out"))))], "qp probe failed")


def _rail_runs(tmp: Path, seen: Seen) -> None:
    """fabric.rail-bandwidth and fabric.port-counters: the lab's saved bandwidth runs replayed as pair.json
    (lab band and expert band), and bandwidth runs as the pair probe records them (tests/test_rail_bandwidth.py)
    at the expert bands: healthy, below, the stale-initialization band, far below, stopped, never started."""
    from test_rail_bandwidth import EXPERT, _judge, _pair, _pc

    for name in ("bw-client", "bw-server", "bw-fault-client", "bw-fault-server"):
        snap = tmp / name
        snap.mkdir()
        (snap / "pair.json").write_text((REPO / "tests" / "fixtures" / "lab-rail" / f"{name}.json").read_text())
        for role in (["--playbook", str(REPO / "lab" / "playbook-rxe.toml")], ["--role", "expert"]):
            seen.add(report(["fabric", "--snapshot", str(snap), *role])["gates"], f"lab rail {name} {role}")
    stopped = _pair(40.0, error="work completion status 12 on QP 101", stage="run", verified=False,
                    counters=[_pc(retry_exceeded_err=1), _pc("peer", "mlx5_1")])
    never = _pair(None, error="cannot reach 192.168.100.11:18515 over TCP: Connection refused", stage="handshake")
    never.bandwidth.counters = []
    for p in (_pair(95.0), _pair(50.0), _pair(12.0), _pair(12.0, speed=None), _pair(3.0), stopped, never,
              _pair(95.0, counters=[_pc(carrier_changes=2), _pc("peer", "mlx5_1")]), None):
        seen.add_verdicts(list(_judge(copy.deepcopy(p), **EXPERT)), f"rail {p.bandwidth.gbps if p else None}")


def _memreg_runs(tmp: Path, seen: Seen) -> None:
    """fabric.mem-registration on the probe's readings (tests/test_mem_registration.py's Spark and H200)."""
    from test_mem_registration import _cma, _count, _dev, _dmabuf_eopnotsupp, h200, spark

    readings = [spark(), h200(), _dmabuf_eopnotsupp(), _cma(spark(), 70000), _count(_cma(spark(), 70000), 9),
                _count(spark(), 9), _count(spark(), 7, memlock=8 << 20),
                spark(verbs={"devices": [_dev("rocep1s0f0", host=False)]}),
                spark(memlock_soft_bytes=8 << 20, verbs={"devices": [_dev("rocep1s0f0", host=False)]}),
                spark(verbs={"devices": [], "why": "pyverbs is not installed: apt install python3-pyverbs"})]
    c02 = fabric_case("02-")
    gds = tmp / "gds.toml"  # a site's role whose engine registers GPU memory
    gds.write_text('[fabric]\nengine_registers = "gpu"\n')
    for i, r in enumerate(readings):
        snap = derive(c02, tmp / f"memreg{i}", {"memreg.json": json.dumps(r)})
        for role in (["--role", "expert"], ["--playbook", str(gds)]):
            seen.add(report(["all", "--snapshot", str(snap), *role, "--fabric-ip", "192.168.100.11"])["gates"],
                     f"memreg {i} {role}")
    from afddiag.gates import Context, fabric, resolve_fabric_ip
    from afddiag.model.fabric import MemRegFacts
    from afddiag.model.run import Inputs, Observation

    obs = Observation("h", "test", memreg=MemRegFacts(failed="memory registration probe timed out"))
    seen.add_verdicts([fabric.mem_registration(Context(obs, Inputs(), resolve_fabric_ip(None, None)))], "memreg failed")


def _nic_runs(tmp: Path, seen: Seen) -> None:
    """fabric.cx7-hotplug (and the no-device path it changes) on nic.json readings of a Spark: functions present,
    absent for want of a cable (debug_state 0, RDMA devices gone), absent though a cable was seen."""
    fn = [{"bdf": "0000:01:00.0", "device": "0x1021", "driver": "mlx5_core"}]
    c02 = fabric_case("02-")
    for i, (funcs, debug) in enumerate(((fn, 1), ([], 0), ([], 1))):
        nic = {"hotplug_driver": True, "hotplug_enabled": 1, "debug_state": debug, "functions": funcs}
        gone = {"sys/class/infiniband": None} if not funcs else {}
        snap = derive(c02, tmp / f"nic{i}", {"nic.json": json.dumps(nic), **gone})
        for role in (["--role", "expert"], ["--fabric-ip", "192.168.100.11"], []):
            seen.add(report(["all", "--snapshot", str(snap), *role])["gates"], f"nic {i} {role}")
    from test_nic_kernel_log import FAULTS, HEALTHY_BOOT  # fabric.nic-kernel-log on saved kernel logs

    for i, lines in enumerate([HEALTHY_BOOT, *([line] for line, _v, _a in FAULTS)]):
        snap = derive(c02, tmp / f"niclog{i}", {"dmesg.txt": "\n".join(lines) + "\n"})
        seen.add(report(["all", "--snapshot", str(snap), "--role", "expert"])["gates"], f"nic log {i}")


def _known_bad_runs(tmp: Path, seen: Seen) -> None:
    """host.known-bad on case 02 as captured (nothing checkable), with a kernel outside every range, and with
    kernel 6.17.0-1008 (the matrix's boot-panic entry)."""
    c02 = fabric_case("02-")
    for i, kernel in enumerate((None, "6.17.0-1031-nvidia\n", "6.17.0-1008-nvidia\n")):
        snap = derive(c02, tmp / f"knownbad{i}", {"proc/sys/kernel/osrelease": kernel})
        seen.add(report(["all", "--snapshot", str(snap), "--role", "expert"])["gates"], f"known-bad {i}")


def _host_runs(tmp: Path, seen: Seen) -> None:
    """host.pcie on a probe reading (tests/test_pcie.py's host), host.cpu-clock on cpu.json readings."""
    from afddiag.probes.pcie import read_pcie
    from test_pcie import fake_host

    for i, nic in enumerate((("32.0 GT/s PCIe", "16"), ("16.0 GT/s PCIe", "16"), ("32.0 GT/s PCIe", "4"))):
        snap = tmp / f"pcie{i}"
        snap.mkdir()
        (snap / "pcie.json").write_text(json.dumps(read_pcie(fake_host(tmp / f"pciehost{i}", nic=nic))))
        seen.add(report(["all", "--snapshot", str(snap)])["gates"], f"pcie {nic}")
    for i, kind in enumerate(("correctable", "nonfatal", "fatal")):  # host.pcie-aer on aer.json readings
        snap = tmp / f"aer{i}"
        snap.mkdir()
        dev = {"bdf": "0000:01:00.0", "kind": "nic", kind: f"DLP 1\nTOTAL_ERR_{kind[:3].upper()} 1\n"}
        (snap / "aer.json").write_text(json.dumps({"boot_id": "b", "devices": [dev]}))
        seen.add(report(["all", "--snapshot", str(snap)])["gates"], f"aer {kind}")
    cpus = [{"model": "Cortex-X925", "under_load_mhz": 3900, "max_mhz": 3900, "loop_mops": 10.0},
            {"model": "Cortex-X925", "under_load_mhz": 1800, "max_mhz": 3900, "loop_mops": 10.0,  # stuck, throttling
             # throttling ruled out:
             "thermal_zones": [{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 54.0, "trip_c": 95.0}]},
            {"model": "Cortex-X925", "under_load_mhz": 3900, "max_mhz": 3900, "loop_mops": 10.0, "failed": "timed out"},
            {"model": "vCPU", "under_load_mhz": None, "max_mhz": None, "loop_mops": 8.0}]
    for i, cpu in enumerate(cpus):
        for role in ("generic", "expert"):
            snap = tmp / f"cpu{i}{role}"
            snap.mkdir()
            (snap / "cpu.json").write_text(json.dumps(cpu))
            seen.add(report(["all", "--snapshot", str(snap), "--role", role])["gates"], f"cpu {cpu} {role}")


def _launch_runs(tmp: Path, seen: Seen) -> None:
    """The launch gates on a whole host (case 12 + the RTX 5090 case) with launch env files, limits and
    reach readings as the probes record them."""
    gpu = CASES / "gpu" / "04-rtx5090-image-exported-for-188-sms" / "gpu.json"
    c12 = fabric_case("12-")
    lims = {"unlimited": UNLIMITED,
            "8MiB": {**UNLIMITED, "memlock_soft_bytes": 8 << 20,
                     "device_nodes": [{"path": "/dev/infiniband/uverbs0", "readable": True, "writable": False}]},
            "no-cm": {**UNLIMITED, "device_nodes": UNLIMITED["device_nodes"][:1]},
            "failed": {**UNLIMITED, "failed": "getrlimit timed out"}}
    att = [{"peer": "198.51.100.73", "port": p, "source": "198.51.100.72", "ok": o == "connected", "outcome": o,
            "errno": None, "error": None if o == "connected" else o, "elapsed_ms": 1.0}
           for p, o in ((29500, "connected"), (29501, "timeout"))]
    reach = {"ok": {"source": "198.51.100.72", "peers": ["198.51.100.73"], "ports": [29500], "attempts": att[:1],
                    "notes": []},
             "dropped": {"source": "198.51.100.72", "peers": ["198.51.100.73"], "ports": [29500, 29501],
                         "attempts": att, "notes": []},
             "none": {"source": "198.51.100.72", "peers": [], "ports": [], "attempts": [], "notes": []}}
    envs = [{"AFD_ROLE": "coordinator", "AFD_FABRIC_IP": "198.51.100.72", "AFD_PREFILL_CAPACITY": "1024",
             "AFD_EXPERT_CAPACITY": "1024", "AFD_ENGINE_PORTS": "29500"},
            {"AFD_ROLE": "coordinator", "AFD_PREFILL_CAPACITY": "4096", "AFD_EXPERT_CAPACITY": "256"},
            {"AFD_ROLE": "coordinator", "AFD_FABRIC_IP": "10.1.1.1", "AFD_PREFILL_CAPACITY": "1024",
             "AFD_GPU_MEMORY_RESERVATION": "0.92", "AFD_ADVERTISE_ADDR": "0.0.0.0", "AFD_ENGINE_PORTS": "29500"},
            {"AFD_ROLE": "generic", "AFD_PREFILL_CAPACITY": "1024"},
            {"AFD_ROLE": "expert", "AFD_FABRIC_IP": "198.51.100.72", "AFD_EXPERT_CAPACITY": "256"}]
    for li, (lname, lim) in enumerate(lims.items()):
        for ri, (rname, r) in enumerate(reach.items()):
            snap = derive(c12, tmp / f"launch{li}{ri}", {"gpu.json": gpu.read_text(), "limits.json": json.dumps(lim),
                                                        "reach.json": json.dumps(r), "env": None})
            for ei, env in enumerate(envs):
                if ri and ei % 2:  # every env once per limits reading, the reach readings with the others
                    continue
                le = envfile(tmp, f"l{li}{ri}{ei}.env", env)
                seen.add(report(["all", "--snapshot", str(snap), "--launch-env", str(le), "--peer", "198.51.100.73"])
                         ["gates"], f"launch {lname} {rname} {env}")
    from afddiag.gates import Context, launch, resolve_fabric_ip
    from afddiag.model.host import ReachFacts
    from afddiag.model.run import Inputs, Observation

    obs = Observation("h", "test", reach=ReachFacts(captured=False, failed="control-plane probe timed out"))
    seen.add_verdicts([launch.control_plane(Context(obs, Inputs(), resolve_fabric_ip(None, None)))], "reach failed")
    seen.add(report(["all", "--snapshot", str(c12), "--expect-capacity", "512",
                     "--launch-env", str(envfile(tmp, "cap.env", envs[4]))])["gates"], "capacity vs --expect-capacity")


def _nccl_readings() -> list[dict]:
    """nccl.json readings as the NCCL probe records them (tests/test_nccl_audit.py): one system copy, a wheel
    build of the same version loaded before it, a leftover /etc/nccl.conf line, no copy found."""
    lib, wheel = "/usr/lib/aarch64-linux-gnu", "/opt/e/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
    one = {"path": f"{lib}/libnccl.so.2", "real_path": f"{lib}/libnccl.so.2.28.9", "origin": "system", "where": lib,
           "version": "2.28.9", "build_id": "a1" * 20}
    two = {**one, "path": wheel, "real_path": wheel, "origin": "wheel", "build_id": "b2" * 20}
    conf = [{"path": "/etc/nccl.conf", "lines": [{"line": 1, "key": "NCCL_P2P_DISABLE", "value": "1"}]}]
    return [{"copies": [one]}, {"copies": [two, one]}, {"copies": [one], "conf_files": conf},
            {"copies": [], "searched": ["/usr/lib"]}]


def _nccl_runs(tmp: Path, seen: Seen) -> None:
    """launch.nccl and launch.engine-net on case 12 (fabric IP 198.51.100.72 on mlx5_0 port 1) with the NCCL
    probe's readings and engine logs as NCCL prints them with NCCL_DEBUG=INFO (tests/test_engine_log.py)."""
    p = "coord:7:7 [0] NCCL INFO "
    logs = ["", f"{p}NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:198.51.100.72<0>\n{p}Using network IB",
            f"{p}NET/IB : Using [0]mlx5_9:1/RoCE; OOB eth0:198.51.100.72<0>\n{p}Using network IB",
            f"{p}NET/Socket : Using [0]eth0:198.51.100.72<0>\n{p}Using network Socket"]
    for i, (nccl, log) in enumerate(zip(_nccl_readings(), logs, strict=True)):
        snap = derive(fabric_case("12-"), tmp / f"nccl{i}", {"nccl.json": json.dumps(nccl), "engine.log": log + "\n"})
        for role in ("expert", "generic"):
            seen.add(report(["all", "--snapshot", str(snap), "--role", role, "--fabric-ip", "198.51.100.72"])["gates"],
                     f"nccl {i} {role}")


def test_every_fabric_host_and_launch_gate_action_is_listed_in_the_catalog(tmp_path):
    seen = Seen()
    _case_runs(tmp_path, seen)
    _fabric_incidents(tmp_path, seen)
    _qp_runs(seen)
    _memreg_runs(tmp_path, seen)
    _rail_runs(tmp_path, seen)
    _nic_runs(tmp_path, seen)
    _known_bad_runs(tmp_path, seen)
    _host_runs(tmp_path, seen)
    _launch_runs(tmp_path, seen)
    _nccl_runs(tmp_path, seen)
    want = {("fabric.link", "FIX_LINK"), ("fabric.link", "RERUN"), ("fabric.rocev2-ipv4", "SET_ENV"),
            ("fabric.rocev2-ipv4", "HW_INSPECTION"), ("fabric.first-device", "FIX_ADDRESS"),
            ("fabric.first-device", "RERUN"), ("fabric.qp-rtr", "FIX_ROUTE"), ("fabric.qp-rtr", "SET_ENV"),
            ("fabric.mem-registration", "REBOOT"), ("fabric.mem-registration", "RAISE_LIMIT"),
            ("fabric.mem-registration", "LOAD_DRIVER"), ("fabric.mem-registration", "STOP_PROCESSES"),
            ("fabric.rdma-present", "RERUN"), ("fabric.rail-bandwidth", "REBOOT"), ("fabric.cx7-hotplug", "FIX_LINK"),
            ("fabric.nic-kernel-log", "REBOOT"), ("fabric.nic-kernel-log", "HW_INSPECTION"),
            ("fabric.nic-kernel-log", "FIX_LINK"),
            ("host.known-bad", "UPDATE_VERSIONS"),
            ("fabric.rail-bandwidth", "CHECK_FABRIC"), ("fabric.port-counters", "FIX_LINK"),
            ("fabric.route", "FIX_ROUTE"), ("fabric.arp", "SET_SYSCTL"),
            ("host.pcie", "HW_INSPECTION"), ("host.pcie-aer", "HW_INSPECTION"), ("host.cpu-clock", "AC_POWER_CYCLE"),
            ("launch.control-plane", "SET_ENV"), ("launch.control-plane", "OPEN_PORTS"),
            ("launch.fabric-address", "SET_ENV"), ("launch.memlock", "RAISE_LIMIT"),
            ("launch.uverbs-access", "PASS_DEVICES"), ("launch.memory-plan", "SET_ENV"), ("launch.capacity", "SET_ENV")}
    seen.check("fabric", want)
    seen.check("host", want)
    seen.check("launch", want)


# ---------------------------------------------------------------------------------------------- fleet


def _merge(tmp: Path, reports: list[dict], *extra: str) -> dict:
    f = tmp / f"fleet{len(list(tmp.glob('fleet*.json')))}.json"
    f.write_text(json.dumps(reports))
    return report(["merge", str(f), *extra])


def _garbage(tmp: Path) -> Path:
    f = tmp / "garbage.json"
    f.write_text("{not json")
    return f


def _host_reports(tmp: Path) -> dict[str, dict]:
    """Per-host reports of the shared Spark cases (spark-a: case 01, spark-b: case 02) and a coordinator
    (case 12 + the RTX 5090 case), each with a launch env, as `afddiag all --json` writes them."""
    out = {}
    hosts = {"spark-a": ("01-", "192.168.100.10", "expert", {"AFD_EXPERT_CAPACITY": "256"}),
             "spark-b": ("02-", "192.168.100.11", "expert", {"AFD_EXPERT_CAPACITY": "256"}),
             "coord": ("12-", "198.51.100.72", "coordinator", {"AFD_PREFILL_CAPACITY": "256"})}
    for name, (prefix, ip, role, env) in hosts.items():
        case = fabric_case(prefix)
        snap = derive(case, tmp / name, {"host": f"{name}\n", "env": None, "case.json": None})
        meta = load_case(case)
        le = envfile(tmp, f"{name}.env", {**(meta.get("env") or {}), "AFD_FABRIC_IP": ip, "AFD_ROLE": role, **env})
        out[name] = report(["all", "--snapshot", str(snap), "--launch-env", str(le)])
        assert out[name]["host"] == name
    return out


def test_every_fleet_gate_action_is_listed_in_the_catalog(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import merge_scaling  # the planted-fault fleet tests/test_merge.py judges
    from test_fleet_control_plane import _report as cp_report

    seen = Seen()
    fix = REPO / "tests" / "fixtures" / "lab-fleet"
    for run in ("fleet-faults", "fleet-link-down", "fleet-faults-control-plane"):  # the lab's recorded fleets
        live = json.loads((fix / f"{run}.json").read_text())
        reps = [live["reports"][h["name"]] for h in live["hosts"]]
        fr = _merge(tmp_path, reps, "--inventory", str(fix / "inventory.toml"))
        seen.add(fr["gates"], run)
    paths = merge_scaling.make_reports(1000, tmp_path / "thousand")  # planted: capacity, MTU, subnet, map, kernel, slow
    seen.add(report(["merge", *map(str, paths)])["gates"], "1000 reports")
    seen.add(report(["merge", *map(str, paths[:3]), "--expect-capacity", "512"])["gates"], "3 reports, capacity 512")

    hosts = _host_reports(tmp_path)
    a, b, coord = hosts["spark-a"], hosts["spark-b"], hosts["coord"]
    seen.add(_merge(tmp_path, [a, b])["gates"], "spark-a, spark-b")
    bad_k = derive(fabric_case("02-"), tmp_path / "spark-k1008", {"host": "spark-k\n", "case.json": None,
                                                                  "proc/sys/kernel/osrelease": "6.17.0-1008-nvidia\n"})
    k1008 = report(["all", "--snapshot", str(bad_k), "--role", "expert"])  # fleet.known-bad's WARN
    seen.add(_merge(tmp_path, [a, k1008])["gates"], "spark-a, a spark on kernel 6.17.0-1008")
    ok_k = derive(bad_k, tmp_path / "spark-k1031", {"proc/sys/kernel/osrelease": "6.17.0-1031-nvidia\n"})
    seen.add(_merge(tmp_path, [report(["all", "--snapshot", str(ok_k), "--role", "expert"])])["gates"],
             "a spark on kernel 6.17.0-1031")
    seen.add(_merge(tmp_path, [a, b, coord])["gates"], "spark-a, spark-b, coord (another subnet)")
    nccl = {}  # fleet.nccl-build: two ranks on one libnccl build, a third on the wheel's build of the same version
    for name, reading in (("nccl-a", 0), ("nccl-b", 0), ("nccl-c", 1)):
        snap = derive(fabric_case("02-"), tmp_path / name, {"host": f"{name}\n", "case.json": None,
                                                            "nccl.json": json.dumps(_nccl_readings()[reading])})
        nccl[name] = report(["all", "--snapshot", str(snap), "--role", "expert"])
    seen.add(_merge(tmp_path, [nccl["nccl-a"], nccl["nccl-b"]])["gates"], "one NCCL build")
    seen.add(_merge(tmp_path, [nccl["nccl-a"], nccl["nccl-c"]])["gates"], "two NCCL builds")
    p = "spark:7:7 [0] NCCL INFO "  # fleet.engine-net: two ranks on RoCE, a third fell back to sockets
    logs = {"net-a": f"{p}NET/IB : Using [0]rocep1s0f1:1/RoCE; OOB enp1s0f1np1:192.168.100.11<0>\n{p}Using network IB",
            "net-c": f"{p}NET/Socket : Using [0]enp1s0f1np1:192.168.100.11<0>\n{p}Using network Socket"}
    net = {}
    for name, log in (("net-a", logs["net-a"]), ("net-b", logs["net-a"]), ("net-c", logs["net-c"])):
        snap = derive(fabric_case("02-"), tmp_path / name, {"host": f"{name}\n", "case.json": None,
                                                            "engine.log": log + "\n"})
        net[name] = report(["all", "--snapshot", str(snap), "--role", "expert"])
    seen.add(_merge(tmp_path, [net["net-a"], net["net-b"]])["gates"], "ranks on RoCE")
    seen.add(_merge(tmp_path, [net["net-a"], net["net-c"]])["gates"], "a rank on sockets")
    # spark-b's NCCL_IB_HCA selects its second rail (192.168.101.0/24): spark-a has an address there, coord none
    le = envfile(tmp_path, "rails.env", {"AFD_FABRIC_IP": "192.168.100.11", "AFD_EXPERT_CAPACITY": "256",
                                         "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1", "NCCL_IB_GID_INDEX": "3",
                                         "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "192.168.100.11=rocep1s0f1"})
    snap_b = derive(fabric_case("02-"), tmp_path / "spark-b-rails",
                    {"host": "spark-b\n", "env": None, "case.json": None})
    b_rails = report(["all", "--snapshot", str(snap_b), "--role", "expert", "--launch-env", str(le)])
    seen.add(_merge(tmp_path, [a, b_rails])["gates"], "rail with a peer")
    seen.add(_merge(tmp_path, [coord, b_rails])["gates"], "rail without a peer")
    # spark-a without a fabric IP (ambiguous), without a launch env, without fabric facts
    bare_a = derive(fabric_case("01-"), tmp_path / "bare-a", {"host": "spark-a\n", "case.json": None})
    bare = report(["all", "--snapshot", str(bare_a)])
    seen.add(_merge(tmp_path, [bare, b])["gates"], "spark-a ambiguous, no launch env")
    gpu_only = report(["all", "--snapshot", str(CASES / "gpu" / "01-gb10-healthy-unified-memory")])
    seen.add(_merge(tmp_path, [gpu_only, b])["gates"], "a host without fabric facts")
    seen.add(_merge(tmp_path, [gpu_only, bare])["gates"], "no launch env anywhere")
    seen.add(report(["merge", str(_garbage(tmp_path))])["gates"], "no host report (a file that does not parse)")
    # a forced GID index that does not fit every host; versions drifted; a slow and a busy GPU
    forced = copy.deepcopy(b)
    forced["summary"]["gid_index_env"] = "1"
    seen.add(_merge(tmp_path, [a, forced])["gates"], "NCCL_IB_GID_INDEX forced")
    from afddiag.gates import fleet as fg
    from test_merge import _host

    units = [_host("a", gid_index=3, env={"NCCL_IB_GID_INDEX": "3"}),
             _host("c", gid_index=1, env={"NCCL_IB_GID_INDEX": "3"})]  # c forces 3 at its GID 1
    seen.add_verdicts([fg.gid_index(units, {}), fg.versions([_host("a"), _host("b", driver="575.9")], {}),
                       fg.versions([_host("a"), _host("b", afddiag="0.0.1")], {})], "units")
    from test_fleet_like_with_like import _rep

    seen.add_verdicts([fg.devicemap([_rep("order-unknown", first="WARN")], {})], "map unset, device order unknown")
    load = [_host(f"r{i}", under_load={"bf16_tflops": 90.0 + i, "clock_sm_mhz": 2300}) for i in range(4)]
    seen.add_verdicts([fg.gpu(load, {}), fg.gpu(load + [_host("r9", under_load={"bf16_tflops": 36.5})], {})], "gpu")
    busy = copy.deepcopy(b)
    busy["summary"]["slow_state"] = {"verdict": "WARN", "summary": "gpu.slow-state inconclusive: the GPU is busy"}
    seen.add(_merge(tmp_path, [a, busy])["gates"], "a busy GPU")
    # control-plane connects recorded on each host (tests/test_fleet_control_plane.py's fleet)
    for outcomes in ({"coord": {"spark-a": "connected", "spark-b": "connected"}, "spark-a": {"coord": "connected"},
                      "spark-b": {"coord": "refused"}},
                     {"coord": {"spark-a": "connected", "spark-b": "timeout"}, "spark-a": {"coord": "connected"},
                      "spark-b": {"coord": "connected"}},
                     {"coord": {"spark-a": "connected"}, "spark-a": {"coord": "connected"},
                      "spark-b": {"spark-a": "refused"}}):
        d = tmp_path / f"cp{len(list(tmp_path.glob('cp*')))}"
        d.mkdir()
        reps = [cp_report(d, capsys, n, o) for n, o in outcomes.items()]
        seen.add(_merge(tmp_path, reps)["gates"], f"control plane {outcomes}")
    d = tmp_path / "cp-advertised"
    d.mkdir()
    reps = [cp_report(d, capsys, "coord", {"spark-a": "connected"}, env=("AFD_ADVERTISE_ADDR=0.0.0.0",)),
            cp_report(d, capsys, "spark-a", {"coord": "connected"})]
    seen.add(_merge(tmp_path, reps)["gates"], "control plane advertised wildcard")
    want = {("fleet.fabric-ip", "SET_ENV"), ("fleet.fabric-ip", "FIX_ADDRESS"), ("fleet.capacity", "SET_ENV"),
            ("fleet.mtu", "SET_MTU"), ("fleet.devicemap", "SET_ENV"), ("fleet.gid-index", "SET_ENV"),
            ("fleet.gpu", "AC_POWER_CYCLE"), ("fleet.gpu", "RERUN"), ("fleet.versions", "UPDATE_VERSIONS"),
            ("fleet.versions", "UPDATE_PACKAGE"),
            ("fleet.rails", "SET_ENV"), ("fleet.control-plane", "OPEN_PORTS"), ("fleet.control-plane", "SET_ENV"),
            ("fleet.control-plane", "RERUN")}
    seen.check("fleet", want)
