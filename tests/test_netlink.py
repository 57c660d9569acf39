"""Live-host sources: the NETLINK_RDMA dump parser and the psutil/ip -j address readers."""

import errno
import struct

import pytest

from afddiag.probes.netlink import (
    NLMSG_DONE,
    NLMSG_ERROR,
    RDMA_NLDEV_ATTR_DEV_INDEX,
    RDMA_NLDEV_ATTR_DEV_NAME,
    netdev_addresses,
    parse_ip_addr_json,
    parse_nldev_dump,
    parse_rdma_dev_json,
)


def attr(t, payload):
    n = 4 + len(payload)
    return struct.pack("=HH", n, t) + payload + b"\0" * ((4 - n % 4) % 4)


def msg(mtype, body):
    return struct.pack("=IHHII", 16 + len(body), mtype, 2, 1, 0) + body


def dev(name, idx):
    body = (attr(RDMA_NLDEV_ATTR_DEV_INDEX, struct.pack("=I", idx))
            + attr(RDMA_NLDEV_ATTR_DEV_NAME, name.encode() + b"\0"))
    return msg((5 << 10) + 1, body)


def test_nldev_dump_keeps_kernel_order_across_datagrams():
    chunks = [dev("zz0", 0) + dev("aa1", 1), dev("mm2", 2) + msg(NLMSG_DONE, struct.pack("=i", 0))]
    assert parse_nldev_dump(chunks) == [("zz0", 0), ("aa1", 1), ("mm2", 2)]


def test_nldev_dump_error_reply_raises_with_errno():
    with pytest.raises(OSError) as e:
        parse_nldev_dump([msg(NLMSG_ERROR, struct.pack("=i", -errno.EPERM) + b"\0" * 16)])
    assert e.value.errno == errno.EPERM


def test_rdma_dev_json_sorted_by_index_and_validated():
    assert parse_rdma_dev_json([{"ifindex": 3, "ifname": "b"}, {"ifindex": 1, "ifname": "z"}]) == [("z", 1), ("b", 3)]
    with pytest.raises(ValueError):
        parse_rdma_dev_json({"ifname": "x"})
    with pytest.raises(ValueError):
        parse_rdma_dev_json([{"ifname": "x", "ifindex": "1"}])


def test_live_addresses_include_loopback():
    lo = netdev_addresses()["lo"]
    assert "127.0.0.1/8" in lo.ipv4


def test_ip_addr_json_parsing():
    nd = parse_ip_addr_json([{"ifname": "vc", "mtu": 9000, "operstate": "UP", "addr_info": [
        {"family": "inet", "local": "10.9.0.2", "prefixlen": 24},
        {"family": "inet6", "local": "fe80::1", "prefixlen": 64}]}])
    assert nd["vc"].mtu == 9000 and nd["vc"].operstate == "up"
    assert nd["vc"].ipv4 == ["10.9.0.2/24"] and nd["vc"].holds_ipv4("10.9.0.2")
    with pytest.raises(ValueError):
        parse_ip_addr_json([{"mtu": 1}])
