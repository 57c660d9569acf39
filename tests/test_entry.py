"""The console script's `--version` fast path (afddiag/entry.py): click's wording, without click."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from afddiag.cli import cli

CODE = ("import sys\nsys.argv = ['afddiag'] + sys.argv[1:]\nfrom afddiag.entry import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        "sys.stderr.write(repr((code, 'click' in sys.modules, 'afddiag.cli' in sys.modules)))\n")


def _entry(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CODE, *args], capture_output=True, text=True, timeout=60)


def test_version_prints_what_click_prints_and_loads_neither_click_nor_the_cli():
    out = _entry("--version")
    assert out.stderr == repr((0, False, False))
    assert out.stdout == CliRunner().invoke(cli, ["--version"]).output


def test_anything_else_goes_to_the_cli():
    out = _entry("--no-such-flag")  # not the bare --version: click parses it and refuses it
    code, click_loaded, cli_loaded = eval(out.stderr.splitlines()[-1])  # noqa: S307 - our own repr above
    assert (click_loaded, cli_loaded) == (True, True)
    assert code == 64, out.stderr


def test_version_into_a_full_device_is_one_line_and_exit_3():
    """Issue 22 item 10 on the fast path too: `afddiag --version > /dev/full` is one stderr line, exit 3."""
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-c", CODE, "--version"], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    lines = out.stderr.splitlines()
    assert "Traceback" not in out.stderr
    assert lines[0] == "afddiag: writing the output: No space left on device", out.stderr
    assert eval(lines[-1])[0] == 3  # noqa: S307 - our own repr (CODE)
