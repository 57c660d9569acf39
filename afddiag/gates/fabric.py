"""Fabric gates: RDMA presence, link, RoCE v2 IPv4 GID, path MTU, the device the engine opens,
launch-environment device selection, the QP walk to RTR, memory registration, route and ARP.
The rail gates (link speed, a rail's bandwidth, its port counters) are in :mod:`afddiag.gates.rail`."""

from __future__ import annotations

from afddiag.catalog import commands, remedy
from afddiag.endpoint import fabric_entry
from afddiag.envvars import (
    GID_INDEX_VARS,
    MAP_VAR,
    NCCL_HCA_VAR,
    WATCHED,
    format_device_map,
    parse_device_map,
)
from afddiag.gates import PROBE_FAILED_REMEDY, Context, declared, devicemap, gate, probe_failed, probed
from afddiag.gates.devicemap import gid_slot
from afddiag.gates.fabric_port import infiniband_port, roce_v1_only, type_not_read
from afddiag.gates.nic import unplugged_skip
from afddiag.model import ROCE_V2, roce_mtu, to_jsonable
from afddiag.model.fabric import (
    Entry,
    FabricFacts,
    carriers,
    errno_words,
    ipv4_entries,
    order_known,
    rocev2_carriers,
    usable_rocev2,
)
from afddiag.model.found import DeviceSelectors, EngineDevice, FabricGid, PathMtu
from afddiag.shellcmd import command, export
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN, Verdict

EOPNOTSUPP = 95  # errno: "operation not supported" (ENOTSUP on Linux): the device cannot, it is not broken


def fabric_facts(ctx: Context, gate_id: str) -> FabricFacts | Verdict:
    """The fabric facts a gate judges (captured, an RDMA device listed), else the ERROR/SKIP Verdict
    that stops it (a gate's preamble: ``fab = fabric_facts(...)``; ``if isinstance(fab, Verdict): return fab``)."""
    fab = ctx.obs.fabric
    if (v := probe_failed(gate_id, fab)) is not None:
        return v
    if fab is None or not fab.captured:
        why = "; ".join(fab.notes) if fab and fab.notes else "fabric not probed"
        return Verdict(gate_id, SKIP, why if why.startswith("fabric") else f"fabric not captured: {why}",
                       remedy("snapshot.fabric"))
    if not fab.devices:
        return Verdict(gate_id, SKIP, "no RDMA device on this host", remedy("fabric.rdma-present"))
    return fab


def _no_fabric(ctx: Context, gate_id: str) -> Verdict:
    """The Verdict of a gate whose fabric facts are missing (probe failed, not captured, no device):
    :func:`fabric_facts`'s."""
    gap = fabric_facts(ctx, gate_id)
    return gap if isinstance(gap, Verdict) else Verdict(gate_id, SKIP, "no RDMA device", remedy("fabric.rdma-present"))


def _need_fabric(ctx: Context, gate_id: str) -> tuple[FabricFacts, str] | Verdict:
    """``(fabric facts, fabric IP)`` when the gate can judge; else the SKIP/WARN/ERROR Verdict saying
    which is missing (:func:`fabric_facts`; no fabric IP, or several candidates)."""
    fab = fabric_facts(ctx, gate_id)
    if isinstance(fab, Verdict):
        return fab
    fip = ctx.fabric_ip
    if fip.ip is None:
        cands = sorted({f"{e.ip} ({e.device} GID {e.gid_index}"
                        + ("" if e.port_state == "ACTIVE" else f", port {e.port_state or 'state unknown'}") + ")"
                        for e in fip.candidates})
        if fip.ambiguous:
            n = len({e.ip for e in fip.candidates})
            return Verdict(gate_id, WARN, f"fabric IP ambiguous: {n} IPv4 addresses have a RoCE v2 GID: "
                           + ", ".join(cands), remedy("fabric.ambiguous"), {"candidates": cands}, action="RERUN")
        return Verdict(gate_id, SKIP, "no fabric IP: no IPv4 RoCE v2 GID on any port and no --fabric-ip",
                       remedy("fabric.rocev2-ipv4"))
    return fab, fip.ip


def port_of(ctx: Context, e: Entry):
    """``(device, port)`` of the fabric facts that ``e`` names; ``(None, None)`` when none does."""
    for d in ctx.obs.fabric.devices if ctx.obs.fabric else ():
        if d.name == e.device:
            for p in d.ports:
                if p.num == e.port:
                    return d, p
    return None, None


def _best_carrier(ctx: Context) -> Entry | None:
    """The fabric IP's entry (:func:`afddiag.endpoint.fabric_entry`)."""
    return fabric_entry(ctx.obs.fabric, ctx.fabric_ip.ip)


def carrier_entry(ctx: Context, gate_id: str) -> Entry | Verdict:
    """The entry of the port carrying the fabric IP, or the SKIP/WARN verdict that stops the gate."""
    if isinstance(v := _need_fabric(ctx, gate_id), Verdict):
        return v
    e = _best_carrier(ctx)
    if e is None:
        return Verdict(gate_id, SKIP, f"fabric IP {ctx.fabric_ip.ip}: no port carries it, so nothing to judge "
                       "(see fabric.rocev2-ipv4)", remedy("fabric.rocev2-ipv4"))
    return e


@gate("fabric.rdma-present")
def rdma_present(ctx: Context, gate_id: str) -> Verdict:
    fab = ctx.obs.fabric
    if (v := probe_failed(gate_id, fab)) is not None:
        return v
    if fab is None or not fab.captured:
        why = "; ".join(fab.notes) if fab and fab.notes else "not probed"
        if ctx.requires("rdma"):  # a role that needs RDMA cannot be passed on evidence that is not there
            return Verdict(gate_id, FAIL, f"role {ctx.playbook.name} requires RDMA, but the fabric was not looked at "
                           f"({why})", remedy("snapshot.fabric"), action="RERUN")
        return Verdict(gate_id, SKIP, why if why.startswith("fabric") else f"fabric not captured: {why}",
                       remedy("snapshot.fabric"))
    if not fab.devices:
        if (v := unplugged_skip(ctx, gate_id)) is not None:  # a Spark's CX-7 powered off for want of a cable
            return v
        said = [n for n in fab.notes if "infiniband" in n] or fab.notes or ["none listed"]
        verdict = FAIL if ctx.requires("rdma") else SKIP
        role = f"; role {ctx.playbook.name} requires one" if verdict == FAIL else ""
        return Verdict(gate_id, verdict, f"no RDMA device on this host ({said[-1]}){role}", remedy(gate_id),
                       {"notes": fab.notes})
    devs = [
        {"name": d.name, "index": d.index, "hca_type": d.hca_type, "fw_ver": d.fw_ver, "board_id": d.board_id,
         "node_guid": d.node_guid,
         "ports": [{"port": p.num, "state": p.state, "phys_state": p.phys_state, "link_layer": p.link_layer,
                    "rate": p.rate, "gid_slots": p.gid_slots, "gids_populated": len(p.gids)} for p in d.ports]}
        for d in fab.devices
    ]
    names = ", ".join(d.name for d in fab.devices)
    return Verdict(gate_id, PASS,
                   f"{len(fab.devices)} RDMA device(s) in enumeration order ({fab.order_source}): {names}",
                   "nothing to do", {"devices": devs, "order_source": fab.order_source, "notes": fab.notes})


