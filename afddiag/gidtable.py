"""The GID table RDMA people read first (``show_gids``), from fabric facts: one row per populated
GID slot, in the engine's enumeration order, marking the device the engine opens and the GID that
carries the fabric IP.

Columns as ``show_gids`` prints them: DEV PORT INDEX GID IPv4 VER NETDEV, then MARK
(``engine``: the device the engine opens; ``fabric-ip``: the GID the launcher's fabric IP is on).
Rendered as aligned text (full width, one line per GID, as show_gids: grep and awk read it) or CSV.
On a terminal narrower than that table (a 39-character GID makes it 100 columns and more) each GID
takes two lines: DEV PORT INDEX VER NETDEV MARK, then the GID and its IPv4 indented under it (whole,
so they copy); ``--format csv`` or a pipe keep the one-line form.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from afddiag.model import ROCE_V1, ROCE_V2
from afddiag.model.fabric import FabricFacts
from afddiag.termsafe import csv_cell, line
from afddiag.textlayout import wrap

HEADER = ("DEV", "PORT", "INDEX", "GID", "IPv4", "VER", "NETDEV", "MARK")
_VER = {ROCE_V2: "v2", ROCE_V1: "v1"}


@dataclass
class GidRow:
    """One populated GID slot (``/sys/class/infiniband/<dev>/ports/<port>/gids/<index>``)."""

    device: str
    port: int
    index: int
    gid: str
    ipv4: str | None
    ver: str  # "v2" (RoCE v2), "v1" (IB/RoCE v1), "" when the type was not read
    netdev: str | None
    port_state: str | None
    engine: bool  # the device the engine opens
    fabric_ip: bool  # this GID carries the fabric IP (IPv4-mapped, netdev holds it)

    @property
    def mark(self) -> str:
        return ",".join(m for m, on in (("engine", self.engine), ("fabric-ip", self.fabric_ip)) if on)

    def cells(self) -> tuple[str, ...]:
        """The row's columns as shown (names read from sysfs escaped: :func:`afddiag.termsafe.line`)."""
        return tuple(line(c) for c in (self.device, str(self.port), str(self.index), self.gid, self.ipv4 or "",
                                       self.ver, self.netdev or "", self.mark))


def gid_rows(fabric: FabricFacts | None, engine_device: str | None, fabric_ip: str | None) -> list[GidRow]:
    """Every populated GID slot of every port, devices in enumeration order (``fabric.devices``,
    lowest kernel device index first, as libibverbs lists them), ports and GID indexes ascending.
    ``engine_device`` marks that device's rows; ``fabric_ip`` marks the GIDs that carry it (the
    IPv4-mapped GID whose netdev holds the address, any type)."""
    out: list[GidRow] = []
    if fabric is None:
        return out
    for dev in fabric.devices:
        for port in sorted(dev.ports, key=lambda p: p.num):
            for g in sorted(port.gids, key=lambda g: g.index):
                nd = fabric.netdevs.get(g.netdev or "")
                holds = bool(nd and g.ipv4 and nd.holds_ipv4(g.ipv4)) or fabric.addresses_source == "none"
                out.append(GidRow(dev.name, port.num, g.index, g.gid, g.ipv4, _VER.get(g.type or "", g.type or ""),
                                  g.netdev, port.state, dev.name == engine_device,
                                  bool(fabric_ip and g.ipv4 == fabric_ip and holds)))
    return out


def legend(rows: list[GidRow], engine_device: str | None, engine_how: str, fabric_ip: str | None) -> list[str]:
    """The lines under the table: ``n_gids_found=N`` (as show_gids ends), which device the engine
    opens and why, and where the fabric IP is."""
    lines = [f"n_gids_found={len(rows)}"]
    if engine_device:
        lines.append(f"engine opens: {engine_device} ({engine_how})")
    if fabric_ip:
        on = [f"{r.device} port {r.port} GID {r.index} ({r.ver or 'type unknown'}, {r.netdev})"
              for r in rows if r.fabric_ip]
        lines.append(f"fabric IP {fabric_ip}: " + ("; ".join(on) if on else "no GID carries it"))
    return lines


NARROW_HEADER = (("DEV", "PORT", "INDEX", "VER", "NETDEV", "MARK"), ("GID", "IPv4"))


def write_gid_table(rows: list[GidRow], foot: list[str], fmt: str = "table", out: TextIO | None = None,
                    width: int | None = None) -> None:
    """Write ``rows`` as ``fmt``: ``csv`` (header ``dev,port,index,gid,ipv4,ver,netdev,engine,fabric_ip``,
    engine/fabric_ip 1 or 0), or ``table``: aligned columns like show_gids, one line per GID, then
    ``foot``. ``width`` (a terminal's columns; None: a pipe, no limit): when a line would be wider,
    the narrow layout (:data:`NARROW_HEADER`: two lines per GID) and ``foot`` wrapped between words,
    so nothing is cut and no GID is split."""
    import sys

    out = out or sys.stdout
    foot = [line(f) for f in foot]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["dev", "port", "index", "gid", "ipv4", "ver", "netdev", "engine", "fabric_ip"])
        for r in rows:  # names from sysfs: escaped, and never a spreadsheet formula
            w.writerow([csv_cell(r.device), r.port, r.index, csv_cell(r.gid), csv_cell(r.ipv4 or ""), csv_cell(r.ver),
                        csv_cell(r.netdev or ""), int(r.engine), int(r.fabric_ip)])
        out.write(buf.getvalue())
        return
    cells = [HEADER] + [r.cells() for r in rows]
    lines = _aligned(cells)
    if width is None or max(len(ln) for ln in lines) <= width:
        out.write("".join(ln + "\n" for ln in lines))
        for ft in foot:
            out.write(ft + "\n")
        return

    top = _aligned([NARROW_HEADER[0]] + [tuple(line(c) for c in (r.device, str(r.port), str(r.index), r.ver,
                                                                  r.netdev or "", r.mark)) for r in rows])
    under = _aligned([NARROW_HEADER[1]] + [(line(r.gid), line(r.ipv4 or "")) for r in rows])
    for a, b in zip(top, under, strict=True):
        out.write(f"{a}\n    {b}\n")
    for ft in foot:
        out.write("".join(ln + "\n" for ln in wrap(ft, width, "", "    ")))


def _aligned(cells: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    return ["  ".join(v.ljust(widths[i]) for i, v in enumerate(c)).rstrip() for c in cells]
