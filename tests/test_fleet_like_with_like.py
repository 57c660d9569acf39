"""Fleet gates compare like with like and never contradict the host gate they summarize
(fleet.versions per HCA model, fleet.gpu per GPU model, fleet.devicemap after fabric.first-device),
and a host summary they quote is shortened by whole items, never mid-token."""

from __future__ import annotations

import pytest

from afddiag import cli
from afddiag.fleet import judge
from afddiag.gates import fleet as fg
from conftest import CASES


def _rep(name: str, role: str = "expert", *, fw=(), gpus=(), env=None, first=None, dm_env=None,
         fabric=True) -> fg.HostResult:
    gates = []
    if first:
        gates.append({"id": "fabric.first-device", "verdict": first, "summary": f"{name}: first-device {first}",
                      "facts": {}})
    if dm_env:
        gates.append({"id": "fabric.devicemap-env", "verdict": dm_env[0], "summary": dm_env[1], "facts": {}})
    if gpus:
        gates.append({"id": "gpu.slow-state", "verdict": "PASS", "summary": "ok", "facts": {}})
    devs = [{"name": f"mlx5_{i}", "hca_type": t, "fw_ver": v, **({"board_id": b} if b else {})}
            for i, (t, v, b) in enumerate(fw)]
    rep = {"schema_version": 1, "host": name, "afddiag_version": "0.1.0", "gates": gates,
           "inputs": {"role": role, "env": env or {}, "fabric_ip": None},
           "facts": {"fabric": {"devices": devs} if fabric else None,
                     "gpu": {"driver_version": "580.1",
                             "devices": [{"name": n, "under_load": {"clock_sm_mhz": c}} for n, c in gpus]}}}
    return fg.HostResult(name=name, report=rep)


def test_firmware_compared_only_between_one_hca_model():
    hosts = [_rep("a", fw=[("MT4129", "28.45.4028", None)]), _rep("b", fw=[("MT4129", "28.45.4028", None)]),
             _rep("c", fw=[("MT4123", "20.39.1002", None)]), _rep("d", fw=[("MT4099", "2.42.5000", None)])]
    v = fg.versions(hosts, {})
    assert v.verdict == "PASS", v.summary  # three models, each on its own: nothing to compare
    hosts.append(_rep("e", fw=[("MT4129", "28.39.2048", None)]))
    v = fg.versions(hosts, {})
    assert v.verdict == "WARN"
    assert v.summary.startswith("e firmware MT4129 28.39.2048 (other expert hosts with MT4129: 28.45.4028)")
    assert "MT4123" not in v.summary and "MT4099" not in v.summary and " c " not in f" {v.summary} "


def test_firmware_board_id_splits_one_chip_into_boards():
    """Two boards on one chip (a CX-7 OCP card and a CX-7 Spark module) carry separate firmware lines."""
    hosts = [_rep("a", fw=[("MT4129", "28.45.4028", "NVD0000000033")]),
             _rep("b", fw=[("MT4129", "28.45.4028", "NVD0000000033")]),
             _rep("c", fw=[("MT4129", "28.39.2048", "MT_0000000838")])]
    assert fg.versions(hosts, {}).verdict == "PASS"
    hosts.append(_rep("d", fw=[("MT4129", "28.39.1002", "NVD0000000033")]))
    v = fg.versions(hosts, {})
    assert v.verdict == "WARN" and v.summary.startswith("d firmware NVD0000000033 28.39.1002")


def test_gpu_figures_compared_only_within_one_model():
    h200 = [_rep(f"h{i}", role="generic", gpus=[("NVIDIA H200", 1980)]) for i in range(3)]
    gb10 = _rep("g", role="generic", gpus=[("NVIDIA GB10", 799)])
    v = fg.gpu(h200 + [gb10], {})
    assert v.verdict == "PASS", v.summary  # one GB10 has no peers of its model: no median to fall below
    sparks = [_rep(f"s{i}", role="generic", gpus=[("NVIDIA GB10", 2400)]) for i in range(3)]
    v = fg.gpu(h200 + sparks + [gb10], {})
    assert v.verdict == "FAIL"
    assert v.summary.startswith("g clock_sm_mhz 799 MHz is 33% of the generic median 2400 (NVIDIA GB10, 4 hosts)")
    assert "1980" not in v.summary


