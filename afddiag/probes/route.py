"""Route and ARP-sysctl probe: how traffic to each peer leaves this host, and what the
kernel's ARP/reverse-path settings of the fabric netdevs are.

Facts for ``fabric.route`` (the route to each peer leaves by the netdev of the selected GID) and
``fabric.arp`` (several rails on one subnet: replies must leave by the port the request came in on).
The versions ``fleet.versions`` compares are read by :mod:`afddiag.probes.versions`.

Sources, live (root ``/``):
- the kernel's FIB lookup for ``<peer> from <fabric-ip>`` (policy rules included): over rtnetlink
  through pyroute2 (``RTM_GETROUTE``), else ``ip -j route get`` (iproute2), one bounded call per peer;
- for a capture, the routing tables (``ip -j route show table all`` form) and the policy rules
  (``ip -j rule show`` form) through pyroute2, else iproute2;
- ``/proc/sys/net/ipv4/conf/{all,<netdev>}/{arp_ignore,arp_announce,rp_filter}`` (the kernel uses
  the larger of "all" and the interface's value for each: Documentation/networking/ip-sysctl.rst).

In a replay the same readings come from the snapshot (:data:`PROBE`'s artifacts); without a recorded
``ip route get`` the lookup is redone from the tables: the policy rules in priority order
(:func:`lookup_policy`, as the kernel's ``fib_rules_lookup``), each rule's table by longest prefix then
lowest metric; without recorded rules, the main table alone. Never raises: what cannot be read is None
with a note.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from typing import Any

from afddiag import proc
from afddiag.model.fabric import RouteFacts, RouteResult
from afddiag.probes.registry import LIVE, Artifact, Probe, Run
from afddiag.probes.sysfs import entry_names
from afddiag.reader import RefusedRead, confined_reader

SYSCTLS = ("arp_ignore", "arp_announce", "rp_filter")


def _read_small(path: str, root: str) -> str:
    """One sysctl or version file, at most 4 KiB; under a snapshot ``root`` confined to it and
    regular files only (a link to /dev/zero or out of the snapshot raises OSError)."""
    if root in ("/", ""):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            return os.read(fd, 4096).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    return confined_reader(root, max_bytes=4096)(path)


def _read_int(path: str, root: str = "/") -> int | None:
    try:
        return int(_read_small(path, root))
    except (OSError, ValueError, RefusedRead):  # RefusedRead: a link out of the snapshot, a device
        return None


RT_TABLES = {253: "default", 254: "main", 255: "local"}  # /etc/iproute2/rt_tables' reserved names
RTN_TYPES = {1: "unicast", 2: "local", 3: "broadcast", 4: "anycast", 5: "multicast", 6: "blackhole",
             7: "unreachable", 8: "prohibit", 9: "throw", 10: "nat"}  # linux/rtnetlink.h RTN_*
FR_ACTIONS = {1: "lookup", 2: "goto", 3: "nop", 6: "blackhole", 7: "unreachable", 8: "prohibit"}  # FR_ACT_*
FIB_RULE_INVERT = 0x2
_REFUSE = ("blackhole", "unreachable", "prohibit")


def table_name(v: Any) -> str:
    """A routing table id or name as ``ip -j`` prints it: 254/"254"/"main" → "main", 255 → "local",
    253 → "default", others as the number's text."""
    try:
        n = int(v)
    except (TypeError, ValueError):
        return str(v) if v not in (None, "") else "main"
    return RT_TABLES.get(n, str(n))


def _iproute():
    """pyroute2's ``IPRoute`` class, or None when pyroute2 is not installed (iproute2 is used then)."""
    try:
        from pyroute2 import IPRoute
    except Exception:  # noqa: BLE001 - ImportError, or a broken install
        return None
    return IPRoute


def _ifnames(ipr: Any) -> dict[int, str]:
    return {link["index"]: link.get("ifname") for link in ipr.get_links()}


def _prefix(addr: Any, length: int, host_len: int = 32) -> str:
    return "default" if not addr or (not length and addr in ("0.0.0.0", None)) else (
        str(addr) if length == host_len else f"{addr}/{length}")


