"""Issue 13: hostile and broken input, round two. Each test is one finding of the issue
(numbered as there): never a traceback, never a write through a device, bounded everywhere."""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest

from afddiag.cli import run
from conftest import case_dirs

FABRIC = case_dirs("fabric")
GPU = case_dirs("gpu")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")


def _null_device(tmp_path):
    """A character device node like /dev/null (1:3), in tmp_path (the real /dev/null stays untouched)."""
    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    return dev


# 1. --output / baseline record --path over a device node ------------------------------------------

@root_only
@pytest.mark.parametrize("fmt", [["--format", "prometheus"], ["--json"], []], ids=["prometheus", "json", "table"])
def test_1_output_to_a_character_device_writes_through_it_and_never_replaces_it(tmp_path, fmt):
    dev = _null_device(tmp_path)
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--no-history", "--output", str(dev)] + fmt)
    assert code in (0, 1, 2)
    assert stat.S_ISCHR(os.lstat(dev).st_mode) and os.stat(dev).st_rdev == os.makedev(1, 3)
    assert sorted(os.listdir(tmp_path)) == ["null", "state"] or sorted(os.listdir(tmp_path)) == ["null"]


@root_only
def test_1_baseline_record_path_on_a_device_is_written_in_place(tmp_path):
    from afddiag import baseline

    dev = _null_device(tmp_path)
    readings = {"devices": [{"uuid": "GPU-1", "name": "NVIDIA H200",
                             "under_load": {"clock_sm_mhz": 1980, "achieved": {"fp32_tflops": 60.0}}}]}
    baseline.record(readings, None, "h", dev)
    assert stat.S_ISCHR(os.lstat(dev).st_mode)


def test_1_a_device_afddiag_chose_itself_is_refused(tmp_path):
    """device_ok is only for a path the user named: the default baseline path never writes through one."""
    from afddiag.atomic import OutputTargetError, atomic_write

    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(OutputTargetError, match="FIFO"):
        with atomic_write(fifo, device_ok=True) as f:
            f.write("x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if os.geteuid() == 0:
        dev = _null_device(tmp_path)
        with pytest.raises(OutputTargetError, match="character device"):
            with atomic_write(dev) as f:
                f.write("x")
        assert stat.S_ISCHR(os.lstat(dev).st_mode)


def _socket_file(tmp_path):
    path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    return path, s


@pytest.mark.parametrize("kind", ["fifo", "socket"])
@pytest.mark.parametrize("cmd", [["--format", "prometheus"], ["--json"]], ids=["prometheus", "json"])
def test_1_output_to_a_fifo_or_socket_is_a_usage_error_and_left_alone(tmp_path, capsys, kind, cmd):
    if kind == "fifo":
        target, keep = tmp_path / "f", None
        os.mkfifo(target)
    else:
        target, keep = _socket_file(tmp_path)
    mode = os.lstat(target).st_mode
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--no-history", "--output", str(target)] + cmd)
    err = capsys.readouterr().err
    assert code == 64
    assert ("a FIFO" if kind == "fifo" else "a socket") in err and "Traceback" not in err
    assert os.lstat(target).st_mode == mode
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    if keep:
        keep.close()


def test_1_output_keeps_the_old_files_mode_and_owner(tmp_path):
    out = tmp_path / "r.prom"
    out.write_text("old\n")
    os.chmod(out, 0o600)
    owner = (1234, 2345) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(out, *owner)
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--no-history", "--format", "prometheus", "--output", str(out)])
    assert code in (0, 1, 2)
    st = os.stat(out)
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == owner
    assert "afddiag_gate_status" in out.read_text()


def test_1_output_through_a_symlink_replaces_its_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert run(["fabric", "--snapshot", str(FABRIC[0]), "--no-history", "--json", "--output", str(link)]) in (0, 1, 2)
    assert link.is_symlink() and json.loads(real.read_text())["gates"]
