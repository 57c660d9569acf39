"""launch.memory-plan: the coordinator's KV pool predicted from GPU memory, reservation, capacity and
drafter flag with the coordinator playbook's [plan] constants, against the seed's measured figures."""

import json

import pytest
from click.testing import CliRunner

from afddiag.cli import cli, run
from afddiag.envvars import LaunchEnvError, parse_launch_env
from afddiag.gates.launch import predict_pool
from afddiag.playbook import PlaybookError, load, parse

GIB = 2**30
RTX5090 = 34190917632  # nvmlDeviceGetMemoryInfo total of a 32607 MiB RTX 5090
PLAN = load("coordinator").plan


@pytest.mark.parametrize("capacity,pool_gib,tokens_m,tol_tokens", [
    (1024, 2.07, 2.5, 0.12),   # measured: 2.07 GiB, ~2.5 M tokens (fit: -11.8 %)
    (256, 7.4, 7.79, 0.02),    # measured: 7.4 GiB, ~7.79 M tokens (fit: +1.2 %)
])
def test_fit_reproduces_the_measured_pools(capacity, pool_gib, tokens_m, tol_tokens):
    p = predict_pool(RTX5090, 0.97, capacity, True, PLAN)
    assert p["pool_bytes"] / GIB == pytest.approx(pool_gib, abs=0.01)
    assert p["pool_tokens"] / 1e6 == pytest.approx(tokens_m, rel=tol_tokens)
    assert p["full_contexts"] == p["pool_tokens"] // 1_048_576


def test_fit_occupied_and_oom():
    p = predict_pool(RTX5090, 0.97, 1024, True, PLAN)
    assert p["occupied_bytes"] / GIB == pytest.approx(26.35, rel=0.02)  # measured 26.35 GiB (fit: +1.8 %)
    assert predict_pool(RTX5090, 0.97, 4096, True, PLAN)["pool_bytes"] < 0  # measured: out of memory
    assert predict_pool(RTX5090, 0.97, 4096, True, PLAN)["pool_tokens"] == 0
    off = predict_pool(RTX5090, 0.97, 1024, False, PLAN)
    on = predict_pool(RTX5090, 0.97, 1024, True, PLAN)
    assert off["pool_bytes"] - on["pool_bytes"] == pytest.approx(7.95e9, abs=2)


def _run(tmp_path, env_lines, total=RTX5090, role="coordinator"):
    snap = tmp_path / "coord"
    snap.mkdir(exist_ok=True)
    (snap / "gpu.json").write_text(json.dumps({"devices": [{
        "index": 0, "name": "NVIDIA GeForce RTX 5090", "cuda": {"sm_count": 170, "integrated": False},
        "nvml": {"memory_info": {"total_bytes": total, "used_bytes": 0, "free_bytes": total}}}]}))
    env = tmp_path / "coord.env"
    env.write_text("\n".join(["AFD_FABRIC_IP=10.9.0.1"] + env_lines) + "\n")
    res = CliRunner().invoke(cli, ["all", "--json", "--snapshot", str(snap), "--role", role, "--launch-env", str(env)],
                             standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    return next(g for g in rep["gates"] if g["id"] == "launch.memory-plan")


@pytest.mark.parametrize("env,verdict,words", [
    (["AFD_PREFILL_CAPACITY=1024"], "PASS", "KV pool 2.07 GiB = 2.21 M tokens = 2 full 1,048,576-token context(s)"),
    (["AFD_PREFILL_CAPACITY=256"], "PASS", "KV pool 7.40 GiB = 7.88 M tokens = 7 full"),
    ([], "PASS", "capacity 1024 (default)"),
    (["AFD_PREFILL_CAPACITY=4096"], "FAIL", "out of memory predicted"),
    (["AFD_PREFILL_CAPACITY=1024", "AFD_GPU_MEMORY_RESERVATION=0.92"], "WARN", "not one request at the maximum"),
    (["AFD_PREFILL_CAPACITY=4096", "AFD_DRAFTER=0"], "FAIL", "GiB short"),
    (["AFD_PREFILL_CAPACITY=1024", "AFD_DRAFTER=off"], "PASS", "AFD_DRAFTER=off"),
])
def test_memory_plan_gate_from_snapshot_and_launch_env(tmp_path, env, verdict, words):
    v = _run(tmp_path, env)
    assert v["verdict"] == verdict, v["summary"]
    assert words in v["summary"]
    assert v["summary"].startswith("GPU 0 NVIDIA GeForce RTX 5090 31.84 GiB")
    if verdict == "FAIL":
        assert "lower the capacity flag" in v["remedy"]


def test_memory_plan_skips_without_a_plan(tmp_path):
    v = _run(tmp_path, ["AFD_EXPERT_CAPACITY=256"], role="expert")
    assert v["verdict"] == "SKIP" and "no memory plan" in v["summary"]


@pytest.mark.parametrize("line,words", [("AFD_DRAFTER=maybe", "not a flag"),
                                        ("AFD_GPU_MEMORY_RESERVATION=97", "not a fraction")])
def test_bad_flags_are_usage_errors(tmp_path, line, words, capsys):
    with pytest.raises(LaunchEnvError, match=words):
        parse_launch_env(line + "\n", "bad.env")
    env = tmp_path / "bad.env"
    env.write_text(line + "\n")
    assert run(["all", "--json", "--snapshot", str(tmp_path), "--launch-env", str(env)]) == 64
    assert words in capsys.readouterr().err


def test_plan_constants_are_checked():
    with pytest.raises(PlaybookError, match="kv_bytes_per_token"):
        parse("[plan]\nweights_bytes = 1\nkv_bytes_per_token = 0\n", "x.toml")
    with pytest.raises(PlaybookError, match="unknown key"):
        parse("[plan]\nkv_per_token = 1\n", "x.toml")
