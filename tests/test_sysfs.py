"""The sysfs fabric reader: EINVAL on empty slots, index order vs name order, partial trees."""

import errno
import json
import shutil
from pathlib import Path

from afddiag.model.fabric import carriers, gid_for_ipv4, ipv4_from_gid, usable_rocev2
from afddiag.probes.fabric import probe_fabric
from afddiag.probes.netlink import parse_ip_addr_json, parse_rdma_dev_json
from afddiag.probes.sysfs import read_text
from conftest import CASES

CASE05 = CASES / "fabric" / "05-k8s-macvlan-slots-0-3-einval"
CASE17 = CASES / "fabric" / "17-rxe-lab-index-order-vs-name-order"


def einval_reader(root: Path):
    """Emulate a real kernel: gid_attrs of slots in EINVAL-SLOTS fail with EINVAL, not ENOENT."""
    bad = set()
    for f in root.glob("sys/class/infiniband/*/ports/*/gid_attrs/EINVAL-SLOTS"):
        port = f.parent.parent
        for i in f.read_text().split():
            bad.add(str(port / "gid_attrs" / "types" / i))
            bad.add(str(port / "gid_attrs" / "ndevs" / i))

    def read(path: str) -> str:
        if path in bad:
            read.einval += 1
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return read_text(path)

    read.einval = 0
    return read, bad


def _facts(case: Path, reader=read_text):
    order = parse_rdma_dev_json(json.loads((case / "rdma-dev.json").read_text()))
    addrs = parse_ip_addr_json(json.loads((case / "ip-addr.json").read_text()))
    return probe_fabric(str(case), order, "rdma-dev.json", addrs, "ip-addr.json", reader=reader)


def test_einval_on_empty_slots_is_empty_not_error(tmp_path):
    root = tmp_path / "c"
    shutil.copytree(CASE05, root)
    # put the attribute files back so that only the reader's EINVAL can make them fail
    for f in root.glob("sys/class/infiniband/*/ports/*/gid_attrs/EINVAL-SLOTS"):
        for i in f.read_text().split():
            for kind in ("types", "ndevs"):
                (f.parent / kind / i).write_text("")
    read, bad = einval_reader(root)
    assert bad, "the case lists EINVAL slots"
    facts = _facts(root, read)
    dev = facts.devices[0]
    assert dev.name == "mlx5_0"
    assert [g.index for g in dev.ports[0].gids] == [4, 5, 6, 7]
    assert not dev.ports[0].notes, dev.ports[0].notes  # EINVAL is not reported as a problem
    assert [(e.device, e.gid_index) for e in usable_rocev2(facts) if e.ip == "10.152.0.12"] == [("mlx5_0", 7)]
    assert read.einval == 0  # attributes of zero GIDs are never read


def test_einval_on_a_populated_slot_leaves_type_unknown(tmp_path):
    root = tmp_path / "c"
    shutil.copytree(CASE05, root)
    target = str(root / "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/6")

    def read(path: str) -> str:
        if path == target:
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return read_text(path)

    facts = _facts(root, read)
    g6 = next(g for g in facts.devices[0].ports[0].gids if g.index == 6)
    assert g6.type is None and g6.ipv4 == "10.152.0.12"
    assert not facts.devices[0].ports[0].notes


def test_other_read_errors_are_noted_not_raised(tmp_path):
    root = tmp_path / "c"
    shutil.copytree(CASE05, root)

    def read(path: str) -> str:
        if path.endswith("/ports/1/state"):
            raise OSError(errno.EIO, "Input/output error", path)
        return read_text(path)

    facts = _facts(root, read)
    port = facts.devices[0].ports[0]
    assert port.state is None
    assert any("Input/output error" in n for n in port.notes)


def test_enumeration_follows_device_index_not_name():
    facts = _facts(CASE17)
    assert [d.name for d in facts.devices] == ["zrxe0", "arxe1"]
    assert [d.index for d in facts.devices] == [0, 1]
    assert sorted(d.name for d in facts.devices)[0] == "arxe1"  # name order would pick the other one
    assert [e.device for e in carriers(facts, "10.9.0.2")] == ["arxe1"]


def test_without_index_order_devices_fall_back_to_name_with_a_note():
    facts = probe_fabric(str(CASE17))
    assert [d.name for d in facts.devices] == ["arxe1", "zrxe0"]
    assert facts.order_source.startswith("name")
    assert any("may not be libibverbs' order" in n for n in facts.notes)


def test_missing_sysfs_tree_is_a_note(tmp_path):
    facts = probe_fabric(str(tmp_path))
    assert facts.devices == []
    assert any("no RDMA driver loaded" in n for n in facts.notes)


def test_gid_ipv4_round_trip():
    assert ipv4_from_gid("0000:0000:0000:0000:0000:ffff:c0a8:640a") == "192.168.100.10"
    assert gid_for_ipv4("192.168.100.10") == "0000:0000:0000:0000:0000:ffff:c0a8:640a"
    assert ipv4_from_gid("fe80:0000:0000:0000:0000:00ff:fe01:0101") is None
    assert ipv4_from_gid("garbage") is None
