"""The runner: one loop over the probe registry for a live run, a capture and a replay, then the gates.

``diagnose(inputs) -> (report, observation)`` is what every command runs (fabric, gpu, all,
preflight, devicemap): the probes of ``inputs.families`` (:data:`afddiag.probes.registry.PROBES`,
each under its time bound; a probe that times out or crashes records why and the run goes on),
the fabric IP resolved once (:mod:`afddiag.endpoint`), the gates, the JSON report.
:func:`capture` runs the same probes' live reads and returns the bundle's files. The CLI only
parses options and renders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from afddiag import __version__, baseline, collect, document, endpoint, expect, summary
from afddiag.bundle import is_bundle
from afddiag.collect import Progress, SnapshotError
from afddiag.gates import Context, run_gates
from afddiag.inputs import checked_store, stored_note, to_store, with_stored
from afddiag.model.found import DeviceSelectors
from afddiag.model.report import Report
from afddiag.model.run import Inputs, Observation
from afddiag.probes import registry
from afddiag.verdict import FAIL, Verdict


def gather(inputs: Inputs, host: Any = None, only: set[str] | None = None) -> Observation:
    """The facts of one run: this host (``host``: :class:`~afddiag.probes.registry.Sources`, default
    this machine) or, when ``inputs.snapshot`` names a folder, the snapshot (a capture bundle is
    opened by :func:`observe` first). Only the probes feeding ``inputs.families`` run (of them, only
    the probes named in ``only`` when given, and for a run of some gates, ``inputs.gates``, only those
    they read: :func:`afddiag.probes.registry.probes_for`). Raises
    :class:`~afddiag.collect.SnapshotError` when the snapshot folder does not exist."""
    if inputs.snapshot:
        root = Path(inputs.snapshot)
        if not root.is_dir():
            raise SnapshotError(f"snapshot {root}: not a directory or capture bundle (give a folder holding "
                                f"{registry.layout_hint()}, or a capture bundle FILE.tar.gz from `afddiag capture`)")
        if not registry.recognizes(root, inputs.families):
            raise SnapshotError(f"snapshot {root}: holds nothing afddiag recognizes: a snapshot holds any of "
                                f"{registry.snapshot_parts()} (`afddiag capture` writes one)")
        obs = Observation(host=root.name, source=f"snapshot {root}")
        inputs = _stored_inputs(inputs, obs, root)
        run = registry.Run(inputs, obs, root=root)
    else:
        obs = Observation(host=os.uname().nodename, source="live")  # as socket.gethostname()
        run = registry.Run(inputs, obs, host=host or registry.Sources.live())
    part_s = inputs.timeout("fabric_s")  # one snapshot part's read: --timeout bounds it too
    wanted = registry.probes_for(inputs.gates) if inputs.gates is not None else None  # --gate: what they read
    for p in registry.probes(inputs.families, run, wanted):
        if (only is not None and p.name not in only) or not p.wanted(run):
            continue
        if p.live_only and not run.live:
            _set(obs, p.replay(run) if p.replay else {})
            continue
        progress = Progress()
        readings: dict[str, Any] = {}

        def step(p=p, progress=progress, readings=readings) -> dict[str, Any]:
            readings.update(p.read(run, progress) if run.root is None else registry.load(p, run.root, part_s))
            if readings.get("refused"):  # a snapshot part that is there but refused: its gates say ERROR
                return p.failed("; ".join(readings["refused"]))
            return p.facts(run, readings, progress)

        what = p.what if run.live else f"{p.what} (snapshot)"
        fields, failed = collect.guarded(step, p.bound_s(run), what, progress)
        if failed:
            fields = p.failed(failed)
            if p.name == "route":
                obs.notes.append(failed)
        elif not run.live and p.name not in ("fabric", "route"):
            obs.notes.extend(readings.get("notes") or [])
        run.readings[p.name] = readings
        _set(obs, fields or {})
        if p.name == "fabric":  # once a run: the QP walk, route and reach probes and the gates read it
            obs.fabric_ip = endpoint.fabric_ip_of(inputs, obs.fabric)
    if inputs.families & {"gpu", "host"}:
        _load_baseline(obs, inputs)
    return obs


def _stored_inputs(inputs: Inputs, obs: Observation, root: Path) -> Inputs:
    """A replay's inputs: those the capture kept (``inputs.json``, checked) where the flags give none;
    ``obs.stored_inputs`` keeps them for :func:`judge`, and a note names what was taken or refused."""
    stored, why = registry.load_inputs(root, inputs.timeout("fabric_s"))
    if stored is not None:
        stored, why = checked_store(stored)
    obs.stored_inputs = stored
    inputs = with_stored(inputs, stored)
    obs.notes.extend(n for n in (why, stored_note(inputs)) if n)
    return inputs


def _set(obs: Observation, fields: dict[str, Any]) -> None:
    """Put a probe's facts on ``obs``: each field set, except ``notes``, appended to the run's notes."""
    for k, v in fields.items():
        if k == "notes":
            obs.notes.extend(v)
        else:
            setattr(obs, k, v)


def _load_baseline(obs: Observation, inputs: Inputs) -> None:
    """The host's recorded baseline: live runs read the state directory's (or --baseline); a
    snapshot replay reads only an explicit --baseline, since this machine's baseline is not the
    captured host's (replays give the same verdicts anywhere)."""
    if inputs.snapshot and not inputs.baseline_path:
        obs.baseline, obs.baseline_why = None, "a replay uses no local baseline (give --baseline to compare)"
        return
    obs.baseline, obs.baseline_why = baseline.load(inputs.baseline_path, strict=bool(inputs.baseline_path))


