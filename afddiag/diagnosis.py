"""The diagnosis: which failing gates are independent faults, each with one remedy and one typed
action, in the order to fix them, and which other gates each one explains.

The catalog (``checks/gates.toml``) gives every gate a default ``action`` from the closed set in
``[actions]``, the gates it ``depends`` on, and what it does when one of them FAILs
(``on_dependency_failure``: "own concern" — the gate's code judges only its own concern; "not
judged" — :func:`apply_dependencies` turns its FAIL/WARN into SKIP "not judged: <gate> failed",
pointing at that gate, so one fault never gets two remedies). Pure: verdicts in, verdicts out.
"""

from __future__ import annotations

from typing import Any

from afddiag.catalog import load
from afddiag.model import to_jsonable
from afddiag.verdict import ERROR, FAIL, SKIP, WARN, Verdict

NOT_JUDGED = "not judged"


def actions() -> dict[str, dict[str, Any]]:
    """The closed set of remedy types: ``{name: {"drain": bool, "meaning": str}}`` (gates.toml [actions])."""
    return load()["actions"]


def needs_drain(action: str) -> bool:
    """True when ``action`` leaves the node unfit for any job until a person acts (RESET_GPU,
    REBOOT, AC_POWER_CYCLE, HW_INSPECTION, FIX_LINK, ...); False for launch-setting fixes, reruns
    and NONE. An action outside the closed set is False (never drain on an unknown word)."""
    return bool(actions().get(action, {}).get("drain", False))


def drains(verdict: str, action: str | None) -> bool:
    """True when a verdict with ``action`` takes the node out until a person acts: a FAIL whose action
    needs a drain (:func:`needs_drain`). A WARN or ERROR never drains (no evidence of the cause yet).
    The one rule behind a diagnosis entry's ``drain`` and every ``[ACTION, drain]`` shown."""
    return verdict == FAIL and action is not None and needs_drain(action)


def _gate(gid: str) -> dict[str, Any]:
    return load()["gates"].get(gid, {})


def depends(gid: str) -> list[str]:
    """The gates ``gid`` declares it depends on (catalog ``depends``; [] when none)."""
    return list(_gate(gid).get("depends", []))


def fill_actions(verdicts: list[Verdict]) -> None:
    """Give every verdict its action: the gate's own choice when it set one, else the catalog's
    default for FAIL (``action``) or WARN (``warn_action``, else ``action``), RERUN for ERROR, NONE for
    PASS/SKIP. Raises ValueError for an action outside the closed set (a gate bug the tests catch)."""
    known = actions()
    for v in verdicts:
        if not v.action:
            if v.verdict == FAIL:
                v.action = _gate(v.id).get("action", "NONE")
            elif v.verdict == WARN:
                v.action = _gate(v.id).get("warn_action") or _gate(v.id).get("action", "NONE")
            elif v.verdict == ERROR:
                v.action = "RERUN"
            else:
                v.action = "NONE"
        if v.action not in known:
            raise ValueError(f"{v.id}: action {v.action!r} is not in checks/gates.toml [actions]")


def apply_dependencies(verdicts: list[Verdict]) -> None:
    """A gate marked ``on_dependency_failure = "not judged"`` whose dependency FAILed in this run
    says SKIP "not judged: <dependency> failed (...)" and points at it (what it would have said
    is kept in ``facts["judged_alone"]``); gates that judge their own concern are left as they are."""
    by_id = {v.id: v for v in verdicts}
    for v in verdicts:
        if _gate(v.id).get("on_dependency_failure") != NOT_JUDGED or v.verdict not in (FAIL, WARN):
            continue
        failed = [by_id[d] for d in depends(v.id) if d in by_id and by_id[d].verdict == FAIL]
        if not failed:
            continue
        d = failed[0]
        v.facts = {**v.facts, "judged_alone": {"verdict": v.verdict, "summary": v.summary, "remedy": v.remedy,
                                               "commands": v.commands}}
        v.verdict, v.action, v.commands = SKIP, "NONE", []
        v.summary = f"not judged: {d.id} failed ({d.summary})"
        v.remedy = f"fix {d.id} first (see its remedy), then re-run"


