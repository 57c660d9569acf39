"""The fleet page (`afddiag fleet|merge --html FILE`, issue 16): one self-contained file, the diagnosis
first; rendered in headless Chromium with no console errors, the failing host and its remedy in view
at 1280x800 (the screenshot is kept in test-artifacts/)."""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner

from afddiag.cli import cli, run
from afddiag.html import host_faults, render
from conftest import CASES, REPO, load_case

ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not __import__("os").environ.get("CI"),
                                    reason="chromium not installed (lab/setup.sh installs Debian's chromium)")


def _report(case_dir: Path, host: str) -> dict:
    meta = load_case(case_dir)
    res = CliRunner().invoke(cli, ["all", "--json", "--no-history", "--snapshot", str(case_dir), "--fabric-ip",
                                   meta["fabric_ip"]], standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    rep["host"] = host
    return rep


@pytest.fixture(scope="module")
def fleet_page(tmp_path_factory):
    """Three hosts: spark-a opens the wrong device (case 01), spark-b is healthy (case 02), and a
    third file is garbage (a host without a report)."""
    d = tmp_path_factory.mktemp("fleet")
    fab = CASES / "fabric"
    (d / "a.json").write_text(json.dumps(_report(fab / "01-spark-fabric-ip-on-nonfirst-device", "spark-a")))
    (d / "b.json").write_text(json.dumps(_report(fab / "02-spark-map-set-healthy", "spark-b")))
    (d / "c.json").write_text("<html>502 Bad Gateway</html>")
    page = d / "fleet.html"
    assert run(["merge", str(d / "a.json"), str(d / "b.json"), str(d / "c.json"), "--html", str(page)]) == 2
    return page


class _Refs(HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.scripts, self.ids = [], 0, {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.scripts += tag == "script"
        for k in ("src", "href", "srcset", "action", "data", "poster"):
            if a.get(k) is not None:
                self.refs.append(a[k])
        if a.get("id"):
            self.ids[a["id"]] = tag


def test_page_is_self_contained_and_diagnosis_first(fleet_page):
    text = fleet_page.read_text()
    p = _Refs()
    p.feed(text)
    assert p.scripts == 0 and all(r.startswith("data:") for r in p.refs), p.refs  # nothing fetched
    assert not re.search(r"url\(|@import|https?://", text)
    assert text.index('id="diagnosis"') < text.index('id="verdicts"') < text.index('id="hosts"')
    diag = text[text.index('id="diagnosis"'):text.index('id="verdicts"')]
    assert 'data-host="spark-a"' in diag and "fabric.first-device" in diag
    assert '<pre class="cmd">export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1</pre>' in diag
    assert 'data-host="spark-b"' not in diag  # a fit host is not in the diagnosis
    assert 'data-host="c.json"' in diag and "not JSON" in diag  # the host without a report, and why
    hosts = text[text.index('id="hosts"'):]
    # HCAs in enumeration order with the device the engine opens and the fabric IP's GIDs
    a = hosts[hosts.index('id="host-spark-a"'):hosts.index('id="host-spark-b"')]
    assert a.index("rocep1s0f0 (0)") < a.index("rocep1s0f1 (1)") < a.index("roceP2p1s0f0 (2)")
    assert re.search(r"rocep1s0f0 \(0\) <span class=\"tag\">engine opens", a)
    assert "192.168.100.10 (3, RoCE v2) <span class=\"tag fip\">fabric IP" in a
    b = hosts[hosts.index('id="host-spark-b"'):]
    assert re.search(r"rocep1s0f1 \(1\) <span class=\"tag\">engine opens", b)  # the map names it


def test_text_is_escaped():
    rep = {"host": "<b>x</b>", "inputs": {}, "facts": {},
           "gates": [{"id": "fabric.link", "verdict": "FAIL", "summary": "<script>alert(1)</script>",
                      "remedy": "a & b"}]}
    fr = {"hosts": [{"name": "<b>x</b>", "status": "ok", "exit_code": 2}], "gates": [], "counts": {}, "exit_code": 2}
    text = render(fr, {"<b>x</b>": rep})
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "a &amp; b" in text


def test_faults_come_from_the_diagnosis_when_present_else_failing_gates():
    gates = [{"id": "fabric.mtu", "verdict": "WARN", "summary": "w", "remedy": "rw"},
             {"id": "fabric.link", "verdict": "PASS", "summary": "p", "remedy": ""},
             {"id": "fabric.qp-rtr", "verdict": "FAIL", "summary": "f", "remedy": "rf"}]
    assert [(f["gate"], f["verdict"]) for f in host_faults({"gates": gates})] == [("fabric.qp-rtr", "FAIL"),
                                                                                 ("fabric.mtu", "WARN")]
    diag = [{"gate": "fabric.first-device", "verdict": "FAIL", "summary": "s", "remedy": "r", "action": "config",
             "explains": ["fabric.qp-rtr"]}]
    assert host_faults({"gates": gates, "diagnosis": diag}) == [
        {"gate": "fabric.first-device", "verdict": "FAIL", "summary": "s", "remedy": "r", "commands": None,
         "action": "config", "drain": None, "explains": ["fabric.qp-rtr"]}]


def _chromium(*args, timeout=120):
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--enable-logging=stderr", "--v=0", *args], capture_output=True, text=True, timeout=timeout)


def _console(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]


@needs_chromium
def test_console_check_catches_an_error(tmp_path):
    """The check below can fail: a page that logs an error is caught."""
    assert CHROMIUM, "chromium missing: lab/setup.sh installs it"
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><link rel="icon" href="data:,"></head><body>'
                   "<script>console.error('boom')</script></body></html>")
    assert any("boom" in ln for ln in _console(_chromium("--dump-dom", bad.as_uri()).stderr))


@needs_chromium
def test_page_in_chromium_at_1280x800(fleet_page, tmp_path):
    assert CHROMIUM, "chromium missing: lab/setup.sh installs it"
    # 1. the page as it is: no console message at all, and a screenshot kept as an artifact
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "fleet-page-1280x800.png"
    shot.unlink(missing_ok=True)
    p = _chromium("--window-size=1280,800", f"--screenshot={shot}", fleet_page.as_uri())
    assert _console(p.stderr) == [], _console(p.stderr)
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (1280, 800)
    (ARTIFACTS / "fleet-page.html").write_text(fleet_page.read_text())
    # 2. the same page with a probe appended: where the failing host's block and its remedy lie
    probe = tmp_path / "probe.html"
    probe.write_text(fleet_page.read_text().replace("</body>", """<script>
const host = document.getElementById("diag-spark-a");
const remedy = host.querySelector("pre.cmd");
const box = e => { const r = e.getBoundingClientRect(); const s = getComputedStyle(e);
  return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
          visible: s.visibility === "visible" && s.display !== "none", text: e.innerText}; };
document.title = JSON.stringify({w: innerWidth, h: innerHeight, host: box(host), remedy: box(remedy)});
</script></body>"""))
    p = _chromium("--window-size=1280,800", "--dump-dom", probe.as_uri())
    assert _console(p.stderr) == [], _console(p.stderr)
    m = re.search(r"<title>(.*?)</title>", p.stdout, re.S)
    geo = json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    # a 1280x800 window (its viewport no taller than the screenshot's): both in view without scrolling
    assert geo["w"] == 1280 and 600 <= geo["h"] <= 800, geo
    for part in ("host", "remedy"):
        b = geo[part]
        assert b["visible"], (part, b)
        assert 0 <= b["top"] < b["bottom"] <= geo["h"] and 0 <= b["left"] < b["right"] <= 1280, (part, b)
    assert geo["remedy"]["text"] == "export DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.10=rocep1s0f1"
    assert "spark-a" in geo["host"]["text"]
