"""Route, ARP-sysctl and version probe: how traffic to each peer leaves this host, and what the
kernel's ARP/reverse-path settings of the fabric netdevs are.

Facts for ``fabric.route`` (the route to each peer leaves by the netdev of the selected GID),
``fabric.arp`` (several rails on one subnet: replies must leave by the port the request came in on)
and ``fleet.versions`` (kernel, BIOS, rdma-core).

Sources, live (root ``/``):
- ``ip -j route get <peer> from <fabric-ip>`` (iproute2; the kernel's FIB lookup, policy rules
  included), one bounded subprocess per peer;
- ``/proc/sys/net/ipv4/conf/{all,<netdev>}/{arp_ignore,arp_announce,rp_filter}`` (the kernel uses
  the larger of "all" and the interface's value for each: Documentation/networking/ip-sysctl.rst);
- ``/proc/sys/kernel/osrelease``, ``/sys/class/dmi/id/bios_version``, the rdma-core version from the
  ``libibverbs.so.1.<abi>.<rdma-core>.0`` file name.

Snapshot directory (root = the snapshot): ``ip-route-get.json`` (``{peer: <ip -j route get output>}``
or a list of such outputs, each object with ``dst``), else ``ip-route.json`` (``ip -j route show``;
the lookup is done here by longest prefix then lowest metric, policy routing not seen), the same
``proc/sys/...`` and ``sys/class/dmi/...`` files under the snapshot, and ``versions.json``
(``{"kernel", "bios", "rdma_core"}``). Never raises: what cannot be read is None with a note.
"""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afddiag.reader import load_json

SYSCTLS = ("arp_ignore", "arp_announce", "rp_filter")


@dataclass
class RouteResult:
    """Where the kernel sends packets for one peer (``ip route get``)."""

    peer: str
    dev: str | None = None  # the netdev the route leaves by
    src: str | None = None  # preferred source address
    via: str | None = None  # gateway, None when on-link
    error: str | None = None  # why there is no route ("Network is unreachable", ...)
    source: str = ""  # "ip route get", "ip-route-get.json", "ip-route.json (longest prefix)"


@dataclass
class RouteFacts:
    """Routes to the peers and the ARP sysctls of the netdevs (``conf`` holds raw values per
    interface name, including ``all``; ``effective`` the max(all, netdev) the kernel applies)."""

    captured: bool = True
    fabric_ip: str | None = None
    routes: list[RouteResult] = field(default_factory=list)
    routes_captured: bool = False
    conf: dict[str, dict[str, int | None]] = field(default_factory=dict)
    effective: dict[str, dict[str, int | None]] = field(default_factory=dict)
    sysctl_captured: bool = False
    notes: list[str] = field(default_factory=list)


def _read_small(path: str, root: str) -> str:
    """One sysctl or version file, at most 4 KiB; under a snapshot ``root`` confined to it and
    regular files only (a link to /dev/zero or out of the snapshot raises OSError)."""
    from afddiag.reader import confined_reader

    if root in ("/", ""):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return os.read(fd, 4096).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    return confined_reader(root, max_bytes=4096)(path)


def _read_int(path: str, root: str = "/") -> int | None:
    from afddiag.reader import RefusedRead

    try:
        return int(_read_small(path, root))
    except (OSError, ValueError, RefusedRead):  # RefusedRead: a link out of the snapshot, a device
        return None


def _read_text(path: str, root: str = "/") -> str | None:
    from afddiag.reader import RefusedRead

    try:
        return _read_small(path, root) or None
    except (OSError, RefusedRead):
        return None


def route_from_get_json(peer: str, obj: Any, source: str) -> RouteResult:
    """One ``ip -j route get`` output (a list holding one object, or the object) → :class:`RouteResult`."""
    if isinstance(obj, list):
        obj = obj[0] if obj else None
    if not isinstance(obj, dict):
        return RouteResult(peer, error=f"no route object for {peer}", source=source)
    if obj.get("error"):
        return RouteResult(peer, error=str(obj["error"]), source=source)
    return RouteResult(peer, dev=obj.get("dev"), src=obj.get("prefsrc") or obj.get("from"),
                       via=obj.get("gateway"), error=None if obj.get("dev") else "route has no device",
                       source=source)


