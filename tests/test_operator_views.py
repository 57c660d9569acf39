"""What an operator reads is the same wherever it is read (new-user trial, 2026-12-02): the action
and its drain flag in every view, tables that fit 80 columns without splitting a command, wording."""

import io
import json
import subprocess
import sys

from conftest import CASES, REPO

from afddiag.cli import run

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
