"""What ``afddiag devicemap`` and ``afddiag fabric --gids`` answer, as library calls returning :class:`Answer`.

Each reads this host's (or a snapshot's) fabric facts only (no QP walk, no gates) and decides, from
:mod:`afddiag.endpoint`: the device map (``DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP``) in a format of
:data:`MAP_FORMATS`, the NCCL variables for the fabric IP, or the GID table. The exit code says
whether the host gives an answer: 0 it does, 2 it has none (no device, no IPv4 RoCE v2 GID), 3 the
fabric could not be read, 64 the caller must choose (several fabric IPs and ``nccl``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from afddiag import endpoint, runner, termsafe
from afddiag.exitcodes import EXIT_ERROR, EXIT_FAIL, EXIT_OK, EXIT_USAGE
from afddiag.gates.fabric import engine_device_for
from afddiag.model.run import Inputs, Observation

#: ``afddiag devicemap --format`` names: the map (env, shell, json), the NCCL variables, the GID table.
MAP_FORMATS = ("env", "shell", "json", "nccl", "table", "csv")


@dataclass
class Answer:
    """``code`` (the exit code) and ``messages`` for stderr (one line each, no prefix), then what to print:
    ``device_map`` (address → device) or ``exports`` (the NCCL variables, name and value), or a GID
    table's ``fabric`` facts with the device the engine opens (``engine_device``, chosen as ``engine_how``)
    and the ``fabric_ip`` to mark. None: not that kind of answer."""

    code: int
    messages: list[str] = field(default_factory=list)
    device_map: dict[str, str] | None = None
    exports: list[tuple[str, str]] | None = None
    fabric: Any = None
    engine_device: str | None = None
    engine_how: str = ""
    fabric_ip: str | None = None


def fabric_facts(inputs: Inputs) -> Observation:
    """Fabric facts only (no QP walk), live or from ``inputs.snapshot`` (a folder or a capture bundle,
    extracted safely). Raises :class:`~afddiag.collect.SnapshotError` for a snapshot that is refused."""
    inputs = dataclasses.replace(inputs, run_qp=False, families=frozenset({"fabric"}))
    return runner.observe(inputs, only={"host", "env", "fabric"})


def gid_table(inputs: Inputs, obs: Observation | None = None) -> Answer:
    """Every GID of this host or the snapshot (show_gids order), marking the device the engine opens
    and the fabric IP's GID; exit 3 when the fabric could not be read, 2 without RDMA devices."""
    obs = obs or fabric_facts(inputs)
    if obs.fabric and obs.fabric.failed:
        return Answer(EXIT_ERROR, messages=[obs.fabric.failed])
    if not (obs.fabric and obs.fabric.devices):
        return Answer(EXIT_FAIL, messages=[endpoint.no_map_reason(obs.fabric)])
    fip = (obs.fabric_ip or endpoint.fabric_ip_of(inputs, obs.fabric)).ip
    dev, how = engine_device_for(obs.fabric, obs.env, fip)
    return Answer(EXIT_OK, fabric=obs.fabric, engine_device=dev, engine_how=how, fabric_ip=fip)


def devicemap(inputs: Inputs, fmt: str = "env") -> Answer:
    """The device map of this host or the snapshot as ``fmt`` (:data:`MAP_FORMATS`; ``table``/``csv``:
    :func:`gid_table`). Exit 2 (saying why) when no address qualifies or the map lacks
    ``inputs.fabric_ip``; ``nccl``: exit 64 with several fabric IPs and none given, 2 when the fabric
    IP's port is not ACTIVE, or (but for ``json``) when a device name is unfit for a shell
(:func:`afddiag.termsafe.device_name_problem`). Entries whose port is down are named in ``messages``."""
    obs = fabric_facts(inputs)
    if fmt in ("table", "csv"):
        return gid_table(inputs, obs)
    given = inputs.fabric_ip
    dm = endpoint.device_map(obs.fabric)
    if not dm:
        return Answer(EXIT_FAIL, messages=[endpoint.no_map_reason(obs.fabric)])
    if given and given not in dm:  # every format: a map that lacks the launcher's own address is no answer for it
        return Answer(EXIT_FAIL, messages=[endpoint.no_map_reason(obs.fabric, given)])
    if fmt != "json":  # env, shell and nccl lines are sourced by a shell: a name that is no device name is refused
        bad = next((why for why in map(termsafe.device_name_problem, dm.values()) if why), None)
        if bad:
            return Answer(EXIT_FAIL, messages=[f"{bad}; not printed for a shell (--format json shows it as data)"])
    caveats = endpoint.devicemap_caveats(obs.fabric, dm)
    if fmt != "nccl":
        return Answer(EXIT_OK, caveats, device_map=dm)
    fip = obs.fabric_ip or endpoint.fabric_ip_of(inputs, obs.fabric)
    if fip.ip is None:  # the caller's to say, not the host's fault: a usage error (64), not FAIL (2)
        return Answer(EXIT_USAGE, messages=caveats + [
            f"--format nccl on a host with several fabric IPs ({', '.join(sorted(dm))}): give --fabric-ip with the "
            "one the launcher uses"])
    pairs = [p for p in endpoint.launch_exports(obs.fabric, fip.ip) if p[0].startswith("NCCL_")]
    if not pairs:
        down = next((e for e in fip.candidates if e.ip == fip.ip), None)
        state = (down.port_state or "in an unknown state") if down else ""
        why = (f"{down.device} port {down.port} carries it, but that port is {state} and NCCL uses only ACTIVE "
               "ports (`afddiag fabric` judges the link in fabric.link)" if down else
               "no IPv4 RoCE v2 GID on an ACTIVE port carries it: give --fabric-ip with one of "
               + ", ".join(sorted(dm)))
        return Answer(EXIT_FAIL, messages=caveats + [f"fabric IP {fip.ip}: {why}"])
    return Answer(EXIT_OK, caveats, exports=pairs)
