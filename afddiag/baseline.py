"""Per-host baselines of healthy load figures, and the reference table used without one.

The baseline file lives in the user's state directory: ``$AFDDIAG_STATE_DIR``, else
``$XDG_STATE_HOME/afddiag``, else ``~/.local/state/afddiag``; ``--baseline PATH`` overrides it.
It is written atomically (temporary file + rename).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from afddiag.atomic import atomic_write, private_folder, written_by_others
from afddiag.reader import InputError, load_json

SCHEMA_VERSION = 1
#: The load probe's throughput figures (field names of ``afddiag.model.gpu.UnderLoad``; their units:
#: ``afddiag.model.gpu.THROUGHPUT_FIGURES``): the one list of their names.
THROUGHPUT_NAMES = ("fp32_tflops", "bf16_tflops", "gemv_gbps", "copy_gbps")
FIGURES = ("clock_sm_mhz_under_load", "power_mw_under_load", *THROUGHPUT_NAMES)

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


# What no GPU of the model can exceed (the vendor's dense peaks; memory figures count bytes read plus
# written, as the load probe does): a baseline above them is no measurement but a typo or a forgery, and
# would make every healthy run of the GPU look slow (gpu.slow-state FAIL, AC power cycle).
PEAK: dict[str, dict[str, Any]] = {
    "NVIDIA H200": {"fp32_tflops": 67.0, "bf16_tflops": 989.5, "gemv_gbps": 4800.0, "copy_gbps": 4800.0,
                    "source": "NVIDIA H200 SXM datasheet: FP32 67 TFLOPS, BF16 989.5 TFLOPS dense, HBM3e 4.8 TB/s"},
    "NVIDIA GB10": {"gemv_gbps": 273.0, "copy_gbps": 273.0,
                    "source": "NVIDIA DGX Spark datasheet: LPDDR5x 273 GB/s"},
}
PEAK_MARGIN = 1.10  # a throughput reading up to 10 % over the datasheet peak is kept (timer granularity)
CLOCK_MARGIN = 1.02  # an SM clock reading up to 2 % over NVML's maximum is kept


class IgnoredWhy(str):
    """Why a baseline file that is there was not used (others can write it): :func:`load`'s words, a
    ``str``; gpu.slow-state WARNs naming it (:mod:`afddiag.expect`), where an absent baseline is silent."""


def unreachable(figures: dict[str, Any], name: str | None, max_clock_mhz: float | None) -> list[str]:
    """The figures of one GPU's baseline that the GPU cannot reach, in words ([] when none): a
    figure that is not a positive finite number, an SM clock above ``max_clock_mhz`` (NVML's maximum,
    ``nvmlDeviceGetMaxClockInfo``), a throughput above :data:`PEAK` for the model ``name``. Pure."""
    out = []
    peak = PEAK.get(name or "") or {}
    for k in FIGURES:
        v = figures.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            out.append(f"{k} {v!r} is not a positive number")
        elif (k == "clock_sm_mhz_under_load" and isinstance(max_clock_mhz, (int, float)) and max_clock_mhz > 0
              and v > CLOCK_MARGIN * max_clock_mhz):
            out.append(f"{k} {v:g} MHz is above the GPU's maximum SM clock {max_clock_mhz:g} MHz")
        elif isinstance(peak.get(k), (int, float)) and v > PEAK_MARGIN * peak[k]:
            out.append(f"{k} {v:g} is above the {name} peak {peak[k]:g} ({peak['source']})")
    return out


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
    words on why none). A file others can write (or in a folder another user owns or can write) is
    not read: the words are an :class:`IgnoredWhy`. Never raises, except with ``strict`` (a file the
    user named): a file that is there but refused (too big, nested too deep, not JSON, a device) or
    of another format raises :class:`afddiag.reader.InputError`, one line naming it."""
    p = Path(path) if path else default_path()

    unsafe = written_by_others(p, sticky_ok=path is not None)
    if unsafe:
        return None, IgnoredWhy(f"baseline {p} ignored: {unsafe}, so anyone could set the figures the GPU is "
                                "judged by; record it again with `afddiag baseline record` (written 0644 in a "
                                "folder of yours)")
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
    out.update({k: ach.get(k) for k in THROUGHPUT_NAMES})
    return {k: v for k, v in out.items() if isinstance(v, (int, float))}


FLOOR_FRACTION = 0.8  # a figure below 80 % of the reference table's for the model is no healthy baseline


