"""The ``afddiag`` console script: ``afddiag --version`` answered without loading click or the CLI
(start-up budget: at most 3x a bare ``python3 -c pass``, ``benchmarks/startup.py``), ``afddiag npd``
(a node-problem-detector plugin, run three at a time every 30 s: :mod:`afddiag.npd`) likewise; anything
else runs :func:`afddiag.cli.main`.

The CLI is imported inside :func:`main` on purpose: importing it is the cost this module exists to
skip for ``--version`` (click alone is ~20 ms of a ~50 ms start).
"""

from __future__ import annotations

import os
import sys

from afddiag import __version__
from afddiag.exitcodes import EXIT_ERROR, EXIT_SIGPIPE, unexpected_line


def main() -> None:
    """Print the version as click's ``version_option`` does, or run the CLI with ``sys.argv``."""
    if sys.argv[1:] == ["--version"]:
        try:
            sys.stdout.write(f"afddiag, version {__version__}\n")
            sys.stdout.flush()
        except OSError as e:  # the reader left (141), or stdout failed (`> /dev/full`): one line, exit 3
            if not isinstance(e, BrokenPipeError):
                print(unexpected_line(e), file=sys.stderr, flush=True)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit must not fail again
            sys.exit(EXIT_SIGPIPE if isinstance(e, BrokenPipeError) else EXIT_ERROR)
        sys.exit(0)
    if sys.argv[1:2] == ["npd"]:
        from afddiag.npd import main as npd_main

        sys.exit(npd_main(sys.argv[2:]))
    from afddiag.cli import main as cli_main

    cli_main()
