"""Gather facts once per run, from the live host or from a snapshot directory.

Each probe runs under a time bound; a probe that fails or times out records why and the run goes
on (its gates then say SKIP or ERROR with the reason).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from afddiag.envvars import MAP_VAR, WATCHED, parse_env_file
from afddiag.facts import FabricFacts, GpuFacts, HostLimits, ImageFacts, QpFacts, gpu_facts_from_readings

T = TypeVar("T")


@dataclass
class Inputs:
    """What the user asked for (flags), before any probing."""

    fabric_ip: str | None = None
    peers: list[str] = field(default_factory=list)
    expect_sm: int | None = None
    snapshot: str | None = None
    probe_timeout_s: float | None = None  # --timeout: overrides the playbook's fabric_s, gpu_s, cpu_s, image_s, limits_s
    qp_timeout_s: float | None = None  # --qp-timeout: overrides the playbook's qp_s
    run_qp: bool = True
    launch_env: dict[str, str] | None = None  # parsed --launch-env file (afddiag's key names)
    launch_env_path: str | None = None
    expect_capacity: int | None = None
    playbook: Any = None  # afddiag.playbook.Playbook
    load: bool = False  # run the GPU load probe (also when the playbook asks)
    load_budget_s: float = 3.0
    baseline_path: str | None = None
    xid_log: str | None = None  # a saved kernel log to read Xid events from instead of /dev/kmsg

    def __post_init__(self) -> None:
        """The launch env feeds the fabric IP and peers when the flags do not give them."""
        le = self.launch_env or {}
        if not self.fabric_ip and le.get("AFD_FABRIC_IP"):
            self.fabric_ip = le["AFD_FABRIC_IP"]
        if not self.peers and le.get("AFD_PEER_FABRIC_IPS"):
            self.peers = [p for p in le["AFD_PEER_FABRIC_IPS"].replace(",", " ").split() if p]

    def timeout(self, kind: str) -> float:
        """Seconds the probe ``kind`` ("fabric_s", "qp_s", "gpu_s", "load_s", "cpu_s", "image_s",
        "limits_s") may take: --qp-timeout for qp_s, --timeout for the others but load_s, else the
        playbook's ``[timeouts]``, else the defaults (:data:`afddiag.playbook.DEFAULT_TIMEOUTS`)."""
        from afddiag.playbook import timeout_for

        if kind == "qp_s" and self.qp_timeout_s is not None:
            return float(self.qp_timeout_s)
        if kind not in ("qp_s", "load_s") and self.probe_timeout_s is not None:
            return float(self.probe_timeout_s)
        return timeout_for(self.playbook, kind)


@dataclass
class Observation:
    """Facts for one run. ``None`` means that part was not asked for by the command."""

    host: str
    source: str  # "live" or "snapshot <dir>"
    fabric: FabricFacts | None = None
    qp: QpFacts | None = None
    gpu: GpuFacts | None = None
    env: dict[str, str] | None = None  # None: not captured
    env_source: str = "process environment"
    image: ImageFacts | None = None
    limits: HostLimits | None = None
    cpu: dict[str, Any] | None = None  # host CPU facts (probes/cpu.py); None: not probed
    baseline: dict[str, Any] | None = None  # the host's recorded baseline
    baseline_why: str = ""
    route: Any = None  # afddiag.probes.route.RouteFacts; None: not probed
    versions: dict[str, Any] | None = None  # kernel, bios, rdma_core (probes/route.read_versions)
    notes: list[str] = field(default_factory=list)


def _overlay_launch_env(obs: Observation, inputs: Inputs) -> None:
    """With --launch-env, the file's device-selection variables are what the launcher exports:
    its map replaces the process's (absent in the file: no map)."""
    if inputs.launch_env is None:
        return
    env = dict(obs.env or {})
    env.pop(MAP_VAR, None)
    env.update({k: v for k, v in inputs.launch_env.items() if k in WATCHED})
    obs.env = env
    obs.env_source = f"launch env {inputs.launch_env_path}"


class ProbeTimeout(Exception):
    """A bounded probe ran past its time bound (the message names the probe and what it was doing)."""


