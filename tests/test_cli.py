"""The command line as a user meets it: exit codes, JSON alone on stdout, plain output, device maps."""

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
from click.testing import CliRunner

from afddiag import __version__
from afddiag.cli import cli, run
from conftest import CASES, load_case

C01 = str(CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device")
C02 = str(CASES / "fabric" / "02-spark-map-set-healthy")
C07 = str(CASES / "fabric" / "07-ipv6-only-no-ipv4-gid")


def invoke(args, env=None):
    return CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False, env=env)


def test_usage_errors_exit_64_with_one_clear_line(capsys):
    assert run(["fabric", "--fabric-ip", "10.9.0"]) == 64
    err = capsys.readouterr().err
    assert "'10.9.0' is not an IPv4 address" in err
    assert run(["all", "--snapshot", "/nonexistent/snap"]) == 64
    assert "not a directory" in capsys.readouterr().err
    assert run(["fabric", "--snapshot", "/etc/passwd"]) == 64
    assert "capture bundle FILE.tar.gz" in capsys.readouterr().err
    assert run(["nosuchcommand"]) == 64
    assert run(["gpu", "--expect-sm", "0"]) == 64


def test_exit_codes_follow_worst_verdict():
    assert run(["fabric", "--json", "--snapshot", C01, "--fabric-ip", "192.168.100.10"]) == 2
    assert run(["fabric", "--json", "--snapshot", C02, "--fabric-ip", "192.168.100.11"]) == 0
    assert run(["fabric", "--json", "--snapshot", str(CASES / "fabric" / "10-spark-mtu-1500-vs-peer-9000"),
                "--fabric-ip", "192.168.101.10"]) == 1


def test_json_is_alone_on_stdout_and_valid(report_schema):
    proc = subprocess.run([sys.executable, "-m", "afddiag", "all", "--json", "--snapshot", C01],
                          capture_output=True, text=True)
    rep = json.loads(proc.stdout)  # nothing but JSON on stdout
    jsonschema.validate(rep, report_schema)
    # two addressed rails and no --fabric-ip: the gates that need one WARN "ambiguous", never guess; but the
    # first enumerated device (rocep1s0f0) carries neither candidate, so first-device FAILs whichever it is
    assert proc.returncode == rep["exit_code"] == 2
    assert rep["inputs"]["fabric_ip"] is None and rep["inputs"]["fabric_ip_source"] == "ambiguous"
    link = next(g for g in rep["gates"] if g["id"] == "fabric.link")
    assert link["verdict"] == "WARN" and "ambiguous" in link["summary"]
    first = next(g for g in rep["gates"] if g["id"] == "fabric.first-device")
    assert first["verdict"] == "FAIL" and "192.168.100.10" in first["summary"] and "192.168.101.10" in first["summary"]
    assert "rocep1s0f0" in first["summary"] and first["action"] == "SET_ENV"
    assert rep["device_map"] == {"192.168.100.10": "rocep1s0f1", "192.168.101.10": "roceP2p1s0f1"}


def test_schema_rejects_a_wrong_report(report_schema):
    rep = json.loads(invoke(["fabric", "--json", "--snapshot", C02]).stdout)
    rep["gates"][0]["verdict"] = "OK"
    try:
        jsonschema.validate(rep, report_schema)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("schema accepted verdict OK")


def test_plain_table_without_tty_names_subject_and_remedy():
    out = invoke(["fabric", "--snapshot", C01, "--fabric-ip", "192.168.100.10"], env={"NO_COLOR": "1"}).stdout
    assert "\x1b[" not in out
    line = next(ln for ln in out.splitlines() if "fabric.first-device" in ln and not ln.startswith(" "))
    assert line.startswith("FAIL") and "rocep1s0f0" in line
    assert "remedy: set DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP in this host's launch file" in out
    # the command alone on its line, under the remedy in the diagnosis and under the gate's line
    export = "export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1"
    assert len([ln for ln in out.splitlines() if ln.strip() == export]) == 2, out
    assert out.rstrip().endswith("exit 2")


def test_devicemap_formats():
    assert invoke(["devicemap", "--snapshot", C01]).stdout.strip() == (
        "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1,192.168.101.10=roceP2p1s0f1")
    assert invoke(["devicemap", "--snapshot", C01, "--format", "shell"]).stdout.strip() == (
        "export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1,192.168.101.10=roceP2p1s0f1")
    assert json.loads(invoke(["devicemap", "--snapshot", C01, "--format", "json"]).stdout) == {
        "192.168.100.10": "rocep1s0f1", "192.168.101.10": "roceP2p1s0f1"}


def test_devicemap_with_no_ipv4_rocev2_says_so_and_exits_2():
    res = invoke(["devicemap", "--snapshot", C07])
    assert res.return_value == 2 and res.stdout == ""
    assert "no IPv4 RoCE v2 GID" in res.stderr


