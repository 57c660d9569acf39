"""ASCII integers in text the kernel, tools and files print.

``str.isdigit()`` is True for characters ``int()`` refuses (superscripts: ``'²'.isdigit()``) and for
decimal digits of other scripts that no kernel prints; a check with it followed by ``int()`` raises
on such input (a snapshot's hostile ``speed`` file crashed the whole fabric probe). :func:`digits`
is the check that matches ``int()`` on ASCII only. Pure.
"""

from __future__ import annotations

import re

_INT = re.compile(r"-?[0-9]+")
INT32_MAX = (1 << 31) - 1  # a kernel `int` attribute (netdev speed, mtu) prints at most this


def digits(text: object) -> bool:
    """True when ``text`` is a non-empty string of ASCII digits 0-9 only (no sign, no space):
    ``int(text)`` then never raises. Pure."""
    return isinstance(text, str) and text.isascii() and text.isdigit()


def kernel_int(text: object, lo: int, hi: int) -> int | None:
    """The integer ``text`` (surrounding whitespace stripped; an optional leading ``-``; ASCII digits)
    when it lies within ``lo..hi`` inclusive, else None (not a number, a sign or digit the kernel does
    not print, or out of range). Pure; never raises."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    if len(t) > 40 or not _INT.fullmatch(t):
        return None
    v = int(t)
    return v if lo <= v <= hi else None
