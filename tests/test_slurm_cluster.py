"""A real Slurm cluster (issue 25): Debian's munged, slurmctld and one slurmd per network namespace, started
as an operator would, and afddiag's Slurm pieces observed through it with ``scontrol show node`` and
``sinfo -R``: collection by ``srun -N2`` + ``afddiag merge``, the HealthCheckProgram draining and resuming
a node, a Prolog refusing a job on an unfit node.

Topology: slurmctld and munged on this host; a bridge here holding 10.231.N.1/24 and, per node, a
network namespace joined to it by a veth pair (10.231.N.11, .12), a slurmd inside it started with
``nsenter --net`` (``ip netns exec`` remounts /sys and slurmd then finds no cgroup filesystem). One munged
serves every namespace (its socket is a file). Each node "is" a recorded case: its HealthCheckProgram and
Prolog run afddiag through tests/slurmnode.py with the host replaced by the snapshot the test assigns.

Needs root and Debian's slurmd, slurmctld, slurm-client and munge (lab/setup.sh installs them); outside
CI a missing package skips, under CI it fails.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import case_dirs, load_case
from snapfix import link_down

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
NEEDED = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "scontrol", "nsenter", "ip")
NODES = ("afd-n1", "afd-n2")
HEALTH_INTERVAL_S = 5
FABRIC = {c.name[:3]: c for c in case_dirs("fabric")}


def _run(argv: list[str], timeout: float = 20, check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _free_subnet() -> str:
    """A 10.231.N /24 no interface here uses (N from the pid, so two runs on one host differ)."""
    used = _run(["ip", "-4", "-o", "addr"]).stdout
    for k in range(250):
        n = (os.getpid() + k) % 250 + 1
        if f" 10.231.{n}." not in used:
            return f"10.231.{n}"
    raise RuntimeError("no free 10.231.N.0/24 subnet")


def _wait(what: str, probe, deadline_s: float, every_s: float = 0.5):
    """Poll ``probe()`` until it returns something true; the last value is in the error."""
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {deadline_s} s (last: {last!r})")


class Cluster:
    """Paths, environment and processes of one test cluster."""

    def __init__(self, d: Path):
        self.d = d
        self.tag = f"{os.getpid() % 100000}"
        self.netns = [f"afdslurm-{self.tag}-{i}" for i in range(len(NODES))]
        self.bridge = f"afdsbr{self.tag}"
        self.veths = [f"afds{self.tag}h{i}" for i in range(len(NODES))]
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = d / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def cmd(self, *argv: str, timeout: float = 20, check: bool = True) -> subprocess.CompletedProcess:
        return _run(list(argv), timeout=timeout, check=check, env=self.env)

    def node(self, name: str) -> dict[str, str]:
        """``scontrol show node NAME -o`` as key → value (Reason keeps its spaces)."""
        line = self.cmd("scontrol", "show", "node", name, "-o").stdout.strip()
        head, _, reason = line.partition(" Reason=")
        out = dict(f.split("=", 1) for f in head.split() if "=" in f)
        if reason:
            out["Reason"] = reason.rsplit(" [", 1)[0]  # "text [root@time]"
        return out

    def states(self) -> dict[str, str]:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(out[::2], out[1::2], strict=True))

    def assign(self, node: str, hook: str, snapshot: Path | str | None, fabric_ip: str = "-", bound_s: int = 0):
        """Node NAME's ``hook`` (health, prolog) now reads ``snapshot`` ("hang": a run that never ends), bounded
        at ``bound_s`` (0: the hook's default); None: the hook passes unrun."""
        f = self.d / "nodes" / f"{node}.{hook}"
        if snapshot is None:
            f.unlink(missing_ok=True)
        else:
            tmp = f.with_suffix(".tmp")
            tmp.write_text(f"{snapshot} {fabric_ip}{f' {bound_s}' if bound_s else ''}\n")
            tmp.replace(f)

    def judged(self, node: str, hook: str, snapshot: Path | str, deadline_s: float = 30) -> int:
        """Wait until a run of NODE's ``hook`` that judged ``snapshot`` finishes (the hook logs what each
        run read when it started); its exit code."""
        runs = self.d / "nodes" / f"{node}.{hook}.runs"
        seen = len(runs.read_text().splitlines()) if runs.exists() else 0

        def finished():
            lines = runs.read_text().splitlines()[seen:] if runs.exists() else []
            return next((ln for ln in lines if ln.split()[1:2] == [str(snapshot)]), None)

        return int(_wait(f"{node}'s {hook} judged {snapshot}", finished, deadline_s).split()[0])

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.d / f"{name}.out", "wb")  # noqa: SIM115  # closed by the child's exit
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            stdin=subprocess.DEVNULL)
        log.close()


