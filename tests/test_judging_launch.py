"""Launch gates pinned on a launch env file's values and the limits/reach probes' facts: every verdict
and typed action of launch.fabric-address, launch.capacity, launch.memlock, launch.uverbs-access,
launch.memory-plan and launch.control-plane; the memlock and KV-pool edges; the probe-failed
preambles."""

from __future__ import annotations

import pytest

from afddiag.model.fabric import FabricFacts, Netdev, RdmaDevice
from afddiag.model.gpu import GpuDevice, GpuFacts
from afddiag.model.host import DeviceNode, HostLimits, ReachFacts
from afddiag.playbook import Playbook
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN
from fakes import judge, observation

ENV = "/etc/afd/rank.env"
GIB = 2**30


def launch(gate_id, env=None, pb=None, **facts):
    return judge(gate_id, observation(**facts), launch_env=env, launch_env_path=ENV if env is not None else None,
                 playbook=pb)


# ---------------------------------------------------------------- launch.fabric-address

def test_fabric_address_every_verdict():
    fab = FabricFacts(netdevs={"enp1": Netdev("enp1", 9000, "up", ["10.0.0.5/24"])})
    v = launch("launch.fabric-address", {"AFD_FABRIC_IP": "10.0.0.5"}, fabric=fab)
    assert (v.verdict, v.action, v.summary) == (PASS, "NONE", f"{ENV}: AFD_FABRIC_IP=10.0.0.5 (on enp1)")
    v = launch("launch.fabric-address", {"AFD_FABRIC_IP": "10.0.0.6"}, fabric=fab)
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert v.summary == f"{ENV}: AFD_FABRIC_IP=10.0.0.6 is on no netdev of this host"
    v = launch("launch.fabric-address", {"AFD_FABRIC_IP": "10.0.0.6"})  # no fabric facts: nothing to hold it against
    assert (v.verdict, v.summary) == (PASS, f"{ENV}: AFD_FABRIC_IP=10.0.0.6")
    v = launch("launch.fabric-address", {})
    assert (v.verdict, v.action) == (WARN, "SET_ENV") and "AFD_FABRIC_IP is not set" in v.summary
    v = launch("launch.fabric-address", {}, Playbook(require_fabric_address=True))
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    v = launch("launch.fabric-address", None)
    assert (v.verdict, v.action) == (SKIP, "NONE")


# ---------------------------------------------------------------- launch.capacity

def test_capacity_every_verdict():
    coord = Playbook(name="coordinator", capacity_key="AFD_PREFILL_CAPACITY")
    v = launch("launch.capacity", {"AFD_PREFILL_CAPACITY": "256", "AFD_EXPERT_CAPACITY": "256"}, coord)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "AFD_PREFILL_CAPACITY=256 equals AFD_EXPERT_CAPACITY in the same file"
    v = launch("launch.capacity", {"AFD_PREFILL_CAPACITY": "256", "AFD_EXPERT_CAPACITY": "128"}, coord)
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    # not set: the engine default (1024) is what runs
    v = launch("launch.capacity", {"AFD_EXPERT_CAPACITY": "1024"}, coord)
    assert v.verdict == PASS and "AFD_PREFILL_CAPACITY=1024 (not set: the engine default)" in v.summary
    v = launch("launch.capacity", {"AFD_PREFILL_CAPACITY": "256"}, coord)
    assert (v.verdict, v.action) == (SKIP, "NONE") and "give --expect-capacity with the ranks' value" in v.summary
    v = launch("launch.capacity", {"AFD_PREFILL_CAPACITY": "256"})
    assert v.verdict == SKIP and v.summary.startswith("role unknown")
    v = launch("launch.capacity", None, coord)
    assert (v.verdict, v.action, v.summary) == (SKIP, "NONE", "no launch env file given (--launch-env FILE)")
    assert v.remedy == "pass the launcher's env file with --launch-env"


# ---------------------------------------------------------------- launch.memlock

def limits(soft, **kw):
    return HostLimits(memlock_soft_bytes=soft, memlock_hard_bytes=soft, user="afd", **kw)


@pytest.mark.parametrize("soft, need, verdict", [
    (-1, -1, PASS), (64 * 2**20, -1, FAIL), (8 * GIB, 8 * GIB, PASS), (8 * GIB - 1, 8 * GIB, FAIL),
    (64 * 2**20, 0, WARN), (-1, 0, PASS)])
def test_memlock_edges(soft, need, verdict):
    v = launch("launch.memlock", pb=Playbook(name="expert", memlock_min_bytes=need), limits=limits(soft))
    assert v.verdict == verdict
    assert v.action == {PASS: "NONE", FAIL: "RAISE_LIMIT", WARN: "RAISE_LIMIT"}[verdict]


