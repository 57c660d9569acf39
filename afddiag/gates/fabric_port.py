"""What ``fabric.rocev2-ipv4`` says when the fault is a port's or an HCA's mode, not the address: a ConnectX port
left in the InfiniBand link layer (its IPoIB netdev may hold the fabric IP, but no RoCE GID can carry an IPv4
address there: the port is named as InfiniBand, the change of port type, a firmware setting and a reboot, its
remedy, never "move the address"); an address offered only as RoCE v1 (the HCA's RoCE mode); a GID type not
read (no judgment on it). Pure."""

from __future__ import annotations

from afddiag.catalog import remedy
from afddiag.gates.devicemap import gid_slot
from afddiag.model.fabric import Entry, FabricFacts, Netdev, Port, RdmaDevice
from afddiag.shellcmd import command
from afddiag.verdict import FAIL, SKIP, Verdict


def ib_ports_of(fab: FabricFacts, nd: Netdev) -> list[tuple[RdmaDevice, Port]]:
    """The RDMA port under IPoIB netdev ``nd``: the one whose GID is the last 16 bytes of its hardware
    address (an IPoIB address is 4 bytes of QPN, then the port GID), else every port whose link layer is
    InfiniBand."""
    raw = (nd.hw_address or "").replace(":", "").lower()
    gid = ":".join(raw[i:i + 4] for i in range(8, 40, 4)) if len(raw) == 40 else None
    ib = [(d, p) for d in fab.devices for p in d.ports if p.link_layer == "InfiniBand"]
    exact = [(d, p) for d, p in ib if gid and any(g.gid.lower() == gid for g in p.gids)]
    return exact or ib


def infiniband_port(gate_id: str, fab: FabricFacts, ipoib: list[Netdev], head: str, inventory: list) -> Verdict:
    """FAIL: the address is on an IPoIB netdev, so its ConnectX port runs the InfiniBand link layer, not
    Ethernet: no RoCE GID can carry it, and moving the address fixes nothing. The remedy is the port type,
    a firmware setting that takes a reboot (SET_PORT_TYPE: drain)."""
    ports = list(dict.fromkeys((d.name, p.num) for nd in ipoib for d, p in ib_ports_of(fab, nd)))
    named = ", ".join(f"{d} port {n}" for d, n in ports) or "its port"
    facts = {"inventory": inventory, "ipoib_netdevs": [n.name for n in ipoib],
             "infiniband_ports": [{"device": d, "port": n} for d, n in ports]}
    return Verdict(gate_id, FAIL, f"{head} {', '.join(n.name for n in ipoib)}: {named} "
                   f"{'runs' if len(ports) < 2 else 'run'} the InfiniBand link layer, not Ethernet (RoCE)",
                   remedy(gate_id + ".infiniband").format(ports=named), facts, action="SET_PORT_TYPE",
                   commands=[command("sudo", "mlxconfig", "-d", d, "set", f"LINK_TYPE_P{n}=2") for d, n in ports])


ROCE_V1_REMEDY = ("the HCA offers this address only as RoCE v1: enable RoCE v2 on it (driver/firmware RoCE mode, "
                  "e.g. mlx4_core roce_mode or the HCA's RoCE mode setting) or use an HCA that supports RoCE v2")


def roce_v1_only(gate_id: str, entries: list[Entry], inventory: list, ip: str | None = None) -> Verdict:
    """FAIL: the IPv4 address is offered only as RoCE v1 GIDs (e.g. mlx4 ConnectX-3): the HCA's RoCE mode
    is the fault, not the address (action HW_INSPECTION; no address fix)."""
    where = "; ".join(f"{gid_slot(e)}, port {e.port_state}" for e in entries)
    head = f"fabric IP {ip}: " if ip else "no IPv4 RoCE v2 GID: "
    return Verdict(gate_id, FAIL, f"{head}only as RoCE v1: {where}", ROCE_V1_REMEDY, {"inventory": inventory},
                   action="HW_INSPECTION")


TYPE_NOT_READ_REMEDY = ("read the GID types on the host: "
                        "`cat /sys/class/infiniband/<hca>/ports/<p>/gid_attrs/types/<i>` "
                        "(or `show_gids`), then re-run; nothing on this host is judged wrong on an unread type")


def type_not_read(gate_id: str, entries: list[Entry], inventory: list, ip: str | None = None) -> Verdict:
    """SKIP: the IPv4-mapped GIDs offer no RoCE v2 entry, but the type of some was not read
    (gid_attrs/types/<i> unreadable or missing from a capture): an unread type is neither v1 nor v2."""
    where = "; ".join(gid_slot(e) for e in entries if e.gid_type is None)
    head = f"fabric IP {ip}" if ip else "IPv4-mapped GIDs"
    return Verdict(gate_id, SKIP, f"{head}: GID type not read for {where}: cannot tell RoCE v2 from v1",
                   TYPE_NOT_READ_REMEDY, {"inventory": inventory})
