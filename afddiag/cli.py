"""Command line: ``afddiag fabric|gpu|all|devicemap|catalog``.

click parses; :func:`diagnose` gathers facts and runs gates; a reporter renders; the command
returns the exit code (2 FAIL, 3 ERROR, 1 WARN, 0 clean, 64 usage error).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Sequence

import click

from afddiag import __version__
from afddiag.collect import Inputs, SnapshotError, gather_live, gather_snapshot
from afddiag.verdict import EXIT_USAGE

FAMILIES = {"fabric": {"fabric"}, "gpu": {"gpu"}, "all": {"fabric", "gpu"}}


def _ipv4(ctx, param, value):
    vals = value if isinstance(value, tuple) else ((value,) if value else ())
    for v in vals:
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise click.BadParameter(f"{v!r} is not an IPv4 address (give the dotted form, e.g. 10.9.0.2)")
    return value


def diagnose(inputs: Inputs, families: set[str]) -> dict:
    """Gather facts (live or snapshot), run the gates of ``families``, return the JSON report.

    Raises :class:`~afddiag.collect.SnapshotError` when ``inputs.snapshot`` is not a directory.
    """
    from afddiag import report
    from afddiag.gates import Context, resolve_fabric_ip, run_gates

    want_fabric, want_gpu = "fabric" in families, "gpu" in families
    if inputs.snapshot:
        obs = gather_snapshot(inputs, want_fabric, want_gpu)
    else:
        obs = gather_live(inputs, want_fabric, want_gpu,
                          lambda fab: resolve_fabric_ip(fab, inputs.fabric_ip).ip)
    fip = resolve_fabric_ip(obs.fabric, inputs.fabric_ip)
    verdicts = run_gates(Context(obs, inputs, fip), families)
    notes = list(obs.notes) + (obs.fabric.notes if obs.fabric else []) + (obs.gpu.notes if obs.gpu else [])
    return report.build(
        verdicts, obs.host, obs.source,
        {"fabric_ip": fip.ip, "fabric_ip_source": fip.source, "peers": list(inputs.peers),
         "expect_sm": inputs.expect_sm, "snapshot": inputs.snapshot, "env_source": obs.env_source,
         "env": obs.env},
        obs.fabric, notes,
        {"fabric": obs.fabric, "qp": obs.qp,
         "gpu": {k: v for k, v in vars(obs.gpu).items() if k != "readings"} if obs.gpu else None})


def common(f):
    f = click.option("--snapshot", type=click.Path(file_okay=False), help="Read a snapshot directory instead of this host.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the JSON report alone on stdout.")(f)
    f = click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=10.0, show_default=True,
                     help="Time bound of each probe, seconds.")(f)
    return f


def fabric_opts(f):
    f = click.option("--fabric-ip", callback=_ipv4, help="The launcher's fabric IPv4 address.")(f)
    f = click.option("--peer", "peers", multiple=True, callback=_ipv4,
                     help="A peer's fabric IPv4 address to aim the QP test at (repeatable).")(f)
    f = click.option("--no-qp", is_flag=True, help="Skip the QP walk (fabric.qp-rtr says SKIP).")(f)
    f = click.option("--qp-timeout", type=click.FloatRange(0.1, 120), default=5.0, show_default=True,
                     help="Time bound of one device's QP walk, seconds.")(f)
    return f


def gpu_opts(f):
    return click.option("--expect-sm", type=click.IntRange(1, 100000),
                        help="SM count the image's kernels were exported for.")(f)


def _run(cmd: str, snapshot, as_json, timeout_s, fabric_ip=None, peers=(), no_qp=False, qp_timeout=5.0,
         expect_sm=None) -> int:
    from afddiag import report

    inputs = Inputs(fabric_ip=fabric_ip, peers=list(peers), expect_sm=expect_sm, snapshot=snapshot,
                    probe_timeout_s=timeout_s, qp_timeout_s=qp_timeout, run_qp=not no_qp)
    try:
        rep = diagnose(inputs, FAMILIES[cmd])
    except SnapshotError as e:
        raise click.UsageError(str(e))
    if as_json:
        report.write_json(rep)
    else:
        report.write_table(rep)
    return rep["exit_code"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="afddiag")
def cli() -> None:
    """Bring-up diagnostics for an attention-FFN-disaggregated fleet: RoCE v2 fabric and GPUs.

    Exit codes: 0 clean, 1 WARN, 2 FAIL, 3 ERROR, 64 usage error.
    """


@cli.command()
@common
@fabric_opts
def fabric(**kw) -> int:
    """RDMA devices, GIDs, the device the engine opens, and a QP walk to RTR."""
    return _run("fabric", **kw)


@cli.command()
@common
@gpu_opts
def gpu(**kw) -> int:
    """GPUs through NVML and the CUDA driver: SM count, memory, clocks event reasons, slow state."""
    return _run("gpu", **kw)


@cli.command(name="all")
@common
@fabric_opts
@gpu_opts
def all_(**kw) -> int:
    """Every gate: fabric and GPU."""
    return _run("all", **kw)


@cli.command()
@click.option("--snapshot", type=click.Path(file_okay=False), help="Read a snapshot directory instead of this host.")
@click.option("--format", "fmt", type=click.Choice(["env", "shell", "json"]), default="env", show_default=True)
def devicemap(snapshot, fmt) -> int:
    """Print DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP for this host (IPv4 RoCE v2 GIDs on ACTIVE ports).

    Exits 2 with a message on stderr when no address qualifies.
    """
    from afddiag import report

    inputs = Inputs(snapshot=snapshot, run_qp=False)
    try:
        obs = gather_snapshot(inputs, True, False) if snapshot else gather_live(inputs, True, False, lambda f: None)
    except SnapshotError as e:
        raise click.UsageError(str(e))
    dm = report.device_map(obs.fabric)
    if not dm:
        click.echo("afddiag devicemap: no IPv4 RoCE v2 GID on an ACTIVE port: put the fabric address on the "
                   "RoCE netdev first (afddiag fabric says more)", err=True)
        return 2
    click.echo(report.format_devicemap(dm, fmt))
    return 0


@cli.command()
@click.option("--markdown", is_flag=True, help="Print docs/GATES.md.")
def catalog(markdown) -> int:
    """List the gates (or print docs/GATES.md with --markdown)."""
    from afddiag import catalog as cat

    if markdown:
        click.echo(cat.markdown(), nl=False)
    else:
        for gid, g in cat.load()["gates"].items():
            click.echo(f"{gid:<22} {g['title']}")
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (no ``sys.exit``)."""
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="afddiag", standalone_mode=False)
    except click.UsageError as e:
        click.echo(f"afddiag: {e.format_message()}", err=True)
        if e.ctx is not None:
            click.echo(f"Try '{e.ctx.command_path} --help'.", err=True)
        return EXIT_USAGE
    except click.Abort:
        click.echo("afddiag: aborted", err=True)
        return 130
    except click.ClickException as e:
        e.show()
        return EXIT_USAGE
    return rv if isinstance(rv, int) else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: run and exit with the code."""
    sys.exit(run(argv))