def netlink_routes() -> list[dict[str, Any]] | None:
    """Every IPv4 route of every table over rtnetlink (pyroute2 ``RTM_GETROUTE`` dump), as
    ``ip -j route show table all`` prints them (``dst``, ``dev``, ``gateway``, ``prefsrc``,
    ``metric``, ``table``, ``type``); None without pyroute2. Raises OSError (NetlinkError) on failure."""
    import socket

    IPRoute = _iproute()
    if IPRoute is None:
        return None
    out = []
    with IPRoute() as ipr:
        names = _ifnames(ipr)
        for r in ipr.route("dump", family=socket.AF_INET):
            row = {"dst": _prefix(r.get("dst"), r["dst_len"]), "table": table_name(r.get("table") or r["table"]),
                   "type": RTN_TYPES.get(r["type"], str(r["type"]))}
            if r.get("oif") is not None:
                row["dev"] = names.get(r.get("oif"), str(r.get("oif")))
            for key, attr in (("gateway", "gateway"), ("prefsrc", "prefsrc"), ("metric", "priority")):
                if r.get(attr) is not None:
                    row[key] = r.get(attr)
            out.append(row)
    return out


def netlink_rules() -> list[dict[str, Any]] | None:
    """The IPv4 policy rules over rtnetlink (pyroute2 ``RTM_GETRULE``), as ``ip -j rule show``
    prints them (``priority``, ``src``/``srclen``, ``dst``/``dstlen``, ``iif``, ``oif``, ``fwmark``,
    ``not``, ``table`` or ``action``); None without pyroute2. Raises OSError on failure."""
    import socket

    IPRoute = _iproute()
    if IPRoute is None:
        return None
    out = []
    with IPRoute() as ipr:
        for r in ipr.get_rules(family=socket.AF_INET):
            row: dict[str, Any] = {"priority": r.get("priority") or 0,
                                   "src": r.get("src") or "all"}
            if r.get("src") and r["src_len"] != 32:
                row["srclen"] = r["src_len"]
            if r.get("dst"):
                row["dst"] = r.get("dst")
                if r["dst_len"] != 32:
                    row["dstlen"] = r["dst_len"]
            for key, attr in (("iif", "iifname"), ("oif", "oifname"), ("fwmark", "fwmark")):
                if r.get(attr):
                    row[key] = r.get(attr)
            if r["flags"] & FIB_RULE_INVERT:
                row["not"] = True
            action = FR_ACTIONS.get(r["action"], str(r["action"]))
            if action == "lookup":
                row["table"] = table_name(r.get("table") or r["table"])
            else:
                row["action"] = action
            out.append(row)
    return out


def netlink_route_get(peer: str, fabric_ip: str | None) -> Any:
    """The kernel's route to ``peer`` from ``fabric_ip`` (``RTM_GETROUTE`` with ``RTA_DST``/``RTA_SRC``,
    what ``ip route get <peer> from <fabric-ip>`` asks) as ``ip -j route get`` prints it, or
    ``{"error": why}``; None without pyroute2. Never raises."""
    IPRoute = _iproute()
    if IPRoute is None:
        return None
    try:
        with IPRoute() as ipr:
            kw = {"dst": peer} | ({"src": fabric_ip} if fabric_ip else {})
            r = ipr.route("get", **kw)[0]
            dev = _ifnames(ipr).get(r.get("oif")) if r.get("oif") is not None else None
    except Exception as e:  # noqa: BLE001 - NetlinkError(101, 'Network is unreachable') and the like
        code = getattr(e, "code", None)
        return {"error": os.strerror(code) if isinstance(code, int) and code > 0 else str(e)}
    return [{"dst": peer, "dev": dev, "gateway": r.get("gateway"), "prefsrc": r.get("prefsrc")}]


def _in(addr: ipaddress.IPv4Address, prefix: Any, length: Any) -> bool:
    if prefix in (None, "", "all", "default"):
        return True
    try:
        text = str(prefix) if "/" in str(prefix) else f"{prefix}/{int(length) if length is not None else 32}"
        return addr in ipaddress.IPv4Network(text, strict=False)
    except ValueError:
        return False


