"""A GPU that fell off the bus is one NVML does not list: the kernel log's fatal Xid is the root
(gpu.errors, REBOOT), and gpu.present's "install the driver" is not offered."""

from __future__ import annotations

import json

import pytest

from afddiag.cli import run

XID79 = "[ 1234.567890] NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
XID154 = ("[ 1234.600000] NVRM: Xid (PCI:0000:01:00): 154, pid=1234, name=python3, GPU recovery action changed "
          "from 0x0 (None) to 0x2 (Node Reboot Required)\n")
XID13 = "[ 99.0] NVRM: Xid (PCI:0000:01:00): 13, pid=77, name=python3, Graphics SM Warp Exception\n"
NO_GPU = {"devices": [], "why": "no NVIDIA GPU seen: NVML lists none"}


def _report(tmp_path, log: str, *extra):
    snap = tmp_path / "s"
    snap.mkdir()
    (snap / "gpu.json").write_text(json.dumps(NO_GPU))
    (snap / "kernel-xid.log").write_text(log)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = run(["gpu", "--json", "--no-history", "--snapshot", str(snap), *extra])
    return code, json.loads(buf.getvalue())


@pytest.mark.parametrize("role", [None, "expert"])
def test_fallen_off_the_bus_is_the_root_not_a_missing_driver(tmp_path, role):
    code, rep = _report(tmp_path, XID79 + XID154, *(["--role", role] if role else []))
    g = {x["id"]: x for x in rep["gates"]}
    assert code == 2
    assert g["gpu.errors"]["verdict"] == "FAIL" and g["gpu.errors"]["action"] == "REBOOT"
    assert "Xid 79" in g["gpu.errors"]["summary"] and "fallen off the bus" in g["gpu.errors"]["summary"]
    assert g["gpu.present"]["verdict"] == "SKIP" and g["gpu.present"]["action"] != "INSTALL"
    assert g["gpu.present"]["summary"].startswith("not judged: gpu.errors failed")
    roots = [d["gate"] for d in rep["diagnosis"]]
    assert roots == ["gpu.errors"] and "gpu.present" in rep["diagnosis"][0]["explains"]
    assert "install" not in json.dumps(rep["diagnosis"]).lower()


def test_an_application_xid_does_not_explain_a_missing_gpu(tmp_path):
    """Xid 13 (application) says nothing about why no GPU is listed: the role's INSTALL stands, and the
    Xid itself is not judged without a GPU."""
    code, rep = _report(tmp_path, XID13, "--role", "expert")
    g = {x["id"]: x for x in rep["gates"]}
    assert g["gpu.present"]["verdict"] == "FAIL" and g["gpu.present"]["action"] == "INSTALL"
    assert g["gpu.errors"]["verdict"] == "SKIP"
