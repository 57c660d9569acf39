"""Reviewer's GPU findings as general rules: a role/model mismatch is not a driver fault, one busy
process is one root, Xid remedies say only what the evidence says. (That the catalog lists what gates
emit is tests/test_emitted_actions.py's, for every family; it drives these GPU variants.)"""

import json
import shutil

import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from afddiag.diagnosis import needs_drain
from afddiag.gates.gpu import xid_judgment
from conftest import CASES, case_dirs

H200 = CASES / "gpu" / "06-h200-healthy-measured"
GB10 = CASES / "gpu" / "01-gb10-healthy-unified-memory"


def run(args):
    res = CliRunner().invoke(cli, ["gpu", "--json", *args], standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    return rep, {g["id"]: g for g in rep["gates"]}


def edited(tmp_path, case, edit):
    """A copy of a shared case with gpu.json changed by ``edit(readings)``."""
    dst = tmp_path / case.name
    shutil.copytree(case, dst)
    readings = json.loads((dst / "gpu.json").read_text())
    edit(readings)
    (dst / "gpu.json").write_text(json.dumps(readings))
    return dst


def test_model_other_than_roles_is_a_role_mismatch_not_a_driver_fault():
    rep, g = run(["--snapshot", str(H200), "--role", "expert"])  # the expert playbook names a GB10
    v = g["gpu.present"]
    assert v["verdict"] == "FAIL" and "expects a" in v["summary"]
    assert v["action"] == "SET_ENV" and not needs_drain(v["action"])
    assert "--role / AFD_ROLE" in v["remedy"] and "[gpu] model" in v["remedy"]
    assert not any(d["drain"] for d in rep["diagnosis"])


def _busy(readings):
    dev = readings["devices"][0]
    nv = dev.setdefault("nvml", {})
    nv["processes"] = [{"pid": 4242, "name": "python3", "used_bytes": 40 * 2**30, "type": "compute"}]
    if isinstance(nv.get("memory_info"), dict):  # discrete: NVML free shrinks by what the process holds
        nv["memory_info"]["free_bytes"] = nv["memory_info"]["total_bytes"] - 40 * 2**30
    else:  # unified: MemAvailable shrinks
        readings["host_meminfo_kb"]["MemAvailable"] = 20 * 2**20
        readings["host_meminfo_kb"]["MemFree"] = 10 * 2**20


@pytest.mark.parametrize("case,role,symptom", [(H200, "coordinator", "gpu.memory"), (GB10, "expert", "gpu.headroom")])
def test_busy_gpu_is_one_root_explaining_the_memory_shortfall(tmp_path, case, role, symptom):
    rep, g = run(["--snapshot", str(edited(tmp_path, case, _busy)), "--role", role])
    assert g["gpu.processes"]["verdict"] == "FAIL"  # catalog: FAIL in a role that reserves memory
    assert g[symptom]["verdict"] == "FAIL"
    roots = {d["gate"]: d for d in rep["diagnosis"]}
    assert symptom not in roots
    assert roots["gpu.processes"]["action"] == "STOP_PROCESSES" and symptom in roots["gpu.processes"]["explains"]


def test_xid79_alone_is_not_attributed_to_the_driver(tmp_path):
    line = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."

    def xid(readings):
        readings["xid_events"] = [{"xid": 79, "pci": "0000:1b:00", "text": line}]
        readings["xid_source"] = "/dev/kmsg"
    _, g = run(["--snapshot", str(edited(tmp_path, H200, xid))])
    v = g["gpu.errors"]
    assert v["verdict"] == "FAIL" and v["action"] == "REBOOT"
    assert "driver says" not in v["remedy"] and "fallen off the bus" in v["remedy"]

    def with_154(readings):
        xid(readings)
        readings["xid_events"].append({"xid": 154, "pci": "0000:1b:00", "text": "NVRM: Xid (PCI:0000:1b:00): 154, "
                                       "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"})
    _, g = run(["--snapshot", str(edited(tmp_path / "b", H200, with_154))])
    assert g["gpu.errors"]["action"] == "REBOOT" and "driver says" in g["gpu.errors"]["remedy"]


def test_unknown_xid_warns_quotes_and_points_at_nvidias_catalog(tmp_path):
    line = "NVRM: Xid (PCI:0000:1b:00): 999, something new"
    assert xid_judgment({"xid": 999, "pci": "0000:1b:00", "text": line})[0] == "WARN"

    def xid(readings):
        readings["xid_events"] = [{"xid": 999, "pci": "0000:1b:00", "text": line}]
    _, g = run(["--snapshot", str(edited(tmp_path, H200, xid))])
    v = g["gpu.errors"]
    assert v["verdict"] == "WARN" and v["action"] == "NONE" and line in v["summary"]
    assert "not in afddiag's Xid table" in v["remedy"] and "NVIDIA's Xid catalog" in v["remedy"]
    assert "application-caused" not in v["remedy"]


def _variants(tmp_path):
    """Every shared GPU case under every role, plus the edits above: the actions gates really emit."""
    out = []
    for i, case in enumerate(case_dirs("gpu")):
        out.append(case)
        out.append(edited(tmp_path / f"busy{i}", case, _busy))
        out.append(edited(tmp_path / f"xid{i}", case, lambda r: r.update(xid_events=[
            {"xid": 79, "pci": "x", "text": "79"}, {"xid": 13, "pci": "x", "text": "13"}])))
    return out


def _as_mig(readings):
    """The H200 with MIG mode on: NVML reads the whole GPU (CUDA does not list it), CUDA lists one
    3g.71gb instance of 60 SMs (its name and MIG- UUID as cuDeviceGetName/cuDeviceGetUuid give them)."""
    whole = readings["devices"][0]
    whole["cuda"] = None
    readings["devices"].append({"index": 0, "name": "NVIDIA H200 MIG 3g.71gb",
                                "uuid": "MIG-5f1e0000-aaaa-bbbb-cccc-000000000001", "pci_bus_id": None,
                                "cuda": {"sm_count": 60, "compute_capability": [9, 0], "integrated": False},
                                "cuda_ordinal": 0, "nvml": None, "under_load": None})


def test_a_mig_instance_is_the_partitions_fault_not_the_images(tmp_path):
    rep, g = run(["--snapshot", str(edited(tmp_path, H200, _as_mig)), "--expect-sm", "132"])
    v = g["gpu.sm-count"]
    assert v["verdict"] == "FAIL" and "MIG instance (3g.71gb, 60 SMs)" in v["summary"], v
    assert v["action"] == "RESET_GPU" and "rebuild" not in v["remedy"].split("Do not")[0]
    assert v["commands"] == ["sudo nvidia-smi -i 0 -mig 0", "sudo nvidia-smi -i 0 -r"], v["commands"]
    assert v["facts"]["mig_instance"] == {"device": 0, "profile": "3g.71gb", "sm_count": 60}
    # the slice has no NVML reading of its own: that is MIG, not a memory fault (NVML's whole GPU is judged)
    assert g["gpu.memory"]["verdict"] == "PASS", g["gpu.memory"]
    roots = [d["gate"] for d in rep["diagnosis"]]
    assert roots == ["gpu.sm-count"], rep["diagnosis"]


def test_a_whole_gpu_with_another_sm_count_still_asks_for_the_images_rebuild(tmp_path):
    rep, g = run(["--snapshot", str(H200), "--expect-sm", "170"])
    v = g["gpu.sm-count"]
    assert v["verdict"] == "FAIL" and v["action"] == "REBUILD_IMAGE" and "MIG" not in v["summary"]
