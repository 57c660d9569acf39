"""ASCII integers in text the kernel, tools and files print.

``str.isdigit()`` is True for characters ``int()`` refuses (superscripts: ``'²'.isdigit()``) and for
decimal digits of other scripts that no kernel prints; a check with it followed by ``int()`` raises
on such input (a snapshot's hostile ``speed`` file crashed the whole fabric probe). :func:`digits`
is the check that matches ``int()`` on ASCII only, and on a bounded length: ``int()`` refuses a
string of more than 4300 digits (``sys.get_int_max_str_digits()``; a hostile env value
``NCCL_IB_GID_INDEX=111…`` crashed fabric.devicemap-env), and no number the kernel, a tool or a
launcher prints is longer than :data:`MAX_DIGITS`. Pure.
"""

from __future__ import annotations

import re

_INT = re.compile(r"-?[0-9]+")
INT32_MAX = (1 << 31) - 1  # a kernel `int` attribute (netdev speed, mtu) prints at most this
MAX_DIGITS = 40  # longer than any 128-bit integer (39 digits), far below int()'s 4300-digit limit


def digits(text: object) -> bool:
    """True when ``text`` is a non-empty string of at most :data:`MAX_DIGITS` (40) ASCII digits 0-9
    and nothing else (no sign, no space): ``int(text)`` then never raises. A longer string of digits
    is False, as for any other text that is not a number (callers give it their one-line "not a
    number" treatment). Pure."""
    return isinstance(text, str) and 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def kernel_int(text: object, lo: int, hi: int) -> int | None:
    """The integer ``text`` (surrounding whitespace stripped; an optional leading ``-``; ASCII digits)
    when it lies within ``lo..hi`` inclusive, else None (not a number, a sign or digit the kernel does
    not print, longer than :data:`MAX_DIGITS` digits, or out of range). Pure; never raises."""
    if not isinstance(text, str):
        return None
    t = text.strip()
    if len(t) - t.startswith("-") > MAX_DIGITS or not _INT.fullmatch(t):
        return None
    v = int(t)
    return v if lo <= v <= hi else None
