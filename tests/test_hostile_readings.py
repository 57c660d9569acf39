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


@pytest.mark.parametrize("n", [1, 40, 41, 4300, 4301, 5000])
def test_digits_and_kernel_int_never_hand_int_more_than_it_parses(n):
    """int() refuses more than 4300 digits (ValueError): digits() is False past MAX_DIGITS, so a
    caller's `digits(x) and int(x)` never raises; kernel_int is None there."""
    text = "1" * n
    assert digits(text) == (n <= 40)
    if digits(text):
        assert int(text) > 0
    assert kernel_int(text, 0, 10 ** 50) == (int(text) if n <= 40 else None)
    assert kernel_int("-" + text, -(10 ** 50), 0) == (-int(text) if n <= 40 else None)


def test_huge_digit_strings_get_the_callers_one_line_treatment():
    """Every kind of call site: a value of 5000 digits is 'not a number' where it is read, never a crash."""
    from afddiag.envvars import LaunchEnvError, parse_launch_env, parse_nccl_hca
    from afddiag.gates.gpu import xid_judgment
    from afddiag.summary import as_int

    big = "1" * 5000
    assert as_int(big) is None
    verdict, words, _ = xid_judgment({"xid": big, "text": "NVRM: Xid (PCI:0000:01:00): " + big})
    assert verdict in ("WARN", "FAIL") and words
    with pytest.raises(LaunchEnvError) as e:
        parse_launch_env(f"AFD_ENGINE_PORTS={big}\n", "l.env")
    assert "AFD_ENGINE_PORTS" in str(e.value) and len(str(e.value)) < 200
    with pytest.raises(ValueError) as e:
        parse_nccl_hca(f"mlx5_0:{big}")
    assert "port is not a number" in str(e.value) and len(str(e.value)) < 200


def test_a_5000_digit_gid_index_is_fail_not_a_gate_crash(tmp_path, capsys):
    """NCCL_IB_GID_INDEX=111… (5000 digits) in the launch env: fabric.devicemap-env FAILs it as not a
    GID index in one short line (before: ERROR 'gate failed ... Exceeds the limit (4300 digits)', exit 3)."""
    env = tmp_path / "l.env"
    env.write_text("NCCL_IB_GID_INDEX=" + "1" * 5000 + "\n")
    code, got = _gates(capsys, HEALTHY, "--launch-env", str(env))
    g = got["fabric.devicemap-env"]
    assert g["verdict"] == "FAIL", g["summary"][:300]
    assert g["summary"].startswith("NCCL_IB_GID_INDEX='11111111111111111111…' is not a GID index"), g["summary"][:300]
    assert len(g["summary"]) < 300 and g["facts"]["failed_vars"] == ["NCCL_IB_GID_INDEX"]
    assert code == 2
