"""Fleet gates pinned on recorded per-host summaries: every verdict and typed action each gate emits,
every threshold on both sides of its edge (the 80 % outlier fraction, the three-host minimum, a
subnet's prefix). The input is what a per-host report carries (``summary``, schema version 1)."""

from __future__ import annotations

import pytest

from afddiag.envvars import MAP_VAR
from afddiag.gates import fleet as fg
from afddiag.verdict import FAIL, PASS, SKIP, WARN


def host(name: str, role: str = "expert", **summary) -> fg.HostResult:
    """A host whose report holds ``summary`` (the per-host summary the fleet gates read)."""
    rep = {"schema_version": 1, "host": name, "gates": [], "inputs": {}, "facts": {},
           "summary": {"summary_version": 1, "role": role, "control_plane": None, "fabric_link": None,
                       "first_device": None, "firmware": [], **summary}}
    return fg.HostResult(name=name, report=rep)


def judged(gid: str, fleet: list[fg.HostResult], expect: dict | None = None):
    """The fleet gate ``gid`` as `afddiag fleet` runs it (typed action filled in)."""
    return next(v for v in fg.run_fleet_gates(fleet, expect) if v.id == gid)


DOWN = fg.HostResult(name="z", error="unreachable: connection refused")


# ---------------------------------------------------------------- fleet.capacity

def cap(name, key="AFD_EXPERT_CAPACITY", value=256, set_=True, role="expert"):
    return host(name, role, capacity={"key": key, "value": value, "set": set_}, launch_env="/etc/afd.env")


def test_capacity_every_verdict_and_action():
    coord = cap("c", "AFD_PREFILL_CAPACITY", 256, role="coordinator")
    v = judged("fleet.capacity", [coord, cap("a"), cap("b")])
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert "3 host(s) agree: capacity 256" in v.summary
    v = judged("fleet.capacity", [coord, cap("a"), cap("b", value=128, set_=False)])
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary.startswith("b AFD_EXPERT_CAPACITY=128 (engine default) in /etc/afd.env: differs from "
                                "coordinator c's AFD_PREFILL_CAPACITY=256")
    v = judged("fleet.capacity", [coord, cap("a"), host("b")])
    assert (v.verdict, v.action) == (WARN, "SET_ENV")
    assert v.summary.startswith("b: no capacity flag reported") and "2 other host(s) agree on 256" in v.summary
    v = judged("fleet.capacity", [host("a"), host("b")])
    assert (v.verdict, v.action) == (SKIP, "NONE")


def test_capacity_reference_is_the_inventory_then_the_coordinator_then_the_majority():
    # the inventory's value wins over an agreeing fleet
    v = judged("fleet.capacity", [cap("a"), cap("b")], {"capacity": 512})
    assert v.verdict == FAIL and "differ from the inventory's capacity 512" in v.summary
    # one coordinator against two ranks that agree with each other: the coordinator's flag is the reference
    v = judged("fleet.capacity", [cap("c", "AFD_PREFILL_CAPACITY", 64, role="coordinator"), cap("a"), cap("b")])
    assert v.verdict == FAIL and v.summary.startswith("a AFD_EXPERT_CAPACITY=256 in /etc/afd.env, "
                                                      "b AFD_EXPERT_CAPACITY=256 in /etc/afd.env: differ")
    # no coordinator: the most common flag
    v = judged("fleet.capacity", [cap("a"), cap("b"), cap("d", value=8)])
    assert v.verdict == FAIL and v.summary.startswith("d AFD_EXPERT_CAPACITY=8")
    assert "the most common flag 256" in v.summary
    # a host without a report is named in the tail, never judged
    v = judged("fleet.capacity", [cap("a"), cap("b"), DOWN])
    assert v.verdict == PASS and "1 host(s) without a report not judged: z" in v.summary


