"""Issue 12: diagnoses an operator can act on — the root cause first, one remedy per fault, typed
actions, and no remedy that harms (busy GPU, link down, order unknown, Xid recovery actions...).

Each test builds the incident as a snapshot (tests/snapfix.py) or as facts, and asserts what a
correct diagnosis says: the verdict, the action, and what must NOT be said (a power cycle, a drain).
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from click.testing import CliRunner

from afddiag import diagnosis
from afddiag.cli import cli, run
from afddiag.gates import Context, fabric, gpu, gpu_load, resolve_fabric_ip
from afddiag.model.fabric import FabricFacts, Gid, Netdev, Port, QpFacts, QpResult, QpStep, RdmaDevice
from afddiag.model.gpu import GpuDevice, GpuFacts, UnderLoad
from afddiag.model.run import Inputs, Observation
from afddiag.probes.load import attach_load
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict
from snapfix import busy_h200, derive, fabric_case, gpu_snapshot, h200_readings, healthy_h200, link_down


def report(args):
    res = CliRunner().invoke(cli, args + ["--json", "--no-history"], standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout), res.return_value


def gates(rep):
    return {g["id"]: g for g in rep["gates"]}


# --- a busy GPU is inconclusive, never a power cycle ---------------------------------------------

def test_control_the_same_figures_on_an_idle_gpu_are_class_b(tmp_path):
    snap = gpu_snapshot(tmp_path / "s", busy_h200())  # 54 % of baseline, nothing else on the GPU
    rep, code = report(["gpu", "--snapshot", str(snap)])
    slow = gates(rep)["gpu.slow-state"]
    assert slow["verdict"] == FAIL and "class B" in slow["summary"] and slow["action"] == "AC_POWER_CYCLE"
    assert code == 2


@pytest.mark.parametrize("procs,util,words", [
    ([{"pid": 4242, "name": "python3", "used_bytes": 2 << 30, "type": "compute"}], 0, "pid 4242, python3"),
    ([{"pid": 4242, "name": "python3", "used_bytes": 2 << 30}], 0, "pid 4242, python3"),  # no type: compute
    ([], 97, "utilization 97 %"),
])
def test_busy_gpu_is_warn_inconclusive_never_power_cycle(tmp_path, report_schema, procs, util, words):
    snap = gpu_snapshot(tmp_path / "s", busy_h200(processes=procs, idle_util=util))
    rep, code = report(["gpu", "--snapshot", str(snap)])
    jsonschema.validate(rep, report_schema)
    slow = gates(rep)["gpu.slow-state"]
    assert slow["verdict"] == WARN, slow
    assert "inconclusive: GPU busy (" in slow["summary"] and words in slow["summary"]
    assert "AC" not in slow["remedy"] and "power-cycle" not in slow["remedy"]
    assert slow["action"] != "AC_POWER_CYCLE"
    assert not any(d["drain"] for d in rep["diagnosis"])
    assert all(d["action"] != "AC_POWER_CYCLE" for d in rep["diagnosis"])
    if procs:  # one fault: the other process (its WARN explains the inconclusive slow state)
        assert [(d["gate"], d["action"], d["explains"]) for d in rep["diagnosis"]] == [
            ("gpu.processes", "STOP_PROCESSES", ["gpu.slow-state"])]
    assert code == 1


def test_graphics_process_or_afddiag_itself_is_not_another_job(tmp_path):
    r = busy_h200(processes=[{"pid": 900, "name": "Xorg", "used_bytes": 1 << 20, "type": "graphics"},
                             {"pid": 77, "name": "python3", "used_bytes": 1 << 30, "type": "compute"}])
    r["probe_pid"] = 77  # the afddiag process that recorded it
    rep, _ = report(["gpu", "--snapshot", str(gpu_snapshot(tmp_path / "s", r))])
    assert gates(rep)["gpu.slow-state"]["verdict"] == FAIL  # the slow figures are judged: nobody else ran


def test_busy_check_recorded_by_the_load_probe_counts(tmp_path):
    r = busy_h200()
    r["devices"][0]["under_load"]["busy_before"] = {
        "utilization_pct": 100, "utilization_samples": [100, 100], "own_pid": 5,
        "processes": [{"pid": 31337, "name": "vllm", "used_bytes": None, "type": "compute"}]}
    rep, _ = report(["gpu", "--snapshot", str(gpu_snapshot(tmp_path / "s", r))])
    slow = gates(rep)["gpu.slow-state"]
    assert slow["verdict"] == WARN and "pid 31337, vllm" in slow["summary"]
    assert "utilization 100 % just before the load probe" in slow["summary"]


def test_busy_gpu_does_not_drain_in_the_health_check(tmp_path, monkeypatch, capsys):
    from afddiag.commands.preflight import show
    from afddiag.inputs import make_inputs
    from afddiag.preflight import PreflightOptions

    calls = []
    monkeypatch.setattr("afddiag.slurm.drain_node", lambda g, node=None, timeout_s=None: calls.append(g) or True)
    snap = gpu_snapshot(tmp_path / "s", busy_h200(processes=[{"pid": 1, "name": "torch", "type": "compute"}]))
    # the library's seam is its inputs: the recording judged as this host (the CLI refuses --drain with --snapshot)
    code = show(make_inputs(snapshot=str(snap)), PreflightOptions(drain=True, strict=True), history=False)
    assert code == 1  # WARN, strict: not fit, not drained
    assert calls == []
    err = capsys.readouterr().err
    assert "WARN gpu.processes" in err and "explains: gpu.slow-state" in err and "not drained" in err


def fake_load(monkeypatch, util, procs=()):
    """The busy check answering ``util`` % and ``procs``, and a load probe that records the ordinals it
    ran on; returns (those ordinals, readings of one GPU)."""
    ran: list[int] = []
    monkeypatch.setattr("afddiag.probes.load.read_busy",
                        lambda uuid, index, window_s=0.5, own_pids=(): {
                            "utilization_pct": util if window_s else None, "processes": list(procs), "own_pid": 1,
                            "window_s": window_s})
    monkeypatch.setattr("afddiag.probes.load.run_load_probe",
                        lambda o, b: ran.append(o) or {"device": {"uuid": "GPU-a"}, "achieved": {}})
    return ran, {"devices": [{"index": 0, "uuid": "GPU-a", "cuda_ordinal": 0}]}


def test_playbook_load_skips_a_busy_gpu_unless_forced(monkeypatch):
    ran, readings = fake_load(monkeypatch, 95)
    attach_load(readings, 1.0, skip_busy=True)
    ul = readings["devices"][0]["under_load"]
    assert ran == [] and ul["why"].startswith("not run: GPU busy (utilization 95 %")
    assert "--load" in ul["why"] and ul["busy_before"]["utilization_pct"] == 95
    attach_load(readings, 1.0, skip_busy=False)  # --load forces it; the check is kept for the gate
    ul = readings["devices"][0]["under_load"]
    assert ran == [0] and ul["busy_before"]["utilization_pct"] == 95 and "busy_after" in ul


def test_skipped_busy_load_probe_reads_as_inconclusive():
    d = GpuDevice(0, "NVIDIA GB10", load_why="not run: GPU busy (pid 9, x)",
                  load_busy_before={"processes": [{"pid": 9, "name": "x", "type": "compute"}], "utilization_pct": 0})
    v = gpu.slow_state(Context(Observation("h", "t", gpu=GpuFacts(available=True, devices=[d])), Inputs(),
                               resolve_fabric_ip(None, None)))
    assert v.verdict == WARN and "GPU busy (pid 9, x)" in v.summary


def test_idle_gpu_load_probe_runs_under_the_playbook(monkeypatch):
    ran, readings = fake_load(monkeypatch, 0)
    attach_load(readings, 1.0, skip_busy=True)
    assert ran == [0] and "why" not in readings["devices"][0]["under_load"]


# --- one fault, one remedy: dependencies -----------------------------------------------------

def test_hw_slowdown_explains_the_low_clock_no_second_remedy(tmp_path):
    r = busy_h200(fraction=0.4)
    r["devices"][0]["under_load"]["clock_sm_mhz"] = 700
    r["devices"][0]["under_load"]["clocks_event_reasons"] = 0x8  # hw_slowdown
    rep, _ = report(["gpu", "--snapshot", str(gpu_snapshot(tmp_path / "s", r))])
    g = gates(rep)
    assert g["gpu.clock-events"]["verdict"] == FAIL
    assert g["gpu.slow-state"]["verdict"] == SKIP
    assert g["gpu.slow-state"]["summary"].startswith("not judged: gpu.clock-events failed")
    alone = g["gpu.slow-state"]["facts"]["judged_alone"]  # even alone, the gate names the cause, not a power cycle
    assert alone["verdict"] == WARN and "not the slow state" in alone["summary"], alone
    [root] = [d for d in rep["diagnosis"] if d["verdict"] == FAIL]
    assert root["gate"] == "gpu.clock-events" and "gpu.slow-state" in root["explains"]
    assert root["action"] == "HW_INSPECTION"


def test_link_down_one_fault_map_still_right(tmp_path, report_schema):
    snap = link_down(tmp_path / "s")
    rep, code = report(["all", "--snapshot", str(snap), "--fabric-ip", "192.168.100.11"])
    jsonschema.validate(rep, report_schema)
    g = gates(rep)
    assert g["fabric.link"]["verdict"] == FAIL and g["fabric.link"]["action"] == "FIX_LINK"
    assert g["fabric.devicemap-env"]["verdict"] == PASS, g["fabric.devicemap-env"]
    assert g["fabric.first-device"]["verdict"] == PASS
    assert g["fabric.rocev2-ipv4"]["verdict"] == PASS and "fabric.link" in g["fabric.rocev2-ipv4"]["summary"]
    assert [v["id"] for v in rep["gates"] if v["verdict"] == FAIL] == ["fabric.link"]
    assert [d["gate"] for d in rep["diagnosis"] if d["verdict"] == FAIL] == ["fabric.link"]
    assert rep["diagnosis"][0]["gate"] == "fabric.link" and rep["diagnosis"][0]["drain"] is True
    assert "unset" not in " ".join(v["remedy"] for v in rep["gates"] if v["verdict"] in (FAIL, WARN))
    assert rep["device_map"]["192.168.100.11"] == "rocep1s0f1"
    assert code == 2


def test_devicemap_prints_the_map_when_the_link_is_down(tmp_path, capsys):
    snap = link_down(tmp_path / "s")
    assert run(["devicemap", "--snapshot", str(snap)]) == 0
    out, err = capsys.readouterr()
    assert "192.168.100.11=rocep1s0f1" in out
    assert "192.168.100.11=rocep1s0f1: port 1 is DOWN" in err and "fabric.link" in err


def test_link_down_without_fabric_ip_still_finds_it(tmp_path):
    snap = derive(fabric_case("12-"), tmp_path / "s")
    meta = json.loads((snap / "case.json").read_text())
    dev = meta["expected"]["device_map"][meta["fabric_ip"]]
    (snap / f"sys/class/infiniband/{dev}/ports/1/state").write_text("1: DOWN\n")
    rep, _ = report(["fabric", "--snapshot", str(snap)])
    assert rep["inputs"]["fabric_ip"] == meta["fabric_ip"]
    assert gates(rep)["fabric.link"]["verdict"] == FAIL


def test_pulled_cable_does_not_make_the_other_rail_the_fabric_ip(tmp_path):
    """Case 02 holds two addressed rails (192.168.100.11 on rocep1s0f1, 192.168.101.11 on
    roceP2p1s0f1): with both up and no --fabric-ip the fabric IP is ambiguous. Pulling the fabric
    rail's cable must not turn the other rail's address into the fabric IP (then fabric.link would PASS
    on the wrong port and the pulled cable would go unreported): still ambiguous, the DOWN candidate
    listed as such, the map unchanged."""
    snap = link_down(tmp_path / "s")
    rep, _ = report(["fabric", "--snapshot", str(snap)])
    assert rep["inputs"]["fabric_ip"] is None and rep["inputs"]["fabric_ip_source"] == "ambiguous"
    link = gates(rep)["fabric.link"]
    assert link["verdict"] == WARN and link["action"] == "RERUN", link
    assert "192.168.100.11 (rocep1s0f1 GID 3, port DOWN)" in link["summary"], link
    assert "192.168.101.11 (roceP2p1s0f1 GID 3)" in link["summary"], link
    assert rep["device_map"] == {"192.168.100.11": "rocep1s0f1", "192.168.101.11": "roceP2p1s0f1"}


def test_only_carrier_down_is_the_fabric_ip_whatever_the_gid_indexes(tmp_path, capsys):
    """Case 04 (one addressed rail, rocep1s0f1; roceP2p1s0f1 ACTIVE with no IPv4 RoCE v2 GID) with the
    addressed rail's cable pulled and its address on two RoCE v2 GID indexes: that address is still
    the fabric IP (fabric.link FAILs on its port), and the pair test's endpoint says the port is DOWN
    instead of crashing."""
    from afddiag.endpoint import pick_endpoint, resolve_fabric_ip
    from afddiag.model.fabric import usable_rocev2
    from afddiag.model.run import Inputs
    from afddiag.runner import gather

    src = fabric_case("04-")
    meta = json.loads((src / "case.json").read_text())
    ip, dev = meta["fabric_ip"], meta["expected"]["device_map"][meta["fabric_ip"]]
    idx = meta["expected"]["rocev2_ipv4_gid_index"][dev]
    port, spare = f"sys/class/infiniband/{dev}/ports/1", 4
    einval = [i for i in (src / port / "gid_attrs" / "EINVAL-SLOTS").read_text().split() if i != str(spare)]
    snap = derive(src, tmp_path / "s", {
        f"{port}/state": "1: DOWN\n", f"{port}/phys_state": "3: Disabled\n",
        f"{port}/gids/{spare}": (src / port / "gids" / str(idx)).read_text(),
        f"{port}/gid_attrs/types/{spare}": "RoCE v2\n",
        f"{port}/gid_attrs/ndevs/{spare}": (src / port / "gid_attrs" / "ndevs" / str(idx)).read_text(),
        f"{port}/gid_attrs/EINVAL-SLOTS": "\n".join(einval) + "\n"})
    fab = gather(Inputs(snapshot=str(snap), families=frozenset({"fabric"}))).fabric
    assert usable_rocev2(fab) == [] and any(p.active for d in fab.devices for p in d.ports)  # ACTIVE ports, no IPv4
    fip = resolve_fabric_ip(fab, None)
    assert fip.ip == ip and "not ACTIVE" in fip.source, fip
    assert sorted(e.gid_index for e in fip.candidates) == sorted({idx, spare})
    with pytest.raises(ValueError, match=f"fabric IP {ip}: {dev} port 1 carries it, but that port is DOWN"):
        pick_endpoint(fab, None)
    rep, _ = report(["fabric", "--snapshot", str(snap)])
    assert rep["inputs"]["fabric_ip"] == ip and gates(rep)["fabric.link"]["verdict"] == FAIL
    assert rep["device_map"] == {ip: dev}
    capsys.readouterr()
    assert run(["devicemap", "--snapshot", str(snap), "--format", "nccl"]) == 2
    out, err = capsys.readouterr()
    assert "NCCL_IB_HCA" not in out  # NCCL uses only ACTIVE ports
    assert f"fabric IP {ip}: {dev} port 1 carries it, but that port is DOWN" in err, err


def test_report_opens_with_the_diagnosis(tmp_path):
    snap = link_down(tmp_path / "s")
    res = CliRunner().invoke(cli, ["all", "--no-history", "--snapshot", str(snap), "--fabric-ip", "192.168.100.11"],
                             env={"NO_COLOR": "1"})
    lines = res.stdout.splitlines()
    assert lines[0].startswith("diagnosis: 1 fault(s)")
    assert lines[1].startswith("  1. FAIL fabric.link:") and "[FIX_LINK, drain]" in lines[2]


def test_every_catalog_action_and_dependency_is_known():
    from afddiag.catalog import load

    cat = load()
    acts = set(cat["actions"])
    schema = json.loads((__import__("pathlib").Path(__file__).parent.parent / "afddiag/schema/report.schema.json")
                        .read_text())
    assert acts == set(schema["$defs"]["action"]["enum"])
    for gid, g in cat["gates"].items():
        assert g["action"] in acts, gid
        for d in g.get("depends", []):
            assert d in cat["gates"], (gid, d)
        if g.get("depends"):
            assert g["on_dependency_failure"] in ("own concern", "not judged"), gid
    assert {a for a, v in cat["actions"].items() if v["drain"]} >= {"RESET_GPU", "REBOOT", "AC_POWER_CYCLE",
                                                                      "HW_INSPECTION"}
    assert not any(cat["actions"][a]["drain"] for a in ("SET_ENV", "STOP_PROCESSES", "RERUN", "NONE",
                                                         "REBUILD_IMAGE"))


def test_unknown_action_is_refused():
    with pytest.raises(ValueError, match="not in checks/gates.toml"):
        diagnosis.fill_actions([Verdict("gpu.errors", FAIL, "x", action="PRAY")])


# --- device order: libibverbs', never guessed from names -------------------------------------------

def test_order_unknown_warns_instead_of_guessing(tmp_path):
    snap = derive(fabric_case("17-"), tmp_path / "s", {"rdma-dev.json": None})
    meta = json.loads((snap / "case.json").read_text())
    rep, _ = report(["fabric", "--snapshot", str(snap), "--fabric-ip", meta["fabric_ip"]])
    first = gates(rep)["fabric.first-device"]
    assert first["verdict"] == WARN and first["summary"].startswith("order unknown"), first
    assert first["facts"]["engine_device"] is None


def test_order_unknown_does_not_matter_with_a_map(tmp_path):
    snap = derive(fabric_case("02-"), tmp_path / "s", {"rdma-dev.json": None})
    rep, _ = report(["fabric", "--snapshot", str(snap), "--fabric-ip", "192.168.100.11"])
    assert gates(rep)["fabric.first-device"]["verdict"] == PASS


def order_host(order_source="test", second_carries=True):
    v4a, v4b = "0000:0000:0000:0000:0000:ffff:0a09:0002", "0000:0000:0000:0000:0000:ffff:0a09:0003"
    f = FabricFacts(order_source=order_source, addresses_source="test")
    f.devices = [RdmaDevice("a", 0, ports=[Port(1, "ACTIVE", "LinkUp", "Ethernet",
                                                gids=[Gid(1, v4a, "RoCE v2", "na", "10.9.0.2")])]),
                 RdmaDevice("b", 1, ports=[Port(1, "ACTIVE", "LinkUp", "Ethernet",
                                                gids=[Gid(1, v4b if second_carries else v4a, "RoCE v2", "nb",
                                                          "10.9.0.3" if second_carries else "10.9.0.2")])])]
    f.netdevs = {"na": Netdev("na", 9000, "up", ["10.9.0.2/24"]),
                 "nb": Netdev("nb", 9000, "up", ["10.9.0.3/24" if second_carries else "10.9.0.2/24"])}
    return Observation("h", "t", fabric=f, qp=QpFacts(ran=False, why="t"), env={})


def test_order_unknown_passes_when_every_device_carries_the_ip():
    obs = order_host("name (device index unknown)", second_carries=False)
    v = fabric.first_device(Context(obs, Inputs(), resolve_fabric_ip(obs.fabric, "10.9.0.2")))
    assert v.verdict == PASS and "every RDMA device" in v.summary


def test_pyverbs_order_wins_and_is_recorded(monkeypatch):
    from afddiag.probes import netlink

    monkeypatch.setattr(netlink, "rdma_devices_netlink", lambda t: [("z", 0), ("a", 1)])
    order, src, notes = netlink.device_order(1.0, pyverbs_list=lambda: ["a", "z"])
    assert order == [("a", 1), ("z", 0)] and src.startswith("pyverbs")
    assert any("differs" in n for n in notes)

    def no_pyverbs():
        raise ImportError("no pyverbs")

    order, src, _ = netlink.device_order(1.0, pyverbs_list=no_pyverbs)
    assert order == [("z", 0), ("a", 1)] and src.startswith("netlink")


# --- ambiguous fabric IP ---------------------------------------------------------------------

def test_ambiguous_fabric_ip_warns_when_the_engine_device_carries_a_candidate():
    obs = order_host()
    v = fabric.first_device(Context(obs, Inputs(), resolve_fabric_ip(obs.fabric, None)))
    assert v.verdict == WARN and "ambiguous" in v.summary


def test_ambiguous_fabric_ip_fails_when_the_engine_device_carries_none():
    obs = order_host()
    obs.fabric.devices.insert(0, RdmaDevice("first", 5, ports=[Port(1, "DOWN", "Disabled", "Ethernet", gids=[
        Gid(0, "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2", "nf")])]))
    v = fabric.first_device(Context(obs, Inputs(), resolve_fabric_ip(obs.fabric, None)))
    assert v.verdict == FAIL and "first" in v.summary and "10.9.0.2" in v.summary and "10.9.0.3" in v.summary
    assert v.commands == ["export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=10.9.0.2=a,10.9.0.3=b"]


# --- NCCL_IB_HCA: every selected port must reach a peer ---------------------------------------

def nccl_host(hca: str, fabric_ip="10.9.0.2"):
    def v4(ip):
        a, b, c, d = (int(x) for x in ip.split("."))
        return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"

    fe80 = "fe80:0000:0000:0000:0000:0000:0000:0001"
    f = FabricFacts(order_source="test", addresses_source="test")
    spec = [("fab", "nf", "10.9.0.2", "ACTIVE"), ("ll", "nl", "169.254.7.2", "ACTIVE"), ("none", "nn", None, "ACTIVE"),
            ("rail", "nr", "10.9.1.2", "ACTIVE"), ("dead", "nd", None, "DOWN")]
    for i, (dev, nd, ip, state) in enumerate(spec):
        gids = [Gid(0, fe80, "RoCE v2", nd)] + ([Gid(3, v4(ip), "RoCE v2", nd, ip)] if ip else [])
        f.devices.append(RdmaDevice(dev, i, ports=[Port(1, state, "LinkUp", "Ethernet", gids=gids)]))
        f.netdevs[nd] = Netdev(nd, 9000, "up", [f"{ip}/24" if not ip.startswith("169") else f"{ip}/16"] if ip else [])
    obs = Observation("h", "t", fabric=f, qp=QpFacts(ran=False, why="t"), env={"NCCL_IB_HCA": hca})
    return Context(obs, Inputs(fabric_ip=fabric_ip), resolve_fabric_ip(f, fabric_ip))


def test_nccl_hca_port_without_ipv4_or_link_local_fails_named():
    v = fabric.devicemap_env(nccl_host("=fab:1,ll:1,none:1,rail:1,dead:1"))
    assert v.verdict == FAIL
    assert "ll:1 has only the link-local IPv4 169.254.7.2" in v.summary
    assert "none:1 has no IPv4 RoCE v2 GID" in v.summary and "errno 110" in v.summary
    named = v.summary.split("reach a peer:")[1]
    assert "rail:1" not in named and "dead:1" not in named
    assert v.facts["ignored_not_active"] == ["dead:1"]


def test_nccl_hca_rail_on_its_own_subnet_is_fine_on_the_host():
    v = fabric.devicemap_env(nccl_host("=fab:1,rail:1,dead:1"))
    assert v.verdict == PASS and "rails: rail:1 10.9.1.2 on 10.9.1.0/24" in v.summary
    assert v.facts["rails"] == [{"port": "rail:1", "ip": "10.9.1.2", "subnet": "10.9.1.0/24", "gid_index": 3}]


def test_link_local_fabric_ip_accepts_link_local_rails():
    c = nccl_host("=ll:1,fab:1", fabric_ip="169.254.7.2")
    assert fabric.devicemap_env(c).verdict == PASS


# --- Xid by catalog and recovery action --------------------------------------------------------

XID_RESET = ("[ 812.331] NVRM: Xid (PCI:0000:00:06): 154, GPU recovery action changed from 0x0 (None) to "
             "0x1 (GPU Reset Required)")
XID_REBOOT = ("NVRM: Xid (PCI:0000:00:06): 154, GPU recovery action changed from 0x0 (None) to "
              "0x2 (Node Reboot Required)")
XID_DRAIN = "NVRM: Xid (PCI:0000:00:06): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
XID_CLEARED = "NVRM: Xid (PCI:0000:00:06): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
XID_APP = "NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 1)"
XID_ODD = "NVRM: Xid (PCI:0000:00:06): 999, something new the driver says"


@pytest.mark.parametrize("lines,verdict,action,words", [
    ([XID_RESET], FAIL, "RESET_GPU", "GPU Reset Required"),
    ([XID_REBOOT], FAIL, "REBOOT", "Node Reboot Required"),
    ([XID_DRAIN], FAIL, "RESET_GPU", "Drain and Reset"),
    ([XID_RESET, XID_CLEARED], PASS, "NONE", "no uncorrected ECC"),
    ([XID_APP], WARN, "NONE", "Xid 13 (graphics engine exception"),
    (["NVRM: Xid (PCI:0000:00:06): 31, pid=1, Ch 00000008, intr 10000000. MMU Fault"], WARN, "NONE", "Xid 31"),
    (["NVRM: Xid (PCI:0000:00:06): 79, GPU has fallen off the bus."], FAIL, "REBOOT", "fallen off the bus"),
    ([XID_ODD], WARN, "NONE", '"NVRM: Xid (PCI:0000:00:06): 999, something new the driver says"'),
])
def test_xid_from_a_saved_log_on_replay(tmp_path, lines, verdict, action, words):
    snap = gpu_snapshot(tmp_path / "s", h200_readings("h200-live-idle"))
    log = tmp_path / "dmesg.txt"
    log.write_text("\n".join(["[ 1.0] unrelated line"] + lines) + "\n")
    rep, _ = report(["gpu", "--snapshot", str(snap), "--xid-log", str(log)])
    err = gates(rep)["gpu.errors"]
    assert err["verdict"] == verdict and err["action"] == action and words in err["summary"], err
    if action == "REBOOT":
        assert "reboot" in err["remedy"]


@pytest.mark.parametrize("how", ["kernel-xid.log", "dmesg.txt", "xid_lines", "xid_events"])
def test_xid_lines_kept_in_the_snapshot_are_judged(tmp_path, how):
    r = h200_readings("h200-live-idle")
    files = {}
    if how == "xid_lines":
        r["xid_lines"] = [XID_RESET]
    elif how == "xid_events":
        r["xid_events"] = [{"xid": 154, "pci": "0000:00:06", "text": XID_RESET.split("] ", 1)[1]}]
    else:
        r.pop("xid_events", None)
        files[how] = XID_RESET + "\n"
    rep, _ = report(["gpu", "--snapshot", str(gpu_snapshot(tmp_path / "s", r, files))])
    err = gates(rep)["gpu.errors"]
    assert err["verdict"] == FAIL and err["action"] == "RESET_GPU", err
    assert [d["gate"] for d in rep["diagnosis"] if d["drain"]] == ["gpu.errors"]


def test_capture_keeps_the_xid_lines_and_the_replay_judges_them(tmp_path):
    from afddiag.capture import write_bundle
    from conftest import case_dirs
    from fakes import case_sources

    r = h200_readings("h200-live-idle")
    r["xid_events"], r["xid_source"] = [{"xid": 154, "pci": "0000:00:06", "text": XID_REBOOT}], "/dev/kmsg"
    src = case_sources(case_dirs("fabric")[0], gpu=lambda: r)
    path, _ = write_bundle(tmp_path / "host.tar.gz", src)
    import tarfile

    with tarfile.open(path) as tf:
        log = next(m for m in tf.getmembers() if m.name.endswith("/kernel-xid.log"))
        assert tf.extractfile(log).read().decode() == XID_REBOOT + "\n"
    rep, _ = report(["gpu", "--snapshot", str(path)])
    err = gates(rep)["gpu.errors"]
    assert err["verdict"] == FAIL and err["action"] == "REBOOT"


# --- not a snapshot, EOPNOTSUPP ----------------------------------------------------------------

def test_snapshot_path_with_nothing_recognized_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert run(["all", "--snapshot", str(tmp_path)]) == 64
    err = capsys.readouterr().err
    assert "holds nothing afddiag recognizes" in err and "gpu.json" in err and "rdma-dev.json" in err


def test_eopnotsupp_is_this_device_cannot_not_broken():
    obs = order_host()
    obs.qp = QpFacts(ran=True, results=[QpResult("a", 1, 1, None, "fabric IP", "10.9.0.9", reached="INIT", errno=-95,
                                                 steps=[QpStep("INIT", True), QpStep("RTR", False, 95)])])
    v = fabric.qp_rtr(Context(obs, Inputs(fabric_ip="10.9.0.2", peers=["10.9.0.9"]),
                              resolve_fabric_ip(obs.fabric, "10.9.0.2")))
    assert v.verdict == SKIP and "cannot" in v.summary and "EOPNOTSUPP" in v.summary
    obs.qp.results[0].errno = 22
    assert fabric.qp_rtr(Context(obs, Inputs(fabric_ip="10.9.0.2"), resolve_fabric_ip(obs.fabric, "10.9.0.2"))
                         ).verdict == FAIL


def test_gpu_busy_evidence_is_pure_on_facts():
    d = GpuDevice(0, "x", processes=[{"pid": 3, "name": "a", "type": "compute"}], utilization_pct=50,
                  under_load=UnderLoad(busy_after={"processes": [{"pid": 8, "name": "late", "type": "compute"}]}))
    g = GpuFacts(available=True, devices=[d], probe_pid=3)
    assert gpu_load.gpu_busy(d, g) == ["utilization 50 % at the GPU probe's read", "pid 8, late"]


# --- baseline record refuses what is no healthy baseline ----------------------------------------

def _record(monkeypatch, readings, *extra):
    """`afddiag baseline record` with the GPU probe, load probe and CPU loop replaced by ``readings``."""
    import copy as _copy

    monkeypatch.setattr("afddiag.probes.gpu.read_gpu", lambda *a, **k: _copy.deepcopy(readings))
    monkeypatch.setattr("afddiag.probes.load.attach_load", lambda r, b, **k: None)
    monkeypatch.setattr("afddiag.probes.cpu.read_cpu", lambda: {"loop_mops": 6.0})
    res = CliRunner().invoke(cli, ["baseline", "record", *extra], standalone_mode=False, catch_exceptions=False)
    return res.return_value, res.stderr, res.stdout


def test_baseline_record_accepts_a_healthy_idle_gpu(monkeypatch, tmp_path):
    code, err, out = _record(monkeypatch, healthy_h200(), "--path", str(tmp_path / "b.json"))
    assert code == 0 and "recorded 1 GPU(s)" in out and "FORCED" not in out
    assert "forced" not in json.loads((tmp_path / "b.json").read_text())


@pytest.mark.parametrize("readings,why", [
    (healthy_h200(processes=[{"pid": 4242, "name": "python3", "type": "compute"}]),
     "is busy (pid 4242, python3)"),
    (healthy_h200(fraction=0.54), "below the reference table's floor"),
    ({"devices": [], "why": "no NVIDIA GPU seen: NVML and CUDA list none"}, "no GPU seen"),
])
def test_baseline_record_refuses_with_the_reason(monkeypatch, tmp_path, readings, why):
    path = tmp_path / "b.json"
    code, err, _ = _record(monkeypatch, readings, "--path", str(path))
    assert code == 2 and "not recorded" in err and why in err, err
    assert not path.exists()
    code, _, out = _record(monkeypatch, readings, "--path", str(path), "--force")
    if readings["devices"]:
        assert code == 0 and "FORCED over" in out
        data = json.loads(path.read_text())
        assert data["forced"] is True and any(why in w for w in data["forced_over"])


def test_baseline_record_refuses_when_a_gpu_gate_fails(monkeypatch, tmp_path):
    r = healthy_h200()
    r["xid_events"] = [{"xid": 154, "pci": "0000:00:06", "text": XID_RESET}]
    code, err, _ = _record(monkeypatch, r, "--path", str(tmp_path / "b.json"))
    assert code == 2 and "gpu.errors FAILs" in err and "GPU Reset Required" in err


def test_forced_baseline_is_named_where_it_is_used(monkeypatch, tmp_path):
    r = healthy_h200(fraction=0.54)
    _record(monkeypatch, r, "--path", str(tmp_path / "b.json"), "--force")
    snap = gpu_snapshot(tmp_path / "s", healthy_h200(fraction=0.54))
    rep, _ = report(["gpu", "--snapshot", str(snap), "--baseline", str(tmp_path / "b.json")])
    slow = gates(rep)["gpu.slow-state"]
    assert "FORCED over" in json.dumps(slow["facts"])


# --- fleet: rails need a peer; a busy host is no outlier ------------------------------------------

def _host(name, addrs, rails=(), slow=None, figures=None, role="expert"):
    from afddiag.gates.fleet import HostResult

    gates_ = [{"id": "fabric.devicemap-env", "verdict": PASS, "summary": "x", "remedy": "", "facts": {
        "rails": [{"port": p, "ip": ip, "subnet": net, "gid_index": 3} for p, ip, net in rails]}}]
    if slow is not None:
        gates_.append({"id": "gpu.slow-state", "verdict": slow[0], "summary": slow[1], "remedy": "", "facts": slow[2]})
    rep = {"inputs": {"role": role, "fabric_ip": addrs[0].split("/")[0]}, "gates": gates_,
           "facts": {"fabric": {"netdevs": {"n0": {"ipv4": list(addrs)}}},
                     "gpu": {"devices": [{"under_load": figures}]} if figures else None}}
    return HostResult(name, report=rep)


def test_fleet_rail_without_a_peer_on_its_subnet_fails_named():
    from afddiag.gates.fleet import rails

    a = _host("spark-a", ["192.168.100.10/24", "192.168.101.10/24"], [("roceP2p1s0f1:1", "192.168.101.10",
                                                                        "192.168.101.0/24")])
    b = _host("spark-b", ["192.168.100.11/24", "192.168.102.11/24"], [("roceP2p1s0f1:1", "192.168.102.11",
                                                                        "192.168.102.0/24")])
    v = rails([a, b], {})
    assert v.verdict == FAIL
    assert "spark-a roceP2p1s0f1:1 (192.168.101.10 on 192.168.101.0/24)" in v.summary
    assert "spark-b roceP2p1s0f1:1 (192.168.102.11 on 192.168.102.0/24)" in v.summary
    b2 = _host("spark-b", ["192.168.100.11/24", "192.168.101.11/24"], [("roceP2p1s0f1:1", "192.168.101.11",
                                                                         "192.168.101.0/24")])
    assert rails([a, b2], {}).verdict == PASS
    assert rails([_host("x", ["10.0.0.1/24"])], {}).verdict == SKIP


def test_fleet_gpu_busy_host_is_no_outlier_and_no_power_cycle():
    from afddiag.diagnosis import fill_actions
    from afddiag.gates.fleet import gpu as fleet_gpu

    ok = (PASS, "fine", {"0": {}})
    busy = (WARN, "GPU 0: inconclusive: GPU busy (pid 1, torch)", {"0": {"busy": ["pid 1, torch"]}})
    fig = {"clock_sm_mhz": 1980, "bf16_tflops": 648.0}
    hosts = [_host(f"h{i}", [f"10.0.0.{i}/24"], slow=ok, figures=fig) for i in range(3)]
    hosts.append(_host("h9", ["10.0.0.9/24"], slow=busy, figures={"clock_sm_mhz": 1980, "bf16_tflops": 350.0}))
    v = fleet_gpu(hosts, {})
    fill_actions([v])
    assert v.verdict == WARN and "h9" in v.summary and not v.facts["outliers"]
    assert v.action == "RERUN" and "power" not in v.remedy


def test_xid_event_recorded_by_hand_is_judged_alike():
    from afddiag.gates.gpu import xid_judgment

    assert xid_judgment({"xid": "154", "message": XID_REBOOT})[0::2] == (FAIL, "REBOOT")
    assert xid_judgment({"xid": 48})[0::2] == (FAIL, "RESET_GPU")
    assert xid_judgment({"xid": 43, "line": "NVRM: Xid (PCI:0000:01:00): 43, pid=9"})[0::2] == (WARN, "NONE")


def test_device_map_keeps_enumeration_order_with_a_port_down(tmp_path):
    from afddiag.endpoint import device_map

    obs = order_host()
    obs.fabric.devices[0].ports[0].state = "DOWN"  # "a" carries 10.9.0.2 on a port whose cable is out
    assert list(device_map(obs.fabric).items()) == [("10.9.0.2", "a"), ("10.9.0.3", "b")]


def test_roots_sharing_one_remedy_and_action_are_named_once():
    """An ambiguous fabric IP WARNs fabric.link and fabric.mtu with the same 'pass --fabric-ip'
    remedy: one fault, kept at the first (most severe) entry, the other in its explains."""
    from afddiag.verdict import Verdict

    same = "pass --fabric-ip with the address the launcher uses"
    vs = [Verdict("fabric.link", "WARN", "fabric IP ambiguous", same, action="RERUN"),
          Verdict("fabric.mtu", "WARN", "fabric IP ambiguous", same, action="RERUN"),
          Verdict("fabric.first-device", "FAIL", "mlx5_0 carries none", "export MAP=...", action="SET_ENV")]
    d = diagnosis.diagnose(vs)
    assert [e["gate"] for e in d] == ["fabric.first-device", "fabric.link"]
    assert d[1]["explains"] == ["fabric.mtu"]
    # a different action is a different fault, even with the same words
    vs[1] = Verdict("fabric.mtu", "WARN", "fabric IP ambiguous", same, action="SET_ENV")
    assert [e["gate"] for e in diagnosis.diagnose(vs)] == ["fabric.first-device", "fabric.link", "fabric.mtu"]


# --- one wrong AFD_FABRIC_IP is one fault ----------------------------------------------------

def test_afd_fabric_ip_on_no_netdev_is_one_fault_in_the_diagnosis(tmp_path):
    """Case 02 (spark-b: 192.168.100.11 on rocep1s0f1) launched with AFD_FABRIC_IP=192.168.100.99, an address
    no netdev here holds: launch.fabric-address and fabric.rocev2-ipv4 both see it; the diagnosis names it
    once (fabric.rocev2-ipv4, whose remedy names this host's address) and explains the launch gate with it."""
    from conftest import CASES

    env = tmp_path / "launch.env"
    env.write_text("AFD_FABRIC_IP=192.168.100.99\nDS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1\n")
    rep, _ = report(["all", "--snapshot", str(CASES / "fabric" / "02-spark-map-set-healthy"), "--role", "generic",
                     "--launch-env", str(env)])
    g = gates(rep)
    assert g["launch.fabric-address"]["verdict"] == FAIL and g["fabric.rocev2-ipv4"]["verdict"] == FAIL
    about = [d for d in rep["diagnosis"] if "192.168.100.99" in d["summary"]
             or d["gate"] in ("launch.fabric-address", "fabric.rocev2-ipv4")]
    assert len(about) == 1, about
    [root] = about
    assert root["gate"] == "fabric.rocev2-ipv4" and "launch.fabric-address" in root["explains"], root
    assert root["action"] == "SET_ENV" and "192.168.100.11" in root["remedy"] and not root["drain"], root


def test_afd_fabric_ip_missing_stays_its_own_fault(tmp_path):
    """The dependency does not swallow an independent launch fault: AFD_FABRIC_IP unset while the host's
    RoCE v2 addresses are fine is launch.fabric-address's own root."""
    from conftest import CASES

    env = tmp_path / "launch.env"
    env.write_text("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1\n")
    rep, _ = report(["all", "--snapshot", str(CASES / "fabric" / "02-spark-map-set-healthy"), "--role", "generic",
                     "--launch-env", str(env), "--fabric-ip", "192.168.100.11"])
    assert gates(rep)["fabric.rocev2-ipv4"]["verdict"] == PASS
    [root] = [d for d in rep["diagnosis"] if d["gate"] == "launch.fabric-address"]
    assert root["verdict"] == WARN and "AFD_FABRIC_IP is not set" in root["summary"]


# --- a GPU that fell off the bus is one fault: what could not be read on it is its symptom ---------

XID79 = "[ 8123.441210] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"


def with_lost_gpu(lost_pci_in_log: str = "0000:3b:00") -> tuple[dict, dict]:
    """The H200 idle recording plus a second GPU whose NVML handle failed (what the probe records
    when nvmlDeviceGetHandleByIndex answers GPU_IS_LOST), and a kernel log with an Xid 79."""
    r = h200_readings("h200-live-idle")
    r["devices"].append({"index": 1, "name": None, "uuid": None, "pci_bus_id": None, "cuda": None, "nvml": None,
                         "under_load": None})
    r["notes"] = ["NVML device 1: nvmlDeviceGetHandleByIndex failed: NVMLError_GpuIsLost: GPU is lost"]
    r["expect"] = {"image_sm_count": 132}
    return r, {"dmesg.txt": XID79.replace("0000:3b:00", lost_pci_in_log)}


def test_gpu_lost_with_xid79_is_one_fault_named_once(tmp_path):
    r, files = with_lost_gpu()
    rep, code = report(["all", "--snapshot", str(gpu_snapshot(tmp_path / "s", r, files))])
    g = gates(rep)
    assert g["gpu.errors"]["verdict"] == FAIL and g["gpu.errors"]["action"] == "REBOOT"
    for gid in ("gpu.memory", "gpu.sm-count", "gpu.clock-events"):
        assert g[gid]["verdict"] == SKIP, g[gid]
        assert g[gid]["summary"].startswith("not judged: gpu.errors failed (Xid 79"), g[gid]
        assert "GPU 1 not readable" in g[gid]["summary"]
    assert "readable: GPU 0 NVIDIA H200: 140.4 GiB" in g["gpu.memory"]["summary"]
    roots = [(d["gate"], d["action"]) for d in rep["diagnosis"]]
    assert roots == [("gpu.errors", "REBOOT")], roots
    assert {"gpu.memory", "gpu.sm-count"} <= set(rep["diagnosis"][0]["explains"])
    assert code == 2


@pytest.mark.parametrize("log", ["", "0000:00:06"])  # no Xid 79; an Xid 79 on the GPU that is read
def test_unreadable_gpu_without_its_xid79_is_still_a_finding(tmp_path, log):
    """Without an Xid 79 on another address, a GPU NVML cannot read is not explained: gpu.memory
    still asks for a look (WARN), it is never folded into an unrelated fault."""
    r, files = with_lost_gpu(log or "0000:3b:00")
    rep, _ = report(["gpu", "--snapshot", str(gpu_snapshot(tmp_path / "s", r, files if log else {}))])
    g = gates(rep)
    assert g["gpu.memory"]["verdict"] == WARN and "GPU 1" in g["gpu.memory"]["summary"]
    assert ("gpu.memory", "RERUN") in [(d["gate"], d["action"]) for d in rep["diagnosis"]]
