"""`afddiag fleet` against real OpenSSH servers on loopback.

Each "host" is its own sshd (127.0.0.1, its own port) whose ForceCommand answers from a snapshot
(`<the requested afddiag command> --snapshot <case>`), with a generated host key listed in a test
known_hosts and a generated client key. Also: one host down (nothing listening), one slower than
the per-host timeout, one printing garbage, one whose host key is not the one known_hosts lists, and
one without ForceCommand that `--push` copies the zipapp to (run by /usr/bin/python3, which has
neither click nor rich nor psutil: the zipapp must be self-contained).

Needs openssh-server (lab/setup.sh installs it); outside CI a missing sshd skips, under CI it fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from afddiag import cli
from conftest import CASES

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")
# the "pushed" host runs SFTP as a program (internal-sftp cannot run under its ForceCommand wrapper)
SFTP_SERVER = next((p for p in ("/usr/lib/openssh/sftp-server", "/usr/libexec/openssh/sftp-server",
                                "/usr/libexec/sftp-server", "/usr/lib/ssh/sftp-server") if os.path.exists(p)), None)
FABRIC = CASES / "fabric"
TIMEOUT_S = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, deadline_s: float = 10.0) -> None:
    t = time.monotonic() + deadline_s
    while time.monotonic() < t:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on port {port} did not listen within {deadline_s}s")


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="module")
def sshfleet(tmp_path_factory):
    if not (os.path.exists(SSHD) and shutil.which("ssh-keygen")):
        msg = "openssh-server not installed (lab/setup.sh installs it)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    if os.geteuid() != 0:
        pytest.skip("sshd test hosts log in as root: run as root")
    pytest.importorskip("ClusterShell")
    d = tmp_path_factory.mktemp("fleet")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    host_pub = _keygen(d / "hostkey")
    _keygen(d / "otherkey")  # the impostor's key: not in known_hosts
    client_pub = _keygen(d / "client")
    (d / "authorized_keys").write_text(client_pub + "\n")
    envs = {
        "coord": "AFD_ROLE=coordinator\nAFD_PREFILL_CAPACITY=256\n"
                 "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.101.10=roceP2p1s0f1\n",
        "spark-a": "AFD_ROLE=expert\nAFD_EXPERT_CAPACITY=256\n",
        "spark-b": "AFD_ROLE=expert\nAFD_EXPERT_CAPACITY=128\n"
                   "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1\n",
    }
    for n, text in envs.items():
        (d / f"{n}.env").write_text(text)
    snap = {"coord": FABRIC / "10-spark-mtu-1500-vs-peer-9000",
            "spark-a": FABRIC / "01-spark-fabric-ip-on-nonfirst-device",
            "spark-b": FABRIC / "02-spark-map-set-healthy", "pushed": FABRIC / "02-spark-map-set-healthy"}
    wrappers = {
        "coord": f'eval "$SSH_ORIGINAL_COMMAND --snapshot {snap["coord"]}"',
        "spark-a": f'eval "$SSH_ORIGINAL_COMMAND --snapshot {snap["spark-a"]}"',
        "spark-b": f'eval "$SSH_ORIGINAL_COMMAND --snapshot {snap["spark-b"]}"',
        "slow": "sleep 60",
        "garbage": "echo 'afddiag: this is {not JSON'",
        "impostor": f'eval "$SSH_ORIGINAL_COMMAND --snapshot {snap["spark-a"]}"',
        # runs what the client asks (SFTP, then the pushed zipapp) in this module's own login directory:
        # root's real ~/.cache/afddiag is shared with every other test run on the machine
        "pushed": f'cd {d / "pushed-home"} && eval "$SSH_ORIGINAL_COMMAND"',
    }
    (d / "pushed-home").mkdir()
    ports = {n: _free_port() for n in [*wrappers, "down"]}
    procs = []
    known = []
    for name, body in wrappers.items():
        cfg = [f"Port {ports[name]}", "ListenAddress 127.0.0.1",
               f"HostKey {d / ('otherkey' if name == 'impostor' else 'hostkey')}",
               f"PidFile {d / (name + '.pid')}", f"AuthorizedKeysFile {d / 'authorized_keys'}", "StrictModes no",
               "UsePAM no", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
               "PermitRootLogin prohibit-password", "LogLevel ERROR", "MaxStartups 50",
               f"Subsystem sftp {SFTP_SERVER if name == 'pushed' and SFTP_SERVER else 'internal-sftp'}"]
        if body is not None:
            w = d / f"wrap-{name}.sh"
            w.write_text("#!/bin/sh\n" + body + "\n")
            w.chmod(0o755)
            cfg.append(f"ForceCommand {w}")
        (d / f"sshd-{name}.conf").write_text("\n".join(cfg) + "\n")
        log = open(d / f"sshd-{name}.log", "w")
        procs.append(subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / f"sshd-{name}.conf")], stdout=log,
                                      stderr=subprocess.STDOUT))
        known.append(f"[127.0.0.1]:{ports[name]} {host_pub}")
    known.append(f"[127.0.0.1]:{ports['down']} {host_pub}")
    (d / "known_hosts").write_text("\n".join(known) + "\n")
    try:
        for name in wrappers:
            _wait_port(ports[name])
        afd = f"{sys.executable} -m afddiag"
        fip = {"coord": "192.168.101.10", "spark-a": "192.168.100.10", "spark-b": "192.168.100.11",
               "slow": "192.168.100.13", "garbage": "192.168.100.14", "impostor": "192.168.100.15",
               "down": "192.168.100.16", "pushed": "192.168.100.11"}
        roles = {"coord": "coordinator"}
        lines = ["[fleet]", f'known_hosts = "{d / "known_hosts"}"', f'identity = "{d / "client"}"',
                 f'afddiag = "{afd}"', "concurrency = 8", f"timeout_s = {TIMEOUT_S}", "connect_timeout_s = 5",
                 'peers = "none"', ""]
        for name in ["coord", "spark-a", "spark-b", "slow", "garbage", "impostor", "down"]:
            lines += ["[[host]]", f'name = "{name}"', f'ssh = "root@127.0.0.1:{ports[name]}"',
                      f'role = "{roles.get(name, "expert")}"', f'fabric_ip = "{fip[name]}"']
            if name in envs:
                lines.append(f'launch_env = "{d / (name + ".env")}"')
            lines.append("")
        (d / "fleet.toml").write_text("\n".join(lines))
        push_inv = [ln for ln in lines[:9] if not ln.startswith("afddiag")] + [
            "[[host]]", 'name = "pushed"', f'ssh = "root@127.0.0.1:{ports["pushed"]}"', 'role = "expert"',
            f'fabric_ip = "{fip["pushed"]}"', f'launch_env = "{d / "spark-b.env"}"', 'python = "/usr/bin/python3"',
            f'args = ["--snapshot", "{snap["pushed"]}"]', ""]
        (d / "push.toml").write_text("\n".join(push_inv))
        yield {"dir": d, "inventory": d / "fleet.toml", "push_inventory": d / "push.toml", "ports": ports}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _fleet(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.run(["fleet", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def fleet_json(sshfleet):
    """One `afddiag fleet --json` run over the loopback fleet (module-scoped: ~TIMEOUT_S seconds)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    t = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.run(["fleet", "--inventory", str(sshfleet["inventory"]), "--json"])
    return {"rc": rc, "report": json.loads(out.getvalue()), "stderr": err.getvalue(),
            "elapsed_s": time.monotonic() - t}


