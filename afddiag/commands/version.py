"""``afddiag version`` (click command): afddiag's version and commit, Python, rdma-core and pyverbs,
the NVIDIA driver, each with where it came from (:func:`afddiag.probes.buildinfo.build_info`).
``afddiag --version`` stays the one-line fast path (:mod:`afddiag.entry`)."""

from __future__ import annotations

import json

import click

from afddiag.probes.buildinfo import build_info
from afddiag.termsafe import line


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON ([{name, value, source}]).")
def version(as_json: bool) -> int:
    """afddiag's version and commit, Python, rdma-core/pyverbs and the NVIDIA driver, each with its source."""
    rows = build_info()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return 0
    w = max(len(r["name"]) for r in rows)
    for r in rows:
        click.echo(line(f"{r['name']:<{w}}  {r['value']}  [{r['source']}]"))
    return 0
