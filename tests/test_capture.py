"""`afddiag capture` → bundle → `--snapshot FILE.tar.gz`: the round trip, the bundle's content, and
the refusal of hostile bundles. The lab test at the end captures on the soft-RoCE incident host."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import tarfile
import tempfile
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from afddiag import bundle as bundlemod
from afddiag.capture import collect_bundle, write_bundle
from afddiag.cli import cli, run
from afddiag.envvars import parse_env_file
from afddiag.probes import registry
from afddiag.probes.netlink import parse_ip_addr_json, parse_rdma_dev_json
from conftest import case_dirs, load_case
from fakes import case_args, case_sources, einval_reader

FABRIC = case_dirs("fabric")
GPU = case_dirs("gpu")
REPO = Path(__file__).resolve().parent.parent


def run_json(args):
    res = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    return json.loads(res.stdout), res.return_value


def normal(rep: dict, *paths) -> list[tuple]:
    out = []
    for g in rep["gates"]:
        s = g["summary"]
        for p in paths:
            s = s.replace(str(p), "<snapshot>")
        s = s.replace("(snapshot without an env file: nothing set)", "(snapshot env)")  # a bundle always has env
        out.append((g["id"], g["verdict"], s))
    return out


@pytest.mark.parametrize("case", FABRIC + GPU, ids=[f"{p.parent.name}/{p.name}" for p in FABRIC + GPU])
def test_capture_replay_gives_the_case_verdicts(case, tmp_path, report_schema):
    bundle = tmp_path / "out" / "host.tar.gz"
    bundle.parent.mkdir()
    path, notes = write_bundle(bundle, case_sources(case))
    assert path == bundle and bundle.is_file()
    assert sorted(os.listdir(bundle.parent)) == ["host.tar.gz"]  # no temporary file left
    direct, code_d = run_json(["all", "--json", "--snapshot", str(case)] + case_args(case))
    replay, code_r = run_json(["all", "--json", "--snapshot", str(bundle)] + case_args(case))
    jsonschema.validate(replay, report_schema)
    assert normal(replay, bundle) == normal(direct, case)
    assert replay["device_map"] == direct["device_map"]
    assert replay["host"] == direct["host"] == load_case(case).get("host", replay["host"])
    assert code_r == code_d == direct["exit_code"]
    assert replay["source"] == f"snapshot {bundle}"
    want = load_case(case)["expected"]["gates"]
    assert {k: v for k, v in ((g["id"], g["verdict"]) for g in replay["gates"]) if k in want} == want


@pytest.mark.parametrize("case", FABRIC, ids=[p.name for p in FABRIC])
def test_bundle_sysfs_matches_the_case_tree(case):
    """The bundle's sys/ has the case's files (same contents), no attribute of an empty slot, and
    EINVAL-SLOTS listing exactly the case's slots."""
    files, host, _ = collect_bundle(case_sources(case))
    assert host == load_case(case)["host"]
    case_files = {str(p.relative_to(case)): p.read_text().strip() for p in (case / "sys").rglob("*") if p.is_file()}
    got = {k: v.decode().strip() for k, v in files.items() if k.startswith("sys/")}
    wanted = {k: v for k, v in case_files.items() if probe_reads(k)}
    assert {k: got.get(k) for k in wanted} == wanted
    for k, v in case_files.items():
        if k.endswith("EINVAL-SLOTS"):
            assert sorted(got[k].split(), key=int) == sorted(v.split(), key=int), k
    for k in got:
        assert k in case_files, f"{k} is not in the case tree"
        assert probe_reads(k) or k.endswith("EINVAL-SLOTS"), f"{k} is not a file the fabric probe reads"


def probe_reads(rel: str) -> bool:
    """The sysfs files the fabric probe reads (and so the only ones a bundle carries)."""
    import re

    return bool(re.fullmatch(
        r"sys/class/infiniband/[^/]+/(node_guid|node_type|hca_type|fw_ver"
        r"|ports/\d+/(state|phys_state|link_layer|rate|gids/\d+|gid_attrs/(types|ndevs)/\d+))"
        r"|sys/class/net/[^/]+/(mtu|operstate|address|carrier|speed)", rel))


