"""The remedy of fabric.rocev2-ipv4 (and first-device) follows the cause: a fabric IP that is not this
host's RoCE address is a launcher setting (SET_ENV, no drain), an address offered only as RoCE v1 is
the HCA's RoCE mode (no address fix), RoCE v2 GIDs only on ports that are not ACTIVE are a link fault
(FIX_LINK). Snapshots are shared cases changed in the test (tests/snapfix.py)."""

from __future__ import annotations

import json

from afddiag import cli
from conftest import CASES
from snapfix import derive, fabric_case


def _gates(capsys, snap, *args: str) -> dict:
    cli.run(["fabric", "--json", "--snapshot", str(snap), *args])
    return {g["id"]: g for g in json.loads(capsys.readouterr().out)["gates"]}


def test_fabric_ip_not_on_any_rdma_netdev_sets_the_launcher_not_the_address(tmp_path, capsys):
    snap = derive(fabric_case("02-"), tmp_path / "b")  # spark-b: RoCE v2 192.168.100.11 / .101.11
    for ip in ("10.9.9.9",):  # on no netdev of this host (the management address of another one)
        g = _gates(capsys, snap, "--fabric-ip", ip)
        r, f = g["fabric.rocev2-ipv4"], g["fabric.first-device"]
        assert r["verdict"] == "FAIL" and r["action"] == "SET_ENV", r
        assert "192.168.100.11" in r["summary"] and "GID 3" in r["summary"]
        assert r["remedy"].startswith("set the launcher's fabric IP (AFD_FABRIC_IP / --fabric-ip)")
        assert "192.168.100.11" in r["remedy"] and "netplan" not in r["remedy"]
        assert f["verdict"] == "FAIL" and f["action"] == "SET_ENV" and f["remedy"] == r["remedy"], f
    g = _gates(capsys, snap, "--fabric-ip", "192.168.100.11")
    assert g["fabric.rocev2-ipv4"]["verdict"] == "PASS"


def test_address_only_as_roce_v1_is_the_hca_mode_not_an_address_fix(tmp_path, capsys):
    snap = derive(CASES / "fabric" / "09-rocev1-only-entry", tmp_path / "v1")
    for args in (["--fabric-ip", "198.51.100.21"], []):
        r = _gates(capsys, snap, *args)["fabric.rocev2-ipv4"]
        assert r["verdict"] == "FAIL" and "only as RoCE v1" in r["summary"], r
        assert r["action"] == "HW_INSPECTION" and r["action"] != "FIX_ADDRESS"
        assert r["remedy"].startswith("the HCA offers this address only as RoCE v1: enable RoCE v2")


def test_rocev2_gids_only_on_down_ports_is_a_link_fault(tmp_path, capsys):
    down = {}
    for hca, nd in (("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")):
        down |= {f"sys/class/infiniband/{hca}/ports/1/state": "1: DOWN\n",
                 f"sys/class/infiniband/{hca}/ports/1/phys_state": "3: Disabled\n",
                 f"sys/class/net/{nd}/operstate": "down\n", f"sys/class/net/{nd}/carrier": "0\n"}
    snap = derive(fabric_case("02-"), tmp_path / "down", down)
    r = _gates(capsys, snap)["fabric.rocev2-ipv4"]
    assert r["verdict"] == "FAIL" and r["action"] == "FIX_LINK", r
    assert "rocep1s0f1 port 1 (enp1s0f1np1, DOWN" in r["summary"] and "roceP2p1s0f1 port 1" in r["summary"]
    assert "RoCE v1" not in r["summary"] and "netplan" not in r["remedy"]


def test_nccl_gid_index_on_a_roce_v1_gid_is_judged(tmp_path, capsys):
    snap = derive(CASES / "fabric" / "09-rocev1-only-entry", tmp_path / "v1", {"env": "NCCL_IB_GID_INDEX=1\n"})
    d = _gates(capsys, snap, "--fabric-ip", "198.51.100.21")["fabric.devicemap-env"]
    assert d["verdict"] == "FAIL" and "NCCL_IB_GID_INDEX=1 selects mlx4_0 port 1 GID 1" in d["summary"], d
    assert "RoCE v1" in d["summary"]
    snap2 = derive(CASES / "fabric" / "09-rocev1-only-entry", tmp_path / "v1b", {"env": "NCCL_IB_GID_INDEX=7\n"})
    d = _gates(capsys, snap2, "--fabric-ip", "198.51.100.21")["fabric.devicemap-env"]
    assert d["verdict"] == "SKIP" and "not judged" in d["summary"], d  # not a v1 GID: rocev2-ipv4's concern