CPU_FIGURES = ("loop_mops", "loop_mops_on_cpu", "loop_samples_mops", "loop_on_cpu", "under_load_mhz", "max_mhz")


def record(readings: Mapping[str, Any], cpu: dict[str, Any] | None, host: str,
           path: str | os.PathLike | None = None, forced: list[str] | None = None,
           cpu_forced: list[str] | None = None) -> Path:
    """Write the healthy figures of every GPU that has under-load readings (keyed by UUID) and the
    CPU's, with kernel/driver/BIOS versions. ``forced``: every refusal (:mod:`afddiag.gates.refusals`)
    overridden by ``--force`` (recorded as ``forced``/``forced_over``, and named
    wherever the baseline is used); ``cpu_forced``: those of them that are the CPU's
    (recorded on the CPU figures as ``forced_over``, which host.cpu-clock names).
    Returns the path. Raises OSError when it cannot write, ValueError when there is nothing to record
    or a figure is one the GPU cannot reach (:func:`unreachable`)."""
    gpus = {}
    impossible = []
    for d in readings.get("devices") or []:
        ul = d.get("under_load")
        if isinstance(ul, dict) and not ul.get("why") and d.get("uuid"):
            gpus[d["uuid"]] = {"name": d.get("name"), **from_under_load(ul)}
            nvml = d.get("nvml") if isinstance(d.get("nvml"), dict) else {}
            impossible += [f"GPU {d['uuid']}: {why}" for why in
                           unreachable(gpus[d["uuid"]], d.get("name"), nvml.get("clock_sm_max_mhz"))]
    if impossible:
        raise ValueError("not recorded, even with --force: figures the GPU cannot reach: " + "; ".join(impossible))
    if not gpus and not cpu:
        raise ValueError("nothing to record: the load probe gave no figures (see `afddiag gpu --load`)")
    data: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "host": host,
                            "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                            "versions": {"driver": readings.get("driver_version"), **(readings.get("versions") or {})},
                            "gpus": gpus, "cpu": cpu or {}}
    if forced:
        data["forced"], data["forced_over"] = True, list(forced)
    if cpu_forced and data["cpu"]:
        data["cpu"] = {**data["cpu"], "forced_over": list(cpu_forced)}

    if path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
    else:
        p = private_folder(state_dir()) / "baseline.json"

    with atomic_write(p, device_ok=path is not None) as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    return p


def for_gpu(uuid: str | None, name: str | None, host_baseline: dict[str, Any] | None,
            snapshot_baseline: dict[str, Any] | None,
            max_clock_mhz: float | None = None) -> tuple[dict[str, Any], str, str]:
    """The baseline figures to judge one GPU by, their source, and what was ignored on the way ("" when
    nothing), in order of precedence: the host's recorded baseline (by UUID), the snapshot's
    ``expect.baseline``, the reference table (by model). A host or snapshot baseline holding a figure
    the GPU cannot reach (:func:`unreachable`: an SM clock above ``max_clock_mhz``, a throughput above
    the model's peak) is ignored whole and the next source used."""
    ignored: list[str] = []
    hb = host_baseline or {}
    gpus = hb.get("gpus")
    if isinstance(gpus, dict) and uuid and isinstance(gpus.get(uuid), dict):
        figures = {k: v for k, v in gpus[uuid].items()  # a hand-edited file may hold anything
                   if k == "name" or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v)}
        bad = unreachable(figures, name, max_clock_mhz)
        if not bad:
            return figures, (f"host baseline {hb.get('path')} ({hb.get('recorded_at')}"
                             + (", FORCED over: " + "; ".join(hb.get("forced_over") or ["?"])
                                if hb.get("forced") else "") + ")"), ""
        ignored.append(f"host baseline {hb.get('path')} ignored for this GPU: {'; '.join(bad)}")
    if snapshot_baseline:
        bad = unreachable(snapshot_baseline, name, max_clock_mhz)
        if not bad:
            return snapshot_baseline, "snapshot expect.baseline", "; ".join(ignored)
        ignored.append(f"snapshot expect.baseline ignored: {'; '.join(bad)}")
    ref = REFERENCE.get(name or "")
    if ref:
        return ({k: v for k, v in ref.items() if k != "source"}, f"reference table for {name}: {ref['source']}",
                "; ".join(ignored))
    return {}, "", "; ".join(ignored)
