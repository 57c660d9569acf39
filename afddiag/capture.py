"""``afddiag capture``: everything the probes read on this host, as a bundle ``--snapshot`` replays.

The bundle (a ``.tar.gz`` with one top folder ``afddiag-capture-<host>-<UTC time>/``) holds:

- ``sys/class/infiniband/<hca>/{node_guid,node_type,hca_type,fw_ver}`` and
  ``.../ports/<n>/{state,phys_state,link_layer,rate,gids/<i>,gid_attrs/types/<i>,gid_attrs/ndevs/<i>}``;
  attributes of empty GID slots are not copied, and ``gid_attrs/EINVAL-SLOTS`` lists the slots whose
  attributes are absent or failed to read (as in the shared cases);
- ``sys/class/net/<if>/{mtu,operstate,address,carrier,speed}`` (a file the kernel refused is left out);
- ``rdma-dev.json`` (``rdma -j dev show`` shape, from :func:`afddiag.probes.netlink.device_order`;
  absent when the order is unknown), ``ip-addr.json`` (``ip -j addr show`` shape, from the addresses
  afddiag reads and sysfs; absent when they could not be read), ``ip-route.json``
  (``ip -j route show table all``; absent without ``ip``);
- ``env``: only :data:`ENV_ALLOW` and ``AFD_*`` variables of this process (nothing else leaves the host);
- ``gpu.json`` (:func:`afddiag.probes.gpu.read_gpu`, with load figures under ``--load``),
  ``limits.json`` (:func:`afddiag.probes.launch.read_limits`), ``cpu.json``
  (:func:`afddiag.probes.cpu.read_cpu`), ``versions.json`` (kernel, driver, BIOS, rdma-core, HCA
  firmware, afddiag), ``host`` (hostname), ``capture.json`` (what was captured, notes).

Every host source is a field of :class:`Sources`, so a test points the capture at a fake root and
fake readings. Probes only read; the bundle is written atomically (temp file + rename).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from afddiag import __version__
from afddiag.facts import is_empty_gid, to_jsonable

ENV_ALLOW = ("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME",
             "UCX_NET_DEVICES", "MC_GID_INDEX", "CUDA_VISIBLE_DEVICES")
ENV_ALLOW_PREFIX = "AFD_"
HCA_ATTRS = ("node_guid", "node_type", "hca_type", "fw_ver")
PORT_ATTRS = ("state", "phys_state", "link_layer", "rate")
NET_ATTRS = ("mtu", "operstate", "address", "carrier", "speed")
SYSCTLS = ("arp_ignore", "arp_announce", "rp_filter")  # proc/sys/net/ipv4/conf/{all,<netdev>}/ (fabric.arp)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:@\-]+$")  # sysfs entry names copied into the bundle


def env_allowed(name: str) -> bool:
    """True for the variables a bundle may carry: :data:`ENV_ALLOW` and ``AFD_*``."""
    return name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIX)


def _live_order():
    from afddiag.probes.netlink import device_order

    return device_order(3.0)


def _live_addresses():
    from afddiag.probes.netlink import netdev_addresses

    return netdev_addresses()


def _live_gpu(timeout_s: float = 10.0, load: bool = False, budget_s: float = 3.0) -> dict:
    from afddiag.probes.gpu import read_gpu

    readings = read_gpu(timeout_s=timeout_s)
    if load and readings.get("devices"):
        from afddiag.collect import attach_load

        attach_load(readings, budget_s)
    return readings


def _live_limits() -> Any:
    from afddiag.probes.launch import read_limits

    return to_jsonable(read_limits())


def _live_cpu() -> dict:
    from afddiag.probes.cpu import read_cpu

    return read_cpu()


def _live_route(timeout_s: float = 5.0) -> Any:
    exe = shutil.which("ip")
    if not exe:
        return None
    p = subprocess.run([exe, "-j", "route", "show", "table", "all"], capture_output=True, text=True,
                       timeout=timeout_s)
    if p.returncode != 0:
        raise OSError(f"ip -j route show table all: rc {p.returncode}: {p.stderr.strip()[:200]}")
    return json.loads(p.stdout or "[]")


def _rdma_core_version(timeout_s: float = 5.0) -> dict[str, str | None]:
    """rdma-core's version → ``{"version", "source"}``: the libibverbs file name (as
    ``fleet.versions`` reads it live, e.g. "44.0"), else ``dpkg-query`` (rdma-core, libibverbs1),
    else pyverbs' package metadata; ``{}`` when none answers."""
    try:
        from afddiag.probes.route import read_versions

        v = read_versions(None).get("rdma_core")
        if v:
            return {"version": v, "source": "libibverbs file name"}
    except Exception:  # noqa: BLE001 - absent or failing: the next source
        pass
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


