"""gpu.headroom: unified-memory headroom (MemFree / MemAvailable / Cached) and discrete NVML free
memory against the role's planned reservation, on synthetic facts and through a snapshot replay."""

import json

import pytest
from click.testing import CliRunner

from afddiag.cli import cli
from afddiag.gates import Context, gpu, resolve_fabric_ip
from afddiag.model.gpu import gpu_facts_from_readings
from afddiag.model.run import Inputs, Observation
from afddiag.playbook import Playbook, PlaybookError, parse
from conftest import CASES

GIB_KB = 2**20  # one GiB in /proc/meminfo kB
PLAN = 100 * 2**30  # the expert rank's 100 GiB budget


@pytest.mark.parametrize("meminfo,verdict,words", [
    # MemFree covers the plan
    ({"MemFree": 110 * GIB_KB, "MemAvailable": 115 * GIB_KB, "Cached": 3 * GIB_KB}, "PASS", "MemFree 110.0 GiB covers"),
    # exactly the plan: covered
    ({"MemFree": 100 * GIB_KB, "MemAvailable": 100 * GIB_KB, "Cached": 0}, "PASS", "covers"),
    # page cache is what is short: MemFree below, MemAvailable covers
    ({"MemFree": 60 * GIB_KB, "MemAvailable": 112 * GIB_KB, "Cached": 50 * GIB_KB, "Buffers": 1 * GIB_KB}, "WARN",
     "page cache 51.0 GiB holds the difference"),
    # one kB short of the plan in MemFree
    ({"MemFree": 100 * GIB_KB - 1, "MemAvailable": 120 * GIB_KB, "Cached": 20 * GIB_KB}, "WARN", "MemFree"),
    # MemAvailable itself is short: processes hold it
    ({"MemFree": 20 * GIB_KB, "MemAvailable": 30 * GIB_KB, "Cached": 10 * GIB_KB}, "FAIL",
     "MemAvailable 30.0 GiB is below the 100.0 GiB"),
    ({"MemFree": 20 * GIB_KB, "MemAvailable": 100 * GIB_KB - 1}, "FAIL", "processes hold the memory"),
    # an older capture without MemFree: judged on MemAvailable, and said so
    ({"MemTotal": 127600748, "MemAvailable": 112503684}, "PASS", "MemFree not captured"),
    ({"MemTotal": 127600748}, "WARN", "MemAvailable not read"),
    ({"MemAvailable": "garbage", "MemFree": True}, "WARN", "MemAvailable not read"),
])
def test_unified_headroom_table(meminfo, verdict, words):
    got, summary, facts = gpu.judge_unified_headroom("GPU 0 NVIDIA GB10", meminfo, PLAN, "reservation of role expert")
    assert got == verdict, summary
    assert words in summary
    assert summary.startswith("GPU 0 NVIDIA GB10")
    assert facts["need_bytes"] == PLAN


def _gb10(meminfo):
    r = json.loads((CASES / "gpu" / "01-gb10-healthy-unified-memory" / "gpu.json").read_text())
    r["host_meminfo_kb"] = meminfo
    return r


def _h200(free_bytes):
    return {"devices": [{"index": 0, "name": "NVIDIA H200", "cuda": {"sm_count": 132, "integrated": False},
                         "nvml": {"memory_info": {"total_bytes": 150 * 2**30, "used_bytes": 150 * 2**30 - free_bytes,
                                                  "free_bytes": free_bytes}}}]}


def _ctx(readings, pb):
    obs = Observation("h", "test", gpu=gpu_facts_from_readings(readings))
    return Context(obs, Inputs(playbook=pb), resolve_fabric_ip(None, None))


EXPERT = Playbook(name="expert", reserve_bytes=PLAN)