def no_device_but_named(ctx: Context, gate_id: str) -> Verdict | None:
    """On a host whose fabric was looked at and lists no RDMA device: FAIL (LOAD_DRIVER) naming the
    missing device when the role requires RDMA; WARN when the operator named a fabric expectation
    (``--fabric-ip``/``AFD_FABRIC_IP``, ``--peer``/``AFD_PEER_FABRIC_IPS``) that nothing could check:
    asking for the fabric and getting only SKIPs must not read as a pass. None otherwise. Pure."""
    fab = ctx.obs.fabric
    if fab is None or not fab.captured or fab.devices or fab.failed:
        return None
    if (v := unplugged_skip(ctx, gate_id)) is not None:  # no cable, not no driver: fabric.cx7-hotplug names it
        return v
    named = ([f"fabric IP {ctx.fabric_ip.ip}"] if ctx.fabric_ip.given and ctx.fabric_ip.ip else [])
    named += [f"peer(s) {', '.join(ctx.inputs.peers)}"] if ctx.inputs.peers else []
    what = " and ".join(named) or "the fabric IP"
    if ctx.requires("rdma"):
        return Verdict(gate_id, FAIL, f"no RDMA device on this host: no port can carry {what}; role "
                       f"{ctx.playbook.name} requires RDMA", remedy("fabric.rdma-present"),
                       {"named": named, "notes": fab.notes}, action="LOAD_DRIVER")
    if named:
        return Verdict(gate_id, WARN, f"{what} given, but no RDMA device on this host: nothing on the fabric could be "
                       "checked", "run on the host whose RDMA device carries the fabric IP, or load its RDMA driver "
                       "(mlx5_ib for ConnectX) and check `rdma dev`", {"named": named, "notes": fab.notes},
                       action="RERUN")
    return None


@gate("fabric.link")
def link(ctx: Context, gate_id: str) -> Verdict:
    if (v := no_device_but_named(ctx, gate_id)) is not None:
        return v
    e = carrier_entry(ctx, gate_id)
    if isinstance(e, Verdict):
        return e
    ip = ctx.fabric_ip.ip
    _, port = port_of(ctx, e)
    nd = ctx.obs.fabric.netdevs.get(e.netdev or "") if ctx.obs.fabric else None
    facts = {"device": e.device, "port": e.port, "state": port.state, "phys_state": port.phys_state,
             "rate": port.rate, "netdev": e.netdev, "netdev_operstate": nd.operstate if nd else None}
    subject = f"{e.device} port {e.port} (fabric IP {ip}, {e.netdev})"
    if port.state is None and not (nd and nd.operstate in ("down", "lowerlayerdown", "notpresent")):
        # an unread state is no evidence of a down link: never the cable remedy (a drain) on it
        why = "; ".join(port.notes) or f"ports/{e.port}/state absent or unreadable"
        return Verdict(gate_id, SKIP, f"{subject}: port state not read ({why}); netdev {e.netdev} is "
                       f"{nd.operstate if nd and nd.operstate else 'in an unknown state'}",
                       f"read the port state on the host: `cat /sys/class/infiniband/{e.device}/ports/{e.port}/state` "
                       "or `rdma link show` (as root in a container)", facts)
    if port.state != "ACTIVE" or (port.phys_state and port.phys_state != "LinkUp"):
        return Verdict(gate_id, FAIL, f"{subject}: port {port.state}, physical {port.phys_state}",
                       remedy(gate_id).format(netdev=e.netdev), facts, commands=commands(gate_id, netdev=e.netdev))
    if nd and nd.operstate in ("down", "lowerlayerdown", "notpresent"):
        return Verdict(gate_id, FAIL, f"{subject}: netdev {e.netdev} is {nd.operstate}",
                       remedy(gate_id).format(netdev=e.netdev), facts, commands=commands(gate_id, netdev=e.netdev))
    return Verdict(gate_id, PASS, f"{subject}: ACTIVE, LinkUp, {port.rate}", "nothing to do", facts)


@gate("fabric.mtu")
def mtu(ctx: Context, gate_id: str) -> Verdict:
    e = carrier_entry(ctx, gate_id)
    if isinstance(e, Verdict):
        return e
    ip = ctx.fabric_ip.ip
    nd = ctx.obs.fabric.netdevs.get(e.netdev or "") if ctx.obs.fabric else None
    if nd is None or nd.mtu is None:
        return Verdict(gate_id, SKIP, f"{e.netdev}: netdev MTU not read", remedy("snapshot.fabric"))
    rm = roce_mtu(nd.mtu)
    facts = {"netdev": e.netdev, "netdev_mtu": nd.mtu, "roce_mtu": rm, "device": e.device, "port": e.port}
    found = PathMtu(e.netdev, nd.mtu, rm)
    subject = f"{e.device} port {e.port} ({e.netdev}, fabric IP {ip})"
    if rm < 4096:
        return Verdict(gate_id, WARN, f"{subject}: netdev MTU {nd.mtu} gives RoCE path MTU {rm}, below 4096",
                       remedy(gate_id).format(netdev=e.netdev), facts, found=found,
                       commands=commands(gate_id, netdev=e.netdev))
    return Verdict(gate_id, PASS, f"{subject}: netdev MTU {nd.mtu}, RoCE path MTU {rm}", "nothing to do", facts,
                   found=found)


def _fabric_gid(e: Entry) -> FabricGid:
    return FabricGid(e.device, e.port, e.gid_index, e.netdev)


