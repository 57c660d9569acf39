"""The known-bad matrix (checks/known_bad.toml) and host.known-bad (issue 24 item 2): every entry at a
version just inside and just outside each end of its range, with its signature seen, absent and unread;
one recorded host per entry; the matrix's validation; the platform probe's /etc/dgx-release reading and
its capture; what the gate says on the healthy Spark captures."""

from __future__ import annotations

import copy
import json

import pytest

from afddiag.gates.known_bad import MatrixError, in_range, matrix, validate, version_key
from afddiag.model.fabric import FabricFacts, MemRegFacts, Port, RdmaDevice
from afddiag.model.gpu import GpuFacts
from afddiag.model.pair import BandwidthRun, PairFacts, PortCounters
from afddiag.model.platform import PlatformFacts
from afddiag.model.run import Inputs
from afddiag.playbook import Playbook
from afddiag.probes.platform import parse_dgx_release
from afddiag.runner import diagnose
from afddiag.verdict import PASS, SKIP, WARN
from conftest import case_dirs
from fakes import judge, observation
from snapfix import derive, fabric_case

ENTRIES = {e["id"]: e for e in matrix()}
SPARK = dict(kernel="6.17.0-1031-nvidia", dgx_os="7.4.0", fw="28.45.4028", driver="580.173.02")


def host(kernel=SPARK["kernel"], dgx_os=SPARK["dgx_os"], fw=SPARK["fw"], driver=SPARK["driver"], cma=None,
         gbps=None, nccl=None):
    """A recorded Spark: versions, platform, fabric (one CX-7 function), GPU; optional CMA readings
    ``(total_kb, free_kb, kho_off)``, a bandwidth run's Gb/s and NCCL copies ``[(version, build_id)]``."""
    pair = None
    if gbps is not None:
        bw = BandwidthRun(seconds_asked=5.0, size=1048576, qps=4, depth=8, stage="done", seconds=5.0, gbps=gbps,
                          verified=True, bytes=int(gbps * 1e9 * 5 / 8), counters=[PortCounters(read=True)])
        pair = PairFacts(role="client", peer="10.0.0.2:18515", device="rocep1s0f0", port=1, fabric_ip="10.0.0.1",
                         netdev="enp1s0f0np0", link_speed_mbps=200000, mode="bandwidth", bandwidth=bw)
    memreg = MemRegFacts(cma_total_kb=cma[0], cma_free_kb=cma[1], kho_off=cma[2]) if cma else None
    return observation(
        versions={"kernel": kernel, "bios": None, "rdma_core": None},
        platform=PlatformFacts(dgx_os=dgx_os, dgx_os_source="DGX_OTA_VERSION", board="NVIDIA DGX Spark",
                               nccl=[{"version": v, "build_id": b, "path": f"/lib{i}"} for i, (v, b) in
                                     enumerate(nccl)] if nccl is not None else None),
        fabric=FabricFacts(devices=[RdmaDevice("rocep1s0f0", 0, fw_ver=fw, ports=[Port(1, "ACTIVE")])]),
        gpu=GpuFacts(driver_version=driver), memreg=memreg, pair=pair)


def kb(obs, **kw):
    return judge("host.known-bad", obs, **kw)


def entry_result(v, entry_id):
    return next(e for e in v.facts["entries"] if e["id"] == entry_id)


# ---------------------------------------------------------------- version ranges


def test_version_key_and_range_ends():
    assert version_key("6.17.0-1008-nvidia") == (6, 17, 0, 1008)
    assert in_range("6.17.0-1008-nvidia-64k", {"min": "6.17.0-1008", "max": "6.17.0-1008"})
    assert not in_range("6.17.0-1009-nvidia", {"min": "6.17.0-1008", "max": "6.17.0-1008"})
    assert in_range("7.0.99", {"min": "7.0.0", "max_below": "7.1"})
    assert not in_range("7.1.0-1", {"min": "7.0.0", "max_below": "7.1"})
    assert not in_range("no digits", {"min": "0"})


# ---------------------------------------------------------------- one recorded host per entry, inside and outside


