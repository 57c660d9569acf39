"""Size rules (issue 21): no function in afddiag/ over 80 lines, no module over 800 lines.

A function's size is its ``def`` line to its last line (docstring and comments included, decorators
not), as :mod:`ast` gives them; nested functions count inside their parent and on their own."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "afddiag"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 800

# PTX text builders: one function writes one kernel's assembly, line for line; splitting it would split
# the kernel's text, not its logic. Named one by one ("path:function"), so a new builder is a choice.
PTX_TEXT_BUILDERS = {"afddiag/probes/load_ptx.py:ptx_gemv"}

# Modules over the limit with a split under way; each entry leaves when its split lands. Do not add to it.
MODULES_BEING_SPLIT: set[str] = set()


def function_sizes(path: Path) -> dict[str, int]:
    """``{"Class.method" or "function": lines}`` of every function in ``path``, nested ones included."""
    sizes: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                sizes[name] = (child.end_lineno or child.lineno) - child.lineno + 1
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(), str(path)), "")
    return sizes


def _modules() -> list[Path]:
    return sorted(PKG.rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(PKG.parent))


def test_no_function_over_80_lines():
    long = {f"{_rel(p)}:{name}": n for p in _modules() for name, n in function_sizes(p).items()
            if n > MAX_FUNCTION_LINES}
    offenders = {k: n for k, n in long.items() if k not in PTX_TEXT_BUILDERS}
    assert offenders == {}, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {offenders}"
    stale = sorted(PTX_TEXT_BUILDERS - set(long))
    assert not stale, f"PTX_TEXT_BUILDERS names functions that are gone or within the limit: {stale}"


def test_no_module_over_800_lines():
    sizes = {_rel(p): len(p.read_text().splitlines()) for p in _modules()}
    offenders = {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES and m not in MODULES_BEING_SPLIT}
    assert offenders == {}, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {offenders}"
    done = sorted(m for m in MODULES_BEING_SPLIT if sizes.get(m, 0) <= MAX_MODULE_LINES)
    assert not done, f"MODULES_BEING_SPLIT lists modules now within the limit (or gone): take them out: {done}"


def test_the_measure_sees_a_long_function(tmp_path):
    # the rule is only as good as its measure: a 81-line function is caught, an 80-line one is not
    body = "\n".join(f"    x{i} = {i}" for i in range(79))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n    return 0\n\n"
                                   "class C:\n    def short(self):\n        return 1\n")
    sizes = function_sizes(tmp_path / "m.py")
    assert sizes == {"long": 81, "C.short": 2}