WRONG_FABRIC_IP_REMEDY = ("set the launcher's fabric IP (AFD_FABRIC_IP / --fabric-ip) to this host's RoCE address "
                          "({addrs}); do not move the address given, it is not the fabric's")
@gate("fabric.rocev2-ipv4")
def rocev2_ipv4(ctx: Context, gate_id: str) -> Verdict:
    fab = ctx.obs.fabric
    if fab is None or not fab.captured or not fab.devices:
        return _no_fabric(ctx, gate_id)
    entries = ipv4_entries(fab)
    inventory = [to_jsonable(e) for e in entries]
    ip = ctx.fabric_ip.ip
    usable = usable_rocev2(fab)
    if ip is None:
        if usable:  # several candidates: each one has a RoCE v2 GID
            cands = sorted({f"{e.ip}={e.device} (GID {e.gid_index})" for e in usable})
            return Verdict(gate_id, PASS, f"IPv4 RoCE v2 GIDs on ACTIVE ports: {', '.join(cands)}",
                           "nothing to do; pass --fabric-ip to say which one the launcher uses",
                           {"inventory": inventory})
        down = rocev2_carriers(fab)  # RoCE v2 GIDs whose port is not ACTIVE: the link is the fault
        if down:
            ports = sorted({f"{e.device} port {e.port} ({e.netdev}, {e.port_state}: {e.ip} GID {e.gid_index})"
                            for e in down})
            return Verdict(gate_id, FAIL, "no IPv4 RoCE v2 GID on an ACTIVE port: the ports carrying them are not "
                           f"ACTIVE: {'; '.join(ports)}", remedy("fabric.link"), {"inventory": inventory},
                           action="FIX_LINK")
        if any(e.gid_type is None for e in entries):
            return type_not_read(gate_id, entries, inventory)
        if entries and all(e.gid_type != ROCE_V2 for e in entries):
            return roce_v1_only(gate_id, entries, inventory)
        if ipoib := [n for n in fab.netdevs.values() if n.ipoib and n.ipv4]:  # addressed ports in InfiniBand mode
            return infiniband_port(gate_id, fab, ipoib, "no RoCE port holds an IPv4 address; IPoIB netdev",
                                   inventory)
        kinds = sorted({e.gid_type or "unknown type" for e in entries})
        detail = (f"IPv4-mapped GIDs exist only as {', '.join(kinds)}"
                  if entries else "no GID on any device is IPv4-mapped (only fe80/IPv6 entries)")
        return Verdict(gate_id, FAIL, f"no IPv4 RoCE v2 GID on any ACTIVE port: {detail}", remedy(gate_id),
                       {"inventory": inventory})
    mine = [e for e in usable if e.ip == ip]
    if mine:
        e = mine[0]
        return Verdict(gate_id, PASS, f"fabric IP {ip}: {gid_slot(e)} on an ACTIVE port", "nothing to do",
                       {"entry": to_jsonable(e), "inventory": inventory}, found=_fabric_gid(e))
    down = [e for e in rocev2_carriers(fab) if e.ip == ip]
    if down:  # the GID is right; the port's link is fabric.link's concern (one fault, one remedy)
        e = down[0]
        return Verdict(gate_id, PASS, f"fabric IP {ip}: {gid_slot(e)}; its port is "
                       f"{e.port_state or 'in a state not read'} (fabric.link judges the link)",
                       "nothing to do here; see fabric.link", {"entry": to_jsonable(e), "inventory": inventory},
                       found=_fabric_gid(e))
    cs = carriers(fab, ip)
    if cs:
        slots = "; ".join(f"{gid_slot(e)}, port {e.port_state}" for e in cs)
        if any(e.gid_type is None for e in cs):  # unread, not v1: never the HCA-mode remedy on it
            return type_not_read(gate_id, cs, inventory, ip)
        if all(e.gid_type != ROCE_V2 for e in cs):
            return roce_v1_only(gate_id, cs, inventory, ip)
        why = "not on an ACTIVE port"
        return Verdict(gate_id, FAIL, f"fabric IP {ip}: {why}: {slots}", remedy(gate_id), {"inventory": inventory})
    stray = [e for e in entries if e.ip == ip]
    if stray:
        return Verdict(gate_id, FAIL, f"fabric IP {ip}: GID present ({gid_slot(stray[0])}) but netdev "
                       f"{stray[0].netdev} does not hold the address", remedy(gate_id), {"inventory": inventory})
    holders = [n.name for n in fab.netdevs.values() if n.holds_ipv4(ip)]
    if ipoib := [fab.netdevs[n] for n in holders if fab.netdevs[n].ipoib]:  # the port's link layer is the fault
        return infiniband_port(gate_id, fab, ipoib, f"fabric IP {ip} is on IPoIB netdev", inventory)
    where = (f"it is on netdev {', '.join(holders)}, which no RDMA port is bound to" if holders
             else "no netdev on this host holds it")
    if usable:  # the host has its RoCE address: the launcher names the wrong one (never move a management address)
        addrs = sorted({f"{e.ip} ({e.netdev}, {e.device} GID {e.gid_index})" for e in usable})
        return Verdict(gate_id, FAIL, f"fabric IP {ip}: no GID carries it ({where}); this host's IPv4 RoCE v2 "
                       f"addresses: {', '.join(addrs)}", WRONG_FABRIC_IP_REMEDY.format(
                           addrs=", ".join(sorted({e.ip for e in usable}))), {"inventory": inventory}, action="SET_ENV")
    return Verdict(gate_id, FAIL, f"fabric IP {ip}: no GID carries it ({where})", remedy(gate_id),
                   {"inventory": inventory})


def engine_device_for(fab: FabricFacts | None, env: dict[str, str] | None, ip: str | None) -> tuple[str | None, str]:
    """The RDMA device the engine opens, and how it is chosen: the device named for ``ip`` in
    ``DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP`` (from ``env``), else the first device in libibverbs
    enumeration order (``fab.devices[0]``, lowest kernel device index). ``(None, how)`` without devices."""
    env = env or {}
    if MAP_VAR in env:
        entries, _ = parse_device_map(env[MAP_VAR])
        if ip in entries:
            return entries[ip], f"{MAP_VAR} names it for {ip}"
    first = fab.devices[0].name if fab and fab.devices else None
    how = "first enumerated device, " + (f"{MAP_VAR} not set" if MAP_VAR not in env else
                                         f"{MAP_VAR} has no entry for {ip}" if ip else
                                         f"{MAP_VAR} set, but no fabric IP to look up")
    return first, how


