"""What an operator reads is the same wherever it is read (new-user trial, 2026-12-02): the action
and its drain flag in every view, tables that fit 80 columns without splitting a command, wording."""

import io
import json
import subprocess
import sys

from conftest import CASES, REPO

C07 = str(CASES / "fabric" / "07-ipv6-only-no-ipv4-gid")  # fabric.rocev2-ipv4 FAIL FIX_ADDRESS (drains)
C01 = str(CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device")  # first-device FAIL SET_ENV (no drain)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "afddiag", *args], capture_output=True, text=True, cwd=REPO)


def test_action_and_drain_are_shown_alike_in_every_view(tmp_path):
    from afddiag.html import render
    from afddiag.render import action_tag

    rep = json.loads(_cli("all", "--json", "--no-history", "--snapshot", C07).stdout)
    root = next(d for d in rep["diagnosis"] if d["drain"])
    gate = next(g for g in rep["gates"] if g["id"] == root["gate"])
    tag = f"[{root['action']}, drain]"
    assert action_tag(root) == action_tag(gate) == tag
    plain = _cli("all", "--no-history", "--snapshot", C07).stdout
    assert plain.count(tag) >= 2  # the diagnosis and the gate's row
    pre = _cli("preflight", "--no-history", "--snapshot", C07)
    assert pre.returncode == 2 and tag in pre.stderr, pre.stderr
    from afddiag.report import write_table

    buf = io.StringIO()
    write_table(rep, buf, width=80)
    assert "".join(buf.getvalue().split()).count("".join(tag.split())) >= 2
    fr = {"hosts": [{"name": rep["host"], "status": "ok", "exit_code": 2}], "gates": [], "counts": {}, "exit_code": 2}
    page = render(fr, {rep["host"]: rep})
    assert tag in page
    # an action that needs no drain never says so, anywhere
    rep1 = json.loads(_cli("all", "--json", "--no-history", "--snapshot", C01).stdout)
    assert not any(d["drain"] for d in rep1["diagnosis"])
    out1 = _cli("all", "--no-history", "--snapshot", C01).stdout
    assert "[SET_ENV]" in out1 and "drain]" not in out1
    # a WARN with a draining action does not drain (no evidence yet)
    assert action_tag({"verdict": "WARN", "action": "FIX_LINK"}) == "[FIX_LINK]"
    assert action_tag({"verdict": "FAIL", "action": "FIX_LINK"}) == "[FIX_LINK, drain]"


def _reports_of_every_case():
    for c in sorted(p for fam in ("fabric", "gpu") for p in (CASES / fam).iterdir() if p.is_dir()):
        yield c, json.loads(_cli("all", "--json", "--no-history", "--snapshot", str(c)).stdout)


def _depth(text: str) -> int:
    d = m = 0
    for ch in text:
        d += (ch == "(") - (ch == ")")
        m = max(m, d)
    return m


def test_no_summary_or_remedy_nests_parentheses_and_skips_say_one_reason():
    for c, rep in _reports_of_every_case():
        for g in rep["gates"]:
            for field in ("summary", "remedy"):
                assert _depth(g[field] or "") < 2, (c.name, g["id"], g[field])
            if g["id"] == "launch.control-plane" and g["verdict"] == "SKIP":
                assert not ("not tried" in g["summary"] and "not captured" in g["summary"]), g["summary"]
        link = {g["id"]: g for g in rep["gates"]}
        speed = link.get("fabric.link-speed")
        if speed and speed["verdict"] == "SKIP" and link["fabric.link"]["verdict"] == "PASS":
            # the link is up: the speed SKIP says why it is missing, not "link down, or ..."
            assert "link down, or" not in speed["summary"] and "not captured in this snapshot" in speed["summary"]


def test_link_speed_unread_live_names_the_errno():
    import errno

    from afddiag.gates.rail import judge_link_speed, speed_unread
    from afddiag.probes.fabric import read_netdev
    from afddiag.probes.sysfs import QuietReader

    def reader(path):
        if path.endswith("/speed"):
            raise OSError(errno.EINVAL, "Invalid argument")
        files = {"mtu": "9000", "operstate": "down"}
        if path.rsplit("/", 1)[1] not in files:  # a file this netdev lacks (type, address): as the kernel answers
            raise OSError(errno.ENOENT, "No such file or directory")
        return files[path.rsplit("/", 1)[1]]

    nd = read_netdev("/sys/class/net", "enp1s0f1np1", QuietReader(reader))
    assert nd.speed_mbps is None and nd.speed_errno == errno.EINVAL
    live = speed_unread(nd.speed_errno, snapshot=False, netdev=nd.name)
    assert "EINVAL" in live and "link is down" in live and "captured" not in live
    assert "EACCES" in speed_unread(errno.EACCES, snapshot=False, netdev="x")
    snap = speed_unread(errno.ENOENT, snapshot=True, netdev="x")
    assert snap.startswith("not read: not captured in this snapshot") and "link down" not in snap
    assert judge_link_speed("x", None, 200000, "expert", live) == ("SKIP", f"x: negotiated speed {live}")


def test_help_lists_every_exit_code_and_readme_agrees():
    import re

    from afddiag.exitcodes import EXIT_CODES

    out = _cli("--help").stdout
    listed = {int(m) for m in re.findall(r"^\s+(\d+)\s+\S", out.split("Exit codes:")[1].split("Options:")[0], re.M)}
    assert listed == {c for c, _ in EXIT_CODES}, out
    assert {0, 1, 2, 3, 64, 141} <= listed
    readme = (REPO / "README.md").read_text()
    sentence = readme[readme.index("Exit code: 2 if any FAIL"):][:600]
    for code, _ in EXIT_CODES:
        assert re.search(rf"\b{code}\b", sentence), (code, sentence)
    # the codes the CLI returns come from that list
    from afddiag import cli as c

    assert (c.EXIT_USAGE, c.EXIT_ABORT, c.EXIT_SIGPIPE) == (64, 130, 141)


def test_every_option_has_help():
    import click

    from afddiag.cli import cli

    ctx = click.Context(cli)
    missing = []

    def walk(cmd, path):
        if isinstance(cmd, click.Group):
            for n in cmd.list_commands(ctx):
                walk(cmd.get_command(ctx, n), path + [n])
            return
        missing.extend(f"{' '.join(path)} {p.opts[0]}" for p in cmd.params
                       if isinstance(p, click.Option) and not p.hidden and not p.help)

    walk(cli, [])
    assert not missing, missing
    assert "--path FILE  The baseline file" in _cli("baseline", "show", "--help").stdout


def test_merge_of_the_same_report_twice_is_one_host_with_a_note(tmp_path):
    a = tmp_path / "a.json"
    a.write_text(_cli("all", "--json", "--no-history", "--snapshot", C01, "--fabric-ip", "192.168.100.10").stdout)
    b = tmp_path / "b.json"
    b.write_text(a.read_text())  # a copy: same host, same generated_at
    for files in ([a, a], [a, b]):
        p = _cli("merge", "--json", *map(str, files))
        fr = json.loads(p.stdout)
        assert [h["name"] for h in fr["hosts"]] == ["spark-a"], fr["hosts"]
        fip = next(g for g in fr["gates"] if g["id"] == "fleet.fabric-ip")
        assert fip["verdict"] != "FAIL", fip
        assert str(files[1]) in p.stderr and "duplicate input" in p.stderr, p.stderr
    # another run of the same host (other content) is still kept apart, named #2
    rep = json.loads(a.read_text())
    rep["generated_at"] = "2000-01-01T00:00:00+00:00"
    b.write_text(json.dumps(rep))
    fr = json.loads(_cli("merge", "--json", str(a), str(b)).stdout)
    assert [h["name"] for h in fr["hosts"]] == ["spark-a", "spark-a#2"]


def _fits(text: str, width: int = 80) -> None:
    long = [ln for ln in text.splitlines() if len(ln) > width]
    assert not long, long
    assert "…" not in text


def _whole(text: str, remedy: str) -> None:
    """Every command and word of ``remedy`` sits on one line of ``text`` (none folded, no `export`
    cut from its assignment), or, wider than the terminal, on shell lines continued with a backslash."""
    from afddiag.render import unbroken

    lines = text.replace("\\\n", "").splitlines()  # a shell line continued after a backslash is one line
    for unit in unbroken(remedy):
        assert any(unit in ln for ln in lines), (unit, text)


def test_every_case_report_fits_80_columns_and_splits_no_command():
    from afddiag.report import write_table

    for _case, rep in _reports_of_every_case():
        buf = io.StringIO()
        write_table(rep, buf, width=80)
        text = buf.getvalue()
        _fits(text)
        for g in rep["gates"] + rep["diagnosis"]:
            if g["verdict"] in ("WARN", "FAIL", "ERROR") and g.get("remedy"):
                _whole(text, g["remedy"])


def test_the_trial_command_on_an_80_column_terminal():
    """The repro: `COLUMNS=80 afddiag all --snapshot <case 01> --fabric-ip ...` on a terminal (a pty)."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = dict(os.environ, COLUMNS="80", AFDDIAG_NO_PROGRESS="1")
    env.pop("NO_COLOR", None)
    p = subprocess.Popen([sys.executable, "-m", "afddiag", "all", "--no-history", "--snapshot", C01,
                          "--fabric-ip", "192.168.100.10"], stdout=sub, stderr=sub, cwd=REPO, env=env)
    os.close(sub)
    chunks = []
    while True:
        try:
            b = os.read(main, 65536)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    p.wait(timeout=60)
    os.close(main)
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", b"".join(chunks).decode()).replace("\r", "")
    _fits(text)
    assert any("export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1" in ln
               for ln in text.splitlines()), text
    assert any(ln.strip() == "192.168.101.10=roceP2p1s0f1" for ln in text.splitlines())  # the map, one entry a line


def test_gid_table_catalog_and_merge_fit_80_columns(tmp_path):
    from afddiag.catalog import listing, load
    from afddiag.devicemap import fabric_facts as _gather_fabric
    from afddiag.endpoint import resolve_fabric_ip
    from afddiag.gates.fabric import engine_device_for
    from afddiag.gidtable import gid_rows, legend, write_gid_table
    from afddiag.inputs import make_inputs
    from conftest import fleet_table

    obs = _gather_fabric(make_inputs(snapshot=C01, fabric_ip="192.168.100.10"))
    fip = resolve_fabric_ip(obs.fabric, "192.168.100.10").ip
    dev, how = engine_device_for(obs.fabric, obs.env, fip)
    rows = gid_rows(obs.fabric, dev, fip)
    wide, narrow = io.StringIO(), io.StringIO()
    write_gid_table(rows, legend(rows, dev, how, fip), out=wide)
    write_gid_table(rows, legend(rows, dev, how, fip), out=narrow, width=80)
    assert max(map(len, wide.getvalue().splitlines())) > 80  # the show_gids line, kept for pipes
    _fits(narrow.getvalue())
    lines = narrow.getvalue().splitlines()
    assert lines[0].split() == ["DEV", "PORT", "INDEX", "VER", "NETDEV", "MARK"] and lines[1].split() == ["GID", "IPv4"]
    for k, r in enumerate(rows):  # two lines a GID: its slot, then the GID whole (and its IPv4)
        assert lines[2 + 2 * k].split()[:4] == [r.device, str(r.port), str(r.index), r.ver]
        assert lines[3 + 2 * k].split() == [r.gid] + ([r.ipv4] if r.ipv4 else [])
    cat = listing(80)
    _fits("\n".join(cat))
    col = max(len(g) for g in load()["gates"]) + 1
    for gid, g in load()["gates"].items():  # every title starts in one column, whole
        first = next(ln for ln in cat if ln.startswith(gid + " "))
        assert first[col:].split()[0] == g["title"].split()[0] and first[:col].strip() == gid
    rep = json.loads(_cli("all", "--json", "--no-history", "--snapshot", C07).stdout)
    fr, table = fleet_table([rep] * 3, tmp_path, [f"spark-with-a-long-name-{i}" for i in range(3)])
    _fits(table)
    for g in fr["gates"]:
        if g["verdict"] in ("WARN", "FAIL", "ERROR"):
            _whole(table, g["remedy"])