class Progress:
    """What a bounded probe is doing now: the probe sets ``doing``; a timeout message quotes it."""

    def __init__(self) -> None:
        self.doing = ""

    def tracking(self, read: Callable[[str], str]) -> Callable[[str], str]:
        """``read`` (a sysfs reader) that first records ``reading <path>`` as what is being done."""

        def wrapped(path: str) -> str:
            self.doing = f"reading {path}"
            return read(path)

        return wrapped


def bounded(fn: Callable[[], T], timeout_s: float, what: str, progress: Progress | None = None) -> T:
    """Run ``fn`` in a daemon thread; raise :class:`ProbeTimeout` naming ``what`` (and what
    ``progress`` says it was doing) after ``timeout_s`` seconds (the thread is abandoned, the run
    goes on). Re-raises ``fn``'s error."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, name=f"afddiag-{what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise ProbeTimeout(f"{what} did not finish within {timeout_s:g} s"
                           + (f" (stuck {progress.doing})" if progress and progress.doing else ""))
    if "error" in box:
        raise box["error"]
    return box["value"]


def guarded(fn: Callable[[], T], timeout_s: float, what: str,
            progress: Progress | None = None) -> tuple[T | None, str | None]:
    """:func:`bounded`, never raising: ``(value, None)``, or ``(None, why)`` when ``fn`` timed out or
    raised; ``why`` names the probe, the time bound or the error, and what it was doing."""
    try:
        return bounded(fn, timeout_s, what, progress), None
    except ProbeTimeout as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - a crashed probe becomes its gates' ERROR
        from afddiag.reader import RefusedRead

        if isinstance(e, RefusedRead):  # a snapshot file that is a device, FIFO or a link out of it
            return None, f"{what} refused {e}"
        doing = f" while {progress.doing}" if progress and progress.doing else ""
        return None, f"{what} crashed{doing} ({type(e).__name__}: {e})"


def _fabric_live(timeout_s: float, progress: Progress | None = None) -> FabricFacts:
    from afddiag.probes import netlink
    from afddiag.probes.sysfs import probe_fabric, read_text

    progress = progress or Progress()
    progress.doing = "dumping RDMA devices over NETLINK_RDMA"
    order, order_source, notes = netlink.device_order(min(timeout_s, 3.0))
    progress.doing = "listing netdev addresses (getifaddrs)"
    try:
        addrs, addr_source = netlink.netdev_addresses(), "psutil.net_if_addrs"
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        addrs, addr_source = None, "none"
        notes.append(f"netdev addresses not read: {e}")
    facts = probe_fabric("/", order, order_source, addrs, addr_source, reader=progress.tracking(read_text))
    facts.notes[:0] = notes if (order is None or not facts.devices) else []
    return facts


def _qp_live(fabric: FabricFacts, inputs: Inputs, fabric_ip: str | None) -> QpFacts:
    try:
        from afddiag.probes.qp import probe_qp
    except ImportError as e:
        return QpFacts(ran=False, why=f"QP probe unavailable: {e}")
    return probe_qp(fabric, fabric_ip, list(inputs.peers), inputs.timeout("qp_s"))


def gather_live(inputs: Inputs, want_fabric: bool, want_gpu: bool,
                resolve_ip: Callable[[FabricFacts], str | None], want_launch: bool = False,
                want_host: bool = False) -> Observation:
    """Probe this host. ``resolve_ip`` picks the fabric IP from fabric facts (for the QP probe)."""
    obs = Observation(host=socket.gethostname(), source="live")
    obs.env = {k: v for k, v in os.environ.items() if k in WATCHED}
    _overlay_launch_env(obs, inputs)
    if want_launch:
        from afddiag.probes.launch import inspect_image, read_limits

        t = inputs.timeout("limits_s")
        obs.limits, failed = guarded(read_limits, t, "limits probe (getrlimit, /dev/infiniband)")
        if failed:
            obs.limits = HostLimits(captured=False, failed=failed, notes=[failed])
        ref = (inputs.launch_env or {}).get("AFD_IMAGE")
        if ref:
            t = inputs.timeout("image_s")
            obs.image, failed = guarded(lambda: inspect_image(ref, t), t + 1.0, f"image probe (inspect {ref})")
            if failed:
                obs.image = ImageFacts(ref=ref, why=failed, failed=failed)
    if want_fabric:
        t = inputs.timeout("fabric_s")
        progress = Progress()
        obs.fabric, failed = guarded(lambda: _fabric_live(t, progress), t, "fabric probe (sysfs)", progress)
        if failed:
            obs.fabric = FabricFacts(captured=False, failed=failed, notes=[failed])
        if not inputs.run_qp:
            obs.qp = QpFacts(ran=False, why="QP test not requested (--no-qp)")
        elif obs.fabric.failed:
            obs.qp = QpFacts(ran=False, why="fabric probe failed: no devices to walk",
                             failed=f"not run: {obs.fabric.failed}")
        elif obs.fabric.devices:
            ip = resolve_ip(obs.fabric)
            budget = inputs.timeout("qp_s") * max(1, len(obs.fabric.devices)) * max(1, len(inputs.peers)) + 2
            obs.qp, failed = guarded(lambda: _qp_live(obs.fabric, inputs, ip), budget, "QP probe")
            if failed:
                obs.qp = QpFacts(ran=False, why=failed, failed=failed)
        else:
            obs.qp = QpFacts(ran=False, why="no RDMA device to open")
    if want_gpu:
        obs.gpu = _gpu_live(inputs)
        _load_baseline(obs, inputs)
    if want_host:
        from afddiag.probes.cpu import read_cpu

        obs.cpu, failed = guarded(read_cpu, inputs.timeout("cpu_s"), "CPU probe (cpufreq, fixed-work loop)")
        if failed:
            obs.cpu = {"why": failed, "failed": failed}
        if obs.baseline is None and not obs.baseline_why:
            _load_baseline(obs, inputs)
    return obs


def _gpu_live(inputs: Inputs) -> GpuFacts:
    """The GPU probe (and the load probe when asked), each under its own bound; a timeout or crash
    sets ``failed`` / ``load_failed`` (their gates say ERROR)."""
    from afddiag.probes.gpu import read_gpu

    t = inputs.timeout("gpu_s")
    # read_gpu bounds its own NVML/CUDA worker; the outer bound catches a hang outside it.
    readings, failed = guarded(lambda: read_gpu(timeout_s=t, xid_log=inputs.xid_log), t + 2.0,
                               "GPU probe (NVML, CUDA driver)")
    if failed:
        return GpuFacts(available=False, why=failed, failed=failed)
    if wants_load(inputs) and readings.get("devices"):
        t = inputs.timeout("load_s") * len(readings["devices"])
        _, failed = guarded(lambda: attach_load(readings, inputs.load_budget_s), t, "GPU load probe")
        if failed:
            readings["load_failed"] = failed
            for d in readings["devices"]:
                if not isinstance(d.get("under_load"), dict):
                    d["under_load"] = {"why": failed}
    try:
        return gpu_facts_from_readings(readings)
    except Exception as e:  # noqa: BLE001 - odd readings must not stop the run
        why = f"GPU readings not usable ({type(e).__name__}: {e})"
        return GpuFacts(available=False, why=why, failed=why)


def wants_load(inputs: Inputs) -> bool:
    """--load, or a playbook that turns the slow-state load probe on."""
    return inputs.load or bool(inputs.playbook and inputs.playbook.load_probe)


def attach_load(readings: dict[str, Any], budget_s: float) -> None:
    """Run the load probe on every CUDA device and attach each result to the NVML device with the
    same UUID as its ``under_load`` (a failed probe leaves ``{"why": ...}``)."""
    from afddiag.probes.load import run_load_probe

    by_uuid = {d.get("uuid"): d for d in readings["devices"]}
    for ordinal in range(len(readings["devices"])):
        ul = run_load_probe(ordinal, budget_s)
        uuid = (ul.get("device") or {}).get("uuid")
        target = by_uuid.get(uuid) or (readings["devices"][ordinal] if ordinal < len(readings["devices"]) else None)
        if target is not None:
            target["under_load"] = ul


def _load_baseline(obs: Observation, inputs: Inputs) -> None:
    """The host's recorded baseline: live runs read the state directory's (or --baseline); a
    snapshot replay reads only an explicit --baseline, since this machine's baseline is not the
    captured host's (replays give the same verdicts anywhere)."""
    from afddiag import baseline

    if inputs.snapshot and not inputs.baseline_path:
        obs.baseline, obs.baseline_why = None, "a replay uses no local baseline (give --baseline to compare)"
        return
    obs.baseline, obs.baseline_why = baseline.load(inputs.baseline_path, strict=bool(inputs.baseline_path))


