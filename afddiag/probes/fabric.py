"""The fabric probe: RDMA devices, ports, GID tables and netdevs from sysfs under a root path, the
device index order (NETLINK_RDMA) and the netdev addresses (getifaddrs); in a capture, the sysfs
files it reads.

Reads only; never raises through the run. A file that cannot be read leaves its field None and a
note on the owning object. Empty GID slots read all zeros and, on a real kernel, reading their
``gid_attrs/types/<i>`` or ``gid_attrs/ndevs/<i>`` fails with EINVAL: a missing file and an EINVAL
read are treated alike (empty), and attributes of empty slots are never read.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from afddiag.model.fabric import FabricFacts, Gid, Netdev, Port, RdmaDevice, ipv4_from_gid, is_empty_gid
from afddiag.probes import netlink
from afddiag.probes.registry import LIVE, Artifact, Probe, Run
from afddiag.probes.sysfs import QuietReader, entry_names, read_text
from afddiag.reader import ERRNO_SUFFIX
from afddiag.textnum import INT32_MAX, digits, kernel_int

TextReader = Callable[[str], str]

IB_CLASS = "sys/class/infiniband"
NET_CLASS = "sys/class/net"


def _after_colon(text: str | None) -> str | None:
    """'4: ACTIVE' -> 'ACTIVE'; '1: CA' -> 'CA'; text without a colon is returned as is."""
    if text is None:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def _int_names(path: str) -> list[int]:
    try:
        names = os.listdir(path)
    except OSError:
        return []
    return sorted(int(n) for n in names if digits(n))


def read_port(port_dir: str, num: int, read: QuietReader) -> Port:
    """Read one port: ``state``, ``phys_state``, ``link_layer``, ``rate`` and the GID table.

    GIDs come from ``gids/<i>``; the type from ``gid_attrs/types/<i>`` ("RoCE v2" / "IB/RoCE v1")
    and the netdev from ``gid_attrs/ndevs/<i>``, read only for non-zero GIDs.
    """
    port = Port(num=num)
    port.state = _after_colon(read(f"{port_dir}/state", port.notes))
    port.phys_state = _after_colon(read(f"{port_dir}/phys_state", port.notes))
    port.link_layer = read(f"{port_dir}/link_layer", port.notes)
    port.rate = read(f"{port_dir}/rate", port.notes)
    slots = _int_names(f"{port_dir}/gids")
    port.gid_slots = len(slots)
    for i in slots:
        gid = read(f"{port_dir}/gids/{i}", port.notes)
        if gid is None or is_empty_gid(gid):
            continue
        port.gids.append(
            Gid(
                index=i,
                gid=gid,
                type=read(f"{port_dir}/gid_attrs/types/{i}", port.notes),
                netdev=read(f"{port_dir}/gid_attrs/ndevs/{i}", port.notes),
                ipv4=ipv4_from_gid(gid),
            )
        )
    return port


def read_device(ib_dir: str, name: str, read: QuietReader) -> RdmaDevice:
    """Read one HCA: ``node_guid``, ``node_type``, ``hca_type``, ``fw_ver``, ``board_id`` (the PSID on
    mlx5; quietly None where the driver has none) and every port."""
    base = f"{ib_dir}/{name}"
    dev = RdmaDevice(name=name)
    dev.node_guid = read(f"{base}/node_guid", dev.notes)
    dev.node_type = _after_colon(read(f"{base}/node_type", dev.notes))
    dev.hca_type = read(f"{base}/hca_type", dev.notes)
    dev.fw_ver = read(f"{base}/fw_ver", dev.notes)
    dev.board_id = read(f"{base}/board_id")
    for num in _int_names(f"{base}/ports"):
        dev.ports.append(read_port(f"{base}/ports/{num}", num, read))
    if not dev.ports:
        dev.notes.append(f"{base}/ports: no ports listed")
    return dev


ARPHRD = {1: "ether", 32: "infiniband", 772: "loopback"}  # /sys/class/net/<if>/type (if_arp.h) as `ip link` names it


def read_netdev(net_dir: str, name: str, read: QuietReader) -> Netdev:
    """Read one netdev's ``mtu`` (bytes), ``operstate`` and ``speed`` (Mb/s; the kernel refuses the
    read with EINVAL while the link is down and prints -1 for SPEED_UNKNOWN, as virtual NICs do;
    ``ethtool <if>`` "Speed:"), its link ``type`` (:data:`ARPHRD`: 32 is an IPoIB netdev) and ``address``
    from ``/sys/class/net/<name>/``."""
    nd = Netdev(name=name)
    mtu = read(f"{net_dir}/{name}/mtu")
    nd.mtu = kernel_int(mtu, 0, INT32_MAX)
    nd.operstate = read(f"{net_dir}/{name}/operstate")
    speed, nd.speed_errno = read.errno_of(f"{net_dir}/{name}/speed")
    nd.speed_mbps = kernel_int(speed, -1, INT32_MAX)  # the kernel prints an int: -1 SPEED_UNKNOWN; else garbage
    nd.link_type = ARPHRD.get(kernel_int(read(f"{net_dir}/{name}/type"), 0, 65535) or -1)
    nd.hw_address = read(f"{net_dir}/{name}/address")
    return nd


def probe_fabric(
    root: str = "/",
    device_order: list[tuple[str, int]] | None = None,
    order_source: str | None = None,
    addresses: dict[str, Netdev] | None = None,
    addresses_source: str | None = None,
    reader: TextReader = read_text,
) -> FabricFacts:
    """Read every RDMA device under ``<root>/sys/class/infiniband`` and netdev under ``.../net``.

    ``device_order`` is ``[(name, kernel_device_index), ...]`` in enumeration order (from netlink
    or a snapshot); devices missing from it follow by name, with index None.
    ``addresses`` maps netdev name → :class:`Netdev` with its addresses (MTU and operstate there fill
    in what sysfs lacks). ``reader`` reads one
    file (injectable: tests emulate EINVAL with it). Returns :class:`FabricFacts`; never raises.
    """
    read = QuietReader(reader)
    ib_dir = str(Path(root) / IB_CLASS)
    net_dir = str(Path(root) / NET_CLASS)
    facts = FabricFacts()
    try:
        names = sorted(os.listdir(ib_dir))
    except OSError as e:
        names = []
        if e.errno != errno.ENOENT:  # EACCES, EIO: not "no RDMA device", a probe that could not read
            facts.failed = f"fabric probe could not list {ib_dir} ({os.strerror(e.errno) if e.errno else e})"
            facts.notes.append(facts.failed)
        else:
            facts.notes.append(f"{ib_dir} does not exist: no RDMA driver loaded")
    index = {n: i for n, i in (device_order or [])}
    ordered = [n for n, _ in (device_order or []) if n in names]
    rest = [n for n in names if n not in index]
    if device_order is None:
        facts.order_source = "name (device index unknown)"
        if names:
            facts.notes.append(
                "device index order unknown: listed by name, which may not be libibverbs' order"
            )
    else:
        facts.order_source = order_source or "given"
        if rest:
            facts.notes.append(f"not in the device index list, appended by name: {', '.join(rest)}")
    for n in ordered + rest:
        dev = read_device(ib_dir, n, read)
        dev.index = index.get(n)
        facts.devices.append(dev)

    try:
        netnames = sorted(os.listdir(net_dir))
    except OSError:
        netnames = []
    for n in netnames:
        facts.netdevs[n] = read_netdev(net_dir, n, read)
    facts.addresses_source = addresses_source or ("given" if addresses is not None else "none")
    for n, given in (addresses or {}).items():
        nd = facts.netdevs.setdefault(n, Netdev(name=n))
        nd.ipv4 = list(given.ipv4)
        nd.ipv6 = list(given.ipv6)
        nd.mtu = nd.mtu if nd.mtu is not None else given.mtu
        nd.operstate = nd.operstate or given.operstate
        nd.link_type = nd.link_type or given.link_type
        nd.hw_address = nd.hw_address or given.hw_address
    return facts


# ---------------------------------------------------------------------------------------------
# the probe: sysfs trees, device index order, netdev addresses; the files a capture copies

HCA_ATTRS = ("node_guid", "node_type", "hca_type", "fw_ver", "board_id")
PORT_ATTRS = ("state", "phys_state", "link_layer", "rate")
NET_ATTRS = ("mtu", "operstate", "address", "carrier", "speed", "type")
def ip_addr_json(run: Run, addresses: dict, netdevs: list[str]) -> list[dict[str, Any]]:
    """``ip -j addr show``-shaped list from afddiag's address reading (``{netdev: Netdev}``) and sysfs
    (``ifindex``, ``mtu`` in bytes, ``operstate``, ``address``): what ``parse_ip_addr_json`` reads."""
    net = os.path.join(run.sys_root or "/", "sys", "class", "net")
    rows = []
    for name in sorted(set(netdevs) | set(addresses)):
        row: dict[str, Any] = {}
        idx = run.try_read(f"{net}/{name}/ifindex")
        if idx is not None and digits(idx):
            row["ifindex"] = int(idx)
        row["ifname"] = name
        mtu = run.try_read(f"{net}/{name}/mtu")
        given = addresses.get(name)
        if mtu is not None and digits(mtu):
            row["mtu"] = int(mtu)
        elif given is not None and given.mtu is not None:
            row["mtu"] = given.mtu
        state = run.try_read(f"{net}/{name}/operstate") or (given.operstate if given is not None else None)
        if state:
            row["operstate"] = state.upper()
        mac = run.try_read(f"{net}/{name}/address")
        if mac:
            row["address"] = mac
        info = []
        for fam, addrs in (("inet", given.ipv4 if given else []), ("inet6", given.ipv6 if given else [])):
            for a in addrs:
                local, _, plen = a.partition("/")
                info.append({"family": fam, "local": local,
                             "prefixlen": int(plen) if digits(plen) else (32 if fam == "inet" else 128)})
        row["addr_info"] = info
        rows.append(row)
    return rows


def _device_rows(run: Run, root: str, order: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """``rdma -j dev show``-shaped rows of the device index order (a capture adds what rdma prints)."""
    ib = os.path.join(root, "sys", "class", "infiniband")
    rows = []
    for name, idx in order:
        row: dict[str, Any] = {"ifindex": idx, "ifname": name}
        if run.capturing:  # what `rdma -j dev show` also prints, for people reading the bundle
            for key, attr in (("node_type", "node_type"), ("fw", "fw_ver"), ("node_guid", "node_guid")):
                v = run.try_read(f"{ib}/{name}/{attr}")
                if v:
                    row[key] = v.split(":", 1)[-1].strip().lower() if key == "node_type" else v
        rows.append(row)
    return rows


def _read(run: Run, progress: Any) -> dict[str, Any]:
    """Device index order (NETLINK_RDMA, else ``rdma -j dev show``), addresses (getifaddrs), and
    the sysfs root the trees are read under."""
    src = run.src
    if src.root is None:
        return {"sys": None, "rdma-dev.json": None, "ip-addr.json": None, "order_source": "not read",
                "order_notes": [], "addr_source": "none", "notes": []}
    t = run.inputs.timeout("fabric_s")
    notes: list[str] = []
    progress.doing = "dumping RDMA devices over NETLINK_RDMA"
    if src.device_order is LIVE:
        order, order_source, onotes = netlink.device_order(min(t, 3.0))
    elif src.device_order is not None:
        order, order_source, onotes = src.device_order()
    else:
        order, order_source, onotes = None, "not read", []
    rows = _device_rows(run, src.root, order) if order is not None else None
    if order is None:
        notes.append("rdma-dev.json not written: device index order unknown on this host")
    progress.doing = "listing netdev addresses (getifaddrs)"
    addrs = None
    try:
        if src.addresses is None:
            raise OSError("not read")
        if src.addresses is LIVE:
            got, addr_source = netlink.netdev_addresses(), "psutil.net_if_addrs"
        else:
            got, addr_source = src.addresses(), "netlink (fake)"
        addrs = ip_addr_json(run, got, entry_names(os.path.join(src.root, "sys", "class", "net")))
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        addr_source = "none"
        notes.append(f"netdev addresses not read: {e}")
    return {"sys": src.root, "rdma-dev.json": rows, "ip-addr.json": addrs, "order_source": order_source,
            "order_notes": list(onotes or []), "addr_source": addr_source, "notes": notes}


def _parsed(r: dict, artifact: str, parse: Callable[[Any], Any], source_key: str, notes: list[str]) -> tuple[Any, Any]:
    """``(parse(r[artifact]), source)`` for a reading that is present and parses; ``(None, None)``
    when absent; a ValueError from ``parse`` becomes a note naming the artifact."""
    if r.get(artifact) is None:
        return None, None
    try:
        return parse(r[artifact]), r.get(source_key) or artifact
    except ValueError as e:
        notes.append(f"{artifact}: {e}")
        return None, None


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    if r.get("sys") is None:
        return {"fabric": FabricFacts(captured=False, notes=["fabric not captured (no sys/ in the snapshot)"])}
    notes: list[str] = list(r.get("notes") or []) if not run.live else []
    order, order_source = _parsed(r, "rdma-dev.json", netlink.parse_rdma_dev_json, "order_source", notes)
    addrs, addr_source = _parsed(r, "ip-addr.json", netlink.parse_ip_addr_json, "addr_source", notes)
    if run.live:
        addr_source = addr_source or r.get("addr_source")
        notes += [n for n in r.get("notes") or [] if "addresses" in n]
    elif addrs is None:
        notes.append("addresses not captured (no ip-addr.json): a GID's netdev is assumed to hold its IP")
    facts = probe_fabric(r["sys"], order, order_source or (r.get("order_source") if order else None), addrs,
                         addr_source, reader=progress.tracking(run.read))
    if run.live and (order is None or not facts.devices):
        notes[:0] = list(r.get("order_notes") or [])
    facts.notes[:0] = notes
    return {"fabric": facts}


def _copy_ports(run: Run, base: str, hca: str, put: Callable[[str, str], None], notes: list[str]) -> None:
    """One HCA's port attributes and GID table into a bundle (attributes of empty slots left out)."""
    for port in entry_names(f"{base}/ports", numeric=True):
        pdir, prel = f"{base}/ports/{port}", f"sys/class/infiniband/{hca}/ports/{port}"
        for a in PORT_ATTRS:
            v = run.try_read(f"{pdir}/{a}")
            if v is not None:
                put(f"{prel}/{a}", v)
        einval: list[int] = []
        for slot in entry_names(f"{pdir}/gids", numeric=True):
            gid = run.try_read(f"{pdir}/gids/{slot}")
            if gid is None:
                notes.append(f"{prel}/gids/{slot}: unreadable")
                continue
            put(f"{prel}/gids/{slot}", gid)
            missing = is_empty_gid(gid)  # empty slots: the kernel answers EINVAL, never read
            if not missing:
                for kind in ("types", "ndevs"):
                    v = run.try_read(f"{pdir}/gid_attrs/{kind}/{slot}")
                    if v is None:
                        missing = True
                    else:
                        put(f"{prel}/gid_attrs/{kind}/{slot}", v)
            if missing:
                einval.append(int(slot))
        if einval:
            put(f"{prel}/gid_attrs/EINVAL-SLOTS", "\n".join(str(i) for i in einval))


