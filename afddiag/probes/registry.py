"""The probe registry: the ordered list of every probe afddiag runs, and the snapshot's load/dump.

A probe lives in one module, ``afddiag/probes/<x>.py``: its reading and its :class:`Probe` (what it
reads live, its artifacts in a capture bundle, how readings become facts, its failure record, its
tree copy). This module holds the types they share (:class:`Sources`, :class:`Run`,
:class:`Probe`, :class:`Artifact`), :data:`PROBES` (one :class:`Entry` each: its module, the gate
families it feeds) and the only code that turns artifacts into files and back (:func:`load`,
:func:`dump`). A run imports only the modules of the probes its families need
(:func:`probes`): a `gpu` run never loads the fabric probe, so never the fabric models.

Readings are a dict keyed by artifact name holding what the file holds (parsed JSON, text; for a
tree the folder it is read under: ``/`` live, the snapshot folder in a replay), plus any extra keys
the probe wants to pass from ``read`` to ``facts`` (a source label, notes). The runner
(:mod:`afddiag.runner`) makes one loop of them:

- a live run: ``facts(run, read(run))`` for each wanted probe, each under its time bound;
- a capture: ``read(run)`` then the artifacts into the bundle (``copy`` for trees);
- a replay: the artifacts loaded from the snapshot folder (absent: None), then ``facts``.

How to add a probe
------------------
1. ``afddiag/probes/<name>.py``: the reading (bounded where it can block, recording why it could not
   read instead of raising, its host sources taken as arguments so a test points it at a fake tree)
   and ``PROBE = Probe(name, what, timeout, artifacts, read, facts, failed, ...)`` (the fields'
   docstring below). ``read`` reaches the host only through a :class:`Sources` field (None: not
   read; :meth:`Sources.live` sets it), so a test's ``Sources()`` never reads this machine.
2. Its facts: a dataclass in ``afddiag/model/`` (units in field names, ``failed``/``notes``) and a
   field on :class:`afddiag.model.run.Observation` (named as the probe when ``report`` is set: the
   JSON report's ``facts`` carry it, :func:`report_facts`).
3. Here: one :class:`Entry` in :data:`PROBES` (order matters: a probe may use an earlier one's
   facts) and, when it reads a new host source, a :class:`Sources` field (default None) named in
   :meth:`Sources.live`.
4. Tests: readings → facts (table-driven), a snapshot folder holding the artifact, a capture round
   trip (``tests/test_capture.py``; fakes in ``tests/fakes.py``), and the gates the facts feed.
"""

from __future__ import annotations

import fnmatch
import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afddiag import reader
from afddiag.endpoint import given_fabric_ip
from afddiag.model.run import Inputs, Observation, wants_load
from afddiag.probes import sysfs

# ---------------------------------------------------------------------------------------------
# Where live readings come from


class _Live:
    """Marker: read this host (every field of :meth:`Sources.live`)."""

    def __repr__(self) -> str:
        return "LIVE"


LIVE: Any = _Live()