def test_map_with_no_fabric_ip_decided_does_not_claim_the_fabric_ips_device(tmp_path, capsys):
    down = {f"sys/class/infiniband/{h}/ports/1/state": "1: DOWN\n" for h in ("rocep1s0f1", "roceP2p1s0f1")}
    snap = derive(fabric_case("02-"), tmp_path / "down", down)
    d = _gates(capsys, snap)["fabric.devicemap-env"]
    assert "fabric IP's device" not in d["summary"], d


def test_engine_gid_index_from_the_launch_env_file_is_judged(tmp_path, capsys):
    """A launch env file's MC_GID_INDEX / UCX_IB_GID_INDEX reaches fabric.devicemap-env (the env is
    filtered to the variables afddiag judges) and a capture carries them."""
    from afddiag.probes.env import env_allowed

    for var in ("MC_GID_INDEX", "UCX_IB_GID_INDEX"):
        env = tmp_path / f"{var}.env"
        env.write_text(f"{var}=1\nAFD_FABRIC_IP=192.168.100.11\n")
        d = _gates(capsys, fabric_case("02-"), "--launch-env", str(env))["fabric.devicemap-env"]
        assert d["verdict"] == "FAIL" and d["summary"].startswith(f"{var}=1 on rocep1s0f1 port 1 is fe80"), d
        assert f"export {var}=3" in d["commands"] and var in d["remedy"], d
        assert env_allowed(var)


def test_a_capture_of_a_port_in_infiniband_mode_names_the_link_layer(tmp_path, capsys):
    """Case 12's ConnectX port switched to the InfiniBand link layer, as a capture shows it: the IB port GID only
    (no ndevs), the IPoIB netdev (type 32, a 20-byte address ending in the port GID) holding the fabric IP.
    Read back through the probe: the port is named InfiniBand, the remedy is its type (a drain), not the address."""
    port = "sys/class/infiniband/mlx5_0/ports/1"
    guid = "0200:00ff:fe0c:0101"
    hw = "00:00:10:49:fe:80:00:00:00:00:00:00:02:00:00:ff:fe:0c:01:01"
    ip_addr = [{"ifindex": 3, "ifname": "ibp3s0", "mtu": 2044, "operstate": "UP", "link_type": "infiniband",
                "address": hw, "addr_info": [{"family": "inet", "local": "198.51.100.72", "prefixlen": 24}]}]
    edits: dict[str, str | None] = {f"{port}/link_layer": "InfiniBand\n", f"{port}/gid_attrs": None,
                                    f"{port}/gids/0": f"fe80:0000:0000:0000:{guid}\n",
                                    "sys/class/net/ens3np0": None, "sys/class/net/ibp3s0/type": "32\n",
                                    "sys/class/net/ibp3s0/address": hw + "\n", "sys/class/net/ibp3s0/mtu": "2044\n",
                                    "sys/class/net/ibp3s0/operstate": "up\n", "ip-addr.json": json.dumps(ip_addr),
                                    "env": None}
    edits |= {f"{port}/gids/{i}": "0000:0000:0000:0000:0000:0000:0000:0000\n" for i in range(1, 4)}
    snap = derive(CASES / "fabric" / "12-cx7-single-port-healthy", tmp_path / "ib", edits)
    capsys.readouterr()
    assert cli.run(["fabric", "--json", "--snapshot", str(snap), "--fabric-ip", "198.51.100.72"]) == 2
    rep = json.loads(capsys.readouterr().out)
    r = {g["id"]: g for g in rep["gates"]}["fabric.rocev2-ipv4"]
    assert (r["verdict"], r["action"]) == ("FAIL", "SET_PORT_TYPE"), r
    assert "mlx5_0 port 1 runs the InfiniBand link layer" in r["summary"]
    assert r["commands"] == ["sudo mlxconfig -d mlx5_0 set LINK_TYPE_P1=2"] and "netplan" not in r["remedy"]
    assert rep["facts"]["fabric"]["netdevs"]["ibp3s0"]["link_type"] == "infiniband"
    root = next(d for d in rep["diagnosis"] if d["gate"] == "fabric.rocev2-ipv4")
    assert root["drain"] is True