@pytest.mark.parametrize("kernel, result", [
    ("6.17.0-1008-nvidia", "match"),   # the release itself
    ("6.17.0-1007-nvidia", "clear"),   # just below
    ("6.17.0-1009-nvidia", "clear"),   # just above
])
def test_kernel_6_17_0_1008(kernel, result):
    v = kb(host(kernel=kernel))
    assert entry_result(v, "kernel-6.17.0-1008-boot-panic")["result"] == result
    if result == "match":
        assert (v.verdict, v.action) == (WARN, "UPDATE_VERSIONS") and "DOE mailbox" in v.summary
        assert "newer DGX OS kernel" in v.remedy
    else:
        assert v.verdict == PASS


@pytest.mark.parametrize("kernel, cma, result", [
    ("7.0.0-1019-nvidia", (0, 9_700_000, None), "match"),      # the reports' kernel and signature
    ("7.0.0-31-generic", (0, 940_604, False), "match"),         # the 7.0.0-31 HWE report
    ("7.0.0-1019-nvidia", (0, 0, True), "clear"),               # kho=off: CmaFree 0, the fix applied
    ("7.0.0-1019-nvidia", (262_144, 200_000, None), "clear"),   # a real CMA area: free below total
    ("7.0.0-1019-nvidia", None, "unchecked"),                   # in range, /proc/meminfo not read
    ("7.0.0", (0, 9_700_000, None), "match"),                   # the lower end
    ("6.17.0-1031-nvidia", (0, 9_700_000, None), "clear"),      # just below: the 6.17 workaround
    ("7.1.0-1", (0, 9_700_000, None), "clear"),                 # just above the range
])
def test_kernel_7_0_kho_cma_enomem(kernel, cma, result):
    v = kb(host(kernel=kernel, cma=cma))
    assert entry_result(v, "kernel-7.0-kho-cma-enomem")["result"] == result
    if result == "match":
        assert (v.verdict, v.action) == (WARN, "UPDATE_VERSIONS") and "kho=off" in v.remedy
    else:
        assert v.verdict == PASS and "kho=off" not in v.remedy  # no remedy without its signature


@pytest.mark.parametrize("dgx_os, fw, gbps, result", [
    ("7.5.0", "28.45.4028", 13.2, "match"),
    ("7.5.0", "28.45.4028", 97.3, "clear"),      # the pairing, but a healthy rail
    ("7.5.0", "28.45.4028", None, "unchecked"),  # no bandwidth run: the signature not measured
    ("7.4.9", "28.45.4028", 13.2, "clear"),      # DGX OS just below
    ("7.5.1", "28.45.4028", 13.2, "clear"),      # just above
    ("7.5.0", "28.45.4027", 13.2, "clear"),      # firmware just below
    ("7.5.0", "28.45.4029", 13.2, "clear"),      # just above
    (None, "28.45.4028", 13.2, "unchecked"),     # DGX OS not read
])
def test_dgx_os_7_5_0_with_fw_28_45_4028(dgx_os, fw, gbps, result):
    v = kb(host(dgx_os=dgx_os, fw=fw, gbps=gbps))
    assert entry_result(v, "dgx-os-7.5.0-fw-28.45.4028-13gbps")["result"] == result
    if result == "match":
        assert (v.verdict, v.action) == (WARN, "REBOOT") and "13 Gb/s" in v.summary
    else:
        assert v.verdict == PASS


@pytest.mark.parametrize("nccl, result", [
    ([("2.28.9", "a7f420a1"), ("2.28.9", "c0db9360")], "match"),   # the wheel and libnccl2
    ([("2.28.9", "a7f420a1"), ("2.28.9", "a7f420a1")], "clear"),   # one build, two paths
    ([("2.28.8", "a7f420a1"), ("2.28.8", "c0db9360")], "clear"),   # just below
    ([("2.28.10", "a7f420a1"), ("2.28.10", "c0db9360")], "clear"),  # just above
    (None, "unchecked"),                                            # not read (afddiag does not read them yet)
])
def test_nccl_2_28_9_two_builds(nccl, result):
    v = kb(host(nccl=nccl))
    assert entry_result(v, "nccl-2.28.9-two-builds")["result"] == result
    if result == "match":
        assert (v.verdict, v.action) == (WARN, "SET_ENV") and "same libnccl build" in v.remedy


