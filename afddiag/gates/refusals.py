"""Why readings must not become this host's healthy baseline (``afddiag baseline record``'s refusals).

Judged with the gates themselves (generic playbook, no baseline), so a refusal and a later run's
verdict never disagree. Pure: nothing here touches the host or the baseline file
(:mod:`afddiag.baseline` stores it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from afddiag import baseline
from afddiag.endpoint import resolve_fabric_ip
from afddiag.gates import Context
from afddiag.gates import gpu as gates_gpu
from afddiag.gates import host as gates_host
from afddiag.gates.gpu_load import gpu_busy
from afddiag.model.gpu import THROUGHPUT_FIGURES, GpuReadings, gpu_facts_from_readings
from afddiag.model.run import Inputs, Observation
from afddiag.verdict import FAIL


def gpu_refusals(readings: GpuReadings | Mapping[str, Any]) -> list[str]:
    """Why the GPU probe's readings (with the load probe's ``under_load``) must not
    become this host's healthy baseline; [] when they may:

    - no GPU was seen, or no GPU gave load figures;
    - the GPU is busy with another job (gpu.slow-state's evidence: other compute processes in NVML,
      utilization just before the load probe);
    - a GPU gate FAILs on them (clock events, Xid/ECC errors, the slow state against the reference table);
    - a figure is below :data:`afddiag.baseline.FLOOR_FRACTION` of the reference table's for the model;
    - a figure the GPU cannot reach (:func:`afddiag.baseline.unreachable`; ``record`` refuses it even forced).

    Pure: judges the readings with the GPU gates, touches nothing."""
    facts = gpu_facts_from_readings(readings)
    if not facts.devices:
        return [f"no GPU seen ({facts.why or 'NVML and CUDA list none'}): a baseline without a GPU compares nothing"]
    out: list[str] = []
    loaded = [d for d in facts.devices if d.under_load is not None]
    if not loaded:
        whys = "; ".join(sorted({d.load_why for d in facts.devices if d.load_why})) or "no figures"
        return [f"the load probe gave no figures ({whys})"]
    for d in facts.devices:
        busy = gpu_busy(d, facts)
        if busy:
            out.append(f"GPU {d.index} {d.name or '?'} is busy ({'; '.join(busy)}): its figures are a share of the GPU")
    ctx = Context(Observation("baseline", "baseline record", gpu=facts), Inputs(), resolve_fabric_ip(None, None))
    for gate_id, fn in gates_gpu.GATES:
        if gate_id in ("gpu.slow-state", "gpu.clock-events", "gpu.errors"):
            v = fn(ctx)
            if v.verdict == FAIL:
                out.append(f"{gate_id} FAILs: {v.summary}")
    for d in loaded:
        ref = baseline.REFERENCE.get(d.name or "") or {}
        ul = d.under_load
        assert ul is not None  # loaded: the GPUs with under-load figures
        fig = baseline.from_under_load({"clock_sm_mhz": ul.clock_sm_mhz, "power_mw": ul.power_mw,
                                        "achieved": {k: getattr(ul, k) for k, _ in THROUGHPUT_FIGURES}})
        out += [f"GPU {d.index} {d.name or '?'}: {why}"
                for why in baseline.unreachable(fig, d.name, d.clock_sm_max_mhz)]
        for k, v in fig.items():
            r = ref.get(k)
            if k != "power_mw_under_load" and isinstance(r, (int, float)) and v < baseline.FLOOR_FRACTION * r:
                out.append(f"GPU {d.index} {d.name}: {k} {v:g} is below the reference table's floor "
                           f"{baseline.FLOOR_FRACTION * r:g} ({baseline.FLOOR_FRACTION:.0%} of {r:g} for this model)")
    return list(dict.fromkeys(out))


def cpu_refusals(cpu: dict[str, Any] | None) -> list[str]:
    """Why the CPU probe's facts (:func:`afddiag.probes.cpu.read_cpu`) must not become this host's
    CPU baseline; [] when they may (or when there are none to record):

    - the loop ran on a busy host (:func:`afddiag.gates.host.cpu_contention`: samples that lost their
      core, samples that disagree, a load average at the CPU count): a noisy rate compared later
      makes every healthy run look fast or slow;
    - host.cpu-clock FAILs on them (the clock under load stuck low, nothing explaining it): judged
      by the gate itself (generic playbook, no baseline), so the two never disagree.

    Pure: judges the facts with the host gates, touches nothing."""
    if not cpu or cpu.get("why") or cpu.get("failed") or not isinstance(cpu.get("loop_mops"), (int, float)):
        return []
    out = []
    busy = gates_host.cpu_contention(cpu)
    if busy:
        out.append(f"CPU loop {cpu['loop_mops']:g} Mop/s measured on a busy host ({'; '.join(busy)}): "
                   "record it when the host is idle")
    ctx = Context(Observation("baseline", "baseline record", cpu=cpu), Inputs(), resolve_fabric_ip(None, None))
    v = gates_host.cpu_clock(ctx)
    if v.verdict == FAIL:
        out.append(f"{v.id} FAILs: {v.summary}")
    return out