def _hook(c: Cluster, hook: str, script: str) -> Path:
    """The Prolog / HealthCheckProgram slurm.conf names: the playbook script with afddiag as this node."""
    p = c.d / f"{hook}.sh"
    p.write_text(
        "#!/bin/sh\n"
        f'f="{c.d}/nodes/${{SLURMD_NODENAME:?}}.{hook}"\n'
        '[ -e "$f" ] || exit 0\n'
        'cp "$f" "$f.now"\n'
        'read -r _ _ bound < "$f.now"\n'
        '[ -z "$bound" ] || export AFDDIAG_TIMEOUT="$bound"\n'
        f'export AFDDIAG_NODE_CASE="$f.now" SLURM_CONF="{c.conf}" AFDDIAG_SLURM_CONF="{c.conf}" '
        f'AFDDIAG_STATE_DIR="{c.d}/state-afddiag" PYTHONPATH="{REPO}:{REPO / "tests"}" '
        f'PATH="/usr/sbin:/usr/bin:/sbin:/bin" AFDDIAG="{sys.executable} {REPO / "tests" / "slurmnode.py"}"\n'
        f'bash "{REPO / "playbooks" / "slurm" / script}"\n'
        'rc=$?\n'
        'echo "$rc $(cat "$f.now")" >> "$f.runs"  # what this run judged, once it finished\n'
        'exit "$rc"\n')
    p.chmod(0o755)
    return p


def _write_conf(c: Cluster, net: str, ctld_port: int) -> None:
    host = socket.gethostname().split(".")[0]
    nodes = "\n".join(f"NodeName={n} NodeAddr={net}.{11 + i} CPUs=1 RealMemory=100 State=UNKNOWN"
                      for i, n in enumerate(NODES))
    c.conf.write_text(f"""\
ClusterName=afdtest
SlurmctldHost={host}({net}.1)
SlurmctldPort={ctld_port}
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={c.d}/munge/munge.socket
CredType=cred/munge
StateSaveLocation={c.d}/ctld
SlurmdSpoolDir={c.d}/spool/%n
SlurmctldPidFile={c.d}/slurmctld.pid
SlurmdPidFile={c.d}/slurmd-%n.pid
SlurmctldLogFile={c.d}/slurmctld.log
SlurmdLogFile={c.d}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
MinJobAge=2
KillWait=2
HealthCheckProgram={_hook(c, "health", "healthcheck.sh")}
HealthCheckInterval={HEALTH_INTERVAL_S}
HealthCheckNodeState=ANY
Prolog={_hook(c, "prolog", "prolog.sh")}
PrologFlags=Alloc
PrologEpilogTimeout=50
{nodes}
PartitionName=afd Nodes={NODES[0]},{NODES[1]} Default=YES MaxTime=5 State=UP
""")


def _network(c: Cluster, net: str) -> None:
    _run(["ip", "link", "add", c.bridge, "type", "bridge"])
    _run(["ip", "addr", "add", f"{net}.1/24", "dev", c.bridge])
    _run(["ip", "link", "set", c.bridge, "up"])
    for i, (ns, veth) in enumerate(zip(c.netns, c.veths, strict=True)):
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
        _run(["ip", "link", "set", veth, "master", c.bridge, "up"])
        for argv in (["addr", "add", f"{net}.{11 + i}/24", "dev", "eth0"], ["link", "set", "eth0", "up"],
                     ["link", "set", "lo", "up"]):
            _run(["ip", "-n", ns, *argv])