@pytest.mark.parametrize("readings,pb,verdict,remedy_words", [
    (_gb10({"MemTotal": 127600748, "MemFree": 61 * GIB_KB, "MemAvailable": 112 * GIB_KB, "Cached": 49 * GIB_KB}),
     EXPERT, "WARN", "drop_caches"),
    (_gb10({"MemTotal": 127600748, "MemFree": 20 * GIB_KB, "MemAvailable": 31 * GIB_KB, "Cached": 9 * GIB_KB}),
     EXPERT, "FAIL", "stop the processes"),
    (_gb10({"MemTotal": 127600748, "MemFree": 108 * GIB_KB, "MemAvailable": 112 * GIB_KB}), EXPERT, "PASS", "nothing"),
    # no plan in the generic role: SKIP, not PASS
    (_gb10({"MemTotal": 127600748, "MemFree": 1, "MemAvailable": 1}), Playbook(), "SKIP", "reserve_bytes"),
    # a fraction of MemTotal on unified memory: 0.9 x 121.7 GiB = 109.5 GiB > MemFree 100 GiB
    (_gb10({"MemTotal": 127600748, "MemFree": 100 * GIB_KB, "MemAvailable": 115 * GIB_KB}),
     Playbook(name="x", reserve_fraction=0.9), "WARN", "drop_caches"),
    # discrete: NVML free against reserve_bytes
    (_h200(90 * 2**30), Playbook(name="big", reserve_bytes=PLAN), "FAIL", "stop the processes"),
    (_h200(140 * 2**30), Playbook(name="big", reserve_bytes=PLAN), "PASS", "nothing"),
    # discrete with a fraction: gpu.memory judges it, once
    (_h200(1 * 2**30), Playbook(name="coordinator", reserve_fraction=0.97), "SKIP", "reserve_bytes"),
])
def test_headroom_gate(readings, pb, verdict, remedy_words):
    v = gpu.headroom(_ctx(readings, pb))
    assert v.verdict == verdict, v.summary
    assert remedy_words in v.remedy + " ".join(v.commands)
    if verdict == "SKIP" and pb.reserve_fraction and not pb.reserve_bytes:
        assert "gpu.memory judges" in v.summary


def test_expert_playbook_plans_100_gib():
    from afddiag.playbook import load

    assert load("expert").reserve_bytes == PLAN
    with pytest.raises(PlaybookError, match="reserve_bytes"):
        parse("[gpu]\nreserve_bytes = -1\n", "x.toml")


def test_headroom_replay_from_snapshot(tmp_path):
    """A capture's gpu.json replays: the expert role WARNs with the drop-caches remedy when page
    cache is what is short."""
    snap = tmp_path / "spark"
    snap.mkdir()
    (snap / "gpu.json").write_text(json.dumps(_gb10(
        {"MemTotal": 127600748, "MemFree": 40 * GIB_KB, "MemAvailable": 110 * GIB_KB, "Cached": 70 * GIB_KB})))
    res = CliRunner().invoke(cli, ["gpu", "--json", "--snapshot", str(snap), "--role", "expert"],
                             standalone_mode=False, catch_exceptions=False)
    rep = json.loads(res.stdout)
    v = next(g for g in rep["gates"] if g["id"] == "gpu.headroom")
    assert v["verdict"] == "WARN", v
    assert "MemFree 40.0 GiB is below the 100.0 GiB reservation of role expert" in v["summary"]
    assert v["commands"] == ["sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"] and "page cache" in v["remedy"]
    assert v["facts"]["0"]["cached_bytes"] == 70 * 2**30


def test_live_meminfo_reads_headroom_lines(tmp_path):
    from afddiag.probes.gpu import read_meminfo

    p = tmp_path / "meminfo"
    p.write_text("MemTotal:       127600748 kB\nMemFree:        41943040 kB\nMemAvailable:   115343360 kB\n"
                 "Buffers:          10240 kB\nCached:         73400320 kB\nSwapCached:         0 kB\n"
                 "CmaTotal:        65536 kB\nCmaFree:         70000 kB\n")
    got = read_meminfo(str(p))
    assert got == {"MemTotal": 127600748, "MemFree": 41943040, "MemAvailable": 115343360, "Buffers": 10240,
                   "Cached": 73400320, "CmaTotal": 65536, "CmaFree": 70000}


def test_headroom_ignores_meminfo_values_no_kernel_prints():
    """Fuzz finding (CI, seed 7): a 400-digit MemAvailable made gpu.headroom raise OverflowError
    ("gate failed on these facts"). Values beyond 64 bits are garbage: left out, never a crash."""
    huge = 10 ** 400
    facts = gpu_facts_from_readings(_gb10({"MemTotal": 127600748, "MemFree": huge, "MemAvailable": huge,
                                           "Cached": -5}))
    assert facts.host_meminfo_kb == {"MemTotal": 127600748}
    v = gpu.headroom(_ctx(_gb10({"MemTotal": 127600748, "MemFree": huge, "MemAvailable": huge}), EXPERT))
    assert v.verdict == "WARN" and "MemAvailable not read" in v.summary, v.summary
