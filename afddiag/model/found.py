"""What a gate works out beyond its verdict, typed: the values the per-host summary
(:func:`afddiag.summary.from_run`) and ``preflight --export`` (:func:`afddiag.runner.judge_with_exports`)
read at judge time, never a gate's ``facts`` by key.

A gate puts one on its :class:`~afddiag.verdict.Verdict` (``found``); the JSON report leaves it out (the
gate's ``facts`` say the same for people). A report of an older afddiag is read back into these by
:func:`afddiag.summary.from_report`, the one place gate JSON is read.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CapacityFlag:
    """``launch.capacity``: this role's capacity flag in the launch env (``AFD_EXPERT_CAPACITY``, ...),
    its value (the engine default when unset) and whether the file sets it; ``spelled``: the file's own name
    for it when the site's aliases spell it otherwise (``CAPACITY``), else None."""

    key: str
    value: int
    set: bool
    spelled: str | None = None


@dataclass(frozen=True)
class FabricGid:
    """``fabric.rocev2-ipv4``: the fabric IP's IPv4 RoCE v2 GID (sysfs ``ports/<port>/gids/<gid_index>``)."""

    device: str | None
    port: int | None
    gid_index: int | None
    netdev: str | None


@dataclass(frozen=True)
class PathMtu:
    """``fabric.mtu``: the fabric netdev, its MTU and the RoCE path MTU it gives (bytes)."""

    netdev: str | None
    netdev_mtu_bytes: int | None
    roce_mtu_bytes: int | None


@dataclass(frozen=True)
class EngineDevice:
    """``fabric.first-device``: the RDMA device the engine opens (None: not known, e.g. device order unknown)."""

    device: str | None


@dataclass(frozen=True)
class Rail:
    """A port ``NCCL_IB_HCA`` selects besides the fabric port, with its own routable IPv4 RoCE v2 GID."""

    port: str  # "mlx5_1:1"
    ip: str
    subnet: str  # "10.9.1.0/24"
    gid_index: int


@dataclass(frozen=True)
class DeviceSelectors:
    """``fabric.devicemap-env``: the variables a FAIL is about (in order; ``preflight --export`` corrects
    those only) and the rails ``NCCL_IB_HCA`` selects besides the fabric port."""

    failed_vars: tuple[str, ...] = ()
    rails: tuple[Rail, ...] = ()


@dataclass(frozen=True)
class GpuBusy:
    """``gpu.slow-state``: a GPU was busy with another job (its load figures are inconclusive)."""

    busy: bool


@dataclass(frozen=True)
class AdvertisedAddress:
    """A launch-env address peers are told to connect to that no peer can reach (wildcard, loopback)."""

    key: str
    value: str
    why: str


@dataclass(frozen=True)
class Advertised:
    """``launch.control-plane``: the advertised addresses that are wrong."""

    bad: tuple[AdvertisedAddress, ...] = ()


Found = CapacityFlag | FabricGid | PathMtu | EngineDevice | DeviceSelectors | GpuBusy | Advertised
