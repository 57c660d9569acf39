"""host.pcie: the PCIe links of the RDMA NICs and GPUs, found through sysfs device links under a fake
root; the judgment per link, a snapshot replay and a capture round trip."""

import json
import os

import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from afddiag.gates import host
from afddiag.model.host import PcieLink, pcie_facts
from afddiag.probes.pcie import read_pcie

NIC, GPU = "0000:01:00.0", "0000:18:00.0"


def fake_host(tmp_path, nic=("32.0 GT/s PCIe", "16"), gpu=("2.5 GT/s PCIe", "16")):
    """mlx5_0 / enp1s0f0np0 on NIC (max x16 32 GT/s), GPU bound to nvidia (max x16 32 GT/s), rxe0 on eth0
    (virtio, no PCI link)."""
    r = tmp_path
    pci = r / "sys/devices/pci0000:00"
    for bdf, (speed, width) in ((NIC, nic), (GPU, gpu)):
        d = pci / bdf
        d.mkdir(parents=True)
        for name, val in (("current_link_speed", speed), ("current_link_width", width),
                          ("max_link_speed", "32.0 GT/s PCIe"), ("max_link_width", "16"),
                          ("vendor", "0x15b3" if bdf == NIC else "0x10de"),
                          ("device", "0x1021" if bdf == NIC else "0x2335")):
            (d / name).write_text(val + "\n")
        (r / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
        os.symlink(d, r / "sys/bus/pci/devices" / bdf)
    (r / "sys/devices/virtual/virtio2").mkdir(parents=True)
    for cls, name, target in (("infiniband", "mlx5_0", pci / NIC), ("net", "enp1s0f0np0", pci / NIC),
                              ("infiniband", "rxe0", None), ("net", "eth0", r / "sys/devices/virtual/virtio2")):
        d = r / "sys/class" / cls / name
        d.mkdir(parents=True)
        if target is not None:
            os.symlink(target, d / "device")
    (r / "sys/bus/pci/drivers/nvidia").mkdir(parents=True)
    os.symlink(pci / GPU, r / "sys/bus/pci/drivers/nvidia" / GPU)
    (r / "sys/bus/pci/drivers/nvidia/module").mkdir()  # not a function: ignored
    return str(r)


def test_probe_finds_nic_and_gpu_through_device_links(tmp_path):
    r = read_pcie(fake_host(tmp_path))
    assert r["devices"][NIC]["names"] == ["mlx5_0", "enp1s0f0np0"] and r["devices"][NIC]["kind"] == "nic"
    assert r["devices"][GPU]["kind"] == "gpu" and r["devices"][GPU]["current_link_speed"] == "2.5 GT/s PCIe"
    assert set(r["devices"]) == {NIC, GPU}
    assert any("rxe0: not a PCI function" in n for n in r["notes"])
    json.dumps(r)


@pytest.mark.parametrize("kind,cur,maxi,verdict", [
    ("nic", (32.0, 16), (32.0, 16), "PASS"),
    ("nic", (16.0, 16), (32.0, 16), "WARN"),   # trained a generation below
    ("nic", (32.0, 8), (32.0, 16), "FAIL"),    # lost half its lanes
    ("gpu", (2.5, 16), (32.0, 16), "PASS"),    # idle GPU: speed not judged
    ("gpu", (32.0, 8), (32.0, 16), "FAIL"),
    ("nic", (None, 16), (32.0, 16), "SKIP"),
])
def test_judge_pcie_link(kind, cur, maxi, verdict):
    link = PcieLink(NIC, kind, ["mlx5_0"], cur[0], cur[1], maxi[0], maxi[1])
    got, finding = host.judge_pcie_link(link)
    assert got == verdict, finding
    if verdict in ("WARN", "FAIL"):
        assert finding.startswith(f"{'NIC' if kind == 'nic' else 'GPU'} {NIC}")
        assert f"x{cur[1]} at {cur[0]:g} GT/s" in finding and "capable of x16 at 32 GT/s" in finding


@pytest.mark.parametrize("raw,speed,width", [("16.0 GT/s PCIe", 16.0, 16), ("8 GT/s", 8.0, 16),
                                             ("Unknown", None, 16), (5, None, 16)])
def test_facts_parse_kernel_text(raw, speed, width):
    f = pcie_facts({"devices": {NIC: {"kind": "nic", "names": ["mlx5_0"], "current_link_speed": raw,
                                      "current_link_width": "16", "max_link_speed": "32.0 GT/s PCIe",
                                      "max_link_width": "x16"}}})
    (link,) = f.links
    assert link.current_speed_gts == speed and link.current_width == width and link.max_width == 16


def _gate(args):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return next(g for g in json.loads(res.stdout)["gates"] if g["id"] == "host.pcie")


@pytest.mark.parametrize("nic,verdict,words", [
    (("32.0 GT/s PCIe", "16"), "PASS", "2 link(s) at their maximum width"),
    (("32.0 GT/s PCIe", "4"), "FAIL", "NIC 0000:01:00.0 (mlx5_0, enp1s0f0np0): PCIe link trained x4 at 32 GT/s"),
])
def test_capture_and_replay(tmp_path, nic, verdict, words):
    """The probe's readings go into a capture as they are and replay with the same verdict."""
    from afddiag.capture import collect_bundle, write_bundle
    from afddiag.probes.registry import LIVE, Sources

    root = fake_host(tmp_path / "host", nic=nic)
    # the PCIe links read live under the fake root; every field not given is not read
    src = dict(root=root, device_order=lambda: (None, "test", []), addresses=lambda: {}, pcie=LIVE,
               rdma_core=lambda: {}, environ={}, hostname=lambda: "spark-a")
    files, _, _ = collect_bundle(Sources(**src))
    assert json.loads(files["pcie.json"]) == read_pcie(root)
    bundle = tmp_path / "b.tar.gz"
    write_bundle(bundle, Sources(**src))
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "pcie.json").write_text(files["pcie.json"].decode())
    direct = _gate(["all", "--json", "--snapshot", str(snap)])
    replay = _gate(["all", "--json", "--snapshot", str(bundle)])
    assert direct["verdict"] == replay["verdict"] == verdict
    assert words in direct["summary"] and direct["summary"] == replay["summary"]
    if verdict == "PASS":
        assert "not judged" in direct["summary"]  # the idle GPU's 2.5 GT/s
    else:
        assert "lspci -vv" in direct["remedy"] and direct["action"] == "HW_INSPECTION"