def test_devicemap_with_a_fabric_ip_not_in_the_map_exits_2_in_every_format():
    messages = set()
    for fmt in ("env", "shell", "json", "nccl"):
        res = invoke(["devicemap", "--snapshot", C02, "--fabric-ip", "10.1.1.1", "--format", fmt])
        assert res.return_value == 2 and res.stdout == "", fmt
        messages.add(res.stderr)
    assert len(messages) == 1
    (msg,) = messages
    assert msg.count("\n") == 1 and "10.1.1.1" in msg and "--fabric-ip" in msg
    # an IP that is in the map still prints it
    ok = invoke(["devicemap", "--snapshot", C02, "--fabric-ip", "192.168.100.11", "--format", "shell"])
    assert ok.return_value == 0 and "192.168.100.11=" in ok.stdout


def test_version():
    assert run(["--version"]) == 0
    assert __version__ in invoke(["--version"]).stdout


def test_devicemap_names_a_rocev1_only_address_not_a_missing_one():
    """Case 09: the address is on the netdev, offered only as RoCE v1: the fix is the HCA's RoCE mode,
    not 'put the fabric address on the RoCE netdev', with or without --fabric-ip."""
    c09 = str(CASES / "fabric" / "09-rocev1-only-entry")
    ip = load_case(Path(c09))["fabric_ip"]
    for extra in ([], ["--fabric-ip", ip]):
        res = invoke(["devicemap", "--snapshot", c09, *extra])
        assert res.return_value == 2 and res.stdout == ""
        assert "only as RoCE v1" in res.stderr and "enable RoCE v2" in res.stderr and ip in res.stderr, res.stderr
        assert "put the fabric address" not in res.stderr and res.stderr.count("\n") == 1


def test_no_map_reason_names_each_cause():
    from afddiag.endpoint import no_map_reason
    from afddiag.model import ROCE_V1
    from afddiag.model.fabric import FabricFacts, Gid, Netdev, Port, RdmaDevice

    def fab(gtype, holds=True):
        nd = Netdev(name="eth0", ipv4=["10.0.0.5/24"] if holds else [])
        g = Gid(index=1, gid="0000:0000:0000:0000:0000:ffff:0a00:0005", type=gtype, netdev="eth0", ipv4="10.0.0.5")
        return FabricFacts(devices=[RdmaDevice(name="mlx5_0", ports=[Port(num=1, state="ACTIVE", gids=[g])])],
                           netdevs={"eth0": nd})

    assert "no RDMA device" in no_map_reason(FabricFacts())
    assert "only as RoCE v1 (10.0.0.5 on mlx5_0 port 1 GID 1)" in no_map_reason(fab(ROCE_V1))
    assert "GID type of 10.0.0.5 on mlx5_0 port 1 GID 1 was not read" in no_map_reason(fab(None))
    assert "netdev does not hold the address" in no_map_reason(fab("RoCE v2", holds=False))
    assert no_map_reason(fab(ROCE_V1), "10.9.9.9").startswith("fabric IP 10.9.9.9: no GID on this host carries it")
    assert no_map_reason(fab("RoCE v2"), "10.9.9.9").endswith("(the map names 10.0.0.5)")


# ---------------------------------------------------------------- one resolver (issue 21): role, fabric IP, sources


def _report(capsys, *args):
    rc = run(["all", "--json", "--no-history", "--no-qp", "--snapshot", C02, *args])
    rep = json.loads(capsys.readouterr().out)
    assert rep["exit_code"] == rc
    return rep


def test_role_and_fabric_ip_carry_where_they_came_from(tmp_path, capsys):
    env = tmp_path / "rank.env"
    env.write_text("AFD_ROLE=expert\nAFD_FABRIC_IP=192.168.100.11\n")
    rep = _report(capsys, "--launch-env", str(env))
    assert rep["inputs"]["fabric_ip"] == "192.168.100.11"
    assert rep["inputs"]["fabric_ip_source"] == f"AFD_FABRIC_IP in {env}"
    assert rep["expectations"]["fabric_ip"] == {"value": "192.168.100.11", "source": f"AFD_FABRIC_IP in {env}"}
    assert rep["expectations"]["role"] == {"value": "expert", "source": f"AFD_ROLE in {env}"}
    # the command line wins over the file, and says so
    rep = _report(capsys, "--launch-env", str(env), "--fabric-ip", "192.168.101.11", "--role", "generic")
    assert rep["inputs"]["fabric_ip_source"] == "--fabric-ip" and rep["inputs"]["fabric_ip"] == "192.168.101.11"
    assert rep["expectations"]["role"] == {"value": "generic", "source": "--role generic"}
    # nothing given: the only IPv4 RoCE v2 address is derived from the facts, and the role is the default
    rep = _report(capsys)
    assert rep["expectations"]["role"]["source"].startswith("default")
    src = rep["inputs"]["fabric_ip_source"]
    assert src in ("ambiguous", "none") or src.startswith("only IPv4"), src


def test_the_fabric_ip_is_resolved_once_a_run(monkeypatch, capsys):
    """The runner resolves it right after the fabric probe; the QP walk, route and reach probes, the gates
    and the report read that one (before: each asked again, 6+ times a run)."""
    from afddiag import endpoint

    calls = []
    real = endpoint.resolve_fabric_ip
    monkeypatch.setattr(endpoint, "resolve_fabric_ip", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    rep = _report(capsys, "--fabric-ip", "192.168.100.11", "--peer", "192.168.100.10")
    assert rep["inputs"]["fabric_ip"] == "192.168.100.11"
    assert len(calls) == 1, calls
