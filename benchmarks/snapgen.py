"""Generate snapshot directories of any size for benchmarks: N devices × P ports × S GID slots.

Each port carries fe80 (RoCE v1 + v2) at slots 0/1 and an IPv4 address (v1 + v2) at 2/3, like mlx5;
the rest of the slots are empty (zeros, listed in gid_attrs/EINVAL-SLOTS, attribute files absent), as
the shared cases lay them out. Device i is `mlx5_i` on netdev `ens{i}np0` with 10.{i//250}.{i%250}.1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def _ip(i: int) -> str:
    return f"10.{i // 250}.{i % 250}.1"


def make_snapshot(root: Path, devices: int, slots: int = 255, ports: int = 1) -> Path:
    """Write a snapshot with ``devices`` HCAs of ``ports`` ports and ``slots`` GID slots each."""
    if root.exists():
        shutil.rmtree(root)
    ib = root / "sys" / "class" / "infiniband"
    net = root / "sys" / "class" / "net"
    rdma_dev, ip_addr = [], []
    for i in range(devices):
        name, nd, ip = f"mlx5_{i}", f"ens{i}np0", _ip(i)
        d = ib / name
        (d).mkdir(parents=True)
        (d / "node_guid").write_text(f"0200:00ff:fe{i // 256:02x}:{i % 256:02x}00\n")
        (d / "node_type").write_text("1: CA\n")
        (d / "hca_type").write_text("MT4129\n")
        (d / "fw_ver").write_text("28.45.4028\n")
        octets = [int(x) for x in ip.split(".")]
        v4 = f"0000:0000:0000:0000:0000:ffff:{octets[0]:02x}{octets[1]:02x}:{octets[2]:02x}{octets[3]:02x}"
        fe80 = f"fe80:0000:0000:0000:0000:00ff:fe{i // 256:02x}:{i % 256:02x}00"
        for p in range(1, ports + 1):
            pd = d / "ports" / str(p)
            (pd / "gids").mkdir(parents=True)
            (pd / "gid_attrs" / "types").mkdir(parents=True)
            (pd / "gid_attrs" / "ndevs").mkdir(parents=True)
            (pd / "state").write_text("4: ACTIVE\n")
            (pd / "phys_state").write_text("5: LinkUp\n")
            (pd / "link_layer").write_text("Ethernet\n")
            (pd / "rate").write_text("200 Gb/sec (2X NDR)\n")
            table = {0: (fe80, "IB/RoCE v1"), 1: (fe80, "RoCE v2"), 2: (v4, "IB/RoCE v1"), 3: (v4, "RoCE v2")}
            for s in range(slots):
                gid, typ = table.get(s, (ZERO, None))
                (pd / "gids" / str(s)).write_text(gid + "\n")
                if typ:
                    (pd / "gid_attrs" / "types" / str(s)).write_text(typ + "\n")
                    (pd / "gid_attrs" / "ndevs" / str(s)).write_text(nd + "\n")
            (pd / "gid_attrs" / "EINVAL-SLOTS").write_text("\n".join(str(s) for s in range(4, slots)) + "\n")
        n = net / nd
        n.mkdir(parents=True)
        (n / "mtu").write_text("9000\n")
        (n / "operstate").write_text("up\n")
        (n / "address").write_text("02:00:00:00:00:01\n")
        (n / "carrier").write_text("1\n")
        rdma_dev.append({"ifindex": i, "ifname": name, "node_type": "ca"})
        ip_addr.append({"ifindex": i + 2, "ifname": nd, "mtu": 9000, "operstate": "UP",
                        "addr_info": [{"family": "inet", "local": ip, "prefixlen": 24}]})
    (root / "rdma-dev.json").write_text(json.dumps(rdma_dev))
    (root / "ip-addr.json").write_text(json.dumps(ip_addr))
    return root


def spark_snapshot(case_dir: Path, root: Path, slots: int = 255) -> Path:
    """A shared Spark case (4 HCAs, 16 slots) padded to ``slots`` GID slots a port, as mlx5 has."""
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(case_dir, root, ignore=shutil.ignore_patterns("case.json"))
    for gids in root.glob("sys/class/infiniband/*/ports/*/gids"):
        have = {int(p.name) for p in gids.iterdir()}
        for s in range(max(have) + 1, slots):
            (gids / str(s)).write_text(ZERO + "\n")
        einval = gids.parent / "gid_attrs" / "EINVAL-SLOTS"
        old = einval.read_text().split() if einval.exists() else []
        einval.write_text("\n".join(sorted(set(old) | {str(s) for s in range(max(have) + 1, slots)}, key=int)) + "\n")
    return root
