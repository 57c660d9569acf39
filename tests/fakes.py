"""Test fakes in one place: facts built directly (no host, no snapshot) and one way to judge them;
host sources that read a case folder instead of this machine (:func:`case_sources`).

``judge`` reaches a gate by its id through the gate registry (the ids and verdicts are the stable
seam; which function implements a gate may move), fills in the typed action as a report does, and
returns the verdict. ``observation`` never reads the host: every probe's facts are None (not probed)
unless given. A :class:`~afddiag.probes.registry.Sources` field a fake leaves out is not read
(``Sources()`` reads nothing of the host running the tests); a real run asks for :meth:`Sources.live`.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from afddiag.diagnosis import fill_actions
from afddiag.envvars import parse_env_file
from afddiag.expect import Expectations, Expected
from afddiag.gates import Context, registry, resolve_fabric_ip
from afddiag.model.run import Inputs, Observation
from afddiag.probes.netlink import parse_ip_addr_json, parse_rdma_dev_json
from afddiag.probes.registry import Sources
from afddiag.probes.sysfs import read_text
from afddiag.verdict import Verdict
from conftest import load_case


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


def einval_reader(root: Path):
    """A sysfs reader over a case tree that answers EINVAL for the attribute files of the slots its
    ``gid_attrs/EINVAL-SLOTS`` lists, as a real kernel does for empty GID slots."""

    def read(path: str) -> str:
        p = Path(path)
        if p.parent.name in ("types", "ndevs") and p.parent.parent.name == "gid_attrs":
            slots = p.parent.parent / "EINVAL-SLOTS"
            if slots.is_file() and p.name in slots.read_text().split():
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
        return read_text(path)

    return read


def case_sources(case: Path, **over) -> Sources:
    """A capture pointed at a case: its sys/ tree as the root, its rdma-dev.json as the netlink
    order, its ip-addr.json as the addresses, its env (plus variables that must not leave), its
    gpu.json as the GPU reading."""
    meta = load_case(case)

    def j(name):
        return json.loads((case / name).read_text()) if (case / name).is_file() else None

    order = parse_rdma_dev_json(j("rdma-dev.json")) if j("rdma-dev.json") is not None else None
    addrs = j("ip-addr.json")

    def addresses():
        if addrs is None:
            raise OSError("getifaddrs failed")
        return parse_ip_addr_json(addrs)

    env = parse_env_file((case / "env").read_text()) if (case / "env").is_file() else {}
    gpu = j("gpu.json")
    route = j("ip-route.json")
    kw = dict(root=str(case), device_order=lambda: (order, "netlink (fake)", []), addresses=addresses,
              gpu=(lambda: gpu) if gpu is not None else (lambda: {"devices": [], "why": "no NVIDIA GPU seen: test"}),
              route=(lambda: route) if route is not None else None,
              rdma_core=lambda: {"version": "50.0", "source": "test"},
              environ={**env, "HOME": "/root", "AWS_SECRET_ACCESS_KEY": "nope", "AFD_ROLE": "expert",
                       "NCCL_SOCKET_IFNAME": "enp1"},
              hostname=lambda: meta.get("host", case.name), reader=einval_reader(case))
    if gpu is None:
        kw["gpu"] = None  # a fabric case had no GPU reading: its replay says "not captured" as the case does
    kw.update(over)
    return Sources(**kw)


def case_args(case: Path) -> list[str]:
    """The command-line arguments a case was judged with: its fabric IP and its peers (case.json)."""
    meta = load_case(case)
    args = ["--fabric-ip", meta["fabric_ip"]] if meta.get("fabric_ip") else []
    for p in meta.get("peer_fabric_ips") or []:
        args += ["--peer", p]
    return args
