"""``afddiag history`` (click command): options and messages; :mod:`afddiag.history` reads the store."""

from __future__ import annotations

import json
import sqlite3

import click

from afddiag.history import default_path, summarize, write_history


@click.command()
@click.option("--gate", help="Only this gate (an id, or a glob such as 'fabric.*').")
@click.option("--host", help="Only runs of this host (a replayed bundle records under its own host).")
@click.option("--command", "command", type=click.Choice(["fabric", "gpu", "all", "preflight"]),
              help="Compare the runs of this command (default: the command of each host's latest run).")
@click.option("--role", help="Compare the runs of this role (default: the role of each host's latest run).")
@click.option("--replays", is_flag=True, help="Show the snapshot replays (--snapshot runs: other hosts' data "
              "judged here) instead of this node's live runs; they are never mixed.")
@click.option("--all-gates", "all_gates", is_flag=True, help="List every gate, not only those whose verdict changed.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--path", "path", type=click.Path(dir_okay=False), help="The store (default: state dir/history.sqlite3).")
def history(gate, host, command, role, replays, all_gates, as_json, path) -> int:
    """When each gate's verdict changed, and the load-probe drift vs the last gpu.slow-state PASS.

    Reads the local store every fabric/gpu/all/preflight run appends to (unless --no-history). Shows
    this node's live runs (--replays: the snapshot replays, apart), per host the runs of one command
    and role (those of its latest run unless --command/--role say), the gates whose verdict changed.
    Exit 1 when nothing is recorded yet, or no recorded gate matches --gate.
    """
    try:
        s = summarize(path, gate, host, replays=replays, command=command, role=role, changed_only=not all_gates)
    except FileNotFoundError as e:
        click.echo(f"afddiag history: {e}", err=True)
        return 1
    except (sqlite3.Error, OSError) as e:
        click.echo(f"afddiag history: {path or default_path()}: {getattr(e, 'strerror', None) or e}", err=True)
        return 1
    if s.get("damaged") and as_json:
        click.echo(f"afddiag: {s['damaged']}", err=True)
    if gate and s["hosts"] and not any(h["gates"] or h["unchanged"] for h in s["hosts"].values()):
        click.echo(f"afddiag history: no recorded gate matches {gate!r} (ids as in `afddiag catalog`)", err=True)
        return 1
    if as_json:
        click.echo(json.dumps(s, indent=2))
    else:
        write_history(s)
    return 0 if s["hosts"] else 1