@dataclass
class Sources:
    """Where a capture reads from. Defaults read this host; tests replace any of them.

    ``root``: the filesystem root sysfs is read under (``<root>/sys/class/...``, ``<root>/sys/class/dmi/id``).
    ``device_order() -> (list[(name, index)] | None, source, notes)``; ``addresses() -> {netdev: Netdev}``
    (raises on failure); ``gpu() -> gpu.json dict``; ``limits() -> limits.json dict``; ``cpu() -> dict``;
    ``route() -> ip -j route JSON or None`` (raises on failure); ``rdma_core() -> {"version", "source"}``;
    ``environ``: the process environment (filtered by :func:`env_allowed`); ``hostname()``;
    ``reader(path) -> str`` reads one sysfs file (raises OSError as the kernel answers).
    """

    root: str = "/"
    device_order: Callable[[], tuple[Any, str, list[str]]] = _live_order
    addresses: Callable[[], dict] = _live_addresses
    gpu: Callable[[], dict] | None = _live_gpu
    limits: Callable[[], Any] | None = _live_limits
    cpu: Callable[[], dict] | None = _live_cpu
    route: Callable[[], Any] | None = _live_route
    rdma_core: Callable[[], dict] = _rdma_core_version
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    hostname: Callable[[], str] = socket.gethostname
    reader: Callable[[str], str] | None = None


def _read(src: Sources, path: str) -> str:
    if src.reader is not None:
        return src.reader(path)
    from afddiag.probes.sysfs import read_text

    return read_text(path)


def _try(src: Sources, path: str) -> str | None:
    try:
        return _read(src, path)
    except (OSError, UnicodeError, ValueError):
        return None


def _names(path: str, digits: bool = False) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return []
    if digits:
        return sorted((n for n in names if n.isdigit()), key=int)
    return [n for n in names if _NAME_RE.match(n)]


def capture_sysfs(src: Sources, files: dict[str, bytes], notes: list[str]) -> dict[str, Any]:
    """Copy the sysfs files the fabric probe reads into ``files`` (``sys/...`` → bytes, each the
    stripped text plus a newline), and the ARP/reverse-path sysctls the route probe reads
    (``proc/sys/net/ipv4/conf/{all,<netdev>}/{arp_ignore,arp_announce,rp_filter}``,
    ``proc/sys/kernel/osrelease``). Returns ``{"hcas": [...], "netdevs": [...], "fw": {hca: fw_ver}}``."""
    ib = os.path.join(src.root, "sys", "class", "infiniband")
    net = os.path.join(src.root, "sys", "class", "net")
    out: dict[str, Any] = {"hcas": [], "netdevs": [], "fw": {}}

    def put(rel: str, text: str) -> None:
        files[rel] = (text + "\n").encode("utf-8", "replace")

    for hca in _names(ib):
        out["hcas"].append(hca)
        base = f"{ib}/{hca}"
        for a in HCA_ATTRS:
            v = _try(src, f"{base}/{a}")
            if v is not None:
                put(f"sys/class/infiniband/{hca}/{a}", v)
                if a == "fw_ver":
                    out["fw"][hca] = v
        for port in _names(f"{base}/ports", digits=True):
            pdir, prel = f"{base}/ports/{port}", f"sys/class/infiniband/{hca}/ports/{port}"
            for a in PORT_ATTRS:
                v = _try(src, f"{pdir}/{a}")
                if v is not None:
                    put(f"{prel}/{a}", v)
            einval: list[int] = []
            for slot in _names(f"{pdir}/gids", digits=True):
                gid = _try(src, f"{pdir}/gids/{slot}")
                if gid is None:
                    notes.append(f"{prel}/gids/{slot}: unreadable")
                    continue
                put(f"{prel}/gids/{slot}", gid)
                missing = is_empty_gid(gid)  # empty slots: the kernel answers EINVAL, never read
                if not missing:
                    for kind in ("types", "ndevs"):
                        v = _try(src, f"{pdir}/gid_attrs/{kind}/{slot}")
                        if v is None:
                            missing = True
                        else:
                            put(f"{prel}/gid_attrs/{kind}/{slot}", v)
                if missing:
                    einval.append(int(slot))
            if einval:
                put(f"{prel}/gid_attrs/EINVAL-SLOTS", "\n".join(str(i) for i in einval))
    for nd in _names(net):
        out["netdevs"].append(nd)
        for a in NET_ATTRS:
            v = _try(src, f"{net}/{nd}/{a}")
            if v is not None:
                put(f"sys/class/net/{nd}/{a}", v)
    conf = os.path.join(src.root, "proc", "sys", "net", "ipv4", "conf")
    for nd in ["all"] + [n for n in out["netdevs"] if n != "all"]:
        for a in SYSCTLS:
            v = _try(src, f"{conf}/{nd}/{a}")
            if v is not None:
                put(f"proc/sys/net/ipv4/conf/{nd}/{a}", v)
    v = _try(src, os.path.join(src.root, "proc", "sys", "kernel", "osrelease"))
    if v:
        put("proc/sys/kernel/osrelease", v)
    return out


