"""``afddiag preflight`` (click command): options → :func:`afddiag.preflight.preflight`, its verdict as
one line (fit) or the faults (not fit), :func:`afddiag.preflight.settle_node`, the export lines."""

from __future__ import annotations

import click

from afddiag.commands.options import (
    fabric_opts,
    gpu_opts,
    inputs_from,
    keep,
    launch_opts,
    output_format,
    usage_errors,
    write_report,
)
from afddiag.inputs import FAMILIES
from afddiag.model.run import Inputs
from afddiag.preflight import PreflightOptions, PreflightResult, preflight, settle_node
from afddiag.render import action_tag
from afddiag.report import format_exports


def _verdict(r: PreflightResult, as_json: bool = False) -> None:
    c = r.report["counts"]
    if r.fit:
        line = (f"afddiag preflight: {r.role} on {r.host}: OK ({c['PASS']} pass, {c['WARN']} warn, "
                f"{c['SKIP']} skip)" + (f"; warn: {', '.join(r.warned)}" if r.warned else ""))
        click.echo(line, err=r.options.export or as_json)
        return
    click.echo(f"afddiag preflight: {r.role} on {r.host}: NOT FIT (exit {r.verdict_code})", err=True)
    for d in r.faults:
        click.echo(f"  {d['verdict']} {d['gate']}: {d['summary']}", err=True)
        click.echo(f"       remedy: {d['remedy']} {action_tag(d)}", err=True)
        for cmd in d.get("commands") or []:
            click.echo(f"         {cmd}", err=True)
        if d["explains"]:
            click.echo(f"       explains: {', '.join(d['explains'])}", err=True)
    if r.options.drain and not r.needs_drain:
        click.echo("afddiag preflight --drain: not drained: no fault's action needs the node drained ("
                   + ", ".join(sorted({d["action"] for d in r.faults})) + "): the remedies above need no person on "
                   "the node", err=True)


def _exports(ex: dict) -> None:
    if ex["kept"]:
        click.echo(f"afddiag preflight --export: kept the launch env's {', '.join(ex['kept'])} "
                   f"({ex['env_source']}); printing only what it does not set"
                   + (f" or fabric.devicemap-env FAILed on ({', '.join(ex['replaced'])})" if ex.get("replaced")
                      else ""), err=True)
    for note in ex["notes"]:
        click.echo(f"afddiag preflight --export: {note}", err=True)
    if ex["pairs"]:
        click.echo(format_exports(ex["pairs"], "shell"))


def preflight_json(r: PreflightResult) -> dict:
    """The JSON ``preflight --json`` prints: the judged report (as ``afddiag all --json``'s) with the
    launch hook's decision under ``preflight``: ``fit``, ``exit_code`` (what the command exits),
    ``verdict_code`` (the report's, WARN made 0 without ``strict``), ``strict``, ``exit_for``,
    ``faults`` and ``needs_drain`` (gate ids), and with ``--export`` the ``exports`` it would print
    (``[{"name", "value"}]``, empty when not fit) and the variables ``kept`` from the launch env."""
    pre: dict = {"fit": r.fit, "exit_code": r.code, "verdict_code": r.verdict_code, "strict": r.options.strict,
                 "exit_for": r.options.exit_for, "faults": [d["gate"] for d in r.faults],
                 "needs_drain": [d["gate"] for d in r.needs_drain]}
    if r.export is not None:
        pre["exports"] = [{"name": k, "value": v} for k, v in r.export["pairs"]] if r.code == 0 else []
        pre["kept"] = list(r.export["kept"])
    return {**r.report, "preflight": pre}


