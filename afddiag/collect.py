"""Gather facts once per run, from the live host or from a snapshot directory.

Each probe runs under a time bound; a probe that fails or times out records why and the run goes
on (its gates then say SKIP or ERROR with the reason).
"""

from __future__ import annotations

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
    probe_timeout_s: float = 10.0
    qp_timeout_s: float = 5.0
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
    pass


def bounded(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """Run ``fn`` in a daemon thread; raise :class:`ProbeTimeout` naming ``what`` after
    ``timeout_s`` seconds (the thread is abandoned, the run goes on). Re-raises ``fn``'s error."""
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
        raise ProbeTimeout(f"{what} did not finish within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _fabric_live(timeout_s: float) -> FabricFacts:
    from afddiag.probes import netlink
    from afddiag.probes.sysfs import probe_fabric

    order, order_source, notes = netlink.device_order(min(timeout_s, 3.0))
    try:
        addrs, addr_source = netlink.netdev_addresses(), "psutil.net_if_addrs"
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        addrs, addr_source = None, "none"
        notes.append(f"netdev addresses not read: {e}")
    facts = probe_fabric("/", order, order_source, addrs, addr_source)
    facts.notes[:0] = notes if (order is None or not facts.devices) else []
    return facts


def _qp_live(fabric: FabricFacts, inputs: Inputs, fabric_ip: str | None) -> QpFacts:
    try:
        from afddiag.probes.qp import probe_qp
    except ImportError as e:
        return QpFacts(ran=False, why=f"QP probe unavailable: {e}")
    return probe_qp(fabric, fabric_ip, list(inputs.peers), inputs.qp_timeout_s)


def gather_live(inputs: Inputs, want_fabric: bool, want_gpu: bool,
                resolve_ip: Callable[[FabricFacts], str | None], want_launch: bool = False,
                want_host: bool = False) -> Observation:
    """Probe this host. ``resolve_ip`` picks the fabric IP from fabric facts (for the QP probe)."""
    obs = Observation(host=socket.gethostname(), source="live")
    obs.env = {k: v for k, v in os.environ.items() if k in WATCHED}
    _overlay_launch_env(obs, inputs)
    if want_launch:
        from afddiag.probes.launch import inspect_image, read_limits

        obs.limits = read_limits()
        ref = (inputs.launch_env or {}).get("AFD_IMAGE")
        if ref:
            obs.image = inspect_image(ref, inputs.probe_timeout_s)
    if want_fabric:
        try:
            obs.fabric = bounded(lambda: _fabric_live(inputs.probe_timeout_s),
                                 inputs.probe_timeout_s, "fabric probe (sysfs)")
        except Exception as e:  # noqa: BLE001
            obs.fabric = FabricFacts(captured=False, notes=[f"fabric probe failed: {e}"])
        if not inputs.run_qp:
            obs.qp = QpFacts(ran=False, why="QP test not requested (--no-qp)")
        elif obs.fabric.devices:
            ip = resolve_ip(obs.fabric)
            budget = inputs.qp_timeout_s * max(1, len(obs.fabric.devices)) * max(1, len(inputs.peers)) + 2
            try:
                obs.qp = bounded(lambda: _qp_live(obs.fabric, inputs, ip), budget, "QP probe")
            except Exception as e:  # noqa: BLE001
                obs.qp = QpFacts(ran=False, why=f"QP probe failed: {e}")
        else:
            obs.qp = QpFacts(ran=False, why="no RDMA device to open")
    if want_gpu:
        try:
            from afddiag.probes.gpu import read_gpu

            readings = read_gpu(timeout_s=inputs.probe_timeout_s, xid_log=inputs.xid_log)
            if wants_load(inputs) and readings.get("devices"):
                attach_load(readings, inputs.load_budget_s)
            obs.gpu = gpu_facts_from_readings(readings)
        except Exception as e:  # noqa: BLE001
            obs.gpu = GpuFacts(available=False, why=f"GPU probe failed: {e}")
        _load_baseline(obs, inputs)
    if want_host:
        from afddiag.probes.cpu import read_cpu

        try:
            obs.cpu = bounded(lambda: read_cpu(), inputs.probe_timeout_s, "CPU probe")
        except Exception as e:  # noqa: BLE001
            obs.cpu = {"why": f"CPU probe failed: {e}"}
        if obs.baseline is None and not obs.baseline_why:
            _load_baseline(obs, inputs)
    return obs


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
    from afddiag import baseline

    obs.baseline, obs.baseline_why = baseline.load(inputs.baseline_path)


class SnapshotError(ValueError):
    """A snapshot directory that cannot be used at all (message names the path and the fix)."""


def _load_json(path: Path, notes: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        notes.append(f"{path.name}: unreadable ({e}); treated as not captured")
        return None


def gather_snapshot(inputs: Inputs, want_fabric: bool, want_gpu: bool, want_launch: bool = False,
                    want_host: bool = False) -> Observation:
    """Read a snapshot directory instead of the host: ``sys/``, ``rdma-dev.json``,
    ``ip-addr.json``, ``env``, ``gpu.json``, ``image.json`` (image inspect), ``limits.json``. Any
    part may be absent; what it would have fed is marked not captured. Raises
    :class:`SnapshotError` when the directory does not exist."""
    from afddiag.probes.netlink import parse_ip_addr_json, parse_rdma_dev_json
    from afddiag.probes.sysfs import probe_fabric

    root = Path(inputs.snapshot or "")
    if not root.is_dir():
        raise SnapshotError(f"snapshot {root}: not a directory (give a folder holding sys/, rdma-dev.json, ip-addr.json, env, gpu.json)")
    obs = Observation(host=root.name, source=f"snapshot {root}")
    case = _load_json(root / "case.json", obs.notes)
    if isinstance(case, dict) and isinstance(case.get("host"), str):
        obs.host = case["host"]
    env_path = root / "env"
    if env_path.is_file():
        obs.env = parse_env_file(env_path.read_text(encoding="utf-8", errors="replace"))
        obs.env_source = "snapshot env"
    else:
        obs.env, obs.env_source = {}, "snapshot (no env file: nothing set)"
    _overlay_launch_env(obs, inputs)
    if want_launch:
        from afddiag.probes.launch import image_from_inspect, limits_from_json

        raw = _load_json(root / "limits.json", obs.notes)
        obs.limits = limits_from_json(raw) if raw is not None else HostLimits(
            captured=False, notes=["limits not captured (no limits.json in the snapshot)"])
        raw = _load_json(root / "image.json", obs.notes)
        if raw is not None:
            obs.image = image_from_inspect(raw, (inputs.launch_env or {}).get("AFD_IMAGE"), "image.json")
        elif (inputs.launch_env or {}).get("AFD_IMAGE"):
            obs.image = ImageFacts(ref=inputs.launch_env["AFD_IMAGE"], why="image not captured (no image.json)")
    if want_fabric:
        if not (root / "sys").is_dir():
            obs.fabric = FabricFacts(captured=False, notes=["fabric not captured (no sys/ in the snapshot)"])
        else:
            notes: list[str] = []
            order = order_source = None
            raw = _load_json(root / "rdma-dev.json", notes)
            if raw is not None:
                try:
                    order, order_source = parse_rdma_dev_json(raw), "rdma-dev.json"
                except ValueError as e:
                    notes.append(f"rdma-dev.json: {e}")
            addrs = addr_source = None
            raw = _load_json(root / "ip-addr.json", notes)
            if raw is not None:
                try:
                    addrs, addr_source = parse_ip_addr_json(raw), "ip-addr.json"
                except ValueError as e:
                    notes.append(f"ip-addr.json: {e}")
            if addrs is None:
                notes.append("addresses not captured (no ip-addr.json): a GID's netdev is assumed to hold its IP")
            obs.fabric = probe_fabric(str(root), order, order_source, addrs, addr_source)
            obs.fabric.notes[:0] = notes
        obs.qp = QpFacts(ran=False, why="not captured: a snapshot holds no live QP test")
    if want_gpu:
        raw = _load_json(root / "gpu.json", obs.notes)
        if raw is None:
            obs.gpu = GpuFacts(captured=False, why="GPU not captured (no gpu.json in the snapshot)")
        else:
            obs.gpu = gpu_facts_from_readings(raw)
        _load_baseline(obs, inputs)
    if want_host:
        raw = _load_json(root / "cpu.json", obs.notes)
        obs.cpu = raw if isinstance(raw, dict) else None
        if obs.baseline is None and not obs.baseline_why:
            _load_baseline(obs, inputs)
    return obs
