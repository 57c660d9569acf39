"""The documented alerting rules (playbooks/prometheus/afddiag-alerts.yml, shown whole in
docs/MONITORING.md) name series afddiag writes, with labels those series carry, and the status rule
fires on what needs attention (issue 23)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from afddiag.cli import cli
from afddiag.prometheus import STATUS, registry_for
from conftest import case_dirs, load_case

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "playbooks" / "prometheus" / "afddiag-alerts.yml"
DOC = REPO / "docs" / "MONITORING.md"
#: node_exporter's own series a rule may use (tests/test_textfile_collector.py scrapes them from node_exporter)
NODE_EXPORTER_SERIES = {"node_textfile_scrape_error": set()}
#: labels Prometheus adds at scrape time
TARGET_LABELS = {"instance", "job"}
PROMQL_WORDS = {"time", "max", "min", "sum", "by", "without", "and", "or", "unless", "on", "ignoring", "count"}


def _emitted() -> dict[str, set[str]]:
    """Every afddiag series name → its label names, from real reports: a fabric case, the H200 case (GPU
    and load figures) and a QP walk."""
    out: dict[str, set[str]] = {}

    def add(text: str) -> None:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                out.setdefault(s.name, set()).update(s.labels)

    fabric = next(c for c in case_dirs("fabric") if c.name.startswith("01-"))
    h200 = next(c for c in case_dirs("gpu") if "h200" in c.name)
    for args in (["all", "--snapshot", str(fabric), "--fabric-ip", load_case(fabric)["fabric_ip"]],
                 ["gpu", "--snapshot", str(h200)]):
        res = CliRunner().invoke(cli, args + ["--format", "prometheus", "--no-history"], standalone_mode=False)
        add(res.stdout)
    from prometheus_client import generate_latest

    walk = {"gates": [], "counts": {}, "exit_code": 0, "facts": {"qp": {"results": [
        {"device": "mlx5_0", "port": 1, "steps": [{"to": "RTR", "ok": True, "elapsed_ms": 1.0}]}]}}}
    add(generate_latest(registry_for(walk)).decode())
    return out


def _rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_the_doc_shows_the_rules_file_whole():
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert RULES.read_text() in blocks


def test_every_rule_names_real_series_and_labels():
    emitted = _emitted()
    known = {**emitted, **NODE_EXPORTER_SERIES}
    rules = _rules()
    assert {r["alert"] for r in rules} >= {"AfddiagGateFailed", "AfddiagGateWarning"}
    for r in rules:
        expr = r["expr"]
        names = [n for n in re.findall(r"\b[a-z_][a-z0-9_]*\b", expr) if n not in PROMQL_WORDS]
        assert names and all(n in known for n in names), (r["alert"], names)
        labels = set().union(*(known[n] for n in names)) | TARGET_LABELS
        used = set(re.findall(r"\$labels\.([a-z_]+)", json.dumps(r.get("annotations", {}))))
        used |= {x.strip() for grp in re.findall(r"by \(([^)]*)\)", expr) for x in grp.split(",")}
        assert used <= labels, (r["alert"], used - labels)
        assert r.get("labels", {}).get("severity") in ("warning", "critical"), r["alert"]


def _fires(expr_op: str, value: float) -> bool:
    op, threshold = expr_op.split()
    return {">=": value >= float(threshold), "==": value == float(threshold), ">": value > float(threshold)}[op]


def test_status_rules_fire_on_warn_fail_error_and_never_on_skip():
    by_alert = {r["alert"]: r["expr"] for r in _rules()}
    failed = by_alert["AfddiagGateFailed"].removeprefix("afddiag_gate_status ")
    warn = by_alert["AfddiagGateWarning"].removeprefix("afddiag_gate_status ")
    fired = {v: (_fires(failed, STATUS[v]), _fires(warn, STATUS[v])) for v in STATUS}
    assert fired == {"PASS": (False, False), "SKIP": (False, False), "WARN": (False, True),
                     "FAIL": (True, False), "ERROR": (True, False)}


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None and not os.environ.get("CI"), reason="promtool not installed (Debian: prometheus)")
def test_promtool_check_rules_passes():
    assert PROMTOOL, "promtool missing: lab/setup.sh installs Debian's prometheus package"
    p = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "SUCCESS: 5 rules found" in p.stdout, p.stdout + p.stderr
