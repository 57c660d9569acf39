"""A remedy is prose plus commands that paste (issue 23): every command of every report is one complete
command ``bash -n`` accepts, a host's value is one word in it whatever its name holds, and the text views
print each command alone on its own lines, never broken where the shell would read something else."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from afddiag.render import command_lines
from afddiag.report import write_table
from afddiag.shellcmd import command, export, fill, lines
from conftest import case_dirs, load_case

FIX = Path(__file__).parent / "fixtures"
BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is the shell the commands are written for")

#: Values a host, a snapshot or a launch file may hand us: spaces, quotes, command substitution, a
#: separator, a newline, a glob, a leading dash, a backslash, a comma (where the renderer may break).
HOSTILE = ["a b", "it's", 'say "hi"', "$(touch PWNED)", "`touch PWNED`", "x;touch PWNED", "x\ntouch PWNED",
           "*", "-rf", "back\\slash", "a,b,c", "${IFS}", "'$(touch PWNED)'", "ünï"]


def _cli_json(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout)


def _case_args(case: Path) -> list[str]:
    meta = load_case(case)
    args = ["all", "--json", "--no-history", "--snapshot", str(case)]
    if meta.get("fabric_ip"):
        args += ["--fabric-ip", meta["fabric_ip"]]
    for peer in meta.get("peer_fabric_ips") or []:
        args += ["--peer", peer]
    return args


def _reports(tmp: Path) -> list[tuple[str, dict]]:
    """Every shared case as the case tests replay it, and again in the expert role with its launch file;
    the recorded GPU fixtures; the recorded lab fleets merged by this afddiag (host and fleet gates)."""
    out = []
    for case in case_dirs("fabric") + case_dirs("gpu"):
        out.append((case.name, _cli_json(_case_args(case))))
        env = ["--launch-env", str(case / "env")] if (case / "env").is_file() else []
        out.append((f"{case.name} expert", _cli_json(_case_args(case) + ["--role", "expert"] + env)))
    for fx in sorted(p for p in (FIX / "gpu").iterdir() if (p / "gpu.json").is_file()):
        out.append((fx.name, _cli_json(["all", "--json", "--no-history", "--snapshot", str(fx)])))
    for rec in sorted((FIX / "lab-fleet").glob("*.json")):
        live = json.loads(rec.read_text())
        f = tmp / f"{rec.stem}.json"
        f.write_text(json.dumps(list(live["reports"].values())))
        out.append((rec.stem, _cli_json(["merge", str(f), "--inventory", str(FIX / "lab-fleet" / "inventory.toml"),
                                         "--json"])))
        out += [(f"{rec.stem} {name}", rep) for name, rep in live["reports"].items()]
    return out


def _bash_n(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, "-n"], input=cmd, capture_output=True, text=True, timeout=30)


def _simple(cmd: str) -> bool:
    """Whether ``cmd`` is one simple command: no pipe, list, redirection or subshell operator outside quotes."""
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return not any(t and set(t) <= set("|&;<>()") for t in lex)


def _words(text: str, tmp_path: Path) -> list[str]:
    """The words bash reads from the simple command ``text`` (lines joined as bash joins them), run as
    arguments of ``set --`` in ``tmp_path``: no word of it runs."""
    script = "set -- " + text + '\nprintf "%s\\0" "$@"'
    res = subprocess.run([BASH, "--norc", "-c", script], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert res.returncode == 0, (text, res.stderr)
    return res.stdout.split("\0")[:-1]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[tuple[str, dict]]:
    return _reports(tmp_path_factory.mktemp("fleets"))


def test_every_command_of_every_case_and_fixture_is_one_complete_command(reports):
    seen = 0
    for name, rep in reports:
        rows = [(g.get("id"), g) for g in rep.get("gates", [])] + [(d["gate"], d) for d in rep.get("diagnosis", [])]
        for gid, row in rows:
            if "commands" not in row:  # a report recorded by an older afddiag (the lab fleets' hosts)
                assert rep.get("afddiag_version") and name.count(" ") == 1, (name, gid)
                continue
            assert isinstance(row["commands"], list), (name, gid)
            for cmd in row["commands"]:
                seen += 1
                assert isinstance(cmd, str) and cmd.strip() and "\n" not in cmd, (name, gid, cmd)
                res = _bash_n(cmd)
                assert res.returncode == 0 and not res.stderr, (name, gid, cmd, res.stderr)
                assert "<" not in cmd or "<<" in cmd, (name, gid, cmd)  # no <placeholder> left in a command
    assert seen >= 5, seen  # the cases hold MTU, device-map and launch-file faults: their commands were checked


def test_a_wrong_device_map_gives_an_export_that_pastes():
    """Case 13: the map sends the fabric IP to the wrong device and NCCL_IB_HCA selects it: the fix is
    ``export`` lines whose values bash reads back exactly, the alternative (unset) in the prose."""
    case = next(c for c in case_dirs("fabric") if c.name.startswith("13-"))
    rep = _cli_json(_case_args(case))
    g = next(g for g in rep["gates"] if g["id"] == "fabric.devicemap-env")
    assert g["verdict"] == "FAIL" and g["commands"], g
    for cmd in g["commands"]:
        assert cmd.startswith("export "), cmd
        name, _, value = cmd[len("export "):].partition("=")
        assert shlex.split(cmd) == ["export", f"{name}={shlex.split(value)[0]}"]
    assert "remove NCCL_IB_HCA" in g["remedy"] and not any("unset" in c for c in g["commands"])


@pytest.mark.parametrize("value", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_value_is_one_word_and_nothing_runs(value, tmp_path):
    """Every catalog command template and the builders, filled with a hostile value: bash -n accepts it,
    shlex.split gives the value back as exactly one word, and bash reading it (as ``set --`` arguments,
    whole and as the terminal lines of :func:`lines` at several widths) runs nothing."""
    from afddiag.catalog import load

    cat = load()
    templates = [t for g in cat["gates"].values() for t in g.get("commands", []) if "{" in t]
    templates += [t for ts in cat.get("commands", {}).values() for t in ts if "{" in t]
    assert templates
    mapped, MAP = f"192.0.2.1={value},192.0.2.2={value}", "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP"
    cmds = [(fill(t, _AllFields(value)), value) for t in templates]  # (command, the word it must hold)
    cmds += [(command("sudo", "ip", "link", "set", "dev", value, "mtu", 9000), value),
             (export("NCCL_IB_HCA", value), f"NCCL_IB_HCA={value}"),
             (export(MAP, mapped), f"{MAP}={mapped}")]
    for cmd, word in cmds:
        assert _bash_n(cmd).returncode == 0, cmd
        words = shlex.split(cmd)
        assert word in words, (cmd, words)  # exactly one word, whatever the value holds
        if _simple(cmd):
            for width in (200, 40, 20):
                text = "\n".join(lines(cmd, width))
                assert _words(text, tmp_path) == words, (cmd, width, text)
    assert not (tmp_path / "PWNED").exists()


class _AllFields(dict):
    """Any template field filled with one value (``{netdev}``, ``{mtu}``, ...)."""

    def __init__(self, value: str):
        super().__init__()
        self.value = value

    def __missing__(self, key: str) -> str:
        return self.value


def test_commands_print_alone_and_whole_at_80_columns(reports, tmp_path):
    """The text view at 80 columns (diagnosis and the lines under the table): each command is on lines of
    its own that bash reads as the command, no prose on them; piped, each command is one whole line."""
    checked = 0
    for name, rep in reports:
        if "diagnosis" not in rep or not any(g.get("commands") for g in rep["gates"]):
            continue
        buf = io.StringIO()
        write_table(rep, buf, width=80)
        text = buf.getvalue()
        plain = io.StringIO()
        write_table(rep, plain)
        for g in rep["gates"]:
            if g["verdict"] not in ("WARN", "FAIL", "ERROR"):
                continue
            for cmd in g.get("commands") or []:
                ls = command_lines([cmd], 80, "    ")
                assert "\n".join(ls) in text, (name, cmd, text)
                assert all(len(ln) <= 80 for ln in ls) or len(ls) == 1, ls
                if _simple(cmd):
                    assert _words("\n".join(ln.strip() for ln in ls), tmp_path) == shlex.split(cmd)
                assert any(ln.strip() == cmd for ln in plain.getvalue().splitlines()), (name, cmd)
                checked += 1
    assert checked >= 3, checked


def test_a_long_export_breaks_where_bash_joins_it(tmp_path):
    value = ",".join(f"192.168.{i}.10=roceP{i}p1s0f1" for i in range(8))
    cmd = export("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", value)
    ls = lines(cmd, 80)
    assert len(ls) > 1 and all(len(ln) <= 80 for ln in ls), ls
    assert _words("\n".join(ls), tmp_path) == ["export", f"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP={value}"]
    quoted = export("X", "a b," * 30)  # inside single quotes: the quote is closed and reopened around the break
    ls = lines(quoted, 40)
    assert len(ls) > 1 and all(len(ln) <= 40 for ln in ls), ls
    assert _words("\n".join(ls), tmp_path) == ["export", "X=" + "a b," * 30]


NAMES = ["dev a b", "dev'q", "$(touch PWNED)", "x;touch PWNED", "x\ntouch PWNED", "`touch PWNED`", "-rf *"]


def _hostile_case(tmp_path: Path, netdev: str, device: str) -> Path:
    """Case 01 (the fabric IP on the second device, its netdev at MTU 1500) with that netdev and that device
    renamed: directory names, the GID's netdev file, rdma-dev.json and ip-addr.json (JSON-escaped)."""
    src = next(c for c in case_dirs("fabric") if c.name.startswith("01-"))
    dst = tmp_path / "case"
    shutil.copytree(src, dst)
    swaps = [("enp1s0f1np1", netdev), ("rocep1s0f1", device)]
    for p in sorted(dst.rglob("*"), key=lambda p: -len(p.parts)):  # contents first, then names, deepest first
        if p.is_file() and not p.is_symlink():
            text = p.read_text()
            for old, new in swaps:
                text = text.replace(old, json.dumps(new)[1:-1] if p.suffix == ".json" else new)
            p.write_text(text)
        for old, new in swaps:
            if p.name == old:
                p.rename(p.with_name(new))
    return dst


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_host_names_that_are_hostile_stay_one_word_in_every_command(name, tmp_path):
    """A netdev and an RDMA device named with spaces, quotes, ``$()``, ``;``, a newline, backquotes or a
    leading dash (a snapshot, a peer's report or a container's sysfs may hold anything): the MTU command
    and the device-map export still come back from shlex.split with the name inside exactly one word,
    bash -n accepts them, and bash reading them (whole, and as lines at 40 columns) runs nothing."""
    netdev, device = f"n-{name}", f"d-{name}"
    case = _hostile_case(tmp_path, netdev, device)
    env = tmp_path / "launch.env"
    env.write_text("AFD_ROLE=expert\nNCCL_IB_HCA=rocep1s0f0\n")  # NCCL sent to the device without the address
    rep = _cli_json(["all", "--json", "--no-history", "--snapshot", str(case), "--fabric-ip", "192.168.100.10",
                     "--launch-env", str(env)])
    cmds = {g["id"]: g["commands"] for g in rep["gates"] if g["commands"]}
    mtu = cmds.get("fabric.mtu")
    assert mtu and shlex.split(mtu[0]) == ["sudo", "ip", "link", "set", "dev", netdev, "mtu", "9000"], mtu
    first = cmds.get("fabric.first-device")
    want = ["export", f"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10={device}"]
    assert first and shlex.split(first[0]) == want, first
    assert cmds.get("launch.fabric-address") == ["export AFD_FABRIC_IP=192.168.100.10"]
    fixes = [shlex.split(c) for c in cmds.get("fabric.devicemap-env", [])]
    assert fixes == [["export", f"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10={device}"],
                     ["export", f"NCCL_IB_HCA=={device}:1"]], cmds.get("fabric.devicemap-env")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for cmd in [c for cs in cmds.values() for c in cs]:
        assert _bash_n(cmd).returncode == 0, cmd
        if not _simple(cmd):
            continue
        for width in (400, 40):
            assert _words("\n".join(lines(cmd, width)), run_dir) == shlex.split(cmd), (cmd, width)
    assert list(run_dir.iterdir()) == []  # nothing ran: no PWNED, no file of any name