def lookup_table(peer: str, table: list[dict[str, Any]]) -> RouteResult:
    """Longest-prefix match of ``peer`` in ``ip -j route show [table all]`` rows (lowest metric wins a
    tie); unicast routes of the main table only (``type`` absent or "unicast", ``table`` absent or main)."""
    src = "ip-route.json (longest prefix)"
    try:
        addr = ipaddress.IPv4Address(peer)
    except ValueError:
        return RouteResult(peer, error=f"{peer!r} is not IPv4", source=src)
    best: tuple[int, int, dict[str, Any]] | None = None
    for r in table:
        if not isinstance(r, dict) or r.get("type", "unicast") != "unicast" or \
                str(r.get("table", "main")) not in ("main", "254"):
            continue  # `ip -j route show table all` also lists local, broadcast and policy tables
        dst = r.get("dst", "")
        try:
            net = ipaddress.IPv4Network("0.0.0.0/0" if dst == "default" else dst, strict=False)
        except ValueError:
            continue
        if addr not in net:
            continue
        key = (net.prefixlen, -int(r.get("metric", 0) or 0))
        if best is None or key > best[:2]:
            best = (key[0], key[1], r)
    if best is None:
        return RouteResult(peer, error="Network is unreachable (no matching route)", source=src)
    r = best[2]
    return RouteResult(peer, dev=r.get("dev"), src=r.get("prefsrc"), via=r.get("gateway"), source=src)


def _route_live(peer: str, fabric_ip: str | None, timeout_s: float) -> RouteResult:
    cmd = ["ip", "-j", "route", "get", peer] + (["from", fabric_ip] if fabric_ip else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return RouteResult(peer, error="ip (iproute2) not installed", source="ip route get")
    except subprocess.TimeoutExpired:
        return RouteResult(peer, error=f"ip route get did not answer within {timeout_s:g} s", source="ip route get")
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or [f"rc {p.returncode}"])[-1]
        return RouteResult(peer, error=msg.replace("RTNETLINK answers: ", ""), source="ip route get")
    try:
        return route_from_get_json(peer, json.loads(p.stdout), "ip route get")
    except ValueError:
        return RouteResult(peer, error=f"ip route get printed no JSON: {p.stdout[:80]!r}", source="ip route get")


def read_sysctls(root: str, netdevs: list[str]) -> tuple[dict[str, dict[str, int | None]], dict[str, dict[str, int | None]]]:
    """Raw ``conf/{all,<netdev>}/{arp_ignore,arp_announce,rp_filter}`` under ``root`` and the
    effective value per netdev (max of "all" and the netdev's; None when either is unread)."""
    base = os.path.join(root, "proc/sys/net/ipv4/conf")
    conf = {nd: {k: _read_int(os.path.join(base, nd, k), root) for k in SYSCTLS} for nd in ["all", *netdevs]}
    eff: dict[str, dict[str, int | None]] = {}
    for nd in netdevs:
        eff[nd] = {}
        for k in SYSCTLS:
            a, b = conf["all"][k], conf[nd][k]
            eff[nd][k] = None if b is None else max(b, a if a is not None else 0)
    return conf, eff


def probe_routes(root: str | None, fabric_ip: str | None, peers: list[str], netdevs: list[str],
                 timeout_s: float = 3.0) -> RouteFacts:
    """Route to every peer and the ARP sysctls of ``netdevs``.

    ``root`` None: this host (``ip route get``, ``/proc``); else a snapshot directory. ``peers``:
    dotted IPv4 addresses. ``netdevs``: the interface names whose sysctls matter (the fabric's).
    ``timeout_s`` bounds each ``ip`` call. Never raises.
    """
    facts = RouteFacts(fabric_ip=fabric_ip)
    try:
        if root is None:
            facts.routes = [_route_live(p, fabric_ip, timeout_s) for p in peers]
            facts.routes_captured = bool(peers)
        else:
            facts.routes_captured = _routes_snapshot(Path(root), peers, facts)
        sys_root = "/" if root is None else root
        if os.path.isdir(os.path.join(sys_root, "proc/sys/net/ipv4/conf")):
            facts.conf, facts.effective = read_sysctls(sys_root, netdevs)
            facts.sysctl_captured = True
        else:
            facts.notes.append("ARP sysctls not captured (no proc/sys/net/ipv4/conf)")
    except Exception as e:  # noqa: BLE001 - a probe never raises
        facts.notes.append(f"route probe failed: {e!r}")
    return facts