def test_bundle_env_is_allow_listed(tmp_path):
    case = FABRIC[0]
    files, _, _ = collect_bundle(case_sources(case, environ={
        "NCCL_IB_HCA": "=mlx5_0:1", "AFD_FABRIC_IP": "10.0.0.1", "HOME": "/root", "SSH_AUTH_SOCK": "/tmp/x",
        "AWS_SECRET_ACCESS_KEY": "k", "CUDA_VISIBLE_DEVICES": "0,1", "UCX_NET_DEVICES": "  spaced ",
        "NCCL_DEBUG": "INFO"}))
    env = parse_env_file(files["env"].decode())
    assert env == {"NCCL_IB_HCA": "=mlx5_0:1", "AFD_FABRIC_IP": "10.0.0.1", "CUDA_VISIBLE_DEVICES": "0,1",
                   "UCX_NET_DEVICES": "  spaced "}
    blob = b"".join(files.values())
    assert b"/tmp/x" not in blob and b"AWS_SECRET" not in blob


def test_bundle_json_parts_have_the_shapes_the_replay_reads():
    case = next(c for c in FABRIC if c.name.startswith("17-"))
    files, _, notes = collect_bundle(case_sources(case, route=lambda: [{"dst": "default", "gateway": "192.0.2.1"}]))
    rdma = json.loads(files["rdma-dev.json"])
    assert parse_rdma_dev_json(rdma) == parse_rdma_dev_json(json.loads((case / "rdma-dev.json").read_text()))
    assert all({"ifindex", "ifname"} <= set(r) for r in rdma)
    got = parse_ip_addr_json(json.loads(files["ip-addr.json"]))
    want = parse_ip_addr_json(json.loads((case / "ip-addr.json").read_text()))
    for name, nd in want.items():
        assert (got[name].ipv4, got[name].mtu) == (nd.ipv4, nd.mtu)
    assert json.loads(files["ip-route.json"]) == [{"dst": "default", "gateway": "192.0.2.1"}]
    v = json.loads(files["versions.json"])
    assert v["rdma_core"] == "50.0" and v["afddiag"] and isinstance(v["bios"], (str, type(None)))
    assert set(v["hca_firmware"]) == {n for n, _ in parse_rdma_dev_json(rdma)}
    assert files["host"].decode().strip() == load_case(case)["host"]
    assert "gpu.json" not in files and "limits.json" not in files


def test_unknown_order_and_failed_addresses_are_left_out_and_replay_alike(tmp_path):
    """No device order (no netlink, no rdma tool): no rdma-dev.json; getifaddrs failed: no
    ip-addr.json. The replay judges what the live run would: names order, addresses not read."""
    case = FABRIC[0]
    src = case_sources(case, device_order=lambda: (None, "name (device index unknown)", ["netlink: no"]))
    src.addresses = lambda: (_ for _ in ()).throw(OSError("getifaddrs failed"))
    files, _, notes = collect_bundle(src)
    assert "rdma-dev.json" not in files and "ip-addr.json" not in files
    assert any("addresses" in n for n in notes) and any("rdma-dev.json not written" in n for n in notes)


def test_a_probe_that_hangs_is_bounded_and_noted():
    import time

    case = GPU[0]
    src = case_sources(case, gpu=lambda: time.sleep(5) or {})
    t = time.monotonic()
    files, _, notes = collect_bundle(src, timeout_s=0.3)
    assert time.monotonic() - t < 3
    assert "gpu.json" not in files and any("GPU probe" in n and "0.3" in n for n in notes)


