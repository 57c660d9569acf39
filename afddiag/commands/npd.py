"""``afddiag npd`` (click command): hands its arguments to :func:`afddiag.npd.main`, the one parser.

The console script answers ``afddiag npd`` before click loads (:mod:`afddiag.entry`); this command is
what ``afddiag --help`` lists and what ``python -m afddiag npd`` runs.
"""

from __future__ import annotations

import click

from afddiag import npd as npd_mode


@click.command(name="npd", add_help_option=False,
               context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def npd(args: tuple[str, ...]) -> int:
    """node-problem-detector plugin: one area's condition from the last full report (never probes);
    exit 0 OK, 1 problem, 2 unknown. `afddiag npd --help` for its options."""
    return npd_mode.main(list(args))
