"""Where this host talks on the fabric: the fabric IP and the endpoint (device, port, GID index).

One module decides, for every caller (the gates, the QP walk, the pair test, the launch exports,
``devicemap``); each decision is a pure function of the fabric facts (no I/O):

- :func:`fabric_ip_of`: the fabric IP of one run, resolved once (the runner calls it right after the
  fabric probe and keeps it on the observation: the QP walk, the route and reach probes, the gates,
  the report and ``devicemap`` read that one): :func:`given_fabric_ip` (``--fabric-ip``, else the
  launch env's ``AFD_FABRIC_IP``), with its source, then :func:`resolve_fabric_ip`;
- :func:`resolve_fabric_ip`: the address given when there is one,
  else the only IPv4 address with a RoCE v2 GID on any port, whatever its link does (a pulled cable
  must not turn another rail's address into the fabric IP: ``fabric.link`` says the link is down),
  else none ("ambiguous" lists the candidates, each with its port state);
- :func:`fabric_entry`: the inventory row that carries the fabric IP (RoCE v2 on an ACTIVE port
  first, then any carrier) — what ``fabric.link``, ``fabric.mtu``, ``fabric.route`` judge;
- :func:`usable_entry` / :func:`pick_endpoint`: the IPv4 RoCE v2 GID on an ACTIVE port for the
  fabric IP — what the launcher exports (``NCCL_IB_HCA``, ``NCCL_IB_GID_INDEX``) and the pair test opens;
- :func:`choose_port` / :func:`choose_sgid`: per device, the port and source GID the QP walk uses
  (what an engine that opens this device would use);
- :func:`device_map`: ``DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP`` (fabric IP → device), whatever the
  link does (:func:`devicemap_caveats` names entries whose port is down).

It never imports the fabric models: it reaches the inventory through the facts' own queries
(:meth:`~afddiag.model.fabric.FabricFacts.rocev2_carriers` and its kin), so the models load only with
the fabric probe that makes the facts, and a run without them (``afddiag gpu``) never loads them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from afddiag.envvars import MAP_VAR, format_device_map, parse_nccl_hca
from afddiag.model import ROCE_V1, ROCE_V2, is_link_local_v4

if TYPE_CHECKING:
    from afddiag.model.fabric import Entry, FabricFacts, RdmaDevice

SGID_FABRIC_IP = "fabric IP"
SGID_FALLBACK = "first RoCE v2 GID (fallback)"


@dataclass
class FabricIp:
    """The fabric IP the gates judge, and how it was chosen."""

    ip: str | None
    source: str  # "--fabric-ip", "only IPv4 RoCE v2 GID on an ACTIVE port", "only IPv4 RoCE v2 GID (its port
    # is not ACTIVE)", "ambiguous", "none"
    candidates: list[Entry] = field(default_factory=list)
    given: bool = False  # the operator named it (--fabric-ip, AFD_FABRIC_IP in the launch env): not derived

    @property
    def ambiguous(self) -> bool:
        return self.ip is None and len({e.ip for e in self.candidates}) > 1


def given_fabric_ip(inputs: Any) -> tuple[str | None, str]:
    """The fabric IP the operator named and where (``inputs``: :class:`~afddiag.model.run.Inputs`):
    ``--fabric-ip``, else ``AFD_FABRIC_IP`` in the launch env file; ``(None, "")`` when neither names one."""
    if inputs.fabric_ip:  # a replay may take it from the capture's stored inputs (afddiag.inputs.with_stored)
        return inputs.fabric_ip, (getattr(inputs, "sources", None) or {}).get("fabric_ip", "--fabric-ip")
    named = (inputs.launch_env or {}).get("AFD_FABRIC_IP")
    if named:
        return named, f"AFD_FABRIC_IP in {inputs.launch_env_path}"
    return None, ""


def fabric_ip_of(inputs: Any, fabric: FabricFacts | None) -> FabricIp:
    """The fabric IP of one run: the one the operator named (:func:`given_fabric_ip`) with its source,
    else the one the fabric facts give (:func:`resolve_fabric_ip`)."""
    ip, source = given_fabric_ip(inputs)
    return resolve_fabric_ip(fabric, ip, source or "--fabric-ip")


def resolve_fabric_ip(fabric: FabricFacts | None, given: str | None, source: str = "--fabric-ip") -> FabricIp:
    """``given`` (``--fabric-ip``, or ``AFD_FABRIC_IP`` from the launch env) when set; else the only
    IPv4 address that has a RoCE v2 GID (on a port whose netdev holds the address) on any port, ACTIVE
    or not; else None (source "ambiguous" with several candidate addresses, "none" without).

    The candidates do not depend on the link state: with two addressed rails the fabric IP stays
    ambiguous when one rail's cable is pulled (it is not silently the other rail's address), and with
    one addressed rail it stays that rail's address (``fabric.link`` FAILs on its port). ``candidates``
    are the IPv4 RoCE v2 entries (:func:`afddiag.model.fabric.rocev2_carriers`, ACTIVE ports first)."""
    cands = fabric.rocev2_carriers() if fabric else []  # a run without fabric facts never loads the fabric models
    if given:
        return FabricIp(given, source, cands, given=True)
    ips = sorted({e.ip for e in cands})
    if len(ips) == 1:
        if any(e.port_state == "ACTIVE" for e in cands):
            return FabricIp(ips[0], "only IPv4 RoCE v2 GID on an ACTIVE port", cands)
        return FabricIp(ips[0], "only IPv4 RoCE v2 GID (its port is not ACTIVE)", cands)
    return FabricIp(None, "ambiguous" if ips else "none", cands)


def fabric_entry(fabric: FabricFacts | None, ip: str | None) -> Entry | None:
    """The entry carrying ``ip`` (its IPv4-mapped GID, on a netdev holding it): RoCE v2 on an
    ACTIVE port first, then any carrier, in enumeration order; None when nothing carries it."""
    if fabric is None or not ip:
        return None
    cs = fabric.carriers(ip)
    cs.sort(key=lambda e: (e.gid_type != ROCE_V2, e.port_state != "ACTIVE"))
    return cs[0] if cs else None


def usable_entry(fabric: FabricFacts | None, ip: str | None) -> Entry | None:
    """The first IPv4 RoCE v2 GID on an ACTIVE port that carries ``ip`` (enumeration order), or None."""
    if fabric is None or not ip:
        return None
    return next((e for e in fabric.usable_rocev2() if e.ip == ip), None)


def device_map(fabric: FabricFacts | None) -> dict[str, str]:
    """Every IPv4 address with a RoCE v2 GID whose netdev holds it → its device (an ACTIVE port's
    first, then the first in enumeration order). A port whose link is down keeps its entry: the map
    is right whatever the cable does (fabric.link says the link is down)."""
    chosen: dict[str, str] = {}
    for e in fabric.rocev2_carriers() if fabric else []:  # ACTIVE ports first
        chosen.setdefault(e.ip, e.device)
    order = [e.ip for e in fabric.rocev2_carriers(active_first=False)] if fabric else []
    return {ip: chosen[ip] for ip in dict.fromkeys(order)}  # listed in enumeration order, as before


def no_map_reason(fabric: FabricFacts | None, fabric_ip: str | None = None) -> str:
    """Why :func:`device_map` is empty (or lacks ``fabric_ip``), naming the first cause the facts show
    and its fix, one line: no RDMA device; the address carried only as RoCE v1 GIDs (the HCA's RoCE
    mode is the fault: the address is there); carried by GIDs whose type was not read; IPv4-mapped
    GIDs whose netdev does not hold the address (a stale GID); else no IPv4 GID at all (put the
    address on the RoCE netdev; with ``fabric_ip``, the addresses the map does name). Facts: the GID
    tables (``gid_attrs/types``, ``ndevs``) and addresses."""
    if not (fabric and fabric.devices):
        return "no RDMA device on this host: load the RDMA driver first (afddiag fabric says more)"
    entries = [e for e in fabric.ipv4_entries() if fabric_ip is None or e.ip == fabric_ip]
    held = [e for e in entries if e.netdev_holds_ip]
    subject = f"fabric IP {fabric_ip}" if fabric_ip else "no IPv4 RoCE v2 GID on any port"

    def where(es: list[Entry]) -> str:
        return ", ".join(f"{e.ip} on {e.device} port {e.port} GID {e.gid_index}" for e in es[:4]) + \
            (f" and {len(es) - 4} more" if len(es) > 4 else "")

    v1 = [e for e in held if e.gid_type == ROCE_V1]
    if v1:
        return (f"{subject}: the address is there only as RoCE v1 ({where(v1)}): enable RoCE v2 on the HCA "
                "(its RoCE mode setting; `afddiag fabric` judges it in fabric.rocev2-ipv4)")
    unread = [e for e in held if e.gid_type is None]
    if unread:
        return (f"{subject}: the GID type of {where(unread)} was not read: read "
                "/sys/class/infiniband/<hca>/ports/<p>/gid_attrs/types/<i> on the host (or re-capture)")
    if entries:
        return (f"{subject}: {where(entries)} is an IPv4 GID whose netdev does not hold the address: "
                "put the address back on that netdev or use the one it holds (afddiag fabric says more)")
    if fabric_ip:
        here = ", ".join(device_map(fabric)) or "none"
        return (f"fabric IP {fabric_ip}: no GID on this host carries it: give --fabric-ip with this host's "
                f"RoCE address (the map names {here})")
    return ("no IPv4 RoCE v2 GID on any port: put the fabric address on the RoCE netdev first "
            "(afddiag fabric says more)")


def devicemap_caveats(fabric: FabricFacts | None, dm: dict[str, str]) -> list[str]:
    """One line per map entry whose port is not ACTIVE: the entry is right, the link is not (fabric.link)."""
    out = []
    for e in fabric.rocev2_carriers() if fabric else []:
        if dm.get(e.ip) == e.device and e.port_state != "ACTIVE":
            out.append(f"{e.ip}={e.device}: port {e.port} is {e.port_state or 'in an unknown state'}; the entry is "
                       "right, the link is not (`afddiag fabric` judges it in fabric.link)")
    return list(dict.fromkeys(out))


def gid_of(fabric: FabricFacts, e: Entry) -> str | None:
    """The GID text (kernel 8-group form) of entry ``e``."""
    return next((g.gid for d in fabric.devices if d.name == e.device for p in d.ports if p.num == e.port
                 for g in p.gids if g.index == e.gid_index), None)


def pick_endpoint(fabric: FabricFacts, fabric_ip: str | None) -> tuple[str, int, int, str, str]:
    """``(device, port, gid_index, gid, ip)`` of the IPv4 RoCE v2 GID for ``fabric_ip`` (or for the
    only such address when ``fabric_ip`` is None). Raises ValueError (one line: what to give or fix)
    when there is none, the choice is ambiguous, or the fabric IP's port is not ACTIVE."""
    fip = resolve_fabric_ip(fabric, fabric_ip)
    if fip.ip is None:
        n = len({c.ip for c in fip.candidates})
        raise ValueError("give --fabric-ip: " + (f"{n} candidates" if n else "no IPv4 RoCE v2 GID on any port"))
    e = usable_entry(fabric, fip.ip)
    if e is None:
        down = next((c for c in fip.candidates if c.ip == fip.ip), None)
        if down is not None:  # the address is right; its link is not (fabric.link)
            raise ValueError(f"fabric IP {fip.ip}: {down.device} port {down.port} carries it, but that port is "
                             f"{down.port_state or 'in an unknown state'} (`afddiag fabric` judges the link in "
                             "fabric.link)")
        raise ValueError(f"fabric IP {fip.ip}: no IPv4 RoCE v2 GID on an ACTIVE port carries it")
    return e.device, e.port, e.gid_index, gid_of(fabric, e) or "", e.ip