def engine_device(ctx: Context) -> tuple[str | None, str]:
    """The device the engine opens: the map's entry for the fabric IP, else the first enumerated."""
    return engine_device_for(ctx.obs.fabric, ctx.obs.env, ctx.fabric_ip.ip)


def _map_fix(fab: FabricFacts, ips: list[str], env: dict[str, str] | None) -> tuple[str, list[str]]:
    """``(prose, commands)``: set the map in this host's launch file, the command ``export MAP=ip=dev,...``
    naming, for each of ``ips``, the device of ``fab`` carrying it as RoCE v2, the map's other entries in
    ``env`` kept (another host's line is not this host's to drop); rocev2-ipv4's remedy when none carries one."""
    pairs = parse_device_map(env[MAP_VAR])[0] if env and MAP_VAR in env else {}
    found = False
    for ip in ips:
        e = next((e for e in rocev2_carriers(fab) if e.ip == ip), None)
        if e is not None:
            pairs[ip], found = e.device, True
    if not found:
        return remedy("fabric.rocev2-ipv4"), []
    return (f"set {MAP_VAR} in this host's launch file, so the engine opens the device that carries the fabric IP "
            "(`afddiag devicemap --format shell` prints the whole map)", [export(MAP_VAR, format_device_map(pairs))])


def _first_device_ambiguous(ctx: Context, fab: FabricFacts, gate_id: str, warn: Verdict) -> Verdict:
    """Several candidate fabric IPs: FAIL when, whichever one the launcher uses, the device the
    engine opens (the map's entry for it, else the first enumerated of ``fab``) carries none of them."""
    env = ctx.obs.env or {}
    entries = parse_device_map(env[MAP_VAR])[0] if MAP_VAR in env else {}
    cands = sorted({e.ip for e in ctx.fabric_ip.candidates})
    first = fab.devices[0].name
    opens = {c: entries.get(c, first) for c in cands}
    works = [c for c in cands if any(e.device == opens[c] for e in carriers(fab, c))]
    facts = {**warn.facts, "engine_device_per_candidate": opens, "candidates_that_work": works,
             "order_source": fab.order_source}
    if works:
        return Verdict(gate_id, WARN, warn.summary + f"; the engine's device carries {', '.join(works)}", warn.remedy,
                       facts, action="RERUN")
    unmapped = [c for c in cands if c not in entries]
    fix, cmds = _map_fix(fab, cands, env)
    if unmapped and not order_known(fab):
        return Verdict(gate_id, WARN, warn.summary + "; device order unknown, so the device the engine opens for "
                       f"{', '.join(unmapped)} cannot be told", fix, facts, action="SET_ENV", commands=cmds)
    seen = ", ".join(sorted({f"{d} ({'map' if c in entries else 'first enumerated device'})"
                             for c, d in opens.items()}))
    return Verdict(gate_id, FAIL, f"fabric IP ambiguous ({', '.join(cands)}), and the device the engine opens carries "
                   f"none of them: {seen}", fix, facts, action="SET_ENV", commands=cmds)


@gate("fabric.first-device")
def first_device(ctx: Context, gate_id: str) -> Verdict:
    need = _need_fabric(ctx, gate_id)
    if isinstance(need, Verdict):
        if need.verdict == WARN and ctx.fabric_ip.ambiguous and ctx.obs.fabric is not None:
            return _first_device_ambiguous(ctx, ctx.obs.fabric, gate_id, need)
        return need
    fab, ip = need
    dev, how = engine_device(ctx)
    cs = carriers(fab, ip)
    carrying = sorted({e.device for e in cs})
    order = [d.name for d in fab.devices]
    unknown = not how.startswith(MAP_VAR) and not order_known(fab)  # never guess libibverbs' order from names
    found = EngineDevice(None if unknown else dev)
    facts = {"engine_device": found.device, "chosen_by": how, "carrying_devices": carrying,
             "enumeration_order": order, "order_source": fab.order_source}
    if unknown:
        if carrying and set(carrying) >= set(order):
            return Verdict(gate_id, PASS, f"every RDMA device carries fabric IP {ip}: whichever the engine opens "
                           f"(device order unknown: {fab.order_source})", "nothing to do", facts, found=found)
        where = (f"fabric IP {ip} is on {', '.join(carrying)}" if carrying else f"no device carries fabric IP {ip}")
        fix, cmds = _map_fix(fab, [ip], ctx.obs.env)
        return Verdict(gate_id, WARN, f"order unknown: the device the engine opens (libibverbs' first) cannot be told "
                       f"without the device index order ({fab.order_source}); {where}, not on "
                       f"{', '.join(d for d in order if d not in carrying)}",
                       fix + "; then the order does not matter. Or capture the order: `afddiag capture` records it; "
                       "live it comes from pyverbs or NETLINK_RDMA", facts, action="SET_ENV", found=found,
                       commands=cmds)
    if dev in carrying:
        return Verdict(gate_id, PASS, f"{dev} ({how}) carries fabric IP {ip}", "nothing to do", facts, found=found)
    good = [e for e in rocev2_carriers(fab) if e.ip == ip]
    action = "SET_ENV"
    cmds = []
    if good:
        e = good[0]
        fix, cmds = _map_fix(fab, [ip], ctx.obs.env)
        where = f"fabric IP {ip} is on {e.device} GID {e.gid_index}"
    elif carrying:
        fix = remedy(gate_id)
        where = f"fabric IP {ip} is on {', '.join(carrying)}"
    elif usable_rocev2(fab):  # the fabric IP given is not this host's RoCE address: one remedy with rocev2-ipv4
        fix = WRONG_FABRIC_IP_REMEDY.format(addrs=", ".join(sorted({e.ip for e in usable_rocev2(fab)})))
        where = f"no device carries fabric IP {ip}; see fabric.rocev2-ipv4"
        action = "SET_ENV"
    else:
        fix = remedy("fabric.rocev2-ipv4")
        where = f"no device carries fabric IP {ip}"
        action = "FIX_ADDRESS"
    if dev not in order:
        return Verdict(gate_id, FAIL, f"{dev} ({how}) is not an RDMA device on this host ({where})", fix, facts,
                       action=action, found=found, commands=cmds)
    return Verdict(gate_id, FAIL, f"{dev} ({how}) does not carry fabric IP {ip} ({where})", fix, facts, action=action,
                   found=found, commands=cmds)


