"""The host report's JSON shape (schema: ``afddiag/schema/report.schema.json``, ``schema_version`` 1), typed.

:func:`afddiag.report.build` makes a :class:`Report`; the runner adds its ``summary``
(:class:`afddiag.model.summary.Summary`) and, for a pair test, ``pair``. A report read back from a
file or a peer is checked against the schema first (:func:`afddiag.schema.validate.report_problem`).
"""

from __future__ import annotations

from typing import Any, TypedDict

from afddiag.model.summary import Summary, VerdictName


class GateEntry(TypedDict):
    """One gate's verdict in ``gates``: ``facts`` is the gate's own (free-form) record of what it saw;
    ``remedy`` the prose and ``commands`` the complete shell commands to run, in order (each one line
    ``bash -n`` accepts, the host's values quoted; [] where no safe command exists); ``action`` its
    typed remedy (``checks/gates.toml`` ``[actions]``) and ``drain`` whether it takes the node out
    (:func:`afddiag.diagnosis.drains`)."""

    id: str
    verdict: VerdictName
    summary: str
    remedy: str
    facts: dict[str, Any]
    action: str
    commands: list[str]
    drain: bool


class _DiagnosisRequired(TypedDict):
    gate: str
    summary: str
    remedy: str
    commands: list[str]
    action: str
    explains: list[str]


class DiagnosisEntry(_DiagnosisRequired, total=False):
    """One independent fault in ``diagnosis`` (fix order); ``explains``: the gates that follow from it."""

    verdict: VerdictName
    drain: bool


class _ReportRequired(TypedDict):
    schema_version: int
    afddiag_version: str
    host: str
    source: str  # "live" or "snapshot <dir>"
    gates: list[GateEntry]
    device_map: dict[str, str]  # fabric IPv4 address -> RDMA device
    counts: dict[str, int]  # PASS, WARN, FAIL, SKIP, ERROR
    exit_code: int


class Report(_ReportRequired, total=False):
    """One host's report (``inputs``: what the run was given and resolved; ``facts``: the probes'
    facts by probe name; ``expectations``: what the gates judged against, with sources)."""

    generated_at: str
    inputs: dict[str, Any]
    diagnosis: list[DiagnosisEntry]
    notes: list[str]
    facts: dict[str, Any]
    expectations: dict[str, Any]
    summary: Summary
    pair: dict[str, Any] | None
