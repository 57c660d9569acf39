"""Platform facts the known-bad matrix judges beyond the kernel and the HCA firmware: the DGX OS release
(``/etc/dgx-release``), the board (DMI ``product_name``) and the NCCL builds on the host. Data only: the
probe is :mod:`afddiag.probes.platform`, the gate :mod:`afddiag.gates.known_bad`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PlatformFacts:
    """``dgx_os``: ``DGX_OTA_VERSION`` (the last OTA applied), else ``DGX_SWBUILD_VERSION`` (the image
    installed) from ``/etc/dgx-release``, ``dgx_os_source`` the key it came from (None: not a DGX OS host
    or not read); ``board``: ``/sys/class/dmi/id/product_name``; ``nccl``: ``[{"version", "build_id",
    "path"}]`` of the libnccl copies found (None: not read; afddiag does not read them yet)."""

    captured: bool = True
    dgx_os: str | None = None
    dgx_os_source: str | None = None
    board: str | None = None
    nccl: list[dict[str, Any]] | None = None
    failed: str | None = None
    notes: list[str] = field(default_factory=list)
