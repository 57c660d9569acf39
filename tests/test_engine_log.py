"""Engine evidence (issue 24): what NCCL says it chose, read from the engine's log (--engine-log), kept
by a capture and replayed, and launch.engine-net judging it against the fabric IP's HCA, port and GID
index on the healthy Spark case (fabric IP 192.168.100.11 on rocep1s0f1 port 1, RoCE v2 GID index 3).

Lines are written from NVIDIA/nccl's format strings: net_ib.cc "NET/IB : Using%s %s; OOB %s:%s" with
" [%d]%s:%d/%s" per device and the RoCE connect line "NET/IB: %s %d IbDev %d Port %d qpn %d mtu %d GID %ld
(%lX/%lX) ..."; net_socket.cc "NET/Socket : Using%s" with " [%d]%s:%s"; init.cc "Using network %s";
param.cc "%s set by environment to %lld."."""

from __future__ import annotations

import os

import pytest

from afddiag import summary
from afddiag.capture import collect_bundle
from afddiag.gates import fleet as fg
from afddiag.model.engine import parse
from afddiag.model.run import Inputs
from afddiag.playbook import Playbook
from afddiag.probes.engine import read_engine_log
from afddiag.runner import diagnose
from afddiag.schema.validate import summary_check
from afddiag.verdict import FAIL, PASS, SKIP, WARN
from conftest import case_dirs
from fakes import case_sources
from snapfix import fabric_case
from test_judging_fleet import host  # the fleet tests' recorded host (its per-host summary)

P = "spark-b:4242:4242 [0] NCCL INFO "
IB_F1 = P + "NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.100.11<0>"
IB_F0 = P + "NET/IB : Using [0]rocep1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:10.0.0.1<0>"
NET_IB, NET_SOCK = P + "Using network IB", P + "Using network Socket"
SOCK = P + "NET/Socket : Using [0]enp1s0f1np1:192.168.100.11<0>"
GID3, GID0 = P + "NCCL_IB_GID_INDEX set by environment to 3.", P + "NCCL_IB_GID_INDEX set by environment to 0."
CONNECT = P.replace("4242 [0]", "4250 [0]") + ("NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 2345 mtu 5 GID {g} "
                                               "(0/B64A8C0FFFF0000) fifoRkey=0x2a fifoLkey=0x2b")
NOISE = ["INFO 05-02 vllm engine starting", P + "cudaDriverVersion 13000", P + "Bootstrap: Using enP7s7:10.0.0.9<0>"]


def test_parse_reads_each_line_kind():
    f = parse(NOISE + [IB_F1, NET_IB, GID3, CONNECT.format(g=3), SOCK])
    assert f.ib_devices == [{"index": 0, "device": "rocep1s0f1", "port": 1, "link_layer": "RoCE"}]
    assert f.oob == {"netdev": "enp1s0f1np1", "ip": "192.168.100.11", "address": "192.168.100.11<0>"}
    assert f.networks == ["IB"] and f.env == {"NCCL_IB_GID_INDEX": "3"}
    assert f.connections == [{"ib_dev": 0, "port": 1, "mtu": 5, "gid_index": 3}]
    assert f.socket_devices == [{"index": 0, "netdev": "enp1s0f1np1", "ip": "192.168.100.11"}]
    many = parse([P + "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB; OOB ib0:fe80::1%ib0<0>"])
    assert [d["device"] for d in many.ib_devices] == ["mlx5_0", "mlx5_1"] and many.oob["ip"] is None
    assert not parse(NOISE).has_net_lines


def test_a_hostile_log_is_bounded(tmp_path):
    p = tmp_path / "e.log"
    p.write_text("x" * 5000 + "\n" + (IB_F1 + "\n") * 3000 + P + "NET/IB : Using " + "[0]a:1/RoCE " * 100000 + "\n")
    lines, notes = read_engine_log(str(p))
    assert len(lines) == 2000 and all(len(x) <= 4096 for x in lines) and "kept" in notes[0]
    assert read_engine_log(str(tmp_path))[0] is None  # a directory
    os.mkfifo(tmp_path / "fifo")
    assert read_engine_log(str(tmp_path / "fifo")) == (None, [f"engine log {tmp_path / 'fifo'}: not a regular file"])


def judge(tmp_path, lines, role="expert"):
    log = tmp_path / "engine.out"
    log.write_text("\n".join(NOISE + lines) + "\n")
    rep, _ = diagnose(Inputs(snapshot=str(fabric_case("02-")), engine_log=str(log), fabric_ip="192.168.100.11",
                             playbook=Playbook(name=role, requires=("rdma",) if role == "expert" else ())))
    return next(g for g in rep["gates"] if g["id"] == "launch.engine-net")


def test_the_fabric_ips_hca_and_gid_pass(tmp_path):
    v = judge(tmp_path, [IB_F1, NET_IB, GID3, CONNECT.format(g=3)])
    assert v["verdict"] == PASS and v["summary"].startswith("NCCL uses rocep1s0f1:1/RoCE, GID index 3: the fabric IP")


def test_another_hca_fails_with_the_fabric_ips_device(tmp_path):
    v = judge(tmp_path, [IB_F0, NET_IB])
    assert v["verdict"] == FAIL and "but the fabric IP 192.168.100.11 is on rocep1s0f1 port 1" in v["summary"]
    assert v["commands"] == ["export NCCL_IB_HCA==rocep1s0f1:1"]