def _routes_snapshot(root: Path, peers: list[str], facts: RouteFacts) -> bool:
    get = root / "ip-route-get.json"
    table = root / "ip-route.json"
    if get.is_file():
        try:
            raw = load_json(get, root)
        except (OSError, ValueError) as e:
            facts.notes.append(f"ip-route-get.json unreadable: {e}")
            return False
        by_peer: dict[str, Any] = {}
        if isinstance(raw, dict):
            by_peer = raw
        elif isinstance(raw, list):
            for item in raw:
                obj = item[0] if isinstance(item, list) and item else item
                if isinstance(obj, dict) and obj.get("dst"):
                    by_peer[obj["dst"]] = obj
        for p in peers:
            facts.routes.append(route_from_get_json(p, by_peer.get(p), "ip-route-get.json") if p in by_peer else
                                RouteResult(p, error="not captured in ip-route-get.json", source="ip-route-get.json"))
        return bool(peers)
    if table.is_file():
        try:
            rows = load_json(table, root)
        except (OSError, ValueError) as e:
            facts.notes.append(f"ip-route.json unreadable: {e}")
            return False
        facts.routes = [lookup_table(p, rows if isinstance(rows, list) else []) for p in peers]
        facts.notes.append("routes looked up in ip-route.json (main table; policy rules not seen)")
        return bool(peers)
    facts.notes.append("routes not captured (no ip-route-get.json or ip-route.json in the snapshot)")
    return False


_IBV_RE = re.compile(r"libibverbs\.so\.1\.\d+\.(\d+(?:\.\d+)?)\.0$")


def read_versions(root: str | None = None, notes: list[str] | None = None) -> dict[str, str | None]:
    """``{"kernel", "bios", "rdma_core"}`` of this host (``root`` None) or of a snapshot
    (``versions.json``, else its ``proc/sys/kernel/osrelease`` and ``sys/class/dmi/id/bios_version``).
    rdma-core from the libibverbs file name (``libibverbs.so.1.14.44.0`` → "44.0"). Never raises."""
    out: dict[str, str | None] = {"kernel": None, "bios": None, "rdma_core": None}
    base = root or "/"
    if root is not None:
        try:
            raw = load_json(Path(root, "versions.json"), root)
            if isinstance(raw, dict):
                out.update({k: str(v)[:200] for k, v in raw.items() if k in out and v is not None})
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            if notes is not None:
                notes.append(f"versions.json refused: {e}")
    out["kernel"] = out["kernel"] or _read_text(os.path.join(base, "proc/sys/kernel/osrelease"), base)
    out["bios"] = out["bios"] or _read_text(os.path.join(base, "sys/class/dmi/id/bios_version"), base)
    if root is None and out["rdma_core"] is None:
        # /usr/lib*/ and one level below (multiarch, lib64): a recursive glob of /usr/lib* takes minutes
        found = glob.glob("/usr/lib*/libibverbs.so.1.*.*.0") + glob.glob("/usr/lib*/*/libibverbs.so.1.*.*.0")
        for path in sorted(found):
            m = _IBV_RE.search(os.path.basename(path))
            if m:
                out["rdma_core"] = m.group(1)
                break
    return out


def attach_host_facts(obs: Any, inputs: Any, fabric_ip: str | None, want_fabric: bool) -> None:
    """Fill ``obs.route`` (when the fabric was asked for) and ``obs.versions`` from the live host or
    the snapshot ``inputs.snapshot`` (a folder, or a capture bundle read through
    :func:`afddiag.collect.opened_snapshot`). Never raises: an unreadable bundle leaves both not captured."""
    snap = getattr(inputs, "snapshot", None)
    if not snap:
        _attach(obs, inputs, None, fabric_ip, want_fabric)
        return
    try:
        from afddiag.collect import opened_snapshot

        with opened_snapshot(str(snap)) as root:
            _attach(obs, inputs, root, fabric_ip, want_fabric)
            if obs.route is not None:
                obs.route.notes = [n.replace(root, str(snap)) for n in obs.route.notes]
    except Exception as e:  # noqa: BLE001 - SnapshotError or anything else: not captured
        obs.versions = None
        if want_fabric:
            obs.route = RouteFacts(captured=False, notes=[f"routes not read from {snap}: {e}"])


def _attach(obs: Any, inputs: Any, root: str | None, fabric_ip: str | None, want_fabric: bool) -> None:
    notes: list[str] = []
    try:
        obs.versions = read_versions(root, notes)
    except Exception:  # noqa: BLE001
        obs.versions = None
    if not want_fabric:
        return
    fab = getattr(obs, "fabric", None)
    netdevs = sorted({g.netdev for d in (fab.devices if fab else []) for p in d.ports for g in p.gids
                      if g.netdev and g.ipv4})
    obs.route = probe_routes(root, fabric_ip, list(getattr(inputs, "peers", []) or []), netdevs,
                             min(3.0, float(getattr(inputs, "probe_timeout_s", None) or 3.0)))
    obs.route.notes[:0] = notes
