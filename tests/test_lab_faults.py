"""Fault injection in the soft-RoCE lab: one boot of lab/scenario-faults.py (lab/boot.sh with
AFDDIAG_LAB_SCRIPT) breaks the incident host between and during ``afddiag all`` runs; each fault must
give the right gate verdict, no hang, no traceback, and no QP, PD or device context left behind.

Needs lab/setup.sh to have run (as root). Outside CI a missing lab skips with the reason; with CI set
it fails instead (under CI the fixture first tries lab/setup.sh itself), as tests/test_lab.py does.
"""

from __future__ import annotations

import pytest

import labboot

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> dict:
    r = labboot.boot(tmp_path_factory, "lab-faults", 'scenario-faults.py')
    assert r["boot_rc"] == 0, "lab/boot.sh failed although results.json exists"
    return r


def _run(faults: dict, name: str) -> dict:
    """One run's record, checked for the promises every run keeps: finished, no traceback, JSON."""
    run = faults["runs"][name]
    assert not run["hung"], f"{name}: afddiag still running after {faults['run_deadline_s']}s"
    assert run["exception"] is None, run["exception"]
    assert not run["traceback_in_output"], run["stderr"]
    assert isinstance(run["json"], dict), f"{name}: no JSON: {run['stdout']!r} {run['stderr']!r}"
    assert run["rc"] == run["json"]["exit_code"]
    return run


def _v(run: dict, gid: str) -> dict:
    gates = {g["id"]: g for g in run["json"]["gates"]}
    assert gid in gates, (gid, sorted(gates))
    return gates[gid]


def test_every_run_finished_in_bounded_time_without_traceback(faults) -> None:
    assert set(faults["runs"]) == {"baseline", "mtu-9000", "mtu-600", "ip-removed", "port-down", "peer-unreachable",
                                   "down-during-run", "delete-while-held", "device-deleted", "netns-gone"}
    for name in faults["runs"]:
        run = _run(faults, name)
        assert run["elapsed_s"] < faults["run_deadline_s"], (name, run["elapsed_s"])
        errors = [g["id"] for g in run["json"]["gates"] if "gate failed on these facts" in g["summary"]]
        assert errors == [], (name, errors)


def test_every_probe_finished_within_its_bound(faults) -> None:
    for name, run in faults["runs"].items():
        bounded = [p for p in run["phases"] if p["bound_s"] is not None]
        assert len(bounded) >= 4, (name, run["phases"])  # limits, fabric, GPU, CPU, route (QP when devices)
        late = [p for p in bounded if p["s"] > p["bound_s"] + 1.0]
        assert late == [], (name, late)
        assert [p for p in bounded if p["failed"]] == [], (name, bounded)  # nothing timed out on a live lab


def test_no_qp_pd_or_context_left_after_any_run(faults) -> None:
    for name, run in faults["runs"].items():
        left = run["leftovers"]
        assert left["qp"] == [] and left["pd"] == [], (name, left)
        assert left["uverbs_fds"] == [], (name, left)
    assert faults["resource_after_cleanup"] == []


def test_baseline_is_healthy(faults) -> None:
    run = _run(faults, "baseline")
    for gid in ("fabric.link", "fabric.rocev2-ipv4", "fabric.first-device", "fabric.qp-rtr"):
        assert _v(run, gid)["verdict"] == "PASS", _v(run, gid)
    assert _v(run, "fabric.mtu")["verdict"] == "WARN"  # 1500-byte veth: RoCE path MTU 1024


def test_mtu_changes_are_judged(faults) -> None:
    big = _v(_run(faults, "mtu-9000"), "fabric.mtu")
    assert big["verdict"] == "PASS" and "4096" in big["summary"], big
    small = _v(_run(faults, "mtu-600"), "fabric.mtu")
    assert small["verdict"] == "WARN" and "600" in small["summary"] and "256" in small["summary"], small


