"""``afddiag baseline record|show`` (click commands): options → :func:`afddiag.baseline_record.record_here`
or :func:`afddiag.baseline.load`, printed."""

from __future__ import annotations

import json

import click

from afddiag import baseline as bl
from afddiag import termsafe
from afddiag.atomic import output_error
from afddiag.baseline_record import record_here
from afddiag.commands.options import usage_errors


def _gpu_lines(gpus: dict) -> None:
    for uuid, g in gpus.items():
        click.echo(termsafe.line(f"  {g.get('name')} {uuid}: " + ", ".join(f"{k}={v}" for k, v in g.items()
                                                                            if k != "name")))


@click.group(name="baseline")
def baseline() -> None:
    """Record or show this host's healthy load figures (gpu.slow-state and host.cpu-clock compare to them)."""


@baseline.command("record")
@click.option("--path", "baseline_path", type=click.Path(dir_okay=False), help="Where to write (default: state dir).")
@click.option("--budget", "budget_s", type=click.FloatRange(0.5, 60), default=3.0, show_default=True,
              help="Load probe time per GPU, seconds.")
@click.option("--force", is_flag=True, help="Record even when the figures are no healthy baseline (a GPU gate "
              "FAILs, the GPU is busy, a figure is below the reference floor); the record is marked forced.")
def baseline_record(baseline_path, budget_s, force) -> int:
    """Run the GPU load probe and the CPU loop on this (healthy) host and store the figures.

    Refuses (exit 2, saying why) when a GPU gate would FAIL on them, the GPU is busy with another job,
    no GPU gave figures, a figure is below the reference table's floor for the model, the CPU loop
    ran on a busy host (samples that lost their core or disagree) or the CPU clock is stuck low; --force
    records anyway and marks the record forced."""
    try:
        r = record_here(baseline_path, budget_s, force)
    except OSError as e:
        raise click.UsageError(output_error(f"baseline {baseline_path or bl.default_path()}", e)) from None
    if r.failed:
        click.echo(termsafe.line(f"afddiag baseline record: {'; '.join(r.failed)}: nothing recorded"), err=True)
    elif r.problem:
        click.echo(f"afddiag baseline record: {r.problem}", err=True)
    elif r.code:
        click.echo("afddiag baseline record: not recorded: these figures are no healthy baseline:", err=True)
        for why in r.refused:
            click.echo(termsafe.line(f"  - {why}"), err=True)
        click.echo("  fix that and record again, or give --force to record them anyway (marked forced)", err=True)
    else:
        data = r.data or {}
        click.echo(f"recorded {len(data['gpus'])} GPU(s) and the CPU in {r.path}"
                   + (" (FORCED over: " + "; ".join(data.get("forced_over") or []) + ")" if data.get("forced") else ""))
        _gpu_lines(data["gpus"])
    return r.code


@baseline.command("show")
@click.option("--path", "baseline_path", type=click.Path(dir_okay=False),
              help="The baseline file to show (default: baseline.json in the state directory, $AFDDIAG_STATE_DIR).")
@click.option("--json", "as_json", is_flag=True, help="Print the baseline as JSON (stdout holds nothing else).")
def baseline_show(baseline_path, as_json) -> int:
    """Print the recorded baseline (exit 1 when none is recorded)."""
    with usage_errors():
        data, why = bl.load(baseline_path, strict=True)
    if data is None:
        click.echo(f"afddiag baseline show: {why}", err=True)
        return 1
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return 0
    # a baseline file is data (written by a host, maybe edited): each line escaped
    click.echo(termsafe.line(f"{data['path']}: host {data.get('host')}, recorded {data.get('recorded_at')}, "
                             "versions " + ", ".join(f"{k} {v}" for k, v in (data.get("versions") or {}).items())))
    _gpu_lines(data.get("gpus") or {})
    if data.get("cpu"):
        click.echo(termsafe.line("  cpu: " + ", ".join(f"{k}={v}" for k, v in data["cpu"].items())))
    return 0
