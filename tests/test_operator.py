"""Operator conventions (issue 16): the show_gids table, 80-column terminals, closed pipes, usage
errors, conflicting output flags, the schemas."""

import csv
import io
import json
import subprocess
import sys

import jsonschema
import pytest
from click.testing import CliRunner

from afddiag.cli import cli, run
from conftest import CASES, REPO

C01 = str(CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device")
C02 = str(CASES / "fabric" / "02-spark-map-set-healthy")
C17 = str(CASES / "fabric" / "17-rxe-lab-index-order-vs-name-order")


def invoke(args):
    return CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)


def _table_rows(text):
    lines = text.splitlines()
    assert lines[0].split() == ["DEV", "PORT", "INDEX", "GID", "IPv4", "VER", "NETDEV", "MARK"]
    rows = []
    for ln in lines[1:]:
        if ln.startswith("n_gids_found="):
            break
        rows.append(ln.split())
    return rows, lines


def test_gid_table_marks_engine_device_and_fabric_ip_gid():
    r = invoke(["devicemap", "--format", "table", "--snapshot", C01, "--fabric-ip", "192.168.100.10"])
    assert r.return_value == 0
    rows, lines = _table_rows(r.stdout)
    assert len(rows) == 12 and "n_gids_found=12" in lines
    # the engine opens the first enumerated device (no map), which carries no IPv4 GID
    assert {row[0] for row in rows if "engine" in row[-1]} == {"rocep1s0f0"}
    marked = [row for row in rows if row[-1].endswith("fabric-ip")]
    assert [(m[0], m[2], m[4], m[5]) for m in marked] == [("rocep1s0f1", "2", "192.168.100.10", "v1"),
                                                          ("rocep1s0f1", "3", "192.168.100.10", "v2")]
    assert marked[1][3] == "0000:0000:0000:0000:0000:ffff:c0a8:640a"  # whole GID, kernel form
    assert any(ln.startswith("engine opens: rocep1s0f0 (first enumerated device") for ln in lines)


def test_gid_table_follows_the_map_when_set():
    r = invoke(["fabric", "--gids", "--snapshot", C02, "--fabric-ip", "192.168.100.11"])
    rows, _ = _table_rows(r.stdout)
    assert {row[0] for row in rows if row[-1].startswith("engine")} == {"rocep1s0f1"}
    assert all(row[0] == "rocep1s0f1" for row in rows if "fabric-ip" in row[-1])


def test_gid_csv_is_in_kernel_index_order_not_name_order():
    r = invoke(["devicemap", "--format", "csv", "--snapshot", C17])
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["dev"] for x in rows] == ["zrxe0", "arxe1", "arxe1"]  # rdma-dev.json index order
    assert [x["engine"] for x in rows] == ["1", "0", "0"]
    assert [(x["ipv4"], x["fabric_ip"], x["ver"]) for x in rows if x["fabric_ip"] == "1"] == [("10.9.0.2", "1", "v2")]


def test_gids_refuses_other_outputs():
    assert run(["fabric", "--gids", "--json", "--snapshot", C01]) == 64
    assert run(["fabric", "--gids", "--pair", "10.0.0.1", "--snapshot", C01]) == 64


def _column(text, header):
    """The text of one column of a SIMPLE_HEAD rich table, its wrapped pieces joined."""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if header in ln)
    start = lines[head].index(header)
    return "".join(ln[start:].strip() for ln in lines[head + 2:])


def test_report_at_80_columns_cuts_nothing():
    from afddiag.check import diagnose as diagnose_full
    from afddiag.model.run import Inputs
    from afddiag.render import View, unbroken
    from afddiag.report import write_table

    rep, _ = diagnose_full(Inputs(snapshot=C01, fabric_ip="192.168.100.10", run_qp=False), {"fabric", "launch"})
    buf = io.StringIO()
    write_table(rep, buf, width=80, view=View(all_rows=True))  # every row (a terminal folds SKIPs by default)
    text = buf.getvalue()
    body = [ln for ln in text.splitlines() if "device map:" not in ln and " pass, " not in ln]
    assert all(len(ln) <= 80 for ln in body), max(body, key=len)
    assert "…" not in text
    squashed = "".join(text.split())
    for g in rep["gates"]:
        assert g["id"] in squashed
        if g["verdict"] in ("WARN", "FAIL", "ERROR"):
            # in its cell, or (a command too wide for the cell) on lines of its own under the table;
            # never folded mid-word (this asserted the fold into the cell before the 80-column fix)
            assert ("".join(g["remedy"].split()) in "".join(_column(text, "summary / remedy").split())
                    or "".join(g["remedy"].split()) in squashed)
            for unit in unbroken(g["remedy"]):
                assert any(unit in ln for ln in text.splitlines()), unit
    first = next(g for g in rep["gates"] if g["id"] == "fabric.first-device")
    assert first["commands"] == ["export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1"]
    assert "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP" in first["remedy"] and "export" not in first["remedy"]