@dataclass
class Sources:
    """Where a live run or a capture reads from. Every field defaults to None: that part is not read
    (``Sources()`` reads nothing of this machine: what a test does not fake stays unread);
    :meth:`Sources.live` reads this host (``LIVE``); a function replaces the source (tests, fakes).

    ``root``: the filesystem root sysfs and procfs are read under (``<root>/sys/class/...``; None: no
    tree is read). ``device_order() -> (list[(name, index)] | None, source, notes)``;
    ``addresses() -> {netdev: Netdev}`` (raises on failure); ``gpu() -> GPU readings dict``;
    ``memreg() -> the memory-registration readings``; ``pcie() -> the PCIe link readings``; ``limits() -> limits
    dict``; ``cpu() -> dict``; ``route() -> ip -j route JSON`` (raises on failure); ``rules() -> ip -j
    rule JSON``; ``rdma_core() -> {"version", "source"}``; ``pair() -> the pair test's JSON`` (a live
    run has none unless ``afddiag fabric --pair/--serve`` hands its result in); ``image() -> (inspect
    JSON, engine, why)`` (``docker|podman image inspect`` of the launch env's AFD_IMAGE); ``reach() ->
    the control-plane connects' readings`` (TCP connects to the peers' engine ports); ``qp``: LIVE walks QPs on the
    fabric probe's devices (pyverbs), a function ``(fabric, fabric_ip, peers, timeout_s) -> QpFacts``
    replaces the walk; ``environ``: the
    process environment (filtered by :func:`afddiag.probes.env.env_allowed`); ``hostname()``;
    ``kernel_log() -> text``: the kernel log the NIC probe takes its lines from (LIVE: ``/dev/kmsg``);
    ``reader(path) -> str`` reads one sysfs file (raises OSError as the kernel answers; None: the
    ordinary read under ``root``).
    """

    root: str | None = None
    device_order: Any = None
    addresses: Any = None
    gpu: Any = None
    memreg: Any = None
    pcie: Any = None
    limits: Any = None
    cpu: Any = None
    route: Any = None
    rules: Any = None
    rdma_core: Any = None
    pair: Any = None
    image: Any = None
    reach: Any = None
    qp: Any = None
    environ: Any = None  # Mapping[str, str] | LIVE (os.environ) | None
    hostname: Any = None  # () -> str | LIVE (uname(2) nodename, as socket.gethostname()) | None
    kernel_log: Any = None  # () -> the kernel log's text | LIVE (/dev/kmsg, or --xid-log) | None: the NIC's lines
    reader: Callable[[str], str] | None = None

    @classmethod
    def live(cls, **replace: Any) -> Sources:
        """This host: every source read live, under ``/`` (no pair test result); ``replace`` sets fields."""
        kw: dict[str, Any] = {k: LIVE for k in ("device_order", "addresses", "gpu", "memreg", "pcie", "limits",
                                                  "cpu", "route", "rules", "rdma_core", "environ", "hostname",
                                                  "image", "reach", "qp", "kernel_log")}
        return cls(root="/", **{**kw, **replace})


def read_source(src: Any, live: Callable[[], Any]) -> Any:
    """One :class:`Sources` field's reading: None when the field is None (not read), ``live()`` when
    it is ``LIVE``, else the replacement's answer."""
    if src is None:
        return None
    return live() if src is LIVE else src()


@dataclass
class Run:
    """One pass over the registry: what was asked, where to read, what was seen so far.

    ``host`` is set for a live run or a capture, ``root`` (the snapshot folder) for a replay.
    ``obs`` fills as probes finish (a later probe may use an earlier one's facts: the route probe
    reads the fabric's netdevs); ``readings`` keeps every probe's readings by probe name.
    """

    inputs: Inputs
    obs: Observation
    host: Sources | None = None
    root: Path | None = None
    capturing: bool = False
    readings: dict[str, dict[str, Any]] = field(default_factory=dict)
    confined: Callable[[str], str] | None = None  # the snapshot's sysfs reader, made on first use

    @property
    def live(self) -> bool:
        return self.root is None

    @property
    def src(self) -> Sources:
        """Where a live read reads from (``host``: a probe's ``read`` runs only in a live run or a capture)."""
        if self.host is None:
            raise RuntimeError("a probe read the host in a replay")
        return self.host

    @property
    def sys_root(self) -> str | None:
        """The folder sysfs/procfs paths are read under: the snapshot's, or the host's ``root`` (None: none)."""
        return str(self.root) if self.root is not None else (self.host.root if self.host else None)

    def fabric_ip(self) -> str | None:
        """The run's fabric IP, resolved once right after the fabric probe (:func:`afddiag.endpoint.fabric_ip_of`);
        before it (a capture keeps no facts), the one the operator named."""
        fip = self.obs.fabric_ip
        return fip.ip if fip is not None else given_fabric_ip(self.inputs)[0]

    def launch_value(self, key: str) -> str | None:
        return (self.inputs.launch_env or {}).get(key)

    def read(self, path: str) -> str:
        """One sysfs/procfs file's stripped text: through ``host.reader`` when a test gives one, the
        snapshot's confined reader in a replay (:func:`afddiag.reader.confined_reader`), else
        :func:`afddiag.probes.sysfs.read_text`. Raises OSError as the kernel answers."""
        if self.host is not None and self.host.reader is not None:
            return self.host.reader(path)
        if self.root is None:
            return sysfs.read_text(path)
        if self.confined is None:  # a snapshot: regular files inside it only
            self.confined = reader.confined_reader(self.root, sysfs.read_text)
        return self.confined(path)

    def try_read(self, path: str) -> str | None:
        """:meth:`read`, None when it fails."""
        try:
            return self.read(path)
        except (OSError, UnicodeError, ValueError):
            return None


# ---------------------------------------------------------------------------------------------
# What a probe is