def _teardown(c: Cluster) -> list[str]:
    """Stop every daemon and job step, delete the namespaces and the bridge; what was left over."""
    left = []
    for name in [n for n in c.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
        p = c.procs.get(name)
        if p is None or p.poll() is not None:
            continue
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            left.append(f"{name} (pid {p.pid}) ignored SIGTERM for 10 s")
            p.kill()
            p.wait(timeout=5)
    for ns in c.netns:  # slurmstepd and job processes outlive slurmd: they are in the node's namespace
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            left.append(f"pid {pid} still in {ns}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r}"
                        if Path(f"/proc/{pid}").exists() else f"pid {pid} in {ns}")
            try:
                os.kill(int(pid), 9)
            except ProcessLookupError:
                pass
        _run(["ip", "netns", "del", ns], check=False)
    _run(["ip", "link", "del", c.bridge], check=False)
    for ns in c.netns:
        if Path(f"/run/netns/{ns}").exists():
            left.append(f"namespace {ns} not deleted")
    return left


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = [x for x in NEEDED if shutil.which(x) is None and not Path("/usr/sbin", x).exists()]
    if missing:
        msg = f"not installed: {', '.join(missing)} (Debian: slurmd slurmctld slurm-client munge; lab/setup.sh)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    if os.geteuid() != 0:
        pytest.skip("network namespaces and slurmd need root")
    d = tmp_path_factory.mktemp("slurm")
    d.chmod(0o755)
    c = Cluster(d)
    for sub in ("munge", "ctld", "spool", *(f"spool/{n}" for n in NODES), "nodes", "state-afddiag"):
        (d / sub).mkdir(mode=0o700)
    key = d / "munge" / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o400)
    net = _free_subnet()
    try:
        _network(c, net)
        _write_conf(c, net, _free_port())
        c.start("munged", ["munged", "-F", "--force", f"--key-file={key}", f"--socket={d}/munge/munge.socket",
                           f"--pid-file={d}/munge/munged.pid", f"--log-file={d}/munge/munged.log",
                           f"--seed-file={d}/munge/munged.seed"])
        _wait("munged socket", lambda: (d / "munge" / "munge.socket").exists(), 10, 0.1)
        c.start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(c.conf)])
        for ns, n in zip(c.netns, NODES, strict=True):
            c.start(f"slurmd-{n}", ["nsenter", f"--net=/run/netns/{ns}", "slurmd", "-D", "-N", n, "-f", str(c.conf)])
        _wait("both nodes idle in sinfo", lambda: (s := c.cmd("sinfo", "-h", "-N", "-o", "%N %T", check=False))
              .returncode == 0 and sorted(s.stdout.split()) == sorted([*NODES, "idle", "idle"]), 40)
        yield c
    except BaseException:
        for f in ("slurmctld.log", *(f"slurmd-{n}.log" for n in NODES), "munge/munged.log"):
            if (d / f).exists():
                print(f"--- {f}\n" + (d / f).read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        left = _teardown(c)
    assert not left, left


def test_srun_collects_one_report_per_node_and_merge_names_the_faults(cluster, tmp_path):
    """The documented collection line (playbooks/slurm/README.md): one ``afddiag all --json`` per node of a 2-node
    allocation, each node judging its own host (here: a recorded case per node), merged here."""
    cases = {NODES[0]: FABRIC["01-"], NODES[1]: FABRIC["02-"]}  # spark-a and spark-b, one cable
    for n, snap in cases.items():
        (tmp_path / n).symlink_to(snap)
        (tmp_path / f"{n}.ip").write_text(load_case(snap)["fabric_ip"])
    out = tmp_path / "reports"
    out.mkdir()
    afddiag = REPO / ".venv" / "bin" / "afddiag"
    here = f"{tmp_path}/$SLURMD_NODENAME"
    p = cluster.cmd("srun", "-N2", "--ntasks-per-node=1", "--time=1", f"--output={out}/%t.json", "sh", "-c",
                    f'exec {afddiag} all --json --no-history --snapshot "{here}" --fabric-ip "$(cat "{here}.ip")"',
                    timeout=60, check=False)
    assert p.returncode != 0 and p.stderr.count("Exited with exit code 2") == 1, p.stderr  # spark-a FAILs
    reports = sorted(out.glob("*.json"))
    assert [r.name for r in reports] == ["0.json", "1.json"], (p.stderr, list(out.iterdir()))
    merged = _run([str(afddiag), "merge", "--json", *map(str, reports)], check=False)
    fleet = json.loads(merged.stdout)
    assert merged.returncode == fleet["exit_code"] == 2
    rows = {h["name"]: h for h in fleet["hosts"]}
    for snap in cases.values():  # every host in, judged, and failing exactly the gates its case says fail
        case = load_case(snap)
        row = rows.pop(case["host"])
        assert row["status"] == "ok" and row["fabric_ip"] == case["fabric_ip"], row
        assert sorted(row["failing"]) == sorted(g for g, v in case["expected"]["gates"].items() if v == "FAIL")
    assert rows == {}
    gates = {g["id"]: g for g in fleet["gates"]}
    assert gates["fleet.fabric-ip"]["verdict"] == "PASS"
    devicemap = gates["fleet.devicemap"]
    assert devicemap["verdict"] == "FAIL"
    assert "spark-a" in devicemap["summary"] and "spark-b" not in devicemap["summary"]


def _drained(cluster: Cluster, node: str):
    n = cluster.node(node)
    return n if "DRAIN" in n["State"] else None


def test_healthcheck_drains_a_node_that_fails_a_gate_and_resumes_it_when_fixed(cluster, tmp_path):
    """HealthCheckProgram=playbooks/slurm/healthcheck.sh, every 5 s: afd-n2's fabric port loses its cable
    (case 02 with the link down), the node is drained with afddiag's reason; the cable back, resumed."""
    healthy, down = FABRIC["02-"], link_down(tmp_path / "down")
    ip = load_case(healthy)["fabric_ip"]
    for n in NODES:
        cluster.assign(n, "health", healthy, ip)
    try:
        for n in NODES:
            assert cluster.judged(n, "health", healthy) == 0
        assert cluster.states() == dict.fromkeys(NODES, "idle")  # a fit node stays in service
        cluster.assign(NODES[1], "health", down, ip)
        t0 = time.monotonic()
        node = _wait("afd-n2 drained by its health check", lambda: _drained(cluster, NODES[1]), 40)
        drained_after = time.monotonic() - t0
        assert node["Reason"].startswith("afddiag: fabric.link: rocep1s0f1 port 1"), node  # gate: summary
        reasons = cluster.cmd("sinfo", "-R", "-h", "-o", "%n|%E").stdout
        assert f"{NODES[1]}|{node['Reason']}" in reasons and NODES[0] not in reasons, reasons
        assert len(node["Reason"].encode()) <= 80, node  # one short line, as sinfo -R shows it
        assert cluster.states()[NODES[0]] == "idle"
        cluster.assign(NODES[1], "health", healthy, ip)
        t0 = time.monotonic()
        _wait("afd-n2 resumed by its health check", lambda: not _drained(cluster, NODES[1]), 40)
        print(f"health check: drained after {drained_after:.1f} s ({node['Reason']!r}), "
              f"resumed after {time.monotonic() - t0:.1f} s", file=sys.stderr)
        assert cluster.node(NODES[1]).get("Reason") is None
    finally:
        for n in NODES:
            cluster.assign(n, "health", None)


def test_healthcheck_leaves_an_admins_drain_alone(cluster, tmp_path):
    """A node an admin drained (their reason) stays drained with their reason, unfit or fit."""
    healthy, down = FABRIC["02-"], link_down(tmp_path / "down")
    ip = load_case(healthy)["fabric_ip"]
    cluster.cmd("scontrol", "update", f"nodename={NODES[0]}", "state=drain", "reason=bad DIMM, ticket 4411")
    try:
        for snap in (down, healthy):
            cluster.assign(NODES[0], "health", snap, ip)
            cluster.judged(NODES[0], "health", snap)
            node = cluster.node(NODES[0])
            assert "DRAIN" in node["State"] and node["Reason"] == "bad DIMM, ticket 4411", node
    finally:
        cluster.assign(NODES[0], "health", None)
        cluster.cmd("scontrol", "update", f"nodename={NODES[0]}", "state=resume")


def test_healthcheck_drains_a_node_whose_run_hangs_and_resumes_it_once_judged_fit(cluster):
    """A run that does not finish within its bound judged nothing: the health check ends it (slurmd
    would kill the script at 60 s and the node would stay in service) and drains the node with a reason
    that says so; the next run that finishes fit resumes it. Nothing of the hung run is left (the
    fixture's teardown finds no process in the node's namespace)."""
    healthy = FABRIC["02-"]
    ip = load_case(healthy)["fabric_ip"]
    cluster.assign(NODES[1], "health", "hang", ip, bound_s=3)
    try:
        t0 = time.monotonic()
        assert cluster.judged(NODES[1], "health", "hang") == 0  # slurmd ignores the code: the drain is the signal
        node = _wait("afd-n2 drained after its run hung", lambda: _drained(cluster, NODES[1]), 10)
        print(f"health check: hung run drained after {time.monotonic() - t0:.1f} s ({node['Reason']!r})",
              file=sys.stderr)
        assert node["Reason"] == "afddiag: healthcheck: run not finished in 3 s", node
        cluster.assign(NODES[1], "health", healthy, ip)
        assert cluster.judged(NODES[1], "health", healthy) == 0
        _wait("afd-n2 resumed once judged fit", lambda: not _drained(cluster, NODES[1]), 10)
    finally:
        cluster.assign(NODES[1], "health", None)
        cluster.cmd("scontrol", "update", f"nodename={NODES[1]}", "state=resume", check=False)


def test_prolog_refuses_a_job_on_an_unfit_node(cluster, tmp_path):
    """Prolog=playbooks/slurm/prolog.sh: on afd-n2 (link down: FIX_LINK, a drain) the Prolog fails, Slurm
    drains the node ("Prolog error") and the job does not run there; afd-n1 (healthy) runs its job."""
    healthy, down = FABRIC["02-"], link_down(tmp_path / "down")
    ip = load_case(healthy)["fabric_ip"]
    cluster.assign(NODES[0], "prolog", healthy, ip)
    cluster.assign(NODES[1], "prolog", down, ip)
    ran = tmp_path / "ran"
    ran.mkdir()
    try:
        ok = cluster.cmd("srun", "-w", NODES[0], "--time=1", "sh", "-c", f"touch {ran}/$SLURMD_NODENAME",
                         timeout=40)
        assert ok.returncode == 0 and (ran / NODES[0]).exists()
        refused = cluster.cmd("srun", "-w", NODES[1], "--time=1", "--immediate=20", "sh", "-c",
                              f"touch {ran}/$SLURMD_NODENAME", timeout=60, check=False)
        assert refused.returncode != 0 and not (ran / NODES[1]).exists(), refused.stderr
        assert f"Prolog failure on node {NODES[1]}" in refused.stderr
        node = _wait("afd-n2 drained after its Prolog failed", lambda: _drained(cluster, NODES[1]), 20)
        assert "Prolog" in node["Reason"], node
        assert cluster.states()[NODES[0]] == "idle"
        log = (cluster.d / f"slurmd-{NODES[1]}.log").read_text(errors="replace")
        print(f"prolog: srun said {refused.stderr.strip()!r}; node reason {node['Reason']!r}", file=sys.stderr)
        assert "prolog failed: rc:2" in log and "NOT FIT" in log  # the verdict is in slurmd's log
        assert "prolog failed" not in (cluster.d / f"slurmd-{NODES[0]}.log").read_text(errors="replace")
    finally:
        for n in NODES:
            cluster.assign(n, "prolog", None)
        cluster.cmd("scontrol", "update", f"nodename={NODES[1]}", "state=resume", check=False)
