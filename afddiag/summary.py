"""The per-host summary: what the fleet compares between hosts, in one typed place of each host report.

Each host report carries ``summary`` (schema: ``afddiag/schema/report.schema.json``, ``summary``).
The fleet gates (:mod:`afddiag.gates.fleet`) read only it, never another gate's free-form facts:
a key renamed in a gate's facts changes this module and its schema, not the fleet.

:func:`from_run` builds it at judge time (:mod:`afddiag.runner`) from the run's typed facts: the
:class:`~afddiag.model.run.Observation` (its fabric, GPU, versions and reach dataclasses), the
:class:`~afddiag.model.run.Inputs`, the resolved fabric IP and the :class:`~afddiag.verdict.Verdict`
objects (their verdict, summary line and, for what only a gate works out, its typed findings:
``Verdict.found``, :mod:`afddiag.model.found`), never a gate's facts by key. Its shape is
:class:`afddiag.model.summary.Summary`; its fields are listed once, in :func:`_assemble`. :func:`of`
gives a report's summary to the fleet: the one the report carries once it passes the schema's
``summary`` check (:func:`load`), else one built by
:func:`from_report` from the report's JSON (a report of an older afddiag that carries none: ``afddiag
merge`` of files collected earlier; only there are gate facts and note text read, back into the same
typed findings: :func:`_legacy_found`).

Fields (None where the host did not say):

- ``role``; ``fabric_ip``, ``fabric_ip_source``; ``ipv4_prefixlen`` (address → prefix length, from
  the netdevs' addresses); ``launch_env`` (the file the launch settings came from);
- ``engine_device`` (the device the engine opens), ``rdma_device``/``port``/``gid_index`` (the
  fabric IP's IPv4 RoCE v2 GID), ``netdev``, ``netdev_mtu_bytes``, ``roce_mtu_bytes``;
- ``device_map`` (this host's own map), ``device_map_env`` (the map the launcher exports),
  ``gid_index_env`` (``NCCL_IB_GID_INDEX``), ``gid_index_envs`` (``{variable: value}`` of every
  engine's forced GID index that is set: ``NCCL_IB_GID_INDEX``, ``MC_GID_INDEX``,
  ``UCX_IB_GID_INDEX``), ``devicemap_env`` (``{verdict, summary}`` of
  ``fabric.devicemap-env``), ``fabric_link`` (``{verdict, summary}`` of ``fabric.link``: a host whose
  link is down explains the connections to and from it), ``first_device`` (``{verdict, summary}`` of
  ``fabric.first-device``: whether the device the engine opens, map or no map, carries the fabric IP);
- ``capacity`` (``{key, value, set}``, and ``spelled`` when the launch env file names it through an
  alias: this role's capacity flag);
- ``gpus`` (``[{name, uuid, sm_count, under_load: {clock_sm_mhz, fp32_tflops, bf16_tflops,
  gemv_gbps, copy_gbps}}]``), ``slow_state`` (``{verdict, summary}`` of ``gpu.slow-state``),
  ``gpu_busy`` (the GPU was busy with another job: figures inconclusive);
- ``rails`` (``[{port, ip, subnet, gid_index}]``: the ports ``NCCL_IB_HCA`` selects besides the fabric port);
- ``versions`` (``afddiag``, ``driver``, ``kernel``, ``bios``, ``rdma_core``, ``firmware``);
  ``firmware`` (``[{hca, fw_ver}]``: each HCA model's firmware, ``hca`` the board id (PSID, sysfs
  ``board_id``) when read, else the HCA type (``hca_type``, e.g. ``MT4129``); fleet.versions compares
  firmware only between HCAs of one ``hca``);
- ``control_plane`` (:func:`control_plane_of`: ``{verdict, source, peers, ports, attempts: [{peer, port,
  outcome}], not_tried: [{peer, port}], advertised_bad: [{key, value, why}]}`` from ``launch.control-plane``;
  None when the report has no such gate: an older afddiag, or the launch gates were not run);
- ``known_bad`` (:func:`known_bad_of`: ``{verdict, matched: [entry ids]}`` of ``host.known-bad``; None when
  the report has no such gate);
- ``nccl`` (``{path, origin, version, build_id}``: the libnccl the engine loads, the NCCL probe's first
  copy in the loader's order; None when not searched or none found; fleet.nccl-build compares them);
- ``engine`` (``{network, devices: ["device:port/link layer"], gid_indexes}``: what NCCL said it chose in
  the engine log given with ``--engine-log``; None without NCCL NET lines; fleet.engine-net compares them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from afddiag import __version__
from afddiag.envvars import CAPACITY_KEYS, GID_INDEX_VARS, MAP_VAR, NCCL_GID_VAR, redact_report
from afddiag.model.found import (
    Advertised,
    CapacityFlag,
    DeviceSelectors,
    EngineDevice,
    FabricGid,
    Found,
    GpuBusy,
    PathMtu,
    Rail,
)
from afddiag.model.gpu import LOAD_FIGURES, GpuFacts
from afddiag.model.report import Report
from afddiag.model.run import Inputs, Observation
from afddiag.model.summary import (
    SUMMARY_VERSION,
    ControlPlane,
    EngineNet,
    FirmwareRow,
    GpuRow,
    NcclBuild,
    Summary,
    VerdictBrief,
)
from afddiag.schema.validate import summary_check
from afddiag.textnum import digits
from afddiag.verdict import VERDICTS, Verdict

__all__ = ["SUMMARY_VERSION", "Summary", "as_int", "from_report", "from_run", "load", "of"]

F = TypeVar("F")


def _d(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def as_int(v: Any) -> int | None:
    """An integer reading, or a string of digits as one; None for anything else (booleans too)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and digits(v.strip()):
        return int(v.strip())
    return None