@dataclass(frozen=True)
class Artifact:
    """One entry of a capture bundle / snapshot folder: ``kind`` "json", "text" or "tree"."""

    name: str
    kind: str = "json"
    max_bytes: int | None = None  # a text file's cap (default: afddiag.reader.MAX_TEXT_BYTES)


def _always(run: Run) -> bool:
    return True


@dataclass(frozen=True)
class Probe:
    """One probe, defined in its own module as ``PROBE`` (or a named constant).

    ``name``: its key in a run's readings (its :class:`Entry`'s name); ``what``: words for a timeout
    message; ``timeout``: an :meth:`Inputs.timeout` key or a function of the run; ``artifacts``: file
    names in a bundle; ``read(run, progress) -> readings`` (set ``progress.doing`` before a call that
    may block); ``facts(run, readings, progress) -> {Observation field: value}`` (a replay's readings
    may be None: say "not captured"; a ``notes`` list is appended to the run's notes, not set);
    ``failed(why) -> {field: facts with failed=why}``; ``wanted(run)``: whether this run needs it;
    ``copy(run, readings, files, notes)``: a tree's files into a bundle; ``live_only``: nothing to
    capture (``replay(run)`` says so in a replay); ``report(value)``: what the report's facts carry
    of its Observation field (default: the value).
    """

    name: str
    what: str
    timeout: str | Callable[[Run], float]
    artifacts: tuple[Artifact, ...]
    read: Callable[[Run, Any], dict[str, Any]]
    facts: Callable[[Run, dict[str, Any], Any], dict[str, Any]]
    failed: Callable[[str], dict[str, Any]]
    wanted: Callable[[Run], bool] = _always
    copy: Callable[[Run, dict[str, Any], dict[str, bytes], list[str]], None] | None = None
    live_only: bool = False
    replay: Callable[[Run], dict[str, Any]] | None = None
    report: Callable[[Any], Any] | None = None

    def bound_s(self, run: Run) -> float:
        return self.timeout(run) if callable(self.timeout) else run.inputs.timeout(self.timeout)


@dataclass(frozen=True)
class Entry:
    """One line of :data:`PROBES`: the probe's ``name``, where it lives (``module``, or
    ``module:NAME`` for a module holding several), the gate ``families`` it feeds (empty: every run),
    whether the report's ``facts`` carry its Observation field of the same name (``report``),
    ``when(run)``: whether this run needs it at all, asked before its module is imported (None: always;
    a probe whose module is heavy stays unloaded in a run that does not need it), the gates whose facts
    it gathers (``feeds``: globs on gate ids, empty: every run, as ``families``) and the earlier probes
    whose facts it reads (``needs``): a run of some gates (``--gate``, :func:`probes_for`) runs only the
    probes they read."""

    name: str
    module: str
    families: frozenset[str] = frozenset()
    report: bool = False
    when: Callable[[Run], bool] | None = None
    feeds: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()

    def runs_for(self, families: frozenset[str] | set[str]) -> bool:
        return not self.families or bool(self.families & set(families))

    def probe(self) -> Probe:
        """The module's :class:`Probe` (the module is imported now, once)."""
        module, _, attr = self.module.partition(":")
        return getattr(importlib.import_module(module), attr or "PROBE")


def load_probe_runs(run: Run) -> bool:
    """Whether the GPU load probe has work in ``run``: a replay reads what a capture kept of it
    (its artifact, when there); a live run or a capture runs it for --load or a playbook that turns
    it on (:func:`afddiag.model.run.wants_load`)."""
    return not run.live or wants_load(run.inputs)