class SnapshotError(ValueError):
    """A snapshot directory that cannot be used at all (message names the path and the fix)."""


def _load_json(path: Path, notes: list[str], failures: dict[str, str] | None = None,
               timeout_s: float | None = None) -> Any:
    """One snapshot JSON part through the bounded reader (:func:`afddiag.reader.load_json`, confined
    to the snapshot folder): its value, or None when absent. A part that is present but refused
    (too big, too deep, a link out, a device, not JSON) is noted and, with ``failures``, recorded
    there by name, so the gates that needed it say ERROR rather than "not captured"."""
    from afddiag.reader import InputError, load_json

    try:
        return load_json(path, root=path.parent, **({"timeout_s": timeout_s} if timeout_s else {}))
    except FileNotFoundError:
        return None
    except InputError as e:
        why = f"{path.name} refused: {str(e).replace(str(path), path.name, 1)}"
        notes.append(why)
        if failures is not None:
            failures[path.name] = why
        return None


def gather_snapshot(inputs: Inputs, want_fabric: bool, want_gpu: bool, want_launch: bool = False,
                    want_host: bool = False) -> Observation:
    """Read a snapshot directory instead of the host: ``sys/``, ``rdma-dev.json``,
    ``ip-addr.json``, ``env``, ``gpu.json``, ``image.json`` (image inspect), ``limits.json``. Any
    part may be absent; what it would have fed is marked not captured. A capture bundle is opened
    by the caller with :func:`opened_snapshot` first (one extraction for every reader). Raises
    :class:`SnapshotError` when the directory does not exist."""
    from afddiag.probes.netlink import parse_ip_addr_json, parse_rdma_dev_json
    from afddiag.probes.sysfs import probe_fabric, read_text
    from afddiag.reader import confined_reader

    root = Path(inputs.snapshot or "")
    if not root.is_dir():
        raise SnapshotError(f"snapshot {root}: not a directory (give a folder holding sys/, rdma-dev.json, ip-addr.json, env, gpu.json)")
    from afddiag.reader import InputError
    from afddiag.reader import read_text as read_capped

    obs = Observation(host=root.name, source=f"snapshot {root}")
    bad: dict[str, str] = {}  # part name -> why it was refused (its gates say ERROR)
    part_s = inputs.timeout("fabric_s")  # one part's read: --timeout bounds it too
    case = _load_json(root / "case.json", obs.notes)
    if isinstance(case, dict) and isinstance(case.get("host"), str):
        obs.host = case["host"][:253]
    else:  # a capture bundle's hostname
        try:
            obs.host = read_capped(root / "host", root, 4096, part_s, errors="replace").strip()[:253] or obs.host
        except FileNotFoundError:
            pass
        except InputError as e:
            obs.notes.append(f"host refused: {e}; the folder name is used")
    env_text = None
    try:
        env_text = read_capped(root / "env", root, timeout_s=part_s, errors="replace")
    except FileNotFoundError:
        pass
    except InputError as e:
        obs.notes.append(f"env refused: {e}; treated as not captured")
    if env_text is not None:
        obs.env = parse_env_file(env_text)
        obs.env_source = "snapshot env"
    else:
        obs.env, obs.env_source = {}, "snapshot (no env file: nothing set)"
    _overlay_launch_env(obs, inputs)
    if want_launch:
        from afddiag.probes.launch import image_from_inspect, limits_from_json

        raw = _load_json(root / "limits.json", obs.notes, bad, part_s)
        obs.limits = limits_from_json(raw) if raw is not None else HostLimits(
            captured=False, notes=["limits not captured (no limits.json in the snapshot)"])
        if "limits.json" in bad:
            obs.limits = HostLimits(captured=False, failed=bad["limits.json"], notes=[bad["limits.json"]])
        raw = _load_json(root / "image.json", obs.notes, bad, part_s)
        if raw is not None:
            obs.image = image_from_inspect(raw, (inputs.launch_env or {}).get("AFD_IMAGE"), "image.json")
        elif "image.json" in bad:
            obs.image = ImageFacts(ref=(inputs.launch_env or {}).get("AFD_IMAGE"), why=bad["image.json"],
                                   failed=bad["image.json"])
        elif (inputs.launch_env or {}).get("AFD_IMAGE"):
            obs.image = ImageFacts(ref=inputs.launch_env["AFD_IMAGE"], why="image not captured (no image.json)")
    if want_fabric:
        if not (root / "sys").is_dir():
            obs.fabric = FabricFacts(captured=False, notes=["fabric not captured (no sys/ in the snapshot)"])
        else:
            notes: list[str] = []
            order = order_source = None
            raw = _load_json(root / "rdma-dev.json", notes, bad, part_s)
            if raw is not None:
                try:
                    order, order_source = parse_rdma_dev_json(raw), "rdma-dev.json"
                except ValueError as e:
                    notes.append(f"rdma-dev.json: {e}")
            addrs = addr_source = None
            raw = _load_json(root / "ip-addr.json", notes, bad, part_s)
            if raw is not None:
                try:
                    addrs, addr_source = parse_ip_addr_json(raw), "ip-addr.json"
                except ValueError as e:
                    notes.append(f"ip-addr.json: {e}")
            if addrs is None:
                notes.append("addresses not captured (no ip-addr.json): a GID's netdev is assumed to hold its IP")
            progress = Progress()
            reader = progress.tracking(confined_reader(root, read_text))
            obs.fabric, failed = guarded(
                lambda: probe_fabric(str(root), order, order_source, addrs, addr_source, reader=reader),
                inputs.timeout("fabric_s"), "fabric probe (snapshot sysfs)", progress)
            failed = failed or "; ".join(bad[k] for k in ("rdma-dev.json", "ip-addr.json") if k in bad) or None
            if failed:
                obs.fabric = FabricFacts(captured=False, failed=failed)
            obs.fabric.notes[:0] = notes + ([failed] if failed else [])
        obs.qp = QpFacts(ran=False, why="not captured: a snapshot holds no live QP test")
    if want_gpu:
        raw = _load_json(root / "gpu.json", obs.notes, bad, part_s)
        if "gpu.json" in bad:
            obs.gpu = GpuFacts(available=False, why=bad["gpu.json"], failed=bad["gpu.json"])
        elif raw is None:
            obs.gpu = GpuFacts(captured=False, why="GPU not captured (no gpu.json in the snapshot)")
        else:
            obs.gpu, failed = guarded(lambda: gpu_facts_from_readings(raw), inputs.timeout("gpu_s"),
                                      "GPU facts (snapshot gpu.json)")
            if failed:
                obs.gpu = GpuFacts(available=False, why=failed, failed=failed)
        _load_baseline(obs, inputs)
    if want_host:
        raw = _load_json(root / "cpu.json", obs.notes, bad, part_s)
        obs.cpu = raw if isinstance(raw, dict) else ({"why": bad["cpu.json"], "failed": bad["cpu.json"]}
                                                     if "cpu.json" in bad else None)
        if obs.baseline is None and not obs.baseline_why:
            _load_baseline(obs, inputs)
    return obs


