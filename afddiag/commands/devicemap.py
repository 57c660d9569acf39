"""``afddiag devicemap`` (click command): options → :func:`afddiag.devicemap.devicemap`, its answer printed."""

from __future__ import annotations

import click

from afddiag import devicemap as dmlib
from afddiag import termsafe
from afddiag.commands.options import ipv4, usage_errors
from afddiag.gidtable import gid_rows, legend, write_gid_table
from afddiag.model.run import Inputs
from afddiag.render import terminal_width
from afddiag.report import format_devicemap, format_exports


def show_gids(answer: dmlib.Answer, fmt: str = "table", prefix: str = "afddiag") -> int:
    """A GID-table answer on stdout (the legend under a table), its messages on stderr; its exit code."""
    for line in answer.messages:
        click.echo(termsafe.line(f"{prefix}: {line}"), err=True)
    if answer.fabric is not None:
        rows = gid_rows(answer.fabric, answer.engine_device, answer.fabric_ip)
        foot = legend(rows, answer.engine_device, answer.engine_how, answer.fabric_ip) if fmt == "table" else []
        width = terminal_width() if fmt == "table" else None  # a terminal narrower than the table: the narrow layout
        write_gid_table(rows, foot, fmt, width=width)
    return answer.code


@click.command(name="devicemap")
@click.option("--snapshot", type=click.Path(),
              help="Read a snapshot directory (or a capture bundle) instead of this host.")
@click.option("--format", "fmt", type=click.Choice(list(dmlib.MAP_FORMATS)), default="env",
              show_default=True, help="nccl: NCCL_IB_HCA==dev:port and NCCL_IB_GID_INDEX for the fabric IP; table, "
              "csv: every GID (DEV PORT INDEX GID IPv4 VER NETDEV, show_gids order), marking the device the engine "
              "opens and the fabric IP's GID.")
@click.option("--fabric-ip", callback=ipv4, help="The launcher's fabric IPv4 address (for --format nccl|table|csv).")
def devicemap(snapshot, fmt, fabric_ip) -> int:
    """Print DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP for this host (each IPv4 RoCE v2 GID's address → its device,
    whatever the link does: stderr names an entry whose port is down).

    Exits 2 with a message on stderr when no address qualifies (table/csv: when there is no RDMA device),
    naming why (no device, the address there only as RoCE v1, a GID type not read, no IPv4 GID); 64 when
    --format nccl is asked on a host with several fabric IPs and no --fabric-ip (the caller's choice).
    """
    with usage_errors():
        answer = dmlib.devicemap(Inputs(snapshot=snapshot, fabric_ip=fabric_ip, run_qp=False), fmt)
    if fmt in ("table", "csv"):
        return show_gids(answer, fmt)
    for line in answer.messages:
        click.echo(termsafe.line(f"afddiag devicemap: {line}"), err=True)
    if answer.device_map is not None:
        click.echo(format_devicemap(answer.device_map, fmt))
    elif answer.exports is not None:
        click.echo(format_exports(answer.exports, "env"))
    return answer.code