def test_capacity_names_each_flag_as_its_hosts_file_spells_it():
    coord = cap("c", "AFD_PREFILL_CAPACITY", 256, role="coordinator")
    b = cap("b", value=128)
    b.report["summary"]["capacity"]["spelled"] = "CAPACITY"  # the site's alias, as launch.capacity recorded it
    v = judged("fleet.capacity", [coord, cap("a"), b])
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary.startswith("b CAPACITY=128 in /etc/afd.env: differs from coordinator c's AFD_PREFILL_CAPACITY=256")
    assert v.remedy.startswith("set CAPACITY=256 in /etc/afd.env on b; ")
    assert v.facts["flags"]["b"] == {"key": "AFD_EXPERT_CAPACITY", "spelled": "CAPACITY", "value": 128, "set": True,
                                     "launch_env": "/etc/afd.env"}
    # a spelling no launch env file could hold is not repeated: afddiag's own name instead
    b.report["summary"]["capacity"]["spelled"] = "CAP; rm -rf /"
    b._summary = None
    v = judged("fleet.capacity", [coord, cap("a"), b])
    assert v.summary.startswith("b AFD_EXPERT_CAPACITY=128")


# ---------------------------------------------------------------- fleet.fabric-ip

def fip(name, ip, plen=24, **kw):
    return host(name, fabric_ip=ip, ipv4_prefixlen={ip: plen} if plen is not None else {}, **kw)


def test_fabric_ip_pass_on_one_subnet():
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1"), fip("b", "10.0.0.2"), fip("c", "10.0.0.3")])
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "3 unique fabric IPs, all on 10.0.0.0/24"


def test_fabric_ip_fails_a_host_on_another_subnet():
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1"), fip("b", "10.0.0.2"), fip("c", "10.0.1.3")])
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS")
    assert v.summary == "c 10.0.1.3 (10.0.1.0/24): not on the fleet's subnet 10.0.0.0/24"
    assert v.facts["subnets"]["c"] == "10.0.1.0/24"


def test_fabric_ip_subnet_follows_each_hosts_prefix_length():
    # 10.0.0.1/16 and 10.0.1.3/16 are one subnet; /24 would split them
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1", 16), fip("b", "10.0.1.3", 16)])
    assert v.verdict == PASS and "10.0.0.0/16" in v.summary
    # a host whose prefix is unseen is judged with the others' prefix, and named in the facts
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1", 16), fip("b", "10.0.1.3", 16), fip("c", "10.0.2.3", None)])
    assert v.verdict == PASS and v.facts["prefix_assumed_for"] == ["c"]
    # nobody's prefix seen: /24
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1", None), fip("b", "10.0.1.3", None)])
    assert v.verdict == FAIL and "not on the fleet's subnet" in v.summary


def test_fabric_ip_fails_a_shared_address_and_an_inventory_mismatch():
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1"), fip("b", "10.0.0.1")])
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS")
    assert v.summary == "a, b share fabric IP 10.0.0.1"
    h = fip("a", "10.0.0.1")
    h.fabric_ip = "10.0.0.9"
    v = judged("fleet.fabric-ip", [h, fip("b", "10.0.0.2")])
    assert v.verdict == FAIL and v.summary == "a: inventory says 10.0.0.9 but the host judged 10.0.0.1"


def test_fabric_ip_missing_address_fails_and_an_ambiguous_one_asks_for_the_input():
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1"), host("b", fabric_ip_source="none")])
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS")
    assert v.summary.startswith("b (none): no fabric IP")
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1"), host("b", fabric_ip_source="ambiguous")])
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.remedy.startswith("give --fabric-ip / AFD_FABRIC_IP (or fabric_ip in the inventory) for b")
    # an ambiguous host beside a real fault: the fault's remedy, not the missing input's
    v = judged("fleet.fabric-ip", [fip("a", "10.0.0.1"), fip("c", "10.0.0.1"),
                                   host("b", fabric_ip_source="ambiguous")])
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS")
    v = judged("fleet.fabric-ip", [DOWN])
    assert (v.verdict, v.action) == (SKIP, "NONE")


# ---------------------------------------------------------------- fleet.mtu

