"""``--gate PATTERN`` (issue 23): the gates asked for run with every gate they depend on, fed by only
the probes they read, and each judges exactly as it does in a whole run."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from afddiag.check import check
from afddiag.cli import run
from afddiag.inputs import FAMILIES, InputsError, make_inputs, select_gates
from afddiag.probes.registry import PROBES, probes_for
from conftest import REPO, case_dirs, load_case

FIXTURES = REPO / "tests" / "fixtures" / "gpu"
SNAPSHOTS = case_dirs("fabric") + case_dirs("gpu") + [FIXTURES / n for n in ("h200-issue15", "h200-live-load")] + [
    FIXTURES / "h200-busy" / "busy.tar.gz"]


def _inputs(case, gates=()):
    c = load_case(case) if (case / "case.json").is_file() else {}
    return make_inputs(snapshot=str(case), fabric_ip=c.get("fabric_ip"), peers=c.get("peer_fabric_ips") or (),
                       role="expert", expect_sm=(c.get("expect") or {}).get("image_sm_count"),
                       families=FAMILIES["all"], gates=gates)


@pytest.mark.parametrize("case", SNAPSHOTS, ids=lambda p: p.name)
def test_each_gate_alone_judges_as_in_the_whole_run(case):
    whole = check("all", _inputs(case))
    for g in whole["gates"]:
        part = check("all", _inputs(case, (g["id"],)))
        got = {x["id"]: x for x in part["gates"]}
        assert set(got) == select_gates([g["id"]], FAMILIES["all"]) & {x["id"] for x in whole["gates"]}
        assert (got[g["id"]]["verdict"], got[g["id"]]["summary"]) == (g["verdict"], g["summary"]), (case.name, g["id"])


def test_dependencies_come_along_and_the_root_is_still_named():
    sel = select_gates(["fabric.qp-rtr"], FAMILIES["fabric"])
    # fabric.qp-rtr depends on link, rocev2-ipv4, first-device, devicemap-env; they on rdma-present
    assert {"fabric.qp-rtr", "fabric.link", "fabric.rocev2-ipv4", "fabric.first-device", "fabric.devicemap-env",
            "fabric.rdma-present"} == sel
    case = next(c for c in case_dirs("fabric") if c.name.startswith("01-"))
    rep = check("all", _inputs(case, ("fabric.qp-rtr",)))
    assert [d["gate"] for d in rep["diagnosis"] if d["verdict"] == "FAIL"] == ["fabric.first-device"]
    assert rep["inputs"]["gates"] == sorted(sel)


def test_only_the_probes_the_gates_read_run():
    assert probes_for({"host.cpu-clock"}) == {"host", "env", "versions", "cpu"}
    assert "qp" not in probes_for({"fabric.first-device"}) and "cpu" not in probes_for({"fabric.first-device"})
    assert probes_for({"fabric.qp-rtr"}) >= {"qp", "fabric"}  # the QP walk reads the fabric probe's devices
    assert probes_for({"launch.memory-plan"}) >= {"gpu"}  # another family's probe when the gate reads it
    every = {g for e in PROBES for g in e.feeds}
    assert every, "entries name the gates they feed"
    case = next(c for c in case_dirs("fabric") if c.name.startswith("01-"))
    rep = check("all", _inputs(case, ("fabric.first-device",)))
    ran = {k for k, v in rep["facts"].items() if v is not None}
    assert "fabric" in ran and not ran & {"qp", "gpu", "cpu", "route", "pair"}


def test_a_pattern_that_matches_nothing_is_a_usage_error():
    with pytest.raises(InputsError, match="--gate gpu.nothing"):
        select_gates(["gpu.nothing"], FAMILIES["all"])
    case = next(c for c in case_dirs("fabric") if c.name.startswith("01-"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = run(["fabric", "--no-history", "--snapshot", str(case), "--gate", "gpu.*"])
    assert code == 64 and "matches none of this command's gates" in err.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = run(["gpu", "--json", "--no-history", "--snapshot", str(case), "--gate", "gpu.mem*", "--gate",
                    "gpu.present"])
    ids = {g["id"] for g in json.loads(out.getvalue())["gates"]}
    assert ids == {"gpu.present", "gpu.memory", "gpu.processes"}  # gpu.memory depends on gpu.processes