@contextlib.contextmanager
def opened(inputs: Inputs):
    """``inputs`` with a capture bundle (``.tar.gz``) snapshot extracted safely to a temporary folder
    (removed on exit); a folder or a live run as is. Raises :class:`~afddiag.collect.SnapshotError`
    for a bundle that is missing or refused."""
    if inputs.snapshot and not os.path.isdir(inputs.snapshot) and is_bundle(inputs.snapshot):
        with collect.opened_snapshot(inputs.snapshot) as root:  # bounded by bundle.EXTRACT_TIMEOUT_S
            yield dataclasses.replace(inputs, snapshot=root)
    else:
        yield inputs


def observe(inputs: Inputs, host: Any = None, only: set[str] | None = None) -> Observation:
    """:func:`gather`, a capture bundle opened first (its source named as the bundle)."""
    with opened(inputs) as inp:
        obs = gather(inp, host, only)
    if inp.snapshot != inputs.snapshot:
        obs.source = f"snapshot {inputs.snapshot}"
    return obs


def diagnose(inputs: Inputs, host: Any = None) -> tuple[Report, Observation]:
    """Gather (:func:`gather`), resolve the fabric IP, run the gates of ``inputs.families`` →
    ``(JSON report, observation)``. A capture bundle (``.tar.gz``) is extracted safely once and its
    folder named as the bundle in the report. Raises :class:`~afddiag.collect.SnapshotError` for a
    snapshot that does not exist or a bundle that is refused."""
    with opened(inputs) as inp:
        obs = gather(inp, host)
        rep = judge(inp, obs)
    if inp.snapshot != inputs.snapshot:
        obs.source = rep["source"] = f"snapshot {inputs.snapshot}"
        rep = collect.relabel(rep, inp.snapshot, str(inputs.snapshot))
    return rep, obs


def judge(inputs: Inputs, obs: Observation) -> Report:
    """The gates of ``inputs.families`` over ``obs`` → the JSON report (its ``facts``:
    :func:`afddiag.probes.registry.report_facts`)."""
    return judged(inputs, obs)[0]


def judged(inputs: Inputs, obs: Observation) -> tuple[Report, list[Verdict]]:
    """:func:`judge`, with the verdicts the report was made of (settled; each with what its gate worked out,
    typed: ``Verdict.found``)."""
    inputs = with_stored(inputs, obs.stored_inputs)  # a replay: the capture's inputs where flags give none
    fip = obs.fabric_ip or endpoint.fabric_ip_of(inputs, obs.fabric)  # no fabric probe ran: the given one
    expected = expect.resolve(inputs, obs, fip)  # once, before any gate runs
    verdicts = run_gates(Context(obs, inputs, fip, expected), set(inputs.families))
    notes = list(obs.notes) + (obs.fabric.notes if obs.fabric else []) + (obs.gpu.notes if obs.gpu else [])
    rep = document.build(
        verdicts, obs.host, obs.source,
        {"fabric_ip": fip.ip, "fabric_ip_source": fip.source, "peers": list(inputs.peers),
         "expect_sm": inputs.expect_sm, "snapshot": inputs.snapshot, "env_source": obs.env_source,
         "env": obs.env, "role": (inputs.playbook.name if inputs.playbook else "generic"),
         "launch_env": inputs.launch_env_path, "expect_capacity": inputs.expect_capacity,
         "sources": {**inputs.sources, "role": inputs.role_source or inputs.sources.get("role", "")},
         **({"gates": sorted(inputs.gates)} if inputs.gates is not None else {})},
        obs.fabric, notes, registry.report_facts(obs),
        expectations={k: v for k, v in vars(expected).items() if v not in (None, {})})
    rep["summary"] = summary.from_run(inputs, obs, (fip.ip, fip.source), verdicts, rep["device_map"])  # fleet
    return rep, verdicts