def test_mtu_every_verdict_and_action():
    a, b = host("a", roce_mtu_bytes=4096, netdev="eth1", netdev_mtu_bytes=9000), host("b", roce_mtu_bytes=4096)
    low = host("c", roce_mtu_bytes=1024, netdev="eth1", netdev_mtu_bytes=1500)
    v = judged("fleet.mtu", [a, b])
    assert (v.verdict, v.action, v.summary) == (PASS, "NONE", "2 host(s) at RoCE MTU 4096")
    v = judged("fleet.mtu", [a, b, low])
    assert (v.verdict, v.action) == (FAIL, "SET_MTU")
    assert v.summary == ("c RoCE MTU 1024 (eth1 MTU 1500): differs from the role's target RoCE MTU 4096 "
                         "(2 host(s) at 4096)")
    v = judged("fleet.mtu", [a, b], {"mtu": 1024})
    assert v.verdict == WARN and "differ from the inventory's 1024" in v.summary
    v = judged("fleet.mtu", [low, host("e", roce_mtu_bytes=1024)], {"mtu": 1024})
    assert v.verdict == PASS
    v = judged("fleet.mtu", [a, host("d")])
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert v.summary == "d: RoCE MTU not reported; 1 host(s) at 4096"
    v = judged("fleet.mtu", [host("d")])
    assert (v.verdict, v.action) == (SKIP, "NONE")


def test_mtu_judges_every_host_against_the_roles_target_not_the_majority():
    """Four Sparks left at MTU 1500 and a coordinator at 9000: the four are named, not the coordinator."""
    coord = host("coord", "coordinator", roce_mtu_bytes=4096, netdev="enp1s0f0np0", netdev_mtu_bytes=9000)
    sparks = [host(f"spark-{i}", roce_mtu_bytes=1024, netdev="enp1s0f1np1", netdev_mtu_bytes=1500) for i in range(4)]
    v = judged("fleet.mtu", [coord, *sparks])
    assert (v.verdict, v.action) == (FAIL, "SET_MTU")
    named = v.summary.split(": differ")[0]
    assert named == ", ".join(f"spark-{i} RoCE MTU 1024 (enp1s0f1np1 MTU 1500)" for i in range(4))
    assert "coord" not in named and "the role's target RoCE MTU 4096" in v.summary
    assert v.facts["target"] == 4096
    # a fleet that agrees below the target: every host named, WARN (consistent, but every large transfer is cut)
    v = judged("fleet.mtu", sparks)
    assert (v.verdict, v.action) == (WARN, "SET_MTU") and v.summary.startswith("spark-0 RoCE MTU 1024")


# ---------------------------------------------------------------- fleet.gid-index

def test_gid_index_every_verdict_and_action():
    v = judged("fleet.gid-index", [host("a", gid_index=3), host("b", gid_index=3)])
    assert (v.verdict, v.action, v.summary) == (PASS, "NONE", "2 host(s) at GID index 3")
    v = judged("fleet.gid-index", [host("a", gid_index=3), host("b", gid_index=1)])
    assert v.verdict == PASS and "nothing forces one index" in v.summary
    v = judged("fleet.gid-index", [host("a", gid_index=3, gid_index_envs={"NCCL_IB_GID_INDEX": "3"}),
                                   host("b", gid_index=1, gid_index_envs={"MC_GID_INDEX": "1"})])
    assert v.verdict == PASS and "each host that forces one forces its own index" in v.summary
    v = judged("fleet.gid-index", [host("a", gid_index=3), host("b", gid_index=1,
                                                                gid_index_envs={"NCCL_IB_GID_INDEX": "3"})])
    assert (v.verdict, v.action) == (WARN, "SET_ENV")
    assert v.summary.startswith("b GID index 1 while NCCL_IB_GID_INDEX=3 is forced there")
    v = judged("fleet.gid-index", [host("a", gid_index=3), host("b", gid_index=1)], {"gid_index": 3})
    assert v.verdict == WARN and v.summary.startswith("b GID index 1: a forced index")
    assert "the inventory forces gid_index 3" in v.summary
    # the older summary's single NCCL variable is read too
    v = judged("fleet.gid-index", [host("a", gid_index=1, gid_index_env="3")])
    assert v.verdict == WARN
    v = judged("fleet.gid-index", [host("a")])
    assert (v.verdict, v.action) == (SKIP, "NONE") and v.facts["unknown"] == ["a"]


