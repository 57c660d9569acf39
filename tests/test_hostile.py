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
    assert code == 2  # case 01: fabric.first-device FAILs
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


def test_1_output_keeps_the_old_files_mode_and_group(tmp_path):
    out = tmp_path / "r.prom"
    out.write_text("old\n")
    os.chmod(out, 0o600)
    owner = (os.geteuid(), 2345) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    os.chown(out, *owner)
    code = run(["fabric", "--snapshot", str(FABRIC[0]), "--no-history", "--format", "prometheus", "--output", str(out)])
    assert code == 2  # case 01: fabric.first-device FAILs
    st = os.stat(out)
    assert stat.S_IMODE(st.st_mode) == 0o600 and (st.st_uid, st.st_gid) == owner
    assert "afddiag_gate_status" in out.read_text()


def test_1_output_through_a_symlink_is_refused_and_its_target_kept(tmp_path, capsys):
    """Issue 22 reverses issue 13's choice: a link at the target is never followed (O_NOFOLLOW)."""
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert run(["fabric", "--snapshot", str(FABRIC[0]), "--no-history", "--json", "--output", str(link)]) == 64
    err = capsys.readouterr().err
    assert f"--output {link}: is a symbolic link" in err and "Traceback" not in err
    assert link.is_symlink() and real.read_text() == "{}"


# 2. / 6. snapshot parts, merge input and baselines through the bounded reader ----------------------

DEEP = "[" * 1000 + "]" * 1000  # 2 KB
FAB = next(p for p in FABRIC if (p / "sys").is_dir() and (p / "rdma-dev.json").is_file()
           and (p / "ip-addr.json").is_file())


def _snap(tmp_path, src=FAB):
    import shutil

    dst = tmp_path / "snap"
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _json_run(capsys, args):
    code = run(args + ["--json", "--no-history"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "RecursionError" not in out + err
    return code, (json.loads(out) if out.strip() else None), err


def _verdicts(rep):
    return {g["id"]: g["verdict"] for g in rep["gates"]}


@pytest.mark.parametrize("part,gate", [("rdma-dev.json", "fabric.first-device"), ("ip-addr.json", "fabric.link"),
                                       ("gpu.json", "gpu.sm-count"), ("limits.json", "launch.memlock"),
                                       ("image.json", "gpu.image-arch"), ("versions.json", None),
                                       ("ip-route-get.json", None), ("case.json", None),
                                       ("cpu.json", "host.cpu-clock")])
def test_2_nested_brackets_in_a_snapshot_part_is_an_error_for_its_gates_not_a_traceback(tmp_path, capsys, part, gate):
    snap = _snap(tmp_path)
    import shutil

    shutil.copy(GPU[0] / "gpu.json", snap / "gpu.json")  # the image gate needs a GPU to judge against
    (snap / part).write_text(DEEP)
    env = tmp_path / "l.env"
    env.write_text("AFD_IMAGE=img:1\n")
    code, rep, _ = _json_run(capsys, ["all", "--snapshot", str(snap), "--launch-env", str(env), "--peer", "10.0.0.9"])
    assert rep is not None and code in (0, 1, 2, 3)
    notes = rep["notes"] + ((rep.get("facts") or {}).get("route") or {}).get("notes", [])
    assert any(part in n and "nested deeper" in n for n in notes), notes
    if gate:
        assert _verdicts(rep)[gate] == "ERROR"
        assert code in (2, 3)


def test_2_nested_merge_input_and_baselines_are_usage_errors(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    assert run(["merge", str(deep)]) == 64
    err = capsys.readouterr().err
    assert "nested deeper" in err and "Traceback" not in err
    assert run(["baseline", "show", "--path", str(deep)]) == 64
    assert "nested deeper" in capsys.readouterr().err
    code, rep, err = _json_run(capsys, ["gpu", "--snapshot", str(GPU[0]), "--baseline", str(deep)])
    assert code == 64 and rep is None and "nested deeper" in err


def test_2_a_deep_host_output_is_an_error_row(tmp_path):
    from afddiag.fleet import parse_report

    rep, why = parse_report(DEEP, "exit 0")
    assert rep is None and "nested deeper" in why


@pytest.mark.parametrize("part", ["gpu.json", "versions.json", "proc/sys/net/ipv4/conf/all/arp_ignore",
                                  "sys/class/infiniband/DEV/ports/1/state"])
def test_6_a_link_to_dev_zero_is_refused_quickly_and_small(tmp_path, capsys, part):
    import resource
    import time

    snap = _snap(tmp_path)
    if "DEV" in part:
        part = part.replace("DEV", sorted(os.listdir(snap / "sys/class/infiniband"))[0])
    target = snap / part
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    target.symlink_to("/dev/zero")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    code, rep, _ = _json_run(capsys, ["all", "--snapshot", str(snap), "--timeout", "5"])
    assert time.monotonic() - t0 < 20
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200 << 10  # KiB: under 200 MiB more
    assert rep is not None and code in (0, 1, 2, 3)


def test_6_a_sparse_gigabyte_gpu_json_is_refused_by_size(tmp_path, capsys):
    snap = _snap(tmp_path, GPU[0])
    with open(snap / "gpu.json", "wb") as f:
        f.truncate(1 << 30)
    code, rep, _ = _json_run(capsys, ["gpu", "--snapshot", str(snap)])
    assert _verdicts(rep)["gpu.sm-count"] == "ERROR" and code == 3
    assert any("gpu.json" in n and "cap" in n for n in rep["notes"])


def test_6_a_link_out_of_the_snapshot_is_refused(tmp_path, capsys):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"kernel": "LEAKED-SECRET"}))
    snap = _snap(tmp_path)
    (snap / "versions.json").symlink_to(secret)
    (snap / "proc/sys/kernel").mkdir(parents=True)
    (snap / "proc/sys/kernel/osrelease").symlink_to(tmp_path / "secret.json")
    code, rep, _ = _json_run(capsys, ["all", "--snapshot", str(snap)])
    assert "LEAKED-SECRET" not in json.dumps(rep)