def test_two_matches_name_both_and_take_the_first_worst_action():
    v = kb(host(kernel="7.0.0-1019-nvidia", cma=(0, 9_700_000, None), dgx_os="7.5.0", gbps=13.2))
    assert v.verdict == WARN and "kernel-7.0-kho-cma-enomem" in v.summary and "dgx-os-7.5.0" in v.summary
    assert "kho=off" in v.remedy and "stale-initialization" in v.remedy


def test_nothing_read_skips_and_nothing_checkable_skips():
    assert kb(observation()).verdict == SKIP
    v = kb(observation(fabric=FabricFacts(devices=[RdmaDevice("m", 0, fw_ver="28.45.4028")])))
    assert v.verdict == SKIP and "no known-bad entry could be checked" in v.summary


# ---------------------------------------------------------------- the matrix itself


def test_every_entry_is_sourced_and_valid():
    for e in matrix():
        assert e["sources"] and all(s.startswith("https://") for s in e["sources"])


@pytest.mark.parametrize("edit, words", [
    ({"sources": []}, "sources"), ({"sources": ["see forum"]}, "sources"), ({"action": "PRAY"}, "action"),
    ({"component": "bios"}, "component"), ({"signature": "vibes"}, "signature"), ({"verdict": "PASS"}, "verdict"),
    ({"summary": ""}, "summary missing"), ({"max_below": "7"}, "max (or max_below)"),
])
def test_validation_refuses_a_bad_entry(edit, words):
    e = {**copy.deepcopy(ENTRIES["kernel-6.17.0-1008-boot-panic"]), **edit}
    with pytest.raises(MatrixError, match=words.split()[0]):
        validate([e], {"UPDATE_VERSIONS", "REBOOT"})
    with pytest.raises(MatrixError, match="twice"):
        validate([ENTRIES["kernel-6.17.0-1008-boot-panic"]] * 2, {"UPDATE_VERSIONS"})


# ---------------------------------------------------------------- the platform probe and a replay


def test_dgx_release_keeps_the_version_keys_only():
    text = 'DGX_NAME="DGX Spark"\nDGX_SWBUILD_VERSION="7.2.3"\nDGX_SERIAL_NUMBER="1234"\nDGX_OTA_VERSION="7.5.0"\n'
    assert parse_dgx_release(text) == {"DGX_NAME": "DGX Spark", "DGX_SWBUILD_VERSION": "7.2.3",
                                       "DGX_OTA_VERSION": "7.5.0"}


def test_a_snapshot_of_the_1008_kernel_warns_through_the_probes(tmp_path):
    snap = derive(fabric_case("02-"), tmp_path / "s", {
        "proc/sys/kernel/osrelease": "6.17.0-1008-nvidia\n",
        "platform.json": json.dumps({"dgx_release": {"DGX_SWBUILD_VERSION": "7.2.3", "DGX_OTA_VERSION": "7.4.0"},
                                     "board": "NVIDIA DGX Spark"})})
    rep, obs = diagnose(Inputs(snapshot=str(snap), playbook=Playbook(name="expert")))
    assert (obs.platform.dgx_os, obs.platform.dgx_os_source) == ("7.4.0", "DGX_OTA_VERSION")
    v = next(g for g in rep["gates"] if g["id"] == "host.known-bad")
    assert v["verdict"] == WARN and "kernel-6.17.0-1008-boot-panic" in v["summary"]


@pytest.mark.parametrize("case", [c for c in case_dirs("fabric") + case_dirs("gpu") if "healthy" in c.name])
def test_healthy_captures_never_warn_or_fail(case):
    rep, _ = diagnose(Inputs(snapshot=str(case)))
    v = next(g for g in rep["gates"] if g["id"] == "host.known-bad")
    assert v["verdict"] in (PASS, SKIP), v
