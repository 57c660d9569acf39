"""Engine evidence: what NCCL says it chose, read from the engine's own log (``--engine-log FILE``).

NCCL prints these lines only with ``NCCL_DEBUG=INFO`` (format strings of NVIDIA/nccl):

- ``src/transport/net_ib.cc`` (``net_ib/init.cc`` in newer trees): ``INFO(NCCL_INIT|NCCL_NET, "NET/IB :
  Using%s %s; OOB %s:%s", line, "[RO]"|"", ncclIbIfName, address)`` where ``line`` is `` [%d]%s:%d/%s``
  per device (index, HCA, port, ``IB``|``RoCE``): ``NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB
  enp1s0f1np1:192.168.100.10<0>``;
- ``src/transport/net_socket.cc``: ``INFO(NCCL_INIT|NCCL_NET, "NET/Socket : Using%s", line)``, `` [%d]%s:%s``
  per interface (index, netdev, address);
- ``src/init.cc``: ``INFO(NCCL_INIT, "Using network %s", ncclNetName(comm))`` (``IB``, ``Socket``, a plugin's);
- ``src/misc/param.cc``: ``INFO(NCCL_ENV, "%s set by environment to %lld.", env, value)``
  (``NCCL_IB_GID_INDEX set by environment to 3.``);
- ``src/transport/net_ib.cc`` connect (RoCE): ``"NET/IB: %s %d IbDev %d Port %d qpn %d mtu %d GID %ld (%lX/%lX) ..."``:
  the GID index a connection used.

Data and a pure parser only: the probe is :mod:`afddiag.probes.engine`, the gate :mod:`afddiag.gates.engine`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

MAX_ITEMS = 64  # devices, connections, lines kept of each kind

_IB_USING = re.compile(r"NET/IB ?: Using((?: \[\d{1,3}\][^\s\[\];]{1,128})*)(?: \[RO\])? ?; "
                       r"OOB ([^\s:]{1,64}):(\S{1,128})")
_IB_DEV = re.compile(r"\[(\d{1,3})\]([^\s:\[\];]{1,64}):(\d{1,3})/([A-Za-z]{1,16})")
_SOCK_USING = re.compile(r"NET/Socket ?: Using((?: \[\d{1,3}\][^\s\[\]]{1,192})+)")
_SOCK_DEV = re.compile(r"\[(\d{1,3})\]([^\s:\[\]]{1,64}):(\S{1,128})")
_NETWORK = re.compile(r"NCCL INFO Using network ([A-Za-z0-9_ .-]{1,64}?)\s*$")
_ENV_SET = re.compile(r"(NCCL_[A-Z0-9_]{1,64}) set by environment to (\S{1,200}?)\.?\s*$")
_CONNECT_GID = re.compile(r"NET/IB: NCCL (?:Merged)?Dev \d{1,3} IbDev (\d{1,3}) Port (\d{1,3}) qpn \d{1,10} "
                          r"mtu (\d) GID (\d{1,4})")
#: What makes a line NCCL's net evidence (the probe keeps only these lines of the log).
MARKS = ("NET/IB", "NET/Socket", "Using network", "set by environment to")


def is_evidence(line: str) -> bool:
    """True when a log line is one :func:`parse` reads. Pure."""
    return "NCCL" in line and any(m in line for m in MARKS)


def _ipv4(addr: str) -> str | None:
    """``192.168.100.10<0>`` (ncclSocketToString: address<port>) → ``192.168.100.10``; None for IPv6/other."""
    m = re.match(r"^(\d{1,3}(?:\.\d{1,3}){3})(?:<\d+>)?$", addr)
    return m.group(1) if m else None


@dataclass
class EngineFacts:
    """What the engine's log says NCCL chose. ``source``: the file (or snapshot artifact) read; ``lines``:
    the evidence lines kept (None: no log given or read); ``networks``: the ``Using network`` names in
    order; ``ib_devices``: ``[{"index", "device", "port", "link_layer"}]`` of the last ``NET/IB : Using``
    line, ``oob``: ``{"netdev", "ip"}`` of it; ``socket_devices``: ``[{"index", "netdev", "ip"}]`` of
    ``NET/Socket : Using``; ``env``: ``{NCCL_*: value}`` NCCL says the environment set; ``connections``:
    ``[{"ib_dev", "port", "mtu", "gid_index"}]`` of the RoCE connect lines (distinct, first 64)."""

    source: str | None = None
    lines: list[str] | None = None
    networks: list[str] = field(default_factory=list)
    ib_devices: list[dict[str, Any]] = field(default_factory=list)
    oob: dict[str, Any] | None = None
    socket_devices: list[dict[str, Any]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    connections: list[dict[str, int]] = field(default_factory=list)
    failed: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def has_net_lines(self) -> bool:
        """NCCL said which network it uses (a ``NET/IB``, ``NET/Socket`` or ``Using network`` line)."""
        return bool(self.networks or self.ib_devices or self.socket_devices)


def parse(lines: list[str], source: str | None = None) -> EngineFacts:
    """Evidence lines (any log: NCCL's prefix ``host:pid:tid [rank] NCCL INFO`` is not required) →
    :class:`EngineFacts`. Every pattern is bounded; unknown lines are ignored. Pure."""
    f = EngineFacts(source=source, lines=lines)
    for line in lines:
        line = line[:4096]
        if (m := _IB_USING.search(line)) is not None:
            f.ib_devices = [{"index": int(d.group(1)), "device": d.group(2), "port": int(d.group(3)),
                             "link_layer": d.group(4)} for d in _IB_DEV.finditer(m.group(1))][:MAX_ITEMS]
            f.oob = {"netdev": m.group(2), "ip": _ipv4(m.group(3)), "address": m.group(3)}
        elif (m := _SOCK_USING.search(line)) is not None:
            f.socket_devices = [{"index": int(d.group(1)), "netdev": d.group(2), "ip": _ipv4(d.group(3))}
                                for d in _SOCK_DEV.finditer(m.group(1))][:MAX_ITEMS]
        elif (m := _NETWORK.search(line)) is not None:
            if len(f.networks) < MAX_ITEMS:
                f.networks.append(m.group(1))
        elif (m := _ENV_SET.search(line)) is not None:
            if len(f.env) < MAX_ITEMS:
                f.env[m.group(1)] = m.group(2)
        elif (m := _CONNECT_GID.search(line)) is not None:
            c = {"ib_dev": int(m.group(1)), "port": int(m.group(2)), "mtu": int(m.group(3)),
                 "gid_index": int(m.group(4))}
            if c not in f.connections and len(f.connections) < MAX_ITEMS:
                f.connections.append(c)
    return f