@gate("fabric.devicemap-env")
def devicemap_env(ctx: Context, gate_id: str) -> Verdict:
    """Each variable that chooses the engine's device, port or GID names the one that carries the fabric
    IP as RoCE v2 (its own concern only: whether that port's link is up is fabric.link's)."""
    env = ctx.obs.env
    if env is None:
        return Verdict(gate_id, SKIP, "launch environment not captured", remedy("snapshot.fabric"))
    set_vars = {k: env[k] for k in WATCHED if k in env}
    gid_vars = [k for k in GID_INDEX_VARS if k in set_vars]  # every engine's forced GID index: one rule
    if not set_vars:
        return Verdict(gate_id, SKIP, f"none of {MAP_VAR}, {NCCL_HCA_VAR}, {', '.join(GID_INDEX_VARS)} is set "
                       f"({ctx.obs.env_source})", "nothing to judge; fabric.first-device covers the default")
    fab = ctx.obs.fabric
    if fab is None or not fab.captured or not fab.devices:
        return _no_fabric(ctx, gate_id)
    ip = ctx.fabric_ip.ip
    found = devicemap.Findings(set_vars)
    if MAP_VAR in set_vars:
        devicemap.check_map(fab, ip, found)
    target = [e for e in rocev2_carriers(fab) if e.ip == ip] if ip else []
    selectors = ([NCCL_HCA_VAR] if NCCL_HCA_VAR in set_vars else []) + gid_vars
    if selectors and not target:
        devicemap.check_without_target(fab, ip, ctx.fabric_ip.ambiguous, selectors, gid_vars, found)
    if ip and target:
        if NCCL_HCA_VAR in set_vars:
            devicemap.check_nccl_hca(fab, ip, target[0], found)
        devicemap.check_gid_index(fab, ip, target[0], gid_vars, found)
    fix = devicemap.corrected(fab, set_vars, ip, target[0], gid_vars) if ip and target else []
    # unsetting the map sends the engine to the first enumerated device: only an engine's own selector may
    # go (NCCL_IB_HCA, a forced GID index: each engine then picks the RoCE v2 GID by address family)
    rem = (f"set {', '.join(k for k, _ in fix)} in this host's launch file to the values below"
           + (f"; or remove {'/'.join(selectors)} from it instead (the engine then selects the RoCE v2 GID by "
              "address family), but never the map: without it the engine opens the first enumerated device"
              if selectors else "")) if fix else remedy(gate_id)
    cmds = [export(k, v) for k, v in fix]
    facts = found.facts
    facts["problems"] = found.fails + found.warns
    facts["sources"] = {k: (ctx.obs.env_sources or {}).get(k) or ctx.obs.env_source for k in set_vars}
    from_txt = devicemap.sources_text(facts["sources"])  # the launch env and the inherited environment both set some
    typed = DeviceSelectors(tuple(found.failed_vars), tuple(found.rails))
    if found.fails:
        return Verdict(gate_id, FAIL, "; ".join(found.fails) + from_txt, rem, facts, found=typed, commands=cmds)
    if found.warns:
        return Verdict(gate_id, WARN, "; ".join(found.warns) + from_txt, rem, facts, found=typed, commands=cmds)
    if facts.get("not_judged"):
        what = facts.get("not_judged_var") or "/".join(selectors)
        return Verdict(gate_id, SKIP, f"{what} not judged: {facts['not_judged']}", "see fabric.rocev2-ipv4", facts,
                       found=typed)
    if ip is None:  # no fabric IP decided: only the map's entries for this host's addresses were judged
        return Verdict(gate_id, PASS, f"{MAP_VAR} names a RoCE v2 device for each of this host's addresses in it "
                       "(no fabric IP decided: which one the engine uses is not judged)", "nothing to do", facts,
                       found=typed)
    rail_txt = ("; rails: " + ", ".join(f"{r.port} {r.ip} on {r.subnet}" for r in found.rails) if found.rails else "")
    return Verdict(gate_id, PASS, f"{', '.join(set_vars)} {'points' if len(set_vars) == 1 else 'point'} at the "
                   "fabric IP's device" + (f" ({target[0].device} GID {target[0].gid_index})" if target else "")
                   + rail_txt + from_txt, "nothing to do", facts, found=typed)


def decode_errno(err: int | None) -> str:
    """Words for a verbs errno (sign ignored: call sites differ); "no errno" for None."""
    return "no errno" if err is None else errno_words(err)


