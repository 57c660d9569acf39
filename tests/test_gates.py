"""Verdict rules on boundaries, on facts built directly (no host, no snapshot)."""

import pytest

from afddiag.envvars import parse_device_map, parse_env_file, parse_nccl_hca
from afddiag.gates import Context, fabric, gpu, resolve_fabric_ip
from afddiag.model.fabric import FabricFacts, Gid, Netdev, Port, QpFacts, QpResult, QpStep, RdmaDevice
from afddiag.model.gpu import GpuDevice, GpuFacts, UnderLoad
from afddiag.model.run import Inputs, Observation
from afddiag.verdict import Verdict, exit_code

V4 = "0000:0000:0000:0000:0000:ffff:0a09:0002"  # 10.9.0.2
FE80 = "fe80:0000:0000:0000:0817:58ff:fe65:b049"


def host(env=None, mtu=1500, second_state="ACTIVE", qp=None, v4_type="RoCE v2"):
    """zrxe0 (fe80 only) enumerates first; arxe1 carries 10.9.0.2 on netdev vc."""
    f = FabricFacts(order_source="test", addresses_source="test")
    f.devices = [
        RdmaDevice("zrxe0", 0, ports=[Port(1, "ACTIVE", "LinkUp", "Ethernet", gids=[Gid(0, FE80, "RoCE v2", "va")])]),
        RdmaDevice("arxe1", 1, ports=[Port(1, second_state, "LinkUp", "Ethernet", gids=[
            Gid(0, FE80, "RoCE v2", "vc"), Gid(1, V4, v4_type, "vc", "10.9.0.2")])]),
    ]
    f.netdevs = {"va": Netdev("va", 1500, "up"), "vc": Netdev("vc", mtu, "up", ["10.9.0.2/24"])}
    obs = Observation("h", "test", fabric=f, qp=qp or QpFacts(ran=False, why="test"), env=env or {})
    return obs


def ctx(obs, fabric_ip=None, **kw):
    inputs = Inputs(fabric_ip=fabric_ip, **kw)
    return Context(obs, inputs, resolve_fabric_ip(obs.fabric, fabric_ip))


@pytest.mark.parametrize("netdev_mtu,roce", [(1500, 1024), (9000, 4096), (4192, 4096), (4191, 2048),
                                             (1120, 1024), (1119, 512), (351, 0), (352, 256)])
def test_roce_mtu_matches_iboe_get_mtu(netdev_mtu, roce):
    assert fabric.roce_mtu(netdev_mtu) == roce


def test_mtu_gate_boundary():
    assert fabric.mtu(ctx(host(mtu=4192))).verdict == "PASS"
    v = fabric.mtu(ctx(host(mtu=4191)))
    assert v.verdict == "WARN" and "2048" in v.summary


def test_fabric_ip_resolved_from_only_candidate_and_first_device_fails():
    c = ctx(host())
    assert c.fabric_ip.ip == "10.9.0.2" and c.fabric_ip.source.startswith("only")
    v = fabric.first_device(c)
    assert v.verdict == "FAIL"
    assert "zrxe0" in v.summary and v.commands == ["export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=10.9.0.2=arxe1"]


