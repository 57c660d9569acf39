"""One judged run of this host or a snapshot: what ``afddiag fabric|gpu|all`` do, as library calls.

:func:`diagnose` gathers and judges the gates of some families (:func:`afddiag.runner.diagnose`);
:func:`check` is a command's run: the CUDA driver started early where the GPU probe will need it,
the run judged, the report returned for the caller to keep (:func:`afddiag.history.record_run`) and
print (:data:`afddiag.report.REPORTERS`). Raises :class:`~afddiag.collect.SnapshotError` or
:class:`~afddiag.reader.InputError` for a snapshot or a ``--baseline`` file that is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from afddiag import catalog, progress, runner
from afddiag.inputs import FAMILIES
from afddiag.model.report import Report
from afddiag.model.run import Inputs, Observation
from afddiag.probes import gpu as gpu_probe


def diagnose(inputs: Inputs, families: Iterable[str] | None = None) -> tuple[Report, Observation]:
    """:func:`afddiag.runner.diagnose` for the gates of ``families`` (default ``inputs.families``) →
    ``(JSON report, observation)``. The progress bar (one a timed-out probe left open) is stopped
    before the caller prints."""
    if families is not None:
        inputs = dataclasses.replace(inputs, families=frozenset(families))
    try:
        return runner.diagnose(inputs)
    finally:
        progress.stop()


def check(command: str, inputs: Inputs) -> Report:
    """The run of ``afddiag <command>`` (``fabric``, ``gpu``, ``all``) → its JSON report. A live run whose
    GPU probe needs the CUDA driver (:func:`afddiag.probes.gpu.cuda_reason`) starts it first, in the
    background. With ``inputs.gates`` (``--gate``) only their families' gates run."""
    families = FAMILIES[command]
    if inputs.gates is not None:  # --gate: only the families of the gates asked for (and their dependencies)
        cat = catalog.load()["gates"]
        families = frozenset(f for f in families if any(cat[g].get("family") == f for g in inputs.gates))
    inputs = dataclasses.replace(inputs, families=families)
    if "gpu" in inputs.families and not inputs.snapshot and gpu_probe.cuda_reason(inputs):
        gpu_probe.preinit_cuda()  # the CUDA driver initialises while the host and fabric probes run
    rep, _ = diagnose(inputs)
    return rep
