"""Per-host baselines of healthy load figures, and the reference table used without one.

The baseline file lives in the user's state directory: ``$AFDDIAG_STATE_DIR``, else
``$XDG_STATE_HOME/afddiag``, else ``~/.local/state/afddiag``; ``--baseline PATH`` overrides it.
It is written atomically (temporary file + rename).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
FIGURES = ("clock_sm_mhz_under_load", "power_mw_under_load", "fp32_tflops", "bf16_tflops", "gemv_gbps", "copy_gbps")

# Healthy figures by GPU model (NVML name), for hosts without a recorded baseline. Throughput figures
# are the load probe's own (other tools measure other things); unknown figures are left out.
REFERENCE: dict[str, dict[str, Any]] = {
    "NVIDIA H200": {
        "clock_sm_mhz_under_load": 1980, "fp32_tflops": 64.8, "bf16_tflops": 648.0, "gemv_gbps": 4515.8,
        "copy_gbps": 3911.0,
        "source": "afddiag load probe on a lent H200, 2026-11-30 (benchmarks/results/h200-gpu-load.txt)",
    },
    "NVIDIA GB10": {
        "clock_sm_mhz_under_load": 2395, "power_mw_under_load": 92500,
        "source": "healthy DGX Spark under load, 2385-2405 MHz at ~92.5 W (model-serving-minefield PR 55); "
                  "throughput needs a recorded baseline (`afddiag baseline record`)",
    },
}


def state_dir() -> Path:
    """The user's afddiag state directory (not created here)."""
    if os.environ.get("AFDDIAG_STATE_DIR"):
        return Path(os.environ["AFDDIAG_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "afddiag"


def default_path() -> Path:
    return state_dir() / "baseline.json"


def load(path: str | os.PathLike | None = None, strict: bool = False) -> tuple[dict[str, Any] | None, str]:
    """Read a baseline file (through the bounded reader, :mod:`afddiag.reader`) → (baseline or None,
    words on why none). Never raises, except with ``strict`` (a file the user named): a file that is
    there but refused (too big, nested too deep, not JSON, a device) or of another format raises
    :class:`afddiag.reader.InputError`, one line naming it."""
    from afddiag.reader import InputError, load_json

    p = Path(path) if path else default_path()
    try:
        data = load_json(p, max_bytes=16 << 20)
    except FileNotFoundError:
        return None, f"no baseline recorded ({p})"
    except InputError as e:
        if strict:
            raise InputError(f"baseline {e}: record it again with `afddiag baseline record`") from None
        return None, f"baseline {p} unreadable ({e}): record it again with `afddiag baseline record`"
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        why = f"baseline {p} has another format: record it again with `afddiag baseline record`"
        if strict:
            raise InputError(why)
        return None, why
    data["path"] = str(p)
    return data, ""


def from_under_load(ul: dict[str, Any]) -> dict[str, Any]:
    """A load probe's under-load readings → baseline figures (units in the names)."""
    ach = ul.get("achieved") or {}
    out = {"clock_sm_mhz_under_load": ul.get("clock_sm_mhz"), "power_mw_under_load": ul.get("power_mw")}
    out.update({k: ach.get(k) for k in ("fp32_tflops", "bf16_tflops", "gemv_gbps", "copy_gbps")})
    return {k: v for k, v in out.items() if isinstance(v, (int, float))}


FLOOR_FRACTION = 0.8  # a figure below 80 % of the reference table's for the model is no healthy baseline


def refusals(readings: dict[str, Any]) -> list[str]:
    """Why the GPU probe's readings (with the load probe's ``under_load``) must not
    become this host's healthy baseline; [] when they may:

    - no GPU was seen, or no GPU gave load figures;
    - the GPU is busy with another job (gpu.slow-state's evidence: other compute processes in NVML,
      utilization just before the load probe);
    - a GPU gate FAILs on them (clock events, Xid/ECC errors, the slow state against the reference table);
    - a figure is below :data:`FLOOR_FRACTION` of the reference table's for the model.

    Pure: judges the readings with the GPU gates, touches nothing."""
    from afddiag.endpoint import resolve_fabric_ip
    from afddiag.gates import Context
    from afddiag.gates import gpu as gates_gpu
    from afddiag.model.gpu import gpu_facts_from_readings
    from afddiag.model.run import Inputs, Observation
    from afddiag.verdict import FAIL

    facts = gpu_facts_from_readings(readings)
    if not facts.devices:
        return [f"no GPU seen ({facts.why or 'NVML and CUDA list none'}): a baseline without a GPU compares nothing"]
    out: list[str] = []
    loaded = [d for d in facts.devices if d.under_load is not None]
    if not loaded:
        whys = "; ".join(sorted({d.load_why for d in facts.devices if d.load_why})) or "no figures"
        return [f"the load probe gave no figures ({whys})"]
    for d in facts.devices:
        busy = gates_gpu.gpu_busy(d, facts)
        if busy:
            out.append(f"GPU {d.index} {d.name or '?'} is busy ({'; '.join(busy)}): its figures are a share of the GPU")
    ctx = Context(Observation("baseline", "baseline record", gpu=facts), Inputs(), resolve_fabric_ip(None, None))
    for gid, fn in gates_gpu.GATES:
        if gid in ("gpu.slow-state", "gpu.clock-events", "gpu.errors"):
            v = fn(ctx)
            if v.verdict == FAIL:
                out.append(f"{gid} FAILs: {v.summary}")
    for d in loaded:
        ref = REFERENCE.get(d.name or "") or {}
        fig = from_under_load({"clock_sm_mhz": d.under_load.clock_sm_mhz, "power_mw": d.under_load.power_mw,
                               "achieved": {k: getattr(d.under_load, k) for k in
                                            ("fp32_tflops", "bf16_tflops", "gemv_gbps", "copy_gbps")}})
        for k, v in fig.items():
            r = ref.get(k)
            if k != "power_mw_under_load" and isinstance(r, (int, float)) and v < FLOOR_FRACTION * r:
                out.append(f"GPU {d.index} {d.name}: {k} {v:g} is below the reference table's floor "
                           f"{FLOOR_FRACTION * r:g} ({FLOOR_FRACTION:.0%} of {r:g} for this model)")
    return list(dict.fromkeys(out))


CPU_FIGURES = ("loop_mops", "loop_mops_on_cpu", "loop_samples_mops", "loop_on_cpu", "under_load_mhz", "max_mhz")


def cpu_refusals(cpu: dict[str, Any] | None) -> list[str]:
    """Why the CPU probe's facts (:func:`afddiag.probes.cpu.read_cpu`) must not become this host's
    CPU baseline; [] when they may (or when there are none to record):

    - the loop ran on a busy host (:func:`afddiag.gates.host.cpu_contention`: samples that lost their
      core, samples that disagree, a load average at the CPU count): a noisy rate compared later
      makes every healthy run look fast or slow;
    - host.cpu-clock FAILs on them (the clock under load stuck low, nothing explaining it): judged
      by the gate itself (generic playbook, no baseline), so the two never disagree.

    Pure: judges the facts with the host gates, touches nothing."""
    from afddiag.endpoint import resolve_fabric_ip
    from afddiag.gates import Context
    from afddiag.gates import host as gates_host
    from afddiag.model.run import Inputs, Observation
    from afddiag.verdict import FAIL

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


def record(readings: dict[str, Any], cpu: dict[str, Any] | None, host: str,
           path: str | os.PathLike | None = None, forced: list[str] | None = None,
           cpu_forced: list[str] | None = None) -> Path:
    """Write the healthy figures of every GPU that has under-load readings (keyed by UUID) and the
    CPU's, with kernel/driver/BIOS versions. ``forced``: every refusal (:func:`refusals` and
    :func:`cpu_refusals`) overridden by ``--force`` (recorded as ``forced``/``forced_over``, and named
    wherever the baseline is used); ``cpu_forced``: those of them that are :func:`cpu_refusals`
    (recorded on the CPU figures as ``forced_over``, which host.cpu-clock names).
    Returns the path. Raises OSError when it cannot write, ValueError when there is nothing to record."""
    gpus = {}
    for d in readings.get("devices") or []:
        ul = d.get("under_load")
        if isinstance(ul, dict) and not ul.get("why") and d.get("uuid"):
            gpus[d["uuid"]] = {"name": d.get("name"), **from_under_load(ul)}
    if not gpus and not cpu:
        raise ValueError("nothing to record: the load probe gave no figures (see `afddiag gpu --load`)")
    data = {"schema_version": SCHEMA_VERSION, "host": host,
            "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "versions": {"driver": readings.get("driver_version"), **(readings.get("versions") or {})},
            "gpus": gpus, "cpu": cpu or {}}
    if forced:
        data["forced"], data["forced_over"] = True, list(forced)
    if cpu_forced and data["cpu"]:
        data["cpu"] = {**data["cpu"], "forced_over": list(cpu_forced)}
    p = Path(path) if path else default_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    from afddiag.atomic import atomic_write

    with atomic_write(p, device_ok=path is not None) as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return p


def for_gpu(uuid: str | None, name: str | None, host_baseline: dict[str, Any] | None,
            snapshot_baseline: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    """The baseline figures to judge one GPU by, and their source, in order of precedence: the host's
    recorded baseline (by UUID), the snapshot's ``expect.baseline``, the reference table (by model)."""
    gpus = host_baseline.get("gpus") if host_baseline else None
    if isinstance(gpus, dict) and uuid and isinstance(gpus.get(uuid), dict):
        figures = {k: v for k, v in gpus[uuid].items()  # a hand-edited file may hold anything
                   if k == "name" or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v)}
        return figures, (f"host baseline {host_baseline.get('path')} ({host_baseline.get('recorded_at')}"
                         + (", FORCED over: " + "; ".join(host_baseline.get("forced_over") or ["?"])
                            if host_baseline.get("forced") else "") + ")")
    if snapshot_baseline:
        return snapshot_baseline, "snapshot expect.baseline"
    ref = REFERENCE.get(name or "")
    if ref:
        return ({k: v for k, v in ref.items() if k != "source"}, f"reference table for {name}: {ref['source']}")
    return {}, ""
