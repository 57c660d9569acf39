"""``afddiag baseline record`` as a library call: :func:`record_here` measures this host and stores
its healthy figures (:func:`afddiag.baseline.record`), or says why they are no healthy baseline.

The runner's GPU probe (with the load probe) and CPU probe run, each under its time bound; a probe
that failed records nothing (exit 3); figures that are no healthy baseline (:mod:`afddiag.gates.refusals`)
are refused (exit 2) unless ``force`` records them marked forced. Kept apart from :mod:`afddiag.baseline`
(which the runner reads) so the runner and the baseline file's reader do not import each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afddiag import baseline, runner
from afddiag.exitcodes import EXIT_ERROR, EXIT_FAIL, EXIT_OK
from afddiag.gates.refusals import cpu_refusals, gpu_refusals
from afddiag.model.run import Inputs


@dataclass
class Recorded:
    """``code`` 0 recorded (``path``, ``data`` as stored), 2 refused (``refused``: why, one line each;
    ``problem``: a one-line reason nothing could be stored), 3 a probe failed (``failed``)."""

    code: int
    path: Path | None = None
    data: dict[str, Any] | None = None
    refused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    problem: str | None = None


def record_here(path: str | os.PathLike | None = None, budget_s: float = 3.0, force: bool = False,
                host: Any = None) -> Recorded:
    """Measure this host (``host``: :class:`~afddiag.probes.registry.Sources`, default this machine) and
    store the figures at ``path`` (default: the state directory's baseline.json). Raises OSError when
    the file cannot be written."""
    obs = runner.gather(Inputs(load=True, load_budget_s=budget_s, run_qp=False, families=frozenset({"gpu", "host"})),
                        host=host, only={"host", "gpu", "load", "cpu"})
    cpu = obs.cpu or {}
    failed = [f for f in (obs.gpu.failed if obs.gpu else None, obs.gpu.load_failed if obs.gpu else None,
                          cpu.get("failed")) if f]
    if failed:
        return Recorded(EXIT_ERROR, failed=failed)
    readings = (obs.gpu.readings if obs.gpu else None) or {}
    cpu_fig = {k: cpu[k] for k in baseline.CPU_FIGURES if cpu.get(k) is not None}
    cpu_refused = cpu_refusals(cpu)
    refused = gpu_refusals(readings) + cpu_refused
    if refused and not force:
        return Recorded(EXIT_FAIL, refused=refused)
    try:
        stored = baseline.record(readings, cpu_fig, obs.host, path, forced=refused if force else None,
                                 cpu_forced=cpu_refused if force else None)
    except ValueError as e:
        return Recorded(EXIT_FAIL, problem=str(e))
    data, _ = baseline.load(stored)
    return Recorded(EXIT_OK, stored, data, refused if force else [])
