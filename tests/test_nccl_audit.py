"""The NCCL audit (issue 24): the NCCL probe on fake trees (the ELF build-id note parser, the wheel's
metadata, the loader's order, nccl.conf), its capture and replay, ``launch.nccl``'s verdicts and the
known-bad signature ``nccl_builds_differ`` it supplies (vLLM issues 41725/42354: pip's NCCL 2.28.9 and
DGX OS's libnccl2 2.28.9 are different builds)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from afddiag import summary
from afddiag.capture import collect_bundle
from afddiag.gates import fleet as fg
from afddiag.model.nccl import NcclConfFile, NcclCopy, NcclFacts
from afddiag.model.run import Inputs, Observation
from afddiag.probes import nccl as ncclprobe
from afddiag.probes.nccl import elf_build_id, version_string
from afddiag.probes.registry import Run, Sources
from afddiag.runner import diagnose
from afddiag.schema.validate import summary_check
from afddiag.verdict import ERROR, PASS, SKIP, WARN
from conftest import case_dirs
from fakes import judge, observation
from test_judging_fleet import host  # the fleet tests' recorded host (its per-host summary)

SYS = "/usr/lib/aarch64-linux-gnu"
VENV = "/opt/engine/.venv"
SITE = f"{VENV}/lib/python3.12/site-packages"
BUILD_SYS, BUILD_PIP = "a1" * 20, "b2" * 20


def elf(build_id: str | None, is64: bool = True, little: bool = True, extra: bytes = b"") -> bytes:
    """A minimal ELF shared object: its header, one PT_LOAD and one PT_NOTE program header, the note
    segment (an ABI tag note, then the GNU build-id note when given), then ``extra`` bytes."""
    e = "<" if little else ">"
    notes = struct.pack(e + "III", 4, 16, 1) + b"GNU\0" + b"\0" * 16  # NT_GNU_ABI_TAG first
    if build_id is not None:
        desc = bytes.fromhex(build_id)
        notes += struct.pack(e + "III", 4, len(desc), 3) + b"GNU\0" + desc + b"\0" * (-len(desc) % 4)
    ehsize, phentsize = (64, 56) if is64 else (52, 32)
    note_off = ehsize + 2 * phentsize
    head = b"\x7fELF" + bytes([2 if is64 else 1, 1 if little else 2, 1]) + b"\0" * 9
    if is64:
        head += struct.pack(e + "HHIQQQIHHHHHH", 3, 183, 1, 0, ehsize, 0, 0, ehsize, phentsize, 2, 0, 0, 0)
        ph = struct.pack(e + "IIQQQQQQ", 1, 5, 0, 0, 0, note_off, note_off, 4096)
        ph += struct.pack(e + "IIQQQQQQ", 4, 4, note_off, note_off, note_off, len(notes), len(notes), 4)
    else:
        head += struct.pack(e + "HHIIIIIHHHHHH", 3, 40, 1, 0, ehsize, 0, 0, ehsize, phentsize, 2, 0, 0, 0)
        ph = struct.pack(e + "IIIIIIII", 1, 0, 0, 0, note_off, note_off, 5, 4096)
        ph += struct.pack(e + "IIIIIIII", 4, note_off, note_off, note_off, len(notes), len(notes), 4, 4)
    return head + ph + notes + extra


def put(root: Path, path: str, data: bytes | str) -> Path:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


def spark_tree(root: Path, system: bool = True, wheel: bool = True, conf: str | None = None) -> Path:
    """A DGX OS host: libnccl2 2.28.9 in the system directory (a soname link to the versioned file) and
    an engine venv holding nvidia-nccl-cu13 2.28.9 (another build), optional /etc/nccl.conf text."""
    if system:
        put(root, f"{SYS}/libnccl.so.2.28.9", elf(BUILD_SYS, extra=b"\0NCCL version 2.28.9+cuda13.0\0"))
        os.symlink("libnccl.so.2.28.9", root / SYS.lstrip("/") / "libnccl.so.2")
    if wheel:
        put(root, f"{SITE}/nvidia/nccl/lib/libnccl.so.2", elf(BUILD_PIP, extra=b"\0NCCL version 2.28.9+cuda13.0\0"))
        put(root, f"{SITE}/nvidia_nccl_cu13-2.28.9.dist-info/METADATA", "Metadata-Version: 2.1\nName: "
            "nvidia-nccl-cu13\nVersion: 2.28.9\n")
    if conf is not None:
        put(root, "/etc/nccl.conf", conf)
    return root


def read_facts(root: Path, env: dict[str, str] | None = None) -> NcclFacts:
    run = Run(Inputs(launch_env=env), Observation("h", "live"), host=Sources(root=str(root)))

    class Progress:
        doing = ""

    return ncclprobe.PROBE.facts(run, ncclprobe.PROBE.read(run, Progress()), Progress())["nccl"]


# ---------------------------------------------------------------- the ELF note parser


@pytest.mark.parametrize("is64,little", [(True, True), (True, False), (False, True), (False, False)])
def test_build_id_is_read_from_the_note_segment_in_every_elf_class(tmp_path, is64, little):
    p = put(tmp_path, "lib.so", elf(BUILD_SYS, is64, little))
    assert elf_build_id(str(p)) == BUILD_SYS


@pytest.mark.parametrize("data,expected", [
    (b"", None), (b"not an elf at all" * 10, None), (elf(None), None),  # no build-id note
    (elf(BUILD_SYS)[:100], None),  # cut inside the program headers
    (elf(BUILD_SYS)[:18] + struct.pack("<H", 0xFFFF) + elf(BUILD_SYS)[20:], BUILD_SYS),  # e_machine: not looked at
])
def test_build_id_on_odd_files(tmp_path, data, expected):
    assert elf_build_id(str(put(tmp_path, "x.so", data))) == expected


def test_a_hostile_note_size_or_header_count_stops_the_parser(tmp_path):
    bad = bytearray(elf(BUILD_SYS))
    struct.pack_into("<H", bad, 0x38, 60000)  # e_phnum
    assert elf_build_id(str(put(tmp_path, "a.so", bytes(bad)))) is None
    notes_at = 64 + 2 * 56
    bad = bytearray(elf(BUILD_SYS))
    struct.pack_into("<I", bad, notes_at, 0xFFFFFFF0)  # namesz past the segment
    assert elf_build_id(str(put(tmp_path, "b.so", bytes(bad)))) is None


@pytest.mark.parametrize("text,want", [
    (b"NCCL version 2.28.9+cuda13.0", ("2.28.9", "13.0")),  # pip's nvidia-nccl-cu13 (strings libnccl.so.2)
    (b"NCCL version 2.28.3 compiled with CUDA 13.0", ("2.28.3", "13.0")),  # a libnccl2 package, as an H200 host has it
    (b"NCCL version 2.21.5", ("2.21.5", None)), (b"NCCL version x", (None, None))])
def test_version_string_forms(tmp_path, text, want):
    assert version_string(str(put(tmp_path, "v.so", b"\0" * 64 + text + b"\0")), deadline=1e18) == want


def test_version_string_is_found_across_a_chunk_edge_and_bounded(tmp_path):
    p = put(tmp_path, "l.so", b"\0" * ((1 << 20) - 10) + b"NCCL version 2.27.3+cuda12.9\0")
    assert version_string(str(p), deadline=1e18) == ("2.27.3", "12.9")
    assert version_string(str(p), deadline=1e18, max_bytes=1 << 19) == (None, None)


# ---------------------------------------------------------------- the probe on fake trees


def test_wheel_and_system_builds_of_one_version_are_both_found_in_loader_order(tmp_path):
    f = read_facts(spark_tree(tmp_path), {"VIRTUAL_ENV": VENV})
    assert [(c.origin, c.version, c.build_id) for c in f.copies] == [("wheel", "2.28.9", BUILD_PIP),
                                                                     ("system", "2.28.9", BUILD_SYS)]
    assert f.copies[0].version_source == "wheel metadata nvidia_nccl_cu13-2.28.9.dist-info"
    assert f.copies[1].real_path == f"{SYS}/libnccl.so.2.28.9" and f.copies[1].version_source == "file name"
    assert f.loaded.origin == "wheel"


def test_ld_library_path_and_ld_preload_come_before_the_wheel(tmp_path):
    root = spark_tree(tmp_path)
    f = read_facts(root, {"VIRTUAL_ENV": VENV, "LD_LIBRARY_PATH": f"/nonexistent:{SYS}"})
    assert [c.origin for c in f.copies] == ["LD_LIBRARY_PATH", "wheel"]  # the system copy is the same file
    put(root, "/opt/nccl/libnccl.so.2.29.1", elf("c3" * 20))
    f = read_facts(root, {"VIRTUAL_ENV": VENV, "LD_PRELOAD": "/opt/nccl/libnccl.so.2.29.1"})
    assert (f.loaded.origin, f.loaded.version) == ("LD_PRELOAD", "2.29.1")


def test_a_library_without_name_or_metadata_version_is_read_from_its_version_string(tmp_path):
    put(tmp_path, "/usr/local/lib/libnccl.so.2", elf(BUILD_SYS, extra=b"x" * 300 + b"NCCL version 2.26.2+cuda12.8"))
    f = read_facts(tmp_path, {})
    assert (f.loaded.version, f.loaded.cuda, f.loaded.version_source) == ("2.26.2", "12.8", "NCCL version string")


def test_conf_files_keep_their_nccl_lines_only_and_nccl_conf_file_replaces_home(tmp_path):
    root = spark_tree(tmp_path, conf="# site\nNCCL_P2P_DISABLE=1\nOTHER=2\n NCCL_SPACED=1\nNCCL_DEBUG=WARN\n")
    put(root, "/home/eng/.nccl.conf", "NCCL_IB_HCA=mlx5_9\n")
    put(root, "/srv/n.conf", "NCCL_SOCKET_IFNAME=eth9\n")
    f = read_facts(root, {"HOME": "/home/eng"})
    assert [(c.path, [(x["line"], x["key"]) for x in c.lines]) for c in f.conf_files] == [
        ("/home/eng/.nccl.conf", [(1, "NCCL_IB_HCA")]),
        ("/etc/nccl.conf", [(2, "NCCL_P2P_DISABLE"), (5, "NCCL_DEBUG")])]
    f = read_facts(root, {"HOME": "/home/eng", "NCCL_CONF_FILE": "/srv/n.conf"})
    assert [c.path for c in f.conf_files] == ["/srv/n.conf", "/etc/nccl.conf"]


def test_capture_then_replay_gives_the_same_facts(tmp_path):
    root = spark_tree(tmp_path / "host", conf="NCCL_P2P_DISABLE=1\n")
    files, _host, _notes = collect_bundle(Sources(root=str(root)))
    assert "nccl.json" in files
    snap = tmp_path / "snap"
    for rel, data in files.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
    _rep, obs = diagnose(Inputs(snapshot=str(snap), families=frozenset({"launch"})))
    live = read_facts(root)
    assert obs.nccl.copies == live.copies and obs.nccl.conf_files == live.conf_files


def test_a_hostile_nccl_json_is_bounded_and_typed(tmp_path):
    raw = {"copies": [{"path": "/x/libnccl.so.2", "origin": "wheel", "build_id": "zz not hex", "version": 7},
                      {"path": 3, "origin": "system"}, {"path": "/y", "origin": "elsewhere"}] + [
                     {"path": f"/l{i}", "origin": "system"} for i in range(100)],
           "conf_files": [{"path": "/etc/nccl.conf", "lines": [{"line": 1, "key": "NCCL_X", "value": "v" * 5000},
                                                                {"line": 2, "key": "LD_PRELOAD", "value": "/evil"}]}]}
    f = ncclprobe.facts_from_json(raw, None)
    assert f.copies[0].build_id is None and f.copies[0].version is None and len(f.copies) == ncclprobe.MAX_COPIES
    assert [x["key"] for x in f.conf_files[0].lines] == ["NCCL_X"] and len(f.conf_files[0].lines[0]["value"]) == 200
    assert not ncclprobe.facts_from_json([1, 2], None).captured


# ---------------------------------------------------------------- launch.nccl and the known-bad signature


def copy(origin: str, version: str, build: str, path: str = "") -> NcclCopy:
    p = path or f"/{origin}/libnccl.so.2"
    return NcclCopy(path=p, real_path=p, origin=origin, where=os.path.dirname(p), version=version, build_id=build)


def test_two_builds_of_one_version_warn_and_feed_the_known_bad_entry():
    f = NcclFacts(copies=[copy("wheel", "2.28.9", BUILD_PIP), copy("system", "2.28.9", BUILD_SYS)], env={})
    v = judge("launch.nccl", observation(nccl=f))
    assert v.verdict == WARN and v.action == "SET_ENV"
    assert "NCCL 2.28.9 in 2 builds" in v.summary and BUILD_PIP[:12] in v.summary and BUILD_SYS[:12] in v.summary
    kb = judge("host.known-bad", observation(nccl=f))
    entry = next(e for e in kb.facts["entries"] if e["id"] == "nccl-2.28.9-two-builds")
    assert kb.verdict == WARN and entry["result"] == "match"


@pytest.mark.parametrize("copies,result,verdict", [
    ([("wheel", "2.28.9", BUILD_PIP), ("system", "2.28.9", BUILD_PIP)], "clear", PASS),  # one build, two places
    ([("wheel", "2.28.8", BUILD_PIP), ("system", "2.28.9", BUILD_SYS)], "clear", PASS),  # different versions
    ([("wheel", "2.29.0", BUILD_PIP), ("system", "2.29.0", BUILD_SYS)], "clear", WARN),  # outside the entry's range
    ([], "unchecked", SKIP),  # no libnccl found: the entry is not checked
])
def test_known_bad_entry_and_gate_on_other_copies(copies, result, verdict):
    f = NcclFacts(copies=[copy(*c, path=f"/p{i}/libnccl.so.2") for i, c in enumerate(copies)], env={})
    kb = judge("host.known-bad", observation(nccl=f))
    assert next(e for e in kb.facts["entries"] if e["id"] == "nccl-2.28.9-two-builds")["result"] == result
    assert judge("launch.nccl", observation(nccl=f)).verdict == verdict


def test_pass_names_the_library_the_engine_loads():
    f = NcclFacts(copies=[copy("LD_LIBRARY_PATH", "2.28.9", BUILD_SYS, f"{SYS}/libnccl.so.2.28.9")], env={},
                  conf_files=[NcclConfFile("/etc/nccl.conf", [])])
    v = judge("launch.nccl", observation(nccl=f))
    assert v.verdict == PASS and v.summary.startswith(f"the engine loads {SYS}/libnccl.so.2.28.9 (LD_LIBRARY_PATH; "
                                                      f"NCCL 2.28.9, build {BUILD_SYS[:12]})")


def test_nccl_conf_setting_what_the_launch_env_does_not_warns_naming_file_and_line():
    conf = NcclConfFile("/etc/nccl.conf", [{"line": 3, "key": "NCCL_P2P_DISABLE", "value": "1"},
                                           {"line": 4, "key": "NCCL_IB_HCA", "value": "mlx5_0"}])
    f = NcclFacts(copies=[copy("system", "2.28.9", BUILD_SYS)], env={"NCCL_IB_HCA": "rocep1s0f1"}, conf_files=[conf])
    v = judge("launch.nccl", observation(nccl=f))
    assert v.verdict == WARN and "/etc/nccl.conf:3 NCCL_P2P_DISABLE=1" in v.summary and "IB_HCA" not in v.summary
    f.env = {"NCCL_IB_HCA": "rocep1s0f1", "NCCL_P2P_DISABLE": "0"}
    assert judge("launch.nccl", observation(nccl=f)).verdict == PASS


def test_hostile_conf_text_is_escaped():
    conf = NcclConfFile("/etc/nccl.conf\x1b[2J", [{"line": 1, "key": "NCCL_X", "value": "\x1b]0;owned\x07\u202e"}])
    v = judge("launch.nccl", observation(nccl=NcclFacts(copies=[], env=None, conf_files=[conf])))
    assert v.verdict == WARN and "\x1b" not in v.summary and "\u202e" not in v.summary and "\\x1b" in v.summary


def test_not_captured_skips_and_a_failed_probe_is_error():
    assert judge("launch.nccl", observation(nccl=NcclFacts(captured=False, notes=["not captured"]))).verdict == SKIP
    assert judge("launch.nccl", observation(nccl=NcclFacts(captured=False, failed="timed out"))).verdict == ERROR
    assert judge("launch.nccl", observation()).verdict == SKIP


@pytest.mark.parametrize("case", [c for c in case_dirs("fabric") + case_dirs("gpu") if "healthy" in c.name])
def test_healthy_captures_pass_or_skip(case):
    rep, _ = diagnose(Inputs(snapshot=str(case)))
    v = next(g for g in rep["gates"] if g["id"] == "launch.nccl")
    assert v["verdict"] in (PASS, SKIP), v


def test_report_json_carries_the_nccl_facts(tmp_path):
    root = spark_tree(tmp_path / "host")
    files, _h, _n = collect_bundle(Sources(root=str(root)))
    assert json.loads(files["nccl.json"])["copies"][0]["build_id"] == BUILD_SYS


# ---------------------------------------------------------------- the per-host summary and fleet.nccl-build


def nccl_host(name: str, version: str | None, build: str | None, origin: str = "wheel"):
    b = {"path": f"/{origin}/libnccl.so.2", "origin": origin, "version": version, "build_id": build}
    return host(name, nccl=b if version or build else None)


def fleet_verdict(fleet):
    return next(v for v in fg.run_fleet_gates(fleet) if v.id == "fleet.nccl-build")


def test_fleet_ranks_on_two_builds_of_one_version_warn_naming_each_group():
    v = fleet_verdict([nccl_host("s1", "2.28.9", BUILD_PIP), nccl_host("s2", "2.28.9", BUILD_PIP),
                       nccl_host("s3", "2.28.9", BUILD_SYS, "system")])
    assert v.verdict == WARN and v.action == "SET_ENV"
    assert v.summary.startswith(f"ranks load 2 different NCCL builds: s1, s2: NCCL 2.28.9 build {BUILD_PIP[:12]} "
                                f"(wheel); s3: NCCL 2.28.9 build {BUILD_SYS[:12]} (system)")


def test_fleet_same_build_passes_and_too_few_skip():
    v = fleet_verdict([nccl_host("s1", "2.28.9", BUILD_SYS), nccl_host("s2", "2.28.9", BUILD_SYS),
                       nccl_host("s3", None, None)])
    assert v.verdict == PASS and "2 host(s) load the same NCCL 2.28.9" in v.summary and "s3" in v.summary
    assert fleet_verdict([nccl_host("s1", "2.28.9", BUILD_SYS), nccl_host("s2", None, None)]).verdict == SKIP


def test_fleet_hostile_build_fields_are_escaped():
    v = fleet_verdict([nccl_host("s1", "2.28.9\x1b[31m", BUILD_SYS), nccl_host("s2\u202e", "2.28.9", BUILD_PIP)])
    assert v.verdict == WARN and "\x1b" not in v.summary and "\u202e" not in v.summary


def test_summary_carries_the_loaded_build_and_reads_it_back_from_an_older_report(tmp_path):
    root = spark_tree(tmp_path / "host")
    files, _h, _n = collect_bundle(Sources(root=str(root)))
    snap = tmp_path / "snap"
    for rel, data in files.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
    rep, _obs = diagnose(Inputs(snapshot=str(snap)))
    want = {"path": f"{SYS}/libnccl.so.2.28.9", "origin": "system", "version": "2.28.9", "build_id": BUILD_SYS}
    assert rep["summary"]["nccl"] == want and summary_check()(rep["summary"], "summary") is None
    older = {k: v for k, v in rep.items() if k != "summary"}
    assert summary.of(older)["nccl"] == want
