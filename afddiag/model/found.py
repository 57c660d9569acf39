"""What a gate works out beyond its verdict, typed: the values ``preflight --export``
(:func:`afddiag.runner.judge_with_exports`) reads at judge time, never a gate's ``facts`` by key.

A gate puts one on its :class:`~afddiag.verdict.Verdict` (``found``); the JSON report leaves it out (the
gate's ``facts`` say the same for people).
"""

from __future__ import annotations

from dataclasses import dataclass


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


Found = DeviceSelectors
