"""The fleet inventory: the TOML file ``afddiag fleet`` reads (which hosts, how to reach them, what
to run there, what the fleet gates expect), checked key by key, and what each host is given
(:func:`remote_args`, :func:`peers_for`).

Inventory (TOML)::

    [fleet]                       # all optional
    user = "root"                 # SSH user when a target names none
    known_hosts = "~/.ssh/known_hosts"   # host keys are always verified (default: ~/.ssh/known_hosts)
    identity = "~/.ssh/id_ed25519"       # client key (default: ssh-agent and ~/.ssh/id_*)
    concurrency = 16              # hosts collected at once
    timeout_s = 120               # per host, connect to last byte
    connect_timeout_s = 10
    max_output_mib = 32           # a host printing more is an ERROR row ("output over 32 MiB")
    afddiag = "afddiag"           # the remote command (per host too)
    python = "python3"            # the remote interpreter for --push
    peers = "coordinator"         # --peer given to each host: "coordinator" (ranks get the
                                  # coordinators' fabric IPs, coordinators every rank's), "all", "none"

    [expect]                      # fleet-wide expectations for the fleet gates
    capacity = 256                # every rank's capacity flag and the coordinator's batch flag
    gid_index = 3                 # a stack forces this GID index everywhere
    mtu = 4096                    # RoCE path MTU, bytes

    [[host]]                      # a node set (ClusterShell's NodeSet) is several hosts, same settings;
    name = "spark[01-16]"         # no fabric_ip or rails (each host's own: give it its own [[host]],
    role = "expert"               # or leave the fabric IP to its launch env's AFD_FABRIC_IP)
    ssh = "root@%h.mgmt"          # optional; %h is each host's name: spark01 at spark01.mgmt

    [[host]]
    name = "spark-a"
    role = "expert"               # --role on that host
    ssh = "root@10.0.0.11:22"     # SSH target (default: name)
    fabric_ip = "192.168.100.10"  # --fabric-ip
    launch_env = "/etc/afd/expert.env"   # --launch-env, a path on that host
    args = ["--load"]             # extra arguments for `afddiag all`
    rails = [                     # the host's RoCE ports, for `fleet --rails` (the rail plan)
      { name = "rocep1s0f0", ip = "192.168.100.10/24", device = "rocep1s0f0" },
    ]

    [fleet] wiring = "switch" (rails on one subnet reach each other) or "links" (only the
    [[link]] cables: a = "spark-a:rocep1s0f1", b = "spark-b:rocep1s0f0"); rail_pairs =
    "coordinator" (default) or "all" (:mod:`afddiag.fleet.rails`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from afddiag.reader import InputError, read_text
from afddiag.textnum import digits

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PEER_POLICIES = ("coordinator", "all", "none")
MAX_NODES = 65536  # hosts one node set may name
RAIL_PAIR_POLICIES = ("coordinator", "all")
WIRINGS = ("switch", "links")
_NAME_RE = __import__("re").compile(r"^[A-Za-z0-9_.:@\[\]\-]{1,253}$")
_NODES_RE = __import__("re").compile(r"^[A-Za-z0-9_.:@\[\]\-,]{1,4096}$")  # a name or a node set


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _spec(kind: str, lo: float = 0, hi: float = 0,
          choices: tuple[object, ...] = ()) -> tuple[Callable[[Any], bool], str]:
    """One key's type: (check(value) -> bool, what is allowed in words); ``lo``..``hi`` bound an "int" or a
    "number", ``choices`` lists a "choice"'s values."""
    if kind == "str":
        return (lambda v: isinstance(v, str) and v != "" and "\0" not in v and len(v) <= 4096), "a non-empty string"
    if kind == "name":
        return (lambda v: isinstance(v, str) and bool(_NAME_RE.match(v))), \
            "a host name (letters, digits, . _ - : @ [ ], at most 253)"
    if kind == "nodes":
        return (lambda v: isinstance(v, str) and bool(_NODES_RE.match(v))), \
            "a host name or a node set (letters, digits, . _ - : @ [ ] ,)"
    if kind == "choice":
        return (lambda v: v in choices), "one of " + ", ".join(map(str, choices))
    if kind == "ipv4":
        def ok(v: Any) -> bool:
            try:
                ipaddress.IPv4Address(v)
                return isinstance(v, str)
            except ValueError:
                return False
        return ok, "an IPv4 address in dotted form (e.g. \"192.168.100.10\")"
    if kind == "ipv4if":
        def ok_if(v: Any) -> bool:
            try:
                return isinstance(v, str) and "/" in v and ipaddress.IPv4Interface(v).network.prefixlen < 32
            except ValueError:
                return False
        return ok_if, "an IPv4 interface address with its prefix length (e.g. \"192.168.100.10/24\")"
    if kind == "args":
        return (lambda v: isinstance(v, list) and all(isinstance(a, str) and "\0" not in a for a in v)), \
            "a list of strings"
    if kind == "int":
        return (lambda v: _is_int(v) and lo <= v <= hi), f"an integer {lo}..{hi}"
    return (lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and lo <= v <= hi),
            f"a number {lo:g}..{hi:g}")  # "number"


