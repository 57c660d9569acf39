"""``afddiag preflight --json`` (issue 23): the judged report, JSON alone on stdout, with the launch hook's
decision under ``preflight``, whose exit code is the command's."""

from __future__ import annotations

import contextlib
import io
import json

from afddiag.cli import run
from conftest import CASES

C01 = str(CASES / "fabric" / "01-spark-fabric-ip-on-nonfirst-device")  # FAIL first-device: not fit
C02 = str(CASES / "fabric" / "02-spark-map-set-healthy")  # fit (WARNs only)


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = run(list(args))
    return code, out.getvalue(), err.getvalue()


def test_preflight_json_is_the_report_with_the_hooks_decision():
    code, out, err = _run("preflight", "--json", "--no-history", "--snapshot", C01)
    rep = json.loads(out)  # JSON alone on stdout
    pre = rep["preflight"]
    assert code == pre["exit_code"] == 2 and pre["fit"] is False
    assert pre["faults"] == [d["gate"] for d in rep["diagnosis"] if d["verdict"] in ("FAIL", "ERROR")]
    assert "NOT FIT" in err
    code, out, err = _run("preflight", "--json", "--export", "--no-history", "--snapshot", C02)
    pre = json.loads(out)["preflight"]
    assert code == 0 and pre["fit"] is True and "OK" in err
    assert "kept" in pre and isinstance(pre["exports"], list)
    code, out, _ = _run("preflight", "--json", "--strict", "--no-history", "--snapshot", C02)
    pre = json.loads(out)["preflight"]
    assert code == pre["exit_code"] == 1 and pre["fit"] is False and pre["verdict_code"] == 1