_EVERY: frozenset[str] = frozenset()
PROBES: tuple[Entry, ...] = (
    Entry("host", "afddiag.probes.hostname"),
    Entry("env", "afddiag.probes.env"),
    Entry("limits", "afddiag.probes.launch:LIMITS", frozenset({"launch"}),
          feeds=("launch.memlock", "launch.uverbs-access")),
    Entry("image", "afddiag.probes.launch:IMAGE", frozenset({"launch", "gpu"}),
          feeds=("gpu.image-arch", "gpu.sm-count")),  # the image's SM-count label is an expectation
    Entry("fabric", "afddiag.probes.fabric", frozenset({"fabric"}), report=True,
          feeds=("fabric.*", "launch.fabric-address", "launch.uverbs-access", "launch.control-plane",
                 "host.known-bad")),
    Entry("qp", "afddiag.probes.qp", frozenset({"fabric"}), report=True, feeds=("fabric.qp-rtr",), needs=("fabric",)),
    Entry("nic", "afddiag.probes.nic", frozenset({"fabric"}), report=True, feeds=("fabric.*",)),
    Entry("route", "afddiag.probes.route", frozenset({"fabric"}), report=True, feeds=("fabric.route", "fabric.arp"),
          needs=("fabric",)),
    Entry("gpu", "afddiag.probes.gpu", frozenset({"gpu"}), report=True,
          feeds=("gpu.*", "launch.memory-plan", "host.known-bad")),
    Entry("load", "afddiag.probes.load", frozenset({"gpu"}), when=load_probe_runs,  # lays its figures on gpu's
          feeds=("gpu.slow-state",), needs=("gpu",)),
    Entry("shm", "afddiag.probes.shm", frozenset({"gpu"}), feeds=("gpu.headroom",)),  # /dev/shm: no process holds it
    Entry("memreg", "afddiag.probes.memreg", frozenset({"fabric"}),
          feeds=("fabric.mem-registration", "host.known-bad")),
    Entry("pcie", "afddiag.probes.pcie", frozenset({"host"}), feeds=("host.pcie",)),
    Entry("aer", "afddiag.probes.aer", frozenset({"host"}), report=True, feeds=("host.pcie-aer",)),
    Entry("reach", "afddiag.probes.reach", frozenset({"launch"}), feeds=("launch.control-plane",), needs=("fabric",)),
    Entry("cpu", "afddiag.probes.cpu", frozenset({"host"}), report=True, feeds=("host.cpu-clock",)),
    Entry("platform", "afddiag.probes.platform", frozenset({"host"}), feeds=("host.known-bad",)),
    Entry("nccl", "afddiag.probes.nccl", frozenset({"launch", "host"}), report=True,
          feeds=("launch.nccl", "host.known-bad")),
    Entry("engine", "afddiag.probes.engine", frozenset({"launch"}), report=True, feeds=("launch.engine-net",),
          needs=("fabric",)),
    Entry("pair", "afddiag.probes.pair_result", frozenset({"fabric"}), report=True,
          feeds=("fabric.rail-bandwidth", "fabric.port-counters", "host.known-bad")),
    Entry("versions", "afddiag.probes.versions", _EVERY, report=True),
)


def probes(families: frozenset[str] | set[str] | None = None, run: Run | None = None,
           names: set[str] | None = None) -> list[Probe]:
    """The probes feeding ``families`` (None: every probe), or those named in ``names`` when given
    (:func:`probes_for`), that ``run`` needs (:attr:`Entry.when`; None: all of them), in registry order;
    only their modules are imported."""
    return [e.probe() for e in PROBES
            if (e.name in names if names is not None else (families is None or e.runs_for(families)))
            and (run is None or e.when is None or e.when(run))]


def probes_for(gate_ids: frozenset[str] | set[str]) -> set[str]:
    """The names of the probes a run of the gates ``gate_ids`` needs: each entry whose ``feeds`` match
    one of them (an entry without ``feeds``: always), and the probes those read (``needs``)."""
    names = {e.name for e in PROBES
             if not e.feeds or any(fnmatch.fnmatchcase(g, p) for g in gate_ids for p in e.feeds)}
    by_name = {e.name: e for e in PROBES}
    todo = list(names)
    while todo:
        for n in by_name[todo.pop()].needs:
            if n not in names:
                names.add(n)
                todo.append(n)
    return names


def report_facts(obs: Observation) -> dict[str, Any]:
    """The JSON report's ``facts``: the Observation field of each entry with ``report``, in registry
    order (None where the probe did not run), as its probe's ``report`` hook trims it."""
    out: dict[str, Any] = {}
    for e in PROBES:
        if not e.report:
            continue
        value = getattr(obs, e.name)
        hook = e.probe().report if value is not None else None  # set: the probe ran, its module is loaded
        out[e.name] = hook(value) if hook is not None else value
    return out


# ---------------------------------------------------------------------------------------------
# Loading and dumping artifacts (the only code that turns a probe's artifacts into files and back)