def failed_selectors(verdicts: list[Verdict]) -> list[str]:
    """The variables ``fabric.devicemap-env`` FAILed on (its typed findings,
    :class:`~afddiag.model.found.DeviceSelectors`); [] when it did not FAIL."""
    for v in verdicts:
        if v.id == "fabric.devicemap-env" and v.verdict == FAIL and isinstance(v.found, DeviceSelectors):
            return list(v.found.failed_vars)
    return []


def judge_with_exports(inputs: Inputs, obs: Observation, rep: Report) -> tuple[Report, Observation, dict]:
    """The launch as it will be after the launcher evaluates ``afddiag preflight --export``'s lines:
    the exports :mod:`afddiag.endpoint` derives from ``obs`` and ``rep`` (a variable the launch env
    already sets is kept unless ``fabric.devicemap-env`` FAILed on that variable: :func:`failed_selectors`
    of the gates judged over ``obs`` again, pure; ``NCCL_IB_GID_INDEX`` paired
    with the ``NCCL_IB_HCA`` in effect) are laid over the judged env and the gates judge again (pure:
    nothing is read twice). Returns ``(report, observation, export)`` where ``export`` is
    ``{"pairs": [(name, value)] to print, "kept": [names], "replaced": [names the env sets that
    fabric.devicemap-env FAILed on, printed corrected], "notes": [lines], "fixed": [gate ids that
    FAILed or ERRORed before and do not after]}``; with nothing to print, ``rep`` and ``obs`` as given.
    A fault the exports do not fix still fails the second report."""
    fip = rep["inputs"]["fabric_ip"]
    pairs = endpoint.launch_exports(obs.fabric, fip)
    failed = failed_selectors(judged(inputs, obs)[1])  # afddiag's value replaces those only
    pairs, kept = endpoint.exports_to_print(pairs, obs.env, failed)
    pairs, notes = endpoint.pair_gid_with_hca(obs.fabric, fip, obs.env, pairs, kept)
    replaced = [k for k, _ in pairs if (obs.env or {}).get(k, "").strip()]  # set, FAILed on: corrected
    export = {"pairs": pairs, "kept": kept, "replaced": replaced, "notes": notes, "fixed": [],
              "env_source": obs.env_source}
    if not pairs:
        return rep, obs, export
    env = {**(obs.env or {}), **dict(pairs)}
    sources = {**(obs.env_sources or {}), **{k: "preflight --export" for k, _ in pairs}}
    after = dataclasses.replace(obs, env=env, env_source=f"{obs.env_source} with preflight --export's lines",
                                env_sources=sources, notes=list(obs.notes))
    rep2 = judge(inputs, after)
    before = {g["id"]: g["verdict"] for g in rep["gates"]}
    export["fixed"] = [g["id"] for g in rep2["gates"] if before.get(g["id"]) in ("FAIL", "ERROR")
                       and g["verdict"] not in ("FAIL", "ERROR")]
    return rep2, after, export


def capture(inputs: Inputs, host: Any = None, timeout_s: float = 10.0) -> tuple[dict[str, bytes], str, list[str]]:
    """Read everything the probes read (every probe a capture can hold: the QP walk aside) from
    ``host`` (default this machine) → (``{relative path: bytes}``, host name, notes).

    Each probe runs under ``timeout_s``; one that fails or times out leaves its files out (a tree
    is merged only when it was read whole) and a note. Never raises for a host problem."""
    obs = Observation(host="unknown", source="capture")
    run = registry.Run(inputs, obs, host=host or registry.Sources.live(), capturing=True)
    files: dict[str, bytes] = {}
    notes: list[str] = []
    for p in registry.probes(run=run):
        if p.live_only or not p.wanted(run):
            continue
        progress = Progress()
        part: dict[str, bytes] = {}
        part_notes: list[str] = []
        readings: dict[str, Any] = {}

        def step(p=p, progress=progress, part=part, part_notes=part_notes, readings=readings) -> dict[str, Any]:
            readings.update(p.read(run, progress))
            registry.dump(p, readings, part)
            if p.copy is not None:
                p.copy(run, readings, part, part_notes)
            return p.facts(run, readings, progress) if p.name == "host" else {}

        fields, failed = collect.guarded(step, timeout_s, p.what, progress)
        if failed:
            notes.append(failed)
            continue
        run.readings[p.name] = readings
        files.update(part)
        notes.extend(part_notes + list(readings.get("notes") or []))
        _set(obs, fields or {})
    files.setdefault("host", b"unknown\n")
    registry.dump_inputs(to_store(inputs), files)  # what a replay judges against unless its flags say otherwise
    files[registry.CAPTURE_MANIFEST] = (json.dumps(
        {"afddiag_version": __version__, "host": obs.host,
         "captured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
         "order_source": (run.readings.get("fabric") or {}).get("order_source", "failed"),
         "files": sorted(files) + [registry.CAPTURE_MANIFEST], "notes": notes}, indent=2, default=str) + "\n").encode()
    return files, obs.host, notes
