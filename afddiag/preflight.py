"""The launch hook as library calls: :func:`preflight` judges the role's gates and decides fit or not;
:func:`settle_node` drains or resumes this Slurm node as that verdict needs.

Fit: exit 0 unless a gate FAILs or ERRORs (or WARNs, with ``strict``); with ``exit_for="drain"``
only a fault whose typed action needs the node drained makes it not fit. With ``export`` the launch is
judged as it will be: the launch env with the lines :mod:`afddiag.endpoint` derives laid over it
(:func:`afddiag.runner.judge_with_exports`); the result's report is that one (the one to keep in
history). ``inputs`` is the seam: a snapshot judged as this node's own data (the CLI refuses
``--drain``/``--resume`` with a snapshot).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from afddiag import runner, slurm
from afddiag.check import diagnose
from afddiag.inputs import FAMILIES
from afddiag.model.report import Report
from afddiag.model.run import Inputs
from afddiag.termsafe import one_line

SLURM_TIMEOUT_S = 30.0  # scontrol/sinfo bound when no --timeout is given


@dataclass
class PreflightOptions:
    """How to judge and what to do: ``strict`` (WARN is not fit), ``exit_for`` ("any" or "drain"),
    ``export`` (judge with the printed exports), ``drain``/``resume`` (act on this Slurm node)."""

    strict: bool = False
    exit_for: str = "any"
    export: bool = False
    drain: bool = False
    resume: bool = False


@dataclass
class PreflightResult:
    """The verdict: ``report`` (the JSON report whose verdicts give the code), ``verdict_code`` (its exit
    code, 1 made 0 without ``strict``: not 0 means not fit), ``code`` (the exit code: with
    ``exit_for="drain"``, 0 unless a fault needs the node drained), ``role``, ``host`` (escaped for a
    terminal, one line each), ``faults`` (the diagnosis entries that make the host not fit, escaped), ``needs_drain``
    (those whose action needs the node drained), ``warned`` (gate ids that WARNed), ``export``
    (:func:`afddiag.runner.judge_with_exports`' record; None without ``export``)."""

    options: PreflightOptions
    report: Report
    verdict_code: int
    code: int
    role: str
    host: str
    faults: list[dict[str, Any]] = field(default_factory=list)
    needs_drain: list[dict[str, Any]] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)
    export: dict[str, Any] | None = None
    timeout_s: float | None = None

    @property
    def fit(self) -> bool:
        """No fault stops the launch (the report may still WARN without ``strict``)."""
        return self.verdict_code == 0


def preflight(inputs: Inputs, options: PreflightOptions | None = None) -> PreflightResult:
    """Judge the role's gates (every family) on this host or ``inputs.snapshot`` → :class:`PreflightResult`.
    Raises :class:`~afddiag.collect.SnapshotError` / :class:`~afddiag.reader.InputError` for a refused
    snapshot or baseline file."""
    opts = options or PreflightOptions()
    inputs = dataclasses.replace(inputs, families=FAMILIES["preflight"])
    rep, obs = diagnose(inputs)
    ex = None
    if opts.export:  # judge the launch as it will be: the launch env with the printed lines laid over it
        rep, obs, ex = runner.judge_with_exports(inputs, obs, rep)
    shown = one_line({"diagnosis": rep.get("diagnosis", []), "host": rep["host"], "gates": rep["gates"],
                      "role": rep["inputs"]["role"]})  # host and playbook text: escaped, one line each
    verdict = rep["exit_code"]
    if verdict == 1 and not opts.strict:
        verdict = 0
    faults = [d for d in shown["diagnosis"] if d["verdict"] in ("FAIL", "ERROR")
              or (opts.strict and d["verdict"] == "WARN")] if verdict else []
    needs = [d for d in faults if d.get("drain")]
    code = 0 if verdict and opts.exit_for == "drain" and not needs else verdict
    warned = [g["id"] for g in shown["gates"] if g["verdict"] == "WARN"]
    return PreflightResult(opts, rep, verdict, code, shown["role"], shown["host"], faults, needs, warned,
                           ex, inputs.probe_timeout_s)


def settle_node(result: PreflightResult) -> None:
    """Act on this Slurm node as ``result`` needs (:mod:`afddiag.slurm`, which says on stderr what it
    did): ``drain`` a node with a fault whose action needs it drained (a drain someone else set is never
    overwritten); ``resume`` a node afddiag drained when no fault left needs a drain."""
    opts, t = result.options, result.timeout_s or SLURM_TIMEOUT_S
    if opts.drain and result.needs_drain:
        slurm.drain_node([f"{d['gate']}: {d['summary']}" for d in result.needs_drain], timeout_s=t)
    if opts.resume and not result.needs_drain:
        slurm.resume_node(timeout_s=t)
