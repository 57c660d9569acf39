"""Several afddiag commands' textfiles in one folder, scraped by Debian's node_exporter (issue 23): every
series unique across the files, so node_exporter drops none. node_exporter drops a duplicate and still
answers 200, so its log and ``node_textfile_scrape_error`` are what show a collision."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from afddiag.cli import cli
from conftest import case_dirs, load_case

NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
FABRIC = next(c for c in case_dirs("fabric") if c.name.startswith("01-"))  # a device map and path MTUs
H200 = next(c for c in case_dirs("gpu") if "h200" in c.name)  # GPU clocks, temperature and load figures


def _write(args: list[str]) -> None:
    res = CliRunner().invoke(cli, args + ["--no-history"], standalone_mode=False, catch_exceptions=False)
    assert res.return_value in (0, 1, 2, 3), res.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(url: str, proc: subprocess.Popen, deadline_s: float = 30.0) -> str:
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                assert r.status == 200
                return r.read().decode()
        except OSError:
            if proc.poll() is not None or time.monotonic() > end:
                raise
            time.sleep(0.2)


@pytest.mark.skipif(NODE_EXPORTER is None and not os.environ.get("CI"),
                    reason="node_exporter not installed (Debian: prometheus-node-exporter; lab/setup.sh installs it)")
def test_four_commands_in_one_textfile_folder_scrape_without_collisions(tmp_path):
    assert NODE_EXPORTER, "node_exporter missing: lab/setup.sh installs prometheus-node-exporter"
    folder = tmp_path / "textfile"
    folder.mkdir()
    fip = ["--fabric-ip", load_case(FABRIC)["fabric_ip"]]
    # fabric and all judge the same host: path MTU, device map and build info twice; gpu and preflight: the GPU series
    _write(["fabric", "--snapshot", str(FABRIC), *fip, "--format", "prometheus",
            "--output", str(folder / "fabric.prom")])
    _write(["all", "--snapshot", str(FABRIC), *fip, "--format", "prometheus", "--output", str(folder / "all.prom")])
    _write(["gpu", "--snapshot", str(H200), "--format", "prometheus", "--output", str(folder / "gpu.prom")])
    _write(["preflight", "--snapshot", str(H200), "--prom", str(folder / "preflight.prom")])
    assert sorted(p.name for p in folder.iterdir()) == ["all.prom", "fabric.prom", "gpu.prom", "preflight.prom"]

    port = _free_port()
    log_path = tmp_path / "node_exporter.log"
    with open(log_path, "wb") as log:  # the textfile collector alone: the one under test, quick in any container
        proc = subprocess.Popen([NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}",
                                 "--collector.disable-defaults", "--collector.textfile",
                                 f"--collector.textfile.directory={folder}"],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        text = _scrape(f"http://127.0.0.1:{port}/metrics", proc)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    log_text = Path(log_path).read_text(errors="replace")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (err,) = fams["node_textfile_scrape_error"].samples
    assert err.value == 0, log_text
    assert "collected before" not in log_text, log_text
    assert "textfile" not in log_text.lower() or "level=error" not in log_text, log_text
    commands = {s.labels.get("command") for s in fams["afddiag_gate_status"].samples}
    assert commands == {"fabric", "all", "gpu", "preflight"}
    for name in ("afddiag_roce_path_mtu_bytes", "afddiag_device_map_info"):
        assert {s.labels["command"] for s in fams[name].samples} == {"fabric", "all"}, name
    assert {s.labels["command"] for s in fams["afddiag_gpu_sm_clock_hertz"].samples} == {"gpu", "preflight"}
    assert {s.labels["command"] for s in fams["afddiag_build_info"].samples} == commands
    files = {s.labels["file"] for s in fams["node_textfile_mtime_seconds"].samples}
    assert {Path(f).name for f in files} == {"all.prom", "fabric.prom", "gpu.prom", "preflight.prom"}
