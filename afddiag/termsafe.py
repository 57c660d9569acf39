"""Text from the host or a remote (device and netdev names, a remote's stderr, snapshot strings) is
untrusted: before it reaches a terminal, control characters (C0, DEL, C1: ESC sequences that move the
cursor, retitle the window or hide text) and lone surrogates (a non-UTF-8 name read from sysfs) are
shown as escapes (``\\x1b``, ``\\udcff``). JSON output needs none of this (``json`` escapes them)."""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def clean(text: str, keep_newlines: bool = True) -> str:
    """``text`` with every control character but newline and tab (and newline too unless
    ``keep_newlines``) and every lone surrogate written as a Python escape."""
    out = _UNSAFE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii")
                      if not ("\ud800" <= m.group() <= "\udfff") else f"\\u{ord(m.group()):04x}", text)
    return out if keep_newlines else out.replace("\n", "\\n")


def cleaned(obj: Any) -> Any:
    """A copy of ``obj`` (report JSON: dicts, lists, strings) with every string (keys too)
    :func:`clean`; iterative, so no nesting depth can overflow it."""
    root: list[Any] = [obj]
    stack: list[tuple[Any, Any, Any]] = [(root, 0, obj)]
    while stack:
        parent, key, value = stack.pop()
        if isinstance(value, str):
            parent[key] = clean(value)
        elif isinstance(value, dict):
            new: dict[Any, Any] = {}
            for k, v in value.items():
                k2 = clean(k) if isinstance(k, str) else k
                new[k2] = v
                stack.append((new, k2, v))
            parent[key] = new
        elif isinstance(value, (list, tuple)):
            new_list = list(value)
            for i, v in enumerate(new_list):
                stack.append((new_list, i, v))
            parent[key] = new_list
    return root[0]
