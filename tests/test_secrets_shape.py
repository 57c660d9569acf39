"""Item 8 of issue 22: credentials are recognised by their value's shape as well as by the variable's
name, wherever a variable lands (bundle env, report, history, merge input, HTML), and a real launch
environment keeps every value."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from afddiag.cli import run
from afddiag.envvars import (
    REDACTED,
    SECRET_SHAPES,
    is_secret_name,
    redact_env,
    redact_report,
    redact_text,
    secret_shape,
)
from snapfix import derive, fabric_case

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZmQifQ.c2lnbmF0dXJlLW9mLWp3dA"
PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
# (variable, value, the secret part that must never be seen)
SHAPED = [
    ("AFD_DB_URL", "postgres://admin:hunter2pw@db.example:5432/afd", "hunter2pw"),
    ("AFD_GIT_REMOTE", "https://ghp_0123456789abcdefghijABCD@github.com/o/r", "ghp_0123456789abcdefghijABCD"),
    ("AFD_HEADERS", "Authorization: Bearer abc123def456ghi789jkl", "abc123def456ghi789jkl"),
    ("AFD_PROXY_HEADER", "Proxy-Authorization: Basic YWRtaW46cHc=", "YWRtaW46cHc="),
    ("AFD_MODEL_ARGS", f"--revision main --hub-auth {HF}", HF),
    ("AFD_S3", "AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("AFD_LLM", "sk-proj-abcdefghijklmnopqrstuvwx0123", "sk-proj-abcdefghijklmnopqrstuvwx0123"),
    ("AFD_SESSION", JWT, "c2lnbmF0dXJlLW9mLWp3dA"),
    ("AFD_DEPLOY", PEM, "b3BlbnNzaC1rZXktdjEAAAAA"),
]
# A real launch environment: nothing in it is a credential.
REAL = {
    "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP": "192.168.100.10=rocep1s0f1,192.168.101.10=roceP2p1s0f1",
    "HF_HUB_ENABLE_HF_TRANSFER": "1", "HF_HOME": "/mnt/models/hf_cache", "HF_HUB_OFFLINE": "1",
    "AFD_MODEL_PATH": "/mnt/models/deepseek-v3/hf_snapshot_0123456789abcdef0123456789",
    "NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1", "NCCL_IB_GID_INDEX": "3", "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
    "NCCL_IB_PKEY": "0", "NCCL_NET_GDR_LEVEL": "PHB", "NCCL_DEBUG": "INFO", "NCCL_IB_TIMEOUT": "22",
    "NCCL_IB_TC": "106", "NCCL_IB_SL": "3", "NCCL_CROSS_NIC": "0", "NCCL_KEY_INDEX": "1",
    "UCX_NET_DEVICES": "rocep1s0f1:1", "UCX_TLS": "rc,cuda_copy,cuda_ipc", "UCX_IB_GID_INDEX": "3",
    "UCX_RNDV_SCHEME": "get_zcopy", "MC_GID_INDEX": "3", "CUDA_VISIBLE_DEVICES": "0",
    "AFD_IMAGE": "registry.example/afd/engine:2026.12-cu128", "AFD_ENGINE_URL": "http://10.64.0.1:8000/v1",
    "AFD_SSH_TARGET": "ssh://root@spark-a", "AFD_NOTE": "basic checks passed; token bucket at 80%",
    "AFD_SSH_KEY_FILE": "/etc/afd/id_ed25519", "AFD_ROLE": "expert", "AFD_FABRIC_IP": "192.168.100.10",
}


@pytest.mark.parametrize("name", ["AFD_PASS", "AFD_PASS2", "AFD_PWD", "DB_PWD1", "AFD_PRIVKEY", "AFD_JWT",
                                  "AFD_CRED", "AFD_CREDS", "AFD_SECRET3", "AFD_REGISTRY_KEY", "AFD_SIGNING_KEY2",
                                  "AFD_DBPASSWORD", "AFD_SSHPRIVKEY"])
def test_credential_name_stems(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["NCCL_IB_PKEY", "AFD_KEY_INDEX", "NCCL_KEY_INDEX", "AFD_SSH_KEY_FILE", "AFD_BYPASS",
                                  "AFD_COMPASS_DIR", "AFD_PASSTHROUGH", "HF_HUB_ENABLE_HF_TRANSFER"])
def test_names_that_are_not_credentials(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("name,value,secret", SHAPED, ids=[s[0] for s in SHAPED])
def test_a_credential_is_redacted_by_its_shape(name, value, secret):
    assert not is_secret_name(name)  # the name says nothing: only the value gives it away
    env, names = redact_env({name: value, "AFD_ROLE": "expert"})
    assert env == {name: REDACTED, "AFD_ROLE": "expert"} and names == [name]
    text, kinds = redact_text(f"launch line: {name}={value} end")
    assert secret not in text and kinds and text.endswith(" end")


def test_a_real_launch_environment_keeps_every_value():
    assert redact_env(REAL) == (REAL, [])
    assert redact_report({"inputs": {"env": REAL}, "notes": list(REAL.values())}) == \
        {"inputs": {"env": REAL}, "notes": list(REAL.values())}


def test_url_userinfo_keeps_scheme_and_host():
    assert redact_text("postgres://admin:pw@db:5432/x")[0] == f"postgres://{REDACTED}@db:5432/x"
    assert redact_text("Authorization: Bearer abcdefghijklmnop1234")[0] == f"Authorization: Bearer {REDACTED}"


def test_every_shape_is_bounded():
    """No unbounded repetition (``*``, ``+``, ``{n,}``): a hostile value costs one bounded scan per start."""
    for kind, pat in SECRET_SHAPES:
        src = re.sub(r"\\.", "", pat.pattern)
        src = re.sub(r"\[[^\]]*\]", "C", src)
        assert not re.search(r"[*+]|\{\d+,\}", src), f"{kind}: unbounded quantifier in {pat.pattern}"


def test_a_pem_block_without_its_end_is_redacted_to_the_end():
    assert redact_text("key: -----BEGIN RSA PRIVATE KEY-----\nMIIEow")[0] == f"key: {REDACTED}"


def test_redact_report_is_iterative_and_redacts_env_by_name_and_shape():
    deep: object = "postgres://a:b@c"
    for _ in range(5000):
        deep = [deep]
    out = redact_report({"inputs": {"env": {"AFD_PASS": "x", "AFD_DB_URL": "mysql://u:p@h"}}, "deep": deep})
    assert out["inputs"]["env"] == {"AFD_PASS": REDACTED, "AFD_DB_URL": REDACTED}
    inner = out["deep"]
    while isinstance(inner, list):
        inner = inner[0]
    assert inner == f"postgres://{REDACTED}@c"


def _every_secret_in(text: str) -> list[str]:
    return [s for _, _, s in SHAPED if s in text] + [v for v in ("pw-by-name",) if v in text]


def test_snapshot_report_history_merge_and_html_hold_no_credential(tmp_path, capsys, monkeypatch):
    """Every place a variable lands: a snapshot env (written before redaction) → the report, the
    history store, a merge of that report (and of one from an older afddiag that kept the values) → HTML."""
    env = "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1\nAFD_PWD=pw-by-name\n" + "".join(
        f"{n}='{v}'\n" for n, v, _ in SHAPED if "\n" not in v)
    snap = derive(fabric_case("02-"), tmp_path / "s", {"env": env})
    monkeypatch.setenv("AFDDIAG_STATE_DIR", str(tmp_path / "state"))
    capsys.readouterr()
    run(["all", "--json", "--snapshot", str(snap)])
    text = capsys.readouterr().out
    assert _every_secret_in(text) == []
    rep = json.loads(text)
    assert rep["inputs"]["env"]["AFD_DB_URL"] == REDACTED and rep["inputs"]["env"]["AFD_PWD"] == REDACTED
    assert "env AFD_DB_URL: value redacted (the value looks like a credential)" in rep["notes"]
    stored = [r[0] for r in sqlite3.connect(next((tmp_path / "state").rglob("*.sqlite3"))).execute(
        "SELECT report FROM runs")]
    assert stored and not any(_every_secret_in(s) for s in stored)
    old = dict(rep, host="old-afddiag", inputs=dict(rep["inputs"], env={n: v for n, v, _ in SHAPED}),
               notes=[f"{n}={v}" for n, v, _ in SHAPED])
    (tmp_path / "r.json").write_text(json.dumps([rep, old]))
    run(["merge", "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "f.html")])
    out = capsys.readouterr()
    assert _every_secret_in((tmp_path / "f.html").read_text()) == []
    assert _every_secret_in(out.out + out.err) == []


def test_shape_check_of_a_long_hostile_value_finishes():
    """A megabyte of near-misses (``hf_`` runs, ``://`` without ``@``, ``Basic`` and padding) is scanned,
    not backtracked: the call returns with the text unchanged."""
    hostile = ("hf_" + "a" * 29 + " ") * 5000 + "x://" + "a:" * 100000 + "Basic " + "=" * 100000
    assert secret_shape(hostile) is None


def test_a_capture_bundle_holds_no_credential_shaped_value(tmp_path, monkeypatch, capsys):
    import tarfile

    for name, value, _ in SHAPED:
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AFD_EXPERT_CAPACITY", "256")
    out = tmp_path / "h.tar.gz"
    assert run(["capture", "-o", str(out)]) == 0
    with tarfile.open(out) as t:
        blobs = {m.name: t.extractfile(m).read().decode("utf-8", "replace") for m in t.getmembers() if m.isfile()}
    assert not [n for n, b in blobs.items() if _every_secret_in(b)]
    env = next(b for n, b in blobs.items() if n.endswith("/env"))
    assert f"AFD_DB_URL='{REDACTED}'" in env and "AFD_EXPERT_CAPACITY='256'" in env
