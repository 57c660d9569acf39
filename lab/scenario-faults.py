#!/usr/bin/env python3
"""Fault injection in the soft-RoCE lab: break the incident host while ``afddiag all`` runs and
between runs, and record what afddiag says (runs as root, in the VM that lab/boot.sh starts with
``AFDDIAG_LAB_SCRIPT=lab/scenario-faults.py``).

Usage (inside the VM): ``python lab/scenario-faults.py OUTDIR``

Topology: lab/labkit.py's incident host (imported, not copied): rxe ``zrxe0`` on va (no IPv4,
device index 0), rxe ``arxe1`` on vc (10.9.0.2/24), the peer 10.9.0.1 on vd in netns ``peer``.
Every run is ``afddiag all --json --fabric-ip 10.9.0.2 --peer 10.9.0.1 --timeout T --qp-timeout Q``
with ``DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=10.9.0.2=arxe1`` (the healthy baseline), in this
process (``afddiag.cli.run``) on a worker thread joined with a deadline, so a hang is recorded
instead of hanging the boot.

Faults, in order (each undone before the next unless said):
  baseline           nothing broken
  mtu-9000, mtu-600  ``ip link set vc mtu N``
  ip-removed         ``ip addr del 10.9.0.2/24 dev vc``
  port-down          ``ip link set vc down`` between runs
  peer-unreachable   the peer's address removed, neighbour cache flushed (stays for the next two)
  down-during-run    ``ip link set vc down`` once afddiag holds an open uverbs device (then up)
  delete-while-held  ``rdma link delete arxe1`` once afddiag holds an open uverbs device: the
                     delete blocks until afddiag closes its context (the device stays deleted)
  device-deleted     a run after arxe1 was deleted
  netns-gone         ``ip netns del peer`` (the veth pairs and so both rxe devices go with it)

After every run: ``rdma -j resource show qp`` / ``pd`` (QPs and PDs left that are not the kernel's
own), the uverbs file descriptors this process still holds. Writes OUTDIR/results.json,
OUTDIR/<fault>.json (afddiag's JSON) and OUTDIR/run.log. Exit 0 when every step ran.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

sys.path.insert(0, os.path.join(REPO, "lab"))
import labkit as lab  # noqa: E402  the topology (build, wait_ready), sh, sh_json, log

FABRIC_IP, PEER_IP = lab.FABRIC_IP, lab.PEER_IP
MAP = f"{FABRIC_IP}={lab.SECOND_DEV}"
TIMEOUT_S = 20.0  # --timeout: the fabric, GPU, CPU probes
QP_TIMEOUT_S = 8.0
CLI_ARGS = ["all", "--json", "--fabric-ip", FABRIC_IP, "--peer", PEER_IP, "--timeout", str(TIMEOUT_S),
            "--qp-timeout", str(QP_TIMEOUT_S)]
# A run may take: fabric + route + GPU + CPU bounds, and a QP walk per device; past it, it is a hang.
RUN_DEADLINE_S = 4 * TIMEOUT_S + 2 * QP_TIMEOUT_S + 30


def uverbs_fds() -> list[str]:
    """Open file descriptors of this process on /dev/infiniband/uverbs* (a device context held)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/infiniband/uverbs"):
            out.append(target)
    return out


def leftovers() -> dict:
    """QPs and PDs on any RDMA device that are not ib_core's own (GSI QP1 and its PD), and the
    uverbs descriptors this process still has open."""
    res = {}
    for kind in ("qp", "pd"):
        rows = lab.sh_json(["rdma", "-j", "resource", "show", kind])
        res[kind] = [r for r in rows if r.get("comm") != "ib_core" or r.get("pid") == os.getpid()] \
            if isinstance(rows, list) else rows
    res["uverbs_fds"] = uverbs_fds()
    return res


# A separate process watches this one's descriptors and applies the fault the moment the named
# device is held (pyverbs may keep the GIL inside a verbs call, so a thread here could miss it).
POLLER = r"""
import json, os, subprocess, sys, time
pid, target, deadline, cmd = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3]), sys.argv[4:]
print("ready", flush=True)
while time.monotonic() < deadline:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        break
    for fd in fds:
        try:
            hit = os.readlink(f"/proc/{pid}/fd/{fd}") == target
        except OSError:
            hit = False
        if hit:
            t = time.monotonic()
            p = subprocess.run(cmd, capture_output=True, text=True)
            print(json.dumps({"applied": True, "applied_mono": t, "done_mono": time.monotonic(), "rc": p.returncode,
                              "cmd": cmd, "stderr": p.stderr.strip()}), flush=True)
            sys.exit(0)
    time.sleep(0.002)
print(json.dumps({"applied": False, "cmd": cmd}), flush=True)
"""


