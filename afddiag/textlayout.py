"""Text laid out for a terminal: words wrapped at a width without breaking what must paste whole
(``export VAR=value``, backquoted commands, long words). Pure string functions; the renderers,
the catalog listing and the GID table use them."""

from __future__ import annotations

import re


def units(text: str) -> list[str]:
    """``text`` cut into the pieces a line may not break: words, ``export VAR=value`` (a command cut
    after ``export`` exports nothing when pasted) and backquoted spans (```rdma link show```)."""
    out: list[str] = []
    for m in re.finditer(r"[^\s`]*`[^`]*`\S*|\S+", text):
        w = m.group(0)
        if out and out[-1] == "export":
            out[-1] += " " + w
        else:
            out.append(w)
    return out


def unbroken(text: str) -> list[str]:
    """The pieces of ``text`` a renderer must keep on one line: ``export VAR=value`` and every
    space-free word (a folded word no longer pastes)."""
    return [u for u in units(text) if u.startswith("export ") or " " not in u]


def wrap(text: str, width: int, first: str = "", indent: str = "") -> list[str]:
    """``text`` wrapped at ``width`` columns between :func:`units`, the first line after ``first``,
    the others after ``indent``. A unit longer than the room after ``indent`` gets a line of its own
    at column 0 (still whole: it pastes); an ``export`` longer than ``width`` continues over lines
    ending in a backslash (it still pastes as one command); any other such unit is folded."""
    lines: list[str] = []
    cur = first
    bare = True  # cur holds no unit yet
    for u in units(text):
        if len(cur) + (0 if bare else 1) + len(u) <= width:
            cur += ("" if bare else " ") + u
            bare = False
            continue
        if not bare or cur.strip():
            lines.append(cur.rstrip())
        if len(indent) + len(u) <= width:
            cur, bare = indent + u, False
        elif len(u) <= width:
            lines.append(u)
            cur, bare = indent, True
        else:  # wider than the terminal: a shell line continues after `\`, anything else folds
            lines.extend(_continued(u, width) if u.startswith("export ") else
                         [u[i:i + width] for i in range(0, len(u), width)])
            cur, bare = indent, True
    if not bare or (cur.strip() and cur != indent):
        lines.append(cur.rstrip())
    return lines


def _continued(command: str, width: int) -> list[str]:
    """A shell word wider than ``width`` as lines ending in ``\\`` (the shell drops backslash-newline,
    so the pasted lines are the one command), broken after commas where it can."""
    pieces = [p for p in re.split(r"(?<=,)", command) if p]
    lines, cur = [], ""
    for p in pieces:
        while len(p) > width - 1:
            if cur:
                lines.append(cur)
                cur = ""
            lines.append(p[:width - 1])
            p = p[width - 1:]
        if len(cur) + len(p) > width - 1:
            lines.append(cur)
            cur = ""
        cur += p
    lines.append(cur)
    return [ln + "\\" for ln in lines[:-1]] + lines[-1:]