def test_memlock_texts_preambles_and_skips():
    v = launch("launch.memlock", pb=Playbook(name="expert", memlock_min_bytes=-1),
               limits=limits(64 * 2**20, in_container=True))
    assert v.summary == ("RLIMIT_MEMLOCK 64 MiB for afd (in a container); role expert needs unlimited "
                         "(verbs registrations pin memory)")
    v = launch("launch.memlock", pb=Playbook(name="expert", memlock_min_bytes=8 * GIB), limits=limits(4 * GIB))
    assert v.summary == "RLIMIT_MEMLOCK 4.0 GiB for afd, below the 8.0 GiB role expert needs"
    v = launch("launch.memlock", limits=HostLimits(failed="getrlimit timed out"))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = launch("launch.memlock", limits=HostLimits(captured=False, notes=["limits not captured in this snapshot"]))
    assert (v.verdict, v.summary) == (SKIP, "limits not captured in this snapshot")
    v = launch("launch.memlock", limits=HostLimits(captured=False, notes=["old"]))
    assert v.summary == "limits not captured (old)"
    v = launch("launch.memlock", limits=HostLimits(notes=["prlimit: EPERM"]))
    assert (v.verdict, v.summary) == (SKIP, "RLIMIT_MEMLOCK not read: prlimit: EPERM")


# ---------------------------------------------------------------- launch.uverbs-access

UV = DeviceNode("/dev/infiniband/uverbs0", True, True, True)
CM = DeviceNode("/dev/infiniband/rdma_cm", True, True, True)


def test_uverbs_access_every_verdict():
    rdma = FabricFacts(devices=[RdmaDevice("mlx5_0", 0)])
    v = launch("launch.uverbs-access", limits=HostLimits(device_nodes=[UV, CM], user="afd"), fabric=rdma)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary == "1 uverbs node(s) and rdma_cm readable and writable by afd on this host"
    v = launch("launch.uverbs-access", limits=HostLimits(device_nodes=[UV], user="afd"), fabric=rdma)
    assert (v.verdict, v.action) == (WARN, "PASS_DEVICES") and "but no /dev/infiniband/rdma_cm" in v.summary
    ro = DeviceNode("/dev/infiniband/uverbs0", True, True, False)
    v = launch("launch.uverbs-access", limits=HostLimits(device_nodes=[ro, CM], user="afd"), fabric=rdma)
    assert (v.verdict, v.action) == (FAIL, "PASS_DEVICES")
    assert v.summary == "/dev/infiniband/uverbs0 not readable and writable by afd"
    v = launch("launch.uverbs-access", limits=HostLimits(in_container=True, user="afd"), fabric=rdma)
    assert (v.verdict, v.summary) == (FAIL, "no /dev/infiniband/uverbs* inside this container although RDMA "
                                            "devices are registered")
    v = launch("launch.uverbs-access", pb=Playbook(requires=["rdma"]), limits=HostLimits(user="afd"))
    assert (v.verdict, v.summary) == (FAIL, "no /dev/infiniband/uverbs* on this host")
    v = launch("launch.uverbs-access", limits=HostLimits(user="afd"))
    assert (v.verdict, v.action) == (SKIP, "NONE")
    v = launch("launch.uverbs-access", limits=HostLimits(captured=False))
    assert (v.verdict, v.summary) == (SKIP, "device nodes not captured")
    v = launch("launch.uverbs-access", limits=HostLimits(failed="stat timed out"))
    assert (v.verdict, v.action) == (ERROR, "RERUN")


# ---------------------------------------------------------------- launch.memory-plan

PLAN = {"weights_bytes": 10 * GIB, "kv_bytes_per_token": 2**20, "max_context_tokens": 1024,
        "runtime_headroom_bytes": 1 * GIB}


def plan(total=100 * GIB, reserve=0.5, env=None, **pb):
    g = GpuFacts(available=True, devices=[GpuDevice(0, name="NVIDIA H200", memory_total_bytes=total)])
    return launch("launch.memory-plan", env if env is not None else {"AFD_PREFILL_CAPACITY": "0"},
                  Playbook(name="coordinator", capacity_key="AFD_PREFILL_CAPACITY", reserve_fraction=reserve,
                           plan={**PLAN, **pb}), gpu=g)


def test_memory_plan_without_a_launch_env_skips():
    g = GpuFacts(available=True, devices=[GpuDevice(0, name="NVIDIA H200", memory_total_bytes=100 * GIB)])
    v = launch("launch.memory-plan", None, Playbook(name="coordinator", capacity_key="AFD_PREFILL_CAPACITY",
                                                     reserve_fraction=0.5, plan=PLAN), gpu=g)
    assert (v.verdict, v.action, v.summary) == (SKIP, "NONE", "no launch env file given (--launch-env FILE)")
    assert v.remedy == "pass the launcher's env file with --launch-env"