def test_devicemap_unset_follows_first_device():
    ok = _rep("single", first="PASS")
    v = fg.devicemap([ok, _rep("mapped", env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.0.0.2=mlx5_1"},
                                 first="PASS")], {})
    assert v.verdict == "PASS" and "single: not set, the first enumerated device carries the fabric IP" in v.summary
    assert v.facts["unset"] == [] and v.facts["unset_first_device_carries"] == ["single"]
    v = fg.devicemap([ok, _rep("bad", first="FAIL")], {})
    assert v.verdict == "FAIL" and v.summary.startswith("bad: DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP not set")
    assert "single" not in v.summary.split(";")[0]
    v = fg.devicemap([ok, _rep("gpuonly", fabric=False, first="SKIP")], {})
    assert v.verdict == "PASS" and "not judged: no fabric data: gpuonly" in v.summary
    assert "not set" not in v.summary.replace("single: not set", "")
    v = fg.devicemap([_rep("gpuonly", fabric=False)], {})
    assert v.verdict == "SKIP" and "no fabric data: gpuonly" in v.summary
    v = fg.devicemap([_rep("unknown", first="WARN")], {})
    assert v.verdict == "WARN" and v.summary.startswith("unknown (unknown: first-device WARN)")


def test_quoted_host_summary_is_shortened_by_whole_items():
    items = [f"NCCL_IB_HCA=rocep1s0f0,roceP2p1s0f{i} selects port {i} with no IPv4 RoCE v2 GID" for i in range(5)]
    long = "; ".join(items)
    v = fg.devicemap([_rep("m", env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.0.0.2=mlx5_1"},
                           first="PASS", dm_env=("FAIL", long))], {})
    quoted = v.facts["local_fail"][0]
    assert quoted.startswith(f"m ({items[0]}; {items[1]}")
    assert quoted.endswith(" (+3 more))")
    for it in items[:2]:  # every kept item whole; none cut
        assert it in quoted
    assert items[2] not in quoted and "roceP2p1s0f2" not in quoted
    one = "x" * 300  # one item longer than the limit is kept whole
    assert fg._brief(one) == one


@pytest.fixture(scope="module")
def case_reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("reps")
    paths = {}
    for case, fip, role in (("fabric/05-k8s-macvlan-slots-0-3-einval", "10.152.0.12", "expert"),
                            ("fabric/12-cx7-single-port-healthy", None, "coordinator"),
                            ("gpu/02-gb10-class-a-stuck-low-clock", None, "expert")):
        args = ["all", "--json", "--no-history", "--snapshot", str(CASES / case), "--role", role]
        if fip:
            args += ["--fabric-ip", fip]
        import contextlib
        import io

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            cli.run(args)
        p = out / (case.split("/")[1] + ".json")
        p.write_text(buf.getvalue())
        paths[case.split("/")[0] + case.split("/")[1][:2]] = p
    return paths


def test_merge_of_cases_agrees_with_each_host(case_reports):
    from afddiag.fleet import load_reports

    hosts = load_reports([str(p) for p in case_reports.values()])
    fr = judge(hosts)
    dm = next(g for g in fr["gates"] if g["id"] == "fleet.devicemap")
    per_host = {h.name: h.gate("fabric.first-device").get("verdict") for h in hosts}
    # no host the fleet gate calls 'not set' passes its own first-device
    assert all(per_host.get(n) == "FAIL" for n in dm["facts"]["unset"]), (dm["facts"], per_host)
    gpu_only = [h.name for h in hosts if not (h.facts.get("fabric") or {}).get("devices")]
    assert gpu_only and set(gpu_only) <= set(dm["facts"]["no_fabric_data"])
    assert dm["verdict"] != "FAIL", dm["summary"]
    ver = next(g for g in fr["gates"] if g["id"] == "fleet.versions")
    assert "firmware" not in ver["summary"] or "(other" not in ver["summary"], ver["summary"]