def ip_addr_json(src: Sources, addresses: dict, netdevs: list[str]) -> list[dict[str, Any]]:
    """``ip -j addr show``-shaped list from afddiag's address reading (``{netdev: Netdev}``) and sysfs
    (``ifindex``, ``mtu`` in bytes, ``operstate``, ``address``): what ``parse_ip_addr_json`` reads."""
    net = os.path.join(src.root, "sys", "class", "net")
    rows = []
    for name in sorted(set(netdevs) | set(addresses)):
        row: dict[str, Any] = {}
        idx = _try(src, f"{net}/{name}/ifindex")
        if idx and idx.isdigit():
            row["ifindex"] = int(idx)
        row["ifname"] = name
        mtu = _try(src, f"{net}/{name}/mtu")
        given = addresses.get(name)
        if mtu and mtu.isdigit():
            row["mtu"] = int(mtu)
        elif given is not None and given.mtu is not None:
            row["mtu"] = given.mtu
        state = _try(src, f"{net}/{name}/operstate") or (given.operstate if given is not None else None)
        if state:
            row["operstate"] = state.upper()
        mac = _try(src, f"{net}/{name}/address")
        if mac:
            row["address"] = mac
        info = []
        for fam, addrs in (("inet", given.ipv4 if given else []), ("inet6", given.ipv6 if given else [])):
            for a in addrs:
                local, _, plen = a.partition("/")
                info.append({"family": fam, "local": local,
                             "prefixlen": int(plen) if plen.isdigit() else (32 if fam == "inet" else 128)})
        row["addr_info"] = info
        rows.append(row)
    return rows


def env_text(environ: Mapping[str, str], notes: list[str]) -> str:
    """The allow-listed variables as ``KEY='value'`` lines (``parse_env_file`` reads them back exactly);
    a value with a newline is left out with a note."""
    lines = []
    for k in sorted(environ):
        if not env_allowed(k):
            continue
        v = environ[k]
        if "\n" in v or "\r" in v:
            notes.append(f"env {k}: value has a newline; not captured")
            continue
        lines.append(f"{k}='{v}'")
    return "\n".join(lines) + ("\n" if lines else "")


def _dmi(src: Sources, name: str) -> str | None:
    return _try(src, os.path.join(src.root, "sys", "class", "dmi", "id", name)) or None


