"""The per-host summary's JSON shape (schema: ``afddiag/schema/report.schema.json``, ``summary``), typed.

:mod:`afddiag.summary` builds a :class:`Summary` from a run's typed facts when the report is made
and loads (checks) one from a report's JSON; the fleet gates (:mod:`afddiag.gates.fleet`) read only
this. Every key but ``summary_version`` may be missing in a summary of an older afddiag.
"""

from __future__ import annotations

from typing import Literal, TypedDict

SUMMARY_VERSION = 1

VerdictName = Literal["PASS", "WARN", "FAIL", "SKIP", "ERROR"]


class VerdictBrief(TypedDict):
    """One host gate's verdict and summary line, as the fleet quotes it."""

    verdict: VerdictName | None
    summary: str


class _CapacitySpelled(TypedDict, total=False):
    spelled: str  # the launch env file's own name for the flag, when the site's aliases spell it otherwise


class Capacity(_CapacitySpelled):
    """This role's capacity flag (``launch.capacity``): ``key`` one of :data:`afddiag.envvars.CAPACITY_KEYS`;
    ``spelled`` the launch env file's own name for it when the site's aliases spell it otherwise."""

    key: str
    value: int
    set: bool


class GpuRow(TypedDict):
    """One GPU: NVML's name and UUID, the CUDA SM count, the load probe's figures (``LOAD_FIGURES`` keys)."""

    name: str | None
    uuid: str | None
    sm_count: int | None
    under_load: dict[str, float]


class Rail(TypedDict, total=False):
    """A port ``NCCL_IB_HCA`` selects besides the fabric port (``fabric.devicemap-env``'s ``rails``)."""

    port: str | None
    ip: str | None
    subnet: str | None
    gid_index: int | None


class FirmwareRow(TypedDict):
    """One HCA model's firmware: ``hca`` the board id (PSID) when read, else the HCA type, else "?"."""

    hca: str
    fw_ver: str


class Attempt(TypedDict):
    """One TCP connect of ``launch.control-plane``: its outcome is connected, refused, timeout,
    unreachable, bind failed or error."""

    peer: str
    port: int
    outcome: str


class PeerPort(TypedDict):
    """A (peer, port) connect that was not tried (the probe's time bound was used up)."""

    peer: str
    port: int


class AdvertisedBad(TypedDict):
    """A launch-env address that is a wildcard or loopback: the variable, its value, why it is bad."""

    key: str
    value: str
    why: str


class ControlPlane(TypedDict):
    """What ``launch.control-plane`` found (``source``: the fabric IP the connects were bound to)."""

    verdict: VerdictName | None
    source: str | None
    peers: list[str]
    ports: list[int]
    attempts: list[Attempt]
    not_tried: list[PeerPort]
    advertised_bad: list[AdvertisedBad]


class KnownBad(TypedDict):
    """``host.known-bad``'s verdict and the ids of the known-bad matrix entries that matched on the host."""

    verdict: VerdictName | None
    matched: list[str]


class NcclBuild(TypedDict):
    """The libnccl the engine loads (the NCCL probe, ``launch.nccl``): its path with links resolved,
    where it was found (LD_PRELOAD, LD_LIBRARY_PATH, wheel, system), its version and ELF build id."""

    path: str
    origin: str
    version: str | None
    build_id: str | None


class EngineNet(TypedDict):
    """What NCCL said it chose (``--engine-log``, ``launch.engine-net``): its network (``IB``, ``Socket``),
    the devices of ``NET/IB : Using`` as ``device:port/link layer``, the GID indexes its connections used."""

    network: str
    devices: list[str]
    gid_indexes: list[int]


class Summary(TypedDict, total=False):
    """The per-host summary (fields documented in :mod:`afddiag.summary`); None where the host did not say;
    ``{}`` for no report at all (:func:`afddiag.summary.of`)."""

    summary_version: int
    role: str | None
    fabric_ip: str | None
    fabric_ip_source: str | None
    ipv4_prefixlen: dict[str, int]
    launch_env: str | None
    engine_device: str | None
    rdma_device: str | None
    port: int | None
    gid_index: int | None
    netdev: str | None
    netdev_mtu_bytes: int | None
    roce_mtu_bytes: int | None
    device_map: dict[str, str]
    device_map_env: str | None
    gid_index_env: str | None
    gid_index_envs: dict[str, str]
    devicemap_env: VerdictBrief | None
    fabric_link: VerdictBrief | None
    first_device: VerdictBrief | None
    capacity: Capacity | None
    gpus: list[GpuRow]
    slow_state: VerdictBrief | None
    gpu_busy: bool
    rails: list[Rail]
    versions: dict[str, str]
    firmware: list[FirmwareRow]
    control_plane: ControlPlane | None
    known_bad: KnownBad | None
    nccl: NcclBuild | None
    engine: EngineNet | None