def test_a_sysfs_read_that_hangs_leaves_no_partial_tree(tmp_path):
    """A hung sysfs read: no sys/ at all in the bundle (a partial tree would be judged as the host),
    and the replay says the fabric was not captured."""
    import threading

    case = FABRIC[0]
    release = threading.Event()
    inner = einval_reader(case)

    def reader(path):
        if path.endswith("/gids/5"):
            release.wait(10)
        return inner(path)

    try:
        path, notes = write_bundle(tmp_path / "b.tar.gz", case_sources(case, reader=reader), timeout_s=0.5)
    finally:
        release.set()
    names = tarfile.open(path).getnames()
    assert not any("/sys/" in n for n in names) and any("sysfs" in n and "0.5" in n for n in notes)
    rep, _ = run_json(["fabric", "--json", "--snapshot", str(path), "--no-history"])
    assert {g["id"]: g["verdict"] for g in rep["gates"]}["fabric.rdma-present"] == "SKIP"
    assert "no sys/" in next(g["summary"] for g in rep["gates"] if g["id"] == "fabric.rdma-present")


def test_capture_command_writes_atomically_and_refuses_a_bad_name(tmp_path, monkeypatch):
    case = FABRIC[0]
    monkeypatch.setattr(registry.Sources, "live", classmethod(lambda cls, **kw: case_sources(case)))
    out = tmp_path / "b.tar.gz"
    res = CliRunner().invoke(cli, ["capture", "-o", str(out)], standalone_mode=False, catch_exceptions=False)
    assert res.return_value == 0 and res.stdout.strip() == str(out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    names = tarfile.open(out).getnames()
    top = names[0].split("/")[0]
    assert top.startswith("afddiag-capture-") and all(n.split("/")[0] == top for n in names)
    assert run(["capture", "-o", str(tmp_path / "b.zip")]) == 64
    assert run(["capture", "-o", str(tmp_path / "missing" / "b.tar.gz")]) == 64
    assert sorted(os.listdir(tmp_path)) == ["b.tar.gz"]


def test_live_capture_on_this_machine_replays_like_the_live_run(tmp_path):
    """Whatever this machine has (usually no RDMA device and no GPU): the replay of its capture
    gives the live run's verdicts, the QP gate aside (a bundle holds no live QP walk)."""
    out = tmp_path / "live.tar.gz"
    assert run(["capture", "-o", str(out)]) == 0
    live, _ = run_json(["all", "--json", "--no-qp", "--no-history"])
    replay, _ = run_json(["all", "--json", "--snapshot", str(out), "--no-history"])
    skip = {"fabric.qp-rtr"}
    assert [(g["id"], g["verdict"]) for g in replay["gates"] if g["id"] not in skip] == \
        [(g["id"], g["verdict"]) for g in live["gates"] if g["id"] not in skip]
    assert replay["device_map"] == live["device_map"] and replay["host"] == live["host"]


# ---- hostile bundles -------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as t:
        for ti, data in members:
            if data is not None:
                ti.size = len(data)
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"x\n") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.linkname = link
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        ti.devmajor, ti.devminor = 1, 3
    return ti, None


