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