# ---------------------------------------------------------------- fleet.devicemap

def dm(name, ip, first=None, dm_env=None, val=None, device_map=None):
    kw = {"fabric_ip": ip, "first_device": {"verdict": first, "summary": f"first-device {first}"} if first else None}
    if dm_env:
        kw["devicemap_env"] = {"verdict": dm_env, "summary": f"devicemap-env {dm_env}"}
    if val is not None:
        kw["device_map_env"] = val
    if device_map is not None:
        kw["device_map"] = device_map
    return host(name, **kw)


def test_devicemap_every_verdict_and_action():
    v = judged("fleet.devicemap", [dm("a", "10.0.0.1", first=PASS), dm("b", "10.0.0.2", first=PASS)])
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.facts["unset_first_device_carries"] == ["a", "b"]
    v = judged("fleet.devicemap", [dm("a", "10.0.0.1", first=FAIL), dm("b", "10.0.0.2", first=PASS)])
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary.startswith(f"a: {MAP_VAR} not set and the first enumerated device")
    v = judged("fleet.devicemap", [dm("a", "10.0.0.1", first=FAIL, dm_env=FAIL), dm("b", "10.0.0.2", first=PASS)])
    assert v.verdict == FAIL and v.summary.startswith("a (devicemap-env FAIL): fabric.devicemap-env FAIL")
    assert v.facts["unset"] == []  # named once, as its devicemap-env FAIL
    v = judged("fleet.devicemap", [dm("a", "10.0.0.1", first=WARN), dm("b", "10.0.0.2", first=PASS)])
    assert (v.verdict, v.action) == (WARN, "SET_ENV")
    v = judged("fleet.devicemap", [dm("a", "10.0.0.1"), dm("b", "10.0.0.2")])
    assert (v.verdict, v.action) == (SKIP, "NONE") and v.facts["no_fabric_data"] == ["a", "b"]


def test_devicemap_fails_a_map_that_sends_another_hosts_ip_to_the_wrong_device():
    a = dm("a", "10.0.0.1", first=PASS, val="10.0.0.1=mlx5_0,10.0.0.2=mlx5_0", device_map={"10.0.0.1": "mlx5_0"})
    b = dm("b", "10.0.0.2", first=PASS, val="10.0.0.2=mlx5_1", device_map={"10.0.0.2": "mlx5_1"})
    v = judged("fleet.devicemap", [a, b])
    assert v.verdict == FAIL
    assert v.summary.startswith("a's map sends b's 10.0.0.2 to mlx5_0, but b carries it on mlx5_1")
    a = dm("a", "10.0.0.1", first=PASS, val="10.0.0.1=mlx5_0,10.0.0.2=mlx5_1", device_map={"10.0.0.1": "mlx5_0"})
    v = judged("fleet.devicemap", [a, b])
    assert v.verdict == PASS and "(2 by the map)" in v.summary


# ---------------------------------------------------------------- fleet.gpu

def gpu_host(name, clock=2000.0, role="expert", model="NVIDIA GB10", slow=None, busy=False):
    return host(name, role, gpus=[{"name": model, "under_load": {"clock_sm_mhz": clock}}],
                slow_state={"verdict": slow or PASS, "summary": f"slow-state {slow}"}, gpu_busy=busy)


def test_gpu_outlier_edge_at_80_percent_of_the_median():
    base = [gpu_host("a", 1000), gpu_host("b", 1000)]
    v = judged("fleet.gpu", base + [gpu_host("c", 800)])  # exactly 80 %: not below
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.facts["medians"] == {"expert": {"NVIDIA GB10": {"clock_sm_mhz": 1000}}}
    v = judged("fleet.gpu", base + [gpu_host("c", 799)])
    assert (v.verdict, v.action) == (FAIL, "AC_POWER_CYCLE")
    assert v.summary.startswith("c clock_sm_mhz 799 MHz is 80% of the expert median 1000 (NVIDIA GB10, 3 hosts)")


