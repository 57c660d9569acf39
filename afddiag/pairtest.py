"""The host-to-host pair test as one library call: :func:`pair_test` runs one side and returns a :class:`PairResult`.

The short phases (SEND and WRITE from 64 B past the path MTU) are verified byte for byte; a bandwidth
run (a client with a :class:`~afddiag.probes.pair.BandwidthSpec`, or a server whose client asked for
one) is judged too: its facts go through the probe registry's pair entry, as a replay of a saved one
does, and the gates of :data:`PAIR_GATES` the role runs judge them on the rail the test used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from afddiag import runner
from afddiag.endpoint import given_fabric_ip
from afddiag.inputs import InputsError
from afddiag.model import to_jsonable
from afddiag.model.pair import PairFacts
from afddiag.model.report import Report
from afddiag.model.run import Inputs
from afddiag.playbook import Playbook
from afddiag.probes import pair as pairmod
from afddiag.probes.pair import BandwidthSpec
from afddiag.probes.registry import Sources

#: What a bandwidth run is judged by: an RDMA device at all (on a DGX Spark: a cable in the CX-7's cage), the
#: rail's link, its speed and MTU, the run, the counters.
PAIR_GATES = ("fabric.cx7-hotplug", "fabric.rdma-present", "fabric.link", "fabric.mtu", "fabric.link-speed",
              "fabric.rail-bandwidth", "fabric.port-counters")

#: What every bandwidth report judges whatever the role: a device at all (on a Spark: a cable in the cage).
REQUIRED_GATES = ("fabric.cx7-hotplug", "fabric.rdma-present")

#: Seconds a bandwidth run needs on top of its own: set up, drain, the peer's check.
BW_OVERHEAD_S = 20


@dataclass
class PairResult:
    """One side's pair test: ``facts`` (what moved, timings, errors), ``report`` (the JSON report of a
    bandwidth run; None for the short phases) and ``code``: short phases 0 when every phase moved and
    verified its bytes, else 2; a bandwidth run the report's exit code (2 as well when an object was
    not destroyed)."""

    facts: PairFacts
    report: Report | None
    code: int

    def to_json(self) -> dict[str, Any]:
        """The pair test's JSON, with the bandwidth run's report under ``report``."""
        out = to_jsonable(self.facts)
        return out if self.report is None else {**out, "report": self.report}


def bandwidth_spec(seconds: float, size: int, qps: int, depth: int, pair_timeout_s: float,
                   target: str | None) -> BandwidthSpec:
    """The bandwidth run asked for (client side: ``target`` is the ``--serve`` host); raises
    :class:`~afddiag.inputs.InputsError` without a target, when a value is out of bounds, or when the
    pair test's time bound leaves no room for it."""
    if not target:
        raise InputsError("--bandwidth runs on the client side: give --pair HOST (the peer runs `afddiag "
                          "fabric --serve`, which serves whichever mode the client asks)")
    spec = BandwidthSpec(seconds, size, qps, depth)
    if (why := spec.problem()) is not None:
        raise InputsError(f"--bandwidth: {why}")
    if seconds + BW_OVERHEAD_S > pair_timeout_s:
        raise InputsError(f"--bandwidth {seconds:g} s needs --pair-timeout of at least {seconds + BW_OVERHEAD_S:g} s "
                          f"(set up, run, drain, the peer's check); got {pair_timeout_s:g}")
    return spec


def peer_and_key(serve: bool, peers: tuple[str, ...] | list[str],
                 key_path: str | None) -> tuple[str | None, bytes | None]:
    """The pair test's peer rule: ``(the one client --serve accepts, the pair key's bytes)``. ``--serve``
    needs exactly one ``--peer`` (the client's fabric IP); a key file that is unsafe or too short
    (:func:`afddiag.probes.pair.load_key`) is refused. Raises :class:`~afddiag.inputs.InputsError`."""
    if serve and len(peers) != 1:
        raise InputsError("--serve accepts one client: give its fabric IP as --peer (exactly one)" if peers else
                          "--serve needs --peer IP: the client's fabric IP (the server accepts that client only)")
    key = None
    if key_path:
        try:
            key = pairmod.load_key(key_path)
        except ValueError as e:
            raise InputsError(f"--pair-key {e}") from None
    return (peers[0] if serve else None), key