def _row(fr: dict, name: str) -> dict:
    return next(r for r in fr["hosts"] if r["name"] == name)


def _gate(fr: dict, gid: str) -> dict:
    return next(g for g in fr["gates"] if g["id"] == gid)


def test_healthy_hosts_complete_and_bad_ones_are_error_rows(fleet_json):
    fr = fleet_json["report"]
    assert [r["name"] for r in fr["hosts"]] == ["coord", "spark-a", "spark-b", "slow", "garbage", "impostor", "down"]
    for n in ("coord", "spark-a", "spark-b"):
        r = _row(fr, n)
        assert r["status"] == "ok", r
        assert fr["reports"][n]["inputs"]["launch_env"].endswith(f"{n}.env")
    assert fr["reports"]["coord"]["inputs"]["role"] == "coordinator"
    assert fr["reports"]["spark-a"]["inputs"]["fabric_ip"] == "192.168.100.10"
    slow, garbage, imp, down = (_row(fr, n) for n in ("slow", "garbage", "impostor", "down"))
    assert slow["status"] == "ERROR" and f"timed out after {TIMEOUT_S} s while running afddiag" in slow["error"]
    assert garbage["status"] == "ERROR" and "not JSON" in garbage["error"] and "this is {not JSON" in garbage["error"]
    assert imp["status"] == "ERROR" and "host key not verified" in imp["error"]
    assert down["status"] == "ERROR" and "unreachable" in down["error"] and "refused" in down["error"]
    assert fr["hosts_ok"] == 3 and fr["hosts_error"] == 4
    # the slow host did not hold the others: everything ended around one per-host timeout
    assert fleet_json["elapsed_s"] < TIMEOUT_S + 8
    assert fleet_json["rc"] == 2  # FAILs below


