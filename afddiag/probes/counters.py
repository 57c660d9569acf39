"""Port counters of one rail, read before and after the pair test's bandwidth run.

Reads ``/sys/class/infiniband/<device>/ports/<port>/hw_counters/*`` (driver counters: mlx5's
out_of_sequence, packet_seq_err, local_ack_timeout_err, np_cnp_sent, ...; rxe's sent_pkts,
retry_exceeded_err, ...), ``.../ports/<port>/counters/*`` (IBTA PortCounters: symbol_error,
link_downed, port_xmit_data, ...) and ``/sys/class/net/<netdev>/carrier_changes``, under a root path.
Read-only; bounded in time; never raises (what could not be read is a note). Command-line equivalent:
``rdma statistic show link <dev>/<port>`` and ``cat /sys/class/net/<if>/carrier_changes``.

A process in a network namespace other than the device's (a container, the lab's namespace hosts)
sees a shared-mode RDMA device through ib_core's compat device, whose sysfs port has no
``hw_counters/`` nor ``counters/``; the hw counters are then read over RDMA netlink with iproute2's
``rdma -j statistic show link <dev>/<port>`` (bounded), and the reading says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from afddiag import proc
from afddiag.collect import guarded
from afddiag.model.pair import NOT_COUNTERS, PortCounters
from afddiag.probes import sysfs

GROUPS = ("hw_counters", "counters")
MAX_FILES = 512  # per folder: a driver with more counters than this is cut (and says so)


def read_port_counters(device: str, port: int, netdev: str | None, root: str = "/",
                       reader: Callable[[str], str] | None = None, timeout_s: float = 5.0) -> dict[str, Any]:
    """One reading of a port's counters: ``{"values": {"hw_counters": {name: int}, "counters": {...},
    "netdev": {"carrier_changes": int}}, "notes": [...]}``. Files that are not integers, unreadable
    files and absent folders are notes (rxe has no ``counters/``; ``hw_counters/lifespan`` is the
    stats cache's lifetime in ms, not a counter). Bounded by ``timeout_s`` seconds (an mlx5 counter
    read is a firmware command); past it, the reading is empty with a note. Never raises."""
    read = reader or sysfs.read_text
    stat = rdma_statistic if reader is None else None  # a fake tree (tests) is never mixed with this host's netlink
    base = os.path.join(root, "sys", "class", "infiniband", device, "ports", str(port))

    def work() -> dict[str, Any]:
        values: dict[str, dict[str, int]] = {}
        notes: list[str] = []
        for group in GROUPS:
            d = os.path.join(base, group)
            try:
                names = sorted(os.listdir(d))
            except OSError as e:
                if group == "hw_counters" and stat is not None and os.path.isdir(base):
                    got, why = stat(device, port)
                    if got is not None:  # a network namespace's view of the device: no hw_counters in sysfs
                        values[group] = got
                        notes.append(f"{device} port {port} hw_counters read with `rdma statistic show link` "
                                     f"(netlink): sysfs shows none here ({e.strerror or e}; a network namespace's "
                                     "view of a shared device)")
                        continue
                    notes.append(f"{device} port {port} `rdma statistic show link`: {why}")
                notes.append(f"{device} port {port} {group}/: not read ({e.strerror or e})")
                continue
            if len(names) > MAX_FILES:
                notes.append(f"{device} port {port} {group}/: {len(names)} files, the first {MAX_FILES} read")
                names = names[:MAX_FILES]
            vals: dict[str, int] = {}
            for n in names:
                if n in NOT_COUNTERS:
                    continue
                try:
                    text = read(os.path.join(d, n))
                except OSError as e:
                    notes.append(f"{device} port {port} {group}/{n}: {e.strerror or e}")
                    continue
                try:
                    vals[n] = int(text.split()[0]) if text.split() else int(text)
                except ValueError:
                    notes.append(f"{device} port {port} {group}/{n}: {text[:40]!r} is not a counter")
            values[group] = vals
        if netdev:
            path = os.path.join(root, "sys", "class", "net", netdev, "carrier_changes")
            try:
                values["netdev"] = {"carrier_changes": int(read(path))}
            except (OSError, ValueError) as e:
                notes.append(f"{netdev} carrier_changes: not read ({getattr(e, 'strerror', None) or e})")
        return {"values": values, "notes": notes}

    got, why = guarded(work, timeout_s, f"port counters of {device} port {port}")
    return got if got is not None else {"values": {}, "notes": [why or "not read"]}


def parse_rdma_statistic(data: Any, device: str, port: int) -> dict[str, int]:
    """``rdma -j statistic show link <device>/<port>`` (iproute2) → ``{counter: int}``: the entry whose
    ``ifname``/``port`` match (or the only one); every integer field but ``ifindex``/``port``, and those
    of nested objects (newer iproute2 groups optional counters). Raises ValueError when ``data`` is not
    that shape or holds no counter. Pure."""
    rows = [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []
    row = next((r for r in rows if r.get("ifname") == device and r.get("port") == port), None)
    if row is None and len(rows) == 1:
        row = rows[0]
    if row is None:
        raise ValueError(f"no entry for {device}/{port}")
    out: dict[str, int] = {}

    def take(d: dict) -> None:
        for k, v in d.items():
            if isinstance(v, dict):
                take(v)
            elif isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and k not in ("ifindex", "port"):
                out[k] = v

    take(row)
    if not out:
        raise ValueError(f"no counter in the entry for {device}/{port}")
    return out


def rdma_statistic(device: str, port: int, timeout_s: float = 3.0) -> tuple[dict[str, int] | None, str | None]:
    """The port's hw counters over RDMA netlink (``rdma -j statistic show link <device>/<port>``, run
    bounded): ``(counters, None)`` or ``(None, why)``. Used where sysfs has no ``hw_counters/`` (a
    process in another network namespace sees the shared device without them). Never raises."""
    import json
    import shutil
    import subprocess

    exe = shutil.which("rdma")
    if not exe:
        return None, "the rdma command (iproute2) is not installed"
    try:
        p = proc.run([exe, "-j", "statistic", "show", "link", f"{device}/{port}"], timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout_s:g} s"
    except OSError as e:
        return None, str(e)
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {(p.stderr or '').strip()[:200]}"
    try:
        return parse_rdma_statistic(json.loads(p.stdout or "[]"), device, port), None
    except ValueError as e:
        return None, f"unreadable output ({e})"


def port_delta(before: dict[str, Any], after: dict[str, Any], device: str | None, port: int | None,
               netdev: str | None, side: str = "local") -> PortCounters:
    """:class:`PortCounters` from two :func:`read_port_counters` readings: ``delta`` = after − before
    for each counter read both times. A counter that went backwards (a reset, a 32-bit wrap) is a note
    and left out; one read only once is a note. ``read`` is True when both readings hold counters.
    Pure."""
    pc = PortCounters(side=side, device=device, port=port, netdev=netdev)
    b, a = before.get("values") or {}, after.get("values") or {}
    pc.notes = list(dict.fromkeys(list(before.get("notes") or []) + list(after.get("notes") or [])))
    for group in sorted(set(b) | set(a)):
        bg, ag = b.get(group) or {}, a.get(group) or {}
        out: dict[str, int] = {}
        for name in sorted(set(bg) | set(ag)):
            if name not in bg or name not in ag:
                pc.notes.append(f"{group}/{name}: read {'after' if name in ag else 'before'} the run only")
                continue
            d = ag[name] - bg[name]
            if d < 0:
                pc.notes.append(f"{group}/{name}: went back from {bg[name]} to {ag[name]} (reset or wrap); not judged")
                continue
            out[name] = d
        pc.delta[group] = out
    pc.read = any(pc.delta.values())
    return pc