def test_6_reader_bounds(tmp_path):
    from afddiag.reader import DepthError, InputError, json_depth, load_json, parse_json, read_bytes

    assert json_depth('{"a": [1, {"b": "[[[[["}]}') == 3
    with pytest.raises(DepthError):
        parse_json("[" * 65 + "]" * 65, "x")
    assert parse_json("[" * 64 + "]" * 64, "x") is not None
    big = tmp_path / "big"
    big.write_bytes(b"0" * 2000)
    with pytest.raises(InputError, match="cap"):
        read_bytes(big, max_bytes=1000)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="FIFO"):
        load_json(fifo)
    with pytest.raises(FileNotFoundError):
        load_json(tmp_path / "absent.json")


# 3. capture bundles: depth, header bytes, corrupt deflate, signals, member count in time ------------

def _tar_gz(path, members, fmt=None):
    """Write a .tar.gz of ``members`` [(TarInfo, bytes or None)]."""
    import io
    import tarfile

    with tarfile.open(path, "w:gz", format=fmt or tarfile.PAX_FORMAT) as tar:
        for ti, data in members:
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
    return path


def _reg(name, data=b"x"):
    import tarfile

    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    return ti, data


def _bundle_run(capsys, bundle, tmpdir, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    code = run(["all", "--snapshot", str(bundle), "--json", "--no-history"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert not list(tmpdir.iterdir()), list(tmpdir.iterdir())  # the temporary tree is gone
    return code, err


def test_3_a_thousand_deep_path_is_refused_and_its_tree_removed(tmp_path, capsys, monkeypatch):
    tmpdir = tmp_path / "t"
    tmpdir.mkdir()
    deep = "/".join(["d"] * 1000) + "/f"
    b = _tar_gz(tmp_path / "deep.tar.gz", [_reg("top/sys/x"), _reg("top/" + deep)])
    code, err = _bundle_run(capsys, b, tmpdir, monkeypatch)
    assert code == 64 and "folders deep" in err and len(err.strip().splitlines()) <= 2


def test_3_remove_tree_is_iterative(tmp_path):
    from afddiag.bundle import remove_tree

    top = tmp_path / "t"
    fd_path = str(top)
    os.mkdir(top)
    d = os.open(fd_path, os.O_RDONLY)
    for _ in range(1500):  # deeper than the recursion limit, past PATH_MAX through descriptors
        os.mkdir("dddddddd", dir_fd=d)
        nd = os.open("dddddddd", os.O_RDONLY, dir_fd=d)
        os.close(d)
        d = nd
    os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=d))
    os.close(d)
    remove_tree(top)
    assert not top.exists()


def test_3_a_huge_gnu_long_name_is_refused_before_it_is_held(tmp_path, capsys, monkeypatch):
    import tarfile

    tmpdir = tmp_path / "t"
    tmpdir.mkdir()
    b = _tar_gz(tmp_path / "long.tar.gz", [_reg("top/sys/x"), _reg("top/" + "n" * (3 << 20))], tarfile.GNU_FORMAT)
    code, err = _bundle_run(capsys, b, tmpdir, monkeypatch)
    assert code == 64 and "GNU long name or pax header" in err


def test_3_header_bytes_count_in_the_total_cap(tmp_path):
    import tarfile

    from afddiag.bundle import BundleError, safe_extract

    members = []
    for i in range(200):  # pax headers, no data
        ti, data = _reg(f"top/sys/{i}", b"")
        ti.pax_headers = {"comment": "c" * 4000}
        members.append((ti, data))
    b = _tar_gz(tmp_path / "pax.tar.gz", members, tarfile.PAX_FORMAT)
    dest = tmp_path / "d"
    dest.mkdir()
    with pytest.raises(BundleError, match="headers and data"):
        safe_extract(b, dest, max_total_bytes=100_000)


@pytest.mark.parametrize("where", ["head", "middle"])
def test_3_corrupt_deflate_is_a_one_line_refusal(tmp_path, capsys, monkeypatch, where):
    tmpdir = tmp_path / "t"
    tmpdir.mkdir()
    members = [_reg(f"top/sys/f{i}", (f"line {i} of a sysfs file\n" * 200).encode()) for i in range(50)]
    b = _tar_gz(tmp_path / "c.tar.gz", members)
    raw = bytearray(b.read_bytes())
    at = 12 if where == "head" else len(raw) // 2  # zlib.error / a CRC mismatch at the trailer
    for i in range(at, at + 64):
        raw[i] ^= 0x5A
    b.write_bytes(bytes(raw))
    code, err = _bundle_run(capsys, b, tmpdir, monkeypatch)
    assert code == 64 and "refused" in err and "zlib" not in err.split("refused", 1)[0]


def test_3_many_members_are_refused_within_the_time_bound(tmp_path):
    import time

    from afddiag.bundle import BundleError, safe_extract

    b = _tar_gz(tmp_path / "many.tar.gz", [_reg(f"top/sys/{i}") for i in range(20000)])
    dest = tmp_path / "d"
    dest.mkdir()
    t0 = time.monotonic()
    with pytest.raises(BundleError, match="not extracted within 0.3 s"):
        safe_extract(b, dest, timeout_s=0.3)
    assert time.monotonic() - t0 < 2


def test_3_sigterm_during_a_replay_removes_the_temporary_tree(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    tmpdir = tmp_path / "t"
    tmpdir.mkdir()
    b = _tar_gz(tmp_path / "many.tar.gz", [_reg(f"top/sys/{i}") for i in range(40000)])
    p = subprocess.Popen([sys.executable, "-m", "afddiag", "all", "--snapshot", str(b), "--json", "--no-history",
                          "--timeout", "120"], env={**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(REPO)},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not list(tmpdir.glob("afddiag-bundle-*")) and time.monotonic() - t0 < 30:
        time.sleep(0.02)
    assert list(tmpdir.glob("afddiag-bundle-*")), "the replay never started extracting"
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err[-2000:]
    assert "Traceback" not in err
    assert list(tmpdir.iterdir()) == []


# 4. fleet: a host that prints without end --------------------------------------------------------

@pytest.fixture(scope="module")
def spewfleet(tmp_path_factory):
    import shutil
    import subprocess
    import sys

    from test_fleet_ssh import SSHD, _free_port, _keygen, _wait_port

    if not (os.path.exists(SSHD) and shutil.which("ssh-keygen")) or os.geteuid() != 0:
        pytest.skip("needs openssh-server and root (lab/setup.sh installs it)")
    pytest.importorskip("ClusterShell")
    d = tmp_path_factory.mktemp("spew")
    os.makedirs("/run/sshd", exist_ok=True)
    host_pub = _keygen(d / "hostkey")
    (d / "authorized_keys").write_text(_keygen(d / "client") + "\n")
    wrappers = {"ok": f'eval "$SSH_ORIGINAL_COMMAND --snapshot {FAB}"', "spew": "exec yes afddiag-spew",
                "spew-no-newline": "exec cat /dev/zero"}  # one endless line: the read buffer is capped too
    ports = {n: _free_port() for n in wrappers}
    procs, known = [], []
    for name, body in wrappers.items():
        w = d / f"wrap-{name}.sh"
        w.write_text("#!/bin/sh\n" + body + "\n")
        w.chmod(0o755)
        (d / f"sshd-{name}.conf").write_text("\n".join([
            f"Port {ports[name]}", "ListenAddress 127.0.0.1", f"HostKey {d / 'hostkey'}",
            f"PidFile {d / (name + '.pid')}",
            f"AuthorizedKeysFile {d / 'authorized_keys'}", "StrictModes no", "UsePAM no", "PasswordAuthentication no",
            "PermitRootLogin prohibit-password", "LogLevel ERROR", f"ForceCommand {w}"]) + "\n")
        procs.append(subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / f"sshd-{name}.conf")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        known.append(f"[127.0.0.1]:{ports[name]} {host_pub}")
    (d / "known_hosts").write_text("\n".join(known) + "\n")
    lines = ["[fleet]", f'known_hosts = "{d / "known_hosts"}"', f'identity = "{d / "client"}"',
             f'afddiag = "{sys.executable} -m afddiag"', "timeout_s = 60", 'peers = "none"', "max_output_mib = 2", ""]
    for name in wrappers:
        lines += ["[[host]]", f'name = "{name}"', f'ssh = "root@127.0.0.1:{ports[name]}"', ""]
    (d / "fleet.toml").write_text("\n".join(lines))
    try:
        for name in wrappers:
            _wait_port(ports[name])
        yield d
    finally:
        for p in procs:
            p.terminate()
            p.wait(5)


def test_4_a_spewing_host_is_an_error_row_and_the_healthy_one_is_judged(spewfleet, capsys):
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    code = run(["fleet", "--inventory", str(spewfleet / "fleet.toml"), "--json", "--quiet"])
    out, err = capsys.readouterr()
    fr = json.loads(out)
    rows = {r["name"]: r for r in fr["hosts"]}
    for spew in ("spew", "spew-no-newline"):
        assert rows[spew]["status"] == "ERROR" and rows[spew]["error"].startswith("output over 2 MiB"), rows[spew]
    assert rows["ok"]["status"] == "ok"
    assert code in (2, 3) and time.monotonic() - t0 < 50
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10  # KiB


# 7. / 10. typed inventory ------------------------------------------------------------------------

@pytest.mark.parametrize("body,words", [
    ("fleet = 5\n", "[fleet] must be a table"),
    ("host = 5\n", "write each host as a [[host]] table"),
    ('[expect]\nexpect = [1, 2]\n[[host]]\nname = "a"\n', "unknown key(s) expect"),
    ('[expect]\ncapacity = [1, 2]\n[[host]]\nname = "a"\n', "capacity must be an integer"),
    ('[expect]\nmtu = 4096.5\n[[host]]\nname = "a"\n', "mtu must be one of 256, 512, 1024, 2048, 4096"),
    ('[fleet]\nconcurrency = "abc"\n[[host]]\nname = "a"\n', "concurrency must be an integer 1..1024"),
    ('[fleet]\ntimeout_s = "x"\n[[host]]\nname = "a"\n', "timeout_s must be a number 1..3600"),
    ('[fleet]\ntimeout_s = true\n[[host]]\nname = "a"\n', "timeout_s must be a number"),
    ('[[host]]\nname = 5\n', "name must be a host name"),
    ('[[host]]\nname = "a"\nrole = ["x"]\n', "role must be a host name"),
    ('[[host]]\nname = "a"\nargs = "--load"\n', "args must be a list of strings"),
])
def test_7_wrongly_typed_inventory_is_a_usage_error_naming_key_and_allowed(tmp_path, capsys, body, words):
    inv = tmp_path / "inv.toml"
    inv.write_text(body)
    assert run(["merge", "--inventory", str(inv), str(tmp_path / "inv.toml")]) == 64
    err = capsys.readouterr().err
    assert words in err and str(inv) in err and "Traceback" not in err, err
    assert run(["fleet", "--inventory", str(inv), "--quiet"]) == 64
    assert words in capsys.readouterr().err


def test_7_non_utf8_inventory_is_a_usage_error(tmp_path, capsys):
    inv = tmp_path / "inv.toml"
    inv.write_bytes(b'[[host]]\nname = "\xff\xfe"\n')
    assert run(["fleet", "--inventory", str(inv), "--quiet"]) == 64
    err = capsys.readouterr().err
    assert "not UTF-8" in err and "Traceback" not in err


def test_10_a_missing_known_hosts_file_is_a_usage_error_not_unreachable(tmp_path, capsys):
    pytest.importorskip("ClusterShell")
    inv = tmp_path / "inv.toml"
    inv.write_text('[[host]]\nname = "a"\nssh = "127.0.0.1:1"\n')
    assert run(["fleet", "--inventory", str(inv), "--quiet", "--known-hosts", str(tmp_path / "nope")]) == 64
    assert "no such file" in capsys.readouterr().err


def test_10_connect_timeout_is_reported_with_its_own_bound(tmp_path):
    """A listener that takes the TCP connection (the kernel's backlog) and never speaks SSH: ssh's
    ConnectTimeout ends it, well inside the per-host bound, and the row names the connect bound."""
    import socket
    import time

    from afddiag import fleet as fl

    pytest.importorskip("ClusterShell")
    known = tmp_path / "known_hosts"
    known.write_text("")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        inv = fl.Inventory(hosts=[fl.InvHost(name="a", ssh=f"127.0.0.1:{s.getsockname()[1]}")])
        t = time.monotonic()
        res = fl.collect(inv, fl.SshOptions(known_hosts=str(known), timeout_s=15, connect_timeout_s=1),
                         fl.Progress(quiet=True))
    assert res[0].error == "unreachable: connect timed out after 1 s", res[0].error
    assert time.monotonic() - t < 10


# 7. / 8. the launch env: exactly what the shell sets, or a usage error with the line ---------------

@pytest.mark.parametrize("line,words", [
    ("AFD_EXPERT_CAPACITY=\u00b2", "not a positive integer"),
    ("AFD_EXPERT_CAPACITY=" + "9" * 5000, "not a positive integer"),
    ("AFD_IMAGE=x;touch F", "metacharacter ';'"),
    ("NCCL_IB_HCA=mlx5_0 touch F", "unquoted a blank"),
    ("AFD_IMAGE=`touch F`", "backtick"),
    ("AFD_IMAGE=$(touch F)", "command substitution"),
    ('AFD_IMAGE="$(touch F)"', "inside double quotes"),
    ('AFD_IMAGE="`id`"', "inside double quotes"),
    ("AFD_IMAGE=a|touch F", "metacharacter '|'"),
    ("AFD_IMAGE=a&touch F", "metacharacter '&'"),
    ("AFD_IMAGE=a>F", "metacharacter '>'"),
    ("AFD_FABRIC_IP=192.168.100.10\r", "carriage return"),
    ("AFD_FABRIC_IP=192.168.100.10\vAFD_ROLE=expert", "vertical tab"),
    ("AFD_FABRIC_IP=192.168.100.10\u2028AFD_ROLE=expert", "U+2028"),
    ("AFD_FABRIC_IP=192.168.100.10\x85", "NEL"),
    ("AFD_ROLE=expert\x00", "control character"),
])
def test_8_launch_env_refuses_what_the_shell_would_read_otherwise(tmp_path, capsys, line, words):
    import subprocess

    env = tmp_path / "rank.env"
    env.write_text("# rank\nAFD_ROLE=expert\n" + line + "\n", encoding="utf-8")
    assert run(["all", "--snapshot", str(FAB), "--launch-env", str(env), "--json", "--no-history"]) == 64
    err = capsys.readouterr().err
    assert f"{env}:3" in err and words in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) <= 2
    assert not (tmp_path / "F").exists()
    if "\x00" not in line:  # what bash makes of the line is not what afddiag would have judged
        subprocess.run(["bash", "-c", f"cd {tmp_path} && set -a && . ./rank.env"], capture_output=True, timeout=10)


@pytest.mark.parametrize("line,value", [
    ("AFD_IMAGE='x;touch F'", "x;touch F"),
    ('AFD_IMAGE="nvcr.io/nvidia/pytorch:24.05-py3"', "nvcr.io/nvidia/pytorch:24.05-py3"),
    ("NCCL_IB_HCA=^=mlx5_0:1,mlx5_1 # rails", "^=mlx5_0:1,mlx5_1"),
    ("export AFD_PEER_FABRIC_IPS='10.0.0.1 10.0.0.2'", "10.0.0.1 10.0.0.2"),
    ("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1", "192.168.100.10=rocep1s0f1"),
])
def test_8_launch_env_accepts_what_bash_sets_literally(tmp_path, line, value):
    import subprocess

    from afddiag.envvars import parse_launch_env

    env = tmp_path / "rank.env"
    env.write_text(line + "\n")
    key = line.removeprefix("export ").split("=", 1)[0]
    assert parse_launch_env(env.read_text(), str(env))[key] == value
    got = subprocess.run(["bash", "-c", f"set -a; . {env}; printf %s \"${key}\""], capture_output=True, text=True)
    assert got.stdout == value  # the shell sets exactly what afddiag judged


@pytest.mark.parametrize("script,args", [("launch-coordinator.sh", []), ("launch-expert.sh", ["3"])])
def test_8_example_launchers_never_run_a_line_afddiag_refused(tmp_path, script, args):
    from test_launch import launcher

    env = tmp_path / "rank.env"
    flag = tmp_path / "F"
    env.write_text(f"AFD_FABRIC_IP=192.168.100.10\nAFD_IMAGE=x;touch {flag}\nAFD_ROLE=expert\n")
    p = launcher(script, env, *args, afddiag_args=f"--snapshot {FAB}")
    assert p.returncode == 64, p.stderr
    assert "refusing to start" in p.stderr and "metacharacter ';'" in p.stderr
    assert not flag.exists()  # the launcher did not source the file before afddiag read it


# 5. a probe that timed out or could not read is ERROR, never SKIP ---------------------------------

def test_5_a_timed_out_route_probe_is_error_not_skip(monkeypatch, capsys):
    import dataclasses
    import time

    from afddiag.probes import route as route_probe

    def hang(probe):
        real = probe.facts

        def facts(run_, r, progress):
            time.sleep(4)  # ip route get / the sysctls hung
            return real(run_, r, progress)

        return dataclasses.replace(probe, facts=facts)

    monkeypatch.setattr(route_probe, "PROBE", hang(route_probe.PROBE))
    fip = json.loads((FAB / "case.json").read_text())["fabric_ip"]
    code = run(["fabric", "--snapshot", str(FAB), "--fabric-ip", fip, "--peer", "10.0.0.9", "--json", "--no-history",
                "--timeout", "1"])
    rep = json.loads(capsys.readouterr().out)
    route = next(g for g in rep["gates"] if g["id"] == "fabric.route")
    assert route["verdict"] == "ERROR" and "route" in route["summary"], route
    assert code in (2, 3)


def test_5_a_route_lookup_that_timed_out_is_error_not_no_route():
    from afddiag.probes.route import route_from_get_json

    r = route_from_get_json("10.0.0.9", {"error": "ip route get did not answer within 1 s", "failed": True}, "ip")
    assert r.failed
    from afddiag.gates import Context, resolve_fabric_ip
    from afddiag.gates.fabric import route as route_gate
    from afddiag.model.fabric import RouteFacts
    from afddiag.model.run import Inputs, Observation
    from afddiag.probes.fabric import probe_fabric

    fab = probe_fabric(str(FAB))
    case = json.loads((FAB / "case.json").read_text())
    obs = Observation(host="h", source="t", fabric=fab,
                      route=RouteFacts(fabric_ip=case["fabric_ip"], routes=[r], routes_captured=True))
    inputs = Inputs(fabric_ip=case["fabric_ip"], peers=["10.0.0.9"])
    v = route_gate(Context(obs, inputs, resolve_fabric_ip(fab, inputs.fabric_ip)))
    assert v.verdict == "ERROR" and "did not answer" in v.summary


def test_5_an_unreadable_infiniband_class_is_error_not_no_device(tmp_path, monkeypatch):
    import errno as _errno

    from afddiag.probes import fabric
    from afddiag.probes.fabric import probe_fabric

    real = os.listdir

    def denied(path="."):
        if str(path).endswith("sys/class/infiniband"):
            raise PermissionError(_errno.EACCES, "Permission denied", str(path))
        return real(path)

    monkeypatch.setattr(fabric.os, "listdir", denied)
    facts = probe_fabric(str(FAB))
    assert facts.failed and "Permission denied" in facts.failed
    from afddiag.gates import probe_failed
    from afddiag.gates.fabric import rdma_present  # noqa: F401 - the gate below reads facts.failed

    assert probe_failed("fabric.rdma-present", facts).verdict == "ERROR"


# 9. / 10. children in their own process group; fixed delays inside --timeout ----------------------

def _hung_tool(tmp_path, name):
    """A fake ``name`` that starts a grandchild (pid in tmp_path/child.pid) and hangs."""
    tool = tmp_path / name
    tool.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path}/child.pid\nsleep 300\n")
    tool.chmod(0o755)
    return tool


def _gone(pid: int, within_s: float = 3.0) -> bool:
    import time

    t = time.monotonic() + within_s
    while time.monotonic() < t:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_9_a_hung_ip_leaves_no_orphan(tmp_path, monkeypatch):
    import time

    from afddiag.probes import route
    from afddiag.probes.route import route_get

    monkeypatch.setattr(route, "_iproute", lambda: None)  # the iproute2 fallback (no pyroute2) is what hangs
    _hung_tool(tmp_path, "ip")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    t0 = time.monotonic()
    got = route_get("10.0.0.9", None, 0.5)
    assert time.monotonic() - t0 < 3 and got.get("failed") and "did not answer" in got["error"]
    pid = int((tmp_path / "child.pid").read_text())
    assert _gone(pid), f"grandchild {pid} outlived the bound"


def test_10_drain_with_a_hung_scontrol_stays_inside_its_bound(tmp_path, monkeypatch, capsys):
    import time

    from afddiag import slurm

    sinfo = tmp_path / "sinfo"
    sinfo.write_text("#!/bin/sh\necho 'idle|none'\n")
    sinfo.chmod(0o755)
    monkeypatch.setenv("AFDDIAG_SINFO", str(sinfo))
    monkeypatch.setenv("AFDDIAG_SCONTROL", str(_hung_tool(tmp_path, "scontrol")))
    t0 = time.monotonic()
    assert slurm.drain_node(["fabric.link"], "n1", timeout_s=1.0) is False
    assert time.monotonic() - t0 < 2.5
    assert _gone(int((tmp_path / "child.pid").read_text()))


def test_10_a_held_history_lock_waits_no_longer_than_the_timeout(tmp_path, monkeypatch, capsys):
    import sqlite3
    import time

    from afddiag import history

    rep = {"gates": [], "host": "h", "exit_code": 0, "counts": {}}
    history.record_run(rep, "all")  # the store exists
    holder = sqlite3.connect(str(history.default_path()), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        t0 = time.monotonic()
        assert history.record_run(rep, "all", busy_s=0.5) is None
        assert time.monotonic() - t0 < 2
        assert "held by another run" in capsys.readouterr().err
    finally:
        holder.execute("ROLLBACK")
        holder.close()


# 10. escape sequences from untrusted text never reach the terminal --------------------------------

def test_10_device_name_escape_sequences_are_escaped_in_table_and_output(tmp_path, capsys):
    snap = _snap(tmp_path)
    ib = snap / "sys/class/infiniband"
    victim = sorted(os.listdir(ib))[0]
    evil = victim + "\x1b]0;pwned\x07\x1b[2J"
    os.rename(ib / victim, ib / evil)
    code = run(["fabric", "--snapshot", str(snap), "--no-history"])
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "\\x1b]0;pwned" in out
    assert code in (0, 1, 2, 3)


def test_10_a_non_utf8_device_name_with_output_is_written_not_a_traceback(tmp_path, capsys):
    snap = _snap(tmp_path)
    ib = snap / "sys/class/infiniband"
    victim = sorted(os.listdir(ib))[0]
    os.rename(os.fsencode(ib / victim), os.fsencode(ib) + b"/" + os.fsencode(victim) + b"\xff")
    for fmt in (["--json"], [], ["--format", "prometheus"]):
        out = tmp_path / "r.out"
        code = run(["fabric", "--snapshot", str(snap), "--no-history", "--output", str(out)] + fmt)
        err = capsys.readouterr().err
        assert code in (0, 1, 2, 3) and "Traceback" not in err, (fmt, err)
        assert out.stat().st_size > 0


def test_10_remote_stderr_escapes_are_escaped_in_the_fleet_table():
    import io

    from afddiag.fleet import judge, write_fleet_table
    from afddiag.gates.fleet import HostResult

    fr = judge([HostResult(name="h\x1b[31m", target="t", error="exit 1: not JSON; stderr: \x1b[2J\x9bboom")])
    buf = io.StringIO()
    write_fleet_table(fr, buf)
    assert "\x1b" not in buf.getvalue() and "\x9b" not in buf.getvalue() and "\\x1b[2J" in buf.getvalue()


# 7. the fuzzer runs from any clone and working directory ----------------------------------------

def test_7_run_fuzz_finds_the_cases_from_any_working_directory(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    script = REPO / "tests" / "fuzz" / "run_fuzz.py"
    env = {k: v for k, v in os.environ.items() if k != "AFDDIAG_CASES"}
    p = subprocess.run([sys.executable, str(script), "--seconds", "1", "--targets", "inventory"], cwd=tmp_path,
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "inventory:" in p.stdout, p.stderr[-2000:]
    p = subprocess.run([sys.executable, str(script), "--seconds", "1"], cwd=tmp_path, capture_output=True, text=True,
                       env={**env, "AFDDIAG_CASES": str(tmp_path / "nowhere")}, timeout=120)
    assert p.returncode == 2 and "set AFDDIAG_CASES" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("kind", ["folder", "fifo", "dev-zero", "not-utf8"])
def test_7_an_unreadable_snapshot_host_file_is_a_note_not_a_traceback(tmp_path, capsys, kind):
    snap = _snap(tmp_path)
    (snap / "case.json").unlink()
    host = snap / "host"
    if kind == "folder":
        host.mkdir()
    elif kind == "fifo":
        os.mkfifo(host)
    elif kind == "dev-zero":
        host.symlink_to("/dev/zero")
    else:
        host.write_bytes(b"node\xff\x1b[2J\n")
    code, rep, _ = _json_run(capsys, ["all", "--snapshot", str(snap), "--timeout", "3"])
    assert rep is not None and code in (0, 1, 2, 3)
    assert "\x1b" not in rep["host"] or kind == "not-utf8"
    if kind != "not-utf8":
        assert rep["host"] == "snap" and any("host refused" in n for n in rep["notes"]), rep["notes"]


def test_10_a_full_disk_is_said_as_such_not_cannot_rollback(monkeypatch, capsys):
    import sqlite3

    from afddiag import history

    rep = {"gates": [], "host": "h", "exit_code": 0, "counts": {}}

    def full(con, report, command):
        con.execute("COMMIT")  # SQLite ends the transaction itself when the disk fills
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(history, "insert_run", full)
    monkeypatch.setattr(history, "_warned", False)
    assert history.record_run(rep, "all") is None
    err = capsys.readouterr().err
    assert "no space left on the device" in err and "rollback" not in err, err