def collect_bundle(src: Sources | None = None, timeout_s: float = 10.0) -> tuple[dict[str, bytes], str, list[str]]:
    """Read everything the probes read from ``src`` → (``{relative path: bytes}``, host name, notes).

    Each source runs under ``timeout_s`` (:func:`afddiag.collect.bounded`); a source that fails or
    times out leaves its file out and a note (in ``capture.json``). Never raises for a host problem.
    """
    from afddiag.collect import bounded

    src = src or Sources()
    notes: list[str] = []
    files: dict[str, bytes] = {}

    def dump(rel: str, obj: Any) -> None:
        files[rel] = (json.dumps(obj, indent=2, default=str) + "\n").encode()

    def guarded(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return bounded(fn, timeout_s, what)
        except Exception as e:  # noqa: BLE001 - recorded, the capture goes on
            notes.append(f"{what}: {type(e).__name__}: {e}")
            return None

    host = (guarded("hostname", src.hostname) or "unknown").strip() or "unknown"
    files["host"] = (host + "\n").encode()
    part: dict[str, bytes] = {}  # merged only when the whole tree was read: a timed-out read leaves no partial sys/
    part_notes: list[str] = []
    sysinfo = guarded("sysfs", lambda: capture_sysfs(src, part, part_notes))
    if sysinfo is None:
        sysinfo = {"hcas": [], "netdevs": [], "fw": {}}
    else:
        files.update(part)
        notes.extend(part_notes)
    got = guarded("device order", src.device_order)
    order, order_source = (got[0], got[1]) if got else (None, "failed")
    if got and got[2]:
        notes.extend(f"device order: {n}" for n in got[2])
    if order is not None:
        ib = os.path.join(src.root, "sys", "class", "infiniband")
        rows = []
        for name, idx in order:
            row: dict[str, Any] = {"ifindex": idx, "ifname": name}
            nt = _try(src, f"{ib}/{name}/node_type")
            if nt:
                row["node_type"] = nt.split(":", 1)[-1].strip().lower()
            fw = sysinfo["fw"].get(name)
            if fw:
                row["fw"] = fw
            guid = _try(src, f"{ib}/{name}/node_guid")
            if guid:
                row["node_guid"] = guid
            rows.append(row)
        dump("rdma-dev.json", rows)
    else:
        notes.append("rdma-dev.json not written: device index order unknown on this host")
    addrs = guarded("addresses", src.addresses)
    if addrs is not None:
        dump("ip-addr.json", ip_addr_json(src, addrs, sysinfo["netdevs"]))
    if src.route is not None:
        route = guarded("ip route", src.route)
        if route is not None:
            dump("ip-route.json", route)
    files["env"] = env_text(src.environ, notes).encode()
    gpu = guarded("GPU probe", src.gpu) if src.gpu is not None else None
    if isinstance(gpu, dict):
        dump("gpu.json", gpu)
    if src.limits is not None:
        lim = guarded("limits", src.limits)
        if lim is not None:
            dump("limits.json", lim)
    if src.cpu is not None:
        cpu = guarded("CPU probe", src.cpu)
        if isinstance(cpu, dict):
            dump("cpu.json", cpu)
    gv = (gpu or {}).get("versions") or {}
    osrel = files.get("proc/sys/kernel/osrelease", b"").decode().strip()
    rdma = guarded("rdma-core version", src.rdma_core) or {}
    versions = {  # kernel, bios and rdma_core are strings: afddiag.probes.route.read_versions reads them
        "kernel": osrel or gv.get("kernel") or (platform.release() if src.root == "/" else None),
        "bios": _dmi(src, "bios_version") or gv.get("bios"),
        "rdma_core": rdma.get("version"),
        "rdma_core_source": rdma.get("source"),
        "driver": (gpu or {}).get("driver_version"),
        "cuda_driver": (gpu or {}).get("cuda_driver_version"),
        "bios_vendor": _dmi(src, "bios_vendor"),
        "bios_date": _dmi(src, "bios_date"),
        "board": {k: _dmi(src, k) for k in ("sys_vendor", "product_name", "board_name")},
        "hca_firmware": sysinfo["fw"],
        "afddiag": __version__,
        "python": platform.python_version(),
    }
    dump("versions.json", versions)
    dump("capture.json", {"afddiag_version": __version__, "host": host,
                          "captured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                          "order_source": order_source, "files": sorted(files) + ["capture.json"], "notes": notes})
    return files, host, notes


def write_bundle(path: str | os.PathLike, src: Sources | None = None, timeout_s: float = 10.0) -> tuple[Path, list[str]]:
    """Collect (:func:`collect_bundle`) and write the bundle atomically at ``path`` → (path, notes).
    Raises OSError when ``path``'s folder cannot be written."""
    from afddiag.bundle import write_tar_gz

    files, host, notes = collect_bundle(src, timeout_s)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = re.sub(r"[^A-Za-z0-9_.\-]", "_", host)[:64] or "host"
    return write_tar_gz(path, files, top=f"afddiag-capture-{safe_host}-{stamp}"), notes


@click.command()
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The bundle to write (FILE.tar.gz); written atomically.")
@click.option("--load", is_flag=True, help="Run the GPU load probe too (~3 s a GPU): gpu.slow-state figures.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Time bound of each probe, seconds.")
def capture(output, load, timeout_s) -> int:
    """Capture what the probes read on this host into a bundle `--snapshot FILE.tar.gz` replays.

    Only the sysfs files the fabric probe reads, the device order, addresses, routes, the GPU,
    limits and CPU readings, versions, and allow-listed variables (DS41RT_*, NCCL_IB_HCA,
    NCCL_IB_GID_INDEX, NCCL_SOCKET_IFNAME, UCX_NET_DEVICES, MC_GID_INDEX, CUDA_VISIBLE_DEVICES,
    AFD_*) leave the host.
    """
    if not str(output).endswith((".tar.gz", ".tgz")):
        raise click.UsageError(f"--output {output}: give a name ending in .tar.gz")
    src = Sources(gpu=lambda: _live_gpu(timeout_s, load))
    try:
        path, notes = write_bundle(output, src, timeout_s)
    except OSError as e:
        from afddiag.atomic import output_error

        raise click.UsageError(output_error(f"--output {output}", e))
    for n in notes:
        click.echo(f"afddiag capture: note: {n}", err=True)
    click.echo(f"afddiag capture: wrote {os.path.getsize(path)} bytes; replay with "
               f"`afddiag all --snapshot {path}`", err=True)
    click.echo(str(path))
    return 0


__all__ = ["Sources", "capture", "capture_sysfs", "collect_bundle", "env_allowed", "ip_addr_json", "write_bundle"]
if __name__ == "__main__":  # pragma: no cover
    sys.exit(capture.main(standalone_mode=True))