def test_a_vlan_rail_sysctl_key_and_a_hostile_one():
    """A dot in a netdev name is a slash in a sysctl key; a hostile name stays inside its words."""
    from afddiag.gates.fabric import arp_sysctls

    assert arp_sysctls("enp1s0f1np1.100").split()[3] == "net.ipv4.conf.enp1s0f1np1/100.arp_ignore=1"
    for name in NAMES:
        words = shlex.split(arp_sysctls(name))
        assert words[:3] == ["sudo", "sysctl", "-w"] and len(words) == 6, words
        assert words[3] == f"net.ipv4.conf.{name.replace('.', '/')}.arp_ignore=1"


def test_the_drain_flag_is_one_fact_in_json_tag_and_prose(reports):
    """Every gate and diagnosis entry of every case and fixture: its JSON ``drain`` is the one rule
    (a FAIL whose action drains), its tag shows the same, and its prose says "drain" only where it drains
    (or in a condition: "if it repeats, drain")."""
    from afddiag.diagnosis import drains
    from afddiag.render import action_tag
    from test_catalog import says_drain

    seen = set()
    for name, rep in reports:
        for row in rep.get("gates", []) + rep.get("diagnosis", []):
            if "drain" not in row or not row.get("action"):
                continue  # an older afddiag's report
            flag = drains(row["verdict"], row["action"])
            assert row["drain"] is flag, (name, row)
            assert action_tag(row).endswith(", drain]") is flag, (name, row)
            if says_drain(row.get("remedy") or ""):
                assert flag, (name, row.get("id") or row.get("gate"), row["remedy"])
            seen.add(flag)
    assert seen == {True, False}  # the cases hold both: a down link or missing GID, and launch-setting fixes