HOSTILE = {
    "absolute": lambda o: [_file("host", b"h\n"), _file(str(o / "abs-evil"))],
    "dotdot": lambda o: [_file("snap/../../dotdot-evil")],
    "dotdot-deep": lambda o: [_file("snap/sys/../../../dotdot-deep-evil")],
    "symlink-out": lambda o: [_special("snap/sys", tarfile.SYMTYPE, str(o)), _file("snap/sys/symlink-evil")],
    "symlink-abs": lambda o: [_special("snap/gpu.json", tarfile.SYMTYPE, "/etc/passwd")],
    "hardlink-out": lambda o: [_special("snap/env", tarfile.LNKTYPE, "/etc/passwd")],
    "hardlink-in": lambda o: [_file("snap/host"), _special("snap/env", tarfile.LNKTYPE, "snap/host")],
    "chardev": lambda o: [_special("snap/null", tarfile.CHRTYPE)],
    "blockdev": lambda o: [_special("snap/sda", tarfile.BLKTYPE)],
    "fifo": lambda o: [_special("snap/fifo", tarfile.FIFOTYPE)],
    "huge-file": lambda o: [_file("snap/gpu.json", b"0" * 4096)],
    "too-much-in-all": lambda o: [_file(f"snap/sys/f{i}", b"1" * 1000) for i in range(10)],
    "duplicate": lambda o: [_file("snap/host", b"a\n"), _file("snap/host", b"b\n")],
    "file-then-dir": lambda o: [_file("snap/sys", b"x"), _file("snap/sys/class/x")],
}
WHY = {"absolute": "absolute path", "dotdot": "'..'", "dotdot-deep": "'..'", "symlink-out": "symbolic link",
       "symlink-abs": "symbolic link", "hardlink-out": "hard link", "hardlink-in": "hard link",
       "chardev": "not a plain file", "blockdev": "not a plain file", "fifo": "not a plain file",
       "huge-file": "cap", "too-much-in-all": "cap", "duplicate": "appears twice", "file-then-dir": "through a file"}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_bundle_is_refused_with_one_line_and_exit_64(kind, tmp_path, monkeypatch, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))  # the bundle is extracted under here
    monkeypatch.setattr(bundlemod, "MAX_FILE_BYTES", 2048)
    monkeypatch.setattr(bundlemod, "MAX_TOTAL_BYTES", 5000)
    b = _tar(tmp_path / "hostile.tar.gz", HOSTILE[kind](outside))
    code = run(["all", "--snapshot", str(b)])
    err = capsys.readouterr().err
    assert code == 64
    first = err.splitlines()[0]
    assert first.startswith(f"afddiag: snapshot {b}: refused: ") and WHY[kind] in first, err
    assert list(outside.iterdir()) == []  # nothing written outside
    assert list(tmpdir.iterdir()) == []  # the extraction folder is gone
    for name in ("dotdot-evil", "dotdot-deep-evil", "abs-evil", "symlink-evil"):
        assert not (tmp_path / name).exists() and not (tmpdir.parent / name).exists()


def test_refusal_comes_before_any_byte_of_the_member(tmp_path):
    dest = tmp_path / "d"
    dest.mkdir()
    b = _tar(tmp_path / "b.tar.gz", [_file("a/ok", b"fine\n"), _file("a/big", b"0" * 100)])
    with pytest.raises(bundlemod.BundleError, match="over the 50-byte cap"):
        bundlemod.safe_extract(b, dest, max_file_bytes=50)
    assert not (dest / "a" / "big").exists() and (dest / "a" / "ok").read_text() == "fine\n"


def test_not_a_bundle_and_missing_bundle_are_usage_errors(tmp_path, capsys):
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip at all")
    assert run(["all", "--snapshot", str(junk)]) == 64
    assert "not a readable .tar.gz" in capsys.readouterr().err
    assert run(["all", "--snapshot", str(tmp_path / "none.tar.gz")]) == 64
    assert "no such file" in capsys.readouterr().err


def test_a_plain_tar_of_a_case_directory_replays(tmp_path):
    """A bundle made with plain `tar czf` of a case folder (no top folder) replays too."""
    case = FABRIC[0]
    b = tmp_path / "case.tar.gz"
    subprocess.run(["tar", "czf", str(b), "-C", str(case), "."], check=True)
    direct, _ = run_json(["all", "--json", "--snapshot", str(case)] + case_args(case))
    replay, _ = run_json(["all", "--json", "--snapshot", str(b)] + case_args(case))
    assert normal(replay, b) == normal(direct, case)


# ---- the lab: capture on the soft-RoCE incident host, replay here ------------------------------

@pytest.fixture(scope="module")
def capture_lab(tmp_path_factory) -> dict:
    import labboot

    r = labboot.boot(tmp_path_factory, "lab-capture", "scenario-capture.py")
    assert r["boot_rc"] == 0, "lab/boot.sh failed although results.json exists"
    return r


