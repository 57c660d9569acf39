"""A pair test that stops on this host (no RDMA device/GID carries the fabric IP here) names the local
cause, never the peer, and the pair output renders unknowns as words, not None."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json

import pytest

from afddiag.cli import run
from afddiag.model.fabric import FabricFacts
from afddiag.model.pair import PairFacts, pair_facts
from afddiag.probes.pair import format_pair, pair

IP = "192.0.2.77"  # TEST-NET-1: no host carries it
# with pyverbs the stop is "no device carries the fabric IP"; without it, "pyverbs is not installed" (below)
needs_pyverbs = pytest.mark.skipif(importlib.util.find_spec("pyverbs") is None,
                                   reason="pyverbs not installed: the stop is then pyverbs' absence")


@needs_pyverbs
def test_client_records_a_local_stop_before_contacting_the_peer():
    f = pair("127.0.0.1", port=1, fabric_ip=IP, fabric=FabricFacts(), timeout_s=5)
    # no device at all: that root, before the fabric IP no device carries (issue 23)
    assert f.local_error and f.local_error.startswith("no RDMA device on this host") and f.peer_qp_num is None
    assert "cannot reach" not in (f.error or "")  # the peer was never contacted
    text = format_pair(f)
    assert "None" not in text
    # no device was opened: the cause alone, in one sentence, root first (issue 23)
    assert text.startswith("afddiag pair (client): stopped on this host before contacting the peer 127.0.0.1:1: ")
    assert "no device port not read" not in text
    assert pair_facts(json.loads(json.dumps(f, default=vars))).local_error == f.local_error  # a saved result keeps it


@needs_pyverbs
def test_bandwidth_gate_names_this_host_not_the_peer(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        run(["fabric", "--pair", "127.0.0.1:1", "--fabric-ip", IP, "--bandwidth", "1", "--role", "expert",
             "--json", "--no-history", "--pair-timeout", "25"])
    rep = json.loads(out.getvalue())
    rep = rep.get("report", rep)
    g = {x["id"]: x for x in rep["gates"]}
    bw = g["fabric.rail-bandwidth"]
    assert bw["verdict"] == "ERROR" and "stopped on this host before contacting the peer" in bw["summary"]
    assert IP in bw["summary"] and "None" not in bw["summary"]
    assert "on the peer" not in bw["remedy"] and "--serve" not in bw["remedy"]
    assert g["fabric.port-counters"]["verdict"] == "SKIP" and "None" not in g["fabric.port-counters"]["summary"]


def test_format_pair_words_for_unknowns():
    text = format_pair(PairFacts(role="server"))
    assert "None" not in text and "no device" in text and "no peer" in text


def test_missing_pyverbs_is_a_local_stop(monkeypatch):
    import afddiag.probes.pair as pairmod

    monkeypatch.setattr(pairmod, "_import_pyverbs", lambda: None)
    f = pair("127.0.0.1", port=1, fabric_ip=IP, fabric=None, timeout_s=5)  # fabric not read: pyverbs is the stop
    assert f.local_error == "pyverbs is not installed: apt install python3-pyverbs"
    assert f.peer_qp_num is None and "cannot reach" not in (f.error or "")


NO_IB = "/sys/class/infiniband does not exist: no RDMA driver loaded"


def test_no_rdma_device_is_the_root_named_first_in_one_sentence(monkeypatch):
    import afddiag.probes.pair as pairmod

    monkeypatch.setattr(pairmod, "_import_pyverbs", lambda: None)  # missing too, but not the root
    f = pair("127.0.0.1", port=1, fabric_ip=None, fabric=FabricFacts(notes=[NO_IB]), timeout_s=5)
    assert f.local_error.startswith(f"no RDMA device on this host ({NO_IB}): load the RDMA driver")
    assert "pyverbs" not in f.local_error and "--fabric-ip" not in f.local_error
    text = format_pair(f)
    first, rest = text.split("\n", 1)
    assert first == ("afddiag pair (client): stopped on this host before contacting the peer 127.0.0.1:1: "
                     + f.local_error)
    assert "nothing sent" in rest and "not read" not in text and "↔" not in text


def test_bandwidth_report_names_the_missing_device_as_root_and_the_errors_under_it(monkeypatch):
    import afddiag.probes.pair as pairmod
    from afddiag.model import to_jsonable
    from afddiag.model.run import Inputs
    from afddiag.pairtest import judge_pair
    from afddiag.probes.pair import BandwidthSpec

    monkeypatch.setattr(pairmod, "_import_pyverbs", lambda: None)
    fab = FabricFacts(notes=[NO_IB])
    f = pair("127.0.0.1", port=1, fabric_ip=None, fabric=fab, timeout_s=5, bandwidth=BandwidthSpec(1.0))
    rep = judge_pair(Inputs(), fab, to_jsonable(f))
    diag = rep["diagnosis"]
    assert diag[0]["gate"] == "fabric.rdma-present" and diag[0]["verdict"] == "FAIL"
    assert "fabric.rail-bandwidth" in diag[0]["explains"]
    assert [d["gate"] for d in diag] == ["fabric.rdma-present"]  # the bandwidth ERROR is under it, not a fault
    ids = [g["id"] for g in rep["gates"]]
    assert ids.index("fabric.rdma-present") < ids.index("fabric.rail-bandwidth")
    rdma = next(g for g in rep["gates"] if g["id"] == "fabric.rdma-present")
    assert "role generic requires" not in rdma["summary"] and "pair test" in rdma["summary"]