_FLEET_SPEC = {"user": _spec("str"), "known_hosts": _spec("str"), "identity": _spec("str"),
               "concurrency": _spec("int", 1, 1024), "timeout_s": _spec("number", 1, 3600),
               "connect_timeout_s": _spec("number", 0.5, 600), "afddiag": _spec("str"), "python": _spec("str"),
               "peers": _spec("choice", choices=PEER_POLICIES), "max_output_mib": _spec("int", 1, 4096),
               "wiring": _spec("choice", choices=WIRINGS), "rail_pairs": _spec("choice", choices=RAIL_PAIR_POLICIES)}
_EXPECT_SPEC = {"capacity": _spec("int", 1, 1 << 20), "gid_index": _spec("int", 0, 65535),
                "mtu": _spec("choice", choices=(256, 512, 1024, 2048, 4096))}
_HOST_SPEC = {"name": _spec("nodes"), "role": _spec("name"), "ssh": _spec("str"), "fabric_ip": _spec("ipv4"),
              "launch_env": _spec("str"), "args": _spec("args"), "afddiag": _spec("str"), "python": _spec("str"),
              "rails": (lambda v: isinstance(v, list), "a list of { name, ip, device } tables")}
_RAIL_SPEC = {"name": _spec("name"), "ip": _spec("ipv4if"), "device": _spec("name")}
_LINK_SPEC = {"a": _spec("str"), "b": _spec("str")}
_FLEET_KEYS, _EXPECT_KEYS, _HOST_KEYS = set(_FLEET_SPEC), set(_EXPECT_SPEC), set(_HOST_SPEC)


def _check_table(where: str, table: Any, spec: dict[str, Any], label: str) -> dict[str, Any]:
    """``table`` checked against ``spec`` (key → (check, allowed)); raises InventoryError naming
    ``where``, the key, the value and what is allowed."""
    if not isinstance(table, dict):
        raise InventoryError(f"{where}: {label} must be a table, not {type(table).__name__} {table!r:.40}")
    bad = set(table) - set(spec)
    if bad:
        raise InventoryError(f"{where}: {label} unknown key(s) {', '.join(sorted(map(str, bad)))} "
                             f"(known: {', '.join(sorted(spec))})")
    for k, v in table.items():
        check, allowed = spec[k]
        if not check(v):
            raise InventoryError(f"{where}: {label} {k} must be {allowed}, not {v!r:.60}")
    return table


class InventoryError(ValueError):
    """An inventory that cannot be used (the message names the file, the entry and the fix)."""


@dataclass
class InvHost:
    """One ``[[host]]`` of the inventory."""

    name: str
    ssh: str
    role: str | None = None
    fabric_ip: str | None = None
    launch_env: str | None = None
    args: list[str] = field(default_factory=list)
    afddiag: str | None = None
    python: str | None = None
    rails: list[dict[str, str]] = field(default_factory=list)


@dataclass
class Inventory:
    """The parsed inventory: hosts in file order, the ``[fleet]`` settings, the ``[expect]`` table."""

    hosts: list[InvHost]
    settings: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, Any] = field(default_factory=dict)
    path: str = ""
    links: list[tuple[tuple[str, str], tuple[str, str]]] = field(default_factory=list)


