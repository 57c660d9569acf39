"""Gates judge facts into verdicts. They never touch the host.

A gate is declared once, by :func:`gate` over its judging function (``@gate("fabric.link")``
``def link(ctx, gate_id)``): that is the only place its id is written in code. Its family is the
id's prefix; its title, remedy, dependencies and place in the order are its entry in the catalog
(``checks/gates.toml``). Each family module's ``GATES`` is derived from the declarations
(:func:`declared`) and :func:`registry` orders them as the catalog does. A host gate is a pure
function of a :class:`Context` and returns one :class:`~afddiag.verdict.Verdict` for the host.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from afddiag import catalog
from afddiag.endpoint import FabricIp, resolve_fabric_ip  # noqa: F401 - the one place that decides
from afddiag.expect import Expectations, resolve
from afddiag.model.run import Inputs, Observation
from afddiag.playbook import Playbook
from afddiag.verdict import ERROR, SKIP, Verdict


@dataclass
class Context:
    """Everything a gate may look at: the facts of one run and what the user asked."""

    obs: Observation
    inputs: Inputs
    fabric_ip: FabricIp
    expectations: Expectations | None = None  # resolved on first use when not given

    @property
    def expect(self) -> Expectations:
        """What the gates judge against, each value with its source (:func:`afddiag.expect.resolve`)."""
        if self.expectations is None:
            self.expectations = resolve(self.inputs, self.obs)
        return self.expectations

    @property
    def playbook(self) -> Playbook:
        """The role's playbook (generic when none was given)."""
        return self.inputs.playbook or Playbook()

    def requires(self, what: str) -> bool:
        """True when the role needs ``what`` ("gpu", "rdma"): its absence FAILs instead of SKIP."""
        return what in self.playbook.requires


Gate = Callable[[Context], Verdict]

PROBE_FAILED_REMEDY = ("run again; if it repeats, the host is stuck where the summary says (a hung driver call or "
                       "sysfs read: check dmesg); a slow but healthy host needs a larger --timeout or playbook "
                       "[timeouts] value")


def probe_failed(gate_id: str, *facts: Any) -> Verdict | None:
    """The shared preamble: ERROR naming what the probe was doing when one of ``facts`` (facts
    objects or dicts with a ``failed`` field) says its probe timed out or crashed; else None."""
    for f in facts:
        why = f.get("failed") if isinstance(f, dict) else getattr(f, "failed", None)
        if why:
            return Verdict(gate_id, ERROR, f"not judged: {why}", PROBE_FAILED_REMEDY, {"probe_failed": why})
    return None


def not_probed(gate_id: str, facts: Any, what: str, remedy_text: str) -> Verdict | None:
    """The preamble of a gate fed by one probe: ERROR when ``facts`` say the probe timed out or
    crashed (:func:`probe_failed`); SKIP when they are None or not captured, naming why (their
    ``notes``, else "<what> not probed") with ``remedy_text``; None when the gate can judge."""
    if (v := probe_failed(gate_id, facts)) is not None:
        return v
    if facts is None or not getattr(facts, "captured", True):
        notes = getattr(facts, "notes", None) or []
        return Verdict(gate_id, SKIP, "; ".join(notes) if notes else f"{what} not probed", remedy_text)
    return None


F = TypeVar("F")  # a probe's facts


def probed(gate_id: str, facts: F | None, what: str, remedy_text: str) -> F | Verdict:
    """:func:`not_probed` that hands back what it checked: the Verdict to return, else ``facts``
    themselves, not None (a gate's preamble: ``p = probed(...)``; ``if isinstance(p, Verdict): return p``)."""
    if facts is None:
        return Verdict(gate_id, SKIP, f"{what} not probed", remedy_text)
    return not_probed(gate_id, facts, what, remedy_text) or facts


# "fleet" gates judge several hosts' reports (afddiag/gates/fleet.py, signature (hosts, expect)); only
# `afddiag fleet`/`merge` run them, never run_gates (no per-host command asks for that family).
FAMILY_ORDER = ("fabric", "gpu", "host", "launch", "fleet")


# The modules that declare each family's gates (imported by name, so a run loads only its families').
FAMILY_MODULES = {"fabric": ("fabric", "rail", "nic"), "gpu": ("gpu",), "host": ("host", "aer", "known_bad"),
                  "launch": ("launch", "nccl", "engine"), "fleet": ("fleet",)}

_DECLARED: dict[str, dict[str, Callable[..., Verdict]]] = {}  # module name -> {gate id: gate}, declaration order


def gate(gate_id: str) -> Callable[[Callable[..., Verdict]], Callable[..., Verdict]]:
    """Declare the gate ``gate_id`` (``"<family>.<name>"``): ``@gate(gate_id)`` over ``judge(*args,
    gate_id)`` gives back ``gate(*args)`` (a host gate's args are ``(ctx,)``, a fleet gate's ``(fleet,
    expect)``) and lists it in its module's :func:`declared`."""
    def declare(judge: Callable[..., Verdict]) -> Callable[..., Verdict]:
        @functools.wraps(judge)
        def judged(*args: Any) -> Verdict:
            return judge(*args, gate_id)

        judged.gate_id = gate_id  # type: ignore[attr-defined]
        clash = [m for m, gates in _DECLARED.items() if gate_id in gates and m != judge.__module__]
        if clash:
            raise ValueError(f"gate {gate_id} declared twice: in {clash[0]} and {judge.__module__}")
        _DECLARED.setdefault(judge.__module__, {})[gate_id] = judged
        return judged
    return declare


def declared(module: str) -> list[tuple[str, Callable[..., Verdict]]]:
    """``(gate id, gate)`` of every gate ``module`` declared, in declaration order (its ``GATES``)."""
    return list(_DECLARED.get(module, {}).items())


def registry(families: set[str] | None = None) -> list[tuple[str, str, Gate]]:
    """Ordered ``(gate id, family, function)``: fabric, GPU, host, launch, then fleet gates, each
    family in the catalog's order (only the modules of ``families`` are imported when given)."""
    order = {gate_id: i for i, gate_id in enumerate(catalog.load()["gates"])}
    out = []
    for fam in FAMILY_ORDER:
        if families is None or fam in families:
            gates = [(gate_id, fam, fn) for mod in FAMILY_MODULES[fam]
                     for gate_id, fn in importlib.import_module(f"afddiag.gates.{mod}").GATES]
            out += sorted(gates, key=lambda g: order.get(g[0], len(order)))
    return out


def run_gates(ctx: Context, families: set[str]) -> list[Verdict]:
    """Run the registered gates of ``families`` that the role's playbook runs (of them, the ones
    ``--gate`` asked for, ``ctx.inputs.gates``, when given); a gate that raises gives ERROR, never a traceback."""
    out: list[Verdict] = []
    for gate_id, _family, fn in registry(families):
        if not ctx.playbook.runs(gate_id) or (ctx.inputs.gates is not None and gate_id not in ctx.inputs.gates):
            continue
        try:
            out.append(fn(ctx))
        except Exception as e:  # noqa: BLE001 - a bug in one gate must not hide the others
            out.append(Verdict(gate_id, ERROR, f"{gate_id}: gate failed on these facts ({type(e).__name__}: {e})",
                               "report this as an afddiag bug with `afddiag all --json` attached"))
    return out
