"""Credentials never leave the host: a variable whose name says token/secret/password/key/auth keeps
its name and loses its value in capture bundles, reports and HTML (afddiag.envvars.is_secret_name)."""

from __future__ import annotations

import json
import tarfile

import pytest

from afddiag.cli import run
from afddiag.envvars import REDACTED, is_secret_name, redact_env
from snapfix import derive, fabric_case

SECRET = "hf_secret123XYZ"


@pytest.mark.parametrize("name,secret", [
    ("AFD_HF_TOKEN", True), ("HF_TOKEN", True), ("AFD_HFTOKEN", True), ("AFD_API_KEY", True),
    ("AFD_APIKEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("AFD_DB_PASSWORD", True), ("AFD_PASSWD", True),
    ("AFD_REGISTRY_CREDENTIALS", True), ("AFD_AUTH", True), ("AFD_BASIC_AUTH_HEADER", True),
    ("NCCL_IB_GID_INDEX", False), ("MC_GID_INDEX", False), ("UCX_IB_GID_INDEX", False), ("NCCL_IB_PKEY", False),
    ("AFD_KEY_INDEX", False), ("AFD_SSH_KEY_FILE", False), ("AFD_FABRIC_IP", False), ("AFD_EXPERT_CAPACITY", False),
    ("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", False), ("AFD_MONKEY", False), ("AFD_AUTHOR", False),
])
def test_secret_names(name, secret):
    assert is_secret_name(name) is secret


def test_redact_env_keeps_the_name():
    env, names = redact_env({"AFD_HF_TOKEN": SECRET, "AFD_FABRIC_IP": "10.0.0.1"})
    assert env == {"AFD_HF_TOKEN": REDACTED, "AFD_FABRIC_IP": "10.0.0.1"} and names == ["AFD_HF_TOKEN"]


def test_capture_bundle_holds_no_credential(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AFD_HF_TOKEN", SECRET)
    monkeypatch.setenv("AFD_EXPERT_CAPACITY", "256")
    out = tmp_path / "h.tar.gz"
    assert run(["capture", "-o", str(out)]) == 0
    with tarfile.open(out) as t:
        blobs = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
    assert not [n for n, b in blobs.items() if SECRET.encode() in b]
    env = next(b for n, b in blobs.items() if n.endswith("/env")).decode()
    assert f"AFD_HF_TOKEN='{REDACTED}'" in env and "AFD_EXPERT_CAPACITY='256'" in env
    manifest = json.loads(next(b for n, b in blobs.items() if n.endswith("capture.json")))
    assert "env AFD_HF_TOKEN: value redacted (the name looks like a credential)" in manifest["notes"]


def test_report_and_html_of_a_snapshot_with_a_credential(tmp_path, capsys):
    """A snapshot written before redaction (or by hand) still never shows the value."""
    snap = derive(fabric_case("02-"), tmp_path / "s", {
        "env": f"DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1\nAFD_HF_TOKEN={SECRET}\n"})
    capsys.readouterr()
    run(["all", "--json", "--no-history", "--snapshot", str(snap)])
    text = capsys.readouterr().out
    assert SECRET not in text
    rep = json.loads(text)
    assert rep["inputs"]["env"]["AFD_HF_TOKEN"] == REDACTED
    assert "env AFD_HF_TOKEN: value redacted (the name looks like a credential)" in rep["notes"]
    (tmp_path / "r.json").write_text(text)
    run(["merge", str(tmp_path / "r.json"), "--html", str(tmp_path / "f.html")])
    assert SECRET not in (tmp_path / "f.html").read_text() and SECRET not in capsys.readouterr().out
