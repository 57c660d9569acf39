"""`afddiag merge` and the fleet gates (afddiag/gates/fleet.py) over per-host reports."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from afddiag import cli
from afddiag.fleet import InventoryError, judge, load_inventory, load_reports, parse_target, peers_for
from afddiag.gates import fleet as fg
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import merge_scaling  # noqa: E402


@pytest.fixture(scope="module")
def thousand(tmp_path_factory) -> list[Path]:
    return merge_scaling.make_reports(1000, tmp_path_factory.mktemp("reports"))


@pytest.fixture(scope="module")
def merged(thousand) -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.run(["merge", "--json", *map(str, thousand)])
    fr = json.loads(out.getvalue())
    fr["_rc"] = rc
    return fr


def _gate(fr: dict, gid: str) -> dict:
    return next(g for g in fr["gates"] if g["id"] == gid)


def test_merge_1000_reports_names_each_planted_fault(merged):
    fr = merged
    assert fr["hosts_ok"] == 1000 and fr["hosts_error"] == 0
    assert fr["_rc"] == 2
    cap = _gate(fr, "fleet.capacity")
    assert cap["verdict"] == "FAIL"
    assert cap["summary"].startswith("node00017 AFD_EXPERT_CAPACITY=128 in /etc/afd/node00017.env: differs from "
                                     "coordinator node00000's AFD_PREFILL_CAPACITY=256"), cap["summary"]
    mtu = _gate(fr, "fleet.mtu")
    assert mtu["verdict"] == "FAIL" and mtu["summary"].startswith("node00042 RoCE MTU 1024 (enp1s0f1np1 MTU 1500)")
    assert [n for n, m in mtu["facts"]["roce_mtu"].items() if m != 4096] == ["node00042"]
    fip = _gate(fr, "fleet.fabric-ip")
    assert fip["verdict"] == "FAIL"
    assert "node00100, node00101 share fabric IP 10.64.0.110" in fip["summary"]
    assert "node00099 10.65.0.9 (10.65.0.0/16): not on the fleet's subnet 10.64.0.0/16" in fip["summary"]
    dm = _gate(fr, "fleet.devicemap")
    assert dm["verdict"] == "FAIL" and dm["facts"]["unset"] == ["node00500"]
    ver = _gate(fr, "fleet.versions")
    assert ver["verdict"] == "WARN"
    assert ver["summary"].startswith("node00777 kernel 6.8.0-1009-nvidia (other expert hosts: 6.11.0-1016-nvidia)")
    gpu = _gate(fr, "fleet.gpu")
    assert gpu["verdict"] == "FAIL" and gpu["summary"].startswith("node00900 (GPU 0 NVIDIA GB10: class A")
    assert _gate(fr, "fleet.gid-index")["verdict"] == "PASS"


def test_fleet_and_merge_share_the_judging_code(thousand):
    """The same reports through load_reports + judge (what `fleet` calls after SSH) give the same verdicts."""
    hosts = load_reports([str(p) for p in thousand[:50]])
    a = judge(hosts)
    b = judge([fg.HostResult(name=h.name, report=h.report) for h in hosts], source="fleet")
    assert [(g["id"], g["verdict"], g["summary"]) for g in a["gates"]] == \
           [(g["id"], g["verdict"], g["summary"]) for g in b["gates"]]


def test_merge_file_forms_and_garbage(tmp_path, thousand, capsys):
    reps = [json.loads(p.read_text()) for p in thousand[:4]]
    (tmp_path / "array.json").write_text(json.dumps(reps[:2]))
    (tmp_path / "lines.jsonl").write_text("\n".join(json.dumps(r) for r in reps[2:4]) + "\n")
    (tmp_path / "garbage.json").write_text("<html>502</html>")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    rc = cli.run(["merge", "--json", str(tmp_path / "array.json"), str(tmp_path / "lines.jsonl"),
                  str(tmp_path / "garbage.json"), str(tmp_path / "other.json")])
    fr = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in fr["hosts"]}
    assert [r["name"] for r in fr["hosts"]][:4] == ["node00000", "node00001", "node00002", "node00003"]
    assert rows["garbage.json"]["status"] == "ERROR" and "not JSON" in rows["garbage.json"]["error"]
    assert "not an afddiag report" in rows["other.json"]["error"]
    assert {r["exit_code"] for r in fr["hosts"][:4]} == {2}  # the generated reports carry per-host FAILs
    assert rc == 2  # FAIL outranks the ERROR rows
    assert [r["exit_code"] for r in fr["hosts"][4:]] == [3, 3]
    assert fr["hosts_ok"] == 4
    # a file that is not there is the user's typo, not a host without a report: usage error
    assert cli.run(["merge", str(tmp_path / "array.json"), str(tmp_path / "missing.json")]) == 64
    assert "missing.json" in capsys.readouterr().err


def test_merge_table_and_expectations(tmp_path, thousand, capsys):
    rc = cli.run(["merge", *map(str, thousand[:3]), "--expect-capacity", "512"])
    out = capsys.readouterr().out
    assert rc == 2
    assert "FAIL fleet.capacity node00000 AFD_PREFILL_CAPACITY=256" in " ".join(out.split())  # ids padded
    assert "differ from the inventory's capacity 512" in out


# ---------------------------------------------------------------- gate units on small fleets

def _host(name: str, role: str = "expert", **kw) -> fg.HostResult:
    gates = []
    if "gid_index" in kw:
        gates.append({"id": "fabric.rocev2-ipv4", "verdict": "PASS",
                      "facts": {"entry": {"gid_index": kw["gid_index"]}}})
    if "under_load" in kw:
        gates.append({"id": "gpu.slow-state", "verdict": "PASS", "facts": {}})
    rep = {"schema_version": 1, "host": name, "afddiag_version": kw.get("afddiag", "0.1.0"), "gates": gates,
           "inputs": {"role": role, "env": kw.get("env", {}), "fabric_ip": kw.get("ip")},
           "facts": {"gpu": {"driver_version": kw.get("driver", "580.1"),
                             "devices": [{"under_load": kw["under_load"]}] if "under_load" in kw else []},
                     "versions": {"kernel": kw.get("kernel", "6.11")}}}
    return fg.HostResult(name=name, report=rep)


def test_gid_index_warns_only_when_a_stack_forces_one():
    hosts = [_host("a", gid_index=3), _host("b", gid_index=3), _host("c", gid_index=1)]
    v = fg.gid_index(hosts, {})
    assert v.verdict == "PASS" and "nothing forces one index" in v.summary
    hosts[0] = _host("a", gid_index=3, env={"NCCL_IB_GID_INDEX": "3"})  # a report that forces its own index
    v = fg.gid_index(hosts, {})  # c forces nothing: its engine picks its own GID
    assert v.verdict == "PASS" and "NCCL_IB_GID_INDEX is set on a=3" in v.summary, v.summary
    hosts[2] = _host("c", gid_index=1, env={"NCCL_IB_GID_INDEX": "3"})  # c forces 3; its GID sits at 1
    v = fg.gid_index(hosts, {})
    assert v.verdict == "WARN" and v.summary.startswith("c GID index 1 while NCCL_IB_GID_INDEX=3 is forced there")
    assert "NCCL_IB_GID_INDEX is set on a=3, c=3" in v.summary and "a GID index" not in v.summary
    v = fg.gid_index([_host("a", gid_index=3), _host("b", gid_index=3)], {"gid_index": 1})
    assert v.verdict == "WARN" and v.summary.startswith("a GID index 3, b GID index 3")


def test_gpu_outlier_by_role_median():
    hosts = [_host(f"r{i}", under_load={"bf16_tflops": 90.0 + i, "clock_sm_mhz": 2300}) for i in range(4)]
    hosts.append(_host("r9", under_load={"bf16_tflops": 36.5, "clock_sm_mhz": 2300}))
    hosts.append(_host("coord", role="coordinator", under_load={"bf16_tflops": 400.0}))
    v = fg.gpu(hosts, {})
    assert v.verdict == "FAIL" and v.summary.startswith("r9 bf16_tflops 36.5 TFLOP/s is 40% of the expert median")
    assert "coord" not in v.summary  # another role, another median
    v = fg.gpu(hosts[:4], {})
    assert v.verdict == "PASS"


def test_versions_drift_within_role_only():
    hosts = [_host("a", driver="580.1"), _host("b", driver="580.1"), _host("c", driver="575.9"),
             _host("coord", role="coordinator", driver="570.0")]
    v = fg.versions(hosts, {})
    assert v.verdict == "WARN" and v.summary.startswith("c driver 575.9 (other expert hosts: 580.1)")
    assert "coord" not in v.summary


@pytest.mark.parametrize("kw,action,names,absent", [
    ({"afddiag": "0.0.1"}, "UPDATE_PACKAGE", ["afddiag"], ["drain"]),           # the reviewer's fleet: no drain
    ({"driver": "575.9"}, "UPDATE_VERSIONS", ["NVIDIA driver", "in a maintenance window"], ["afddiag"]),
    ({"kernel": "6.8"}, "UPDATE_VERSIONS", ["kernel package", "in a maintenance window"],
     ["NVIDIA driver", "afddiag"]),
    ({"kernel": "6.8", "afddiag": "0.0.1"}, "UPDATE_VERSIONS",
     ["kernel package", "in a maintenance window", "also update afddiag", "no drain"], ["NVIDIA driver"]),
])
def test_versions_drain_only_for_what_takes_a_reboot(kw, action, names, absent):
    """Firmware/driver/kernel/BIOS drift: that update in a maintenance window; afddiag or rdma-core drift: the
    package update, no drain. Neither drains (issue 23: no remedy says "drain" where the flag is false)."""
    from afddiag.diagnosis import drains, fill_actions, needs_drain

    v = fg.versions([_host("a"), _host("b"), _host("c", **kw)], {})
    fill_actions([v])
    assert v.verdict == "WARN" and v.action == action, (v.summary, v.action)
    for w in names:
        assert w in v.remedy, (w, v.remedy)
    for w in absent:
        assert w not in v.remedy.replace("no drain", ""), (w, v.remedy)
    assert not drains(v.verdict, v.action) and not needs_drain(v.action)
    assert "drain" not in v.remedy.replace("no drain", "")


def test_rdma_core_drift_is_a_package_update():
    from afddiag.gates.fleet import versions_remedy

    rem, action = versions_remedy({"rdma_core"})
    assert action == "UPDATE_PACKAGE" and "rdma-core" in rem and "drain the host" not in rem
    rem, action = versions_remedy({"firmware MT_0000000970", "rdma_core"})
    assert action == "UPDATE_VERSIONS" and rem.index("firmware") < rem.index("rdma-core"), rem
    assert "BIOS" in versions_remedy({"bios"})[0]


def test_error_rows_are_named_in_every_gate_and_exit_3():
    hosts = [_host("a", ip="10.0.0.1", env={"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "10.0.0.1=mlx5_0"}),
             fg.HostResult(name="b", error="unreachable: connection refused")]
    fr = judge(hosts)
    assert fr["exit_code"] == 3
    row = next(r for r in fr["hosts"] if r["name"] == "b")
    assert row["status"] == "ERROR" and row["error"] == "unreachable: connection refused"
    assert all("1 host(s) without a report not judged: b" in g["summary"] for g in fr["gates"])


def test_a_gate_that_raises_is_error_not_traceback(monkeypatch):
    def boom(fleet, expect):
        raise KeyError("x")

    monkeypatch.setattr(fg, "GATES", [("fleet.capacity", boom)])
    v = fg.run_fleet_gates([_host("a")])
    assert v[0].verdict == "ERROR" and "KeyError" in v[0].summary


def test_inventory_parsing(tmp_path):
    p = tmp_path / "inv.toml"
    p.write_text('[fleet]\npeers = "coordinator"\n[expect]\ncapacity = 256\n'
                 '[[host]]\nname = "c"\nrole = "coordinator"\nfabric_ip = "10.0.0.1"\n'
                 '[[host]]\nname = "r1"\nssh = "admin@r1.example:2222"\nrole = "expert"\nfabric_ip = "10.0.0.2"\n'
                 '[[host]]\nname = "r2"\nrole = "expert"\nfabric_ip = "10.0.0.3"\n')
    inv = load_inventory(str(p))
    assert [h.name for h in inv.hosts] == ["c", "r1", "r2"] and inv.expect == {"capacity": 256}
    assert peers_for(inv.hosts[0], inv) == ["10.0.0.2", "10.0.0.3"]
    assert peers_for(inv.hosts[1], inv) == ["10.0.0.1"]
    assert parse_target(inv.hosts[1].ssh) == ("admin", "r1.example", 2222)
    assert parse_target("r2", "root") == ("root", "r2", 22)
    for bad, msg in (('[[host]]\nname = "a"\nfabric_ip = "10.0.0"\n', "fabric_ip must be an IPv4 address"),
                     ('[[host]]\nname = "a"\n[[host]]\nname = "a"\n', "used twice"),
                     ('[[host]]\nname = "a"\nsshh = "x"\n', r"unknown key\(s\) sshh"),
                     ('[fleet]\npeers = "some"\n[[host]]\nname = "a"\n', "peers must be one of")):
        p.write_text(bad)
        with pytest.raises(InventoryError, match=msg):
            load_inventory(str(p))


def test_fleet_bad_inventory_is_usage_error(tmp_path, capsys):
    assert cli.run(["fleet", "--inventory", str(tmp_path / "none.toml")]) == 64
    assert "inventory" in capsys.readouterr().err


def test_fleet_gates_are_registered_but_never_run_per_host():
    from afddiag.gates import registry

    ids = [g for g, fam, _ in registry() if fam == "fleet"]
    assert ids == [g for g, _ in fg.GATES]
    assert all(fam != "fleet" for _, fam, _ in registry({"fabric", "gpu", "host", "launch"}))


def test_deep_copy_of_reports_is_not_mutated_by_judging(thousand):
    hosts = load_reports([str(p) for p in thousand[:5]])
    before = copy.deepcopy([h.report for h in hosts])
    judge(hosts)
    assert [h.report for h in hosts] == before


def test_fabric_ip_not_given_on_an_ambiguous_host_is_a_missing_input_not_a_host_change():
    amb = _host("spark-b")
    amb.report["inputs"]["fabric_ip_source"] = "ambiguous"
    v = fg.fabric_ip([_host("spark-a", ip="10.0.0.1"), amb], {})
    assert v.verdict == "FAIL" and "spark-b (ambiguous)" in v.summary
    assert v.action == "SET_ENV" and "--fabric-ip / AFD_FABRIC_IP" in v.remedy and "spark-b" in v.remedy
    # a real address fault alongside keeps the host remedy
    v = fg.fabric_ip([_host("spark-a", ip="10.0.0.1"), _host("spark-c", ip="10.0.0.1"), amb], {})
    assert v.action != "SET_ENV" and "share fabric IP" in v.summary


def test_gid_index_counts_every_engines_forced_index():
    """Mooncake's MC_GID_INDEX and UCX_IB_GID_INDEX force one index as NCCL_IB_GID_INDEX does: a host
    whose fabric GID sits elsewhere is named, with the variable and host that force it."""
    def forced(name, gid_index, env):
        return _host(name, gid_index=gid_index, env=env)

    for var in ("MC_GID_INDEX", "UCX_IB_GID_INDEX"):
        hosts = [forced("a", 3, {var: "3"}), _host("b", gid_index=3), forced("c", 1, {var: "3"})]
        assert hosts[0].summary["gid_index_envs"] == {var: "3"}
        v = fg.gid_index(hosts, {})
        assert v.verdict == "WARN" and v.summary.startswith(f"c GID index 1 while {var}=3 is forced there"), v.summary
        assert f"{var} is set on a=3, c=3" in v.summary
        assert v.facts["forced_by_env"] == {"a": {var: "3"}, "c": {var: "3"}}
    # two engines forcing on two hosts: both named, grouped by variable
    hosts = [forced("a", 3, {"MC_GID_INDEX": "3"}), forced("b", 3, {"NCCL_IB_GID_INDEX": "3"}), _host("c", gid_index=1)]
    v = fg.gid_index(hosts, {})
    assert "MC_GID_INDEX is set on a=3; NCCL_IB_GID_INDEX is set on b=3" in v.summary
    # a summary written before gid_index_envs joined it: its NCCL gid_index_env still counts
    old = _host("a", gid_index=3)
    old.report["summary"] = {**old.summary, "gid_index_env": "3"}
    old.report["summary"].pop("gid_index_envs")
    old._summary = None
    v = fg.gid_index([old, _host("c", gid_index=1)], {})
    assert v.verdict == "PASS" and "NCCL_IB_GID_INDEX is set on a=3" in v.summary
    old = _host("a", gid_index=1)
    old.report["summary"] = {**old.summary, "gid_index_env": "3"}
    old.report["summary"].pop("gid_index_envs")
    old._summary = None
    v = fg.gid_index([old, _host("c", gid_index=1)], {})
    assert v.verdict == "WARN" and v.summary.startswith("a GID index 1 while NCCL_IB_GID_INDEX=3 is forced there")


def test_gid_index_compares_each_host_with_its_own_forced_value():
    """Each host's forced index is judged against its own GID table: hosts forcing different values that
    are each right PASS (before: the fleet's most common forced value was the reference, so a host forcing
    its own correct 5 was WARNed against 3, contradicting its devicemap-env PASS); engines are not pooled."""
    def forced(name, gid_index, env):
        return _host(name, gid_index=gid_index, env=env)

    nccl = "NCCL_IB_GID_INDEX"
    v = fg.gid_index([forced("a", 3, {nccl: "3"}), forced("b", 3, {nccl: "3"}), forced("c", 5, {nccl: "5"})], {})
    assert v.verdict == "PASS" and "forces its own index" in v.summary, v.summary
    # other engines' variables are no reference for NCCL's: MC=3 on a, UCX=3 on b, NCCL=5 on c, each right
    v = fg.gid_index([forced("a", 3, {"MC_GID_INDEX": "3"}), forced("b", 3, {"UCX_IB_GID_INDEX": "3"}),
                      forced("c", 5, {nccl: "5"})], {})
    assert v.verdict == "PASS", v.summary
    # one host, two engines: only the variable that misses its own index is named
    v = fg.gid_index([forced("a", 3, {nccl: "3"}), forced("c", 5, {nccl: "5", "MC_GID_INDEX": "3"})], {})
    assert v.verdict == "WARN" and v.summary.startswith("c GID index 5 while MC_GID_INDEX=3 is forced there:")
    assert v.facts["forced_elsewhere"] == {"c": {"MC_GID_INDEX": "3"}}
    # the inventory's gid_index: every host compared with it, forced or not
    v = fg.gid_index([forced("a", 3, {nccl: "3"}), forced("c", 5, {nccl: "5"})], {"gid_index": 3})
    assert v.verdict == "WARN" and v.summary.startswith("c GID index 5: ")
    assert "inventory forces gid_index 3" in v.summary
