"""What a run was asked (:class:`Inputs`) and what it saw (:class:`Observation`). Data only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from afddiag.model.gpu import GpuFacts
from afddiag.model.host import HostLimits, ImageFacts, PcieFacts, ReachFacts
from afddiag.playbook import Playbook, timeout_for

if TYPE_CHECKING:  # field types only: a gpu run never loads the fabric models
    from afddiag.model.fabric import FabricFacts, MemRegFacts, QpFacts, RouteFacts

ALL_FAMILIES = frozenset({"fabric", "gpu", "host", "launch"})


@dataclass
class Inputs:
    """What the user asked for (flags), before any probing."""

    fabric_ip: str | None = None  # --fabric-ip (the launch env's AFD_FABRIC_IP: afddiag.endpoint.given_fabric_ip)
    peers: list[str] = field(default_factory=list)
    expect_sm: int | None = None
    snapshot: str | None = None
    # --timeout: overrides the playbook's fabric_s, gpu_s, cpu_s, image_s, limits_s
    probe_timeout_s: float | None = None
    qp_timeout_s: float | None = None  # --qp-timeout: overrides the playbook's qp_s
    run_qp: bool = True
    launch_env: dict[str, str] | None = None  # parsed --launch-env file (afddiag's key names)
    launch_env_path: str | None = None
    # afddiag's name -> the launch env file's own, for the keys it sets through the playbook's aliases
    launch_env_spelled: dict[str, str] = field(default_factory=dict)
    expect_capacity: int | None = None
    playbook: Playbook | None = None
    load: bool = False  # run the GPU load probe (also when the playbook asks)
    load_budget_s: float = 3.0
    baseline_path: str | None = None
    engine_log: str | None = None  # --engine-log: the engine's output (NCCL_DEBUG=INFO) to read NCCL's choices from
    xid_log: str | None = None  # a saved kernel log to read Xid events and the NIC's lines from instead of /dev/kmsg
    families: frozenset[str] = ALL_FAMILIES  # the gate families the command runs (and the probes feeding them)
    role_source: str = ""  # where the playbook came from (afddiag.inputs.resolve): "--role expert", "AFD_ROLE in FILE"
    # input (afddiag.inputs.STORED_FLAGS key) -> where it came from: "--peer", "captured with --peer"
    sources: dict[str, str] = field(default_factory=dict)
    # --gate: the gate ids asked for with every gate they depend on (afddiag.inputs.select_gates); only
    # they run, fed by only the probes they read (afddiag.probes.registry.probes_for). None: every gate
    gates: frozenset[str] | None = None

    def __post_init__(self) -> None:
        """The launch env feeds the peers when the flags do not give them (the fabric IP's precedence is
        :func:`afddiag.endpoint.given_fabric_ip`'s)."""
        le = self.launch_env or {}
        if not self.peers and le.get("AFD_PEER_FABRIC_IPS"):
            self.peers = [p for p in le["AFD_PEER_FABRIC_IPS"].replace(",", " ").split() if p]

    def timeout(self, kind: str) -> float:
        """Seconds the probe ``kind`` ("fabric_s", "qp_s", "gpu_s", "load_s", "cpu_s", "image_s",
        "limits_s") may take: --qp-timeout for qp_s, --timeout for the others but load_s, else the
        playbook's ``[timeouts]``, else the defaults (:data:`afddiag.playbook.DEFAULT_TIMEOUTS`)."""
        if kind == "qp_s" and self.qp_timeout_s is not None:
            return float(self.qp_timeout_s)
        if kind not in ("qp_s", "load_s") and self.probe_timeout_s is not None:
            return float(self.probe_timeout_s)
        return timeout_for(self.playbook, kind)

    def spelled(self, name: str) -> str:
        """``name`` (an afddiag launch variable) as the operator's launch env file spells it."""
        return self.launch_env_spelled.get(name, name)


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
    # variable → where it came from (launch env FILE, snapshot env, process environment)
    env_sources: dict[str, str] = field(default_factory=dict)
    image: ImageFacts | None = None
    limits: HostLimits | None = None
    cpu: dict[str, Any] | None = None  # host CPU facts (probes/cpu.py); None: not probed
    baseline: dict[str, Any] | None = None  # the host's recorded baseline
    baseline_why: str = ""
    route: RouteFacts | None = None  # None: not probed
    versions: dict[str, Any] | None = None  # kernel, bios, rdma_core; None: not read
    memreg: MemRegFacts | None = None  # which memory the NIC can register; None: not probed
    pcie: PcieFacts | None = None  # PCIe links of the RDMA NICs and GPUs; None: not probed
    aer: Any = None  # afddiag.model.aer.AerFacts: PCIe AER counters of the NIC functions and GPUs; None: not probed
    reach: ReachFacts | None = None  # TCP connects to the peers' engine ports; None: not probed
    fabric_ip: Any = None  # afddiag.endpoint.FabricIp, resolved once right after the fabric probe; None: not yet
    platform: Any = None  # afddiag.model.platform.PlatformFacts: DGX OS release, board; None: not probed
    shm: Any = None  # afddiag.model.shm.ShmFacts: /dev/shm entries and their live holders; None: not probed
    nic: Any = None  # afddiag.model.nic.NicFacts: CX-7 hot-plug state, the NIC's kernel-log lines; None: not probed
    engine: Any = None  # afddiag.model.engine.EngineFacts: what NCCL said it chose (--engine-log); None: not read
    nccl: Any = None  # afddiag.model.nccl.NcclFacts: libnccl copies, NCCL_* variables, nccl.conf; None: not probed
    pair: Any = None  # afddiag.model.pair.PairFacts: the pair test's result (bandwidth run); None: not run
    stored_inputs: dict[str, Any] | None = None  # a replayed capture's inputs.json (checked); None: none kept
    notes: list[str] = field(default_factory=list)


def wants_load(inputs: Inputs) -> bool:
    """--load, or a playbook that turns the slow-state load probe on (--no-load turned it off)."""
    return bool(inputs.load or (inputs.playbook and inputs.playbook.load_probe))
