"""The options several commands share (click decorators), and the one way a library error becomes a
usage error (exit 64): each command parses its options into the library's inputs, calls one library
function, renders its result and returns the exit code."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any

import click

from afddiag.atomic import output_error
from afddiag.collect import SnapshotError
from afddiag.history import record_run
from afddiag.inputs import InputsError, Resolved
from afddiag.inputs import resolve as resolve_inputs
from afddiag.model.run import Inputs
from afddiag.reader import InputError
from afddiag.render import DEFAULT_VIEW, View
from afddiag.report import REPORTERS, FormatError, choose_format, emit


def ipv4(ctx, param, value):
    """click callback: each value a dotted IPv4 address, else a usage error naming it."""
    vals = value if isinstance(value, tuple) else ((value,) if value else ())
    for v in vals:
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise click.BadParameter(f"{v!r} is not an IPv4 address (give the dotted form, e.g. 10.9.0.2)") from None
    return value


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """The library's one-line refusals of what the user named (a flag combination, a launch env, a
    playbook, a snapshot, a --baseline file, an output format) as usage errors (exit 64)."""
    try:
        yield
    except (InputsError, FormatError, SnapshotError, InputError) as e:
        raise click.UsageError(str(e)) from None


def inputs_from(**flags) -> Inputs:
    """Flags → :class:`~afddiag.model.run.Inputs` (:func:`afddiag.inputs.resolve`); its notes (a role
    given twice) on stderr."""
    with usage_errors():
        r: Resolved = resolve_inputs(**flags)
    for note in r.notes:
        click.echo(f"afddiag: {note}", err=True)
    return r.inputs


def output_format(as_json: bool, fmt: str | None) -> str:
    """``--json``/``--format`` → one :data:`afddiag.report.REPORTERS` name (a usage error when they
    disagree or the format cannot run here), checked before any probing."""
    with usage_errors():
        return choose_format(as_json, fmt)


def keep(report: Mapping[str, Any], command: str, enabled: bool, busy_s: float | None) -> None:
    """Append the run to the local history store (:func:`afddiag.history.record_run`, which never raises)."""
    record_run(report, command, enabled=enabled, busy_s=busy_s)


def table_view(fmt: str, all_rows: bool = False, quiet: bool = False) -> View:
    """``--all``/``--quiet`` → the table's :class:`~afddiag.render.View`; a usage error when they are
    given together or with another format than the table (JSON and metrics always hold every gate)."""
    if all_rows and quiet:
        raise click.UsageError("--all lists every gate's row and --quiet prints the diagnosis alone: give one of them")
    if fmt != "table" and (all_rows or quiet):
        flag = "--all" if all_rows else "--quiet"
        raise click.UsageError(f"{flag} shapes the table; --format {fmt} always holds every gate (for the "
                               "diagnosis alone in JSON: `--json | jq .diagnosis`)")
    return View(all_rows=all_rows, quiet=quiet)


def write_report(report: Mapping[str, Any], fmt: str, output: str | None, command: str, flag: str = "--output",
                 view: View = DEFAULT_VIEW) -> None:
    """:func:`afddiag.report.emit`; a target that cannot be written is a usage error naming ``flag``."""
    if output is None:
        emit(report, fmt, None, command, view)  # a closed pipe is the group's to end quietly (141)
        return
    try:
        emit(report, fmt, output, command, view)
    except OSError as e:
        raise click.UsageError(output_error(f"{flag} {output}", e)) from None


def common(f):
    f = click.option("--snapshot", type=click.Path(), help="Read a snapshot directory (or an `afddiag capture` "
                     "bundle, FILE.tar.gz) instead of this host.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the JSON report alone on stdout.")(f)
    f = click.option("--format", "fmt", type=click.Choice(list(REPORTERS)), default=None,
                     help="table (default), json (= --json), or prometheus (node_exporter textfile collector).")(f)
    f = click.option("--output", "output", type=click.Path(dir_okay=False),
                     help="Write the report to FILE (atomically: temp file + rename) instead of stdout.")(f)
    f = click.option("--no-history", is_flag=True, help="Do not append this run to the local history store.")(f)
    f = click.option("--gate", "gates", multiple=True, metavar="PATTERN",
                     help="Run only the gates whose id matches PATTERN (a shell glob: 'fabric.*', gpu.memory; "
                     "repeatable) and the gates they depend on, with only the probes they read. Such a run is not "
                     "kept in the history.")(f)
    f = click.option("--all", "all_rows", is_flag=True, help="List every gate's row on a terminal too (a terminal "
                     "folds the SKIP rows into one count line; a pipe or file always gets every row).")(f)
    f = click.option("--quiet", "-q", "quiet", is_flag=True, help="Print the diagnosis alone (each fault, its remedy "
                     "and action, in the order to fix them): no table.")(f)
    f = click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=None,
                     help="Time bound of each probe, seconds (default: the playbook's [timeouts], 10 s); a probe "
                     "past it gives ERROR for its own gates. The CPU probe needs at least 0.5 s to measure: a shorter "
                     "bound leaves its loop unstarted (host.cpu-clock ERROR naming the bound).")(f)
    return f


def fabric_opts(f):
    f = click.option("--fabric-ip", callback=ipv4, help="The launcher's fabric IPv4 address.")(f)
    f = click.option("--peer", "peers", multiple=True, callback=ipv4,
                     help="A peer's fabric IPv4 address to aim the QP test at (repeatable); with `fabric --serve`: "
                     "the one client the pair server accepts.")(f)
    f = click.option("--no-qp", is_flag=True, help="Skip the QP walk (fabric.qp-rtr says SKIP).")(f)
    f = click.option("--qp-timeout", type=click.FloatRange(0.1, 120), default=None,
                     help="Time bound of one device's QP walk, seconds (default: the playbook's qp_s, 5 s).")(f)
    return f


def gpu_opts(f):
    f = click.option("--expect-sm", type=click.IntRange(1, 100000),
                     help="SM count the image's kernels were exported for.")(f)
    f = click.option("--load", is_flag=True, help="Run the GPU load probe (FP32, BF16, GEMV, copy; ~3 s a GPU) "
                     "for gpu.slow-state (the expert playbook turns it on).")(f)
    f = click.option("--no-load", is_flag=True, help="No load probe, even where the playbook asks for it (a node "
                     "running jobs: the slurm health check passes it on allocated nodes).")(f)
    f = click.option("--baseline", "baseline_path", type=click.Path(exists=True, dir_okay=False),
                     help="Baseline file (default: the user's state directory).")(f)
    f = click.option("--xid-log", type=click.Path(dir_okay=False, exists=True),
                     help="A saved kernel log (dmesg, journalctl -k) to read Xid events and the NIC's lines "
                     "(mlx5, CX-7 hot-plug) from instead of /dev/kmsg.")(f)
    return f


def launch_opts(f):
    f = click.option("--role", help="Role playbook: coordinator, expert, generic, or a site's "
                     "(default: AFD_ROLE from --launch-env, else generic).")(f)
    f = click.option("--playbook", "playbook_path", type=click.Path(dir_okay=False),
                     help="A playbook file instead of a role name.")(f)
    f = click.option("--launch-env", "launch_env_path", type=click.Path(dir_okay=False),
                     help="The launcher's KEY=VALUE env file (AFD_FABRIC_IP, capacities, AFD_IMAGE, the map).")(f)
    f = click.option("--engine-log", type=click.Path(dir_okay=False, exists=True),
                     help="The engine's output run with NCCL_DEBUG=INFO: what NCCL chose (HCA, port, GID index, "
                     "socket fallback) is checked against the device map and the fabric IP.")(f)
    f = click.option("--expect-capacity", type=click.IntRange(1, 1 << 20),
                     help="The other side's capacity flag (ranks' for a coordinator, coordinator's for a rank).")(f)
    return f