def uverbs_path(dev: str) -> str | None:
    """``/dev/infiniband/uverbsN`` of RDMA device ``dev`` (from /sys/class/infiniband_verbs)."""
    base = "/sys/class/infiniband_verbs"
    for n in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if lab.read(f"{base}/{n}/ibdev") == dev:
            return f"/dev/infiniband/{n}"
    return None


PHASES: list[dict] = []  # every bounded probe of every run: what, start (s into the run), seconds, bound, failed
RUN_T0 = [0.0]  # time.monotonic() at the start of the current run


def instrument() -> None:
    """Time afddiag's bounded probes (``collect.guarded``), the gates and the history write, for
    the record; behaviour is unchanged."""
    import afddiag.collect as collect
    import afddiag.gates as gates

    real = collect.guarded

    def guarded(fn, timeout_s, what, progress=None):
        t = time.monotonic()
        value, failed = real(fn, timeout_s, what, progress)
        PHASES.append({"what": what, "start_s": round(t - RUN_T0[0], 3), "s": round(time.monotonic() - t, 3),
                       "bound_s": timeout_s, "failed": failed})
        return value, failed

    collect.guarded = guarded

    def timed(mod, attr: str, label: str) -> None:
        fn = getattr(mod, attr, None)
        if fn is None:
            return

        def wrapper(*a, **k):
            t = time.monotonic()
            try:
                return fn(*a, **k)
            finally:
                PHASES.append({"what": label, "start_s": round(t - RUN_T0[0], 3), "s": round(time.monotonic() - t, 3),
                               "bound_s": None, "failed": None})

        setattr(mod, attr, wrapper)

    timed(gates, "run_gates", "gates")
    try:
        import afddiag.history as history

        timed(history, "record_run", "history write")
    except ImportError:
        pass


def run_cli(name: str, fault_cmd: list[str] | None = None, hold_dev: str | None = None) -> dict:
    """``afddiag.cli.run(CLI_ARGS)`` on a worker thread joined with a deadline. With ``fault_cmd``,
    a watcher process runs it once this process holds ``hold_dev``'s uverbs device. Returns exit
    code, JSON, timing, whether it hung, the fault's record and the leftovers."""
    import afddiag.cli as cli

    out, err = io.StringIO(), io.StringIO()
    box: dict = {}

    def work() -> None:
        try:
            box["rc"] = cli.run(list(CLI_ARGS))
        except BaseException:  # noqa: BLE001 - recorded: a traceback is a finding
            box["exception"] = traceback.format_exc()

    os.environ[lab.MAP_VAR] = MAP
    watcher = None
    if fault_cmd:
        target = uverbs_path(hold_dev or lab.SECOND_DEV)
        watcher = subprocess.Popen([sys.executable, "-S", "-c", POLLER, str(os.getpid()), str(target),
                                    str(RUN_DEADLINE_S), *fault_cmd], stdout=subprocess.PIPE, text=True)
        watcher.stdout.readline()  # "ready": the watcher's start-up is not part of the run
    t0 = RUN_T0[0] = time.monotonic()
    first_phase = len(PHASES)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        t = threading.Thread(target=work, name=f"afddiag-{name}", daemon=True)
        t.start()
        t.join(RUN_DEADLINE_S)
    end = time.monotonic()
    hung = t.is_alive()
    fault = None
    if watcher is not None:
        try:
            line, _ = watcher.communicate(timeout=TIMEOUT_S + 30)
            fault = json.loads(line.strip().splitlines()[-1]) if line.strip() else {"applied": False}
        except (subprocess.TimeoutExpired, ValueError) as e:
            watcher.kill()
            fault = {"applied": None, "fault_hung": True, "error": str(e)}
        if fault.get("applied"):
            fault["applied_at_s"] = round(fault.pop("applied_mono") - t0, 3)
            fault["done_at_s"] = round(fault.pop("done_mono") - t0, 3)
    text = out.getvalue()
    try:
        parsed = json.loads(text) if text.strip() else None
    except ValueError:
        parsed = None
    rec = {"name": name, "rc": box.get("rc"), "elapsed_s": round(end - t0, 3), "hung": hung,
           "exception": box.get("exception"), "json": parsed, "stdout": None if parsed is not None else text[-4000:],
           "stderr": err.getvalue()[-4000:], "fault": fault,
           "traceback_in_output": "Traceback (most recent call last)" in text + err.getvalue()}
    rec["phases"] = PHASES[first_phase:]
    rec["leftovers"] = leftovers()
    verdicts = {g["id"]: g["verdict"] for g in (parsed or {}).get("gates", [])}
    lab.log(f"{name}: rc={rec['rc']} in {rec['elapsed_s']:.2f}s hung={hung} fault={json.dumps(fault)} "
            f"verdicts={json.dumps(verdicts)} phases={json.dumps(rec['phases'])}"
            + (f"\n{rec['exception']}" if rec["exception"] else ""))
    return rec