@contextlib.contextmanager
def opened_snapshot(path: str):
    """Yield the snapshot folder for ``path``: the folder itself, or for a capture bundle
    (``.tar.gz``) the folder it was extracted to safely (:func:`afddiag.bundle.safe_extract`) under
    a temporary directory that is removed on exit. Raises :class:`SnapshotError` when the bundle is
    missing, unreadable or refused (one line naming the bundle and the member)."""
    import shutil
    import tempfile

    from afddiag.bundle import BundleError, is_bundle, safe_extract

    if not is_bundle(path):
        yield str(path)
        return
    if not os.path.isfile(path):
        raise SnapshotError(f"snapshot {path}: no such file (give a bundle written by `afddiag capture`)")
    tmp = tempfile.mkdtemp(prefix="afddiag-bundle-")
    try:
        try:
            root = safe_extract(path, tmp)
        except BundleError as e:
            raise SnapshotError(f"snapshot {path}: refused: {e}") from None
        yield str(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def relabel(obj: Any, root: str, bundle: str) -> Any:
    """``obj`` (report JSON, lists, strings) with the extracted folder ``root`` named as ``bundle``."""
    if isinstance(obj, str):
        return obj.replace(root, bundle)
    if isinstance(obj, dict):
        return {k: relabel(v, root, bundle) for k, v in obj.items()}
    if isinstance(obj, list):
        return [relabel(v, root, bundle) for v in obj]
    return obj
