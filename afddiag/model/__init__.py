"""The model: plain data a run carries, no I/O.

- :mod:`afddiag.model.fabric`: RDMA devices, ports, GIDs, netdevs, the QP walk, routes (fabric facts);
- :mod:`afddiag.model.gpu`: GPUs through NVML and the CUDA driver, the load probe's figures;
- :mod:`afddiag.model.host`: the launch image, process limits, device nodes (host facts);
- :mod:`afddiag.model.run`: :class:`~afddiag.model.run.Inputs` (what the user asked) and
  :class:`~afddiag.model.run.Observation` (the facts of one run).

Units are in field names (``_mhz``, ``_mw``, ``_bytes``). A value a probe could not read is ``None``
and the reason is in the owning object's ``notes``.
"""

from __future__ import annotations

import ipaddress
from typing import Any

ROCE_V2 = "RoCE v2"  # a GID's type as the kernel prints it (gid_attrs/types/<i>)
ROCE_V1 = "IB/RoCE v1"
ROCE_MTUS = (4096, 2048, 1024, 512, 256)
ROCE_OVERHEAD = 40 + 8 + 12 + 4 + 28 + 4  # GRH + UDP + BTH + XRC ETH + AtomicETH + ICRC (iboe_get_mtu)


def roce_mtu(netdev_mtu: int) -> int:
    """RoCE path MTU (bytes) for a netdev MTU, as the kernel's ``iboe_get_mtu`` computes it:
    the largest of 256…4096 that fits the netdev MTU less RoCE headers (1500 → 1024, 9000 → 4096).
    Returns 0 below 256."""
    room = netdev_mtu - ROCE_OVERHEAD
    return next((m for m in ROCE_MTUS if room >= m), 0)


def is_link_local_v4(ip: str | None) -> bool:
    """True for an IPv4 link-local address (169.254.0.0/16, RFC 3927): not routed between subnets."""
    try:
        return ipaddress.IPv4Address(ip or "").is_link_local
    except ValueError:
        return False


def to_jsonable(obj: Any) -> Any:
    """Dataclasses (but their fields whose metadata says ``json=False``), lists and dicts to plain JSON types."""
    if hasattr(obj, "__dataclass_fields__"):  # field by field: asdict() deep-copies first
        return {k: to_jsonable(getattr(obj, k)) for k, f in obj.__dataclass_fields__.items()
                if f.metadata.get("json", True)}  # a field marked json=False stays out (Verdict.found)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj
