"""fleet.known-bad (issue 24 item 2's fleet gate): hosts grouped by the known-bad entries their
host.known-bad matched, from the per-host summary; the summary's ``known_bad`` built at judge time from a
real replay and read back from an older report's gate."""

from __future__ import annotations

from afddiag.gates import fleet as fg
from afddiag.model.run import Inputs
from afddiag.playbook import Playbook
from afddiag.runner import diagnose
from afddiag.summary import from_report, known_bad_of
from afddiag.verdict import PASS, SKIP, WARN
from snapfix import derive, fabric_case
from test_judging_fleet import DOWN, host, judged

K1008 = "kernel-6.17.0-1008-boot-panic"
K70 = "kernel-7.0-kho-cma-enomem"


def kb(name, verdict="PASS", matched=()):
    return host(name, known_bad={"verdict": verdict, "matched": list(matched)})


def test_pass_when_no_judged_host_matches_and_not_judged_hosts_are_named():
    v = judged("fleet.known-bad", [kb("a"), kb("b"), host("old"), kb("c", "SKIP"), DOWN])
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert v.summary.startswith("2 host(s): no known-bad entry matches") and "matrix not checked: old, c" in v.summary
    assert "1 host(s) without a report not judged: z" in v.summary


def test_hosts_are_grouped_by_entry_and_named_at_most_eight():
    fleet = [kb(f"s{i:02d}", "WARN", [K1008]) for i in range(10)] + [kb("t", "WARN", [K70, K1008]), kb("u")]
    v = judged("fleet.known-bad", fleet)
    assert (v.verdict, v.action) == (WARN, "UPDATE_VERSIONS")
    assert f"{K1008}: 11 host(s): s00" in v.summary and "and 3 more" in v.summary
    assert f"{K70}: 1 host(s): t" in v.summary
    assert v.facts["matched"][K1008]["count"] == 11 and len(v.facts["matched"][K1008]["hosts"]) == 8
    assert "kho=off" in v.remedy and "newer DGX OS kernel" in v.remedy


def test_an_entry_this_afddiag_does_not_know_is_still_named():
    v = judged("fleet.known-bad", [kb("a", "WARN", ["from-a-newer-matrix"])])
    assert (v.verdict, v.action) == (WARN, "UPDATE_VERSIONS") and "from-a-newer-matrix: 1 host(s): a" in v.summary


def test_skip_when_no_host_could_be_checked():
    assert judged("fleet.known-bad", [host("old"), kb("b", "SKIP"), DOWN]).verdict == SKIP


def test_the_summary_carries_what_host_known_bad_matched(tmp_path):
    snap = derive(fabric_case("02-"), tmp_path / "s", {"proc/sys/kernel/osrelease": "6.17.0-1008-nvidia\n"})
    rep, _ = diagnose(Inputs(snapshot=str(snap), playbook=Playbook(name="expert")))
    assert rep["summary"]["known_bad"] == {"verdict": WARN, "matched": [K1008]}
    gate = next(g for g in rep["gates"] if g["id"] == "host.known-bad")
    assert known_bad_of(gate) == rep["summary"]["known_bad"] == from_report(rep)["known_bad"]
    older = {**rep, "summary": {k: v for k, v in rep["summary"].items() if k != "known_bad"}}
    assert fg.HostResult(name="x", report=older).summary["known_bad"] == {"verdict": WARN, "matched": [K1008]}
    assert known_bad_of(None) is None