def show(inputs: Inputs, options: PreflightOptions, prom_path: str | None = None, history: bool = True,
         as_json: bool = False) -> int:
    """Judge (:func:`afddiag.preflight.preflight`), keep the run in history, print the verdict (stderr
    with ``as_json``, the JSON of :func:`preflight_json` alone on stdout), act on the Slurm node, print
    the export lines and write the metrics to ``prom_path``; the exit code."""
    with usage_errors():
        r = preflight(inputs, options)
    keep(r.report, "preflight", history, inputs.probe_timeout_s)
    if r.export and r.export["fixed"]:
        click.echo(f"afddiag preflight --export: judged with the lines it prints, which fix "
                   f"{', '.join(r.export['fixed'])}", err=True)
    _verdict(r, as_json)
    settle_node(r)
    if as_json:
        write_report(preflight_json(r), "json", None, "preflight")
    elif r.export is not None and r.code == 0:
        _exports(r.export)
    if prom_path:
        write_report(r.report, "prometheus", prom_path, "preflight", flag="--prom")
    return r.code


@click.command(name="preflight")
@click.option("--snapshot", type=click.Path(),
              help="Read a snapshot directory (or a capture bundle) instead of this host.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=None,
              help="Time bound of each probe, seconds (default: the playbook's [timeouts]).")
@click.option("--drain", is_flag=True, help="When not fit, drain this Slurm node: `scontrol update nodename=<node> "
              "state=drain reason=\"afddiag: <gate>: <summary>\"` (for HealthCheckProgram; $AFDDIAG_SCONTROL overrides "
              "scontrol); a drain someone else set is never overwritten.")
@click.option("--resume", is_flag=True, help="When fit, resume this Slurm node if afddiag drained it (its reason "
              "starts with 'afddiag:'); any other drain stays.")
@click.option("--prom", "prom_path", type=click.Path(dir_okay=False),
              help="Also write this run's metrics for node_exporter's textfile collector to FILE (atomically).")
@click.option("--no-history", is_flag=True, help="Do not append this run to the local history store.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report alone on stdout (as `afddiag all --json`, "
              "with the launch hook's decision under `preflight`: fit, exit_code, faults, needs_drain, and with "
              "--export the exports); the verdict line goes to stderr.")
@fabric_opts
@gpu_opts
@launch_opts
@click.option("--strict", is_flag=True, help="WARN fails the preflight too (exit 1).")
@click.option("--exit-for", "exit_for", type=click.Choice(["any", "drain"]), default="any", show_default=True,
              help="drain: exit non-zero only when a fault's action needs the node drained (RESET_GPU, REBOOT, "
                   "AC_POWER_CYCLE, HW_INSPECTION, FIX_LINK, ...), for a Slurm Prolog, whose failure drains the node.")
@click.option("--export", "export", is_flag=True,
              help="Print the lines the launcher evaluates (device map, NCCL_IB_HCA, NCCL_IB_GID_INDEX, "
                   "UCX_NET_DEVICES, MC_GID_INDEX) on stdout, and judge the launch as it will be with them (a fault "
                   "they fix, such as no device map, no longer stops the launch; any other still does); one the "
                   "launch env already sets is kept, not printed, unless fabric.devicemap-env FAILed on that variable "
                   "(named on stderr). NCCL_IB_GID_INDEX printed is always the index of the NCCL_IB_HCA in effect "
                   "(kept or printed); when none suits it, it is left out and stderr says why.")
def preflight_command(strict, exit_for, export, drain, resume, prom_path, no_history, as_json, **kw) -> int:
    """Launch hook: run the role's gates; one line on success, the failing gates otherwise.

    Exit codes as `afddiag all`, except that WARN exits 0 unless --strict. With --drain a host that
    is not fit also drains its Slurm node (Slurm ignores a HealthCheckProgram's exit code), only when
    a fault's typed action needs it (a launch-setting fix or a busy GPU never drains) and unless
    someone else drained it; with --resume the node is resumed when afddiag drained it and no fault
    left needs a drain (afddiag/slurm.py). --prom FILE writes the same run's metrics.
    """
    if (drain or resume) and kw.get("snapshot"):
        raise click.UsageError(f"--{'drain' if drain else 'resume'} acts on this Slurm node, and --snapshot judges "
                               "another host's data: give one of them")
    if prom_path:
        output_format(False, "prometheus")
    inputs = inputs_from(families=FAMILIES["preflight"], **kw)
    options = PreflightOptions(strict=strict, exit_for=exit_for, export=export, drain=drain, resume=resume)
    return show(inputs, options, prom_path, history=not no_history, as_json=as_json)

