"""``afddiag capture`` (click command): options and usage errors; :mod:`afddiag.capture` collects and writes."""

from __future__ import annotations

import os
import shlex

import click

from afddiag.atomic import output_error
from afddiag.capture import write_bundle
from afddiag.commands.options import launch_opts, usage_errors
from afddiag.probes.registry import Sources


@click.command()
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False),
              help="The bundle to write (FILE.tar.gz); written atomically.")
@click.option("--load", is_flag=True, help="Run the GPU load probe too (~3 s a GPU): gpu.slow-state figures.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
              help="Time bound of each probe, seconds.")
@click.option("--fabric-ip", default=None, help="The launcher's fabric IPv4 address (routes are looked up from it).")
@click.option("--peer", "peers", multiple=True, help="A peer's fabric IPv4 address: its route (ip route get) is "
              "captured too, as a live run with --peer reads it (repeatable).")
@click.option("--expect-sm", type=click.IntRange(1, 100000), help="SM count the image's kernels were exported for.")
@launch_opts
def capture(output, load, timeout_s, fabric_ip, peers, expect_sm, **launch) -> int:
    """Capture what the probes read on this host into a bundle `--snapshot FILE.tar.gz` replays.

    The bundle keeps the inputs given here (fabric IP, peers, role, expectations, the launch env's
    allow-listed variables, credentials redacted); the replay judges against them unless its own flags
    say otherwise.

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
            raise click.UsageError(f"{v!r} is not an IPv4 address (give the dotted form, e.g. 10.9.0.2)") from None
    if not str(output).endswith((".tar.gz", ".tgz")):
        raise click.UsageError(f"--output {output}: give a name ending in .tar.gz")
    src = Sources.live()
    try:
        with usage_errors():
            path, notes = write_bundle(output, src, timeout_s, load=load, peers=tuple(peers), fabric_ip=fabric_ip,
                                       expect_sm=expect_sm, **launch)
    except OSError as e:
        raise click.UsageError(output_error(f"--output {output}", e)) from e
    for n in notes:
        click.echo(f"afddiag capture: note: {n}", err=True)
    kept = ([f"--fabric-ip {fabric_ip}"] if fabric_ip else []) + [f"--peer {p}" for p in peers] + [
        f"{flag} {shlex.quote(str(v))}" for flag, v in (("--role", launch.get("role")), ("--playbook",
        launch.get("playbook_path")), ("--launch-env", launch.get("launch_env_path")), ("--expect-sm", expect_sm),
        ("--expect-capacity", launch.get("expect_capacity"))) if v is not None]
    click.echo(f"afddiag capture: wrote {os.path.getsize(path)} bytes; replay with "
               f"`afddiag all --snapshot {shlex.quote(str(path))}`" + (
                   f" (it judges with the captured {' '.join(kept)}; flags given there override them)"
                   if kept else ""), err=True)
    click.echo(str(path))
    return 0
