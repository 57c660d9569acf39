"""The probe registry: every probe afddiag runs, and the one place that knows the snapshot layout.

One explicit, ordered list (:data:`PROBES`). Each entry says

- what it reads live (``read``: bounded by the runner, a timeout or crash becomes ``failed``),
- the artifacts it writes into a capture bundle (``artifacts``: a JSON file, a text file, or a
  sysfs/procfs tree copied by ``copy``),
- how its readings become facts (``facts``: the same function for a live run and a replay).

Readings are a dict keyed by artifact name holding what the file holds (parsed JSON, text; for a
tree the folder it is read under: ``/`` live, the snapshot folder in a replay), plus any extra keys
the probe wants to pass from ``read`` to ``facts`` (a source label, notes). The runner
(:mod:`afddiag.runner`) makes one loop of them:

- a live run: ``facts(run, read(run))`` for each wanted probe, each under its time bound;
- a capture: ``read(run)`` then the artifacts into the bundle (``copy`` for trees);
- a replay: the artifacts loaded from the snapshot folder (absent: None), then ``facts``.

No other module names a snapshot file: what a capture writes and a replay reads is here.

How to add a probe
------------------
1. Write the reading function in ``afddiag/probes/<name>.py``: bounded in time where it can block,
   recording why it could not read instead of raising; take its host sources as arguments
   (a root path, a reader) so a test can point it at a fake tree.
2. Put its facts in the model (``afddiag/model/fabric.py``, ``gpu.py`` or ``host.py``, units in
   field names, ``failed``/``notes`` fields) and a field on :class:`afddiag.model.run.Observation`.
3. Add one :class:`Probe` to :data:`PROBES` here: ``name``, ``what`` (words for a timeout
   message), ``families`` (the gate families it feeds; empty = every run), ``timeout`` (an
   :meth:`Inputs.timeout` key or a function of the run), ``artifacts`` (file names in a bundle),
   ``read(run, progress) -> readings`` (call the live source through ``run.host`` so tests can fake
   it; set ``progress.doing`` before a call that may block), ``facts(run, readings, progress) ->
   {observation field: value}`` (readings of a replay may be None: say "not captured"; a ``notes``
   list is appended to the run's notes, not set), and
   ``failed(why) -> {field: facts with failed=why}``.
4. Tests: readings → facts (table-driven), a snapshot folder holding the artifact, a capture round
   trip (``tests/test_capture.py``), and the gates the facts feed.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afddiag.model import to_jsonable
from afddiag.model.gpu import GpuFacts
from afddiag.model.host import HostLimits, ImageFacts
from afddiag.model.run import wants_load
from afddiag.textnum import digits

# ---------------------------------------------------------------------------------------------
# Where live readings come from (a test replaces any of them)


class _Live:
    """Marker: read this host (the default of every :class:`Sources` field)."""

    def __repr__(self) -> str:
        return "LIVE"


LIVE: Any = _Live()


@dataclass
class Sources:
    """Where a live run or a capture reads from. ``LIVE`` reads this host; ``None`` reads nothing
    (that part is not captured); a function replaces the source (tests, fakes).

    ``root``: the filesystem root sysfs and procfs are read under (``<root>/sys/class/...``).
    ``device_order() -> (list[(name, index)] | None, source, notes)``; ``addresses() -> {netdev: Netdev}``
    (raises on failure); ``gpu() -> GPU readings dict``; ``limits() -> limits dict``; ``cpu() -> dict``;
    ``route() -> ip -j route JSON`` (raises on failure); ``rules() -> ip -j rule JSON`` (None: read live
    with the routes when ``route`` is LIVE, else not captured); ``memreg() -> memreg.json readings``;
    ``rdma_core() -> {"version", "source"}``; ``pair() -> the pair test's JSON`` (None: no pair test ran; a
    live run has none unless ``afddiag fabric --pair/--serve`` hands its result in);
    ``environ``: the process environment (filtered by :func:`env_allowed`); ``hostname()``;
    ``reader(path) -> str`` reads one sysfs file (raises OSError as the kernel answers).
    """

    root: str = "/"
    device_order: Any = LIVE
    addresses: Any = LIVE
    gpu: Any = LIVE
    memreg: Any = LIVE
    pcie: Any = LIVE  # LIVE: read the PCIe links under ``root``; None: not captured
    limits: Any = LIVE
    cpu: Any = LIVE
    route: Any = LIVE
    rules: Any = None
    rdma_core: Any = LIVE
    pair: Any = None  # () -> the pair test's JSON (`fabric --pair/--serve` hands its result in); None: not run
    environ: Mapping[str, str] | None = None
    hostname: Callable[[], str] | None = None  # None: uname(2) nodename, as socket.gethostname()
    reader: Callable[[str], str] | None = None


@dataclass
class Run:
    """One pass over the registry: what was asked, where to read, what was seen so far.

    ``host`` is set for a live run or a capture, ``root`` (the snapshot folder) for a replay.
    ``obs`` fills as probes finish (a later probe may use an earlier one's facts: the route probe
    reads the fabric's netdevs); ``readings`` keeps every probe's readings by probe name.
    """

    inputs: Any  # afddiag.model.run.Inputs
    obs: Any  # afddiag.model.run.Observation
    host: Sources | None = None
    root: Path | None = None
    capturing: bool = False
    readings: dict[str, dict[str, Any]] = field(default_factory=dict)
    confined: Callable[[str], str] | None = None  # the snapshot's sysfs reader, made on first use

    @property
    def live(self) -> bool:
        return self.root is None

    def fabric_ip(self) -> str | None:
        """The fabric IP as resolved now (:func:`afddiag.endpoint.resolve_fabric_ip`)."""
        from afddiag.endpoint import resolve_fabric_ip

        return resolve_fabric_ip(self.obs.fabric, self.inputs.fabric_ip).ip

    def launch_value(self, key: str) -> str | None:
        return (self.inputs.launch_env or {}).get(key)


@dataclass(frozen=True)
class Artifact:
    """One entry of a capture bundle / snapshot folder: ``kind`` "json", "text" or "tree"."""

    name: str
    kind: str = "json"
    max_bytes: int | None = None  # a text file's cap (default: afddiag.reader.MAX_TEXT_BYTES)


def _always(run: Run) -> bool:
    return True


@dataclass(frozen=True)
class Probe:
    """One registry entry (see the module docstring)."""

    name: str
    what: str
    timeout: str | Callable[[Run], float]
    artifacts: tuple[Artifact, ...]
    read: Callable[[Run, Any], dict[str, Any]]
    facts: Callable[[Run, dict[str, Any], Any], dict[str, Any]]
    failed: Callable[[str], dict[str, Any]]
    families: frozenset[str] = frozenset()
    wanted: Callable[[Run], bool] = _always
    copy: Callable[[Run, dict[str, Any], dict[str, bytes], list[str]], None] | None = None
    live_only: bool = False  # nothing to capture (the QP walk): ``replay`` says so in a replay
    replay: Callable[[Run], dict[str, Any]] | None = None

    def runs_for(self, families: frozenset[str] | set[str]) -> bool:
        return not self.families or bool(self.families & set(families))

    def bound_s(self, run: Run) -> float:
        return self.timeout(run) if callable(self.timeout) else run.inputs.timeout(self.timeout)


# ---------------------------------------------------------------------------------------------
# Loading and dumping artifacts (the only code that touches snapshot files by name)


def load(probe: Probe, root: Path, timeout_s: float = 30.0) -> dict[str, Any]:
    """A probe's readings from a snapshot folder: each artifact's content, None when absent. Every
    file goes through the bounded reader (:mod:`afddiag.reader`: confined to ``root``, regular
    files only, size and JSON depth caps, read within ``timeout_s``). ``notes`` lists what was
    present but refused; ``refused`` the JSON parts among them (the probe's gates say ERROR)."""
    from afddiag.reader import InputError, load_json, read_text

    notes: list[str] = []
    refused: list[str] = []
    out: dict[str, Any] = {}
    for a in probe.artifacts:
        path = root / a.name
        try:
            if a.kind == "json":
                out[a.name] = load_json(path, root=root, timeout_s=timeout_s)
            elif a.kind == "text":
                out[a.name] = read_text(path, root, **({"max_bytes": a.max_bytes} if a.max_bytes else {}),
                                        timeout_s=timeout_s, errors="replace")
            else:
                out[a.name] = str(root) if path.is_dir() else None
        except FileNotFoundError:
            out[a.name] = None
        except InputError as e:
            out[a.name] = None
            why = f"{a.name} refused: {str(e).replace(str(path), a.name, 1)}"
            notes.append(why if a.kind == "json" else f"{why}; treated as not captured")
            if a.kind == "json":
                refused.append(why)
    out["notes"] = notes
    out["refused"] = refused
    return out


def dump(probe: Probe, readings: dict[str, Any], files: dict[str, bytes]) -> None:
    """A probe's JSON and text artifacts into ``files`` (relative path → bytes); None is left out."""
    for a in probe.artifacts:
        v = readings.get(a.name)
        if v is None or a.kind == "tree":
            continue
        if a.kind == "json":
            files[a.name] = (json.dumps(v, indent=2, default=str) + "\n").encode()
        else:
            files[a.name] = (v if v.endswith("\n") else v + "\n").encode("utf-8", "replace")


def _from(src: Any, live: Callable[[], Any]) -> Any:
    """One :class:`Sources` field's reading: None when the field is None (not read), ``live()`` when
    it is ``LIVE``, else the replacement's answer."""
    if src is None:
        return None
    return live() if src is LIVE else src()


def _sysread(run: Run, path: str) -> str:
    if run.host is not None and run.host.reader is not None:
        return run.host.reader(path)
    from afddiag.probes.sysfs import read_text

    if run.root is None:
        return read_text(path)
    if run.confined is None:  # a snapshot: regular files inside it only (afddiag.reader.confined_reader)
        from afddiag.reader import confined_reader

        run.confined = confined_reader(run.root, read_text)
    return run.confined(path)


def _try(run: Run, path: str) -> str | None:
    try:
        return _sysread(run, path)
    except (OSError, UnicodeError, ValueError):
        return None


def _root(run: Run) -> str:
    return str(run.root) if run.root is not None else (run.host.root if run.host else "/")


# ---------------------------------------------------------------------------------------------
# host name


def _host_read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "gethostname"
    if run.host.hostname is None:
        return {"host": os.uname().nodename.strip() or "unknown"}
    return {"host": (run.host.hostname() or "").strip() or "unknown"}


def _host_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    case = r.get("case.json")
    if isinstance(case, dict) and isinstance(case.get("host"), str):
        return {"host": case["host"][:253]}
    if r.get("host"):
        return {"host": r["host"].strip()[:253] or run.obs.host}
    if any(n.startswith("host refused") for n in r.get("notes") or []):
        return {"notes": ["the snapshot folder's name is used as the host name"]}
    return {}


# ---------------------------------------------------------------------------------------------
# environment

ENV_ALLOW = ("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME",
             "UCX_NET_DEVICES", "MC_GID_INDEX", "UCX_IB_GID_INDEX", "CUDA_VISIBLE_DEVICES")
ENV_ALLOW_PREFIX = "AFD_"


def env_allowed(name: str) -> bool:
    """True for the variables a bundle may carry: :data:`ENV_ALLOW` and ``AFD_*``."""
    return name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIX)


def env_text(environ: Mapping[str, str], notes: list[str]) -> str:
    """The allow-listed variables as ``KEY='value'`` lines (``parse_env_file`` reads them back exactly);
    a value with a newline is left out with a note; a credential's value (the name says token, secret,
    password, key, auth: :func:`afddiag.envvars.is_secret_name`) is written as ``<redacted>``, noted."""
    from afddiag.envvars import redact_env, redacted_note

    env, redacted = redact_env({k: environ[k] for k in sorted(environ) if env_allowed(k)})
    notes.extend(redacted_note(k) for k in redacted)  # the name is kept, the credential never enters a bundle
    lines = []
    for k, v in env.items():
        if "\n" in v or "\r" in v:
            notes.append(f"env {k}: value has a newline; not captured")
            continue
        lines.append(f"{k}='{v}'")
    return "\n".join(lines) + ("\n" if lines else "")


def _env_read(run: Run, progress: Any) -> dict[str, Any]:
    notes: list[str] = []
    environ = run.host.environ if run.host.environ is not None else dict(os.environ)
    return {"env": env_text(environ, notes), "notes": notes}


def _env_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.envvars import WATCHED, parse_env_file, redact_env, redacted_note

    if run.live:
        env, source = {k: v for k, v in parse_env_file(r.get("env") or "").items() if k in WATCHED}, \
            "process environment"
    elif r.get("env") is not None:
        env, source = parse_env_file(r["env"]), "snapshot env"
    else:
        env, source = {}, "snapshot without an env file: nothing set"
    env, redacted = redact_env(env)  # a snapshot written before redaction, or by hand
    sources = {k: source for k in env}
    le = run.inputs.launch_env
    if le is not None:
        # Precedence: the launcher sources its env file over the environment it runs in, so each variable
        # the file sets is what the engine gets; one the file does not set is inherited from that
        # environment: live, this process's; replayed, the captured process's (snapshot env). Each
        # variable's source is kept (env_sources) and the gates name it.
        file_source = f"launch env {run.inputs.launch_env_path}"
        for k, v in le.items():
            if k in WATCHED:
                env[k], sources[k] = v, file_source
        inherited = sorted(k for k in env if sources[k] != file_source and k in WATCHED)
        source = file_source + (f" (+ {', '.join(inherited)} from the {sources[inherited[0]]})" if inherited else "")
    return {"env": env, "env_source": source, "env_sources": sources, "notes": [redacted_note(k) for k in redacted]}


# ---------------------------------------------------------------------------------------------
# limits (RLIMIT_MEMLOCK, /dev/infiniband access)


def _limits_read(run: Run, progress: Any) -> dict[str, Any]:
    def live() -> Any:
        from afddiag.probes.launch import read_limits

        return to_jsonable(read_limits())

    progress.doing = "getrlimit(RLIMIT_MEMLOCK), access(/dev/infiniband/*)"
    return {"limits.json": _from(run.host.limits, live)}


def _limits_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.probes.launch import limits_from_json

    raw = r.get("limits.json")
    if raw is None:
        return {"limits": HostLimits(captured=False, notes=["limits not captured (no limits.json in the snapshot)"])}
    return {"limits": limits_from_json(raw)}


# ---------------------------------------------------------------------------------------------
# the launch image (docker|podman image inspect)


def _image_wanted(run: Run) -> bool:
    return not run.live or bool(run.launch_value("AFD_IMAGE"))


def _image_read(run: Run, progress: Any) -> dict[str, Any]:
    from afddiag.probes.launch import run_inspect

    ref = run.launch_value("AFD_IMAGE")
    progress.doing = f"image inspect {ref}"
    raw, engine, why = run_inspect(ref, run.inputs.timeout("image_s"))
    return {"image.json": raw, "engine": engine, "why": why}


def _image_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.probes.launch import image_from_inspect

    ref = run.launch_value("AFD_IMAGE")
    raw = r.get("image.json")
    if raw is not None:
        return {"image": image_from_inspect(raw, ref, r.get("engine") or "image.json")}
    if ref:
        return {"image": ImageFacts(ref=ref, source=r.get("engine"), why=r.get("why") or "image not captured (no image.json)")}
    return {}


# ---------------------------------------------------------------------------------------------
# fabric: sysfs trees, device index order, netdev addresses

HCA_ATTRS = ("node_guid", "node_type", "hca_type", "fw_ver", "board_id")
PORT_ATTRS = ("state", "phys_state", "link_layer", "rate")
NET_ATTRS = ("mtu", "operstate", "address", "carrier", "speed")
SYSCTLS = ("arp_ignore", "arp_announce", "rp_filter")  # proc/sys/net/ipv4/conf/{all,<netdev>}/ (fabric.arp)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@\-]+$")  # sysfs entry names copied into the bundle


def _names(path: str, numeric: bool = False) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    if numeric:
        return sorted((n for n in names if digits(n)), key=int)
    return [n for n in names if _NAME_RE.match(n)]


def ip_addr_json(run: Run, addresses: dict, netdevs: list[str]) -> list[dict[str, Any]]:
    """``ip -j addr show``-shaped list from afddiag's address reading (``{netdev: Netdev}``) and sysfs
    (``ifindex``, ``mtu`` in bytes, ``operstate``, ``address``): what ``parse_ip_addr_json`` reads."""
    net = os.path.join(_root(run), "sys", "class", "net")
    rows = []
    for name in sorted(set(netdevs) | set(addresses)):
        row: dict[str, Any] = {}
        idx = _try(run, f"{net}/{name}/ifindex")
        if digits(idx):
            row["ifindex"] = int(idx)
        row["ifname"] = name
        mtu = _try(run, f"{net}/{name}/mtu")
        given = addresses.get(name)
        if digits(mtu):
            row["mtu"] = int(mtu)
        elif given is not None and given.mtu is not None:
            row["mtu"] = given.mtu
        state = _try(run, f"{net}/{name}/operstate") or (given.operstate if given is not None else None)
        if state:
            row["operstate"] = state.upper()
        mac = _try(run, f"{net}/{name}/address")
        if mac:
            row["address"] = mac
        info = []
        for fam, addrs in (("inet", given.ipv4 if given else []), ("inet6", given.ipv6 if given else [])):
            for a in addrs:
                local, _, plen = a.partition("/")
                info.append({"family": fam, "local": local,
                             "prefixlen": int(plen) if digits(plen) else (32 if fam == "inet" else 128)})
        row["addr_info"] = info
        rows.append(row)
    return rows


def _fabric_read(run: Run, progress: Any) -> dict[str, Any]:
    """Device index order (NETLINK_RDMA, else ``rdma -j dev show``), addresses (getifaddrs), and
    the sysfs root the trees are read under."""
    src = run.host
    t = run.inputs.timeout("fabric_s")
    notes: list[str] = []
    progress.doing = "dumping RDMA devices over NETLINK_RDMA"
    if src.device_order is LIVE:
        from afddiag.probes import netlink

        order, order_source, onotes = netlink.device_order(min(t, 3.0))
    else:
        order, order_source, onotes = src.device_order()
    rows = None
    if order is not None:
        ib = os.path.join(src.root, "sys", "class", "infiniband")
        rows = []
        for name, idx in order:
            row: dict[str, Any] = {"ifindex": idx, "ifname": name}
            if run.capturing:  # what `rdma -j dev show` also prints, for people reading the bundle
                for key, attr in (("node_type", "node_type"), ("fw", "fw_ver"), ("node_guid", "node_guid")):
                    v = _try(run, f"{ib}/{name}/{attr}")
                    if v:
                        row[key] = v.split(":", 1)[-1].strip().lower() if key == "node_type" else v
            rows.append(row)
    else:
        notes.append("rdma-dev.json not written: device index order unknown on this host")
    progress.doing = "listing netdev addresses (getifaddrs)"
    addrs = None
    try:
        if src.addresses is LIVE:
            from afddiag.probes import netlink

            got, addr_source = netlink.netdev_addresses(), "psutil.net_if_addrs"
        else:
            got, addr_source = src.addresses(), "netlink (fake)"
        addrs = ip_addr_json(run, got, _names(os.path.join(src.root, "sys", "class", "net")))
    except Exception as e:  # noqa: BLE001 - recorded, not raised
        addr_source = "none"
        notes.append(f"netdev addresses not read: {e}")
    return {"sys": src.root, "rdma-dev.json": rows, "ip-addr.json": addrs, "order_source": order_source,
            "order_notes": list(onotes or []), "addr_source": addr_source, "notes": notes}


def _parsed(r: dict, artifact: str, parse, source_key: str, notes: list[str]):
    """``(parse(r[artifact]), source)`` for a reading that is present and parses; ``(None, None)``
    when absent; a ValueError from ``parse`` becomes a note naming the artifact."""
    if r.get(artifact) is None:
        return None, None
    try:
        return parse(r[artifact]), r.get(source_key) or artifact
    except ValueError as e:
        notes.append(f"{artifact}: {e}")
        return None, None


def _fabric_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.model.fabric import FabricFacts
    from afddiag.probes.netlink import parse_ip_addr_json, parse_rdma_dev_json
    from afddiag.probes.sysfs import probe_fabric

    if r.get("sys") is None:
        return {"fabric": FabricFacts(captured=False, notes=["fabric not captured (no sys/ in the snapshot)"])}
    notes: list[str] = list(r.get("notes") or []) if not run.live else []
    order, order_source = _parsed(r, "rdma-dev.json", parse_rdma_dev_json, "order_source", notes)
    addrs, addr_source = _parsed(r, "ip-addr.json", parse_ip_addr_json, "addr_source", notes)
    if run.live:
        addr_source = addr_source or r.get("addr_source")
        notes += [n for n in r.get("notes") or [] if "addresses" in n]
    elif addrs is None:
        notes.append("addresses not captured (no ip-addr.json): a GID's netdev is assumed to hold its IP")
    facts = probe_fabric(r["sys"], order, order_source or (r.get("order_source") if order else None), addrs,
                         addr_source, reader=progress.tracking(lambda p: _sysread(run, p)))
    if run.live and (order is None or not facts.devices):
        notes[:0] = list(r.get("order_notes") or [])
    facts.notes[:0] = notes
    return {"fabric": facts}


def _fabric_copy(run: Run, r: dict[str, Any], files: dict[str, bytes], notes: list[str]) -> None:
    """The sysfs files the fabric probe reads → ``files`` (``sys/...``, each the stripped text and a
    newline): attributes of empty GID slots are not copied, ``gid_attrs/EINVAL-SLOTS`` lists the
    slots whose attributes are absent or failed to read (as in the shared cases); a netdev attribute
    that is there but refused its read (``speed``: EINVAL while the link is down) leaves
    ``<attr>.errno`` with the errno, which a replay raises again (:func:`afddiag.reader.confined_reader`)."""
    from afddiag.model.fabric import is_empty_gid

    root = _root(run)
    ib = os.path.join(root, "sys", "class", "infiniband")
    net = os.path.join(root, "sys", "class", "net")

    def put(rel: str, text: str) -> None:
        files[rel] = (text + "\n").encode("utf-8", "replace")

    for hca in _names(ib):
        base = f"{ib}/{hca}"
        for a in HCA_ATTRS:
            v = _try(run, f"{base}/{a}")
            if v is not None:
                put(f"sys/class/infiniband/{hca}/{a}", v)
        for port in _names(f"{base}/ports", numeric=True):
            pdir, prel = f"{base}/ports/{port}", f"sys/class/infiniband/{hca}/ports/{port}"
            for a in PORT_ATTRS:
                v = _try(run, f"{pdir}/{a}")
                if v is not None:
                    put(f"{prel}/{a}", v)
            einval: list[int] = []
            for slot in _names(f"{pdir}/gids", numeric=True):
                gid = _try(run, f"{pdir}/gids/{slot}")
                if gid is None:
                    notes.append(f"{prel}/gids/{slot}: unreadable")
                    continue
                put(f"{prel}/gids/{slot}", gid)
                missing = is_empty_gid(gid)  # empty slots: the kernel answers EINVAL, never read
                if not missing:
                    for kind in ("types", "ndevs"):
                        v = _try(run, f"{pdir}/gid_attrs/{kind}/{slot}")
                        if v is None:
                            missing = True
                        else:
                            put(f"{prel}/gid_attrs/{kind}/{slot}", v)
                if missing:
                    einval.append(int(slot))
            if einval:
                put(f"{prel}/gid_attrs/EINVAL-SLOTS", "\n".join(str(i) for i in einval))
    from afddiag.reader import ERRNO_SUFFIX

    for nd in _names(net):
        for a in NET_ATTRS:
            try:
                put(f"sys/class/net/{nd}/{a}", _sysread(run, f"{net}/{nd}/{a}"))
            except OSError as e:  # there but refused (speed: EINVAL while the link is down): the replay
                if e.errno and e.errno != errno.ENOENT:  # raises the same errno (afddiag.reader)
                    put(f"sys/class/net/{nd}/{a}{ERRNO_SUFFIX}", str(e.errno))
            except (UnicodeError, ValueError):
                pass


def _fabric_failed(why: str) -> dict[str, Any]:
    from afddiag.model.fabric import FabricFacts

    return {"fabric": FabricFacts(captured=False, failed=why, notes=[why])}


# ---------------------------------------------------------------------------------------------
# the QP walk (live only)


def _qp_bound(run: Run) -> float:
    fab = run.obs.fabric
    n = len(fab.devices) if fab else 1
    return run.inputs.timeout("qp_s") * max(1, n) * max(1, len(run.inputs.peers)) + 2


def _qp_not_run(why: str, failed: bool = False) -> dict[str, Any]:
    """``{"qp": QpFacts}`` of a QP walk that did not run (``failed``: it timed out or crashed)."""
    from afddiag.model.fabric import QpFacts

    return {"qp": QpFacts(ran=False, why=why, failed=why if failed else None)}


def _qp_read(run: Run, progress: Any) -> dict[str, Any]:
    from afddiag.model.fabric import QpFacts

    fab = run.obs.fabric
    if not run.inputs.run_qp:
        return {"qp": QpFacts(ran=False, why="QP test not requested (--no-qp)")}
    if fab is None or fab.failed:
        return {"qp": QpFacts(ran=False, why="fabric probe failed: no devices to walk",
                              failed=f"not run: {fab.failed}" if fab else "not run")}
    if not fab.devices:
        return {"qp": QpFacts(ran=False, why="no RDMA device to open")}
    try:
        from afddiag.probes.qp import probe_qp
    except ImportError as e:
        return {"qp": QpFacts(ran=False, why=f"QP probe unavailable: {e}")}
    progress.doing = "walking QPs RESET→INIT→RTR→RTS"
    return {"qp": probe_qp(fab, run.fabric_ip(), list(run.inputs.peers), run.inputs.timeout("qp_s"))}


# ---------------------------------------------------------------------------------------------
# routes to the peers and ARP sysctls


def _fabric_netdevs(run: Run) -> list[str]:
    fab = run.obs.fabric
    return sorted({g.netdev for d in (fab.devices if fab else []) for p in d.ports for g in p.gids
                   if g.netdev and g.ipv4})


def _route_read(run: Run, progress: Any) -> dict[str, Any]:
    """``ip -j route get <peer> from <fabric-ip>`` per peer (as ``{peer: output}``; a failure as
    ``{"error": why}``), the whole table when capturing (peers are not known then), the ARP sysctls' root."""
    from afddiag.probes.route import route_get, route_table, rule_table

    ip = run.fabric_ip()
    peers = list(run.inputs.peers)
    t = min(3.0, float(run.inputs.probe_timeout_s or 3.0))
    got = {}
    for p in peers:
        progress.doing = f"ip route get {p}"
        got[p] = route_get(p, ip, t)
    table = rules = None
    src = run.host.route
    if run.capturing and src is not None:
        progress.doing = "ip route show table all"
        table = route_table(t) if src is LIVE else src()
        progress.doing = "ip rule show"  # a replay redoes the lookup: rules decide which table it reads
        rules = rule_table(t) if src is LIVE and run.host.rules is None else (
            run.host.rules() if callable(run.host.rules) else None)
    return {"ip-route-get.json": got if peers else None, "ip-route.json": table, "ip-rule.json": rules,
            "proc/sys/net/ipv4/conf": run.host.root, "route_source": "ip route get"}


def _route_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.model.fabric import RouteFacts
    from afddiag.probes.route import lookup_policy, read_sysctls, route_from_get_json, routes_from_table

    facts = RouteFacts(fabric_ip=run.fabric_ip())
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
    conf_root = r.get("proc/sys/net/ipv4/conf")
    if conf_root is not None and os.path.isdir(os.path.join(conf_root, "proc/sys/net/ipv4/conf")):
        progress.doing = "reading the ARP sysctls"
        facts.conf, facts.effective = read_sysctls(conf_root, _fabric_netdevs(run))
        facts.sysctl_captured = True
    else:
        facts.notes.append("ARP sysctls not captured (no proc/sys/net/ipv4/conf)")
    facts.notes += [n for n in r.get("notes") or []]
    return {"route": facts}


def _route_copy(run: Run, r: dict[str, Any], files: dict[str, bytes], notes: list[str]) -> None:
    """``proc/sys/net/ipv4/conf/{all,<netdev>}/{arp_ignore,arp_announce,rp_filter}`` for every netdev."""
    root = _root(run)
    conf = os.path.join(root, "proc", "sys", "net", "ipv4", "conf")
    netdevs = _names(os.path.join(root, "sys", "class", "net"))
    for nd in ["all"] + [n for n in netdevs if n != "all"]:
        for a in SYSCTLS:
            v = _try(run, f"{conf}/{nd}/{a}")
            if v is not None:
                files[f"proc/sys/net/ipv4/conf/{nd}/{a}"] = (v + "\n").encode("utf-8", "replace")


def _route_failed(why: str) -> dict[str, Any]:
    from afddiag.model.fabric import RouteFacts

    return {"route": RouteFacts(captured=False, notes=[why], failed=why)}


# ---------------------------------------------------------------------------------------------
# versions (kernel, BIOS, rdma-core, HCA firmware)


def _dmi(run: Run, name: str) -> str | None:
    return _try(run, os.path.join(_root(run), "sys", "class", "dmi", "id", name)) or None


def _versions_read(run: Run, progress: Any) -> dict[str, Any]:
    import sys

    from afddiag import __version__

    src = run.host
    progress.doing = "reading the kernel, BIOS and rdma-core versions"
    if src.rdma_core is LIVE:
        from afddiag.probes.versions import rdma_core_version

        rdma = rdma_core_version()
    else:
        rdma = src.rdma_core() or {}
    ib = os.path.join(src.root, "sys", "class", "infiniband")
    fw = {h: v for h in _names(ib) if (v := _try(run, f"{ib}/{h}/fw_ver")) is not None}
    gpu = (run.readings.get("gpu") or {}).get("gpu.json") or {}
    osrel = _try(run, os.path.join(src.root, "proc", "sys", "kernel", "osrelease"))
    return {"versions.json": {
        "kernel": osrel or (os.uname().release if src.root == "/" else None),
        "bios": _dmi(run, "bios_version"),
        "rdma_core": rdma.get("version"),
        "rdma_core_source": rdma.get("source"),
        "driver": gpu.get("driver_version"),
        "cuda_driver": gpu.get("cuda_driver_version"),
        "bios_vendor": _dmi(run, "bios_vendor"),
        "bios_date": _dmi(run, "bios_date"),
        "board": {k: _dmi(run, k) for k in ("sys_vendor", "product_name", "board_name")},
        "hca_firmware": fw,
        "afddiag": __version__,
        "python": "{}.{}.{}".format(*sys.version_info[:3]),
    }, "proc/sys/kernel/osrelease": osrel}


def _versions_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    out: dict[str, str | None] = {"kernel": None, "bios": None, "rdma_core": None}
    raw = r.get("versions.json")
    if isinstance(raw, dict):
        out.update({k: str(v)[:200] for k, v in raw.items() if k in out and v is not None})
    for key, name in (("kernel", "proc/sys/kernel/osrelease"), ("bios", "sys/class/dmi/id/bios_version")):
        v = r.get(name)
        if not out[key] and isinstance(v, str) and v.strip():
            out[key] = v.strip()
    return {"versions": out}


def _versions_failed(why: str) -> dict[str, Any]:
    return {"versions": None}


# ---------------------------------------------------------------------------------------------
# GPUs (NVML, the CUDA driver) and the load probe


KERNEL_XID_LOG = "kernel-xid.log"  # what `capture` keeps of the kernel log: its NVRM Xid lines
KERNEL_LOGS = (KERNEL_XID_LOG, "dmesg.txt", "dmesg.log", "kmsg.txt", "kern.log", "journalctl-k.txt")
KERNEL_LOG_MAX_BYTES = 16 << 20


def _gpu_bound(run: Run) -> float:
    t = run.inputs.timeout("gpu_s") + 2.0  # read_gpu bounds its own NVML/CUDA worker; this catches a hang outside it
    return t + (run.inputs.timeout("load_s") * 8 + 5 if wants_load(run.inputs) else 0)


CUDA_NOT_NEEDED = ("not read: nothing in this run needs it (no expected SM count: --expect-sm, the launch env's "
                   "AFD_IMAGE_SM_COUNT or the image label; no load probe; no dma-buf registration probe)")


def cuda_reason(inputs: Any, obs: Any = None, capturing: bool = False) -> str | None:
    """Why this run needs the CUDA driver's view of the GPUs (SM count, integrated), or None when
    nothing does: then the GPU probe reads NVML only and ``cuInit`` (0.2 s on an H200, every device
    set up) is skipped. Needed by an expected SM count from any source (:func:`afddiag.expect.sm_count`:
    ``--expect-sm``, the launch env's ``AFD_IMAGE_SM_COUNT``, the image label, a snapshot's expect;
    ``obs`` None: the inputs alone), the load probe, the memory-registration probe (its CUDA dma-buf
    export initialises CUDA anyway) and a capture (it keeps everything). Pure."""
    from afddiag.expect import sm_count

    if capturing:
        return "a capture keeps everything"
    want = sm_count(inputs, obs)
    if want is not None:
        return f"expected SM count {want.value} ({want.source})"
    if wants_load(inputs):
        return "the load probe runs"
    if "fabric" in inputs.families and inputs.run_qp:
        return "the memory-registration probe's dma-buf export initialises CUDA"
    return None


def _gpu_read(run: Run, progress: Any) -> dict[str, Any]:
    from afddiag import collect

    def live() -> Any:
        from afddiag.probes.gpu import read_gpu

        why = cuda_reason(run.inputs, run.obs, run.capturing)  # the image probe ran before this one
        return read_gpu(timeout_s=run.inputs.timeout("gpu_s"), xid_log=run.inputs.xid_log,
                        cuda=why is not None, cuda_why=why or CUDA_NOT_NEEDED)

    progress.doing = "reading GPUs (NVML, CUDA driver when needed)"
    readings = _from(run.host.gpu, live)
    if readings is None:
        return {"gpu.json": None}
    if isinstance(readings, dict) and wants_load(run.inputs) and readings.get("devices"):
        from afddiag.probes.load import attach_load

        progress.doing = "running the GPU load probe"
        t = run.inputs.timeout("load_s") * len(readings["devices"])
        # the playbook's load probe stays off a GPU another job computes on; an explicit --load forces it
        _, failed = collect.guarded(lambda: attach_load(readings, run.inputs.load_budget_s, skip_busy=not run.inputs.load),
                                    t, "GPU load probe")
        if failed:
            readings["load_failed"] = failed
            for d in readings["devices"]:
                if not isinstance(d.get("under_load"), dict):
                    d["under_load"] = {"why": failed}
    out: dict[str, Any] = {"gpu.json": readings if isinstance(readings, dict) else None}
    if isinstance(readings, dict) and isinstance(readings.get("xid_events"), list):
        # the kernel log's Xid lines, as the driver printed them: a replay judges them like --xid-log
        out[KERNEL_XID_LOG] = "".join(f"{e.get('text')}\n" for e in readings["xid_events"]
                                      if isinstance(e, dict) and e.get("text"))
    return out


def _snapshot_xids(run: Run, raw: dict[str, Any], r: dict[str, Any]) -> None:
    """The Xid events a replay judges, into ``raw["xid_events"]``/``["xid_source"]``: ``--xid-log``
    when given; else gpu.json's own ``xid_events``; else Xid lines gpu.json records as
    ``xid_lines``/``kernel_log`` (a list of lines or text); else a kernel log saved in the snapshot
    (:data:`KERNEL_LOGS`: what `capture` keeps, or dmesg / journalctl -k output)."""
    from afddiag.probes.gpu import parse_xid_lines
    from afddiag.reader import InputError, read_text

    if run.inputs.xid_log:
        try:
            text = read_text(run.inputs.xid_log, None, KERNEL_LOG_MAX_BYTES, errors="replace")
        except (OSError, InputError) as e:
            raw["xid_source"] = f"not read: {run.inputs.xid_log}: {e}"
            raw["xid_events"] = None
            return
        raw["xid_events"], raw["xid_source"] = parse_xid_lines(text.splitlines()), run.inputs.xid_log
        return
    if isinstance(raw.get("xid_events"), list):
        return
    for key in ("xid_lines", "kernel_log"):
        lines = raw.get(key)
        if isinstance(lines, str):
            lines = lines.splitlines()
        if isinstance(lines, list):
            raw["xid_events"] = parse_xid_lines([x for x in lines if isinstance(x, str)])
            raw["xid_source"] = f"gpu.json {key}"
            return
    for name in KERNEL_LOGS:
        if isinstance(r.get(name), str):
            raw["xid_events"], raw["xid_source"] = parse_xid_lines(r[name].splitlines()), f"snapshot {name}"
            return


def _gpu_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.model.gpu import gpu_facts_from_readings

    raw = r.get("gpu.json")
    if raw is None:
        return {"gpu": GpuFacts(captured=False, why="GPU not captured (no gpu.json in the snapshot)")}
    if not run.live and isinstance(raw, dict):
        _snapshot_xids(run, raw, r)
    try:
        return {"gpu": gpu_facts_from_readings(raw)}
    except Exception as e:  # noqa: BLE001 - odd readings must not stop the run
        why = f"GPU readings not usable ({type(e).__name__}: {e})"
        return {"gpu": GpuFacts(available=False, why=why, failed=why)}


def _gpu_failed(why: str) -> dict[str, Any]:
    return {"gpu": GpuFacts(available=False, why=why, failed=why)}


# ---------------------------------------------------------------------------------------------
# host CPU (cpufreq, a fixed-work loop)


def _cpu_read(run: Run, progress: Any) -> dict[str, Any]:
    def live() -> Any:
        from afddiag.probes.cpu import read_cpu

        return read_cpu()

    progress.doing = "reading cpufreq and running the fixed-work loop"
    return {"cpu.json": _from(run.host.cpu, live)}


def _cpu_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get("cpu.json")
    return {"cpu": raw if isinstance(raw, dict) else None}


# ---------------------------------------------------------------------------------------------
# which memory the NIC can register (pyverbs MRs, the CUDA dma-buf export, the CMA signature)


def _memreg_wanted(run: Run) -> bool:
    # --no-qp skips every verbs object a run would create; a capture records the registrations
    return run.capturing or not run.live or run.inputs.run_qp


def _memreg_bound(run: Run) -> float:
    return run.inputs.timeout("qp_s") * 2 + 5.0  # CUDA initialisation takes seconds on a large GPU


def _memreg_read(run: Run, progress: Any) -> dict[str, Any]:
    src = run.host.memreg
    if src is None:
        return {"memreg.json": None}
    progress.doing = "registering host and GPU memory (pyverbs MR, DmaBufMR; CUDA dma-buf export)"
    if src is LIVE:
        from afddiag.probes.memreg import read_memreg

        return {"memreg.json": read_memreg(run.host.root, timeout_s=_memreg_bound(run) - 3.0)}
    return {"memreg.json": src()}


def _memreg_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.model.fabric import memreg_facts

    return {"memreg": memreg_facts(r.get("memreg.json"))}


def _memreg_failed(why: str) -> dict[str, Any]:
    from afddiag.model.fabric import MemRegFacts

    return {"memreg": MemRegFacts(captured=False, failed=why, notes=[why])}



# ---------------------------------------------------------------------------------------------
# PCIe links of the RDMA NICs and GPUs


def _pcie_read(run: Run, progress: Any) -> dict[str, Any]:
    from afddiag.probes.pcie import read_pcie

    if run.host.pcie is None:
        return {"pcie.json": None}
    if run.host.pcie is not LIVE:
        return {"pcie.json": run.host.pcie()}
    progress.doing = "reading PCIe links (/sys/bus/pci/devices/<bdf>/*_link_*)"
    return {"pcie.json": read_pcie(run.host.root, reader=lambda p: _sysread(run, p))}


def _pcie_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.model.host import pcie_facts

    return {"pcie": pcie_facts(r.get("pcie.json"))}


def _pcie_failed(why: str) -> dict[str, Any]:
    from afddiag.model.host import PcieFacts

    return {"pcie": PcieFacts(captured=False, failed=why, notes=[why])}


# ---------------------------------------------------------------------------------------------
# control-plane reach: TCP connects from the fabric IP to the peers' engine ports


def engine_ports(run: Run) -> list[int]:
    """The peers' engine ports: the launch env's AFD_ENGINE_PORTS, else the playbook's engine_ports."""
    raw = run.launch_value("AFD_ENGINE_PORTS")
    if raw:
        return [int(v) for v in re.split(r"[,\s]+", raw.strip()) if digits(v)]
    pb = run.inputs.playbook
    return list(pb.engine_ports) if pb is not None else []


def _reach_wanted(run: Run) -> bool:
    return not run.live or bool(run.inputs.peers and engine_ports(run))


def _reach_read(run: Run, progress: Any) -> dict[str, Any]:
    from afddiag.probes.reach import read_reach

    progress.doing = "TCP connects to the peers' engine ports"
    src = run.fabric_ip() or run.inputs.fabric_ip
    return {"reach.json": read_reach(list(run.inputs.peers), engine_ports(run), src,
                                     run.inputs.timeout("limits_s"))}


def _reach_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.model.host import reach_facts

    return {"reach": reach_facts(r.get("reach.json"))}


def _reach_failed(why: str) -> dict[str, Any]:
    from afddiag.model.host import ReachFacts

    return {"reach": ReachFacts(captured=False, failed=why, notes=[why])}


# ---------------------------------------------------------------------------------------------
# the pair test's result (the bandwidth run and the port counters around it)

PAIR_ARTIFACT = "pair.json"  # the JSON `afddiag fabric --pair HOST --bandwidth --json` prints


def _pair_wanted(run: Run) -> bool:
    # a replay reads a saved result; a live run only the one the pair command hands in (a capture has none)
    return not run.live or (run.host is not None and run.host.pair is not None and not run.capturing)


def _pair_read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "taking the pair test's result"
    return {PAIR_ARTIFACT: run.host.pair()}


def _pair_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    from afddiag.model.pair import _json_kind, pair_facts

    raw = r.get(PAIR_ARTIFACT)
    if raw is not None and not isinstance(raw, dict):
        return _pair_failed(f"{PAIR_ARTIFACT}: a JSON {_json_kind(raw)}, not the pair test's object: save the output of "
                            "`afddiag fabric --pair HOST --bandwidth --json` unedited")
    return {"pair": pair_facts(raw)}


def _pair_failed(why: str) -> dict[str, Any]:
    from afddiag.model.pair import PairFacts

    return {"pair": PairFacts(role="unknown", failed=why, notes=[why])}


PROBES: tuple[Probe, ...] = (
    Probe("host", "hostname", "limits_s", (Artifact("host", "text", 4096), Artifact("case.json")),
          _host_read, _host_facts, lambda why: {}),
    Probe("env", "environment", "limits_s", (Artifact("env", "text"),), _env_read, _env_facts, lambda why: {}),
    Probe("limits", "limits probe (getrlimit, /dev/infiniband)", "limits_s", (Artifact("limits.json"),),
          _limits_read, _limits_facts,
          lambda why: {"limits": HostLimits(captured=False, failed=why, notes=[why])}, frozenset({"launch"})),
    Probe("image", "image probe (docker|podman image inspect)", lambda run: run.inputs.timeout("image_s") + 1.0,
          (Artifact("image.json"),), _image_read, _image_facts,
          lambda why: {"image": ImageFacts(why=why, failed=why)}, frozenset({"launch", "gpu"}), _image_wanted),
    Probe("fabric", "fabric probe (sysfs)", "fabric_s",
          (Artifact("sys", "tree"), Artifact("rdma-dev.json"), Artifact("ip-addr.json")),
          _fabric_read, _fabric_facts, _fabric_failed, frozenset({"fabric"}), copy=_fabric_copy),
    Probe("qp", "QP probe", _qp_bound, (), _qp_read, lambda run, r, progress: {"qp": r["qp"]},
          lambda why: _qp_not_run(why, failed=True), frozenset({"fabric"}), live_only=True,
          replay=lambda run: _qp_not_run("not captured: a snapshot holds no live QP test")),
    Probe("route", "route probe (ip route get, ARP sysctls)", "fabric_s",
          (Artifact("ip-route-get.json"), Artifact("ip-route.json"), Artifact("ip-rule.json"),
           Artifact("proc/sys/net/ipv4/conf", "tree")),
          _route_read, _route_facts, _route_failed, frozenset({"fabric"}), copy=_route_copy),
    Probe("gpu", "GPU probe (NVML, CUDA driver)", _gpu_bound,
          (Artifact("gpu.json"),) + tuple(Artifact(n, "text", KERNEL_LOG_MAX_BYTES) for n in KERNEL_LOGS),
          _gpu_read, _gpu_facts, _gpu_failed, frozenset({"gpu"})),
    Probe("memreg", "memory-registration probe (pyverbs MR, CUDA dma-buf)", _memreg_bound, (Artifact("memreg.json"),),
          _memreg_read, _memreg_facts, _memreg_failed, frozenset({"fabric"}), _memreg_wanted),
    Probe("pcie", "PCIe link probe (sysfs)", "fabric_s", (Artifact("pcie.json"),), _pcie_read, _pcie_facts,
          _pcie_failed, frozenset({"host"})),
    Probe("reach", "control-plane probe (TCP connects to the peers' engine ports)", lambda run: run.inputs.timeout("limits_s") + 1.0,
          (Artifact("reach.json"),), _reach_read, _reach_facts, _reach_failed, frozenset({"launch"}), _reach_wanted),
    Probe("cpu", "CPU probe (cpufreq, fixed-work loop)", "cpu_s", (Artifact("cpu.json"),), _cpu_read, _cpu_facts,
          lambda why: {"cpu": {"why": why, "failed": why}}, frozenset({"host"})),
    Probe("pair", "pair-test result (bandwidth run, port counters)", "fabric_s", (Artifact(PAIR_ARTIFACT),),
          _pair_read, _pair_facts, _pair_failed, frozenset({"fabric"}), _pair_wanted),
    Probe("versions", "version probe (kernel, BIOS, rdma-core)", "fabric_s",
          (Artifact("versions.json"), Artifact("proc/sys/kernel/osrelease", "text", 4096),
           Artifact("sys/class/dmi/id/bios_version", "text", 4096)),
          _versions_read, _versions_facts, _versions_failed),
)

def layout_hint() -> str:
    """The main files of a snapshot folder, for an error message: ``sys/, rdma-dev.json, ...``."""
    names = [a.name + ("/" if a.kind == "tree" else "") for p in PROBES for a in p.artifacts
             if p.name in ("env", "fabric", "gpu")]
    return ", ".join(names)


#: What `afddiag capture` writes besides the probes' artifacts (``capture.json``: what was captured, notes).
CAPTURE_MANIFEST = "capture.json"


def recognizes(root: Path) -> bool:
    """True when folder ``root`` holds at least one artifact of a probe (or a capture manifest): a
    folder with none is not a snapshot (a usage error, never a page of SKIPs and exit 0)."""
    names = [a.name for p in PROBES for a in p.artifacts] + [CAPTURE_MANIFEST]
    return any((root / n).exists() for n in names)


def snapshot_parts() -> str:
    """What a snapshot holds, for an error message (every artifact name, trees with a slash)."""
    return ", ".join(dict.fromkeys(a.name + ("/" if a.kind == "tree" else "") for p in PROBES for a in p.artifacts))