def launch_exports(fabric: FabricFacts | None, fabric_ip: str | None) -> list[tuple[str, str]]:
    """What a launcher exports: the device map, and for the fabric IP's IPv4 RoCE v2 GID
    ``NCCL_IB_HCA==dev:port`` (a leading '=' makes NCCL match exactly, not by prefix: 'roce' would
    match all four Spark devices), ``NCCL_IB_GID_INDEX``, ``UCX_NET_DEVICES=dev:port``, ``MC_GID_INDEX``."""
    out: list[tuple[str, str]] = []
    dm = device_map(fabric)
    if dm:
        out.append((MAP_VAR, format_device_map(dm)))
    entry = usable_entry(fabric, fabric_ip)
    if entry:
        out += [("NCCL_IB_HCA", f"={entry.device}:{entry.port}"), ("NCCL_IB_GID_INDEX", str(entry.gid_index)),
                ("UCX_NET_DEVICES", f"{entry.device}:{entry.port}"), ("MC_GID_INDEX", str(entry.gid_index))]
    return out


def exports_to_print(pairs: list[tuple[str, str]], env: dict[str, str] | None,
                     failed: Collection[str] = ()) -> tuple[list[tuple[str, str]], list[str]]:
    """Split :func:`launch_exports`' ``pairs`` into ``(to print, names kept)``: a variable the judged
    launch environment ``env`` (the --launch-env file, else the process env) already sets is kept as
    the launcher has it, never overridden (it may name more rails than the one the fabric IP's GID
    gives), unless ``fabric.devicemap-env`` FAILed on that variable: ``failed`` holds those names
    (:func:`afddiag.runner.failed_selectors`); afddiag's value corrects each of them, and only them (a
    wrong ``MC_GID_INDEX`` never replaces a correct multi-rail ``NCCL_IB_HCA``). What the env lacks is
    printed. Pure."""
    if not env:
        return list(pairs), []
    kept = [k for k, _ in pairs if env.get(k, "").strip() and k not in failed]
    return [(k, v) for k, v in pairs if k not in kept], kept


