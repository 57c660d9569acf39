"""Fuzzing, CI-sized: property tests (hypothesis) and a short mutation run over afddiag's parsers.

The long run is ``tests/fuzz/run_fuzz.py``; both use the targets of ``tests/fuzz/fuzzlib.py``, whose
promise is: never a traceback, always facts and verdicts (or a one-line usage error, exit 64).
Bounded: about half a minute in all on two cores.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import fuzzlib  # noqa: E402

FAST = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
SLOW = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

odd_text = st.one_of(st.sampled_from(fuzzlib.ODD_NAMES + ["", "NOT_SUPPORTED", "UP", "inet", "inet6"]),
                     st.text(max_size=20))
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), odd_text)
anyjson = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                    st.dictionaries(odd_text, c, max_size=4)), max_leaves=20)


def _ok(target: str, data: bytes) -> None:
    why = fuzzlib.run_one(target, data)
    assert why is None, f"{target}: {why}\ninput: {data[:500]!r}"


def _dump(obj) -> bytes:
    return json.dumps(obj).encode()


# --- ip -j addr -------------------------------------------------------------------------------

addr_info = st.fixed_dictionaries({"family": st.one_of(st.sampled_from(["inet", "inet6"]), scalars),
                                   "local": st.one_of(st.sampled_from(["192.168.100.10", "fe80::1", ""]), scalars),
                                   "prefixlen": st.one_of(st.integers(0, 128), scalars)})
interface = st.fixed_dictionaries(
    {"ifname": st.one_of(st.sampled_from(["enp1s0f1np1", "enP2p1s0f1np1"]), odd_text)},
    optional={"mtu": st.one_of(st.integers(-1, 70000), scalars), "operstate": scalars,
              "addr_info": st.one_of(st.lists(st.one_of(addr_info, scalars), max_size=4), scalars)})


@FAST
@given(st.one_of(st.lists(interface, max_size=6), anyjson))
def test_ip_addr_json_never_crashes(data) -> None:
    _ok("ip_addr", _dump(data))


@FAST
@given(st.binary(max_size=300))
def test_ip_addr_random_bytes(data) -> None:
    _ok("ip_addr", data)


# --- rdma -j dev show -------------------------------------------------------------------------

@FAST
@given(st.one_of(st.lists(st.fixed_dictionaries({"ifname": odd_text, "ifindex": st.one_of(st.integers(), scalars)}),
                          max_size=8), anyjson))
def test_rdma_dev_json_never_crashes(data) -> None:
    _ok("rdma_dev", _dump(data))


# --- env / launch env -------------------------------------------------------------------------

env_line = st.one_of(
    st.builds(lambda k, v, e, q: f"{'export ' if e else ''}{k}={q}{v}{q}",
              st.sampled_from(["DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX",
                               "AFD_FABRIC_IP", "AFD_ROLE", "AFD_EXPERT_CAPACITY", "AFD_PEER_FABRIC_IPS",
                               "AFD_IMAGE_SM_COUNT", "SITE_IP", "X Y", "\u00e9"]),
              st.one_of(st.sampled_from(["192.168.100.10=rocep1s0f1", "=mlx5_0:1", "^mlx5", "3", "-1",
                                         "192.168.100.10", "1.2.3.4,,", "expert", "99999999999999999999"]),
                        st.text(max_size=30)),
              st.booleans(), st.sampled_from(["", "'", '"'])),
    st.text(max_size=40))


@FAST
@given(st.lists(env_line, max_size=10))
def test_env_files_never_crash(lines) -> None:
    _ok("env", "\n".join(lines).encode("utf-8", errors="replace"))


@FAST
@given(st.binary(max_size=300))
def test_env_random_bytes(data) -> None:
    _ok("env", data)


# --- gpu.json ---------------------------------------------------------------------------------

nvml = st.dictionaries(st.sampled_from(["memory_info", "clock_sm_mhz", "clock_sm_max_mhz", "power_mw", "pstate",
                                        "clocks_event_reasons", "temperature_c", "ecc", "retired_pages",
                                        "remapped_rows", "processes", "clocks_event_reason_counters_us"]),
                       st.one_of(scalars, anyjson), max_size=8)
device = st.fixed_dictionaries({}, optional={
    "index": scalars, "name": st.one_of(st.sampled_from(["NVIDIA H200", "NVIDIA GB10"]), scalars), "uuid": scalars,
    "cuda": st.one_of(st.dictionaries(st.sampled_from(["sm_count", "compute_capability", "integrated"]),
                                      st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=3), scalars),
    "nvml": st.one_of(nvml, scalars), "under_load": st.one_of(anyjson, st.dictionaries(
        st.sampled_from(["clock_sm_mhz", "why", "achieved", "power_mw"]), st.one_of(scalars, anyjson), max_size=4)),
    "notes": st.one_of(st.lists(scalars, max_size=3), scalars)})
gpu_json = st.fixed_dictionaries({}, optional={
    "devices": st.one_of(st.lists(st.one_of(device, scalars), max_size=4), scalars),
    "driver_version": scalars, "cuda_driver_version": scalars, "why": scalars, "failed": scalars,
    "host_meminfo_kb": st.one_of(
        st.dictionaries(st.sampled_from(["MemTotal", "MemAvailable", "MemFree", "Cached", "Buffers"]), scalars),
        scalars),
    "expect": st.one_of(st.dictionaries(st.sampled_from(["image_sm_count", "baseline"]), st.one_of(scalars, anyjson)),
                        scalars),
    "xid_events": st.one_of(st.lists(anyjson, max_size=3), scalars), "notes": scalars})


@FAST
@given(gpu_json)
def test_gpu_json_never_crashes(data) -> None:
    _ok("gpu", _dump(data))


# --- sysfs tree and whole snapshots -----------------------------------------------------------

edit = st.one_of(
    st.tuples(st.just("bytes"), st.integers(0, 10000), st.sampled_from(
        ["", "\x00\xff", "4: ACTIVE", "1: DOWN", "RoCE v2", "IB/RoCE v1", "9000", "-1", "fe80::1", "x" * 3000,
         "0000:0000:0000:0000:0000:ffff:c0a8:640a", "\u00e9\u2028"])),
    st.tuples(st.just("truncate"), st.integers(0, 10000), st.integers(0, 40)),
    st.tuples(st.sampled_from(["delete", "dir"]), st.integers(0, 10000), st.just(0)),
    st.tuples(st.just("rename"), st.integers(0, 10000), st.integers(0, len(fuzzlib.ODD_NAMES) - 1)),
    st.tuples(st.just("errno"), st.integers(0, 10000), st.sampled_from(sorted(fuzzlib.ERRNOS))),
    st.tuples(st.just("dup"), st.integers(0, 10000), st.sampled_from([1, 5]))).map(list)


@SLOW
@given(st.lists(edit, min_size=1, max_size=6))
def test_sysfs_tree_edits_and_read_errors_never_crash(edits) -> None:
    _ok("sysfs", _dump(edits))


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(edit, min_size=1, max_size=6))
def test_snapshot_replay_through_the_cli_never_crashes(edits) -> None:
    _ok("snapshot", _dump(edits))


# --- the stored corpus, scale, and a short mutation run ---------------------------------------

@pytest.mark.parametrize("target", sorted(fuzzlib.TARGETS))
def test_corpus_replays_clean(target) -> None:
    files = sorted((fuzzlib.CORPUS / target).glob("*"))
    assert files, f"no corpus for {target} in {fuzzlib.CORPUS / target}"
    for p in files:
        _ok(target, p.read_bytes())


def test_thousands_of_devices_and_gids(tmp_path) -> None:
    """1000 RDMA devices (names with spaces and unicode among them), 4000 GIDs: read and judged in bounded time."""
    import tempfile

    from afddiag.gates import Context, resolve_fabric_ip, run_gates
    from afddiag.model.fabric import QpFacts
    from afddiag.model.run import Inputs, Observation
    from afddiag.probes.fabric import probe_fabric

    # a folder of its own in tmpfs (tmp_path's name repeats across concurrent runs: two checkouts
    # running the suite at once collided on it)
    root = Path(tempfile.mkdtemp(prefix="afddiag-scale-", dir=fuzzlib.FAST_TMP or tmp_path))
    ib = root / "sys/class/infiniband"
    try:
        for i in range(1000):
            name = f"mlx5_{i}" if i % 10 else f"dev {i} \u00e9"
            port = ib / name / "ports/1"
            (port / "gids").mkdir(parents=True)
            (port / "gid_attrs/types").mkdir(parents=True)
            (port / "gid_attrs/ndevs").mkdir(parents=True)
            (port / "state").write_text("4: ACTIVE\n")
            for g in range(4):
                mapped = f"0000:0000:0000:0000:0000:ffff:0a{i // 256:02x}:{i % 256:02x}{g:02x}"
                (port / "gids" / str(g)).write_text(mapped + "\n")
                (port / "gid_attrs/types" / str(g)).write_text("RoCE v2\n")
                (port / "gid_attrs/ndevs" / str(g)).write_text(f"eth{i}\n")
        t = time.monotonic()
        fab = probe_fabric(str(root))
        obs = Observation(host="scale", source="scale", fabric=fab, qp=QpFacts(why="scale"), env={})
        inputs = Inputs(fabric_ip="10.0.0.1")
        verdicts = run_gates(Context(obs, inputs, resolve_fabric_ip(fab, inputs.fabric_ip)), {"fabric"})
        elapsed = time.monotonic() - t
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    assert len(fab.devices) == 1000 and sum(len(p.gids) for d in fab.devices for p in d.ports) == 4000
    assert "dev 0 \u00e9" in {d.name for d in fab.devices}
    assert all("gate failed" not in v.summary for v in verdicts), [v.summary for v in verdicts]
    assert elapsed < 60, f"1000 devices took {elapsed:.1f}s"


def test_short_mutation_run_finds_nothing(capsys) -> None:
    """A few seconds of run_fuzz.py's mutation loop over every target: executions happen, findings don't."""
    import run_fuzz

    rc = run_fuzz.main(["--seconds", "6", "--seed", "7"])
    out = capsys.readouterr().out
    total = int(out.strip().splitlines()[-1].split()[1])
    assert rc == 0, out[-3000:]
    assert total > 200, out


# --- the command line itself ------------------------------------------------------------------

arg_value = st.one_of(st.sampled_from(["192.168.100.10", "10.9.0", "", "-1", "0", "0.05", "1e9", "nan", "expert",
                                       "no-such-role", "\u00e9", "a b", "--json"]), st.text(max_size=12))
option = st.one_of(
    st.tuples(st.sampled_from(["--fabric-ip", "--peer", "--timeout", "--qp-timeout", "--expect-sm", "--role",
                               "--expect-capacity", "--format"]), arg_value),
    st.tuples(st.sampled_from(["--json", "--no-qp", "--strict", "--bogus"]), st.none()))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.sampled_from(["all", "fabric", "gpu", "preflight", "devicemap", "catalog", "nosuch"]),
       st.lists(option, max_size=4), st.one_of(st.none(), st.binary(max_size=200)))
def test_command_line_never_tracebacks(tmp_path_factory, command, options, launch_env) -> None:
    """Random flags and values (and a random --launch-env file) on a snapshot: an exit code, a JSON
    report when --json ran, or a usage error (64) that is one line, never a traceback."""
    import contextlib
    import io

    from afddiag.cli import run

    args = [command]
    if command not in ("catalog", "nosuch"):
        args += ["--snapshot", str(fuzzlib.CASES / "fabric" / fuzzlib.BASE_FABRIC_CASE)]
    for flag, value in options:
        args += [flag] if value is None else [flag, value]
    if launch_env is not None and command in ("all", "fabric", "gpu", "preflight"):
        p = tmp_path_factory.mktemp("env") / "rank.env"
        p.write_bytes(launch_env)
        args += ["--launch-env", str(p)]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = run(args)
    assert rc in (0, 1, 2, 3, 64), (args, rc, err.getvalue())
    if rc == 64:
        first = err.getvalue().strip().splitlines()[0]
        assert first.startswith("afddiag:") and len(first) < 2000, (args, err.getvalue())
    elif "--json" in args and command in ("all", "fabric", "gpu"):
        assert json.loads(out.getvalue())["exit_code"] == rc, args


def test_snapshot_path_with_spaces_and_unicode_reads_the_same(tmp_path, capsys) -> None:
    import shutil

    from afddiag.cli import run

    src = fuzzlib.CASES / "fabric" / fuzzlib.BASE_FABRIC_CASE
    odd = tmp_path / "snap shot \u00e9\u2028 \U0001f600" / "case"
    shutil.copytree(src, odd)
    verdicts = []
    for path in (src, odd):
        rc = run(["all", "--json", "--snapshot", str(path), "--fabric-ip", "192.168.100.10"])
        rep = json.loads(capsys.readouterr().out)
        verdicts.append((rc, {g["id"]: g["verdict"] for g in rep["gates"]}))
    assert verdicts[0] == verdicts[1] and verdicts[0][0] == 2, verdicts