def test_map_rescues_first_device_only_when_right():
    good = host(env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=arxe1"})
    assert fabric.first_device(ctx(good)).verdict == "PASS"
    assert fabric.devicemap_env(ctx(good)).verdict == "PASS"
    bad = host(env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=zrxe0"})
    assert fabric.first_device(ctx(bad)).verdict == "FAIL"
    assert fabric.devicemap_env(ctx(bad)).verdict == "FAIL"
    ghost = host(env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=mlx5_9"})
    v = fabric.first_device(ctx(ghost))
    assert v.verdict == "FAIL" and "not an RDMA device on this host" in v.summary


def test_map_entries_for_other_hosts_are_ignored_and_garbage_fails():
    fleet = host(env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.1=rocep1s0f1,10.9.0.2=arxe1"})
    assert fabric.devicemap_env(ctx(fleet)).verdict == "PASS"
    junk = host(env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=arxe1,oops"})
    v = fabric.devicemap_env(ctx(junk))
    assert v.verdict == "FAIL" and "'oops' is not ip=device" in v.summary


def test_nccl_hca_prefix_and_exact():
    assert fabric.devicemap_env(ctx(host(env={"NCCL_IB_HCA": "=arxe1:1"}))).verdict == "PASS"
    assert fabric.devicemap_env(ctx(host(env={"NCCL_IB_HCA": "^arxe"}))).verdict == "FAIL"
    assert fabric.devicemap_env(ctx(host(env={"NCCL_IB_HCA": "=arxe"}))).verdict == "FAIL"  # exact: no prefix
    v = fabric.devicemap_env(ctx(host(env={"NCCL_IB_HCA": "arxe1:2"})))
    assert v.verdict == "FAIL"  # wrong port
    # the catalog's rule: selecting, beside the fabric port, an ACTIVE port with no IPv4 RoCE v2 GID FAILs
    v = fabric.devicemap_env(ctx(host(env={"NCCL_IB_HCA": "zrxe0,arxe1"}), "10.9.0.2"))
    assert v.verdict == "FAIL" and "zrxe0:1 has no IPv4 RoCE v2 GID" in v.summary
    assert "export NCCL_IB_HCA==arxe1:1" in v.commands, v.commands
    spec = parse_nccl_hca("roce")
    assert all(spec.selects(d, 1) for d in ("rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"))


def test_map_without_the_fabric_ip_is_the_fault_when_the_fallback_device_lacks_it():
    """A map set without the fabric IP's entry sends the engine to the first enumerated device: when
    that device does not carry the address, the missing entry is the fault (FAIL, one root explaining
    fabric.first-device) and the remedy adds the entry to the map as it is (never 'unset' it, which
    gives the same first device); when the first device carries it, only a WARN."""
    from afddiag.diagnosis import prepare

    env = {"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.8.0.9=rocep1s0f1"}  # another host's entry only
    c = ctx(host(env=env), "10.9.0.2")
    v = fabric.devicemap_env(c)
    assert v.verdict == "FAIL" and "no entry for fabric IP 10.9.0.2" in v.summary and "zrxe0" in v.summary, v.summary
    assert v.commands == ["export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=10.8.0.9=rocep1s0f1,10.9.0.2=arxe1"]
    assert "remove" not in v.remedy, v.remedy  # the map is never to be dropped
    roots = prepare([fabric.first_device(c), v])
    assert [(r["gate"], r["action"], r["explains"]) for r in roots] == [
        ("fabric.devicemap-env", "SET_ENV", ["fabric.first-device"])]
    swapped = host(env=env)
    swapped.fabric.devices.reverse()  # arxe1, which carries 10.9.0.2, enumerates first
    v = fabric.devicemap_env(ctx(swapped, "10.9.0.2"))
    assert v.verdict == "WARN" and "arxe1, which carries it" in v.summary


def test_nccl_gid_index():
    assert fabric.devicemap_env(ctx(host(env={"NCCL_IB_GID_INDEX": "1"}))).verdict == "PASS"
    v = fabric.devicemap_env(ctx(host(env={"NCCL_IB_GID_INDEX": "0"})))
    assert v.verdict == "FAIL" and "GID index 1" in v.summary
    assert fabric.devicemap_env(ctx(host(env={"NCCL_IB_GID_INDEX": "x"}))).verdict == "FAIL"


@pytest.mark.parametrize("var", ["NCCL_IB_GID_INDEX", "MC_GID_INDEX", "UCX_IB_GID_INDEX"])
def test_every_engines_forced_gid_index_is_judged_alike(var):
    """NCCL's, Mooncake's and UCX's forced GID index follow one rule: the fabric IP's RoCE v2 GID index
    (held-out: MC_GID_INDEX=1 and UCX_IB_GID_INDEX=1, both fe80, passed unjudged as 'none set')."""
    v = fabric.devicemap_env(ctx(host(env={var: "1"}), "10.9.0.2"))
    assert v.verdict == "PASS", v.summary
    v = fabric.devicemap_env(ctx(host(env={var: "0"}), "10.9.0.2"))
    assert v.verdict == "FAIL" and v.summary.startswith(f"{var}=0 on arxe1 port 1 is {FE80}")
    assert "GID index 1" in v.summary
    assert f"export {var}=1" in v.commands and f"remove {var} from it" in v.remedy, (v.remedy, v.commands)
    assert fabric.devicemap_env(ctx(host(env={var: "x"}), "10.9.0.2")).verdict == "FAIL"
    v = fabric.devicemap_env(ctx(host(v4_type="IB/RoCE v1", env={var: "1"}), "10.9.0.2"))
    assert v.verdict == "FAIL" and f"{var}=1 selects" in v.summary and "a RoCE v1 GID" in v.summary


def test_two_engines_gid_indexes_each_named():
    """Two engines forced to different indexes: the wrong one is named, the right one is not."""
    v = fabric.devicemap_env(ctx(host(env={"NCCL_IB_GID_INDEX": "1", "MC_GID_INDEX": "0"}), "10.9.0.2"))
    assert v.verdict == "FAIL" and "MC_GID_INDEX=0" in v.summary and "NCCL_IB_GID_INDEX=1" not in v.summary
    assert "export NCCL_IB_GID_INDEX=1" in v.commands and "export MC_GID_INDEX=1" in v.commands


def test_port_down_fails_link_and_rocev1_fails_rocev2():
    assert fabric.link(ctx(host(second_state="DOWN"), "10.9.0.2")).verdict == "FAIL"
    v = fabric.rocev2_ipv4(ctx(host(v4_type="IB/RoCE v1"), "10.9.0.2"))
    assert v.verdict == "FAIL" and "only as RoCE v1" in v.summary


def test_unread_gid_type_is_not_roce_v1():
    """A GID whose gid_attrs/types/<i> was not read (type None) is neither v1 nor v2: no 'only as RoCE
    v1' claim (HW_INSPECTION, a drain), no map or GID-index FAIL on it; a read v1 type still FAILs."""
    obs = host(v4_type=None, env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=arxe1"})
    for ip in ("10.9.0.2", None):
        v = fabric.rocev2_ipv4(ctx(obs, ip))
        assert v.verdict == "SKIP" and "GID type not read" in v.summary and "RoCE v1" not in v.remedy, v.summary
    v = fabric.devicemap_env(ctx(obs, "10.9.0.2"))
    assert v.verdict == "SKIP" and "entry 10.9.0.2=arxe1" in v.summary and "not read" in v.summary
    v = fabric.devicemap_env(ctx(host(v4_type=None, env={"NCCL_IB_GID_INDEX": "1"}), "10.9.0.2"))
    assert v.verdict == "SKIP" and "RoCE v1" not in v.summary
    v = fabric.devicemap_env(ctx(host(v4_type="IB/RoCE v1", env={"NCCL_IB_GID_INDEX": "1"}), "10.9.0.2"))
    assert v.verdict == "FAIL" and "a RoCE v1 GID" in v.summary
    v = fabric.rocev2_ipv4(ctx(host(v4_type="IB/RoCE v1"), None))
    assert v.verdict == "FAIL" and "only as RoCE v1" in v.summary


@pytest.mark.parametrize("state,operstate,verdict", [(None, "up", "SKIP"), (None, None, "SKIP"),
                                                     (None, "down", "FAIL"), ("DOWN", "up", "FAIL"),
                                                     ("ACTIVE", "up", "PASS")])
def test_link_unread_port_state_is_no_evidence_of_a_down_link(state, operstate, verdict):
    """A port state that could not be read (an unreadable or missing ports/<p>/state) is not DOWN:
    fabric.link says it was not read, never the cable remedy; a netdev read as down still FAILs."""
    obs = host(second_state=state)
    obs.fabric.devices[1].ports[0].phys_state = None if state is None else "LinkUp"
    obs.fabric.netdevs["vc"].operstate = operstate
    v = fabric.link(ctx(obs, "10.9.0.2"))
    assert v.verdict == verdict, v.summary
    if verdict == "SKIP":
        assert "port state not read" in v.summary and "cable" not in v.remedy
        assert "state not read" in fabric.rocev2_ipv4(ctx(obs, "10.9.0.2")).summary


def test_ambiguous_fabric_ip_warns_and_lists_candidates():
    obs = host()
    dev = obs.fabric.devices[0]
    dev.ports[0].gids.append(Gid(1, "0000:0000:0000:0000:0000:ffff:0a08:0002", "RoCE v2", "va", "10.8.0.2"))
    obs.fabric.netdevs["va"].ipv4 = ["10.8.0.2/24"]
    c = ctx(obs)
    assert c.fabric_ip.ambiguous
    for g in (fabric.link, fabric.mtu, fabric.first_device):
        v = g(c)
        assert v.verdict == "WARN" and "ambiguous" in v.summary and "10.8.0.2" in v.summary
    assert fabric.first_device(ctx(obs, "10.8.0.2")).verdict == "PASS"


def test_qp_gate_judges_engine_device_and_decodes_errno():
    fail = QpResult("zrxe0", 1, 0, FE80, "first RoCE v2 GID (fallback)", "10.9.0.1", reached="INIT", errno=-22,
                    steps=[QpStep("INIT", True), QpStep("RTR", False, 22)])
    ok = QpResult("arxe1", 1, 1, V4, "fabric IP", "10.9.0.1", reached="RTS",
                  steps=[QpStep("INIT", True), QpStep("RTR", True), QpStep("RTS", True)])
    qp = QpFacts(ran=True, results=[fail, ok])
    v = fabric.qp_rtr(ctx(host(qp=qp), peers=["10.9.0.1"]))
    assert v.verdict == "FAIL" and "errno 22" in v.summary and "invalid attribute" in v.summary
    assert "INIT→RTR" in v.summary
    mapped = host(env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=arxe1"}, qp=qp)
    assert fabric.qp_rtr(ctx(mapped)).verdict == "PASS"
    timeout = QpFacts(ran=True, results=[QpResult("arxe1", reached="INIT", errno=110, target="10.9.0.1")])
    v = fabric.qp_rtr(ctx(host(env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.9.0.2=arxe1"}, qp=timeout)))
    assert v.verdict == "FAIL" and "timed out" in v.summary and "ARP" in v.remedy
    loop = QpFacts(ran=True, results=[QpResult("zrxe0", reached="RTS", target="loopback")])
    v = fabric.qp_rtr(ctx(host(qp=loop)))
    assert v.verdict == "PASS" and "weaker test" in v.summary
    assert fabric.qp_rtr(ctx(host(qp=QpFacts(ran=True, results=[])))).verdict == "ERROR"


def gpu_obs(ul=None, mx=3000.0, base=None, reasons=0, counters=None, util=100.0):
    d = GpuDevice(0, "NVIDIA GB10", sm_count=48, clock_sm_max_mhz=mx, clocks_event_reasons=reasons,
                  clocks_event_reason_counters_us=counters, memory_total_bytes=1, memory_source="nvml")
    if ul is not None:
        d.under_load = UnderLoad(clock_sm_mhz=ul, utilization_pct=util, bf16_tflops=(base or {}).get("got"))
    return Observation("h", "test", gpu=GpuFacts(available=True, devices=[d], baseline=base))


@pytest.mark.parametrize("clock,verdict", [(1499, "FAIL"), (1500, "PASS")])
def test_slow_state_class_a_boundary_half_of_max(clock, verdict):
    v = gpu.slow_state(ctx(gpu_obs(ul=clock, mx=3000)))
    assert v.verdict == verdict
    if verdict == "FAIL":
        assert "class A" in v.summary


@pytest.mark.parametrize("got,verdict", [(79.9, "FAIL"), (80.0, "PASS")])
def test_slow_state_class_b_boundary_80_percent(got, verdict):
    base = {"bf16_tflops": 100.0, "clock_sm_mhz_under_load": 2400, "got": got}
    v = gpu.slow_state(ctx(gpu_obs(ul=2400, base=base)))
    assert v.verdict == verdict
    if verdict == "FAIL":
        assert "class B" in v.summary and "bf16_tflops" in v.summary


@pytest.mark.parametrize("mask", [0x20, 0x40, 0x80, 0x8])
def test_slow_state_explained_by_a_clock_event_reason_is_no_power_cycle(mask):
    """A slow clock under load with thermal slowdown, HW slowdown or power brake active is that
    cause's (gpu.clock-events), not the slow state: WARN naming it, never the AC power cycle."""
    o = gpu_obs(ul=1000, mx=3000)
    o.gpu.devices[0].under_load.clocks_event_reasons = mask
    v = gpu.slow_state(ctx(o))
    assert v.verdict == "WARN" and "not the slow state" in v.summary and "class A" in v.summary, v.summary
    assert "AC power cycle is advised only" in v.remedy and v.action != "AC_POWER_CYCLE"
    o.gpu.devices[0].under_load.clocks_event_reasons = 0x4  # SW power cap alone explains nothing
    assert gpu.slow_state(ctx(o)).verdict == "FAIL"


def test_slow_state_low_utilization_is_inconclusive_never_pass():
    v = gpu.slow_state(ctx(gpu_obs(ul=2400, util=79)))
    assert v.verdict == "WARN" and "inconclusive" in v.summary
    assert gpu.slow_state(ctx(gpu_obs())).verdict == "SKIP"  # no under-load readings


@pytest.mark.parametrize("util,verdict", [(7, "WARN"), (79.9, "WARN"), (80, "FAIL")])
def test_slow_state_low_utilization_figures_are_idle_not_class_a(util, verdict):
    """Figures recorded while the GPU was not kept busy (P8, 232 MHz at 7 % utilization) are idle
    figures: inconclusive, never class A and never the AC power cycle; at 80 % and above a clock
    under half of max is judged as before (no utilization at all: the next test)."""
    o = gpu_obs(ul=232, mx=3090, util=util)
    o.gpu.devices[0].under_load.pstate = 8
    v = gpu.slow_state(ctx(o))
    assert v.verdict == verdict, v.summary
    if verdict == "WARN":
        assert "inconclusive" in v.summary and "class A" not in v.summary and "232 MHz, P8" in v.summary
        assert "power-cycle" not in v.remedy
    else:
        assert "class A" in v.summary


@pytest.mark.parametrize("pstate,util,verdict", [(8, None, "WARN"), (12, None, "WARN"), (2, None, "FAIL"),
                                                 (8, 100, "FAIL"), (None, None, "FAIL")])
def test_slow_state_p8_reading_without_utilization_is_idle(pstate, util, verdict):
    """A recording with no utilization figure whose P-state is P8 or deeper was not taken under a
    compute load (compute runs at P0-P2): inconclusive, never class A. With utilization at 100 % a GPU
    stuck in P8 is judged (that is a slow GPU, not an idle one)."""
    o = gpu_obs(ul=240, mx=3090, util=util)
    o.gpu.devices[0].under_load.pstate = pstate
    v = gpu.slow_state(ctx(o))
    assert v.verdict == verdict, v.summary
    if verdict == "WARN":
        assert f"P{pstate} (an idle performance state) and no utilization recorded" in v.summary


@pytest.mark.parametrize("mask,verdict", [(0x1, "PASS"), (0x4, "PASS"), (0x2 | 0x10, "PASS"), (0x20, "WARN"),
                                          (0x8, "FAIL"), (0x40, "FAIL"), (0x80, "FAIL"), (0x24, "WARN")])
def test_clock_event_bits(mask, verdict):
    assert gpu.clock_events(ctx(gpu_obs(reasons=mask))).verdict == verdict


def test_clock_event_counters_warn_without_a_current_bit():
    v = gpu.clock_events(ctx(gpu_obs(counters={"hw_slowdown": 0, "sw_thermal_slowdown": 2_000_000})))
    assert v.verdict == "WARN" and "2.00 s" in v.summary


def test_exit_code_precedence():
    mk = lambda *vs: [Verdict("x.y", v, "s") for v in vs]  # noqa: E731
    assert exit_code(mk("PASS", "SKIP")) == 0
    assert exit_code(mk("PASS", "WARN")) == 1
    assert exit_code(mk("WARN", "ERROR")) == 3
    assert exit_code(mk("ERROR", "FAIL", "WARN")) == 2


def test_parsers():
    assert parse_device_map("10.0.0.1=mlx5_0, 10.0.0.2=mlx5_1,") == ({"10.0.0.1": "mlx5_0", "10.0.0.2": "mlx5_1"}, [])
    _, probs = parse_device_map("10.0.0.1=a,10.0.0.1=b,x=y,10.0.0.3=")
    assert len(probs) == 3
    env = parse_env_file("# c\nexport A='1 2'\nB=\"x=y\"\n\ngarbage\nC=3\n")
    assert env == {"A": "1 2", "B": "x=y", "C": "3"}


@pytest.mark.parametrize("power_w,limit_w,reasons,verdict", [
    # a power reading above the limit: SW power cap holds 210 MHz (open-gpu-kernel-modules #1237)
    (588.4, 35.0, 0x4, "WARN"),
    (25.0, 25.0, 0x4, "WARN"),     # a platform limit of 25 W reached: ~600 MHz (open-gpu-kernel-modules #1310)
    (100.0, 100.0, None, "WARN"),  # a 575 W card capped at 100 W: at the limit, whatever the mask says
    # 92 % with SW power capping active: the limiter's running average sits under the limit
    (92.0, 100.0, 0x4, "WARN"),
    (92.0, 100.0, 0x0, "FAIL"),    # 92 % and no SW power cap reason: the limiter does not explain the clock
    (80.0, 100.0, 0x4, "FAIL"),    # far under the limit: the cap bit alone explains nothing
    (19.5, None, 0x0, "FAIL"),     # no enforced limit read (GB10: NOT_SUPPORTED): class A as before
])
def test_slow_state_at_the_enforced_power_limit_is_the_limiter_not_class_a(power_w, limit_w, reasons, verdict):
    """A low clock under load while the GPU draws its enforced power limit (or its reading says it
    does) is what SW power capping does: WARN naming power and limit, never the AC power cycle (a
    power cycle raises no limit and fixes no power reading); below the limit the class A judgment
    stands."""
    o = gpu_obs(ul=210, mx=2115)
    d = o.gpu.devices[0]
    d.under_load.power_mw = power_w * 1000
    d.under_load.clocks_event_reasons = reasons
    d.power_limit_mw = limit_w * 1000 if limit_w is not None else None
    v = gpu.slow_state(ctx(o))
    assert v.verdict == verdict, v.summary
    if verdict == "WARN":
        assert "not the slow state" in v.summary and "enforced power limit" in v.summary, v.summary
        assert v.action != "AC_POWER_CYCLE" and "power-cycle" not in v.remedy and "nvidia-smi -q -d POWER" in v.remedy
        assert v.facts["0"]["explained_by"] == ["power_limit"]
        assert ("telemetry is suspect" in v.summary) == (power_w > 1.05 * limit_w)
    else:
        assert "class A" in v.summary and "power-cycle" in v.remedy


def test_slow_state_power_limit_does_not_excuse_class_b_at_a_normal_clock():
    """At the power limit with the clock normal, a throughput shortfall is still class B: the limiter
    explains a low clock, not slow work at a normal one."""
    base = {"bf16_tflops": 100.0, "clock_sm_mhz_under_load": 2400, "got": 50.0}
    o = gpu_obs(ul=2400, base=base)
    d = o.gpu.devices[0]
    d.under_load.power_mw, d.power_limit_mw, d.under_load.clocks_event_reasons = 100_000, 100_000, 0x4
    v = gpu.slow_state(ctx(o))
    assert v.verdict == "FAIL" and "class B" in v.summary