def test_cross_host_gates_name_the_host(fleet_json):
    fr = fleet_json["report"]
    cap = _gate(fr, "fleet.capacity")
    assert cap["verdict"] == "FAIL" and cap["summary"].startswith("spark-b AFD_EXPERT_CAPACITY=128"), cap
    assert "coordinator coord's AFD_PREFILL_CAPACITY=256" in cap["summary"]
    dm = _gate(fr, "fleet.devicemap")
    assert dm["verdict"] == "FAIL"
    assert dm["summary"].startswith("spark-a: DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP not set")
    mtu = _gate(fr, "fleet.mtu")
    # judged against the role's target (RoCE MTU 4096), not the majority: the two hosts at 1024 are named
    assert mtu["verdict"] == "FAIL" and mtu["summary"].startswith("coord RoCE MTU 1024"), mtu
    assert "spark-a RoCE MTU 1024" in mtu["summary"] and "spark-b" not in mtu["summary"].split(":")[0], mtu
    assert "differ from the role's target RoCE MTU 4096" in mtu["summary"], mtu
    assert mtu["facts"]["roce_mtu"] == {"coord": 1024, "spark-a": 1024, "spark-b": 4096}
    fip = _gate(fr, "fleet.fabric-ip")
    assert fip["facts"]["fabric_ips"] == {"coord": "192.168.101.10", "spark-a": "192.168.100.10",
                                          "spark-b": "192.168.100.11"}
    assert fip["verdict"] == "FAIL", fip
    assert fip["summary"].startswith("coord 192.168.101.10 (192.168.101.0/24): not on the fleet's subnet "
                                     "192.168.100.0/24"), fip
    for g in fr["gates"]:
        assert "4 host(s) without a report not judged: slow, garbage, impostor, down" in g["summary"], g


def test_progress_on_stderr_per_host(fleet_json):
    err = fleet_json["stderr"]
    for n in ("coord", "spark-a", "spark-b"):
        assert f"{n}: done: exit" in err
    assert "slow: ERROR: timed out" in err and "down: ERROR: unreachable" in err
    assert "garbage: running" in err


def test_fleet_table_plain(sshfleet, capsys):
    # 12 s, not the inventory's 10: seven ssh handshakes and three afddiag runs at once take 4-7 s on a
    # loaded 2-core machine
    rc, out, err = _fleet(capsys, "--inventory", str(sshfleet["inventory"]), "--quiet", "--timeout", "12")
    print(out, file=sys.stderr)  # the table, for the record (pytest -s shows it)
    assert rc == 2
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["host", "role", "collected"]
    assert any(ln.startswith("slow ") and "ERROR" in ln and "timed out after 12 s" in ln for ln in lines), out
    assert any(ln.split()[:3] == ["FAIL", "fleet.capacity", "spark-b"] for ln in lines), out
    assert "3 host(s) reported, 4 without a report" in out
    assert err == ""  # --quiet