def _copy(run: Run, r: dict[str, Any], files: dict[str, bytes], notes: list[str]) -> None:
    """The sysfs files the fabric probe reads → ``files`` (``sys/...``, each the stripped text and a
    newline): attributes of empty GID slots are not copied, ``gid_attrs/EINVAL-SLOTS`` lists the
    slots whose attributes are absent or failed to read (as in the shared cases); a netdev attribute
    that is there but refused its read (``speed``: EINVAL while the link is down) leaves
    ``<attr>.errno`` with the errno, which a replay raises again (:func:`afddiag.reader.confined_reader`)."""
    root = run.sys_root
    if root is None:
        return
    ib = os.path.join(root, "sys", "class", "infiniband")
    net = os.path.join(root, "sys", "class", "net")

    def put(rel: str, text: str) -> None:
        files[rel] = (text + "\n").encode("utf-8", "replace")

    for hca in entry_names(ib):
        base = f"{ib}/{hca}"
        for a in HCA_ATTRS:
            v = run.try_read(f"{base}/{a}")
            if v is not None:
                put(f"sys/class/infiniband/{hca}/{a}", v)
        _copy_ports(run, base, hca, put, notes)
    for nd in entry_names(net):
        for a in NET_ATTRS:
            try:
                put(f"sys/class/net/{nd}/{a}", run.read(f"{net}/{nd}/{a}"))
            except OSError as e:  # there but refused (speed: EINVAL while the link is down): the replay
                if e.errno and e.errno != errno.ENOENT:  # raises the same errno (afddiag.reader)
                    put(f"sys/class/net/{nd}/{a}{ERRNO_SUFFIX}", str(e.errno))
            except (UnicodeError, ValueError):
                pass


def _failed(why: str) -> dict[str, Any]:
    return {"fabric": FabricFacts(captured=False, failed=why, notes=[why])}


PROBE = Probe("fabric", "fabric probe (sysfs)", "fabric_s",
              (Artifact("sys", "tree"), Artifact("rdma-dev.json"), Artifact("ip-addr.json")),
              _read, _facts, _failed, copy=_copy)
