"""host.pcie-aer and its probe on fake sysfs trees as the kernel's AER driver writes them
(Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats): the probe finds the Mellanox functions
and NVIDIA GPUs, reads their aer_dev_* attributes and the boot id, a capture replays to the same facts;
the gate FAILs on a fatal count, WARNs on a non-fatal one, PASSes naming the correctable counts, SKIPs
when nothing is readable; hostile text from a capture is bounded and escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from afddiag.capture import collect_bundle
from afddiag.model.aer import AerFacts, parse_aer, total
from afddiag.model.run import Inputs, Observation
from afddiag.probes import aer as aerprobe
from afddiag.probes.registry import Run, Sources
from afddiag.runner import diagnose
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN
from conftest import case_dirs
from fakes import judge, observation

COR = ["RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF"]
UNCOR = ["Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
         "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
         "PoisonTLPBlocked"]
BOOT = "5d1e7a0c-3f51-4b8e-9a43-2f0c1b7d9e61"


def attr(names: list[str], total_name: str, **counts: int) -> str:
    """An aer_dev_* attribute's text: every name with its count (0 unless given), then the total."""
    lines = [f"{n} {counts.get(n, 0)}" for n in names]
    return "\n".join(lines + [f"{total_name} {sum(counts.values())}"]) + "\n"


def tree(root: Path, functions: dict[str, tuple[str, str]], aer: dict[str, dict[str, str]] | None = None,
         boot: str | None = BOOT) -> Path:
    """``functions``: bdf → (vendor, class); ``aer``: bdf → {kind: text} (default: all three, zero)."""
    pci = root / "sys/bus/pci/devices"
    pci.mkdir(parents=True)
    for bdf, (vendor, cls) in functions.items():
        d = pci / bdf
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        texts = (aer or {}).get(bdf, {"correctable": attr(COR, "TOTAL_ERR_COR"),
                                      "nonfatal": attr(UNCOR, "TOTAL_ERR_NONFATAL"),
                                      "fatal": attr(UNCOR, "TOTAL_ERR_FATAL")})
        for kind, text in texts.items():
            (d / f"aer_dev_{kind}").write_text(text)
    if boot is not None:
        (root / "proc/sys/kernel/random").mkdir(parents=True)
        (root / "proc/sys/kernel/random/boot_id").write_text(boot + "\n")
    return root


SPARK = {"0000:01:00.0": ("0x15b3", "0x020000"), "0002:01:00.1": ("0x15b3", "0x020000"),
         "000f:01:00.0": ("0x10de", "0x030200"), "000f:01:00.1": ("0x10de", "0x040300"),  # GPU, its audio
         "0000:00:00.0": ("0x10de", "0x060400")}  # an NVIDIA root port: not a GPU


def read_facts(root: Path) -> AerFacts:
    run = Run(Inputs(), Observation("h", "live"), host=Sources(root=str(root)))

    class Progress:
        doing = ""

    return aerprobe.PROBE.facts(run, aerprobe.PROBE.read(run, Progress()), Progress())["aer"]


def gate(f: AerFacts):
    return judge("host.pcie-aer", observation(aer=f))


def dev(bdf="0000:01:00.0", kind="nic", cor=0, nonfatal=0, fatal=0, **names):
    return {"bdf": bdf, "kind": kind, "correctable": {"RxErr": cor, "TOTAL_ERR_COR": cor},
            "nonfatal": {"DLP": nonfatal, "TOTAL_ERR_NONFATAL": nonfatal},
            "fatal": {"SDES": fatal, "TOTAL_ERR_FATAL": fatal}} | names


# ---------------------------------------------------------------- the probe


def test_probe_reads_nic_functions_and_gpus_only_and_the_boot_id(tmp_path):
    root = tree(tmp_path, SPARK, aer={"0002:01:00.1": {"correctable": attr(COR, "TOTAL_ERR_COR", BadTLP=3, RxErr=2),
                                                       "fatal": attr(UNCOR, "TOTAL_ERR_FATAL", DLP=1)}})
    before = {p: p.read_text() for p in root.rglob("*") if p.is_file()}
    f = read_facts(root)
    assert f.captured and f.boot_id == BOOT
    assert [(d["bdf"], d["kind"]) for d in f.devices] == [("0000:01:00.0", "nic"), ("0002:01:00.1", "nic"),
                                                         ("000f:01:00.0", "gpu")]
    one = f.devices[1]
    assert (total(one["correctable"], "correctable"), one["nonfatal"], total(one["fatal"], "fatal")) == (5, None, 1)
    assert one["correctable"]["BadTLP"] == 3 and one["fatal"]["DLP"] == 1
    assert {p: p.read_text() for p in root.rglob("*") if p.is_file()} == before  # read only


def test_parse_takes_name_count_lines_and_sums_without_a_total():
    assert parse_aer("RxErr 2\nBadTLP 1\n") == {"RxErr": 2, "BadTLP": 1}
    assert total(parse_aer("RxErr 2\nBadTLP 1\n"), "correctable") == 3
    assert parse_aer("garbage\n\x1b[31mRxErr 1\n" + "Name 99999999999999999999999\n") is None
    assert parse_aer("") is None and parse_aer(None) is None


