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

In a replay the same readings come from the snapshot (:mod:`afddiag.probes.registry` knows its
layout); a table lookup there is done by longest prefix then lowest metric (policy routing not
seen). Never raises: what cannot be read is None with a note.
"""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import re
import shutil
import subprocess
from typing import Any

from afddiag.model.fabric import RouteFacts, RouteResult

SYSCTLS = ("arp_ignore", "arp_announce", "rp_filter")


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


def lookup_table(peer: str, table: list[dict[str, Any]], src: str = "route table (longest prefix)") -> RouteResult:
    """Longest-prefix match of ``peer`` in ``ip -j route show [table all]`` rows (lowest metric wins a
    tie); unicast routes of the main table only (``type`` absent or "unicast", ``table`` absent or main).
    ``src`` labels the result's source."""
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


def route_get(peer: str, fabric_ip: str | None, timeout_s: float) -> Any:
    """``ip -j route get <peer> [from <fabric-ip>]`` output (a list of one route object), or
    ``{"error": why}`` (no iproute2, a timeout, "Network is unreachable"). Never raises."""
    cmd = ["ip", "-j", "route", "get", peer] + (["from", fabric_ip] if fabric_ip else [])
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return {"error": "ip (iproute2) not installed"}
    except subprocess.TimeoutExpired:
        return {"error": f"ip route get did not answer within {timeout_s:g} s"}
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or [f"rc {p.returncode}"])[-1]
        return {"error": msg.replace("RTNETLINK answers: ", "")}
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": f"ip route get printed no JSON: {p.stdout[:80]!r}"}


def route_table(timeout_s: float = 5.0) -> Any:
    """``ip -j route show table all`` (a list of route objects); None without iproute2. Raises
    OSError when ``ip`` fails."""
    exe = shutil.which("ip")
    if not exe:
        return None
    p = subprocess.run([exe, "-j", "route", "show", "table", "all"], capture_output=True, text=True,
                       timeout=timeout_s)
    if p.returncode != 0:
        raise OSError(f"ip -j route show table all: rc {p.returncode}: {p.stderr.strip()[:200]}")
    return json.loads(p.stdout or "[]")


def routes_from_table(peers: list[str], table: Any, src: str = "route table (longest prefix)") -> list[RouteResult]:
    """:func:`lookup_table` for each peer (a table that is not a list finds no route)."""
    return [lookup_table(p, table if isinstance(table, list) else [], src) for p in peers]


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
    """This host's route to every peer (``ip route get``) and the ARP sysctls of ``netdevs`` under
    ``root`` (None: ``/``). ``peers``: dotted IPv4 addresses. ``timeout_s`` bounds each ``ip`` call.
    Never raises. (A run reads routes through the registry's route probe, which also replays them.)"""
    facts = RouteFacts(fabric_ip=fabric_ip)
    try:
        if root is None:
            facts.routes = [route_from_get_json(p, route_get(p, fabric_ip, timeout_s), "ip route get") for p in peers]
            facts.routes_captured = bool(peers)
        sys_root = "/" if root is None else root
        if os.path.isdir(os.path.join(sys_root, "proc/sys/net/ipv4/conf")):
            facts.conf, facts.effective = read_sysctls(sys_root, netdevs)
            facts.sysctl_captured = True
        else:
            facts.notes.append("ARP sysctls not captured (no proc/sys/net/ipv4/conf)")
    except Exception as e:  # noqa: BLE001 - a probe never raises
        facts.notes.append(f"route probe failed: {e!r}")
    return facts


_IBV_RE = re.compile(r"libibverbs\.so\.1\.\d+\.(\d+(?:\.\d+)?)\.0$")


def rdma_core_version(timeout_s: float = 5.0) -> dict[str, str | None]:
    """rdma-core's version → ``{"version", "source"}``: the libibverbs file name
    (``libibverbs.so.1.14.44.0`` → "44.0", as ``fleet.versions`` compares it), else ``dpkg-query``
    (rdma-core, libibverbs1), else pyverbs' package metadata; ``{}`` when none answers. Never raises."""
    # /usr/lib*/ and one level below (multiarch, lib64): a recursive glob of /usr/lib* takes minutes
    found = glob.glob("/usr/lib*/libibverbs.so.1.*.*.0") + glob.glob("/usr/lib*/*/libibverbs.so.1.*.*.0")
    for path in sorted(found):
        m = _IBV_RE.search(os.path.basename(path))
        if m:
            return {"version": m.group(1), "source": "libibverbs file name"}
    exe = shutil.which("dpkg-query")
    if exe:
        for pkg in ("rdma-core", "libibverbs1"):
            try:
                p = subprocess.run([exe, "-W", "-f=${Version}", pkg], capture_output=True, text=True,
                                   timeout=timeout_s)
            except (OSError, subprocess.SubprocessError):
                break
            if p.returncode == 0 and p.stdout.strip():
                return {"version": p.stdout.strip(), "source": f"dpkg {pkg}"}
    try:
        from importlib.metadata import version

        return {"version": version("pyverbs"), "source": "pyverbs"}
    except Exception:  # noqa: BLE001 - absent is fine
        return {}
