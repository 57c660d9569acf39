"""Test fakes in one place: facts built directly (no host, no snapshot) and one way to judge them.

``judge`` reaches a gate by its id through the gate registry (the ids and verdicts are the stable
seam; which function implements a gate may move), fills in the typed action as a report does, and
returns the verdict. ``observation`` never reads the host: every probe's facts are None (not probed)
unless given.
"""

from __future__ import annotations

from typing import Any

from afddiag.diagnosis import fill_actions
from afddiag.expect import Expectations, Expected
from afddiag.gates import Context, registry, resolve_fabric_ip
from afddiag.model.run import Inputs, Observation
from afddiag.verdict import Verdict


def observation(source: str = "live", **facts: Any) -> Observation:
    """An observation of host "h" holding only ``facts`` (fabric=, gpu=, cpu=, limits=, ...)."""
    return Observation("h", source, **facts)


def context(obs: Observation, fabric_ip: str | None = None, expectations: Expectations | None = None,
            **inputs: Any) -> Context:
    """What a gate sees: ``obs``, the inputs (``Inputs`` fields), the fabric IP resolved as a run does."""
    return Context(obs, Inputs(fabric_ip=fabric_ip, **inputs), resolve_fabric_ip(obs.fabric, fabric_ip),
                   expectations)


def gate(gate_id: str):
    """The registered gate function of ``gate_id``."""
    for gid, _family, fn in registry():
        if gid == gate_id:
            return fn
    raise KeyError(f"{gate_id}: no such gate in the registry")


def judge(gate_id: str, obs: Observation, **kw: Any) -> Verdict:
    """Gate ``gate_id`` judged on ``obs`` (``kw`` as for :func:`context`), its typed action filled in."""
    v = gate(gate_id)(context(obs, **kw))
    assert v.id == gate_id
    fill_actions([v])
    return v


def gpu_baselines(**per_index: dict[str, float]) -> Expectations:
    """Expectations holding GPU baselines: ``gpu_baselines(i0={"fp32_tflops": 100.0})``."""
    return Expectations(gpu_baselines={int(k[1:]): Expected(v, "snapshot expect.baseline")
                                       for k, v in per_index.items()})
