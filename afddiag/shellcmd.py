"""Remedy commands: complete shell commands a person pastes, built so a value read from a host stays one word.

A remedy is prose plus commands (a verdict's ``commands``): each command is one complete line that
``bash -n`` accepts, every host-derived value (netdev, device, GID index, address, MTU, a launch
file's value) quoted with :func:`shlex.quote`, so a netdev named ``a b`` or ``$(reboot)`` is one word
and nothing in it runs. A setting in a launch file is ``export NAME=value`` (:func:`export`); where no
safe command exists a remedy has none, never prose in place of a command. :func:`lines` lays a command
out on a terminal without changing what the shell reads. Pure string functions.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Mapping

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def command(*words: object) -> str:
    """One simple command of ``words``, each quoted (``command("sudo", "ip", "link", "set", "dev", nd, "up")``)."""
    return shlex.join(str(w) for w in words)


def export(name: str, value: object) -> str:
    """``export NAME=value`` with the value quoted. Raises ValueError when ``name`` is not a shell
    variable name (it is code's, never a host's: a launch file's variable names are checked there)."""
    if not _NAME.match(name):
        raise ValueError(f"not a shell variable name: {name!r}")
    return f"export {name}={shlex.quote(str(value))}"


def unset(name: str) -> str:
    """``unset NAME`` (``name`` checked as :func:`export` does)."""
    if not _NAME.match(name):
        raise ValueError(f"not a shell variable name: {name!r}")
    return f"unset {name}"


def fill(template: str, values: Mapping[str, object]) -> str:
    """``template`` (``str.format`` fields, e.g. ``sudo ip link set dev {netdev} mtu {mtu}``) with each
    value quoted as one word. Raises KeyError for a field ``values`` lacks. A field must stand where a
    word does, never inside quotes (tests fill every catalog template with hostile values)."""
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    return template.format(**{f: shlex.quote(str(values[f])) for f in fields})


def _breaks(cmd: str) -> list[tuple[int, str]]:
    """``(index, quote)`` after which ``cmd`` may break: after a space outside quotes or a comma
    anywhere (``quote``: the quote open there, "" outside), never at its end."""
    out, quote, i = [], "", 0
    while i < len(cmd):
        ch = cmd[i]
        if quote == "'":
            quote = "" if ch == "'" else quote
            if ch == ",":
                out.append((i + 1, quote))
        elif ch == "\\":
            i += 1  # the escaped character is part of the word
        elif ch in "'\"" and quote in ("", ch):
            quote = "" if quote else ch
        elif ch == "," or (ch == " " and not quote):
            out.append((i + 1, quote))
        i += 1
    return [b for b in out if b[0] < len(cmd)]


def lines(cmd: str, width: int) -> list[str]:
    """``cmd`` as terminal lines of at most ``width`` columns that the shell reads as ``cmd``: a break
    is a backslash-newline after a space outside quotes or after a comma (outside single quotes the
    shell drops a backslash-newline; inside them the quote is closed before it and reopened after),
    never inside a word otherwise. A piece with no break point that fits stays whole on a longer line
    (the terminal wraps it; a copy keeps it one line)."""
    if len(cmd) <= width:
        return [cmd]
    out: list[str] = []
    start, lead = 0, ""  # where the current line starts in cmd, and the quote it reopens
    breaks = _breaks(cmd)
    while len(lead) + len(cmd) - start > width:
        ahead = [b for b in breaks if b[0] > start]
        fits = [b for b in ahead if len(lead) + b[0] - start + (2 if b[1] == "'" else 1) <= width]
        if not ahead:
            break
        cut, q = fits[-1] if fits else ahead[0]
        out.append(lead + cmd[start:cut] + ("'\\" if q == "'" else "\\"))
        start, lead = cut, ("'" if q == "'" else "")
    out.append(lead + cmd[start:])
    return out