def nccl_gid_index_for(fabric: FabricFacts, hca: str, fabric_ip: str | None) -> tuple[int | None, str]:
    """The one ``NCCL_IB_GID_INDEX`` that suits every ACTIVE port the ``NCCL_IB_HCA`` value ``hca``
    selects (NCCL skips ports that are not ACTIVE), from the GID tables (sysfs ``ports/<p>/gids``):
    per port, the fabric IP's RoCE v2 GID when the port carries it, else the port's own IPv4 RoCE v2
    GID (a rail; a routable one before a link-local one unless the fabric IP is link-local). One
    index is used for every port NCCL opens, so ``(index, "")`` only when all those ports have theirs
    at the same index, else ``(None, why)`` (no ACTIVE port selected, a port without an IPv4 RoCE v2
    GID, or different indexes). Raises nothing; a value NCCL cannot parse gives ``(None, why)``."""
    try:
        spec = parse_nccl_hca(hca)
    except ValueError as e:
        return None, f"NCCL_IB_HCA={hca!r}: {e}"
    per: dict[str, int | None] = {}
    for d in fabric.devices:
        for p in d.ports:
            if not p.active or not spec.selects(d.name, p.num):
                continue
            mine = [e for e in fabric.rocev2_carriers(active_first=False) if e.device == d.name and e.port == p.num]
            mine.sort(key=lambda e: (e.ip != fabric_ip, is_link_local_v4(e.ip) and not is_link_local_v4(fabric_ip)))
            per[f"{d.name}:{p.num}"] = mine[0].gid_index if mine else None
    if not per:
        return None, f"NCCL_IB_HCA={hca} selects no ACTIVE port"
    if none := [k for k, v in per.items() if v is None]:
        return None, f"NCCL_IB_HCA={hca} selects {', '.join(none)}, which has no IPv4 RoCE v2 GID"
    if len(set(per.values())) > 1:
        return None, (f"NCCL_IB_HCA={hca} selects ports whose IPv4 RoCE v2 GIDs sit at different indexes ("
                      + ", ".join(f"{k} GID {v}" for k, v in per.items()) + "), and NCCL_IB_GID_INDEX is one index "
                      "for all of them")
    return next(iter(per.values())), ""


