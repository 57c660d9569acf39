"""The shared-memory probe: /dev/shm entries (allocated bytes, owner) and the live processes that map or hold
each, read from a fake root (no host), bounded; shm.json replayed from a snapshot into gpu.headroom."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from afddiag.cli import cli
from afddiag.probes import shm
from conftest import CASES


def _root(tmp_path):
    root = tmp_path / "root"
    d = root / "dev" / "shm"
    d.mkdir(parents=True)
    (d / "vllm-kv-7f3a").write_bytes(b"\1" * 65536)  # written: its blocks hold memory
    with open(d / "sparse", "wb") as f:  # apparent size only: holds nothing
        f.truncate(1 << 30)
    (d / "nccl-dir").mkdir()
    (d / "nccl-dir" / "seg").write_bytes(b"\1" * 8192)
    (d / "link").symlink_to("/etc/passwd")  # never followed
    kv = "7f00-7f10 rw-s 0 00:1a 6 /dev/shm/vllm-kv-7f3a (deleted)\n"
    for pid, maps, fds in ((101, "7f00-7f10 rw-s 0 00:1a 5 /dev/shm/nccl-dir/seg\n", {}),
                           (202, kv, {"3": "/dev/shm/sparse"})):
        p = root / "proc" / str(pid)
        (p / "fd").mkdir(parents=True)
        (p / "maps").write_text(maps)
        for fd, target in fds.items():
            os.symlink(target, p / "fd" / fd)
    return root


def test_shm_entries_by_allocated_bytes_with_owner_and_no_link_followed(tmp_path):
    r = shm.list_shm(str(_root(tmp_path)))
    assert r is not None and r["entries"] == 4
    by = {f["path"]: f for f in r["files"]}
    assert by["/dev/shm/vllm-kv-7f3a"]["bytes"] >= 65536 and by["/dev/shm/sparse"]["bytes"] < 1 << 20
    assert by["/dev/shm/nccl-dir"]["bytes"] >= 8192 and by["/dev/shm/link"]["bytes"] == 0
    assert r["files"][0]["path"] == "/dev/shm/vllm-kv-7f3a" and isinstance(r["files"][0]["owner"], str)
    assert shm.list_shm(str(tmp_path / "nothing")) is None


def test_shm_holders_from_maps_and_open_files(tmp_path):
    import time

    root = _root(tmp_path)
    paths = ["/dev/shm/vllm-kv-7f3a", "/dev/shm/sparse", "/dev/shm/orphan"]
    held, complete = shm.shm_holders(str(root), paths, time.monotonic() + 5)
    assert complete and held == {"/dev/shm/vllm-kv-7f3a": [202], "/dev/shm/sparse": [202], "/dev/shm/orphan": []}
    held, complete = shm.shm_holders(str(root), paths, time.monotonic() - 1)  # no time left: not complete
    assert not complete


def test_a_replayed_shm_json_names_the_leftover_on_a_gb10(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    g = json.loads((CASES / "gpu" / "01-gb10-healthy-unified-memory" / "gpu.json").read_text())
    g["host_meminfo_kb"] = {**g["host_meminfo_kb"], "MemFree": 30 * 2**20, "MemAvailable": 35 * 2**20}
    (snap / "gpu.json").write_text(json.dumps(g))
    left = {"path": "/dev/shm/vllm-kv-7f3a", "bytes": 80 * 2**30, "owner": "afd", "mtime": 1.0, "holders": []}
    (snap / "shm.json").write_text(json.dumps({"files": [left], "total_bytes": left["bytes"], "entries": 1,
                                               "notes": [], "holders_read": True}))
    res = CliRunner().invoke(cli, ["gpu", "--json", "--role", "expert", "--snapshot", str(snap)],
                             standalone_mode=False, catch_exceptions=False)
    h = {x["id"]: x for x in json.loads(res.stdout)["gates"]}["gpu.headroom"]
    assert (h["verdict"], h["action"]) == ("FAIL", "CLEAN_SHM"), h
    assert "/dev/shm/vllm-kv-7f3a (owner afd, 80.0 GiB)" in h["summary"]
    (snap / "shm.json").unlink()  # not captured: the processes, as before
    res = CliRunner().invoke(cli, ["gpu", "--json", "--role", "expert", "--snapshot", str(snap)],
                             standalone_mode=False, catch_exceptions=False)
    h = {x["id"]: x for x in json.loads(res.stdout)["gates"]}["gpu.headroom"]
    assert (h["verdict"], h["action"]) == ("FAIL", "STOP_PROCESSES") and "shared memory" not in h["summary"]