def test_memory_plan_pool_edges():
    # reserved 11 GiB - 1 GiB headroom - 10 GiB weights = 0: out of memory at exactly zero
    v = plan(total=11 * GIB, reserve=1.0)
    assert (v.verdict, v.action) == (FAIL, "SET_ENV") and "out of memory predicted" in v.summary
    # 1 GiB pool = 1024 tokens of 1 MiB = exactly one full context
    v = plan(total=12 * GIB, reserve=1.0)
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary.endswith("KV pool 1.00 GiB = 0.00 M tokens = 1 full 1,024-token context(s)")
    v = plan(total=12 * GIB - 2**20, reserve=1.0)
    assert (v.verdict, v.action) == (WARN, "SET_ENV") and "not one request at the maximum context fits" in v.summary


def test_memory_plan_inputs_and_skips():
    v = plan(env={"AFD_PREFILL_CAPACITY": "0", "AFD_DRAFTER": "off", "AFD_GPU_MEMORY_RESERVATION": "0.2"},
             drafter_bytes=5 * GIB)
    assert "AFD_GPU_MEMORY_RESERVATION=0.2" in v.summary and "AFD_DRAFTER=off" in v.summary
    assert v.facts["pool_bytes"] == int(0.2 * 100 * GIB) - 11 * GIB
    v = plan(env={"AFD_PREFILL_CAPACITY": "0"}, drafter_bytes=5 * GIB)  # drafter on by default
    assert v.facts["occupied_bytes"] == 15 * GIB and "drafter on (default)" in v.summary
    assert plan(reserve=0.0).verdict == SKIP
    v = judge("launch.memory-plan", observation(), launch_env={}, playbook=Playbook(name="x"))
    assert v.verdict == SKIP and "has no memory plan" in v.summary
    v = judge("launch.memory-plan", observation(gpu=GpuFacts(failed="nvmlInit timed out")), launch_env={},
              playbook=Playbook(name="x", plan=PLAN, reserve_fraction=0.5))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = judge("launch.memory-plan", observation(gpu=GpuFacts(why="no driver")), launch_env={},
              playbook=Playbook(name="x", plan=PLAN, reserve_fraction=0.5))
    assert (v.verdict, v.summary) == (SKIP, "GPU memory unknown (no driver): nothing to plan against")


# ---------------------------------------------------------------- launch.control-plane

def reach(*attempts, **kw):
    return ReachFacts(source="10.0.0.1", peers=["10.0.0.2"], ports=[5000],
                      attempts=[{"peer": "10.0.0.2", "port": 5000, "outcome": o, "ok": o == "connected"}
                                for o in attempts], **kw)


@pytest.mark.parametrize("outcome, verdict", [("connected", PASS), ("refused", PASS), ("timeout", FAIL),
                                              ("unreachable", FAIL), ("bind failed", FAIL), ("error", FAIL)])
def test_control_plane_outcomes(outcome, verdict):
    v = launch("launch.control-plane", {}, reach=reach(outcome))
    assert (v.verdict, v.action) == (verdict, "OPEN_PORTS" if verdict == FAIL else "NONE")


def test_control_plane_texts_advertised_and_skips():
    v = launch("launch.control-plane", {}, reach=reach("connected", "refused"))
    assert v.summary == ("2 control connection(s) from 10.0.0.1 to 10.0.0.2 on port(s) 5000: 1 connected; 1 refused "
                         "(the peer answered, nothing listens yet: start order)")
    v = launch("launch.control-plane", {}, reach=reach("timeout", "connected"))
    assert v.summary == "1 of 2 control connection(s) from 10.0.0.1 fail: 10.0.0.2:5000 timeout"
    v = launch("launch.control-plane", {"AFD_COORD_ADDR": "127.0.0.1:9000", "MASTER_ADDR": "0.0.0.0",
                                        "AFD_PEER_HOST": "[::1]:80", "AFD_OTHER": "127.0.0.1"},
               reach=reach("connected"))
    assert (v.verdict, v.action) == (FAIL, "SET_ENV")
    assert [b["key"] for b in v.facts["advertised_bad"]] == ["AFD_COORD_ADDR", "AFD_PEER_HOST", "MASTER_ADDR"]
    v = launch("launch.control-plane", {}, reach=ReachFacts(failed="connect loop timed out"))
    assert (v.verdict, v.action) == (ERROR, "RERUN")
    v = launch("launch.control-plane", {})
    assert (v.verdict, v.summary) == (SKIP, "control-plane reach not tried: no peers (--peer or AFD_PEER_FABRIC_IPS)")
    v = judge("launch.control-plane", observation(reach=ReachFacts()), peers=["10.0.0.2"])
    assert v.summary.startswith("control-plane reach not tried: no engine ports")
    v = launch("launch.control-plane", {}, reach=ReachFacts(captured=False, notes=["not captured in this snapshot"]))
    assert v.summary == "control-plane reach not captured in this snapshot"