def test_capture_then_replay_gives_the_same_facts(tmp_path):
    nonfatal = {"nonfatal": attr(UNCOR, "TOTAL_ERR_NONFATAL", CmpltTO=2)}
    root = tree(tmp_path / "host", SPARK, aer={"0000:01:00.0": nonfatal})
    files, _host, _notes = collect_bundle(Sources(root=str(root)))
    assert "aer.json" in files
    snap = tmp_path / "snap"
    for rel, data in files.items():
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(data)
    rep, obs = diagnose(Inputs(snapshot=str(snap), families=frozenset({"host"})))
    live = read_facts(root)
    assert (obs.aer.boot_id, obs.aer.devices) == (live.boot_id, live.devices)
    v = next(g for g in rep["gates"] if g["id"] == "host.pcie-aer")
    assert v["verdict"] == WARN and "0000:01:00.0 (nic) nonfatal 2: CmpltTO 2" in v["summary"]


def test_hostile_capture_is_bounded_and_escaped(tmp_path):
    snap = tmp_path / "snap"
    snap.mkdir()
    devices = [{"bdf": "\x1b[2J\u202eevil" * 40, "kind": "nic", "fatal": "SDES 1\nTOTAL_ERR_FATAL 1\n"}] + \
        [{"bdf": f"0000:{i:02x}:00.0", "kind": "gpu", "correctable": "RxErr 1\n"} for i in range(400)] + \
        [{"bdf": "x", "kind": "other"}, "junk"]
    (snap / "aer.json").write_text(json.dumps({"boot_id": 7, "devices": devices, "notes": ["n" * 5000]}))
    rep, obs = diagnose(Inputs(snapshot=str(snap), families=frozenset({"host"})))
    assert len(obs.aer.devices) == aerprobe.MAX_DEVICES and obs.aer.boot_id is None
    assert len(obs.aer.devices[0]["bdf"]) == 64 and len(obs.aer.notes[0]) == 300
    v = next(g for g in rep["gates"] if g["id"] == "host.pcie-aer")
    assert v["verdict"] == FAIL and "\x1b" not in v["summary"] and "\u202e" not in v["summary"]


# ---------------------------------------------------------------- the gate


def test_fatal_edge_fails_with_hw_inspection_and_no_reboot():
    v = gate(AerFacts(boot_id=BOOT, devices=[dev(fatal=0), dev("000f:01:00.0", "gpu", fatal=1)]))
    assert (v.verdict, v.action) == (FAIL, "HW_INSPECTION")
    assert "000f:01:00.0 (gpu) fatal 1: SDES 1" in v.summary and "0000:01:00.0" not in v.summary
    assert "reseat" in v.remedy and "no reason to reboot" in v.remedy
    assert gate(AerFacts(devices=[dev(fatal=0)])).verdict == PASS


def test_nonfatal_edge_warns():
    v = gate(AerFacts(devices=[dev(nonfatal=1)]))
    assert (v.verdict, v.action) == (WARN, "HW_INSPECTION")  # a WARN never drains
    assert "0000:01:00.0 (nic) nonfatal 1: DLP 1" in v.summary
    assert "drain" not in v.remedy and "reboot" not in v.remedy
    assert gate(AerFacts(devices=[dev(nonfatal=0)])).verdict == PASS


def test_correctable_counts_are_named_not_judged():
    v = gate(AerFacts(devices=[dev(cor=12), dev("000f:01:00.0", "gpu")]))
    assert (v.verdict, v.action) == (PASS, "NONE")
    assert "0000:01:00.0 (nic) correctable 12: RxErr 12" in v.summary and "000f:01:00.0 (gpu)" in v.summary
    assert "no correctable error" in gate(AerFacts(devices=[dev()])).summary


@pytest.mark.parametrize("facts, words", [
    (AerFacts(devices=[{"bdf": "0000:01:00.0", "kind": "nic", "correctable": None, "nonfatal": None, "fatal": None}]),
     "without aer_dev_* attributes"),
    (AerFacts(devices=[]), "no Mellanox or NVIDIA GPU PCI function"),
    (AerFacts(captured=False, notes=["AER counters not captured (no aer.json in the snapshot)"]), "not captured"),
])
def test_nothing_readable_skips(facts, words):
    v = gate(facts)
    assert v.verdict == SKIP and words in v.summary


def test_a_failed_probe_is_error():
    assert gate(AerFacts(captured=False, failed="timed out reading sysfs")).verdict == ERROR


def test_a_kernel_without_aer_attributes_skips(tmp_path):
    assert gate(read_facts(tree(tmp_path, SPARK, aer={b: {} for b in SPARK}, boot=None))).verdict == SKIP


@pytest.mark.parametrize("case", case_dirs("fabric") + case_dirs("gpu"))
def test_cases_never_warn_or_fail_unless_they_carry_aer_readings(case):
    rep, _ = diagnose(Inputs(snapshot=str(case), families=frozenset({"host"})))
    v = next(g for g in rep["gates"] if g["id"] == "host.pcie-aer")
    assert v["verdict"] in (PASS, SKIP) or (case / "aer.json").exists(), v
