"""``afddiag history`` (click command): options and messages; :mod:`afddiag.history` reads the store."""

from __future__ import annotations

import json
import sqlite3

import click

from afddiag.history import default_path, summarize, write_history


@click.command()
@click.option("--gate", help="Only this gate (an id, or a glob such as 'fabric.*').")
@click.option("--host", help="Only runs of this host (a replayed bundle records under its own host).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--path", "path", type=click.Path(dir_okay=False), help="The store (default: state dir/history.sqlite3).")
def history(gate, host, as_json, path) -> int:
    """When each gate's verdict changed, and the load-probe drift vs the last gpu.slow-state PASS.

    Reads the local store every fabric/gpu/all/preflight run appends to (unless --no-history).
    Exit 1 when nothing is recorded yet, or no recorded gate matches --gate.
    """
    try:
        s = summarize(path, gate, host)
    except FileNotFoundError as e:
        click.echo(f"afddiag history: {e}", err=True)
        return 1
    except sqlite3.Error as e:
        click.echo(f"afddiag history: {path or default_path()}: {e}", err=True)
        return 1
    if gate and s["hosts"] and not any(h["gates"] for h in s["hosts"].values()):
        click.echo(f"afddiag history: no recorded gate matches {gate!r} (ids as in `afddiag catalog`)", err=True)
        return 1
    if as_json:
        click.echo(json.dumps(s, indent=2))
    else:
        write_history(s)
    return 0 if s["hosts"] else 1