def _num(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _verdict(g: dict[str, Any]) -> dict[str, Any] | None:
    return {"verdict": g.get("verdict"), "summary": str(g.get("summary", ""))} if g else None


def versions_of(rep: Report | Mapping[str, Any]) -> dict[str, str]:
    """``afddiag``, ``driver`` (NVIDIA), ``kernel``, ``bios``, ``rdma_core`` and ``firmware`` (per HCA
    type: ``"MT4129 28.45.4028"``; several joined by ",") from a report's facts."""
    f = _d(rep.get("facts"))
    out: dict[str, str] = {}
    if rep.get("afddiag_version"):
        out["afddiag"] = str(rep["afddiag_version"])
    g = _d(f.get("gpu"))
    if g.get("driver_version"):
        out["driver"] = str(g["driver_version"])
    v = {**_d(g.get("versions")), **_d(f.get("versions"))}
    for k in ("kernel", "bios", "rdma_core"):
        if v.get(k):
            out[k] = str(v[k])
    fws = sorted({f"{d.get('hca_type') or '?'} {d.get('fw_ver')}" for d in (_d(f.get("fabric")).get("devices") or [])
                  if isinstance(d, dict) and d.get("fw_ver")})
    if fws:
        out["firmware"] = ", ".join(fws)
    return out


def firmware_of(rep: Report | Mapping[str, Any]) -> list[dict[str, str]]:
    """Each HCA model's firmware from a report's ``facts.fabric.devices``: ``[{"hca", "fw_ver"}]``,
    ``hca`` the board id (PSID, sysfs ``board_id``: one board's firmware line) when the report has it,
    else the HCA type (sysfs ``hca_type``, the chip: MT4129 is a ConnectX-7), else "?"; one row per
    distinct pair, sorted. Firmware is comparable only between rows of one ``hca`` (a ConnectX-4
    and a ConnectX-7 have unrelated version lines)."""
    rows = {(str(d.get("board_id") or d.get("hca_type") or "?"), str(d.get("fw_ver")))
            for d in (_d(_d(rep.get("facts")).get("fabric")).get("devices") or [])
            if isinstance(d, dict) and d.get("fw_ver")}
    return [{"hca": h, "fw_ver": v} for h, v in sorted(rows)]


def known_bad_of(gate: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``{"verdict", "matched": [entry ids]}`` of a report's ``host.known-bad`` gate (its JSON: the
    ``entries`` its facts list with result "match"); None without the gate. Never raises on odd content."""
    if not isinstance(gate, Mapping):
        return None
    entries = _d(gate.get("facts")).get("entries")
    matched = [str(e.get("id")) for e in entries if isinstance(e, dict) and e.get("result") == "match"] \
        if isinstance(entries, list) else []
    return {"verdict": gate.get("verdict") if gate.get("verdict") in VERDICTS else None, "matched": matched}


def _known_bad_gate(rep: Report | Mapping[str, Any]) -> Mapping[str, Any] | None:
    return next((g for g in rep.get("gates") or [] if isinstance(g, dict) and g.get("id") == "host.known-bad"), None)


_NOT_TRIED = re.compile(r"^(\S+):(\d+) not tried")


def control_plane_of(rep: Report | Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``launch.control-plane`` found on this host, for ``fleet.control-plane``: ``{"verdict",
    "source"`` (the fabric IP the connects were bound to), ``"peers"`` (IPv4 addresses), ``"ports"``
    (TCP ports), ``"attempts": [{"peer", "port", "outcome"}]`` (outcome as
    :func:`afddiag.probes.reach.connect_once` says: connected, refused, timeout, unreachable, bind failed,
    error), ``"not_tried": [{"peer", "port"}]`` (the probe's time bound was used up), ``"advertised_bad":
    [{"key", "value", "why"}]`` (launch-env addresses that are wildcards or loopback)``}``. None when the
    report has no ``launch.control-plane`` gate. Never raises on odd content."""
    g = next((g for g in rep.get("gates") or [] if isinstance(g, dict) and g.get("id") == "launch.control-plane"), None)
    if g is None:
        return None
    f = _d(g.get("facts"))
    def seq(k: str) -> list[Any]:
        v = f.get(k)
        return v if isinstance(v, list) else []

    attempts = []
    for a in seq("attempts"):
        if isinstance(a, dict) and isinstance(a.get("peer"), str) and as_int(a.get("port")) is not None:
            attempts.append({"peer": a["peer"], "port": as_int(a["port"]), "outcome": str(a.get("outcome") or "error")})
    not_tried = []
    for n in seq("notes"):
        m = _NOT_TRIED.match(str(n))
        if m:
            not_tried.append({"peer": m.group(1), "port": int(m.group(2))})
    bad = [{"key": str(b.get("key")), "value": str(b.get("value")), "why": str(b.get("why"))}
           for b in seq("advertised_bad") if isinstance(b, dict)]
    verdict = g.get("verdict") if g.get("verdict") in VERDICTS else None
    return {"verdict": verdict, "source": f.get("source") if isinstance(f.get("source"), str) else None,
            "peers": [str(p) for p in seq("peers")],
            "ports": [p for p in map(as_int, seq("ports")) if p is not None and 0 < p < 65536],
            "attempts": attempts, "not_tried": not_tried, "advertised_bad": bad}


def _legacy_found(gate_id: str, facts: dict[str, Any]) -> Found | None:
    """What a gate of an older report worked out, read back from its JSON ``facts`` (the one place gate
    facts are read by key: a report of an afddiag that carries no summary). Never raises on odd content."""
    if gate_id == "launch.capacity":
        value = as_int(facts.get("value"))
        sp = facts.get("spelled")  # the launch env file's own name for it (a site alias), when not afddiag's
        return CapacityFlag(facts["key"], value, bool(facts.get("set")),
                            sp if isinstance(sp, str) and sp not in CAPACITY_KEYS.values() else None) \
            if facts.get("key") in CAPACITY_KEYS.values() and value is not None else None
    if gate_id == "fabric.rocev2-ipv4":
        e = _d(facts.get("entry"))
        return FabricGid(e.get("device"), as_int(e.get("port")), as_int(e.get("gid_index")), e.get("netdev"))
    if gate_id == "fabric.mtu":
        return PathMtu(facts.get("netdev"), as_int(facts.get("netdev_mtu")), as_int(facts.get("roce_mtu")))
    if gate_id == "fabric.first-device":
        return EngineDevice(facts.get("engine_device"))
    if gate_id == "gpu.slow-state":
        return GpuBusy(any(isinstance(v, dict) and v.get("busy") for v in facts.values()))
    if gate_id == "fabric.devicemap-env":
        rails = [r for r in facts.get("rails") or [] if isinstance(r, dict)]
        return DeviceSelectors(rails=tuple(Rail(*(_raw(r, k) for k in ("port", "ip", "subnet", "gid_index")))
                                           for r in rails))
    return None


def _raw(d: Mapping[str, Any], key: str) -> Any:
    """``d[key]`` as the JSON holds it (None when absent): an older report's value, passed on unchecked
    (the summary's schema check judges it)."""
    return d.get(key)


def _legacy_verdict(g: Mapping[str, Any]) -> Verdict:
    """One gate of a report's JSON as a :class:`~afddiag.verdict.Verdict` (its ``found`` read back by
    :func:`_legacy_found`)."""
    gate_id, facts = str(g.get("id")), _d(g.get("facts"))
    return Verdict(gate_id, _raw(g, "verdict"), str(g.get("summary", "")), facts=facts,
                   found=_legacy_found(gate_id, facts))


def from_report(rep: Report | Mapping[str, Any]) -> dict[str, Any]:
    """The summary of one host report (see the module docstring). Never raises on odd content."""
    gates = {g.get("id"): _legacy_verdict(g) for g in rep.get("gates") or [] if isinstance(g, dict)}
    inputs, facts = _d(rep.get("inputs")), _d(rep.get("facts"))
    prefixes: dict[str, int] = {}
    for nd in _d(_d(facts.get("fabric")).get("netdevs")).values():
        for a in _d(nd).get("ipv4") or []:
            addr, _, plen = str(a).partition("/")
            if digits(plen):
                prefixes.setdefault(addr, int(plen))
    gpus = []
    for d in _d(facts.get("gpu")).get("devices") or []:
        if not isinstance(d, dict):
            continue
        ul = _d(d.get("under_load"))
        gpus.append({"name": d.get("name"), "uuid": d.get("uuid"), "sm_count": as_int(d.get("sm_count")),
                     "under_load": {k: _num(ul.get(k)) for k, _ in LOAD_FIGURES if _num(ul.get(k)) is not None}})
    head = {"role": inputs.get("role"), "fabric_ip": inputs.get("fabric_ip"),
            "fabric_ip_source": inputs.get("fabric_ip_source"), "ipv4_prefixlen": prefixes,
            "launch_env": inputs.get("launch_env")}
    host = {"device_map": _d(rep.get("device_map")), "gpus": gpus, "versions": versions_of(rep),
            "firmware": firmware_of(rep), "control_plane": control_plane_of(rep),
            "known_bad": known_bad_of(_known_bad_gate(rep)), "nccl": nccl_of(rep),
            "engine": engine_of(_d(_d(rep.get("facts")).get("engine")))}
    return _assemble(head, _d(inputs.get("env")), gates, host)


def _nccl_build(c: Mapping[str, Any]) -> NcclBuild | None:
    path = c.get("real_path") or c.get("path")
    if not isinstance(path, str) or not isinstance(c.get("origin"), str):
        return None
    ver, bid = c.get("version"), c.get("build_id")
    return {"path": path[:4096], "origin": c["origin"][:32], "version": ver[:64] if isinstance(ver, str) else None,
            "build_id": bid[:128] if isinstance(bid, str) else None}


def engine_of(e: Mapping[str, Any]) -> EngineNet | None:
    """What NCCL chose, from the engine facts (:class:`afddiag.model.engine.EngineFacts` as a dict: a run's,
    or a report's ``facts.engine``); None without a ``Using network``/``NET/IB``/``NET/Socket`` line."""
    nets = [n for n in e.get("networks") or [] if isinstance(n, str)]
    ib = [d for d in e.get("ib_devices") or [] if isinstance(d, dict)]
    sock = e.get("socket_devices") or []
    network = nets[-1] if nets else "IB" if ib else "Socket" if sock else None
    if network is None:
        return None
    gids = sorted({c["gid_index"] for c in e.get("connections") or []
                   if isinstance(c, dict) and isinstance(c.get("gid_index"), int)})
    forced = _d(e.get("env")).get("NCCL_IB_GID_INDEX")
    if not gids and isinstance(forced, str) and forced.isdigit():
        gids = [int(forced)]
    return {"network": network[:64], "gid_indexes": gids[:16],
            "devices": [f"{d.get('device')}:{d.get('port')}/{d.get('link_layer')}"[:100] for d in ib[:16]]}


def nccl_of(rep: Mapping[str, Any]) -> NcclBuild | None:
    """The libnccl the engine loads, from a report's ``facts.nccl.copies`` (the first: loader order)."""
    copies = _d(_d(rep.get("facts")).get("nccl")).get("copies")
    return _nccl_build(copies[0]) if isinstance(copies, list) and copies and isinstance(copies[0], dict) else None


def _found(gates: Mapping[Any, Verdict], gate_id: str, kind: type[F]) -> F | None:
    """What gate ``gate_id`` worked out, when it ran and it is a ``kind``; else None."""
    v = gates.get(gate_id)
    return v.found if v is not None and isinstance(v.found, kind) else None


def _assemble(head: dict[str, Any], env: Mapping[Any, Any], gates: Mapping[Any, Verdict],
              host: dict[str, Any]) -> dict[str, Any]:
    """The summary's fields, in their order: the one list both :func:`from_run` and :func:`from_report` fill.
    ``head``: role, fabric_ip, fabric_ip_source, ipv4_prefixlen, launch_env; ``env``: the judged launch
    variables; ``gates``: the verdicts by gate id, what each gate worked out in ``found``; ``host``:
    device_map, gpus, versions, firmware, control_plane."""
    env = {str(k): str(v) for k, v in env.items()}
    cap = _found(gates, "launch.capacity", CapacityFlag)
    gid = _found(gates, "fabric.rocev2-ipv4", FabricGid)
    mtu = _found(gates, "fabric.mtu", PathMtu)
    engine = _found(gates, "fabric.first-device", EngineDevice)
    selectors = _found(gates, "fabric.devicemap-env", DeviceSelectors)
    busy = _found(gates, "gpu.slow-state", GpuBusy)
    return {
        "summary_version": SUMMARY_VERSION,
        **{k: head[k] for k in ("role", "fabric_ip", "fabric_ip_source", "ipv4_prefixlen", "launch_env")},
        "engine_device": engine.device if engine else None,
        "rdma_device": gid.device if gid else None,
        "port": gid.port if gid else None,
        "gid_index": gid.gid_index if gid else None,
        "netdev": (mtu.netdev if mtu else None) or (gid.netdev if gid else None),
        "netdev_mtu_bytes": mtu.netdev_mtu_bytes if mtu else None,
        "roce_mtu_bytes": mtu.roce_mtu_bytes if mtu else None,
        "device_map": dict(host["device_map"]),
        "device_map_env": env.get(MAP_VAR),
        "gid_index_env": env.get(NCCL_GID_VAR),
        "gid_index_envs": {v: env[v] for v in GID_INDEX_VARS if isinstance(env.get(v), str)},
        "devicemap_env": _brief(gates.get("fabric.devicemap-env")),
        "fabric_link": _brief(gates.get("fabric.link")),
        "first_device": _brief(gates.get("fabric.first-device")),
        "capacity": ({"key": cap.key, "value": cap.value, "set": cap.set,
                      **({"spelled": cap.spelled} if cap.spelled else {})}
                     if cap is not None and cap.key in CAPACITY_KEYS.values() else None),
        "gpus": host["gpus"],
        "slow_state": _brief(gates.get("gpu.slow-state")),
        "gpu_busy": bool(busy and busy.busy),
        "rails": [{"port": r.port, "ip": r.ip, "subnet": r.subnet, "gid_index": r.gid_index}
                  for r in (selectors.rails if selectors else ())],
        "versions": host["versions"],
        "firmware": host["firmware"],
        "control_plane": host["control_plane"],
        "known_bad": host.get("known_bad"),
        "nccl": host.get("nccl"),
        "engine": host.get("engine"),
    }


def _brief(v: Verdict | None) -> VerdictBrief | None:
    return {"verdict": cast(Any, v.verdict), "summary": str(v.summary)} if v is not None else None


def _prefixes(obs: Observation) -> dict[str, int]:
    """Address → prefix length of every IPv4 address on the host's netdevs (the first one seen)."""
    out: dict[str, int] = {}
    for nd in (obs.fabric.netdevs if obs.fabric is not None else {}).values():
        for a in nd.ipv4:
            addr, _, plen = str(a).partition("/")
            if digits(plen):
                out.setdefault(addr, int(plen))
    return out


def _gpus(gpu: GpuFacts | None) -> list[GpuRow]:
    rows: list[GpuRow] = []
    for d in gpu.devices if gpu is not None else []:
        ul = d.under_load
        figures = {k: getattr(ul, k) for k, _ in LOAD_FIGURES} if ul is not None else {}
        rows.append({"name": d.name, "uuid": d.uuid, "sm_count": as_int(d.sm_count),
                     "under_load": {k: v for k, v in figures.items() if _num(v) is not None}})
    return rows


def _versions(obs: Observation) -> dict[str, str]:
    """As :func:`versions_of`, from the typed facts."""
    out = {"afddiag": __version__} if __version__ else {}
    if obs.gpu is not None and obs.gpu.driver_version:
        out["driver"] = str(obs.gpu.driver_version)
    v = {**(obs.gpu.versions if obs.gpu is not None else {}), **(obs.versions or {})}
    for k in ("kernel", "bios", "rdma_core"):
        if v.get(k):
            out[k] = str(v[k])
    devices = obs.fabric.devices if obs.fabric is not None else []
    fws = sorted({f"{d.hca_type or '?'} {d.fw_ver}" for d in devices if d.fw_ver})
    if fws:
        out["firmware"] = ", ".join(fws)
    return out


def _firmware(obs: Observation) -> list[FirmwareRow]:
    """As :func:`firmware_of`, from the typed fabric facts."""
    devices = obs.fabric.devices if obs.fabric is not None else []
    rows = {(str(d.board_id or d.hca_type or "?"), str(d.fw_ver)) for d in devices if d.fw_ver}
    return [{"hca": h, "fw_ver": v} for h, v in sorted(rows)]


def _control_plane(gate: Verdict | None, obs: Observation) -> ControlPlane | None:
    """As :func:`control_plane_of`, from ``launch.control-plane``'s verdict, what it worked out (its
    :class:`~afddiag.model.found.Advertised`) and the typed reach facts
    (:class:`~afddiag.model.host.ReachFacts`: its ``not_tried`` pairs, not its notes)."""
    if gate is None:
        return None
    r = obs.reach
    reached = r if r is not None and r.captured and not r.failed else None
    bad = gate.found.bad if isinstance(gate.found, Advertised) else ()
    attempts = [{"peer": a["peer"], "port": as_int(a.get("port")), "outcome": str(a.get("outcome") or "error")}
                for a in (reached.attempts if reached else [])
                if isinstance(a.get("peer"), str) and as_int(a.get("port")) is not None]
    return cast(ControlPlane, {
        "verdict": gate.verdict if gate.verdict in VERDICTS else None,
        "source": reached.source if reached and isinstance(reached.source, str) else None,
        "peers": [str(p) for p in (reached.peers if reached else [])],
        "ports": [p for p in map(as_int, reached.ports if reached else []) if p is not None and 0 < p < 65536],
        "attempts": attempts,
        "not_tried": [{"peer": peer, "port": port} for peer, port in (reached.not_tried if reached else [])],
        "advertised_bad": [{"key": str(b.key), "value": str(b.value), "why": str(b.why)} for b in bad]})


def from_run(inputs: Inputs, obs: Observation, fabric_ip: tuple[str | None, str | None], verdicts: list[Verdict],
             device_map: dict[str, str]) -> Summary:
    """The summary of one run, at judge time, from its typed facts (see the module docstring);
    ``fabric_ip``: the resolved fabric IP and its source (:class:`afddiag.endpoint.FabricIp`'s ``ip``,
    ``source``); ``device_map``: this host's map (:func:`afddiag.endpoint.device_map` of ``obs.fabric``, as the report
    holds it). Call it after the report is built (:func:`afddiag.report.build` settles the verdicts'
    dependencies first). Its strings go through the report's redaction, as the report's do."""
    gates = {v.id: v for v in verdicts}
    head = {"role": inputs.playbook.name if inputs.playbook else "generic", "fabric_ip": fabric_ip[0],
            "fabric_ip_source": fabric_ip[1], "ipv4_prefixlen": _prefixes(obs), "launch_env": inputs.launch_env_path}
    host = {"device_map": device_map, "gpus": _gpus(obs.gpu), "versions": _versions(obs), "firmware": _firmware(obs),
            "control_plane": _control_plane(gates.get("launch.control-plane"), obs),
            "known_bad": known_bad_of({"verdict": kb.verdict, "facts": kb.facts})
            if (kb := gates.get("host.known-bad")) is not None else None,
            "nccl": _nccl_build(vars(obs.nccl.loaded)) if obs.nccl is not None and obs.nccl.loaded else None,
            "engine": engine_of(vars(obs.engine)) if obs.engine is not None else None}
    built = _assemble(head, obs.env or {}, gates, host)
    return cast(Summary, redact_report(built))


def load(obj: Any) -> Summary | None:
    """A summary from a report's JSON once it passes the schema's ``summary`` check and is of this
    :data:`SUMMARY_VERSION`; None otherwise (the caller builds one from the report)."""
    if summary_check()(obj, "summary") is not None:
        return None
    return cast(Summary, obj)


def of(rep: dict[str, Any] | None) -> Summary:
    """The report's own summary (:func:`load`), else one built from it (a report of an older afddiag);
    {} without a report. Redacted either way (:func:`afddiag.envvars.redact_report`)."""
    if not isinstance(rep, dict):
        return {}
    loaded = load(rep.get("summary"))
    if loaded is None:
        return cast(Summary, from_report(rep))
    s: dict[str, Any] = dict(loaded)
    if "control_plane" not in s:  # a summary made before control_plane joined it: read the gate's facts
        s = {**s, "control_plane": control_plane_of(rep)}
    gates = {g.get("id"): g for g in rep.get("gates") or [] if isinstance(g, dict)}
    for key, gid in (("fabric_link", "fabric.link"), ("first_device", "fabric.first-device")):
        if key not in s:  # a summary made before the key joined it: read the gate's verdict
            s = {**s, key: _verdict(_d(gates.get(gid)))}
    if "firmware" not in s:
        s = {**s, "firmware": firmware_of(rep)}
    if "known_bad" not in s:  # a summary made before known_bad joined it: read the gate's facts
        s = {**s, "known_bad": known_bad_of(_known_bad_gate(rep))}
    if "nccl" not in s:  # a summary made before nccl joined it: the report's facts
        s = {**s, "nccl": nccl_of(rep)}
    if "engine" not in s:  # a summary made before engine joined it: the report's facts
        s = {**s, "engine": engine_of(_d(_d(rep.get("facts")).get("engine")))}
    return cast(Summary, redact_report(s))  # a report from elsewhere may hold a credential, as from_report's