def pair_test(inputs: Inputs, serve: bool, target: str | None, port: int = pairmod.DEFAULT_PORT,
              timeout_s: float = 60.0, bandwidth: BandwidthSpec | None = None, peer: str | None = None,
              key: bytes | None = None) -> PairResult:
    """Run one side: ``serve`` one session on ``port`` to the client at ``peer`` (:func:`peer_and_key`),
    or connect to ``target`` (``HOST[:PORT]``); ``key``: the shared pair key (HMAC challenge-response).
    This host's fabric facts are read first, bounded by ``inputs.probe_timeout_s`` (rxe's 1024-slot
    GID tables under emulation outrun the 10 s default). Raises :class:`~afddiag.inputs.InputsError`
    for both sides at once or a bad ``HOST:PORT``."""
    if serve and target:
        raise InputsError("give --serve or --pair, not both")
    seen = runner.observe(Inputs(run_qp=False, families=frozenset({"fabric"}), probe_timeout_s=inputs.probe_timeout_s,
                                 xid_log=inputs.xid_log), only={"fabric", "nic"})
    fab, nic = seen.fabric, seen.nic  # nic: a Spark's CX-7 powered off for want of a cable is "no cable"
    given, _ = given_fabric_ip(inputs)  # None: the pair test picks the only IPv4 RoCE v2 address
    if serve:
        facts = pairmod.serve(port, fabric_ip=given, timeout_s=timeout_s, fabric=fab, peer=peer or "",
                              key=key, nic=nic)
    else:
        try:
            host, port = pairmod.parse_hostport(target or "", port)
        except ValueError as e:
            raise InputsError(f"--pair {e}") from None
        facts = pairmod.pair(host, port, fabric_ip=given, timeout_s=timeout_s, fabric=fab,
                             bandwidth=bandwidth, key=key, nic=nic)
    if facts.bandwidth is None:
        ok = facts.error is None and facts.destroyed and all(p.verified for p in facts.phases)
        return PairResult(facts, None, 0 if ok else 2)
    rep = judge_pair(inputs, fab, to_jsonable(facts), nic)
    return PairResult(facts, rep, rep["exit_code"] if facts.destroyed else 2)


def judge_pair(inputs: Inputs, fabric: Any, pair_json: dict[str, Any], nic: Any = None) -> Report:
    """The JSON report of one side's bandwidth run: ``pair_json`` (the pair test's JSON) read through
    the probe registry's pair entry (as a replay of a saved one is), this host's fabric facts, and the
    gates of :data:`PAIR_GATES` the role runs, on the rail the pair test used; RDMA is required (the test
    needs a device), so a host with none FAILs ``fabric.rdma-present``, the root of the rest; ``nic`` (the NIC
    probe's facts): a Spark whose CX-7 is powered off for want of a cable FAILs ``fabric.cx7-hotplug`` instead."""
    pb = inputs.playbook or Playbook()
    # the pair test runs over RDMA whatever the role: no device is its root (fabric.rdma-present FAILs and
    # explains the rest), not a bandwidth ERROR listed before it
    pb = dataclasses.replace(pb, gates=[g for g in PAIR_GATES if pb.runs(g) or g in REQUIRED_GATES],
                             requires=sorted({*pb.requires, "rdma"}),
                             name=pb.name if "rdma" in pb.requires else f"{pb.name} (for the pair test)")
    inp = dataclasses.replace(inputs, families=frozenset({"fabric"}), playbook=pb, run_qp=False,
                              fabric_ip=pair_json.get("fabric_ip") or given_fabric_ip(inputs)[0])
    obs = runner.gather(inp, host=Sources(pair=lambda: pair_json), only={"pair"})
    obs.fabric, obs.nic = fabric, nic
    return runner.judge(inp, obs)