@gate("fabric.qp-rtr")
def qp_rtr(ctx: Context, gate_id: str) -> Verdict:
    qp = ctx.obs.qp
    fab = ctx.obs.fabric
    if (v := probe_failed(gate_id, qp)) is not None:  # the live run marks qp failed when the fabric probe failed
        return v
    if qp is None or not qp.ran:
        why = qp.why if qp else "QP test not run"
        rem = remedy(gate_id + ".no-pyverbs") if qp and qp.why and "pyverbs" in qp.why else "nothing to do"
        return Verdict(gate_id, SKIP, f"QP test not run: {why}", rem)
    if fab is None or not fab.devices:
        return Verdict(gate_id, SKIP, "no RDMA device", remedy("fabric.rdma-present"))
    dev: str | None
    if ctx.fabric_ip.ip is None and ctx.fabric_ip.ambiguous:
        dev, how = fab.devices[0].name, "first enumerated device (fabric IP ambiguous)"
    else:
        dev, how = engine_device(ctx)
    results = [to_jsonable(r) for r in qp.results]
    mine = [r for r in qp.results if r.device == dev]
    facts = {"engine_device": dev, "chosen_by": how, "results": results, "notes": qp.notes}
    if not mine and dev not in {d.name for d in fab.devices}:  # e.g. the map names a device deleted since
        return Verdict(gate_id, FAIL, f"{dev} ({how}) is not an RDMA device on this host: the engine cannot open it",
                       remedy("fabric.first-device"), facts)
    if not mine:
        return Verdict(gate_id, ERROR, f"{dev}: no QP result for the device the engine opens", remedy(gate_id), facts)
    hung = [r for r in mine if r.reached not in ("RTR", "RTS") and (r.error or "").startswith("timed out")]
    if hung:  # the walk ran past its bound: nothing was judged, the kernel call may still be running
        r = hung[0]
        return Verdict(gate_id, ERROR, f"not judged: {dev} QP walk toward {r.target} {r.error} (reached {r.reached})",
                       PROBE_FAILED_REMEDY, facts)
    bad = [r for r in mine if r.reached not in ("RTR", "RTS")]
    cannot = [r for r in bad if r.errno is not None and abs(r.errno) == EOPNOTSUPP]
    if bad and len(cannot) == len(bad):  # "this device cannot", not "this device is broken"
        r = cannot[0]
        refused = next((s.to for s in r.steps if not s.ok), "the walk")
        return Verdict(gate_id, SKIP, f"{dev} ({how}): this device cannot run the RC QP walk: {refused} "
                       f"toward {r.target} "
                       f"answered errno {EOPNOTSUPP} (EOPNOTSUPP, operation not supported by this device)",
                       "nothing is broken on this evidence; test the path with the engine's own transport", facts)
    if bad:
        r = bad[0]
        step = next((s for s in r.steps if not s.ok), None)
        to = step.to if step else "RTR"
        return Verdict(gate_id, FAIL, f"{dev} ({how}): RC QP {r.reached}→{to} toward {r.target} failed: "
                       f"errno {abs(r.errno) if r.errno is not None else '?'} {decode_errno(r.errno)} "
                       f"[sgid index {r.sgid_index}: {r.sgid_choice}]",
                       remedy(gate_id) if abs(r.errno or 0) != 110 else remedy(gate_id + ".timeout"), facts,
                       action="SET_ENV" if abs(r.errno or 0) != 110 else "FIX_ROUTE",
                       commands=[command("ip", "route", "get", r.target, "from", ctx.fabric_ip.ip)]
                       if abs(r.errno or 0) == 110 and r.target not in (None, "loopback") and ctx.fabric_ip.ip else [])
    weak = all(r.target == "loopback" for r in mine)
    targets = ", ".join(sorted({r.target or "?" for r in mine}))
    tail = (" — loopback only, a weaker test (a QP aimed at its own GID reaches RTR even on the wrong port): "
            "give --peer" if weak else "")
    return Verdict(gate_id, PASS, f"{dev} ({how}): RC QP reached {mine[0].reached} toward {targets} "
                   f"from GID index {mine[0].sgid_index}{tail}", "nothing to do", facts)


@gate("fabric.route")
def route(ctx: Context, gate_id: str) -> Verdict:
    """fabric.route: the route to each peer (``ip route get <peer> from <fabric-ip>``, probes/route.py)
    leaves by the netdev of the GID selected for the fabric IP."""
    peers = list(ctx.inputs.peers)
    if not peers:
        return Verdict(gate_id, SKIP,
                       "no peer given (--peer or AFD_PEER_FABRIC_IPS in the launch env): no route to judge",
                       "give the peers' fabric IPs with --peer")
    e = carrier_entry(ctx, gate_id)
    if isinstance(e, Verdict):
        return e
    rf = ctx.obs.route
    if (v := probe_failed(gate_id, rf)) is not None:  # timed out or crashed: not evidence of "no route"
        return v
    if rf is None or not rf.captured or not rf.routes_captured:
        notes = [n for n in (rf.notes if rf is not None else []) if not n.startswith("ARP sysctls")]
        why = "; ".join(notes) if notes else "route probe not run"
        return Verdict(gate_id, SKIP, why if why.startswith("routes not captured") else f"routes not captured: {why}",
                       remedy("snapshot.route"))
    lost = [r for r in rf.routes if r.failed]
    if lost:
        why = "; ".join(f"peer {r.peer}: {r.error}" for r in lost)
        return Verdict(gate_id, ERROR, f"not judged: route lookup failed ({why})", PROBE_FAILED_REMEDY,
                       {"probe_failed": why})
    ip = ctx.fabric_ip.ip
    rows = [{"peer": r.peer, "dev": r.dev, "src": r.src, "via": r.via, "error": r.error, "source": r.source}
            for r in rf.routes]
    facts = {"fabric_ip": ip, "gid_netdev": e.netdev, "device": e.device, "gid_index": e.gid_index, "routes": rows}
    bad = []
    for r in rf.routes:
        if r.error:
            bad.append(f"no route to peer {r.peer} from {ip}: {r.error}")
        elif r.dev != e.netdev:
            bad.append(f"route to peer {r.peer} leaves by {r.dev}" + (f" via {r.via}" if r.via else "")
                       + f", not {e.netdev} (the netdev of {e.device} GID {e.gid_index} carrying {ip})")
    if bad:
        return Verdict(gate_id, FAIL, "; ".join(bad),
                       remedy(gate_id).format(netdev=e.netdev, fabric_ip=ip), facts,
                       commands=[command("ip", "route", "get", r.peer, "from", ip) for r in rf.routes
                                 if r.error or r.dev != e.netdev])
    via = [f"{r.peer} via {r.via}" for r in rf.routes if r.via]
    return Verdict(gate_id, PASS, f"route to {', '.join(r.peer for r in rf.routes)} leaves by {e.netdev} "
                   f"({e.device} GID {e.gid_index})" + (f"; routed: {', '.join(via)}" if via else ""),
                   "nothing to do", facts)


ARP_IGNORE_MIN = 1  # reply only when the target address is on the interface the request came in on
ARP_ANNOUNCE_WANT = 2  # always use the best local address (the one on the outgoing interface)
RP_FILTER_STRICT = 1  # strict reverse path: drops packets that arrive on the "other" rail


def arp_sysctls(netdev: str) -> str:
    """The ``sysctl -w`` line that keeps ``netdev``'s ARP replies and reverse path on its own port (a dot in a
    netdev name is a slash in a sysctl key: ``enp1s0f1.100`` -> ``net.ipv4.conf.enp1s0f1/100``)."""
    key = f"net.ipv4.conf.{netdev.replace('.', '/')}"
    return command("sudo", "sysctl", "-w", f"{key}.arp_ignore={ARP_IGNORE_MIN}",
                   f"{key}.arp_announce={ARP_ANNOUNCE_WANT}", f"{key}.rp_filter=2")


