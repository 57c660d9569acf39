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
    assert f.local_error and IP in f.local_error and f.peer_qp_num is None
    assert "cannot reach" not in (f.error or "")  # the peer was never contacted
    text = format_pair(f)
    assert "None" not in text
    assert text.startswith(f"afddiag pair (client): no device port not read GID not read ({IP}) ↔ 127.0.0.1:1")
    assert "stopped on this host before contacting the peer" in text
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
    f = pair("127.0.0.1", port=1, fabric_ip=IP, fabric=FabricFacts(), timeout_s=5)
    assert f.local_error == "pyverbs is not installed: apt install python3-pyverbs"
    assert f.peer_qp_num is None and "cannot reach" not in (f.error or "")
