"""Every real-world case in ../shared/cases replayed through `--snapshot`."""

import json

import jsonschema
import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from conftest import case_dirs, load_case

FABRIC = case_dirs("fabric")
GPU = case_dirs("gpu")


def run_json(args):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout), res.return_value


@pytest.mark.parametrize("case", FABRIC, ids=[p.name for p in FABRIC])
def test_fabric_case(case, report_schema):
    meta = load_case(case)
    args = ["all", "--json", "--snapshot", str(case)]
    if meta.get("fabric_ip"):
        args += ["--fabric-ip", meta["fabric_ip"]]
    for peer in meta.get("peer_fabric_ips") or []:
        args += ["--peer", peer]
    rep, code = run_json(args)
    jsonschema.validate(rep, report_schema)
    got = {g["id"]: g["verdict"] for g in rep["gates"]}
    want = meta["expected"]["gates"]
    assert {k: got.get(k) for k in want} == want, [g for g in rep["gates"] if g["id"] in want]
    for ip, dev in meta["expected"]["device_map"].items():
        assert rep["device_map"].get(ip) == dev
    if not meta["expected"]["device_map"]:
        assert meta.get("fabric_ip") not in rep["device_map"]
    assert code == rep["exit_code"]
    # a snapshot holds no live QP test and no GPU readings: those gates say so instead of passing
    assert got["fabric.qp-rtr"] == "SKIP" and got["gpu.present"] == "SKIP"


@pytest.mark.parametrize("case", GPU, ids=[p.name for p in GPU])
def test_gpu_case(case, report_schema):
    meta = load_case(case)
    rep, _ = run_json(["all", "--json", "--snapshot", str(case)])
    jsonschema.validate(rep, report_schema)
    got = {g["id"]: g["verdict"] for g in rep["gates"]}
    want = meta["expected"]["gates"]
    assert {k: got.get(k) for k in want} == want, [g for g in rep["gates"] if g["id"] in want]
    # GPU cases carry no sys/: the fabric gates say "not captured"
    assert got["fabric.rdma-present"] == "SKIP"
    assert rep["device_map"] == {}


@pytest.mark.parametrize("case", GPU, ids=[p.name for p in GPU])
def test_gpu_case_expect_sm_flag_wins(case):
    """--expect-sm overrides the snapshot's expect.image_sm_count."""
    readings = json.loads((case / "gpu.json").read_text())
    have = readings["devices"][0]["cuda"]["sm_count"]
    rep, _ = run_json(["gpu", "--json", "--snapshot", str(case), "--expect-sm", str(have + 18)])
    sm = next(g for g in rep["gates"] if g["id"] == "gpu.sm-count")
    assert sm["verdict"] == "FAIL"
    assert f"image built for {have + 18} SMs, this GPU has {have}" in sm["summary"]
