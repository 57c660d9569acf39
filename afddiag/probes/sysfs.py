"""Fabric probe: RDMA devices, ports, GID tables and netdevs from sysfs under a root path.

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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from afddiag.model.fabric import FabricFacts, Netdev, Port, RdmaDevice
from afddiag.textnum import INT32_MAX, digits, kernel_int

Reader = Callable[[str], str]

IB_CLASS = "sys/class/infiniband"
NET_CLASS = "sys/class/net"


def read_text(path: str) -> str:
    """Read one sysfs attribute (at most 64 KiB) as stripped text. Raises OSError as the kernel
    answers it. os.open/os.read: a sysfs attribute is one read, and a GID table is 255-1,024 files
    a port, so the file-object machinery of open() is most of the cost."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


class _Reader:
    """Wraps a text reader: returns None for absent/EINVAL/ENODATA attributes, notes other errors."""

    QUIET = (errno.ENOENT, errno.EINVAL, errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTDIR)

    def __init__(self, read: Reader):
        self.read = read

    def __call__(self, path: str, notes: list[str] | None = None) -> str | None:
        try:
            return self.read(path)
        except OSError as e:
            if e.errno not in self.QUIET and notes is not None:
                notes.append(f"{path}: {os.strerror(e.errno) if e.errno else e}")
            return None
        except (UnicodeError, ValueError) as e:  # pragma: no cover - defensive
            if notes is not None:
                notes.append(f"{path}: {e}")
            return None

    def errno_of(self, path: str) -> tuple[str | None, int | None]:
        """``(text, None)`` when ``path`` reads, else ``(None, errno)`` (0 for an error without one):
        for an attribute whose refusal means something (``speed``: EINVAL while the link is down)."""
        try:
            return self.read(path), None
        except OSError as e:
            return None, e.errno or 0
        except (UnicodeError, ValueError):
            return None, 0


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


def read_port(port_dir: str, num: int, read: _Reader) -> Port:
    """Read one port: ``state``, ``phys_state``, ``link_layer``, ``rate`` and the GID table.

    GIDs come from ``gids/<i>``; the type from ``gid_attrs/types/<i>`` ("RoCE v2" / "IB/RoCE v1")
    and the netdev from ``gid_attrs/ndevs/<i>``, read only for non-zero GIDs.
    """
    from afddiag.model.fabric import Gid, Port, ipv4_from_gid, is_empty_gid

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


def read_device(ib_dir: str, name: str, read: _Reader) -> RdmaDevice:
    """Read one HCA: ``node_guid``, ``node_type``, ``hca_type``, ``fw_ver``, ``board_id`` (the PSID on
    mlx5; quietly None where the driver has none) and every port."""
    from afddiag.model.fabric import RdmaDevice

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


def read_netdev(net_dir: str, name: str, read: _Reader) -> Netdev:
    """Read one netdev's ``mtu`` (bytes), ``operstate`` and ``speed`` (Mb/s; the kernel refuses the
    read with EINVAL while the link is down and prints -1 for SPEED_UNKNOWN, as virtual NICs do;
    ``ethtool <if>`` "Speed:") from ``/sys/class/net/<name>/``."""
    from afddiag.model.fabric import Netdev

    nd = Netdev(name=name)
    mtu = read(f"{net_dir}/{name}/mtu")
    nd.mtu = kernel_int(mtu, 0, INT32_MAX)
    nd.operstate = read(f"{net_dir}/{name}/operstate")
    speed, nd.speed_errno = read.errno_of(f"{net_dir}/{name}/speed")
    nd.speed_mbps = kernel_int(speed, -1, INT32_MAX)  # the kernel prints an int: -1 SPEED_UNKNOWN; else garbage
    return nd


def probe_fabric(
    root: str = "/",
    device_order: list[tuple[str, int]] | None = None,
    order_source: str | None = None,
    addresses: dict[str, Netdev] | None = None,
    addresses_source: str | None = None,
    reader: Reader = read_text,
) -> FabricFacts:
    """Read every RDMA device under ``<root>/sys/class/infiniband`` and netdev under ``.../net``.

    ``device_order`` is ``[(name, kernel_device_index), ...]`` in enumeration order (from netlink
    or a snapshot); devices missing from it follow by name, with index None.
    ``addresses`` maps netdev name → :class:`Netdev` with its addresses (MTU and operstate there fill
    in what sysfs lacks). ``reader`` reads one
    file (injectable: tests emulate EINVAL with it). Returns :class:`FabricFacts`; never raises.
    """
    from afddiag.model.fabric import FabricFacts, Netdev

    read = _Reader(reader)
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
    return facts