@pytest.mark.parametrize("lines", [[IB_F1, NET_IB, GID0], [IB_F1, NET_IB, CONNECT.format(g=0)]])
def test_another_gid_index_fails(tmp_path, lines):
    v = judge(tmp_path, lines)
    assert v["verdict"] == FAIL and "with GID index 0" in v["summary"]
    assert v["commands"] == ["export NCCL_IB_GID_INDEX=3"]


def test_socket_fallback_fails_where_rdma_is_required_and_warns_otherwise(tmp_path):
    v = judge(tmp_path, [SOCK, NET_SOCK])
    assert v["verdict"] == FAIL and v["summary"].startswith("NCCL fell back to sockets: Using network Socket over "
                                                            "enp1s0f1np1 192.168.100.11")
    assert judge(tmp_path, [SOCK, NET_SOCK], role="generic")["verdict"] == WARN
    forced = judge(tmp_path, [P + "NCCL_IB_DISABLE set by environment to 1.", SOCK, NET_SOCK])
    assert forced["verdict"] == FAIL and "NCCL_IB_DISABLE=1 set by the environment" in forced["summary"]


def test_a_log_without_net_lines_skips_saying_so_and_no_log_skips(tmp_path):
    v = judge(tmp_path, [])
    assert v["verdict"] == SKIP and "no NCCL NET lines: run the engine with NCCL_DEBUG=INFO" in v["summary"]
    rep, _ = diagnose(Inputs(snapshot=str(fabric_case("02-"))))
    assert next(g for g in rep["gates"] if g["id"] == "launch.engine-net")["verdict"] == SKIP


def test_hostile_device_names_are_escaped(tmp_path):
    v = judge(tmp_path, [P + "NET/IB : Using [0]ev\x1bc\x07il\u202e:1/RoCE; OOB e0:1.2.3.4<0>", NET_IB])
    assert v["verdict"] == FAIL and "\x1b" not in v["summary"] and "\u202e" not in v["summary"]
    assert "ev\\x1bc\\x07il\\u202e:1" in v["summary"]
    v = judge(tmp_path, [NET_IB])  # the network named, the HCA not: not judged
    assert v["verdict"] == SKIP and "no 'NET/IB : Using' line" in v["summary"]


def test_capture_keeps_the_evidence_lines_and_replay_judges_them(tmp_path):
    log = tmp_path / "engine.out"
    log.write_text("\n".join(NOISE + [IB_F1, NET_IB, GID3]) + "\n")
    files, _h, _n = collect_bundle(case_sources(fabric_case("02-")), engine_log=str(log))
    assert files["engine.log"].decode().splitlines() == [IB_F1, NET_IB, GID3]
    snap = tmp_path / "snap"
    for rel, data in files.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
    rep, obs = diagnose(Inputs(snapshot=str(snap), fabric_ip="192.168.100.11"))
    assert obs.engine.source == "snapshot engine.log"
    assert next(g for g in rep["gates"] if g["id"] == "launch.engine-net")["verdict"] == PASS


@pytest.mark.parametrize("case", [c for c in case_dirs("fabric") + case_dirs("gpu") if "healthy" in c.name])
def test_healthy_captures_skip_without_an_engine_log(case):
    rep, _ = diagnose(Inputs(snapshot=str(case)))
    assert next(g for g in rep["gates"] if g["id"] == "launch.engine-net")["verdict"] == SKIP


# ---------------------------------------------------------------- the per-host summary and fleet.engine-net


def ranks(*engines):
    return [host(f"s{i}", engine=e) for i, e in enumerate(engines)]


def fleet_verdict(fleet):
    return next(v for v in fg.run_fleet_gates(fleet) if v.id == "fleet.engine-net")


ROCE3 = {"network": "IB", "devices": ["rocep1s0f1:1/RoCE"], "gid_indexes": [3]}


def test_fleet_a_rank_on_sockets_beside_roce_ranks_warns_naming_it():
    v = fleet_verdict(ranks(ROCE3, ROCE3, {"network": "Socket", "devices": [], "gid_indexes": []}))
    assert v.verdict == WARN and v.action == "CHECK_FABRIC"
    assert v.summary.startswith("ranks on different NCCL networks: s0, s1: IB/RoCE; s2: Socket")


def test_fleet_same_network_passes_listing_gid_indexes_and_too_few_skip():
    v = fleet_verdict(ranks(ROCE3, ROCE3, None))
    assert v.verdict == PASS and v.summary.startswith("2 rank(s) on NCCL network IB/RoCE, GID index 3")
    assert "1 host(s) without NCCL NET lines read: s2" in v.summary
    v = fleet_verdict(ranks(ROCE3, {**ROCE3, "gid_indexes": [5]}))  # each rank its own fabric GID: not a fault
    assert v.verdict == PASS and "GID index per rank" in v.summary
    assert fleet_verdict(ranks(ROCE3, None)).verdict == SKIP


def test_summary_carries_what_nccl_chose_and_reads_it_back_from_an_older_report(tmp_path):
    log = tmp_path / "engine.out"
    log.write_text("\n".join([IB_F1, NET_IB, CONNECT.format(g=3)]) + "\n")
    rep, _ = diagnose(Inputs(snapshot=str(fabric_case("02-")), engine_log=str(log), fabric_ip="192.168.100.11"))
    assert rep["summary"]["engine"] == ROCE3 and summary_check()(rep["summary"], "summary") is None
    assert summary.of({k: v for k, v in rep.items() if k != "summary"})["engine"] == ROCE3
