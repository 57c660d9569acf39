"""fleet.control-plane: the hosts' launch.control-plane connects judged across the fleet, as one matrix.

Each host report here is made the way a replay makes it: ``afddiag all --json --snapshot`` over a
snapshot holding that host's reach.json (the TCP connects its probe recorded) and a launch env, so the
per-host gate, the per-host summary (``summary.control_plane``) and the fleet gate all run on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from afddiag import cli, summary
from afddiag.fleet import judge, load_reports
from afddiag.gates import fleet as fg

IP = {"coord": "10.9.0.10", "spark-a": "10.9.0.11", "spark-b": "10.9.0.12"}
ROLE = {"coord": "coordinator", "spark-a": "expert", "spark-b": "expert"}
PORTS = [29500, 29501]


def _att(src: str, peer: str, port: int, outcome: str) -> dict:
    return {"peer": IP.get(peer, peer), "port": port, "source": IP[src], "ok": outcome == "connected",
            "outcome": outcome, "errno": {"refused": 111, "unreachable": 113}.get(outcome),
            "error": None if outcome == "connected" else outcome, "elapsed_ms": 1.0}


def _report(tmp: Path, capsys, name: str, outcomes: dict[str, str | dict[int, str]] | None,
            env: tuple[str, ...] = (), notes: tuple[str, ...] = ()) -> dict:
    """One host's report from a replay: ``outcomes`` maps each peer (host name or IPv4) to the outcome on
    every engine port, or to {port: outcome}; None: no reach.json and no peer (the gate SKIPs)."""
    snap = tmp / name
    snap.mkdir()
    (snap / "host").write_text(name + "\n")
    args = ["all", "--json", "--no-history", "--snapshot", str(snap), "--role", ROLE[name], "--fabric-ip", IP[name]]
    if outcomes is not None:
        attempts = [_att(name, peer, port, o if isinstance(o, str) else o[port])
                    for peer, o in outcomes.items() for port in (PORTS if isinstance(o, str) else sorted(o))]
        peers = [IP.get(p, p) for p in outcomes]
        (snap / "reach.json").write_text(json.dumps({"source": IP[name], "peers": peers, "ports": PORTS,
                                                     "attempts": attempts, "notes": list(notes)}))
        for p in peers:
            args += ["--peer", p]
    le = tmp / f"{name}.env"
    le.write_text("\n".join((f"AFD_FABRIC_IP={IP[name]}", f"AFD_ENGINE_PORTS={','.join(map(str, PORTS))}") + env)
                  + "\n")
    args += ["--launch-env", str(le)]
    capsys.readouterr()
    cli.run(args)
    rep = json.loads(capsys.readouterr().out)
    assert rep["host"] == name
    return rep


def _fleet(tmp: Path, capsys, reports: list[dict]) -> dict:
    """The reports through ``afddiag merge --json`` (files, as Slurm or Ansible collect them)."""
    f = tmp / "reports.json"
    f.write_text(json.dumps(reports))
    capsys.readouterr()
    cli.run(["merge", "--json", str(f)])
    return json.loads(capsys.readouterr().out)


def _cp(fr: dict) -> dict:
    return next(g for g in fr["gates"] if g["id"] == "fleet.control-plane")


def test_summary_carries_the_connects_and_matches_the_schema(tmp_path, capsys, report_schema):
    import jsonschema

    rep = _report(tmp_path, capsys, "spark-a", {"coord": {29500: "connected", 29501: "refused"}},
                  env=("AFD_ADVERTISE_ADDR=0.0.0.0",), notes=("10.9.0.10:29502 not tried: the 5 s bound was used up",))
    jsonschema.validate(rep, report_schema)
    cp = rep["summary"]["control_plane"]
    assert cp["source"] == "10.9.0.11" and cp["peers"] == ["10.9.0.10"] and cp["ports"] == PORTS
    assert cp["attempts"] == [{"peer": "10.9.0.10", "port": 29500, "outcome": "connected"},
                              {"peer": "10.9.0.10", "port": 29501, "outcome": "refused"}]
    assert cp["not_tried"] == [{"peer": "10.9.0.10", "port": 29502}]
    assert cp["advertised_bad"] == [{"key": "AFD_ADVERTISE_ADDR", "value": "0.0.0.0",
                                     "why": "a wildcard (listen-on-all) address, not one a peer can reach"}]
    assert cp["verdict"] == "FAIL"  # the per-host gate fails the advertised wildcard
    # a summary written before control_plane joined it is completed from the gate's facts
    old = {**rep, "summary": {k: v for k, v in rep["summary"].items() if k != "control_plane"}}
    assert summary.of(old)["control_plane"] == cp
    # a report of an afddiag without launch.control-plane has none
    older = {**old, "gates": [g for g in rep["gates"] if g["id"] != "launch.control-plane"]}
    assert summary.of(older)["control_plane"] is None


def test_all_reached_passes_with_refused_counted_as_answered(tmp_path, capsys):
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "connected"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "connected"}),
            _report(tmp_path, capsys, "spark-b", {"coord": "refused"})]
    fr = _fleet(tmp_path, capsys, reps)
    v = _cp(fr)
    assert v["verdict"] == "PASS", v["summary"]
    assert v["summary"].startswith("8 control connection(s) between 3 host(s) and their peers reached, 2 refused")
    assert v["facts"]["matrix"] == {"coord": {"spark-a": {"29500": "connected", "29501": "connected"},
                                              "spark-b": {"29500": "connected", "29501": "connected"}},
                                    "spark-a": {"coord": {"29500": "connected", "29501": "connected"}},
                                    "spark-b": {"coord": {"29500": "refused", "29501": "refused"}}}
    assert v["action"] == "NONE"


def test_asymmetric_pair_names_the_side_that_drops(tmp_path, capsys):
    # coord's connects to spark-b time out; spark-b reaches coord: spark-b's firewall drops what it did not start
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "timeout"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "connected"}),
            _report(tmp_path, capsys, "spark-b", {"coord": "connected"})]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL" and v["action"] == "OPEN_PORTS"
    assert v["summary"].startswith("asymmetric: spark-b reaches coord, but coord cannot reach spark-b (10.9.0.12) "
                                   "port 29500 timeout, 29501 timeout: spark-b's side drops incoming connections"), \
        v["summary"]
    assert v["remedy"].startswith("on spark-b, open port(s) 29500, 29501 to coord's fabric address 10.9.0.10")
    assert v["facts"]["asymmetric"] == [{"reaches": "spark-b", "cannot_reach_back": "coord", "drops": "spark-b",
                                         "ports": [29500, 29501], "outcomes": {"29500": "timeout", "29501": "timeout"}}]
    assert [(u["source"], u["peer"], u["port"]) for u in v["facts"]["unreachable"]] == \
        [("coord", "spark-b", 29500), ("coord", "spark-b", 29501)]


def _link_down(rep: dict) -> dict:
    """The report as a host whose own fabric.link FAILed would carry it (the summary the fleet reads)."""
    rep["summary"]["fabric_link"] = {"verdict": "FAIL", "summary": "mlx5_1 port 1 (enp1s0f1np1): DOWN"}
    return rep


def test_connects_to_a_host_whose_link_is_down_blame_the_link_not_a_firewall(tmp_path, capsys):
    # the same outcomes as the asymmetric case, but spark-b's fabric link is down: no firewall is blamed
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "timeout"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "connected"}),
            _link_down(_report(tmp_path, capsys, "spark-b", {"coord": "connected"}))]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL" and v["action"] == "FIX_LINK", (v["action"], v["summary"])
    assert "asymmetric" not in v["summary"] and v["facts"]["asymmetric"] == []
    assert "coord cannot reach spark-b (10.9.0.12) port 29500 timeout, 29501 timeout: spark-b's fabric link is down" \
        in v["summary"]
    assert v["remedy"].startswith("fix the fabric link first on spark-b (fabric.link there: mlx5_1 port 1"), v["remedy"]
    assert "ufw" not in v["remedy"]
    assert v["facts"]["explained_by_link_down"] == [{"source": "coord", "peer": "spark-b"}]


def test_a_down_link_and_a_firewall_elsewhere_are_both_named(tmp_path, capsys):
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "timeout", "spark-b": "timeout"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "timeout"}),
            _link_down(_report(tmp_path, capsys, "spark-b", {"coord": "unreachable"}))]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL" and v["action"] == "OPEN_PORTS"
    assert v["remedy"].startswith("open the engine ports between the fabric addresses on the side that drops")
    assert "; and fix the fabric link first on spark-b" in v["remedy"]
    assert {(e["source"], e["peer"]) for e in v["facts"]["explained_by_link_down"]} == \
        {("coord", "spark-b"), ("spark-b", "coord")}


def test_both_ways_dropped_is_plain_failure_on_each_side(tmp_path, capsys):
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": {29500: "unreachable", 29501: "unreachable"},
                                                "spark-b": "connected"}),
            _report(tmp_path, capsys, "spark-a", {"coord": {29500: "connected", 29501: "timeout"}}),
            _report(tmp_path, capsys, "spark-b", {"coord": "connected"})]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL" and "asymmetric" not in v["summary"], v["summary"]
    assert "coord cannot reach spark-a (10.9.0.11) port 29500 unreachable, 29501 unreachable" in v["summary"]
    assert "spark-a cannot reach coord (10.9.0.10) port 29501 timeout" in v["summary"]
    # both sides drop: the generic firewall remedy, not the one-sided "open port(s) on <host>" of an asymmetric pair
    assert v["remedy"].startswith("open the engine ports between the fabric addresses on the side that drops")
    assert "its firewall drops connections it does not start" not in v["remedy"] and v["facts"]["asymmetric"] == []


def test_a_source_that_cannot_bind_is_no_firewall_on_the_peer(tmp_path, capsys):
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "connected"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "bind failed"}),
            _report(tmp_path, capsys, "spark-b", {"coord": "connected"})]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL" and v["facts"]["asymmetric"] == []
    assert v["summary"].startswith("spark-a cannot reach coord (10.9.0.10) port 29500 bind failed, 29501 bind failed")


def test_required_pair_never_tested_warns_with_the_peer_remedy(tmp_path, capsys):
    # spark-b was given spark-a only; the coordinator was given spark-a only
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "connected"}),
            _report(tmp_path, capsys, "spark-b", {"spark-a": "refused"})]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "WARN" and v["action"] == "RERUN"
    assert v["summary"].startswith("coord never tested spark-b (not in its peer list); spark-b never tested coord "
                                   "(not in its peer list): not tested"), v["summary"]
    assert v["facts"]["not_tested"] == {"coord": ["spark-b"], "spark-b": ["coord"]}
    assert "--peer" in v["remedy"] and "AFD_PEER_FABRIC_IPS" in v["remedy"]
    # a rank not testing another rank is no gap: the roles require coordinator <-> rank only
    assert "spark-a never tested" not in v["summary"]


def test_hosts_without_connects_are_not_judged_not_failed(tmp_path, capsys):
    old = _report(tmp_path, capsys, "spark-b", None)  # no peers: launch.control-plane SKIP
    assert old["summary"]["control_plane"]["verdict"] == "SKIP"
    older = json.loads(json.dumps(old))  # an afddiag before launch.control-plane (and the summary): no gate
    older["host"] = "spark-a"
    older["inputs"]["fabric_ip"] = IP["spark-a"]
    older["gates"] = [g for g in older["gates"] if g["id"] != "launch.control-plane"]
    del older["summary"]
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "refused"}), older, old]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "PASS", v["summary"]
    assert v["summary"].endswith("(2 host(s) not judged: spark-a, spark-b)")
    assert [u.split(" (")[0] for u in v["facts"]["hosts_not_judged"]] == ["spark-a", "spark-b"]
    assert "no control-plane facts" in v["facts"]["hosts_not_judged"][0]
    assert "launch.control-plane SKIP" in v["facts"]["hosts_not_judged"][1]
    # nobody with connects at all: SKIP, not a failure
    v = _cp(_fleet(tmp_path, capsys, [older, old]))
    assert v["verdict"] == "SKIP" and v["summary"].startswith("no host report holds control-plane connects")


def test_advertised_wildcard_on_any_host_fails_with_set_env(tmp_path, capsys):
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "connected"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "connected"}, env=("AFD_COORDINATOR_URL=http://127.0.0.1:8000",)),
            _report(tmp_path, capsys, "spark-b", {"coord": "connected"})]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL" and v["action"] == "SET_ENV"
    assert v["summary"].startswith("spark-a advertises AFD_COORDINATOR_URL=http://127.0.0.1:8000 (loopback)")
    assert v["facts"]["advertised_bad"]["spark-a"][0]["key"] == "AFD_COORDINATOR_URL"
    # with a dropped connection too: the ports first, the advertised address in the same remedy
    (tmp_path / "again").mkdir()
    reps[2] = _report(tmp_path / "again", capsys, "spark-b", {"coord": "timeout"})
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL" and v["action"] == "OPEN_PORTS"
    assert "spark-b cannot reach coord" in v["summary"] and "spark-a advertises" in v["summary"]
    assert "advertise the fabric IP" in v["remedy"]


def test_a_peer_outside_the_fleet_is_named_by_its_address(tmp_path, capsys):
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "connected"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "connected", "10.9.0.99": "timeout"}),
            _report(tmp_path, capsys, "spark-b", {"coord": "connected"})]
    v = _cp(_fleet(tmp_path, capsys, reps))
    assert v["verdict"] == "FAIL"
    assert v["summary"].startswith("spark-a cannot reach 10.9.0.99 (10.9.0.99) port 29500 timeout")


def test_fleet_and_merge_judge_control_plane_alike(tmp_path, capsys):
    reps = [_report(tmp_path, capsys, "coord", {"spark-a": "connected", "spark-b": "timeout"}),
            _report(tmp_path, capsys, "spark-a", {"coord": "connected"}),
            _report(tmp_path, capsys, "spark-b", {"coord": "connected"})]
    f = tmp_path / "r.json"
    f.write_text(json.dumps(reps))
    a = judge(load_reports([str(f)]))
    b = judge([fg.HostResult(name=r["host"], role=ROLE[r["host"]], fabric_ip=IP[r["host"]], report=r) for r in reps],
              source="fleet")
    assert _cp(a)["summary"] == _cp(b)["summary"] and _cp(a)["verdict"] == "FAIL"


@pytest.mark.parametrize("junk", [{"control_plane": "x"}, {"control_plane": {"attempts": "x"}},
                                  {"control_plane": {"attempts": [None, {"peer": 3, "port": "a"}]}}])
def test_odd_summaries_never_raise(junk):
    rep = {"schema_version": 1, "host": "h", "gates": [], "inputs": {"role": "expert", "fabric_ip": "10.0.0.1"},
           "summary": {"summary_version": 1, **junk}}
    v = fg.control_plane([fg.HostResult(name="h", report=rep)], {})
    assert v.verdict == "SKIP"


def test_untested_pairs_keep_a_few_names_and_the_count_not_every_pair():
    """Thousands of ranks none of which a coordinator tested: the facts (and the report, the page, the
    memory) hold MAX_NAMED peers and the count per host, not coordinators x ranks names (issue 22)."""
    from afddiag.gates.control_plane import not_tested

    ranks = [f"r{i}" for i in range(20)]
    fip = {n: f"10.0.0.{i}" for i, n in enumerate(["coord", *ranks])}
    matrix = {"coord": {"r0": {29500: "connected"}}, "r3": {"r5": {29500: "connected"}}}
    names, counts = not_tested(matrix, ["coord"], ranks, fip, keep=fg.MAX_NAMED)
    assert names == {"coord": ranks[1:1 + fg.MAX_NAMED], "r3": ["coord"]}
    assert counts == {"coord": 19, "r3": 1}
    assert fg._names(names["coord"], counts["coord"]).endswith(f"{ranks[fg.MAX_NAMED]} and {19 - fg.MAX_NAMED} more")