def test_gpu_needs_three_like_hosts_for_a_median():
    v = judged("fleet.gpu", [gpu_host("a", 1000), gpu_host("c", 100)])
    assert v.verdict == PASS and v.facts["medians"] == {}
    # three hosts, but of two roles: no group of three
    v = judged("fleet.gpu", [gpu_host("a", 1000), gpu_host("b", 1000), gpu_host("c", 100, role="coordinator")])
    assert v.verdict == PASS and v.facts["medians"] == {}
    # a busy GPU's figures are a share: not counted
    v = judged("fleet.gpu", [gpu_host("a", 1000), gpu_host("b", 1000), gpu_host("c", 100, busy=True)])
    assert v.verdict == PASS and "c" not in v.facts["figures"]


def test_gpu_slow_state_fail_and_warn():
    v = judged("fleet.gpu", [gpu_host("a", slow=FAIL), gpu_host("b")])
    assert (v.verdict, v.action) == (FAIL, "AC_POWER_CYCLE")
    assert v.summary.startswith("a (slow-state FAIL): one slow GPU slows every rank in lockstep")
    v = judged("fleet.gpu", [gpu_host("a", slow=WARN), gpu_host("b")])
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert v.summary.startswith("a (slow-state WARN): gpu.slow-state inconclusive")
    v = judged("fleet.gpu", [host("a"), host("b")])
    assert (v.verdict, v.action) == (SKIP, "NONE")
    v = judged("fleet.gpu", [gpu_host("a"), gpu_host("b")])
    assert v.verdict == PASS and v.summary.startswith("2 host(s) with GPU load figures")


# ---------------------------------------------------------------- fleet.versions

def test_versions_drift_within_a_role_and_its_action():
    ok = {"driver": "580.1", "kernel": "6.11", "afddiag": "0.1.0"}
    v = judged("fleet.versions", [host("a", versions=ok), host("b", versions=ok)])
    assert (v.verdict, v.action) == (PASS, "NONE")
    v = judged("fleet.versions", [host("a", versions=ok), host("b", versions=ok),
                                  host("c", versions={**ok, "kernel": "6.8"})])
    assert (v.verdict, v.action) == (WARN, "UPDATE_VERSIONS")
    assert v.summary == "c kernel 6.8 (other expert hosts: 6.11)"
    v = judged("fleet.versions", [host("a", versions=ok), host("b", versions=ok),
                                  host("c", versions={**ok, "afddiag": "0.0.9"})])
    assert (v.verdict, v.action) == (WARN, "UPDATE_PACKAGE")
    # two hosts of a role whose HCAs of one model run different firmware: drift, even with two
    v = judged("fleet.versions", [host("a", versions=ok, firmware=[{"hca": "MT4129", "fw_ver": "28.39.1002"}]),
                                  host("b", versions=ok, firmware=[{"hca": "MT4129", "fw_ver": "28.41.1000"}])])
    assert (v.verdict, v.action) == (WARN, "UPDATE_VERSIONS") and "firmware MT4129" in v.summary, v.summary
    # one host per role: nothing to compare
    v = judged("fleet.versions", [host("a", versions=ok), host("c", "coordinator", versions={**ok, "kernel": "6.8"})])
    assert v.verdict == PASS
    v = judged("fleet.versions", [DOWN])
    assert (v.verdict, v.action) == (SKIP, "NONE")


def test_versions_remedy_drains_only_for_node_kinds():
    rem, action = fg.versions_remedy({"rdma_core"})
    assert action == "UPDATE_PACKAGE" and "rdma-core" in rem
    rem, action = fg.versions_remedy({"firmware MT4129", "afddiag"})
    assert action == "UPDATE_VERSIONS" and "mlxfwmanager" in rem and "afddiag" in rem


# ---------------------------------------------------------------- fleet.rails