def rule_matches(rule: dict[str, Any], peer: str, src: str | None) -> bool:
    """Does a policy rule (``ip -j rule show`` form) select a locally sent packet to ``peer`` from
    ``src``? ``from``/``to`` by prefix; a rule naming an input interface other than ``lo``, an
    output interface or a fwmark selects nothing here (the engine's packets carry no mark and are not
    bound to an interface); ``not`` inverts the selectors."""
    dst = ipaddress.IPv4Address(peer)
    sel = True
    if rule.get("src") not in (None, "all"):
        sel = src is not None and _in(ipaddress.IPv4Address(src), rule.get("src"), rule.get("srclen"))
    if sel and rule.get("dst") not in (None, "all"):
        sel = _in(dst, rule.get("dst"), rule.get("dstlen"))
    if rule.get("iif") not in (None, "lo") or rule.get("oif") or rule.get("fwmark"):
        sel = False
    return (not sel) if rule.get("not") else sel


def lookup_policy(peer: str, src: str | None, rules: list[dict[str, Any]], table: list[dict[str, Any]],
                  label: str = "policy rules + route tables") -> RouteResult:
    """The route to ``peer`` from ``src`` the way the kernel finds it (``fib_rules_lookup``): rules
    by priority; the first selecting rule whose table holds a unicast route to ``peer`` (longest
    prefix, lowest metric) gives it; a blackhole/unreachable/prohibit rule or route ends the lookup
    with that error; ``nop``, ``goto`` and ``throw`` go on. ``label`` names the source."""
    try:
        ipaddress.IPv4Address(peer)
    except ValueError:
        return RouteResult(peer, error=f"{peer!r} is not IPv4", source=label)
    ordered = sorted((r for r in rules if isinstance(r, dict)), key=lambda r: int(r.get("priority") or 0))
    for r in ordered:
        if not rule_matches(r, peer, src):
            continue
        action = r.get("action") or "lookup"
        where = f"{label}: rule {r.get('priority', 0)}"
        if action in _REFUSE:
            return RouteResult(peer, error=f"policy rule {r.get('priority', 0)} says {action}", source=where)
        if action != "lookup":
            continue
        name = table_name(r.get("table"))
        rows = [x for x in table if isinstance(x, dict) and table_name(x.get("table", "main")) == name]
        hit = _longest_prefix(peer, rows, types=("unicast",) + _REFUSE)
        if hit is None:
            continue
        if hit.get("type", "unicast") in _REFUSE:
            return RouteResult(peer, error=f"{hit['type']} route in table {name}", source=f"{where} → table {name}")
        return RouteResult(peer, dev=hit.get("dev"), src=hit.get("prefsrc"), via=hit.get("gateway"),
                           source=f"{where} → table {name}")
    return RouteResult(peer, error="Network is unreachable (no policy rule's table has a route)", source=label)


def _longest_prefix(peer: str, rows: list[dict[str, Any]],
                    types: tuple[str, ...] = ("unicast",)) -> dict[str, Any] | None:
    addr = ipaddress.IPv4Address(peer)
    best: tuple[int, int, dict[str, Any]] | None = None
    for r in rows:
        if not isinstance(r, dict) or r.get("type", "unicast") not in types:
            continue
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
    return best[2] if best else None


def route_from_get_json(peer: str, obj: Any, source: str) -> RouteResult:
    """One ``ip -j route get`` output (a list holding one object, or the object) → :class:`RouteResult`."""
    if isinstance(obj, list):
        obj = obj[0] if obj else None
    if not isinstance(obj, dict):
        return RouteResult(peer, error=f"no route object for {peer}", source=source)
    if obj.get("error"):
        return RouteResult(peer, error=str(obj["error"])[:300], source=source, failed=obj.get("failed") is True)
    return RouteResult(peer, dev=obj.get("dev"), src=obj.get("prefsrc") or obj.get("from"),
                       via=obj.get("gateway"), error=None if obj.get("dev") else "route has no device",
                       source=source)


def lookup_table(peer: str, table: list[dict[str, Any]], src: str = "route table (longest prefix)") -> RouteResult:
    """Longest-prefix match of ``peer`` in ``ip -j route show [table all]`` rows (lowest metric wins a
    tie); unicast routes of the main table only (``type`` absent or "unicast", ``table`` absent or main).
    ``src`` labels the result's source."""
    try:
        ipaddress.IPv4Address(peer)
    except ValueError:
        return RouteResult(peer, error=f"{peer!r} is not IPv4", source=src)
    # `ip -j route show table all` also lists local, broadcast and policy tables: the main table only
    r = _longest_prefix(peer, [x for x in table
                               if isinstance(x, dict) and table_name(x.get("table", "main")) == "main"])
    if r is None:
        return RouteResult(peer, error="Network is unreachable (no matching route)", source=src)
    return RouteResult(peer, dev=r.get("dev"), src=r.get("prefsrc"), via=r.get("gateway"), source=src)