def test_fabric_ip_removed_fails_rocev2_gid(faults) -> None:
    run = _run(faults, "ip-removed")
    g = _v(run, "fabric.rocev2-ipv4")
    assert g["verdict"] == "FAIL" and "10.9.0.2" in g["summary"], g
    assert run["rc"] == 2


def test_port_down_fails_link(faults) -> None:
    run = _run(faults, "port-down")
    link = _v(run, "fabric.link")
    assert link["verdict"] == "FAIL" and "port DOWN" in link["summary"] and "arxe1" in link["summary"], link
    # the address is still on its RoCE v2 GID: one fault (the link), named once (issue 12)
    rocev2 = _v(run, "fabric.rocev2-ipv4")
    assert rocev2["verdict"] == "PASS" and "DOWN" in rocev2["summary"], rocev2
    assert [d["gate"] for d in run["json"]["diagnosis"] if d["verdict"] == "FAIL"] == ["fabric.link"]
    assert run["rc"] == 2


def test_peer_unreachable_fails_rtr_with_etimedout(faults) -> None:
    rtr = _v(_run(faults, "peer-unreachable"), "fabric.qp-rtr")
    assert rtr["verdict"] == "FAIL" and "errno 110" in rtr["summary"], rtr


def test_port_down_while_running_gives_verdicts_and_releases(faults) -> None:
    run = _run(faults, "down-during-run")
    assert run["fault"]["applied"], run["fault"]
    assert run["fault"]["rc"] == 0
    assert _v(run, "fabric.qp-rtr")["verdict"] in ("FAIL", "ERROR"), _v(run, "fabric.qp-rtr")


def test_device_deleted_while_held_is_released_within_the_timeout(faults) -> None:
    run = _run(faults, "delete-while-held")
    f = run["fault"]
    assert f["applied"], f
    assert f["rc"] == 0, f  # rdma link delete succeeded...
    # ...once afddiag closed its context: no later than the end of the run (plus scheduling slack)
    assert f["done_at_s"] <= run["elapsed_s"] + 5, (f, run["elapsed_s"])
    assert f["done_at_s"] - f["applied_at_s"] < faults["qp_timeout_s"] + 5, f
    qp = next(p for p in run["phases"] if p["what"] == "QP probe")
    qp_end = qp["start_s"] + qp["s"]
    # the delete waited for afddiag's context on arxe1 (it was applied while the walk held it) and
    # finished promptly once the walk closed it
    assert f["applied_at_s"] < qp_end and qp_end - 0.5 <= f["done_at_s"] <= qp_end + 3, (f, qp)
    assert not any(d.get("ifname") == "arxe1" for d in faults["rdma_dev_after_delete"] or [])


def test_device_deleted_between_runs(faults) -> None:
    run = _run(faults, "device-deleted")
    present = _v(run, "fabric.rdma-present")
    assert present["verdict"] == "PASS" and "arxe1" not in present["summary"], present
    assert _v(run, "fabric.rocev2-ipv4")["verdict"] == "FAIL"
    first = _v(run, "fabric.first-device")
    assert first["verdict"] == "FAIL" and "arxe1" in first["summary"], first  # the map names a device gone
    # the QP walk on a device that is gone is the same fault: "not judged", pointing at a failed gate
    rtr = _v(run, "fabric.qp-rtr")
    assert rtr["verdict"] == "SKIP" and rtr["summary"].startswith("not judged: fabric."), rtr
    assert "fabric.qp-rtr" not in [d["gate"] for d in run["json"]["diagnosis"]]


def test_peer_namespace_gone(faults) -> None:
    run = _run(faults, "netns-gone")
    assert faults["rdma_dev_after_netns"] == []  # the veths went with the namespace, rxe with them
    present = _v(run, "fabric.rdma-present")
    assert present["verdict"] == "SKIP" and "no RDMA device" in present["summary"], present
    assert _v(run, "fabric.qp-rtr")["verdict"] == "SKIP"
