"""Live-host sources the sysfs tree lacks: RDMA device index order and netdev addresses.

* Device order: an ``RDMA_NLDEV_CMD_GET`` dump over ``NETLINK_RDMA`` — the same dump libibverbs
  walks, so its order (kernel device index) is the order pyverbs and every engine enumerate.
  Falls back to ``rdma -j dev show`` (iproute2) when the socket cannot be used.
* Addresses: ``psutil.net_if_addrs()`` (getifaddrs) per netdev.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import struct
import subprocess

from afddiag import proc
from afddiag.model.fabric import Netdev

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3


def _parse_attrs(buf: bytes) -> dict[int, bytes]:
    attrs: dict[int, bytes] = {}
    off = 0
    while off + 4 <= len(buf):
        alen, atype = struct.unpack_from("=HH", buf, off)
        if alen < 4:
            break
        attrs[atype & 0x3FFF] = buf[off + 4 : off + alen]
        off += (alen + 3) & ~3
    return attrs


def parse_nldev_dump(chunks: list[bytes]) -> list[tuple[str, int]]:
    """Parse the datagrams of an RDMA_NLDEV_CMD_GET dump into ``[(name, index), ...]`` in order.

    Raises OSError with the kernel's errno on an NLMSG_ERROR reply.
    """
    out: list[tuple[str, int]] = []
    for data in chunks:
        off = 0
        while off + 16 <= len(data):
            mlen, mtype, _flags, _seq, _pid = struct.unpack_from("=IHHII", data, off)
            if mlen < 16:
                break
            if mtype == NLMSG_DONE:
                return out
            if mtype == NLMSG_ERROR:
                (err,) = struct.unpack_from("=i", data, off + 16)
                if err:
                    raise OSError(-err, os.strerror(-err))
            else:
                attrs = _parse_attrs(data[off + 16 : off + mlen])
                if RDMA_NLDEV_ATTR_DEV_INDEX in attrs and RDMA_NLDEV_ATTR_DEV_NAME in attrs:
                    (idx,) = struct.unpack("=I", attrs[RDMA_NLDEV_ATTR_DEV_INDEX][:4])
                    name = attrs[RDMA_NLDEV_ATTR_DEV_NAME].split(b"\0", 1)[0].decode()
                    out.append((name, idx))
            off += (mlen + 3) & ~3
    return out


def rdma_devices_netlink(timeout_s: float = 2.0) -> list[tuple[str, int]]:
    """RDMA devices in kernel device index order via a NETLINK_RDMA dump: ``[(name, index)]``.

    Raises OSError when the socket cannot be opened (kernel without RDMA netlink) or times out.
    """
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    try:
        s.settimeout(timeout_s)
        s.bind((0, 0))
        msg_type = (RDMA_NL_NLDEV << 10) + RDMA_NLDEV_CMD_GET
        s.send(struct.pack("=IHHII", 16, msg_type, NLM_F_REQUEST | NLM_F_DUMP, 1, 0))
        chunks: list[bytes] = []
        while True:
            data = s.recv(65536)
            chunks.append(data)
            done = False
            off = 0
            while off + 16 <= len(data):
                mlen, mtype = struct.unpack_from("=IH", data, off)
                if mtype in (NLMSG_DONE, NLMSG_ERROR) or mlen < 16:
                    done = True
                    break
                off += (mlen + 3) & ~3
            if done:
                break
        return parse_nldev_dump(chunks)
    finally:
        s.close()


def rdma_devices_iproute(timeout_s: float = 3.0) -> list[tuple[str, int]]:
    """``rdma -j dev show`` (iproute2) → ``[(name, index)]``. Raises OSError or ValueError."""
    exe = shutil.which("rdma")
    if not exe:
        raise OSError("the rdma command (iproute2) is not installed")
    p = proc.run([exe, "-j", "dev", "show"], timeout_s)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, p.args, p.stdout, p.stderr)
    out = p.stdout
    return parse_rdma_dev_json(json.loads(out or "[]"))


def parse_rdma_dev_json(data: object) -> list[tuple[str, int]]:
    """``rdma -j dev show`` JSON (list of {ifindex, ifname, ...}) → ``[(name, index)]`` by index.

    Raises ValueError when the JSON is not that shape.
    """
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of devices")
    rows = []
    for d in data:
        if not isinstance(d, dict) or not isinstance(d.get("ifname"), str):
            raise ValueError("each device needs a string 'ifname'")
        idx = d.get("ifindex")
        if not isinstance(idx, int):
            raise ValueError(f"device {d['ifname']}: 'ifindex' is not an integer")
        rows.append((d["ifname"], idx))
    return sorted(rows, key=lambda r: r[1])


def rdma_devices_pyverbs() -> list[str]:
    """Device names in libibverbs' own enumeration order (``pyverbs.device.get_device_list()``, i.e.
    ``ibv_get_device_list``): the order an engine built on libibverbs sees. Raises ImportError
    without pyverbs, OSError/other pyverbs errors when the list cannot be read."""
    import pyverbs.device as pvd  # python3-pyverbs; optional

    names = []
    for dev in pvd.get_device_list():
        n = dev.name
        names.append(n.decode() if isinstance(n, bytes) else str(n))
    return names


def device_order(timeout_s: float = 2.0, pyverbs_list=None) -> tuple[list[tuple[str, int]] | None, str, list[str]]:
    """Best live source of libibverbs' enumeration order → (``[(name, index)]`` or None, source, notes).

    pyverbs' device list first (libibverbs itself; indexes from the NETLINK_RDMA dump when it answers,
    else the list position), then the NETLINK_RDMA dump (the same kernel device index order
    libibverbs walks), then ``rdma -j dev show``; None with source "name (device index unknown)"
    when none answers (gates then say the order is unknown instead of guessing from names).
    ``pyverbs_list`` replaces :func:`rdma_devices_pyverbs` (tests)."""
    notes: list[str] = []
    kernel: list[tuple[str, int]] | None = None
    try:
        kernel = rdma_devices_netlink(timeout_s)
        kernel_source = "netlink (RDMA_NLDEV_CMD_GET)"
    except (OSError, ValueError, struct.error) as e:
        notes.append(f"NETLINK_RDMA dump failed: {e}")
    try:
        names = (pyverbs_list or rdma_devices_pyverbs)()
    except ImportError:
        names = None
        notes.append("pyverbs not importable: device order from the kernel's device index instead")
    except Exception as e:  # noqa: BLE001 - pyverbs errors are not OSError subclasses
        names = None
        notes.append(f"pyverbs device list failed: {type(e).__name__}: {e}")
    if names:
        idx = dict(kernel or [])
        if kernel is not None and [n for n, _ in kernel if n in names] != names:
            notes.append("pyverbs order differs from the kernel's device index order; pyverbs' (libibverbs') is used")
        return ([(n, idx.get(n, i)) for i, n in enumerate(names)],
                "pyverbs (ibv_get_device_list)" + ("" if kernel is not None else "; index = list position"), notes)
    if kernel is not None:
        return kernel, kernel_source, notes
    try:
        return rdma_devices_iproute(timeout_s), "rdma -j dev show", notes
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        notes.append(f"rdma -j dev show failed: {e}")
    return None, "name (device index unknown)", notes


def _prefixlen(netmask: str | None, default: int) -> int:
    if not netmask:
        return default
    try:
        return ipaddress.ip_network(f"0.0.0.0/{netmask}").prefixlen if "." in netmask else (
            bin(int(ipaddress.IPv6Address(netmask))).count("1")
        )
    except ValueError:
        return default


def netdev_addresses() -> dict[str, Netdev]:
    """Every netdev's addresses from ``psutil.net_if_addrs()``: IPv4 "a.b.c.d/len", IPv6 "addr/len".

    MTU and operstate come from sysfs; only addresses are filled here.
    """
    import psutil

    out: dict[str, Netdev] = {}
    for name, addrs in psutil.net_if_addrs().items():
        nd = out.setdefault(name, Netdev(name=name))
        for a in addrs:
            if a.family == socket.AF_INET:
                nd.ipv4.append(f"{a.address}/{_prefixlen(a.netmask, 32)}")
            elif a.family == socket.AF_INET6:
                nd.ipv6.append(f"{a.address.split('%')[0]}/{_prefixlen(a.netmask, 128)}")
    return out


def parse_ip_addr_json(data: object) -> dict[str, Netdev]:
    """``ip -j addr show`` JSON → netdevs with MTU (bytes), operstate and addresses.

    Raises ValueError when the JSON is not a list of interface objects.
    """
    if not isinstance(data, list):
        raise ValueError("expected a JSON list of interfaces")
    out: dict[str, Netdev] = {}
    for link in data:
        if not isinstance(link, dict) or not isinstance(link.get("ifname"), str):
            raise ValueError("each interface needs a string 'ifname'")
        nd = Netdev(
            name=link["ifname"],
            mtu=link["mtu"] if isinstance(link.get("mtu"), int) else None,
            operstate=str(link["operstate"]).lower() if link.get("operstate") else None,
            link_type=link["link_type"] if isinstance(link.get("link_type"), str) else None,
            hw_address=link["address"] if isinstance(link.get("address"), str) else None,
        )
        for a in link["addr_info"] if isinstance(link.get("addr_info"), list) else []:
            if not isinstance(a, dict) or not a.get("local"):
                continue
            plen = a.get("prefixlen")
            if a.get("family") == "inet":
                nd.ipv4.append(f"{a['local']}/{plen if isinstance(plen, int) else 32}")
            elif a.get("family") == "inet6":
                nd.ipv6.append(f"{a['local']}/{plen if isinstance(plen, int) else 128}")
        out[nd.name] = nd
    return out
