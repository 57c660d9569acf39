"""The click commands :mod:`afddiag.cli` loads lazily (``LAZY_COMMANDS``): only the CLI imports click.

Each module here parses options and turns errors into usage errors; the work is the plain functions
of :mod:`afddiag.capture`, :mod:`afddiag.history` and :mod:`afddiag.fleet`.
"""