def test_rails_every_verdict_and_action():
    rail = {"port": "mlx5_1/1", "ip": "10.1.0.1", "subnet": "10.1.0.0/24"}
    a = host("a", ipv4_prefixlen={"10.0.0.1": 24, "10.1.0.1": 24}, rails=[rail])
    b = host("b", ipv4_prefixlen={"10.0.0.2": 24, "10.1.0.2": 24})
    v = judged("fleet.rails", [a, b])
    assert (v.verdict, v.action) == (PASS, "NONE") and v.summary == "1 rail(s), each with a peer on its subnet"
    b = host("b", ipv4_prefixlen={"10.0.0.2": 24})
    v = judged("fleet.rails", [a, b])
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary.startswith("a mlx5_1/1 (10.1.0.1 on 10.1.0.0/24): NCCL_IB_HCA selects a rail on a subnet")
    v = judged("fleet.rails", [b])
    assert (v.verdict, v.action) == (SKIP, "NONE")


# ---------------------------------------------------------------- fleet.control-plane

def cp(name, ip, role="expert", attempts=(), **kw):
    return host(name, role, fabric_ip=ip, ipv4_prefixlen={ip: 24},
                control_plane={"verdict": "PASS", "attempts": [{"peer": p, "port": port, "outcome": o}
                                                               for p, port, o in attempts], **kw})


def test_control_plane_every_verdict_and_action():
    c = cp("c", "10.0.0.1", "coordinator", [("10.0.0.2", 5000, "connected")])
    r = cp("r", "10.0.0.2", attempts=[("10.0.0.1", 5000, "refused")])
    v = judged("fleet.control-plane", [c, r])
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert "1 refused (the peer answered" in v.summary
    # both ways dropped: a firewall or route, OPEN_PORTS
    r2 = cp("r", "10.0.0.2", attempts=[("10.0.0.1", 5000, "timeout")])
    c2 = cp("c", "10.0.0.1", "coordinator", [("10.0.0.2", 5000, "timeout")])
    v = judged("fleet.control-plane", [c2, r2])
    assert (v.verdict, v.action) == (FAIL, "OPEN_PORTS")
    # one way: the side that drops is named, with the port to open
    v = judged("fleet.control-plane", [c, r2])
    assert (v.verdict, v.action) == (FAIL, "OPEN_PORTS")
    assert "asymmetric: c reaches r, but r cannot reach c (10.0.0.1) port 5000 timeout" in v.summary
    assert v.remedy.startswith("on c, open port(s) 5000 to r's fabric address 10.0.0.2")
    # a link that is down explains it: FIX_LINK
    r3 = cp("r", "10.0.0.2", attempts=[("10.0.0.1", 5000, "timeout")])
    r3.report["summary"]["fabric_link"] = {"verdict": FAIL, "summary": "mlx5_0 port 1 DOWN"}
    v = judged("fleet.control-plane", [c2, r3])
    assert (v.verdict, v.action) == (FAIL, "FIX_LINK")
    # nothing dropped but a bad advertised address: SET_ENV
    c4 = cp("c", "10.0.0.1", "coordinator", [("10.0.0.2", 5000, "connected")],
            advertised_bad=[{"key": "AFD_COORD_ADDR", "value": "0.0.0.0", "why": "wildcard"}])
    v = judged("fleet.control-plane", [c4, r])
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary.startswith("c advertises AFD_COORD_ADDR=0.0.0.0 (wildcard)")
    # the coordinator never tried a rank: WARN
    c5 = cp("c", "10.0.0.1", "coordinator", [("10.0.0.2", 5000, "connected")])
    r5 = cp("r", "10.0.0.2", attempts=[("10.0.0.1", 5000, "connected")])
    q = cp("q", "10.0.0.3", attempts=[("10.0.0.1", 5000, "connected")])
    v = judged("fleet.control-plane", [c5, r5, q])
    assert (v.verdict, v.action) == (WARN, "RERUN")
    assert v.summary.startswith("c never tested q (not in its peer list)")
    v = judged("fleet.control-plane", [host("a"), host("b")])
    assert (v.verdict, v.action) == (SKIP, "NONE")


