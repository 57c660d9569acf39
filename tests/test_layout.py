"""The package's layout rules (issue 11): only the CLI imports click, and start-up loads no command module."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "afddiag"
CLI_MODULES = {PKG / "cli.py"} | set((PKG / "commands").rglob("*.py"))


def _imports_click(path: Path) -> list[int]:
    """Line numbers of every `import click…` / `from click… import` in ``path``, at any depth."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name == "click" or a.name.startswith("click.") for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == "click" or node.module.startswith("click.")):
            lines.append(node.lineno)
    return lines


def test_only_the_cli_imports_click():
    offenders = {str(p.relative_to(PKG.parent)): n for p in sorted(PKG.rglob("*.py"))
                 if p not in CLI_MODULES and (n := _imports_click(p))}
    assert offenders == {}, f"click imported outside afddiag/cli.py and afddiag/commands/: {offenders}"
    # the walk sees the CLI's own imports (so an empty result above is not a walk that finds nothing)
    assert _imports_click(PKG / "cli.py")
    assert all(_imports_click(p) for p in (PKG / "commands").glob("*.py") if p.name != "__init__.py")


def test_version_loads_no_command_module():
    code = ("import sys\nfrom afddiag.cli import cli\ntry:\n    cli(['--version'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('afddiag.commands', 'afddiag.fleet', "
            "'afddiag.capture', 'afddiag.history'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_lazy_commands_resolve_into_the_commands_package():
    from afddiag import cli as climod

    for name, target in climod.LAZY_COMMANDS.items():
        assert target.startswith("afddiag.commands."), (name, target)
        cmd = climod.LazyGroup._load(name)
        assert cmd is not None and cmd.name == name, (name, climod.LazyGroup._why.get(name))


def _imports(path: Path, top: str) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == top for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == top:
            return True
    return False


def _opens_a_library(path: Path) -> bool:
    """Whether ``path`` calls ctypes.CDLL / ctypes.cdll.LoadLibrary (opens a shared library itself)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("CDLL", "LoadLibrary"):
                return True
    return False


def test_one_nvml_wrapper_and_one_cuda_driver_binding():
    mods = sorted(PKG.rglob("*.py"))
    nvml_users = [str(p.relative_to(PKG)) for p in mods if _imports(p, "pynvml")]
    assert nvml_users == ["probes/nvml.py"]
    cuda_openers = [str(p.relative_to(PKG)) for p in mods
                    if _opens_a_library(p) and "libcuda" in p.read_text() and p.name != "cudadrv.py"]
    assert cuda_openers == []
    assert _opens_a_library(PKG / "probes" / "cudadrv.py")


def test_every_subpackage_is_installed():
    """pyproject's explicit package list names every package under afddiag/ (a wheel holds only those:
    a missing one installs an afddiag that fails on import)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    listed = set(tomllib.loads((PKG.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py")
               if "__pycache__" not in p.parts}
    assert {"afddiag", "afddiag.probes", "afddiag.gates"} <= on_disk  # the walk finds packages
    assert on_disk - listed == set(), \
        f"packages missing from pyproject.toml [tool.setuptools] packages: {on_disk - listed}"


def test_readme_fresh_machine_commands_work_as_root_without_sudo_and_ci_runs_the_test_command():
    """Not every machine has sudo: the README's two commands run as root as written, and CI calls the
    README's test command."""
    import re

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    section = readme.split("## On a fresh machine", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in section.splitlines() if line.startswith("    ")]
    assert commands == ["./scripts/setup.sh && .venv/bin/afddiag all", "./scripts/test.sh"], commands
    assert not any(re.search(r"\bsudo\b", c) for c in commands)
    assert "scripts/test.sh" in (root / ".ci" / "run").read_text()
    for script in ("scripts/setup.sh", "scripts/test.sh"):
        text = (root / script).read_text()
        assert 'SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"' in text, script


def test_a_gpu_run_never_loads_the_fabric_models():
    """`afddiag gpu` (issue 16's start-up budget): the fabric models (a dozen dataclasses, a measurable
    part of a cold run) and the fabric gates stay unloaded when no fabric facts are gathered."""
    root = Path(__file__).resolve().parents[1]
    code = ("import sys, io, contextlib\n"
            "from afddiag import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    cli.run(['gpu', '--json', '--no-history', '--snapshot', sys.argv[1]])\n"
            "print(sorted(m for m in sys.modules if m in ('afddiag.model.fabric', 'afddiag.gates.fabric', "
            "'afddiag.probes.qp')))\n")
    for target in (str(root / "tests/fixtures/gpu/h200-live-idle"), ""):  # a replay, and this host live
        run = code if target else code.replace("'--snapshot', sys.argv[1]", "")
        out = subprocess.run([sys.executable, "-c", run, target], capture_output=True, text=True, cwd=root,
                             check=True).stdout
        assert out.strip() == "[]", (target or "live", out)



# ---------------------------------------------------------------- import direction and circles (issue 21)

#: The layers, lowest first; a module may import its own layer or a lower one. probes and gates share a
#: rank but never import each other (facts flow from probes to gates only through the model).
LAYERS = {
    "utilities": ("afddiag", "afddiag.atomic", "afddiag.baseline", "afddiag.bundle", "afddiag.catalog",
                  "afddiag.envvars", "afddiag.exitcodes", "afddiag.packaged", "afddiag.playbook", "afddiag.proc",
                  "afddiag.progress", "afddiag.reader", "afddiag.schema", "afddiag.shellcmd", "afddiag.termsafe",
                  "afddiag.textlayout",
                  "afddiag.textnum", "afddiag.schema.validate"),
    "model": ("afddiag.model", "afddiag.model.*", "afddiag.facts", "afddiag.verdict", "afddiag.expect",
              "afddiag.endpoint", "afddiag.collect"),
    "probes": ("afddiag.probes", "afddiag.probes.*"),
    "gates": ("afddiag.gates", "afddiag.gates.*", "afddiag.diagnosis", "afddiag.summary"),
    "runner": ("afddiag.runner", "afddiag.capture", "afddiag.fleet.inventory", "afddiag.fleet.judge",
               "afddiag.fleet.rails", "afddiag.fleet.ssh", "afddiag.slurm", "afddiag.baseline_record", "afddiag.inputs",
               "afddiag.check", "afddiag.preflight", "afddiag.pairtest", "afddiag.devicemap",
               "afddiag.document"),
    # afddiag.fleet is the fleet's facade: it re-exports the runner's modules and the fleet table
    "renderers": ("afddiag.render", "afddiag.report", "afddiag.prometheus", "afddiag.html", "afddiag.gidtable",
                  "afddiag.history", "afddiag.fleet", "afddiag.fleet.table", "afddiag.npd"),
    "cli": ("afddiag.cli", "afddiag.commands", "afddiag.commands.*", "afddiag.__main__", "afddiag.entry"),
}
RANK = {"utilities": 0, "model": 1, "probes": 2, "gates": 2, "runner": 3, "renderers": 4, "cli": 5}

#: Imports against the direction that another change is still removing: (importer, imported) -> why.
#: Shrinks to nothing; do not add to it.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imported(mod: str, path: Path, node: ast.Import | ast.ImportFrom, mods: dict[str, Path]) -> list[str]:
    """The afddiag modules one import statement names (``from afddiag.gates import gpu`` names the module
    afddiag.gates.gpu; ``from afddiag.gates import Context`` the package)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        if node.level:
            pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
            base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    out = []
    for t in targets:
        while t not in mods and "." in t:
            t = t.rsplit(".", 1)[0]
        if t in mods and t != mod:
            out.append(t)
    return out


def _import_graph() -> dict[str, dict[str, list[int]]]:
    """``{importer: {imported: [line, ...]}}`` over every import statement of afddiag/, at any depth
    (function-level and ``TYPE_CHECKING`` ones included)."""
    mods = _modules()
    graph: dict[str, dict[str, list[int]]] = {m: {} for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _imported(m, p, node, mods):
                    graph[m].setdefault(t, []).append(node.lineno)
    return graph


def _layer(mod: str) -> str | None:
    import fnmatch

    return next((name for name, pats in LAYERS.items() if any(fnmatch.fnmatchcase(mod, p) for p in pats)), None)


def test_every_module_has_a_layer():
    assert [m for m in _modules() if _layer(m) is None] == []


def test_imports_follow_the_layers():
    """utilities < model < probes | gates < runner < renderers < cli, on every import statement."""
    graph = _import_graph()
    assert sum(len(v) for v in graph.values()) > 200  # the walk sees the package's imports
    bad = []
    for m, targets in graph.items():
        for t, lines in targets.items():
            a, b = _layer(m), _layer(t)
            if a is None or b is None:
                continue
            sideways = {a, b} == {"probes", "gates"}
            if (RANK[b] > RANK[a] or sideways) and (m, t) not in UPWARD_ALLOWED:
                bad.append(f"{m} ({a}) imports {t} ({b}) at line {lines[0]}")
    assert bad == []
    stale = [k for k in UPWARD_ALLOWED if k[1] not in graph.get(k[0], {})]
    assert stale == [], f"UPWARD_ALLOWED lists imports that are gone: remove {stale}"


def _circles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle():
    assert _circles(_import_graph()) == []
    # the search finds a circle when there is one
    assert _circles({"a": {"b": [1]}, "b": {"c": [1]}, "c": {"a": [1]}, "d": {}}) == [["a", "b", "c"]]


#: The only afddiag imports below the top of a file (a function-level import of an afddiag module hides a
#: dependency, and hid both circles this test forbids): (importer, imported) -> why it waits.
LATE_IMPORT_ALLOWED = {
    ("afddiag.entry", "afddiag.cli"): "`afddiag --version` is answered without loading the CLI (the point of "
                                      "entry.py)",
    ("afddiag.entry", "afddiag.npd"): "`afddiag npd` (three NPD plugins every 30 s) is answered without click or the "
                                      "CLI, and `--version` without the NPD mode's reader",
}


def _top_level(tree: ast.Module) -> set[int]:
    """The statements of a module's top: its body, and the bodies of a top-level ``if TYPE_CHECKING:``
    or ``try:`` (no import there runs later than the file)."""
    top = set()
    for n in tree.body:
        top.add(id(n))
        if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING":
            top |= {id(c) for c in n.body}
        if isinstance(n, ast.Try):
            top |= {id(c) for c in n.body + n.orelse + n.finalbody}
            top |= {id(c) for h in n.handlers for c in h.body}
    return top


def _late_imports() -> dict[tuple[str, str], list[int]]:
    """``{(importer, imported): [line, ...]}`` for every afddiag import below the top of a file."""
    mods = _modules()
    late: dict[tuple[str, str], list[int]] = {}
    for m, p in mods.items():
        tree = ast.parse(p.read_text(), str(p))
        top = _top_level(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                for t in _imported(m, p, node, mods):
                    late.setdefault((m, t), []).append(node.lineno)
    return late


def test_afddiag_imports_at_the_top():
    """Package-wide: every afddiag import at the top of its file, but the named exceptions."""
    late = _late_imports()
    assert [f"{m} imports {t} at line {lines[0]}" for (m, t), lines in late.items()
            if (m, t) not in LATE_IMPORT_ALLOWED] == []
    stale = [k for k in LATE_IMPORT_ALLOWED if k not in late]
    assert stale == [], f"LATE_IMPORT_ALLOWED lists imports that are gone: remove {stale}"
    # the walk sees a function-level import
    tree = ast.parse("import os\nif TYPE_CHECKING:\n    import afddiag.cli\ndef f():\n    import afddiag.cli\n")
    assert [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import) and id(n) not in _top_level(tree)] == [5]