def test_fleet_table_at_80_columns_cuts_nothing():
    paths = []
    for c in (C01, C02):
        out = subprocess.run([sys.executable, "-m", "afddiag", "fabric", "--json", "--no-history", "--no-qp",
                              "--snapshot", c], capture_output=True, text=True, cwd=REPO).stdout
        paths.append(out)
    import tempfile
    from pathlib import Path

    from conftest import fleet_table

    fr, text = fleet_table([json.loads(t) for t in paths], Path(tempfile.mkdtemp()),
                           [f"spark-{i}" for i in range(len(paths))])
    assert "…" not in text
    assert all(len(ln) <= 80 for ln in text.splitlines()[:-1])
    squashed = "".join(text.split())
    for r in fr["hosts"]:
        for gid in r["failing"]:
            assert gid in squashed
    for g in fr["gates"]:
        assert g["id"] in squashed


def test_closed_pipe_exits_quietly():
    # `true` exits at once, so afddiag writes its report after the reader is gone (EPIPE)
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m afddiag all --no-history --snapshot "{C01}" | true;'
                        ' echo "rc=${PIPESTATUS[0]}" >&2'], capture_output=True, text=True, cwd=REPO)
    assert p.stderr.strip() == "rc=141", p.stderr  # no traceback, not a verdict's exit code


def test_usage_errors_and_conflicting_flags_exit_64(capsys, tmp_path):
    assert run(["merge", "/nonexistent"]) == 64
    assert "/nonexistent" in capsys.readouterr().err
    assert run(["all", "--json", "--format", "prometheus", "--snapshot", C01]) == 64
    assert "--json and --format prometheus" in capsys.readouterr().err
    assert run(["gpu", "--baseline", str(tmp_path / "none.json"), "--snapshot", C01]) == 64
    assert run(["fleet", "--inventory", str(tmp_path / "none.toml")]) == 64
    # agreeing flags are fine
    assert run(["fabric", "--json", "--format", "json", "--no-history", "--snapshot", C02,
                "--fabric-ip", "192.168.100.11"]) == 0


@pytest.mark.parametrize("which", ["report", "fleet"])
def test_schema_command_prints_a_schema_with_a_real_id(which):
    r = invoke(["schema", which])
    s = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(s)
    assert s["$id"] == f"urn:afddiag:schema:{which}:1"
    assert "invalid" not in r.stdout


def test_fleet_output_uses_schema_version_and_validates(tmp_path):
    rep = json.loads(invoke(["fabric", "--json", "--no-history", "--snapshot", C02]).stdout)
    f = tmp_path / "a.json"
    f.write_text(json.dumps(rep))
    r = invoke(["merge", "--json", str(f)])
    fr = json.loads(r.stdout)
    assert fr["schema_version"] == 1 and fr["kind"] == "fleet"
    jsonschema.validate(fr, json.loads(invoke(["schema", "fleet"]).stdout))
    # a fleet report is not mistaken for a host's report
    g = tmp_path / "fleet.json"
    g.write_text(r.stdout)
    fr2 = json.loads(invoke(["merge", "--json", str(g)]).stdout)
    assert fr2["hosts"][0]["status"] == "ERROR" and "fleet report" in fr2["hosts"][0]["error"]


def test_history_table_at_80_columns():
    from afddiag.history import summarize, write_history

    for c, ip, code in ((C01, "192.168.100.10", 2), (C02, "192.168.100.11", 0)):  # recorded in the state dir
        assert run(["fabric", "--json", "--snapshot", c, "--fabric-ip", ip]) == code  # 01: first-device FAILs
    s = summarize(None, replays=True)  # snapshot replays: kept apart from live runs
    assert s["hosts"]
    buf = io.StringIO()
    write_history(s, buf, width=80)
    text = buf.getvalue()
    assert "…" not in text and all(len(ln) <= 80 for ln in text.splitlines())
    squashed = "".join(text.split())
    for hs in s["hosts"].values():
        for gid, segs in hs["gates"].items():
            assert gid in squashed and segs[0]["verdict"] in text
    plain = io.StringIO()
    write_history(s, plain)  # not a terminal: the plain lines
    assert plain.getvalue().startswith("history ") and "host " in plain.getvalue()