def route_get(peer: str, fabric_ip: str | None, timeout_s: float) -> Any:
    """The kernel's route to ``peer`` from ``fabric_ip`` in ``ip -j route get`` form (a list of one
    route object), or ``{"error": why}`` ("Network is unreachable", no iproute2, a timeout): over
    rtnetlink with pyroute2 (:func:`netlink_route_get`), else ``ip -j route get <peer> [from <ip>]``.
    Never raises."""
    got = netlink_route_get(peer, fabric_ip)
    if got is not None:
        return got
    cmd = ["ip", "-j", "route", "get", peer] + (["from", fabric_ip] if fabric_ip else [])
    try:
        p = proc.run(cmd, timeout_s)
    except FileNotFoundError:
        return {"error": "ip (iproute2) not installed", "failed": True}
    except subprocess.TimeoutExpired:
        return {"error": f"ip route get did not answer within {timeout_s:g} s", "failed": True}
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or [f"rc {p.returncode}"])[-1]
        return {"error": msg.replace("RTNETLINK answers: ", "")}
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": f"ip route get printed no JSON: {p.stdout[:80]!r}"}


def _ip_json(args: list[str], timeout_s: float) -> Any:
    """``ip -j <args>`` parsed; None without iproute2. Raises OSError when ``ip`` fails."""
    exe = shutil.which("ip")
    if not exe:
        return None
    p = proc.run([exe, "-j", *args], timeout_s)
    if p.returncode != 0:
        raise OSError(f"ip -j {' '.join(args)}: rc {p.returncode}: {p.stderr.strip()[:200]}")
    return json.loads(p.stdout or "[]")


def route_table(timeout_s: float = 5.0) -> Any:
    """Every route of every table in ``ip -j route show table all`` form: pyroute2
    (:func:`netlink_routes`), else iproute2; None with neither. Raises OSError when the read fails."""
    got = netlink_routes()
    return got if got is not None else _ip_json(["route", "show", "table", "all"], timeout_s)


def rule_table(timeout_s: float = 5.0) -> Any:
    """The IPv4 policy rules in ``ip -j rule show`` form: pyroute2 (:func:`netlink_rules`), else
    ``ip -j -4 rule show``; None with neither. Raises OSError when the read fails."""
    got = netlink_rules()
    return got if got is not None else _ip_json(["-4", "rule", "show"], timeout_s)


def routes_from_table(peers: list[str], table: Any, src: str = "route table (longest prefix)") -> list[RouteResult]:
    """:func:`lookup_table` for each peer (a table that is not a list finds no route)."""
    return [lookup_table(p, table if isinstance(table, list) else [], src) for p in peers]


SysctlsByNetdev = dict[str, dict[str, int | None]]  # netdev ("all" too) → sysctl name → value (None: unread)


def read_sysctls(root: str, netdevs: list[str]) -> tuple[SysctlsByNetdev, SysctlsByNetdev]:
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


# ---------------------------------------------------------------------------------------------
# the probe: routes to the peers, the tables and rules a replay redoes the lookup with, ARP sysctls


def _fabric_netdevs(run: Run) -> list[str]:
    fab = run.obs.fabric
    return sorted({g.netdev for d in (fab.devices if fab else []) for p in d.ports for g in p.gids
                   if g.netdev and g.ipv4})


def _read(run: Run, progress: Any) -> dict[str, Any]:
    """``ip -j route get <peer> from <fabric-ip>`` per peer (as ``{peer: output}``; a failure as
    ``{"error": why}``), the whole table when capturing (peers are not known then), the ARP sysctls'
    root. A fake ``route`` source stands for the table (no ``route get``); None reads no route."""
    ip = run.fabric_ip()
    peers = list(run.inputs.peers)
    t = min(3.0, float(run.inputs.probe_timeout_s or 3.0))
    src, rules_src = run.src.route, run.src.rules
    got = {}
    if src is LIVE:
        for p in peers:
            progress.doing = f"ip route get {p}"
            got[p] = route_get(p, ip, t)
    table = rules = None
    if src is not None and (run.capturing or src is not LIVE):
        progress.doing = "ip route show table all"
        table = route_table(t) if src is LIVE else src()
        progress.doing = "ip rule show"  # a replay redoes the lookup: rules decide which table it reads
        rules = rule_table(t) if rules_src is LIVE else (rules_src() if callable(rules_src) else None)
    return {"ip-route-get.json": got if peers and src is LIVE else None, "ip-route.json": table, "ip-rule.json": rules,
            "proc/sys/net/ipv4/conf": run.src.root, "route_source": "ip route get"}


