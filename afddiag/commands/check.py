"""``afddiag gpu`` and ``afddiag all`` (click commands), and :func:`run_check`, which ``afddiag fabric``
shares: options → inputs, :func:`afddiag.check.check`, the report through one reporter."""

from __future__ import annotations

import click

from afddiag.check import check
from afddiag.commands.options import (
    common,
    fabric_opts,
    gpu_opts,
    inputs_from,
    keep,
    launch_opts,
    output_format,
    table_view,
    usage_errors,
    write_report,
)
from afddiag.inputs import FAMILIES


def run_check(command: str, as_json: bool = False, fmt: str | None = None, output: str | None = None,
              no_history: bool = False, all_rows: bool = False, quiet: bool = False, **flags) -> int:
    """One ``fabric``/``gpu``/``all`` run: the format and view checked first, then the run, then the report."""
    fmt = output_format(as_json, fmt)
    view = table_view(fmt, all_rows, quiet)
    inputs = inputs_from(families=FAMILIES[command], **flags)
    with usage_errors():
        rep = check(command, inputs)
    keep(rep, command, not no_history and inputs.gates is None, inputs.probe_timeout_s)  # part of a host: not kept
    write_report(rep, fmt, output, command, view=view)
    return rep["exit_code"]


@click.command()
@common
@gpu_opts
@launch_opts
def gpu(**kw) -> int:
    """GPUs through NVML and the CUDA driver: SM count, memory, clocks event reasons, slow state."""
    return run_check("gpu", **kw)


@click.command(name="all")
@common
@fabric_opts
@gpu_opts
@launch_opts
def all_(**kw) -> int:
    """Every gate of the role: fabric, GPU and launch."""
    return run_check("all", **kw)