@pytest.mark.lab
def test_lab_capture_replays_to_the_guest_live_verdicts(capture_lab):
    live = capture_lab["runs"]["live"]
    assert live["exception"] is None and isinstance(live["json"], dict), live
    assert capture_lab["runs"]["capture"]["rc"] == 0, capture_lab["runs"]["capture"]
    bundle = capture_lab["outdir"] / "capture.tar.gz"
    replay, code = run_json(["all", "--json", "--snapshot", str(bundle), "--fabric-ip", "10.9.0.2",
                             "--peer", "10.9.0.1"])
    lv = {g["id"]: g["verdict"] for g in live["json"]["gates"]}
    rv = {g["id"]: g["verdict"] for g in replay["gates"]}
    assert lv["fabric.first-device"] == "FAIL"  # the incident, live
    # the failed QP walk is explained by fabric.first-device (one fault, one remedy): SKIP "not judged",
    # with what the walk alone said kept in its facts
    qp = next(g for g in live["json"]["gates"] if g["id"] == "fabric.qp-rtr")
    assert qp["verdict"] == "SKIP" and qp["summary"].startswith("not judged: fabric.first-device failed"), qp
    assert qp["facts"]["judged_alone"]["verdict"] == "FAIL", qp["facts"]
    assert [d["gate"] for d in live["json"]["diagnosis"]][0] == "fabric.first-device"
    assert rv.pop("fabric.qp-rtr") == "SKIP"  # a bundle holds no live QP walk
    lv.pop("fabric.qp-rtr")
    assert rv == lv
    # no flags: the bundle's stored inputs (--fabric-ip 10.9.0.2 --peer 10.9.0.1) give the same verdicts
    bare, _ = run_json(["all", "--json", "--snapshot", str(bundle)])
    bv = {g["id"]: g["verdict"] for g in bare["gates"] if g["id"] != "fabric.qp-rtr"}
    assert bv == lv, (bv, lv)
    assert bare["inputs"]["sources"]["peers"] == "captured with --peer"
    assert replay["device_map"] == live["json"]["device_map"] == {"10.9.0.2": "arxe1"}
    assert replay["host"] == live["json"]["host"]
    fab = replay["facts"]["fabric"]
    assert [d["name"] for d in fab["devices"]] == ["zrxe0", "arxe1"] and fab["order_source"] == "rdma-dev.json"
    with tarfile.open(bundle) as t:
        names = t.getnames()
        env = next(n for n in names if n.endswith("/env"))
        env_text = t.extractfile(env).read().decode()
        assert all(m.isfile() or m.isdir() for m in t.getmembers())
    assert "NCCL_SOCKET_IFNAME='vc'" in env_text and "must-not-leave" not in env_text
    assert any(n.endswith("/ip-route.json") for n in names) and any(n.endswith("/limits.json") for n in names)


@pytest.mark.lab
def test_lab_prometheus_and_history_in_the_guest(capture_lab):
    from prometheus_client.parser import text_string_to_metric_families

    assert capture_lab["runs"]["prometheus"]["rc"] == 2  # first-device FAILs without the map
    text = (capture_lab["outdir"] / "afddiag.prom").read_text()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    first = [s for s in fams["afddiag_gate_status"].samples if s.labels["gate"] == "fabric.first-device"]
    assert [s.value for s in first] == [2.0]  # FAIL
    assert [s.labels for s in fams["afddiag_device_map_info"].samples][0]["device"] == "arxe1"
    hist = capture_lab["runs"]["history"]["json"]
    assert hist and len(hist["hosts"]) == 1
    (h,) = hist["hosts"].values()
    # both live runs are recorded: history compares runs of the latest run's command (fabric) and names
    # the other command's (all) apart
    assert h["command"] == "fabric" and h["runs"] == 1 and h["gates"]["fabric.first-device"][0]["verdict"] == "FAIL"
    assert [(o["command"], o["runs"]) for o in h["other"]] == [("all", 1)]


