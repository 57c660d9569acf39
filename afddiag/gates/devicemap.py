"""The judging steps of ``fabric.devicemap-env`` (the gate itself is :func:`afddiag.gates.fabric.devicemap_env`):
each variable that chooses the engine's device, port or GID (the device map, ``NCCL_IB_HCA``, every
engine's forced GID index) checked against the port that carries the fabric IP as RoCE v2, and the
corrected values. Pure functions of the fabric facts and the set variables; they never touch the host."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any

from afddiag.envvars import MAP_VAR, NCCL_HCA_VAR, format_device_map, parse_device_map, parse_nccl_hca
from afddiag.model import ROCE_V2, to_jsonable
from afddiag.model.fabric import (
    Entry,
    FabricFacts,
    RdmaDevice,
    carriers,
    ipv4_entries,
    is_link_local_v4,
    order_known,
    rocev2_carriers,
)
from afddiag.model.found import Rail
from afddiag.textnum import digits


def gid_slot(e: Entry) -> str:
    """One GID slot in words: ``mlx5_0 port 1 GID 3 (RoCE v2, enp1s0f0np0)``."""
    return f"{e.device} port {e.port} GID {e.gid_index} ({e.gid_type or 'type unknown'}, {e.netdev})"


def shown(raw: str, n: int = 20) -> str:
    """``raw`` quoted for a one-line summary: its first ``n`` characters, '…' when cut."""
    return repr(raw[:n] + ("…" if len(raw) > n else ""))


@dataclass
class Findings:
    """What the checks found: FAIL and WARN reasons, ``failed_vars`` (the variables a FAIL is about, in
    order; preflight --export overrides those only), ``rails`` (:func:`check_nccl_hca`) and the gate's
    facts (which show both)."""

    set_vars: dict[str, str]
    fails: list[str] = field(default_factory=list)
    warns: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    failed_vars: list[str] = field(default_factory=list)
    rails: list[Rail] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.facts.update({"set": self.set_vars, "failed_vars": self.failed_vars})

    def fail(self, var: str, why: str) -> None:
        self.fails.append(why)
        if var not in self.failed_vars:
            self.failed_vars.append(var)


def check_map(fab: FabricFacts, ip: str | None, found: Findings) -> None:
    """The device map: each entry for one of this host's addresses names a device that carries it as
    RoCE v2 (another host's entry is not judged here); the fabric IP has an entry, else the engine
    opens the first enumerated device (FAIL when that one does not carry it)."""
    good = rocev2_carriers(fab)
    entries, problems = parse_device_map(found.set_vars[MAP_VAR])
    for p in problems:
        found.fail(MAP_VAR, f"{MAP_VAR}: {p}")
    local = {e.ip for e in ipv4_entries(fab)} | {a.split("/")[0] for n in fab.netdevs.values() for a in n.ipv4}
    for eip, dev in entries.items():
        if eip not in local:
            continue  # another host's entry in a fleet-wide map
        ok = [e for e in good if e.ip == eip]
        unread = [e for e in ipv4_entries(fab) if e.ip == eip and e.device == dev and e.gid_type is None
                  and e.netdev_holds_ip]
        if not ok and unread:  # the named device carries it; whether as RoCE v2 was not read
            found.facts["not_judged"] = f"its entry {eip}={dev}: the GID type of {gid_slot(unread[0])} was not read"
            found.facts["not_judged_var"] = MAP_VAR
            continue
        if not any(e.device == dev for e in ok):
            right = f" (should be {ok[0].device})" if ok else " (no device here has it as RoCE v2)"
            found.fail(MAP_VAR, f"{MAP_VAR} sends {eip} to {dev}, which does not carry it as RoCE v2{right}")
    if ip and ip not in entries:
        first = fab.devices[0].name if order_known(fab) else None
        gap = f"{MAP_VAR} has no entry for fabric IP {ip}: the engine falls back to the first enumerated device"
        if first and not any(e.device == first for e in carriers(fab, ip)):
            # the missing entry is why the engine opens the wrong device: this gate's FAIL is the root
            # fabric.first-device's FAIL follows from (one fault, one remedy: add the entry)
            found.fail(MAP_VAR, f"{gap}, {first}, which does not carry it")
        else:
            found.warns.append(gap + (f", {first}, which carries it" if first else " (device order unknown)"))


def check_without_target(fab: FabricFacts, ip: str | None, ambiguous: bool, selectors: list[str],
                         gid_vars: list[str], found: Findings) -> None:
    """Selectors set while no port carries the fabric IP as RoCE v2: WARN when the fabric IP is not
    decided; else not judged (fabric.rocev2-ipv4's fault), except a forced GID index that selects a
    RoCE v1 GID of the fabric IP (the engine would send frames a RoCE v2 peer drops)."""
    if ip is None:
        found.warns.append(f"{'/'.join(selectors)} set but the fabric IP is "
                           f"{'ambiguous' if ambiguous else 'unknown'}: give --fabric-ip")
        return
    found.facts["not_judged"] = f"fabric IP {ip} has no RoCE v2 GID (fabric.rocev2-ipv4)"
    for var in gid_vars:
        raw = found.set_vars[var].strip()
        v1 = [e for e in carriers(fab, ip) if e.gid_type not in (None, ROCE_V2) and digits(raw)
              and e.gid_index == int(raw)]
        if v1:  # its own fault: the engine would send RoCE v1 frames, which a RoCE v2 peer drops
            found.fail(var, f"{var}={raw} selects {gid_slot(v1[0])}: a RoCE v1 GID; the engine needs a RoCE v2 "
                            "GID (the peers speak RoCE v2)")


def nccl_port_problem(fab: FabricFacts, d: RdmaDevice, p: Any, ip: str) -> tuple[str, Any]:
    """What NCCL gets from one selected ACTIVE port: ("fabric", None) when it carries the fabric IP as
    RoCE v2, ("rail", :class:`~afddiag.model.found.Rail`) when it carries its own routable IPv4 RoCE v2
    GID (fleet.rails checks a peer is on that subnet), else ("fail", why)."""
    mine = [e for e in rocev2_carriers(fab) if e.device == d.name and e.port == p.num]
    if any(e.ip == ip for e in mine):
        return "fabric", None
    routable = [e for e in mine if not is_link_local_v4(e.ip) or is_link_local_v4(ip)]
    if routable:
        e = routable[0]
        nd = fab.netdevs.get(e.netdev or "")
        pre = next((a for a in (nd.ipv4 if nd else []) if a.split("/")[0] == e.ip), f"{e.ip}/32")
        try:
            net = str(ipaddress.IPv4Interface(pre).network)
        except ValueError:
            net = pre
        return "rail", Rail(f"{d.name}:{p.num}", e.ip, net, e.gid_index)
    if mine:
        return "fail", (f"{d.name}:{p.num} has only the link-local IPv4 {mine[0].ip} (169.254/16), which no peer "
                        f"off that link reaches while the fabric IP {ip} is routable")
    return "fail", (f"{d.name}:{p.num} has no IPv4 RoCE v2 GID: NCCL falls back to GID index 0 (fe80) there and "
                    "its QP times out at RTR (errno 110)")


def check_nccl_hca(fab: FabricFacts, ip: str, t: Entry, found: Findings) -> None:
    """``NCCL_IB_HCA`` selects the fabric IP's port ``t``, and every other ACTIVE port it selects is one
    NCCL can use to reach a peer (its own routable RoCE v2 rail; ports not ACTIVE NCCL skips)."""
    raw = found.set_vars[NCCL_HCA_VAR]
    try:
        spec = parse_nccl_hca(raw)
    except ValueError as e:
        found.fail(NCCL_HCA_VAR, f"{NCCL_HCA_VAR}={shown(raw, 60)}: {e}")
        return
    picked = [(d, p) for d in fab.devices for p in d.ports if spec.selects(d.name, p.num)]
    chosen = [f"{d.name}:{p.num}" for d, p in picked]
    found.facts["nccl_selects"] = chosen
    if not spec.selects(t.device, t.port):
        found.fail(NCCL_HCA_VAR, f"{NCCL_HCA_VAR}={raw} selects {', '.join(chosen) or 'nothing'}, "
                                 f"not {t.device}:{t.port} which carries {ip}")
        return
    # NCCL uses every ACTIVE port it selects (ncclIbInit skips ports that are not ACTIVE)
    rails, bad, idle = [], [], []
    for d, p in picked:
        if p.state != "ACTIVE":
            idle.append(f"{d.name}:{p.num}")
            continue
        kind, why = nccl_port_problem(fab, d, p, ip)
        if kind == "rail":
            rails.append(why)
        elif kind == "fail":
            bad.append(why)
    found.rails = rails
    found.facts["rails"] = [to_jsonable(r) for r in rails]
    found.facts["ignored_not_active"] = idle
    if bad:
        found.fail(NCCL_HCA_VAR, f"{NCCL_HCA_VAR}={raw} also selects ports NCCL cannot use to "
                                 "reach a peer: " + "; ".join(bad))


def check_gid_index(fab: FabricFacts, ip: str, t: Entry, gid_vars: list[str], found: Findings) -> None:
    """Every engine's forced GID index (NCCL, Mooncake, UCX alike) is the index of the fabric IP's
    RoCE v2 GID ``t``."""
    for var in gid_vars:
        raw = found.set_vars[var].strip()
        if not digits(raw):
            found.fail(var, f"{var}={shown(raw)} is not a GID index")
        elif int(raw) != t.gid_index:
            port = next((p for d in fab.devices if d.name == t.device for p in d.ports if p.num == t.port), None)
            g = next((g for g in port.gids if g.index == int(raw)), None) if port else None
            what = f"{g.gid} ({g.type})" if g else "an empty slot"
            found.fail(var, f"{var}={raw} on {t.device} port {t.port} is {what}, not {ip} as RoCE v2 "
                            f"(that is GID index {t.gid_index})")


def corrected(fab: FabricFacts, set_vars: dict[str, str], ip: str, t: Entry,
              gid_vars: list[str]) -> list[tuple[str, str]]:
    """``(VAR, value)`` settings that point every set selector at the fabric IP's RoCE v2 GID ``t``: the map
    corrected, never dropped (other hosts' entries kept, this host's fixed), else one entry for it."""
    fix = []
    if MAP_VAR in set_vars:
        good = rocev2_carriers(fab)
        fixed = {}
        for eip, dev in parse_device_map(set_vars[MAP_VAR])[0].items():
            ok = [e for e in good if e.ip == eip]
            fixed[eip] = dev if not ok or any(e.device == dev for e in ok) else ok[0].device
        fixed[ip] = t.device
        fix.append((MAP_VAR, format_device_map(fixed)))
    else:
        fix.append((MAP_VAR, f"{ip}={t.device}"))
    if NCCL_HCA_VAR in set_vars:
        fix.append((NCCL_HCA_VAR, f"={t.device}:{t.port}"))  # "=": NCCL's exact match of the device name
    return fix + [(var, str(t.gid_index)) for var in gid_vars]


def sources_text(srcs: dict[str, str]) -> str:
    """`` (A, B from the launch env; C from the inherited environment)`` when the variables come from
    more than one place, else ""."""
    by_src: dict[str, list[str]] = {}
    for k, src in srcs.items():
        by_src.setdefault(src, []).append(k)
    return (" (" + "; ".join(f"{', '.join(ks)} from the {src}" for src, ks in by_src.items()) + ")"
            if len(by_src) > 1 else "")
