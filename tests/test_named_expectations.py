"""An expectation the operator named (a fabric IP, a peer, an SM count, a role that requires the
device) that nothing on the host could check does not read as a pass (exit 0)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from afddiag.cli import run

NO_GPU = {"devices": [], "why": "no NVIDIA GPU seen: NVML lists none"}


def report(tmp_path, cmd, *args) -> tuple[int, dict, list]:
    snap = tmp_path / "s"
    snap.mkdir(exist_ok=True)
    (snap / "gpu.json").write_text(json.dumps(NO_GPU))
    (snap / "sys" / "class" / "infiniband").mkdir(parents=True, exist_ok=True)  # looked at: no RDMA device
    (snap / "sys" / "class" / "net").mkdir(parents=True, exist_ok=True)
    (snap / "ip-addr.json").write_text("[]")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run([cmd, "--json", "--no-history", "--snapshot", str(snap), *args])
    rep = json.loads(buf.getvalue())
    return code, {g["id"]: g for g in rep["gates"]}, rep["diagnosis"]


def test_fabric_ip_and_peer_on_a_host_without_rdma_is_not_a_pass(tmp_path):
    code, g, _ = report(tmp_path, "fabric", "--fabric-ip", "192.168.100.10", "--peer", "192.168.100.11")
    assert code != 0
    assert g["fabric.link"]["verdict"] == "WARN" and "no RDMA device" in g["fabric.link"]["summary"]
    assert "192.168.100.10" in g["fabric.link"]["summary"] and "192.168.100.11" in g["fabric.link"]["summary"]


def test_role_requiring_rdma_fails_fabric_link_naming_the_missing_device_once(tmp_path):
    code, g, diag = report(tmp_path, "fabric", "--fabric-ip", "192.168.100.10", "--role", "expert")
    assert code == 2
    assert g["fabric.link"]["verdict"] == "FAIL" and "no RDMA device" in g["fabric.link"]["summary"]
    assert [d["gate"] for d in diag] == ["fabric.rdma-present"] and "fabric.link" in diag[0]["explains"]


def test_nothing_named_stays_skip(tmp_path):
    code, g, _ = report(tmp_path, "fabric")
    assert g["fabric.link"]["verdict"] == "SKIP" and code == 0


@pytest.mark.parametrize("args,code", [(["--expect-sm", "170"], 1), ([], 0)])
def test_expected_sm_count_with_no_gpu_is_not_a_pass(tmp_path, args, code):
    got, g, _ = report(tmp_path, "gpu", *args)
    assert got == code
    assert g["gpu.sm-count"]["verdict"] == ("WARN" if args else "SKIP")
    if args:
        assert "170 SMs" in g["gpu.sm-count"]["summary"] and "no GPU" in g["gpu.sm-count"]["summary"]


@pytest.mark.parametrize("args,code", [(["--load"], 1), ([], 0), (["--load", "--role", "expert"], 2)])
def test_a_load_run_with_no_gpu_is_not_a_pass(tmp_path, args, code):
    """`gpu --load` on a host with no GPU checked nothing: WARN RERUN (exit 1), as --expect-sm does; a role
    that requires the GPU FAILs gpu.present instead, named once as the root (issue 23)."""
    got, g, diag = report(tmp_path, "gpu", *args)
    assert got == code
    slow = g["gpu.slow-state"]
    if args == ["--load"]:
        assert slow["verdict"] == "WARN" and slow["action"] == "RERUN"
        assert "--load" in slow["summary"] and "no GPU" in slow["summary"]
        assert [d["gate"] for d in diag] == ["gpu.slow-state"]
    elif not args:
        assert slow["verdict"] == "SKIP"
    else:
        assert slow["verdict"] == "SKIP" and [d["gate"] for d in diag] == ["gpu.present"]
