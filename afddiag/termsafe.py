"""The one escape path for text that came from elsewhere: a host (device, netdev and host names, GIDs,
a remote's stderr), a snapshot, a report or history entry, a playbook or a pair peer.

Every renderer goes through it:

- terminal text (plain lines and rich): :func:`clean` / :func:`line` / :func:`cleaned` show control
  characters (C0, DEL, C1: ESC sequences that set the clipboard through OSC 52, retitle the window,
  clear the screen), bidi controls (U+202E and friends: text that reads in another order than it is)
  and lone surrogates (a non-UTF-8 name read from sysfs) as escapes (``\\x1b``, ``\\u202e``,
  ``\\udcff``); a field's newline is shown as ``\\n`` so one value never splits a row;
- rich: tables take ``rich.text.Text`` cells and titles, :func:`afddiag.render.console_for` makes
  consoles with markup off and the progress bar's labels are plain text, so ``spark-b[/bold]`` prints
  as it is;
- HTML: :func:`html` (escaped, then cleaned);
- CSV: :func:`csv_cell` also neutralises a cell a spreadsheet would run as a formula (``= + - @``);
- shell and env lines: :func:`shell_word_problem` says why a name may not be printed for a shell
  (the caller refuses, exit 2).

JSON output needs none of this (``json`` escapes control characters; bidi controls stay data).
"""

from __future__ import annotations

import re
from typing import Any

# C0 but \t \n, DEL, C1, lone surrogates, line/paragraph separators, bidi controls (ALM, LRM, RLM,
# LRE/RLE/PDF/LRO/RLO, LRI/RLI/FSI/PDI), zero-width and BOM characters that hide or reorder text.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029\u061c\u200b-\u200f\u202a-\u202e"
                     "\u2060-\u2069\ufeff]")


def _visible(m: re.Match[str]) -> str:
    c = m.group()
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def clean(text: str, keep_newlines: bool = True) -> str:
    """``text`` with every unsafe character (control, bidi, zero-width, lone surrogate) written as a
    Python-style escape; tab kept; newline kept unless ``keep_newlines`` is False (then ``\\n``)."""
    out = _UNSAFE.sub(_visible, text)
    return out if keep_newlines else out.replace("\n", "\\n")


def line(value: Any) -> str:
    """One value on one line: ``str(value)`` :func:`clean`-ed with its newlines (and tabs) escaped.
    For a table cell, a name in a message, a field of a plain row."""
    return clean("" if value is None else str(value), keep_newlines=False).replace("\t", "\\t")


def html(value: Any) -> str:
    """``value`` for an HTML page: HTML-escaped (quotes too), then :func:`clean` (keeps newlines for
    ``pre-wrap`` blocks; a bidi override cannot reorder the page's text)."""
    import html as _html

    return clean(_html.escape("" if value is None else str(value), quote=True))


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """A CSV cell: :func:`line`, and a leading ``'`` when it starts with ``= + - @`` (a spreadsheet
    would run it as a formula: ``=HYPERLINK(...)``, ``@SUM(...)``; OWASP's CSV injection rule)."""
    s = line(value)
    return "'" + s if s.startswith(_FORMULA_START) else s


_DEVICE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def device_name_problem(name: str) -> str | None:
    """Why ``name`` may not be written into a shell or env line as an RDMA device or netdev name
    (the device-name rule: 1-64 of ``A-Z a-z 0-9 _ . -``), else None."""
    if _DEVICE_NAME.fullmatch(name):
        return None
    return (f"device name '{line(name)}' is not an RDMA device name (1-64 letters, digits, '_', '.', '-'): a shell "
            "sourcing the line would run or split it")


def cleaned(obj: Any, keep_newlines: bool = True) -> Any:
    """A copy of ``obj`` (report JSON: dicts, lists, strings) with every string (keys too)
    :func:`clean`-ed (``keep_newlines`` as there); iterative, so no nesting depth can overflow it."""
    root: list[Any] = [obj]
    stack: list[tuple[Any, Any, Any]] = [(root, 0, obj)]
    while stack:
        parent, key, value = stack.pop()
        if isinstance(value, str):
            parent[key] = clean(value, keep_newlines)
        elif isinstance(value, dict):
            new: dict[Any, Any] = {}
            for k, v in value.items():
                k2 = clean(k, keep_newlines) if isinstance(k, str) else k
                new[k2] = v
                stack.append((new, k2, v))
            parent[key] = new
        elif isinstance(value, (list, tuple)):
            new_list = list(value)
            for i, v in enumerate(new_list):
                stack.append((new_list, i, v))
            parent[key] = new_list
    return root[0]


def one_line(obj: Any) -> Any:
    """:func:`cleaned` with newlines escaped too: what the row-per-line renderers (tables, history,
    preflight) take, so a value never starts a forged row."""
    return cleaned(obj, keep_newlines=False)


def bounded_line(value: Any, max_bytes: int, keep: str = "") -> str:
    """:func:`line` of ``value`` cut to at most ``max_bytes`` UTF-8 bytes on a character boundary
    (``...`` where cut), with ``keep`` (a short suffix, escaped too) always whole at its end. For one-line
    messages another program stores with a size limit: a node condition's message (node-problem-detector
    keeps 80 bytes), a Slurm drain reason."""
    body, tail = line(value), line(keep)
    room = max_bytes - len(tail.encode())
    raw = body.encode()
    if len(raw) > room:
        body = raw[: max(0, room - 3)].decode("utf-8", "ignore").rstrip() + "..."
    return body + tail