def test_case_without_pcie_skips():
    from conftest import CASES

    v = _gate(["all", "--json", "--snapshot", str(CASES / "gpu" / "01-gb10-healthy-unified-memory")])
    assert v["verdict"] == "SKIP" and "not captured" in v["summary"]


def _slot_host(tmp_path, port_max=("16.0 GT/s PCIe", "2"), nic=("16.0 GT/s PCIe", "2")):
    """A Gen5 x4 NIC function (LnkCap 32 GT/s x4) behind root port 0000:00:01.0, as real sysfs nests it
    (/sys/devices/pci0000:00/<port>/<nic>), the port's own LnkCap ``port_max``; the NIC trained ``nic``."""
    r = tmp_path
    port = r / "sys/devices/pci0000:00/0000:00:01.0"
    d = port / NIC
    d.mkdir(parents=True)
    for name, val in (("max_link_speed", port_max[0]), ("max_link_width", port_max[1])):
        (port / name).write_text(val + "\n")
    for name, val in (("current_link_speed", nic[0]), ("current_link_width", nic[1]),
                      ("max_link_speed", "32.0 GT/s PCIe"), ("max_link_width", "4"), ("vendor", "0x15b3"),
                      ("device", "0x1021")):
        (d / name).write_text(val + "\n")
    (r / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink(os.path.relpath(d, r / "sys/bus/pci/devices"), r / "sys/bus/pci/devices" / NIC)
    ib = r / "sys/class/infiniband/rocep1s0f0"
    ib.mkdir(parents=True)
    os.symlink(d, ib / "device")
    return str(r)


def test_probe_reads_the_upstream_ports_maximum(tmp_path):
    r = read_pcie(_slot_host(tmp_path))
    assert r["devices"][NIC]["upstream"] == {"bdf": "0000:00:01.0", "max_link_speed": "16.0 GT/s PCIe",
                                             "max_link_width": "2"}
    (link,) = pcie_facts(r).links
    assert (link.upstream_bdf, link.upstream_max_speed_gts, link.upstream_max_width) == ("0000:00:01.0", 16.0, 2)


@pytest.mark.parametrize("port_max,nic,verdict,words", [
    # a port giving the Gen5 x4 card two lanes: trained x2 is all the slot allows: nothing to reseat, but
    # the slot's width may be the BIOS's (bifurcation, lane sharing): WARN CHECK_BIOS, no drain
    (("16.0 GT/s PCIe", "2"), ("16.0 GT/s PCIe", "2"), "WARN",
     "the most its upstream port 0000:00:01.0 x2 at 16 GT/s allows"),
    # the port allows x4: trained x2 is a fault of this link
    (("32.0 GT/s PCIe", "4"), ("32.0 GT/s PCIe", "2"), "FAIL", "upstream port 0000:00:01.0 x4 at 32 GT/s"),
    # the port allows Gen5: a NIC at Gen4 trained a generation below what both ends support
    (("32.0 GT/s PCIe", "4"), ("16.0 GT/s PCIe", "4"), "WARN", "trained x4 at 16 GT/s"),
    # a Gen4 port: the Gen5 card at 16 GT/s x4 is at the link's maximum
    (("16.0 GT/s PCIe", "4"), ("16.0 GT/s PCIe", "4"), "PASS",
     "the most its upstream port 0000:00:01.0 x4 at 16 GT/s allows"),
])
def test_the_link_is_judged_against_both_ends(tmp_path, port_max, nic, verdict, words):
    """A link trains to the lower of its two ends' LnkCap: the port's maximum, read through the
    function's real sysfs path, is the yardstick, so a card in a narrower slot is not sent to reseat."""
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "pcie.json").write_text(json.dumps(read_pcie(_slot_host(tmp_path / "host", port_max, nic))))
    v = _gate(["all", "--json", "--snapshot", str(snap)])
    assert v["verdict"] == verdict and words in v["summary"], v
    if verdict == "PASS":
        assert v["action"] == "NONE" and "reseat" not in v["remedy"]
    elif "x2 at 16" in words:  # the slot, not the card
        assert v["action"] == "CHECK_BIOS" and "nothing to reseat" in v["remedy"] and "bifurcation" in v["remedy"]
        from afddiag import catalog

        assert catalog.load()["actions"]["CHECK_BIOS"]["drain"] is False
    else:
        assert "reseat" in v["remedy"] and "not read" not in v["summary"] and v["action"] == "HW_INSPECTION"