@gate("fabric.arp")
def arp(ctx: Context, gate_id: str) -> Verdict:
    """fabric.arp: with several RDMA netdevs on one IPv4 subnet, arp_ignore >= 1, arp_announce = 2
    and rp_filter != 1 (effective values: max of conf/all and conf/<netdev>) on each of them."""
    import ipaddress

    fab = ctx.obs.fabric
    if (v := probe_failed(gate_id, fab)) is not None:
        return v
    if fab is None or not fab.captured or not fab.devices:
        return _no_fabric(ctx, gate_id)
    rails = {e.netdev for e in ipv4_entries(fab) if e.netdev}
    nets: dict[str, set[str]] = {}
    for name in sorted(rails):
        nd = fab.netdevs.get(name)
        for a in (nd.ipv4 if nd else []):
            try:
                nets.setdefault(str(ipaddress.IPv4Interface(a).network), set()).add(name)
            except ValueError:
                continue
    shared = {net: sorted(nds) for net, nds in nets.items() if len(nds) > 1}
    facts: dict = {"subnets": {k: sorted(v) for k, v in nets.items()}, "shared": shared}
    if not nets:
        return Verdict(gate_id, SKIP, "no IPv4 address on any RDMA netdev: no ARP replies to judge", "nothing to do",
                       facts)
    holders = sorted({n for v in nets.values() for n in v})
    if len(holders) == 1:  # ARP flux needs a sibling port on the L2 domain to answer for this one's address
        return Verdict(gate_id, PASS, f"one IPv4 RDMA netdev ({holders[0]} on {', '.join(sorted(nets))}): no sibling "
                       "RDMA port to answer ARP for its address, so no ARP flux whatever the sysctls", "nothing to do",
                       facts)
    rf = ctx.obs.route
    if (v := probe_failed(gate_id, rf)) is not None:
        return v
    if not shared and (rf is None or not rf.sysctl_captured):  # the catalog: SKIP when the sysctls were not read
        why = next((n for n in (rf.notes if rf is not None else []) if n.startswith("ARP sysctls")),
                   "ARP sysctls not captured (route probe not run)")
        return Verdict(gate_id, SKIP, "one RDMA netdev per subnet (" + ", ".join(f"{n}: {', '.join(sorted(v))}"
                       for n, v in sorted(nets.items())) + f"), but not judged: {why}", remedy("snapshot.route"), facts)
    if not shared:
        return Verdict(gate_id, PASS, "one RDMA netdev per subnet (" + (", ".join(f"{n}: {', '.join(sorted(v))}"
                       for n, v in sorted(nets.items())) or "no IPv4 on the RDMA netdevs") + "): ARP replies "
                       "leave by the port the request came in on", "nothing to do", facts)
    if rf is None or not rf.sysctl_captured:
        why = "; ".join(rf.notes) if rf is not None and rf.notes else "not probed"
        sharing = ", ".join(f"{' and '.join(v)} share {k}" for k, v in shared.items())
        return Verdict(gate_id, SKIP, f"{sharing}, but the ARP sysctls were not captured ({why})",
                       remedy("snapshot.route"), facts)
    facts["effective"] = rf.effective
    facts["conf"] = rf.conf
    fails: list[str] = []
    warns: list[str] = []
    for net, nds in shared.items():
        for name in nds:
            eff = rf.effective.get(name) or {}
            ai, aa, rp = eff.get("arp_ignore"), eff.get("arp_announce"), eff.get("rp_filter")
            if ai is not None and ai < ARP_IGNORE_MIN:
                fails.append(f"{name} ({net}): arp_ignore {ai}: it answers ARP for its sibling's address")
            if aa is not None and aa < ARP_ANNOUNCE_WANT:
                (fails if aa == 0 else warns).append(f"{name} ({net}): arp_announce {aa}, not 2")
            if rp == RP_FILTER_STRICT:
                warns.append(f"{name} ({net}): rp_filter 1 (strict) drops replies that come back on the other rail")
    names = ", ".join(f"{' and '.join(v)} on {k}" for k, v in shared.items())
    if fails or warns:
        return Verdict(gate_id, FAIL if fails else WARN,
                       f"several rails on one subnet ({names}): " + "; ".join(fails + warns),
                       remedy(gate_id), facts, commands=[arp_sysctls(nd) for nds in shared.values() for nd in nds])
    return Verdict(gate_id, PASS, f"several rails on one subnet ({names}): arp_ignore, arp_announce and rp_filter "
                   "keep replies on the right port", "nothing to do", facts)


MIB = 1 << 20


def _words(errno: int | None, error: str | None) -> str:
    """An MR failure in words: EOPNOTSUPP is "this device cannot", EFAULT the engines' "Bad address"."""
    if errno == 95:
        return "this device cannot (EOPNOTSUPP)"
    if errno is not None:
        return f"errno {errno}: {errno_words(errno)}"
    return error or "not tried"


def cma_signature(m) -> bool:
    """The Spark registration-bug signature (NV-Kernels PR 591): ``CmaFree`` above ``CmaTotal`` in
    /proc/meminfo with no ``kho=off`` on the kernel command line. Pure."""
    return (isinstance(m.cma_total_kb, int) and isinstance(m.cma_free_kb, int) and m.cma_free_kb > m.cma_total_kb
            and m.kho_off is not True)


def mem_kinds(m) -> dict:
    """Which memory this host's RDMA devices registered: ``{"host": [devices], "gpu_peermem": [...],
    "gpu_dmabuf": [...], "why_gpu": [reasons]}`` from :class:`MemRegFacts`. Pure."""
    out: dict = {"host": [], "gpu_peermem": [], "gpu_dmabuf": [], "why_gpu": []}
    for d in m.devices:
        for key, kind in (("host_mr", "host"), ("gpu_mr", "gpu_peermem"), ("dmabuf_mr", "gpu_dmabuf")):
            r = d.get(key)
            if isinstance(r, dict) and r.get("ok") is True:
                out[kind].append(d["name"])
    for g in m.gpus:
        if g.get("gpu_direct_rdma_supported") is False:
            out["why_gpu"].append(f"CUDA reports no GPUDirect RDMA on GPU {g.get('ordinal')} {g.get('name') or '?'}")
    ex = m.dmabuf_export
    if isinstance(ex, dict) and ex.get("ok") is False:
        out["why_gpu"].append(f"dma-buf export refused ({ex.get('error')})")
    first = next((d for d in m.devices if isinstance(d.get("gpu_mr"), dict)), None)
    if first is not None and not out["gpu_peermem"]:
        g = first["gpu_mr"]
        out["why_gpu"].append(f"GPU pointer registration on {first['name']}: {_words(g.get('errno'), g.get('error'))}"
                              + ("" if m.peermem_loaded else " (nvidia_peermem not loaded)"))
    first = next((d for d in m.devices if isinstance(d.get("dmabuf_mr"), dict)), None)
    if first is not None and not out["gpu_dmabuf"]:
        g = first["dmabuf_mr"]
        out["why_gpu"].append(f"DmaBufMR on {first['name']}: {_words(g.get('errno'), g.get('error'))}")
    if m.cuda_why and not m.gpus:
        out["why_gpu"].append(m.cuda_why)
    return out


