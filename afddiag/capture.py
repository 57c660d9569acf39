"""``afddiag capture``: everything the probes read on this host, as a bundle ``--snapshot`` replays.

The bundle (a ``.tar.gz`` with one top folder ``afddiag-capture-<host>-<UTC time>/``) holds what
each probe of :data:`afddiag.probes.registry.PROBES` reads, as its artifacts (the registry's
docstring and entries list them): the sysfs files of the fabric probe (attributes of empty GID
slots left out, ``gid_attrs/EINVAL-SLOTS`` listing them), the device order, addresses, routes,
ARP sysctls, the GPU, limits and CPU readings, versions, allow-listed variables
(:data:`~afddiag.probes.registry.ENV_ALLOW` and ``AFD_*``; nothing else leaves the host), the
host name and a manifest. The reads are the live run's (:func:`afddiag.runner.capture`), so a
replay gives the live run's verdicts, the QP walk aside.

Every host source is a field of :class:`Sources`, so a test points the capture at a fake root and
fake readings. Probes only read; the bundle is written atomically (temp file + rename).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import sys
from pathlib import Path

import click

from afddiag.probes.registry import ENV_ALLOW, ENV_ALLOW_PREFIX, Sources, env_allowed, env_text  # noqa: F401


def collect_bundle(src: Sources | None = None, timeout_s: float = 10.0, load: bool = False,
                   peers: tuple[str, ...] = (), fabric_ip: str | None = None) -> tuple[dict[str, bytes], str, list[str]]:
    """Read everything the probes read from ``src`` (default this host) → (``{relative path: bytes}``,
    host name, notes): :func:`afddiag.runner.capture`. ``load`` runs the GPU load probe too;
    ``peers``/``fabric_ip`` add the routes to the peers. Each probe runs under ``timeout_s``; one
    that fails or times out leaves its files out and a note (in the manifest). Never raises for a
    host problem."""
    from afddiag import runner
    from afddiag.model.run import Inputs

    inputs = Inputs(probe_timeout_s=timeout_s, load=load, peers=list(peers), fabric_ip=fabric_ip, run_qp=False)
    return runner.capture(inputs, src, timeout_s)


def write_bundle(path: str | os.PathLike, src: Sources | None = None, timeout_s: float = 10.0,
                 **kw) -> tuple[Path, list[str]]:
    """Collect (:func:`collect_bundle`, ``kw`` passed on) and write the bundle atomically at ``path``
    → (path, notes). Raises OSError when ``path``'s folder cannot be written."""
    from afddiag.bundle import write_tar_gz

    files, host, notes = collect_bundle(src, timeout_s, **kw)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = re.sub(r"[^A-Za-z0-9_.\-]", "_", host)[:64] or "host"
    return write_tar_gz(path, files, top=f"afddiag-capture-{safe_host}-{stamp}"), notes


@click.command()
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The bundle to write (FILE.tar.gz); written atomically.")
@click.option("--load", is_flag=True, help="Run the GPU load probe too (~3 s a GPU): gpu.slow-state figures.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Time bound of each probe, seconds.")
@click.option("--fabric-ip", default=None, help="The launcher's fabric IPv4 address (routes are looked up from it).")
@click.option("--peer", "peers", multiple=True, help="A peer's fabric IPv4 address: its route (ip route get) is "
              "captured too, as a live run with --peer reads it (repeatable).")
def capture(output, load, timeout_s, fabric_ip, peers) -> int:
    """Capture what the probes read on this host into a bundle `--snapshot FILE.tar.gz` replays.

    Only the sysfs files the fabric probe reads, the device order, addresses, routes, the GPU,
    limits and CPU readings, versions, and allow-listed variables (DS41RT_*, NCCL_IB_HCA,
    NCCL_IB_GID_INDEX, NCCL_SOCKET_IFNAME, UCX_NET_DEVICES, MC_GID_INDEX, CUDA_VISIBLE_DEVICES,
    AFD_*) leave the host.
    """
    import ipaddress

    for v in ([fabric_ip] if fabric_ip else []) + list(peers):
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise click.UsageError(f"{v!r} is not an IPv4 address (give the dotted form, e.g. 10.9.0.2)")
    if not str(output).endswith((".tar.gz", ".tgz")):
        raise click.UsageError(f"--output {output}: give a name ending in .tar.gz")
    src = Sources()
    try:
        path, notes = write_bundle(output, src, timeout_s, load=load, peers=tuple(peers), fabric_ip=fabric_ip)
    except OSError as e:
        from afddiag.atomic import output_error

        raise click.UsageError(output_error(f"--output {output}", e))
    for n in notes:
        click.echo(f"afddiag capture: note: {n}", err=True)
    click.echo(f"afddiag capture: wrote {os.path.getsize(path)} bytes; replay with "
               f"`afddiag all --snapshot {path}`", err=True)
    click.echo(str(path))
    return 0


__all__ = ["Sources", "capture", "collect_bundle", "env_allowed", "write_bundle"]
if __name__ == "__main__":  # pragma: no cover
    sys.exit(capture.main(standalone_mode=True))