def _routes(run: Run, r: dict[str, Any], facts: RouteFacts) -> None:
    """``facts.routes`` from the readings: ``ip route get``'s answer per peer, else a lookup in the tables."""
    peers = list(run.inputs.peers)
    got, table = r.get("ip-route-get.json"), r.get("ip-route.json")
    rules = r.get("ip-rule.json") if isinstance(r.get("ip-rule.json"), list) else None

    def from_tables(ps: list[str]) -> list:
        if rules is not None and isinstance(table, list):
            return [lookup_policy(p, run.fabric_ip(), rules, table, "ip-rule.json + ip-route.json") for p in ps]
        return routes_from_table(ps, table, "ip-route.json (longest prefix)")

    if got is not None:
        src = r.get("route_source") or "ip-route-get.json"
        by_peer: dict[str, Any] = {}
        if isinstance(got, dict):
            by_peer = got
        elif isinstance(got, list):
            for item in got:
                obj = item[0] if isinstance(item, list) and item else item
                if isinstance(obj, dict) and obj.get("dst"):
                    by_peer[obj["dst"]] = obj
        for p in peers:
            if p in by_peer:
                facts.routes.append(route_from_get_json(p, by_peer[p], src))
            elif table is not None:
                facts.routes += from_tables([p])
            else:
                facts.routes.append(route_from_get_json(p, {"error": "not captured in ip-route-get.json"}, src))
        facts.routes_captured = bool(peers)
    elif table is not None:
        facts.routes = from_tables(peers)
        facts.notes.append("routes looked up in ip-route.json through the policy rules of ip-rule.json" if rules
                           is not None else "routes looked up in ip-route.json (main table; no ip-rule.json: "
                           "policy rules not seen)")
        facts.routes_captured = bool(peers)
    elif peers and not run.live:
        facts.notes.append("routes not captured (no ip-route-get.json or ip-route.json in the snapshot)")


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    facts = RouteFacts(fabric_ip=run.fabric_ip())
    _routes(run, r, facts)
    conf_root = r.get("proc/sys/net/ipv4/conf")
    if conf_root is not None and os.path.isdir(os.path.join(conf_root, "proc/sys/net/ipv4/conf")):
        progress.doing = "reading the ARP sysctls"
        facts.conf, facts.effective = read_sysctls(conf_root, _fabric_netdevs(run))
        facts.sysctl_captured = True
    else:
        facts.notes.append("ARP sysctls not captured (no proc/sys/net/ipv4/conf)")
    facts.notes += [n for n in r.get("notes") or []]
    return {"route": facts}


def _copy(run: Run, r: dict[str, Any], files: dict[str, bytes], notes: list[str]) -> None:
    """``proc/sys/net/ipv4/conf/{all,<netdev>}/{arp_ignore,arp_announce,rp_filter}`` for every netdev."""
    root = run.sys_root
    if root is None:
        return
    conf = os.path.join(root, "proc", "sys", "net", "ipv4", "conf")
    netdevs = entry_names(os.path.join(root, "sys", "class", "net"))
    for nd in ["all"] + [n for n in netdevs if n != "all"]:
        for a in SYSCTLS:
            v = run.try_read(f"{conf}/{nd}/{a}")
            if v is not None:
                files[f"proc/sys/net/ipv4/conf/{nd}/{a}"] = (v + "\n").encode("utf-8", "replace")


def _failed(why: str) -> dict[str, Any]:
    return {"route": RouteFacts(captured=False, notes=[why], failed=why)}


PROBE = Probe("route", "route probe (ip route get, ARP sysctls)", "fabric_s",
              (Artifact("ip-route-get.json"), Artifact("ip-route.json"), Artifact("ip-rule.json"),
               Artifact("proc/sys/net/ipv4/conf", "tree")),
              _read, _facts, _failed, copy=_copy)
