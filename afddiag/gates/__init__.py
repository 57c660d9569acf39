"""Gates judge facts into verdicts. They never touch the host.

One explicit, ordered registry (:data:`REGISTRY`); each gate is a pure function of a
:class:`Context` and returns one :class:`~afddiag.verdict.Verdict` for the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from afddiag.endpoint import FabricIp, resolve_fabric_ip  # noqa: F401 - the one place that decides
from afddiag.model.run import Inputs, Observation
from afddiag.verdict import ERROR, SKIP, Verdict



@dataclass
class Context:
    """Everything a gate may look at: the facts of one run and what the user asked."""

    obs: Observation
    inputs: Inputs
    fabric_ip: FabricIp
    expectations: Any = None  # afddiag.expect.Expectations; resolved on first use when not given

    @property
    def expect(self):
        """What the gates judge against, each value with its source (:func:`afddiag.expect.resolve`)."""
        if self.expectations is None:
            from afddiag.expect import resolve

            self.expectations = resolve(self.inputs, self.obs)
        return self.expectations

    @property
    def playbook(self):
        """The role's playbook (generic when none was given)."""
        from afddiag.playbook import Playbook

        return self.inputs.playbook or Playbook()

    def requires(self, what: str) -> bool:
        """True when the role needs ``what`` ("gpu", "rdma"): its absence FAILs instead of SKIP."""
        return what in self.playbook.requires


Gate = Callable[[Context], Verdict]

PROBE_FAILED_REMEDY = ("run again; if it repeats, the host is stuck where the summary says (a hung driver call or "
                       "sysfs read: check dmesg); a slow but healthy host needs a larger --timeout or playbook "
                       "[timeouts] value")


def probe_failed(gid: str, *facts: Any) -> Verdict | None:
    """The shared preamble: ERROR naming what the probe was doing when one of ``facts`` (facts
    objects or dicts with a ``failed`` field) says its probe timed out or crashed; else None."""
    for f in facts:
        why = f.get("failed") if isinstance(f, dict) else getattr(f, "failed", None)
        if why:
            return Verdict(gid, ERROR, f"not judged: {why}", PROBE_FAILED_REMEDY, {"probe_failed": why})
    return None


def not_probed(gid: str, facts: Any, what: str, remedy_text: str) -> Verdict | None:
    """The preamble of a gate fed by one probe: ERROR when ``facts`` say the probe timed out or
    crashed (:func:`probe_failed`); SKIP when they are None or not captured, naming why (their
    ``notes``, else "<what> not probed") with ``remedy_text``; None when the gate can judge."""
    if (v := probe_failed(gid, facts)) is not None:
        return v
    if facts is None or not getattr(facts, "captured", True):
        notes = getattr(facts, "notes", None) or []
        return Verdict(gid, SKIP, "; ".join(notes) if notes else f"{what} not probed", remedy_text)
    return None


# "fleet" gates judge several hosts' reports (afddiag/gates/fleet.py, signature (hosts, expect)); only
# `afddiag fleet`/`merge` run them, never run_gates (no per-host command asks for that family).
FAMILY_ORDER = ("fabric", "gpu", "host", "launch", "fleet")


def registry(families: set[str] | None = None) -> list[tuple[str, str, Gate]]:
    """Ordered ``(gate id, family, function)``: fabric, GPU, host, then launch gates (only the
    modules of ``families`` are imported when given)."""
    import importlib

    out = []
    for fam in FAMILY_ORDER:
        if families is None or fam in families:
            out += [(gid, fam, fn) for gid, fn in importlib.import_module(f"afddiag.gates.{fam}").GATES]
    return out


def run_gates(ctx: Context, families: set[str]) -> list[Verdict]:
    """Run the registered gates of ``families`` that the role's playbook runs; a gate that raises
    gives ERROR, never a traceback."""
    out: list[Verdict] = []
    for gid, family, fn in registry(families):
        if not ctx.playbook.runs(gid):
            continue
        try:
            out.append(fn(ctx))
        except Exception as e:  # noqa: BLE001 - a bug in one gate must not hide the others
            out.append(Verdict(gid, ERROR, f"{gid}: gate failed on these facts ({type(e).__name__}: {e})",
                               "report this as an afddiag bug with `afddiag all --json` attached"))
    return out
