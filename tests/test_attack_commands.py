"""Issue 22, attacked on main: text from an input becomes an argument of a command afddiag runs. The
launch env's AFD_IMAGE goes to ``docker|podman image inspect``: a value starting with ``-`` must reach
the engine as the image name, never as one of its options."""

from __future__ import annotations

import json
import os
import stat
import sys

from afddiag.probes import launch


def _fake_engine(tmp_path, monkeypatch):
    """A `docker` on PATH that prints the argv it was given as an inspect result's tag."""
    exe = tmp_path / "docker"
    exe.write_text(f"#!{sys.executable}\nimport json, sys\n"
                   "print(json.dumps([{'RepoTags': [json.dumps(sys.argv[1:])], 'Config': {}}]))\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe


def test_an_image_name_that_looks_like_an_option_is_passed_after_the_end_of_options(tmp_path, monkeypatch):
    _fake_engine(tmp_path, monkeypatch)
    for ref in ("--format={{json .}}", "-f", "registry.example/afd/engine:1"):
        data, engine, why = launch.run_inspect(ref, timeout_s=30)
        assert why is None and engine == "docker"
        argv = json.loads(data[0]["RepoTags"][0])
        assert argv[-2:] == ["--", ref], argv  # everything after "--" is an operand, never an option