def test_unknown_known_hosts_file_refuses_every_host(sshfleet, capsys, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    rc, out, _ = _fleet(capsys, "--inventory", str(sshfleet["inventory"]), "--json", "--known-hosts", str(empty),
                        "--quiet", "--timeout", "4")
    fr = json.loads(out)
    assert rc == 3
    assert all(r["status"] == "ERROR" for r in fr["hosts"])
    assert "host key not verified" in _row(fr, "coord")["error"]


def test_push_runs_the_zipapp_on_a_bare_python(sshfleet, capsys, tmp_path, monkeypatch):
    """/usr/bin/python3 here has no click, rich or psutil: the pushed zipapp brings click and rich.
    The zipapp is built in this test's own cache (XDG_CACHE_HOME) and lands in the "pushed" host's
    own login directory (its sshd starts SFTP and the command there), never in a shared ~/.cache."""
    if SFTP_SERVER is None:
        msg = "openssh-sftp-server not installed (lab/setup.sh installs it)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    remote = sshfleet["dir"] / "pushed-home" / ".cache" / "afddiag"
    shutil.rmtree(remote, ignore_errors=True)
    rc, out, err = _fleet(capsys, "--inventory", str(sshfleet["push_inventory"]), "--json", "--push")
    fr = json.loads(out)
    row = _row(fr, "pushed")
    assert row["status"] == "ok", (row, err)
    rep = fr["reports"]["pushed"]
    assert rep["inputs"]["launch_env"].endswith("spark-b.env")
    assert rep["host"] == "spark-b" and rep["afddiag_version"]
    assert "copying the zipapp (scp)" in err and ".cache/afddiag/afddiag-" in err
    (local,) = (tmp_path / "cache" / "afddiag").glob("afddiag-*.pyz")  # built here, copied there
    (pushed,) = remote.glob("afddiag-*.pyz")
    assert pushed.name == f"afddiag-{hashlib.sha256(local.read_bytes()).hexdigest()[:16]}.pyz"
    assert pushed.read_bytes() == local.read_bytes() and list(remote.glob("*.part")) == []
    # a second run finds the same content there (same sha256) and does not copy it again
    os.utime(pushed, (1, 1))  # a copy would make it new again
    rc2, out2, err2 = _fleet(capsys, "--inventory", str(sshfleet["push_inventory"]), "--json", "--push")
    assert _row(json.loads(out2), "pushed")["status"] == "ok"
    assert pushed.stat().st_mtime == 1 and "same sha256" in err2 and "copying" not in err2


def test_push_never_runs_a_different_file_at_the_remote_name(sshfleet, capsys, tmp_path, monkeypatch):
    """Another file where the zipapp should be (a stale or tampered copy, same name and size): it is
    replaced by the real one and never run."""
    if SFTP_SERVER is None:
        pytest.skip("openssh-sftp-server not installed")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    home = sshfleet["dir"] / "pushed-home"
    rc, out, err = _fleet(capsys, "--inventory", str(sshfleet["push_inventory"]), "--json", "--push", "--quiet")
    (pushed,) = (home / ".cache" / "afddiag").glob("afddiag-*.pyz")
    good = pushed.read_bytes()
    marker = home / "impostor-ran"
    marker.unlink(missing_ok=True)
    bad = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran'); print('{{}}')\n".encode()
    pushed.write_bytes(bad.ljust(len(good), b"#"))  # same size: a size check would take it
    rc, out, err = _fleet(capsys, "--inventory", str(sshfleet["push_inventory"]), "--json", "--push")
    assert _row(json.loads(out), "pushed")["status"] == "ok", err
    assert not marker.exists() and pushed.read_bytes() == good
    assert "copying the zipapp (scp)" in err


def test_push_run_step_refuses_content_that_changed_after_the_copy(tmp_path):
    """The run step hashes the file again just before running it: other content there is not run
    (exit 97, stderr says why), the zipapp's own content is."""
    from afddiag.fleet.ssh import REMOTE_DIR, _Push

    app = tmp_path / "app.pyz"
    app.write_bytes(b"import sys; print('ran', sys.argv[1:])\n")
    push = _Push.of(str(app))
    there = tmp_path / "home" / REMOTE_DIR
    there.mkdir(parents=True)
    (there / push.name).write_bytes(b"import sys; print('IMPOSTOR')\n")
    cmd = push.run_command(sys.executable, ["all", "--json"], fresh_copy=False)
    r = subprocess.run(cmd, shell=True, cwd=tmp_path / "home", capture_output=True, text=True)
    assert r.returncode == 97 and "IMPOSTOR" not in r.stdout and "content differs" in r.stderr, r
    shutil.copy(app, there / (push.name + ".part"))
    r = subprocess.run(push.run_command(sys.executable, ["all", "--json"], fresh_copy=True), shell=True,
                       cwd=tmp_path / "home", capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "ran ['all', '--json']\n", r
    assert not (there / (push.name + ".part")).exists()


@pytest.mark.parametrize("kind", ["directory", "link to /dev/null"])
def test_identity_that_is_not_a_regular_file_is_refused(tmp_path, capsys, kind):
    pytest.importorskip("ClusterShell")
    ident = tmp_path / "id"
    if kind == "directory":
        ident.mkdir()
    else:
        ident.symlink_to("/dev/null")
    (tmp_path / "known_hosts").write_text("")
    inv = tmp_path / "inv.toml"
    inv.write_text(f'[fleet]\nknown_hosts = "{tmp_path / "known_hosts"}"\n[[host]]\nname = "a"\nssh = "127.0.0.1:1"\n')
    rc, out, err = _fleet(capsys, "--inventory", str(inv), "--identity", str(ident))
    assert rc == 64 and out == ""
    words = "a directory" if kind == "directory" else "not a regular file"
    assert f"identity {ident}: {words}" in err and "Traceback" not in err and "connecting" not in err, err


def _unshare_ok() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0


def test_user_ssh_config_cannot_weaken_the_host_key_check(sshfleet, tmp_path):
    """The user's ~/.ssh/config and /etc/ssh/ssh_config say StrictHostKeyChecking no and
    UserKnownHostsFile /dev/null (ssh reads them from the passwd home, not $HOME: they are bound over it
    in a private mount namespace); plain ssh there takes them, afddiag fleet still refuses the impostor."""
    if not _unshare_ok():
        pytest.skip("needs unshare -m (a private mount namespace)")
    import pwd

    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    hostile = "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n"
    (home / ".ssh" / "config").write_text(hostile)
    (tmp_path / "ssh_config").write_text(hostile)
    pw_dir = pwd.getpwuid(os.getuid()).pw_dir
    script = (f"mount --make-rprivate / && mount --bind {home} {pw_dir} && "
              f"mount --bind {tmp_path / 'ssh_config'} /etc/ssh/ssh_config && "
              "ssh -G 127.0.0.1 | grep -i '^stricthostkeychecking' && "
              f"exec {sys.executable} -m afddiag fleet --inventory {sshfleet['inventory']} --json --quiet "
              "--nodes impostor,spark-a")
    r = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(home)})
    first, _, rest = r.stdout.partition("\n")
    assert first == "stricthostkeychecking false", r  # the hostile config is in effect for plain ssh
    fr = json.loads(rest)
    assert [h["name"] for h in fr["hosts"]] == ["spark-a", "impostor"]
    assert _row(fr, "spark-a")["status"] == "ok", fr["hosts"]
    imp = _row(fr, "impostor")
    assert imp["status"] == "ERROR" and "host key not verified" in imp["error"], imp


