"""``afddiag catalog`` and ``afddiag schema`` (click commands): the gate list and the JSON Schemas."""

from __future__ import annotations

from importlib import resources

import click

from afddiag import catalog as cat
from afddiag.render import terminal_width


@click.command(name="catalog")
@click.option("--markdown", is_flag=True, help="Print docs/GATES.md.")
def catalog(markdown) -> int:
    """List the gates (or print docs/GATES.md with --markdown)."""
    if markdown:
        click.echo(cat.markdown(), nl=False)
    else:
        for line in cat.listing(terminal_width()):
            click.echo(line)
    return 0


@click.command(name="schema")
@click.argument("which", type=click.Choice(["report", "fleet"]), default="report")
def schema(which) -> int:
    """Print the JSON Schema of `afddiag all --json` (report) or of `afddiag fleet|merge --json` (fleet)."""
    click.echo(resources.files("afddiag.schema").joinpath(f"{which}.schema.json").read_text(encoding="utf-8"),
               nl=False)
    return 0