def test_devicemap_reads_a_bundle_like_a_folder(tmp_path, monkeypatch):
    import tempfile

    case = next(p for p in FABRIC if p.name.startswith("01-"))
    bundle, _ = write_bundle(tmp_path / "host.tar.gz", case_sources(case))
    private = tmp_path / "tmp"  # this test's own temporary folder: the shared /tmp holds other runs' bundles
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))  # gettempdir() caches its first answer
    made = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **kw: made.append(real_mkdtemp(*a, **kw)) or made[-1])
    before = set(Path(tempfile.gettempdir()).glob("afddiag-bundle-*"))
    assert Path(tempfile.gettempdir()) == private and before == set()
    outs = []
    for snap in (case, bundle):
        res = CliRunner().invoke(cli, ["devicemap", "--snapshot", str(snap), "--format", "json"],
                                 standalone_mode=False, catch_exceptions=False)
        outs.append(json.loads(res.stdout))
    assert outs[0] == outs[1] == {"192.168.100.10": "rocep1s0f1", "192.168.101.10": "roceP2p1s0f1"}
    assert set(Path(tempfile.gettempdir()).glob("afddiag-bundle-*")) == before  # extraction folder removed
    assert [Path(m).parent for m in made] == [private] and not Path(made[0]).exists()  # the bundle's, here


def _comparable_facts(rep: dict) -> dict:
    """A report's facts without what names where they came from (netlink vs the bundle's file, ip
    route get vs the captured answer), without the QP walk (live only) and without what the capture
    measures again (the CPU loop's figures, /proc/meminfo's free and cached memory): which of those
    readings each side has, not their values; and without why the CUDA view was read (the live run's
    reason is a probe, the replay's the capture), keeping whether it was."""
    f = json.loads(json.dumps(rep["facts"]))
    f.pop("qp", None)
    fab = f.get("fabric") or {}
    for k in ("order_source", "addresses_source", "notes"):
        fab.pop(k, None)
    (f.get("nic") or {}).pop("kernel_source", None)  # /dev/kmsg live, the bundle's kernel-nic.log replayed
    route = f.get("route") or {}
    route.pop("notes", None)
    for r in route.get("routes") or []:
        r.pop("source", None)
    cpu = f.get("cpu") or {}
    f["cpu"] = sorted(cpu)  # which readings the CPU probe gave, not the re-measured values
    gpu = f.get("gpu") or {}
    if isinstance(gpu.get("cuda_view"), dict):  # why CUDA was read names the run (the live run's probe, the capture)
        gpu["cuda_view"].pop("why", None)
    if isinstance(gpu.get("host_meminfo_kb"), dict):
        gpu["host_meminfo_kb"] = sorted(gpu["host_meminfo_kb"])
    return f


@pytest.mark.lab
def test_lab_every_probe_live_capture_replay_same_facts(capture_lab):
    """Parity in the soft-RoCE lab: every registered probe ran live in the guest, the capture holds
    what each read, the replay here turns it into the same facts and verdicts (the QP walk aside)."""
    live = capture_lab["runs"]["live"]["json"]
    bundle = capture_lab["outdir"] / "capture.tar.gz"
    replay, _ = run_json(["all", "--json", "--snapshot", str(bundle), "--fabric-ip", "10.9.0.2", "--peer", "10.9.0.1"])
    a, b = _comparable_facts(live), _comparable_facts(replay)
    assert a["fabric"]["devices"] and a["route"]["routes"] and a["versions"]["kernel"]  # the probes did read
    assert a == b
    lv = {g["id"]: g["verdict"] for g in live["gates"] if g["id"] != "fabric.qp-rtr"}
    assert lv == {g["id"]: g["verdict"] for g in replay["gates"] if g["id"] != "fabric.qp-rtr"}
    with tarfile.open(bundle) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    from afddiag.model.run import Inputs, Observation

    run = registry.Run(Inputs(fabric_ip="10.9.0.2", peers=["10.9.0.1"], run_qp=False),
                       Observation(host="", source="capture"), host=registry.Sources.live(),
                       capturing=True)  # the guest's capture: no launch env, so no image nor engine ports
    for p in registry.probes():  # every probe the capture wanted left its artifacts
        if p.live_only or not p.wanted(run):
            continue
        assert any(n == a.name or n.startswith(a.name + "/") for a in p.artifacts for n in names), p.name
