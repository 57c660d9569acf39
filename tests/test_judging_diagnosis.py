"""The diagnosis pinned on verdict lists: typed actions filled from the catalog (FAIL's action, WARN's
warn_action, ERROR → RERUN, PASS/SKIP → NONE), "not judged" dependencies, roots and what each one
explains, the fix order (FAIL, ERROR, WARN; catalog order within), one fault per remedy and action,
and which actions drain. Gate ids and their dependencies are the catalog's (checks/gates.toml)."""

from __future__ import annotations

import pytest

from afddiag.diagnosis import apply_dependencies, diagnose, drains, fill_actions, needs_drain, prepare
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN, Verdict


def V(gid, verdict, summary="s", remedy="r", action=""):
    return Verdict(gid, verdict, summary, remedy, {}, action)


# ---------------------------------------------------------------- actions

def test_fill_actions_from_the_catalog():
    vs = [V("fabric.link", FAIL), V("fabric.link", WARN), V("fabric.mtu", WARN), V("gpu.errors", ERROR),
          V("fabric.link", PASS), V("fabric.link", SKIP), V("gpu.errors", FAIL, action="REBOOT")]
    fill_actions(vs)
    assert [v.action for v in vs] == ["FIX_LINK", "RERUN", "SET_MTU", "RERUN", "NONE", "NONE", "REBOOT"]


def test_an_action_outside_the_closed_set_is_a_gate_bug():
    with pytest.raises(ValueError, match="fabric.link: action 'POWER_OFF' is not in checks/gates.toml"):
        fill_actions([V("fabric.link", FAIL, action="POWER_OFF")])


@pytest.mark.parametrize("verdict, action, drain", [
    (FAIL, "RESET_GPU", True), (FAIL, "REBOOT", True), (FAIL, "AC_POWER_CYCLE", True), (FAIL, "HW_INSPECTION", True),
    (FAIL, "FIX_LINK", True), (FAIL, "SET_ENV", False), (FAIL, "RERUN", False), (FAIL, "NONE", False),
    (WARN, "RESET_GPU", False), (ERROR, "REBOOT", False), (FAIL, "", False), (FAIL, "NO_SUCH_ACTION", False)])
def test_only_a_fail_whose_action_needs_a_drain_drains(verdict, action, drain):
    assert drains(verdict, action) is drain
    assert needs_drain("RESET_GPU") and not needs_drain("SET_ENV") and not needs_drain("NO_SUCH_ACTION")


# ---------------------------------------------------------------- dependencies

def test_a_not_judged_gate_defers_to_its_failed_dependency():
    link = V("fabric.link", FAIL, "mlx5_0 port 1 DOWN")
    speed = V("fabric.link-speed", WARN, "enp1 10 Gb/s")
    speed.commands = ["ethtool enp1"]
    apply_dependencies([link, speed])
    assert (speed.verdict, speed.action, speed.commands) == (SKIP, "NONE", [])  # its commands are not the fix
    assert speed.summary == "not judged: fabric.link failed (mlx5_0 port 1 DOWN)"
    assert speed.remedy == "fix fabric.link first (see its remedy), then re-run"
    assert speed.facts["judged_alone"] == {"verdict": WARN, "summary": "enp1 10 Gb/s", "remedy": "r",
                                           "commands": ["ethtool enp1"]}


def test_dependencies_that_do_not_fail_or_gates_of_their_own_concern_are_left_alone():
    speed = V("fabric.link-speed", FAIL)
    apply_dependencies([V("fabric.link", WARN), speed])
    assert speed.verdict == FAIL
    link = V("fabric.link", FAIL)  # fabric.link judges its own concern when rdma-present fails
    apply_dependencies([V("fabric.rdma-present", FAIL), link])
    assert link.verdict == FAIL
    passed = V("fabric.link-speed", PASS)
    apply_dependencies([V("fabric.link", FAIL), passed])
    assert passed.verdict == PASS


# ---------------------------------------------------------------- roots

def test_a_failed_dependency_is_the_root_and_explains_its_symptoms():
    vs = [V("fabric.rdma-present", PASS), V("fabric.link", FAIL, "down", "fix cable"),
          V("fabric.link-speed", FAIL, "slow", "fix speed"), V("fabric.route", FAIL, "wrong route", "fix route")]
    d = prepare(vs)
    assert [(e["gate"], e["verdict"], e["action"], e["drain"]) for e in d] == [("fabric.link", FAIL, "FIX_LINK", True)]
    assert d[0]["explains"] == ["fabric.link-speed", "fabric.route"]


def test_roots_in_fix_order_fail_error_warn_then_catalog_order():
    vs = [V("gpu.processes", WARN, remedy="a"), V("gpu.errors", ERROR, remedy="b"), V("fabric.mtu", FAIL, remedy="c"),
          V("fabric.link", FAIL, remedy="d"), V("host.pcie", WARN, remedy="e")]
    d = prepare(vs)
    assert [e["gate"] for e in d] == ["fabric.link", "fabric.mtu", "gpu.errors", "gpu.processes", "host.pcie"]
    assert [e["explains"] for e in d] == [[], [], [], [], []]


def test_a_warn_dependency_explains_only_the_warn_of_a_gate_that_defers():
    # gpu.slow-state defers to gpu.processes: a busy GPU's inconclusive slow state is the busy GPU's
    d = prepare([V("gpu.processes", WARN, remedy="stop it"), V("gpu.slow-state", WARN, remedy="rerun")])
    assert [(e["gate"], e["explains"]) for e in d] == [("gpu.processes", ["gpu.slow-state"])]
    # a FAIL of the deferring gate is its own fault
    d = prepare([V("gpu.processes", WARN, remedy="stop it"), V("gpu.slow-state", FAIL, remedy="power cycle")])
    assert [e["gate"] for e in d] == ["gpu.slow-state", "gpu.processes"]
    # a gate of its own concern is not explained by a WARN dependency
    d = prepare([V("gpu.present", WARN, remedy="x"), V("gpu.errors", WARN, remedy="y")])
    assert [e["gate"] for e in d] == ["gpu.present", "gpu.errors"]


def test_one_remedy_and_action_is_one_fault():
    vs = [V("launch.capacity", FAIL, remedy="set it", action="SET_ENV"),
          V("launch.fabric-address", FAIL, remedy="set it", action="SET_ENV"),
          V("launch.memory-plan", FAIL, remedy="set it", action="RERUN")]
    d = diagnose(vs)
    assert [(e["gate"], e["explains"]) for e in d] == [("launch.fabric-address", ["launch.capacity"]),
                                                      ("launch.memory-plan", [])]
    # no remedy: never merged
    d = diagnose([V("launch.capacity", FAIL, remedy="", action="SET_ENV"),
                  V("launch.fabric-address", FAIL, remedy="", action="SET_ENV")])
    assert len(d) == 2


def test_a_not_judged_skip_is_listed_under_its_dependencys_root():
    vs = [V("fabric.link", FAIL, "down", "fix cable"), V("fabric.link-speed", WARN, "slow")]
    d = prepare(vs)
    assert d[0]["explains"] == ["fabric.link-speed"] and len(d) == 1


def test_passes_and_skips_are_no_fault():
    assert prepare([V("fabric.link", PASS), V("fabric.mtu", SKIP)]) == []
