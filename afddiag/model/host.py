"""Host facts: the container image the launcher runs, process limits, RDMA device nodes.

Data only (no I/O). Sources: ``docker|podman image inspect``, ``getrlimit``, ``access(2)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class ImageFacts:
    """The container image the launcher runs (``docker|podman image inspect``, live or replayed)."""

    ref: str | None = None
    source: str | None = None  # "docker", "podman", or the snapshot file
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # the image's Config.Env
    why: str | None = None  # why nothing was read
    failed: str | None = None  # the image probe timed out or crashed (gpu.image-arch says ERROR)


@dataclass
class DeviceNode:
    """A character device the engine opens (``/dev/infiniband/uverbs0``, ``rdma_cm``)."""

    path: str
    exists: bool = False
    readable: bool = False
    writable: bool = False


@dataclass
class HostLimits:
    """Process limits and RDMA device-node access of the launching user (``getrlimit``, ``access``)."""

    captured: bool = True
    memlock_soft_bytes: int | None = None  # -1: unlimited (RLIM_INFINITY)
    memlock_hard_bytes: int | None = None
    device_nodes: list[DeviceNode] = field(default_factory=list)
    in_container: bool = False
    user: str | None = None
    notes: list[str] = field(default_factory=list)
    failed: str | None = None  # the limits probe timed out or crashed (launch.memlock/uverbs-access say ERROR)