@gate("fabric.mem-registration")
def mem_registration(ctx: Context, gate_id: str) -> Verdict:
    m = probed(gate_id, ctx.obs.memreg, "memory registration (--no-qp skips it)",
               "run on the host without --no-qp, or replay a capture made with this afddiag")
    if isinstance(m, Verdict):
        return m
    if not m.devices:  # nothing registered; the CUDA and driver side was still read: keep it in the facts
        side = {"verbs_why": m.verbs_why, "open_kernel_module": m.open_kernel_module,
                "peermem_loaded": m.peermem_loaded, "gpus": m.gpus, "dmabuf_export": m.dmabuf_export,
                "cuda_why": m.cuda_why,
                "cma_total_kb": m.cma_total_kb, "cma_free_kb": m.cma_free_kb, "kho_off": m.kho_off,
                "kernel_release": m.kernel_release, "memlock_soft_bytes": m.memlock_soft_bytes}
        return Verdict(gate_id, SKIP, f"no registration tried: {m.verbs_why or 'no RDMA device'}",
                       remedy("fabric.qp-rtr.no-pyverbs") if "pyverbs" in (m.verbs_why or "")
                       else remedy("fabric.rdma-present"),
                       side)
    pb = ctx.playbook
    k = mem_kinds(m)
    gpu_ok = k["gpu_peermem"] or k["gpu_dmabuf"]
    facts = {"kinds": k, "engine_registers": pb.engine_registers or None, "open_kernel_module": m.open_kernel_module,
             "peermem_loaded": m.peermem_loaded, "cma_total_kb": m.cma_total_kb, "cma_free_kb": m.cma_free_kb,
             "kho_off": m.kho_off, "kernel_release": m.kernel_release, "memlock_soft_bytes": m.memlock_soft_bytes,
             "gpus": m.gpus, "dmabuf_export": m.dmabuf_export, "devices": m.devices}
    names = ", ".join(d["name"] for d in m.devices)
    host_txt = f"host memory {'yes' if k['host'] else 'no'}"
    paths = [p for p, ok in (("nvidia-peermem", k["gpu_peermem"]), ("dma-buf", k["gpu_dmabuf"])) if ok]
    gpu_txt = (f"GPU memory yes ({', '.join(paths)})" if gpu_ok
               else "GPU memory no" + (f" ({'; '.join(k['why_gpu'])})" if k["why_gpu"] else ""))
    role = f"role {pb.name} registers {pb.engine_registers} memory" if pb.engine_registers else \
        f"role {pb.name} does not say which memory its engine registers"
    if not k["host"]:
        d = next((d for d in m.devices if isinstance(d.get("host_mr"), dict) or d.get("open_error")), m.devices[0])
        r = d.get("host_mr") or d.get("open_error") or {}
        limited = r.get("errno") == 12 and m.memlock_soft_bytes not in (None, -1)
        return Verdict(gate_id, FAIL, f"{names}: cannot register host memory ({d['name']}: "
                       f"{_words(r.get('errno'), r.get('error'))}); {gpu_txt}",
                       "raise RLIMIT_MEMLOCK to unlimited for the engine's user (launch.memlock)" if limited else
                       "check the RDMA driver (`ibv_devinfo`, dmesg) and the device nodes (launch.uverbs-access)",
                       facts, action="RAISE_LIMIT" if limited else "LOAD_DRIVER")
    if pb.engine_registers == "gpu" and not gpu_ok:
        return Verdict(gate_id, FAIL, f"{names}: {host_txt}, {gpu_txt}; {role}: its registrations will fail "
                       "(\"Failed to register memory ... Bad address [14]\")", remedy(gate_id), facts)
    cnt = [d["host_mr_count"] for d in m.devices if isinstance(d.get("host_mr_count"), dict)]
    short = [c for c in cnt if isinstance(c.get("registered"), int) and isinstance(c.get("wanted"), int)
             and c["registered"] < c["wanted"] and c.get("errno") == 12]
    limit = m.memlock_soft_bytes
    by_limit = short and limit not in (None, -1) and limit < max(c["wanted"] for c in short) * MIB
    limit_txt = "unlimited" if limit == -1 else "not read" if limit is None else f"{limit / MIB:.0f} MiB"
    count_txt = (f"{min(c['registered'] for c in cnt)} of {cnt[0]['wanted']} x 1 MiB held at once" if cnt else "")
    if cma_signature(m):
        sig = (f"Spark registration-bug signature: CmaFree {m.cma_free_kb} kB > CmaTotal {m.cma_total_kb} kB and no "
               f"kho=off on the kernel command line (kernel {m.kernel_release or '?'})")
        verdict = FAIL if short and not by_limit else WARN
        got = f"; {count_txt} (ENOMEM)" if short else (f"; {count_txt}" if count_txt else "")
        return Verdict(gate_id, verdict, f"{names}: {sig}: large registrations fail with ENOMEM{got}",
                       remedy(gate_id + ".cma"), facts, action="REBOOT")
    if short and not by_limit:
        return Verdict(gate_id, WARN, f"{names}: {host_txt} but only {count_txt} (ENOMEM with RLIMIT_MEMLOCK "
                       f"{limit_txt}): pinned memory is short",
                       "find what pins memory (`grep -E 'Mlocked|Unevictable' /proc/meminfo`) and stop it "
                       "before launch",
                       facts, action="STOP_PROCESSES")
    note = (f"; the count stopped at RLIMIT_MEMLOCK {limit_txt} (launch.memlock judges it)" if by_limit
            else (f" ({count_txt})" if count_txt else ""))
    return Verdict(gate_id, PASS, f"{names}: {host_txt}{note}; {gpu_txt}; {role}", "nothing to do", facts)


GATES = declared(__name__)