def diagnose(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """The independent faults, in the order to fix them: ``[{gate, verdict, summary, remedy, commands,
    action, drain, explains: [gate ids]}]``.

    A FAIL/ERROR/WARN gate is explained by a dependency (catalog ``depends``, followed to its root)
    that FAILed (or, for a WARN of a gate that defers to its dependencies, one that WARNed); the
    others are roots, each listed once with its one remedy. Roots that share the same remedy and
    action are one fault: the first (most severe) is kept and lists the others in ``explains``. Order: FAIL, then
    ERROR, then WARN; within each, catalog order (dependencies come first there)."""
    by_id = {v.id: v for v in verdicts}
    order = {gid: i for i, gid in enumerate(load()["gates"])}

    def explains(d: str, gid: str) -> bool:
        """A FAILed dependency explains any symptom; a WARN one explains a WARN of a gate that defers
        to its dependencies (a busy GPU's inconclusive slow state is the other processes' WARN)."""
        if d not in by_id:
            return False
        if by_id[d].verdict == FAIL:
            return True
        return (by_id[d].verdict == WARN and by_id[gid].verdict == WARN
                and _gate(gid).get("on_dependency_failure") == NOT_JUDGED)

    def root_of(gid: str, seen: frozenset = frozenset()) -> str:
        for d in depends(gid):
            if d not in seen and explains(d, gid):
                return root_of(d, seen | {gid})
        return gid

    bad = [v for v in verdicts if v.verdict in (FAIL, ERROR, WARN)]
    roots: dict[str, list[str]] = {}
    for v in bad:
        r = root_of(v.id)
        roots.setdefault(r, [])
        if r != v.id:
            roots[r].append(v.id)
    for v in verdicts:  # "not judged" gates point at their dependency too
        if v.verdict == SKIP and v.summary.startswith(f"{NOT_JUDGED}: "):
            dep = v.summary.split()[2]
            dep_root = root_of(dep) if dep in by_id else None
            if dep_root in roots and v.id not in roots[dep_root]:
                roots[dep_root].append(v.id)
    rank = {FAIL: 0, ERROR: 1, WARN: 2}
    out = []
    same: dict[tuple[str, str, tuple[str, ...]], dict[str, Any]] = {}  # (remedy, action, commands) -> its entry
    for gid in sorted(roots, key=lambda g: (rank[by_id[g].verdict], order.get(g, 999), g)):
        v = by_id[gid]
        key = (v.remedy, v.action, tuple(v.commands))
        first = same.get(key) if v.remedy else None
        if first is not None:  # one remedy, one action: one fault, named once at its first (most severe) entry
            first["explains"] = sorted({*first["explains"], gid, *roots[gid]}, key=lambda g: order.get(g, 999))
            continue
        out.append({"gate": gid, "verdict": v.verdict, "summary": v.summary, "remedy": v.remedy,
                    "commands": list(v.commands), "action": v.action, "drain": drains(v.verdict, v.action),
                    "explains": sorted(roots[gid], key=lambda g: order.get(g, 999))})
        if v.remedy:
            same[key] = out[-1]
    return out


def entries(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """The verdicts as a report's ``gates``: each one's fields and its ``drain`` (:func:`drains`), the
    same flag its tag and a diagnosis entry show."""
    return [{**to_jsonable(v), "drain": drains(v.verdict, v.action)} for v in verdicts]


def prepare(verdicts: list[Verdict]) -> list[dict[str, Any]]:
    """:func:`apply_dependencies`, :func:`fill_actions`, then :func:`diagnose` (what a report does)."""
    apply_dependencies(verdicts)
    fill_actions(verdicts)
    return diagnose(verdicts)