def test_connects_dropped_by_a_host_off_the_subnet_are_the_address_fault_not_a_firewall():
    """Two ranks on a subnet no route reaches: fleet.fabric-ip names the address fault, and fleet.control-plane
    points at it (FIX_ADDRESS) instead of telling anyone to open a firewall port."""
    c = cp("c", "10.0.0.1", "coordinator", [("10.0.0.2", 5000, "connected"), ("10.0.1.2", 5000, "connected"),
                                            ("10.0.1.3", 5000, "unreachable")])
    a = cp("a", "10.0.0.2", attempts=[("10.0.0.1", 5000, "connected")])
    b = cp("b", "10.0.1.2", attempts=[("10.0.0.1", 5000, "timeout")])  # c reaches b, b never gets back: "asymmetric"
    d = cp("d", "10.0.1.3", attempts=[("10.0.0.1", 5000, "unreachable")])
    fleet = [c, a, b, d]
    fip = judged("fleet.fabric-ip", fleet)
    # two against two: the coordinator's subnet is the fleet's (every rank must reach it), not a tie-break
    assert fip.verdict == FAIL and fip.summary.startswith("b 10.0.1.2 (10.0.1.0/24), d 10.0.1.3 (10.0.1.0/24): "
                                                          "not on the fleet's subnet 10.0.0.0/24"), fip.summary
    v = judged("fleet.control-plane", fleet)
    assert (v.verdict, v.action) == (FAIL, "FIX_ADDRESS"), (v.action, v.remedy)
    assert "b is not on the fleet's subnet 10.0.0.0/24 (fleet.fabric-ip)" in v.summary
    assert "asymmetric" not in v.summary and v.facts["asymmetric"] == []
    assert v.remedy.startswith("fix the fabric address first on b, d (fleet.fabric-ip")
    assert not any(w in v.remedy for w in ("firewall port", "ufw", "open port", "nftables"))
    assert {(e["source"], e["peer"]) for e in v.facts["explained_by_address"]} == {("b", "c"), ("c", "d"), ("d", "c")}
    # the same hosts on one subnet: the one-way drop is a firewall again (the rule is the address, not the pair)
    b_on = cp("b", "10.0.0.3", attempts=[("10.0.0.1", 5000, "timeout")])
    c_on = cp("c", "10.0.0.1", "coordinator", [("10.0.0.2", 5000, "connected"), ("10.0.0.3", 5000, "connected")])
    v = judged("fleet.control-plane", [c_on, a, b_on])
    assert (v.verdict, v.action) == (FAIL, "OPEN_PORTS") and v.remedy.startswith("on c, open port(s) 5000")
    # an address fault and a firewall elsewhere: both named, each once
    e = cp("e", "10.0.0.4", attempts=[("10.0.0.1", 5000, "timeout")])
    c = cp("c", "10.0.0.1", "coordinator", [("10.0.0.2", 5000, "connected"), ("10.0.1.2", 5000, "connected"),
                                            ("10.0.1.3", 5000, "unreachable"), ("10.0.0.4", 5000, "connected")])
    v = judged("fleet.control-plane", [c, a, b, d, e])
    assert (v.verdict, v.action) == (FAIL, "OPEN_PORTS")
    assert "on c, open port(s) 5000 to e's" in v.remedy and "fix the fabric address first on b, d" in v.remedy


def test_a_gate_that_raises_is_error_for_that_gate_only(monkeypatch):
    def boom(fleet, expect):
        raise KeyError("x")

    monkeypatch.setattr(fg, "GATES", [("fleet.mtu", boom), *fg.GATES[3:4]])
    out = fg.run_fleet_gates([host("a", gid_index=3)])
    assert [(v.id, v.verdict, v.action) for v in out] == [("fleet.mtu", "ERROR", "RERUN"),
                                                          ("fleet.gid-index", PASS, "NONE")]


@pytest.mark.parametrize("n", [8, 9])
def test_at_most_eight_hosts_are_named(n):
    v = judged("fleet.fabric-ip", [fip(f"h{i}", "10.0.0.1") for i in range(n)])
    names = v.summary.split(" share ")[0]
    assert names.startswith("h0, h1, h2, h3, h4, h5, h6, h7")
    assert names.endswith("h7" if n == 8 else "h7 and 1 more")