def pair_gid_with_hca(fabric: FabricFacts | None, fabric_ip: str | None, env: dict[str, str] | None,
                      to_print: list[tuple[str, str]], kept: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Keep ``NCCL_IB_GID_INDEX`` with the ``NCCL_IB_HCA`` it goes with, after :func:`exports_to_print`
    (``to_print``, ``kept``; ``env`` the judged launch env). Returns ``(to print, notes)``:

    - the launch env's ``NCCL_IB_HCA`` kept, ``NCCL_IB_GID_INDEX`` to print: the index printed is the
      one every ACTIVE port of the kept HCA has its IPv4 RoCE v2 GID at (:func:`nccl_gid_index_for`);
      when there is no such index, ``NCCL_IB_GID_INDEX`` is not printed and a note says why;
    - the launch env's ``NCCL_IB_GID_INDEX`` kept, ``NCCL_IB_HCA`` to print (the fabric IP's port):
      printed only when the kept index is the fabric IP's RoCE v2 GID on that port, else left out
      with a note. Never prints half of a mismatched pair."""
    hca, gidx = "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"
    env = env or {}
    out = list(to_print)
    notes: list[str] = []
    names = [k for k, _ in out]
    if fabric is None:
        return out, notes
    if hca in kept and gidx in names:
        idx, why = nccl_gid_index_for(fabric, env[hca], fabric_ip)
        if idx is None:
            out = [(k, v) for k, v in out if k != gidx]
            notes.append(f"{gidx} not printed: {why}; leave {gidx} unset (NCCL 2.21 and later pick each port's "
                         f"RoCE v2 GID by address family) or set {hca} to ports whose IPv4 RoCE v2 GIDs share "
                         "one index")
        else:
            mine = dict(out)[gidx]
            out = [(k, str(idx) if k == gidx else v) for k, v in out]
            if str(idx) != mine:
                notes.append(f"{gidx}={idx}: the GID index of the ports the kept {hca}={env[hca]} selects "
                             f"(the fabric IP's GID is index {mine})")
    if gidx in kept and hca in names:
        e = usable_entry(fabric, fabric_ip)
        raw = env.get(gidx, "").strip()
        if e is not None and raw != str(e.gid_index):
            out = [(k, v) for k, v in out if k != hca]
            notes.append(f"{hca} not printed: the kept {gidx}={raw} is not fabric IP {fabric_ip}'s RoCE v2 GID on "
                         f"{e.device}:{e.port} (that is index {e.gid_index}): set {gidx}={e.gid_index} in the "
                         "launch env or unset it")
    return out, notes


@dataclass
class SgidChoice:
    """Which port and source GID the walk uses on one device, and why."""

    port: int
    sgid_index: int | None
    sgid: str | None  # kernel 8-group form
    choice: str  # SGID_FABRIC_IP, SGID_FALLBACK, or why there is none


def choose_port(dev: RdmaDevice, fabric_ip: str | None) -> int:
    """The port the walk uses on ``dev``: the one whose GID table holds ``fabric_ip``'s IPv4-mapped
    GID, else the first ACTIVE port, else port 1 (what engines open by default)."""
    if fabric_ip:
        for p in dev.ports:
            if any(g.ipv4 == fabric_ip for g in p.gids):
                return p.num
    for p in dev.ports:
        if p.active:
            return p.num
    return 1


def choose_sgid(dev: RdmaDevice, fabric_ip: str | None) -> SgidChoice:
    """Pick port and source GID index for ``dev`` from the fabric facts (no I/O).

    1. The port from :func:`choose_port`.
    2. On it, the RoCE v2 GID whose IPv4 is ``fabric_ip`` → choice ``"fabric IP"``.
    3. Else the lowest-index populated RoCE v2 GID on that port — what an engine with no better
       information falls back to (often an fe80 link-local GID) → ``"first RoCE v2 GID (fallback)"``.
    4. Else no source GID: ``sgid_index`` None, ``choice`` says why.
    """
    port_num = choose_port(dev, fabric_ip)
    port = next((p for p in dev.ports if p.num == port_num), None)
    if port is None:
        return SgidChoice(port_num, None, None, f"no GID table read for {dev.name} port {port_num}")
    gids = sorted((g for g in port.gids if not g.empty), key=lambda g: g.index)
    if fabric_ip:
        for g in gids:
            if g.ipv4 == fabric_ip and g.type == ROCE_V2:
                return SgidChoice(port_num, g.index, g.gid, SGID_FABRIC_IP)
    for g in gids:
        if g.type == ROCE_V2:
            return SgidChoice(port_num, g.index, g.gid, SGID_FALLBACK)
    return SgidChoice(port_num, None, None, f"no RoCE v2 GID on {dev.name} port {port_num}")
