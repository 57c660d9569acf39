"""The soft-RoCE lab: boot Debian's 6.1 kernel under QEMU once and check afddiag on the incident host.

One boot (lab/boot.sh) runs every scenario of lab/run-scenario.py: the incident (no device map),
the fix (map set), and the peer's address gone; see that script for the topology.

Needs lab/setup.sh to have run (as root). Outside CI a missing QEMU or lab kernel skips with the
reason; with CI set it fails instead (under CI the fixture first tries lab/setup.sh itself).
"""

from __future__ import annotations

import json

import pytest

import labboot

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> dict:
    r = labboot.boot(tmp_path_factory, "lab")
    assert r["boot_rc"] == 0, "lab/boot.sh failed although results.json exists"
    return r


def _run(lab: dict, name: str) -> dict:
    sc = lab["scenarios"][name]
    assert sc["exception"] is None, sc["exception"]
    assert isinstance(sc["json"], dict), f"{name}: afddiag printed no JSON: {sc['stdout']!r} {sc['stderr']!r}"
    return sc


def _gate(sc: dict, gid: str) -> dict:
    gates = {g["id"]: g for g in sc["json"]["gates"]}
    assert gid in gates, f"{gid} missing; gates: {sorted(gates)}"
    return gates[gid]


def _mentions(gate: dict, *words: str) -> bool:
    text = json.dumps({"summary": gate.get("summary"), "facts": gate.get("facts")})
    return all(w in text for w in words)


def test_enumeration_order_is_device_index_not_name(lab) -> None:
    devs = sorted(lab["captures"]["rdma_dev"], key=lambda d: d["ifindex"])
    assert [d["ifname"] for d in devs] == ["zrxe0", "arxe1"]
    assert lab["direct"]["no-map"]["order"] == [["zrxe0", 0], ["arxe1", 1]]


def test_incident_without_map_fails_first_device_and_rtr_with_einval(lab) -> None:
    sc = _run(lab, "no-map")
    assert sc["rc"] == 2
    assert sc["json"]["device_map"] == {"10.9.0.2": "arxe1"}
    assert _gate(sc, "fabric.first-device")["verdict"] == "FAIL"
    # the failed walk is the same fault as fabric.first-device: named once, as the root (issue 12);
    # the gate says "not judged" and keeps what the walk alone said
    rtr = _gate(sc, "fabric.qp-rtr")
    assert rtr["verdict"] == "SKIP" and rtr["summary"].startswith("not judged: fabric.first-device failed"), rtr
    alone = rtr["facts"]["judged_alone"]
    assert alone["verdict"] == "FAIL" and "zrxe0" in alone["summary"] and "errno 22" in alone["summary"], alone
    assert "invalid attribute" in alone["summary"], alone
    assert _mentions(rtr, "zrxe0", "22"), rtr  # the walk's results stay in the facts
    assert [d["gate"] for d in sc["json"]["diagnosis"]][0] == "fabric.first-device"


def test_with_map_first_device_and_rtr_pass(lab) -> None:
    sc = _run(lab, "map")
    assert sc["rc"] in (0, 1)  # no FAIL (fabric.mtu WARNs on the 1500-byte veth)
    assert _gate(sc, "fabric.first-device")["verdict"] == "PASS"
    assert _gate(sc, "fabric.qp-rtr")["verdict"] == "PASS"
    assert _mentions(_gate(sc, "fabric.qp-rtr"), "arxe1")


def test_peer_address_gone_fails_rtr_with_etimedout(lab) -> None:
    sc = _run(lab, "peer-gone")
    assert sc["rc"] == 2
    rtr = _gate(sc, "fabric.qp-rtr")
    assert rtr["verdict"] == "FAIL"
    assert "errno 110" in rtr["summary"] and "timed out" in rtr["summary"], rtr


def test_probe_qp_raw_results(lab) -> None:
    """The probe's own facts, called directly (independent of the gates)."""

    def by_dev(name: str) -> dict:
        q = lab["direct"][name]["qp"]
        assert q["ran"], q
        return {r["device"]: r for r in q["results"]}

    r = by_dev("no-map")
    assert r["zrxe0"]["reached"] == "INIT" and r["zrxe0"]["errno"] == 22
    assert r["zrxe0"]["sgid_choice"] == "first RoCE v2 GID (fallback)"
    assert r["arxe1"]["reached"] == "RTS" and r["arxe1"]["sgid_index"] == 1
    assert r["arxe1"]["sgid_choice"] == "fabric IP"
    r = by_dev("peer-gone")
    assert r["arxe1"]["errno"] == 110 and r["arxe1"]["reached"] == "INIT"
    rtr = next(s for s in r["arxe1"]["steps"] if s["to"] == "RTR")
    assert rtr["elapsed_ms"] >= 500  # the kernel waited for an ARP reply
    for name in ("no-map", "map", "peer-gone"):
        assert all(x["destroyed"] for x in by_dev(name).values())


def test_no_qp_or_pd_left_behind(lab) -> None:
    caps = lab["captures"]
    # While the devices exist: only the kernel's own objects (ib_core's GSI QP1 and its PD).
    for kind in ("resource_qp_after_runs", "resource_pd_after_runs"):
        rows = caps[kind]
        assert isinstance(rows, list), (kind, rows)
        leftovers = [x for x in rows if x.get("comm") != "ib_core" or x.get("pid") == lab["pid"]]
        assert leftovers == [], (kind, leftovers)
    summary = caps["resource_after_runs"]
    assert summary and all(d["ctx"] == 0 for d in summary), summary
    # After cleanup: no device, nothing left.
    assert caps["resource_after_cleanup"] == []
    assert caps["rdma_dev_after_cleanup"] == []


def test_memory_registration_host_yes_gpu_no(lab) -> None:
    """rxe registers host memory (one MR and 64 x 1 MiB held at once) and the guest has no CUDA, so
    GPU memory is named as not registrable; every MR and PD was closed (test_no_qp_or_pd_left_behind)."""
    g = _gate(_run(lab, "no-map"), "fabric.mem-registration")
    assert g["verdict"] == "PASS", g["summary"]
    assert "host memory yes" in g["summary"] and "GPU memory no" in g["summary"]
    kinds = g["facts"]["kinds"]
    assert kinds["host"] and not kinds["gpu_peermem"] and not kinds["gpu_dmabuf"]
    for d in g["facts"]["devices"]:
        assert d["host_mr"]["ok"] is True and d["destroyed"] is True
        assert d["host_mr_count"]["registered"] == d["host_mr_count"]["wanted"] == 64
        assert d["gpu_mr"] is None and d["dmabuf_mr"] is None  # no CUDA buffer to register