def test_a_catalog_remedy_comes_with_its_catalog_commands(reports):
    """A verdict whose remedy is its gate's catalog remedy as written carries that gate's catalog commands
    (the prose says "the command below": a verdict without it would point at nothing)."""
    from afddiag.catalog import commands, load

    gates = load()["gates"]
    for name, rep in reports:
        for row in rep.get("gates", []):
            g = gates.get(row["id"], {})
            if "commands" in row and g.get("commands") and row["remedy"] == g["remedy"] and row["verdict"] in (
                    "WARN", "FAIL", "ERROR"):
                assert row["commands"] == commands(row["id"]), (name, row)


def test_blocks_under_the_table_follow_the_diagnosis_order(reports):
    """Pasting the commands under the table top to bottom fixes the root first: their blocks come in
    the diagnosis' order (case 01 replayed: the device map before the MTU, which restarts queues)."""
    checked = 0
    for name, rep in reports:
        if "host" not in rep:  # a fleet report: its own table (afddiag.fleet.table)
            continue
        order = [d["gate"] for d in rep.get("diagnosis") or []]
        buf = io.StringIO()
        write_table(rep, buf, width=80)
        heads = [m.group(1) for m in re.finditer(r"^(?:WARN|FAIL|ERROR) (\S+) \[", buf.getvalue(), re.M)]
        ranked = [h for h in heads if h in order]
        assert ranked == sorted(ranked, key=order.index), (name, ranked, order)
        checked += len(ranked) > 1
    assert checked >= 1, checked
