"""Hostile sysfs readings in snapshots: a netdev's ``speed``/``mtu`` and a PCIe link's figures holding
what no kernel prints. One bad file is SKIP for the gate it feeds (never PASS on garbage), never a
crash of the whole fabric probe (which turned every fabric gate into ERROR)."""

from __future__ import annotations

import glob
import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from afddiag.cli import run
from afddiag.gates import host
from afddiag.model.host import pcie_facts
from afddiag.textnum import digits, kernel_int
from conftest import CASES

HEALTHY = CASES / "fabric" / "12-cx7-single-port-healthy"


def _gates(capsys, snap, *extra):
    code = run(["fabric", "--snapshot", str(snap), "--json", "--no-history", "--role", "expert", *extra])
    out = json.loads(capsys.readouterr().out)
    return code, {g["id"]: g for g in out["gates"]}


def _with_file(tmp_path, name, data):
    """A copy of the healthy capture whose every netdev's ``name`` file holds ``data``."""
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    dirs = glob.glob(str(snap / "sys/class/net/*"))
    assert dirs
    for d in dirs:
        with open(f"{d}/{name}", "wb") as f:
            f.write(data)
    return snap


def test_a_speed_the_kernel_prints_is_judged(tmp_path, capsys):
    _, got = _gates(capsys, _with_file(tmp_path, "speed", b"150000\n"))
    assert got["fabric.link-speed"]["verdict"] == "WARN" and got["fabric.link-speed"]["facts"]["speed_mbps"] == 150000


@pytest.mark.parametrize("data", [b"--5\n", "\u00b2".encode(), b"-99999999999\n", b"99999999999999999999999\n",
                                  b"Unknown!\n", b"", b"1e5\n", b"100000 extra\n", b"\xff\xfe"],
                         ids=["double-minus", "superscript", "huge-negative", "huge", "unknown", "empty", "float",
                              "trailing", "binary"])
def test_a_garbage_speed_file_is_skip_for_link_speed_and_the_other_fabric_gates_still_judge(tmp_path, capsys, data):
    base_code, base = _gates(capsys, HEALTHY)
    _, got = _gates(capsys, _with_file(tmp_path, "speed", data))
    assert got["fabric.link-speed"]["verdict"] == "SKIP", got["fabric.link-speed"]["summary"]
    assert got["fabric.link-speed"]["facts"]["speed_mbps"] is None
    # the rest of the fabric probe was read: its gates say what they said on the good capture
    for gid in ("fabric.link", "fabric.mtu", "fabric.rocev2-ipv4", "fabric.first-device"):
        assert got[gid]["verdict"] == base[gid]["verdict"], (gid, got[gid]["summary"])


@pytest.mark.parametrize("data", [b"--1500\n", "9\u00b2".encode(), b"99999999999999999999\n"])
def test_a_garbage_mtu_file_does_not_crash_the_fabric_probe(tmp_path, capsys, data):
    _, got = _gates(capsys, _with_file(tmp_path, "mtu", data))
    assert not any("crashed" in g["summary"] for g in got.values()), [g["summary"] for g in got.values()]


def test_a_superscript_port_folder_is_not_a_port_and_not_a_crash(tmp_path, capsys):
    snap = tmp_path / "snap"
    shutil.copytree(HEALTHY, snap, symlinks=True)
    ports = glob.glob(str(snap / "sys/class/infiniband/*/ports"))
    assert ports
    (snap / ports[0] / "\u00b2").mkdir()
    _, got = _gates(capsys, snap)
    assert not any("crashed" in g["summary"] for g in got.values())
    assert got["fabric.link"]["verdict"] == "PASS"


@given(st.text(max_size=12))
def test_digits_is_exactly_when_int_parses_ascii(text):
    if digits(text):
        assert int(text) >= 0 and text.isascii()
    v = kernel_int(text, -1, 1 << 31)
    assert v is None or (-1 <= v <= 1 << 31 and v == int(text.strip()) and text.strip().isascii())


@pytest.mark.parametrize("speed,width", [("nan GT/s", "16"), ("inf GT/s PCIe", "16"), ("1e300 GT/s", "16"),
                                         ("Unknown", "16"), ("0 GT/s", "16"), ("16.0 GT/s PCIe", "99999"),
                                         ("16.0 GT/s PCIe", "0"), ("16.0 GT/s PCIe", "\u00b9\u2076"), ("", "")])
def test_pcie_figures_no_kernel_prints_are_skip_never_pass_or_warn(speed, width):
    for cur_or_max in ("current", "max"):
        dev = {"kind": "nic", "names": ["mlx5_0"], "current_link_speed": "16.0 GT/s PCIe", "current_link_width": "16",
               "max_link_speed": "16.0 GT/s PCIe", "max_link_width": "16"}
        dev[f"{cur_or_max}_link_speed"], dev[f"{cur_or_max}_link_width"] = speed, width
        link = pcie_facts({"devices": {"0000:01:00.0": dev}}).links[0]
        verdict, finding = host.judge_pcie_link(link)
        assert verdict == "SKIP", (cur_or_max, speed, width, verdict, finding)


def test_pcie_figures_the_kernel_prints_still_parse():
    link = pcie_facts({"devices": {"0000:01:00.0": {
        "kind": "nic", "current_link_speed": "2.5 GT/s PCIe", "current_link_width": "x8",
        "max_link_speed": "32.0 GT/s PCIe", "max_link_width": "16"}}}).links[0]
    assert (link.current_speed_gts, link.current_width, link.max_speed_gts, link.max_width) == (2.5, 8, 32.0, 16)
    assert host.judge_pcie_link(link)[0] == "FAIL"
