"""Expectations: what this host is judged against, resolved once before any gate runs, each with its source.

Gates read :class:`Expectations` (``ctx.expect``), never work out their own precedence from raw
inputs. Each value is an :class:`Expected` (value, source) or None when nothing gives one:

- ``sm_count``: the SM count the image's kernels were exported for: ``--expect-sm``, else the launch
  env's ``AFD_IMAGE_SM_COUNT``, else the image label ``afd.export.sm_count``, else a snapshot's
  ``expect.image_sm_count``;
- ``capacity_key`` / ``capacity``: this role's capacity flag (the playbook's, else by ``AFD_ROLE``) and
  the other side's value: ``--expect-capacity``, else the other side's flag in the same launch env;
- ``image``: the launch env's ``AFD_IMAGE``;
- ``peers``: ``--peer``, else the launch env's ``AFD_PEER_FABRIC_IPS``;
- ``fabric_ip``: the run's fabric IP (:func:`afddiag.endpoint.fabric_ip_of`: ``--fabric-ip``, the launch
  env's ``AFD_FABRIC_IP``, else the only IPv4 RoCE v2 address), resolved once by the runner;
- ``role``: the playbook judged by and where it came from (:func:`afddiag.inputs.resolve`: ``--playbook``,
  ``--role``, ``AFD_ROLE`` in the launch env, or generic);
- ``gpu_baselines``: per GPU index, the figures ``gpu.slow-state`` compares to (the host's recorded
  baseline by UUID, a snapshot's ``expect.baseline``, the reference table by model:
  :func:`afddiag.baseline.for_gpu`); ``cpu_baseline``: the host baseline's CPU figures.

Pure: reads the inputs and the observation, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from afddiag import baseline
from afddiag.envvars import CAPACITY_KEYS
from afddiag.textnum import digits

SM_LABEL = "afd.export.sm_count"  # image label holding the SM count the AOT kernels were exported for
_PREFILL, _EXPERT = CAPACITY_KEYS["coordinator"], CAPACITY_KEYS["expert"]
OTHER_KEY = {_PREFILL: _EXPERT, _EXPERT: _PREFILL}  # one side's capacity flag -> the other side's


@dataclass
class Expected:
    """One expectation and where it came from (``"--expect-sm"``, ``"AFD_IMAGE_SM_COUNT in rank.env"``)."""

    value: Any
    source: str


@dataclass
class BaselineExpected(Expected):
    """A GPU's baseline figures with what was ignored on the way to them (a host baseline others can
    write, a figure the GPU cannot reach: :func:`afddiag.baseline.for_gpu`); gpu.slow-state WARNs naming it."""

    ignored: str = ""


@dataclass
class Expectations:
    """What the gates judge against (see the module docstring); None: nothing gave it."""

    sm_count: Expected | None = None
    capacity_key: Expected | None = None
    capacity: Expected | None = None
    image: Expected | None = None
    peers: Expected | None = None
    fabric_ip: Expected | None = None
    role: Expected | None = None
    gpu_baselines: dict[int, Expected] = field(default_factory=dict)
    cpu_baseline: Expected | None = None

    def value(self, name: str) -> Any:
        """The value of expectation ``name`` (None when unset)."""
        e = getattr(self, name)
        return e.value if isinstance(e, Expected) else None


def sm_count(inputs: Any, obs: Any = None) -> Expected | None:
    """The expected SM count and its source (the module docstring gives the precedence), or None.
    ``obs`` None: from the inputs alone (before any probe ran: no image, no snapshot)."""
    if inputs.expect_sm is not None:
        return Expected(int(inputs.expect_sm), "--expect-sm")
    le = inputs.launch_env or {}
    if digits(le.get("AFD_IMAGE_SM_COUNT", "")):
        return Expected(int(le["AFD_IMAGE_SM_COUNT"]), f"AFD_IMAGE_SM_COUNT in {inputs.launch_env_path}")
    img = getattr(obs, "image", None)
    if img is not None and digits(img.labels.get(SM_LABEL, "").strip()):
        return Expected(int(img.labels[SM_LABEL]), f"image {img.ref} label {SM_LABEL}")
    g = getattr(obs, "gpu", None)
    if g is not None and g.expect_image_sm_count is not None:
        return Expected(int(g.expect_image_sm_count), "snapshot expect.image_sm_count")
    return None


def _capacity(inputs: Any, pb: Any) -> tuple[Expected | None, Expected | None]:
    le = inputs.launch_env
    if le is None:
        return None, None
    key = None
    if pb is not None and pb.capacity_key:
        key = Expected(pb.capacity_key, f"playbook {pb.name}")
    elif CAPACITY_KEYS.get(le.get("AFD_ROLE", "")):
        key = Expected(CAPACITY_KEYS[le["AFD_ROLE"]], f"AFD_ROLE in {inputs.launch_env_path}")
    if inputs.expect_capacity is not None:
        return key, Expected(int(inputs.expect_capacity), "--expect-capacity")
    other = OTHER_KEY.get(key.value, "") if key else ""
    if other and digits(str(le.get(other, ""))):
        return key, Expected(int(le[other]), f"{other} in the same file")
    return key, None


def resolve(inputs: Any, obs: Any, fabric_ip: Any = None) -> Expectations:
    """Every expectation of one run (``inputs``: :class:`~afddiag.model.run.Inputs`, ``obs``: its
    :class:`~afddiag.model.run.Observation`, ``fabric_ip``: its :class:`~afddiag.endpoint.FabricIp`,
    default ``obs.fabric_ip``), each with its source. Never raises on odd inputs."""
    pb = inputs.playbook
    le = inputs.launch_env or {}
    ex = Expectations()
    ex.sm_count = sm_count(inputs, obs)
    ex.capacity_key, ex.capacity = _capacity(inputs, pb)
    if le.get("AFD_IMAGE"):
        ex.image = Expected(le["AFD_IMAGE"], f"AFD_IMAGE in {inputs.launch_env_path}")
    if inputs.peers:
        given = [p for p in le.get("AFD_PEER_FABRIC_IPS", "").replace(",", " ").split() if p]
        ex.peers = Expected(list(inputs.peers), f"AFD_PEER_FABRIC_IPS in {inputs.launch_env_path}"
                            if given == list(inputs.peers) else "--peer")
    fip = fabric_ip if fabric_ip is not None else getattr(obs, "fabric_ip", None)
    if fip is not None and fip.ip:
        ex.fabric_ip = Expected(fip.ip, fip.source)
    if pb is not None:
        ex.role = Expected(pb.name, inputs.role_source or f"playbook {getattr(pb, 'path', None) or pb.name}")
    else:
        ex.role = Expected("generic", "default (no --role, --playbook or AFD_ROLE)")
    g = obs.gpu
    file_ignored = obs.baseline_why if isinstance(obs.baseline_why, baseline.IgnoredWhy) else ""
    for d in (g.devices if g is not None else []):
        figures, src, ignored = baseline.for_gpu(d.uuid, d.name, obs.baseline, g.baseline, d.clock_sm_max_mhz)
        ignored = "; ".join(x for x in (file_ignored, ignored) if x)
        if ignored:
            ex.gpu_baselines[d.index] = BaselineExpected(figures, src or "none", ignored)
        elif src:
            ex.gpu_baselines[d.index] = Expected(figures, src)
    cpu = (obs.baseline or {}).get("cpu")
    if isinstance(cpu, dict) and cpu:
        ex.cpu_baseline = Expected(cpu, f"host baseline {(obs.baseline or {}).get('path')}")
    return ex