def load_inventory(path: str) -> Inventory:
    """Parse the inventory TOML at ``path``.

    Raises :class:`InventoryError` (naming the file and the entry) for an unreadable file, TOML
    errors, unknown keys, a host without a name, duplicate names, or a fabric IP that is not IPv4.
    """
    try:
        data = tomllib.loads(read_text(path))
    except FileNotFoundError as e:
        raise InventoryError(f"inventory {path}: {e.strerror}: give the fleet's inventory file") from e
    except InputError as e:
        raise InventoryError(f"inventory {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise InventoryError(f"inventory {path}: not TOML ({e})") from e
    extra = set(data) - {"fleet", "expect", "host", "link"}
    if extra:
        raise InventoryError(f"inventory {path}: unknown table(s) {', '.join(sorted(extra))} "
                             "(known: fleet, expect, host, link)")
    settings = _check_table(f"inventory {path}", data.get("fleet", {}), _FLEET_SPEC, "[fleet]")
    expect = _check_table(f"inventory {path}", data.get("expect", {}), _EXPECT_SPEC, "[expect]")
    raw_hosts = data.get("host", [])
    if not isinstance(raw_hosts, list):
        raise InventoryError(f"inventory {path}: host = {raw_hosts!r:.40}: write each host as a [[host]] table")
    hosts: list[InvHost] = []
    seen: set[str] = set()
    for i, h in enumerate(raw_hosts):
        where = f"inventory {path}: host #{i + 1}"
        if not isinstance(h, dict) or "name" not in h:
            raise InventoryError(f"{where}: every [[host]] needs a name")
        _check_table(where, h, _HOST_SPEC, "[[host]]")
        for name in node_set(where, h):
            if name in seen:
                raise InventoryError(f"{where}: name {name!r} used twice")
            seen.add(name)
            ssh = h["ssh"].replace("%h", name) if h.get("ssh") else name
            hosts.append(InvHost(name=name, ssh=ssh, role=h.get("role"), fabric_ip=h.get("fabric_ip"),
                                 launch_env=h.get("launch_env"), args=list(h.get("args") or []),
                                 afddiag=h.get("afddiag"), python=h.get("python"),
                                 rails=_rails(where, h.get("rails"))))
    if not hosts:
        raise InventoryError(f"inventory {path}: no [[host]] entries")
    links = _links(f"inventory {path}", data.get("link", []), hosts)
    return Inventory(hosts=hosts, settings=dict(settings), expect=dict(expect), path=path, links=links)


def expand_nodes(nodes: str, where: str) -> list[str]:
    """A ClusterShell node set (``spark[01-16]``, ``coord,spark[1-4]``; no ``@group``) → its names, in
    order; InventoryError naming ``where`` for one that does not parse or holds over MAX_NODES."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

    try:
        ns = NodeSet(nodes, resolver=RESOLVER_NOGROUP)
        if len(ns) > MAX_NODES:
            raise InventoryError(f"{where}: node set {nodes!r:.80} holds {len(ns)} hosts (at most {MAX_NODES})")
        return list(ns)
    except NodeSetException as e:
        raise InventoryError(f"{where}: {nodes!r:.80} is not a node set ({e})") from None


def node_set(where: str, h: dict[str, Any]) -> list[str]:
    """The names a ``[[host]]`` stands for: its ``name``, or every node of a node set (``spark[01-16]``).
    A set of several hosts shares every setting, so it takes no ``fabric_ip`` or ``rails`` (each host's
    own: give it its own [[host]]); its ``ssh``, if given, names each host by ``%h``."""
    name = h["name"]
    names = expand_nodes(name, f"{where}: name") if "[" in name or "," in name else [name]
    bad = [n for n in names if not _NAME_RE.match(n)]
    if bad:
        raise InventoryError(f"{where}: [[host]] name {bad[0]!r:.60} is not a host name (letters, digits, "
                             ". _ - : @ [ ], at most 253)")
    if len(names) > 1:
        for key in ("fabric_ip", "rails"):
            if key in h:
                raise InventoryError(f"{where}: {name!r} is a node set of {len(names)} hosts: {key} is each host's "
                                     "own, so give those hosts their own [[host]] (or leave the fabric IP to the "
                                     "launch env's AFD_FABRIC_IP)")
        if "ssh" in h and "%h" not in h["ssh"]:
            raise InventoryError(f"{where}: {name!r} is a node set: its ssh target names each host by %h "
                                 "(ssh = \"root@%h.mgmt:22\"), or leave ssh out")
    return names


def select_hosts(inv: Inventory, nodes: str) -> Inventory:
    """``inv`` narrowed to the hosts of node set ``nodes`` (``--nodes``): peers and fleet gates then see only
    them. InventoryError for a name the inventory does not hold."""
    wanted = expand_nodes(nodes, "--nodes")
    known = {h.name for h in inv.hosts}
    missing = [n for n in wanted if n not in known]
    if missing:
        raise InventoryError(f"--nodes: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} not in the "
                             f"inventory {inv.path}")
    keep = set(wanted)
    return dataclasses.replace(inv, hosts=[h for h in inv.hosts if h.name in keep])


def _rails(where: str, raw: Any) -> list[dict[str, str]]:
    """A host's ``rails`` checked: each a table with a name (unique on the host) and an interface
    address with its prefix length; the RDMA device optional."""
    out: list[dict[str, str]] = []
    for i, r in enumerate(raw or []):
        w = f"{where}: rails #{i + 1}"
        if not isinstance(r, dict) or "name" not in r or "ip" not in r:
            raise InventoryError(f"{w}: every rail needs a name and an ip (\"192.168.100.10/24\")")
        _check_table(w, r, _RAIL_SPEC, "rail")
        if any(o["name"] == r["name"] for o in out):
            raise InventoryError(f"{w}: rail name {r['name']!r} used twice on this host")
        out.append(dict(r))
    return out


def _links(where: str, raw: Any, hosts: list[InvHost]) -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """The ``[[link]]`` cables, each end ``host:rail`` naming a declared rail; a rail takes one cable."""
    if not isinstance(raw, list):
        raise InventoryError(f"{where}: link = {raw!r:.40}: write each cable as a [[link]] table (a, b)")
    rails = {(h.name, r["name"]) for h in hosts for r in h.rails}
    out, used = [], set()
    for i, lk in enumerate(raw):
        w = f"{where}: link #{i + 1}"
        if not isinstance(lk, dict) or set(lk) != {"a", "b"}:
            raise InventoryError(f"{w}: a [[link]] has exactly a and b (\"host:rail\" each)")
        _check_table(w, lk, _LINK_SPEC, "[[link]]")
        ends = []
        for k in ("a", "b"):
            host, _, rail = lk[k].rpartition(":")
            if (host, rail) not in rails:
                raise InventoryError(f"{w}: {k} = {lk[k]!r:.60} names no declared rail (write host:rail, the rail "
                                     "in that host's rails list)")
            if (host, rail) in used:
                raise InventoryError(f"{w}: {lk[k]!r:.60} already has a cable: a port takes one")
            used.add((host, rail))
            ends.append((host, rail))
        if ends[0][0] == ends[1][0]:
            raise InventoryError(f"{w}: both ends on {ends[0][0]!r:.60}: a link joins two hosts")
        out.append((ends[0], ends[1]))
    return out


def parse_target(target: str, default_user: str | None = None) -> tuple[str | None, str, int]:
    """``[user@]host[:port]`` (``[v6]:port`` for IPv6) → ``(user, host, port)``; port 22 by default."""
    at_user, _, rest = target.rpartition("@")
    user = at_user or default_user
    port = 22
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":") and digits(tail[1:]):
            port = int(tail[1:])
    elif rest.count(":") == 1:
        host, _, p = rest.partition(":")
        if digits(p):
            port = int(p)
        else:
            host = rest
    else:
        host = rest
    return user, host, port


def peers_for(h: InvHost, inv: Inventory) -> list[str]:
    """The ``--peer`` addresses ``h`` is given under the inventory's ``peers`` policy."""
    policy = inv.settings.get("peers", "coordinator")
    others = [(o.role, o.fabric_ip) for o in inv.hosts if o is not h and o.fabric_ip and o.fabric_ip != h.fabric_ip]
    if policy == "none":
        return []
    if policy == "all":
        return [ip for _, ip in others]
    if h.role == "coordinator":
        return [ip for role, ip in others if role != "coordinator"]
    return [ip for role, ip in others if role == "coordinator"]


def remote_args(h: InvHost, inv: Inventory) -> list[str]:
    """The arguments of ``afddiag all --json`` on ``h`` (role, launch env, fabric IP, peers, args)."""
    args = ["all", "--json"]
    if h.role:
        args += ["--role", h.role]
    if h.launch_env:
        args += ["--launch-env", h.launch_env]
    if h.fabric_ip:
        args += ["--fabric-ip", h.fabric_ip]
    for p in peers_for(h, inv):
        args += ["--peer", p]
    return args + list(h.args)