def test_no_temp_files_or_ssh_processes_left(sshfleet, capsys, monkeypatch):
    """The per-run ssh config is in a private temporary folder that is gone after the run, a timed-out
    host included; no ssh process outlives it."""
    import tempfile

    import psutil

    made: list[str] = []
    real = tempfile.mkdtemp

    def mkdtemp(*a, **k):
        made.append(real(*a, **k))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    rc, out, _ = _fleet(capsys, "--inventory", str(sshfleet["inventory"]), "--json", "--quiet", "--timeout", "8",
                        "--nodes", "slow,spark-a")
    rows = {r["name"]: r for r in json.loads(out)["hosts"]}
    assert "timed out after 8 s" in rows["slow"]["error"] and rows["spark-a"]["status"] == "ok"
    assert made and not any(os.path.exists(p) for p in made), made
    assert [c for c in psutil.Process().children(recursive=True) if c.name() in ("ssh", "scp")] == []


def test_fan_out_window_bounds_ssh_processes_at_once(sshfleet, capsys):
    """--concurrency 2 is ClusterShell's fan-out window: never more than two hosts between their start
    and their end (read from the progress lines, which come from ClusterShell's events)."""
    rc, out, err = _fleet(capsys, "--inventory", str(sshfleet["inventory"]), "--json", "--concurrency", "2",
                          "--timeout", "12", "--nodes", "coord,spark-a,spark-b,garbage,impostor,down")
    running, most = set(), 0
    for ln in err.splitlines():
        host, _, state = ln.partition("] ")[2].partition(": ")
        if state.startswith("connecting"):
            running.add(host)
        elif state.startswith(("done", "ERROR")):
            running.discard(host)
        most = max(most, len(running))
    assert most == 2, err
    assert sum(r["status"] == "ok" for r in json.loads(out)["hosts"]) == 3