def load(probe: Probe, root: Path, timeout_s: float = 30.0) -> dict[str, Any]:
    """A probe's readings from a snapshot folder: each artifact's content, None when absent. Every
    file goes through the bounded reader (:mod:`afddiag.reader`: confined to ``root``, regular
    files only, size and JSON depth caps, read within ``timeout_s``). ``notes`` lists what was
    present but refused; ``refused`` the JSON parts among them (the probe's gates say ERROR)."""
    notes: list[str] = []
    refused: list[str] = []
    out: dict[str, Any] = {}
    for a in probe.artifacts:
        path = root / a.name
        try:
            if a.kind == "json":
                out[a.name] = reader.load_json(path, root=root, timeout_s=timeout_s)
            elif a.kind == "text":
                out[a.name] = reader.read_text(path, root, **({"max_bytes": a.max_bytes} if a.max_bytes else {}),
                                               timeout_s=timeout_s, errors="replace")
            else:
                out[a.name] = str(root) if path.is_dir() else None
        except FileNotFoundError:
            out[a.name] = None
        except reader.InputError as e:
            out[a.name] = None
            why = f"{a.name} refused: {str(e).replace(str(path), a.name, 1)}"
            notes.append(why if a.kind == "json" else f"{why}; treated as not captured")
            if a.kind == "json":
                refused.append(why)
    out["notes"] = notes
    out["refused"] = refused
    return out


def dump(probe: Probe, readings: dict[str, Any], files: dict[str, bytes]) -> None:
    """A probe's JSON and text artifacts into ``files`` (relative path → bytes); None is left out."""
    for a in probe.artifacts:
        v = readings.get(a.name)
        if v is None or a.kind == "tree":
            continue
        if a.kind == "json":
            files[a.name] = (json.dumps(v, indent=2, default=str) + "\n").encode()
        else:
            files[a.name] = (v if v.endswith("\n") else v + "\n").encode("utf-8", "replace")


#: What `afddiag capture` writes besides the probes' artifacts (``capture.json``: what was captured, notes).
CAPTURE_MANIFEST = "capture.json"
#: The operator's inputs of a capture (``inputs.json``: :func:`afddiag.inputs.to_store`'s dict), which a
#: replay uses where its flags give none (:func:`afddiag.inputs.with_stored`).
CAPTURE_INPUTS = "inputs.json"


def dump_inputs(stored: dict[str, Any], files: dict[str, bytes]) -> None:
    """A capture's stored inputs into ``files`` as :data:`CAPTURE_INPUTS` (JSON)."""
    files[CAPTURE_INPUTS] = (json.dumps(stored, indent=2, sort_keys=True) + "\n").encode()


def load_inputs(root: Path, timeout_s: float = 30.0) -> tuple[dict[str, Any] | None, str]:
    """A snapshot's stored inputs (:data:`CAPTURE_INPUTS`), read through the bounded reader →
    ``(dict, "")``; ``(None, "")`` when the snapshot has none (a bundle from before inputs were kept,
    a case folder); ``(None, why)`` when the file is there but refused (not a JSON object, too big)."""
    try:
        v = reader.load_json(root / CAPTURE_INPUTS, root=root, timeout_s=timeout_s)
    except FileNotFoundError:
        return None, ""
    except reader.InputError as e:
        return None, f"{CAPTURE_INPUTS} refused: {str(e).replace(str(root / CAPTURE_INPUTS), CAPTURE_INPUTS, 1)}"
    if not isinstance(v, dict):
        return None, f"{CAPTURE_INPUTS} refused: not a JSON object"
    return v, ""


def _names(entries: tuple[Entry, ...] | list[Entry]) -> list[str]:
    return [a.name + ("/" if a.kind == "tree" else "") for e in entries for a in e.probe().artifacts]


def layout_hint() -> str:
    """The main files of a snapshot folder, for an error message: ``env, sys/, ...``."""
    return ", ".join(_names([e for e in PROBES if e.name in ("env", "fabric", "gpu")]))


def recognizes(root: Path, families: frozenset[str] | set[str] | None = None) -> bool:
    """True when folder ``root`` holds at least one artifact of a probe (or a capture manifest): a
    folder with none is not a snapshot (a usage error, never a page of SKIPs and exit 0). The
    probes of ``families`` are looked at first, so a replay that finds one imports no other probe."""
    first = [e for e in PROBES if families is not None and e.runs_for(families)]
    for group in (first, [e for e in PROBES if e not in first]):
        if any((root / n.rstrip("/")).exists() for n in _names(group) + [CAPTURE_MANIFEST]):
            return True
    return False


def snapshot_parts() -> str:
    """What a snapshot holds, for an error message (every artifact name, trees with a slash)."""
    return ", ".join(dict.fromkeys(_names(PROBES)))

