"""The JSON report document of one run (schema ``afddiag/schema/report.schema.json``): built by the runner
from the verdicts and facts; the reporters (:data:`afddiag.report.REPORTERS`) render it."""

from __future__ import annotations

import datetime as _dt
from typing import TYPE_CHECKING, Any, cast

from afddiag import __version__
from afddiag.diagnosis import entries, prepare
from afddiag.endpoint import device_map
from afddiag.envvars import redact_report
from afddiag.model import to_jsonable
from afddiag.model.report import Report
from afddiag.verdict import VERDICTS, Verdict, exit_code

if TYPE_CHECKING:
    from afddiag.model.fabric import FabricFacts


SCHEMA_VERSION = 1


def build(verdicts: list[Verdict], host: str, source: str, inputs: dict[str, Any],
          fabric: FabricFacts | None, notes: list[str] | None = None,
          facts: dict[str, Any] | None = None, expectations: dict[str, Any] | None = None) -> Report:
    """The JSON report (schema ``afddiag/schema/report.schema.json``, ``schema_version`` 1).

    Gates whose dependency failed are settled first and every verdict gets its typed action
    (:func:`afddiag.diagnosis.prepare`); ``diagnosis`` lists the independent faults in fix order."""
    diagnosis = prepare(verdicts)
    counts = {v: 0 for v in VERDICTS}
    for v in verdicts:
        counts[v.verdict] += 1
    return cast(Report, redact_report({  # no credential (by name or by shape) leaves in a report
        "schema_version": SCHEMA_VERSION,
        "afddiag_version": __version__,
        "host": host,
        "source": source,
        "generated_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "inputs": inputs,
        "diagnosis": diagnosis,
        "gates": entries(verdicts),
        "device_map": _device_map(fabric),
        "counts": counts,
        "exit_code": exit_code(verdicts),
        "notes": list(notes or []),
        "facts": to_jsonable(facts or {}),
        "expectations": to_jsonable(expectations or {}),
    }))


def _device_map(fabric: FabricFacts | None) -> dict[str, str]:
    return {} if fabric is None else device_map(fabric)
