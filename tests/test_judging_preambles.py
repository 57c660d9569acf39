"""The shared gate machinery pinned: the probe-failed and not-probed preambles, the registry's
order and families, a gate declared once, and run_gates (the playbook's gate set; a gate that
raises is ERROR for that gate alone)."""

from __future__ import annotations

import pytest

from afddiag import catalog
from afddiag.gates import PROBE_FAILED_REMEDY, gate, not_probed, probe_failed, registry, run_gates
from afddiag.model.host import PcieFacts
from afddiag.playbook import Playbook
from afddiag.verdict import ERROR, SKIP, Verdict
from fakes import context, observation


def test_probe_failed_reads_objects_and_dicts_and_names_the_first_failure():
    v = probe_failed("host.pcie", None, {"failed": ""}, PcieFacts(failed="lspci hung"), {"failed": "second"})
    assert (v.id, v.verdict, v.summary, v.remedy) == ("host.pcie", ERROR, "not judged: lspci hung", PROBE_FAILED_REMEDY)
    assert v.facts == {"probe_failed": "lspci hung"}
    assert probe_failed("host.pcie", None, {}, PcieFacts()) is None


def test_not_probed():
    assert not_probed("host.pcie", PcieFacts(failed="x"), "PCIe links", "r").verdict == ERROR
    v = not_probed("host.pcie", None, "PCIe links", "run on the host")
    assert (v.verdict, v.summary, v.remedy) == (SKIP, "PCIe links not probed", "run on the host")
    v = not_probed("host.pcie", PcieFacts(captured=False, notes=["a", "b"]), "PCIe links", "r")
    assert (v.verdict, v.summary) == (SKIP, "a; b")
    assert not_probed("host.pcie", PcieFacts(), "PCIe links", "r") is None


def test_the_registry_follows_the_catalogs_order_and_families():
    ids = [gid for gid, _, _ in registry()]
    assert ids == [g for g in catalog.load()["gates"] if g in set(ids)]
    assert {fam for _, fam, _ in registry({"gpu"})} == {"gpu"}
    assert all(gid.startswith(fam + ".") for gid, fam, _ in registry())
    assert len(ids) == len(set(ids)) == len(catalog.load()["gates"])


def test_a_gate_id_declared_twice_is_refused():
    with pytest.raises(ValueError, match="gate fabric.link declared twice"):
        gate("fabric.link")(lambda ctx, gate_id: None)


def test_run_gates_runs_the_playbooks_gates_and_contains_a_gate_that_raises(monkeypatch):
    ctx = context(observation(), playbook=Playbook(gates=["host.*"]))
    out = run_gates(ctx, {"host", "gpu"})
    assert [v.id for v in out] == ["host.cpu-clock", "host.pcie", "host.pcie-aer", "host.known-bad"]

    def boom(ctx):
        raise KeyError("links")

    import afddiag.gates as gates

    real = gates.registry
    monkeypatch.setattr(gates, "registry", lambda fams=None: [(g, f, boom if g == "host.pcie" else fn)
                                                               for g, f, fn in real(fams)])
    out = run_gates(ctx, {"host"})
    assert [(v.id, v.verdict) for v in out] == [("host.cpu-clock", SKIP), ("host.pcie", ERROR),
                                                ("host.pcie-aer", SKIP), ("host.known-bad", SKIP)]
    assert out[1].summary == "host.pcie: gate failed on these facts (KeyError: 'links')"
    assert isinstance(out[0], Verdict)
