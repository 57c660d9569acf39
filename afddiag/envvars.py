"""Launch-environment variables afddiag reads, and their parsers (pure functions)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

MAP_VAR = "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP"
NCCL_HCA_VAR = "NCCL_IB_HCA"
NCCL_GID_VAR = "NCCL_IB_GID_INDEX"
WATCHED = (MAP_VAR, NCCL_HCA_VAR, NCCL_GID_VAR)

_DEV_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_device_map(value: str) -> tuple[dict[str, str], list[str]]:
    """Parse ``ip=device[,ip=device...]`` → (``{ip: device}``, problems).

    Each problem is one line naming the bad entry. Empty entries (``a=b,,``) are ignored.
    """
    entries: dict[str, str] = {}
    problems: list[str] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        ip, sep, dev = item.partition("=")
        ip, dev = ip.strip(), dev.strip()
        if not sep or not ip or not dev:
            problems.append(f"entry {item!r} is not ip=device")
            continue
        try:
            ipaddress.IPv4Address(ip)
        except ValueError:
            problems.append(f"entry {item!r}: {ip!r} is not an IPv4 address")
            continue
        if not _DEV_RE.match(dev):
            problems.append(f"entry {item!r}: {dev!r} is not an RDMA device name")
            continue
        if ip in entries and entries[ip] != dev:
            problems.append(f"{ip} is mapped twice ({entries[ip]} and {dev})")
            continue
        entries[ip] = dev
    return entries, problems


def format_device_map(entries: dict[str, str]) -> str:
    """``{ip: device}`` → ``ip=device,ip=device`` (the launcher's form)."""
    return ",".join(f"{ip}={dev}" for ip, dev in entries.items())


@dataclass
class HcaSpec:
    """``NCCL_IB_HCA`` parsed: ``^`` excludes, ``=`` asks exact names (else prefix match)."""

    exclude: bool = False
    exact: bool = False
    items: list[tuple[str, int | None]] = field(default_factory=list)  # (name, port or None)

    def selects(self, device: str, port: int) -> bool:
        """True when NCCL would use ``device`` port ``port`` under this spec."""
        hit = any(
            (device == name if self.exact else device.startswith(name))
            and (p is None or p == port)
            for name, p in self.items
        )
        return not hit if self.exclude else hit


def parse_nccl_hca(value: str) -> HcaSpec:
    """Parse ``NCCL_IB_HCA`` (``[^][=]dev[:port][,dev[:port]...]``). Raises ValueError on a bad port."""
    v = value.strip()
    spec = HcaSpec()
    if v.startswith("^"):
        spec.exclude, v = True, v[1:]
    if v.startswith("="):
        spec.exact, v = True, v[1:]
    for item in v.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, port = item.partition(":")
        if port and not port.isdigit():
            raise ValueError(f"{item!r}: port {port!r} is not a number")
        spec.items.append((name, int(port) if port else None))
    return spec


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (a snapshot's ``env``): blank lines and ``#`` comments skipped,
    ``export`` prefixes and matching outer quotes removed. Lines without ``=`` are ignored."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, sep, val = line.partition("=")
        if not sep or not key.strip():
            continue
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
            val = val[1:-1]
        out[key.strip()] = val
    return out