def set_link(state: str) -> None:
    """``ip link set vc <state>``: the netdev under arxe1 (the fabric IP's port) down or up."""
    lab.sh(["ip", "link", "set", "vc", state])


def main() -> int:
    """Build the lab, run every fault in order, write OUTDIR; 0 when every step ran (whatever the verdicts)."""
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-lab-faults"
    os.makedirs(outdir, exist_ok=True)
    # The host's root is read-only here, and OUTDIR is 9p, where the history store's SQLite WAL locks
    # wait out their 10 s busy timeout: keep the state directory on the guest's tmpfs.
    try:
        os.environ["AFDDIAG_STATE_DIR"] = tempfile.mkdtemp(prefix="afddiag-state-")
    except OSError:
        os.environ["AFDDIAG_STATE_DIR"] = os.path.join(outdir, "state")
    results: dict = {"pid": os.getpid(), "kernel": os.uname().release, "timeout_s": TIMEOUT_S,
                     "qp_timeout_s": QP_TIMEOUT_S, "run_deadline_s": RUN_DEADLINE_S, "runs": {}, "errors": []}
    runs = results["runs"]

    def step(name: str, fault_cmd: list[str] | None = None) -> None:
        runs[name] = run_cli(name, fault_cmd)

    try:
        instrument()
        # Under TCG a cold import of pyroute2 (the route probe's rtnetlink library) takes ~20 s, about
        # the whole route bound, against ~0.3 s on a host: warm it, as every run after the first is, so
        # the runs measure the probes' bounds and not the emulator's import time.
        t = time.monotonic()
        try:
            import pyroute2.iproute.linux  # noqa: F401
        except ImportError:
            pass
        results["warm_imports_s"] = round(time.monotonic() - t, 3)
        lab.build()
        results["ready"] = lab.wait_ready()
        step("baseline")

        lab.sh(["ip", "link", "set", "vc", "mtu", "9000"])
        step("mtu-9000")
        lab.sh(["ip", "link", "set", "vc", "mtu", "600"])
        step("mtu-600")
        lab.sh(["ip", "link", "set", "vc", "mtu", "1500"])

        lab.sh(["ip", "addr", "del", f"{FABRIC_IP}/24", "dev", "vc"])
        step("ip-removed")
        lab.sh(["ip", "addr", "add", f"{FABRIC_IP}/24", "dev", "vc"])
        results["ready_after_ip"] = lab.wait_ready()

        set_link("down")
        step("port-down")
        set_link("up")
        results["ready_after_down"] = lab.wait_ready()

        lab.sh(["ip", "-n", "peer", "addr", "del", f"{PEER_IP}/24", "dev", "vd"])
        lab.sh(["ip", "neigh", "flush", "dev", "vc"])
        step("peer-unreachable")

        lab.sh(["ip", "neigh", "flush", "dev", "vc"])
        step("down-during-run", ["ip", "link", "set", "vc", "down"])
        set_link("up")
        results["ready_after_down_during"] = lab.wait_ready()

        lab.sh(["ip", "neigh", "flush", "dev", "vc"])
        step("delete-while-held", ["rdma", "link", "delete", lab.SECOND_DEV])
        results["rdma_dev_after_delete"] = lab.sh_json(["rdma", "-j", "dev", "show"])

        step("device-deleted")

        lab.sh(["ip", "netns", "del", "peer"])
        deadline = time.monotonic() + 20  # the veths, then rxe, go asynchronously
        while time.monotonic() < deadline and (os.path.exists("/sys/class/net/vc")
                                                or os.path.isdir("/sys/class/infiniband")
                                                and os.listdir("/sys/class/infiniband")):
            time.sleep(0.2)
        results["rdma_dev_after_netns"] = lab.sh_json(["rdma", "-j", "dev", "show"])
        step("netns-gone")
    except Exception:
        results["errors"].append(traceback.format_exc())
        lab.log(traceback.format_exc())
    finally:
        for dev in (lab.SECOND_DEV, lab.FIRST_DEV):
            if os.path.exists(f"/sys/class/infiniband/{dev}"):
                lab.sh(["rdma", "link", "delete", dev], check=False)
        if os.path.exists("/run/netns/peer"):
            lab.sh(["ip", "netns", "del", "peer"], check=False)
        results["resource_after_cleanup"] = lab.sh_json(["rdma", "-j", "resource", "show"])
        results["elapsed_s"] = round(time.monotonic() - lab.T0, 3)
        for name, r in runs.items():
            with open(os.path.join(outdir, f"{name}.json"), "w") as f:
                json.dump({"rc": r["rc"], "output": r["json"]}, f, indent=2)
        with open(os.path.join(outdir, "results.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
        with open(os.path.join(outdir, "run.log"), "w") as f:
            f.write("\n".join(lab.LOG) + "\n")
        lab.log(f"done in {results['elapsed_s']}s; results in {outdir}")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