def test_without_the_ports_reading_a_narrow_link_fails_and_says_read_the_port_first(tmp_path):
    """A capture without the upstream port (an older capture, a literal tree): the card's own maximum is
    the yardstick, and the remedy puts reading the port before any reseat."""
    r = read_pcie(_slot_host(tmp_path / "host"))
    del r["devices"][NIC]["upstream"]
    snap = tmp_path / "snap"
    snap.mkdir()
    (snap / "pcie.json").write_text(json.dumps(r))
    v = _gate(["all", "--json", "--snapshot", str(snap)])
    assert v["verdict"] == "FAIL" and "upstream port's maximum not read" in v["summary"]
    assert v["remedy"].index(NIC) < v["remedy"].index("reseat")


def test_a_x16_gpu_behind_a_x8_port_is_a_warning_to_check_the_bios_not_a_pass():
    """A root port's width follows the BIOS's bifurcation and lane sharing: a coordinator GPU at half its
    lanes because its port is x8 is not the card's fault (no reseat) but not a pass either."""
    link = PcieLink(GPU, "gpu", ["nvidia"], 32.0, 8, 32.0, 16, upstream_bdf="0000:00:01.1",
                    upstream_max_speed_gts=32.0, upstream_max_width=8)
    verdict, finding = host.judge_pcie_link(link)
    assert verdict == "WARN" and "capable of x16" in finding and "upstream port 0000:00:01.1 x8" in finding
    assert host._port_narrow(link)
    # the same GPU trained x4 behind the x8 port: the link itself fell short of both ends
    short = PcieLink(GPU, "gpu", ["nvidia"], 32.0, 4, 32.0, 16, upstream_bdf="0000:00:01.1",
                     upstream_max_speed_gts=32.0, upstream_max_width=8)
    assert host.judge_pcie_link(short)[0] == "FAIL" and not host._port_narrow(short)
