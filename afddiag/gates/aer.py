"""Host gate ``host.pcie-aer``: the PCIe AER counters of the NIC functions and GPUs
(:mod:`afddiag.model.aer`). A fatal uncorrectable error on a link FAILs (evidence for inspecting and
reseating the card, not for a reboot by itself), a non-fatal one WARNs; correctable errors are counted
since boot and named, not judged on one reading. Pure: facts in, verdicts out."""

from __future__ import annotations

from afddiag.catalog import remedy
from afddiag.gates import Context, declared, gate, probed
from afddiag.model.aer import AER_KINDS, AerFacts, nonzero, total
from afddiag.termsafe import one_line
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

MAX_NAMED = 8  # functions named in a summary, then a count


def _named(items: list[str]) -> str:
    more = len(items) - MAX_NAMED
    return "; ".join(items[:MAX_NAMED]) + (f"; and {more} more" if more > 0 else "")


def _line(d: dict, kind: str) -> str:
    return f"{one_line(d['bdf'])} ({d['kind']}) {kind} {total(d[kind], kind)}: " + \
        (", ".join(one_line(x) for x in nonzero(d[kind])[:6]) or "no name counted")


@gate("host.pcie-aer")
def pcie_aer(ctx: Context, gate_id: str) -> Verdict:
    p = probed(gate_id, ctx.obs.aer, "PCIe AER counters", remedy("snapshot.host"))
    if isinstance(p, Verdict):
        return p
    facts: AerFacts = p
    readable = [d for d in facts.devices if any(d[k] is not None for k in AER_KINDS)]
    found = {"boot_id": facts.boot_id, "devices": [
        {"bdf": d["bdf"], "kind": d["kind"]} | {k: total(d[k], k) for k in AER_KINDS} for d in readable]}
    if not readable:
        what = (f"{len(facts.devices)} NIC/GPU function(s) without aer_dev_* attributes (a kernel without AER "
                "statistics, or no AER capability)" if facts.devices else "no Mellanox or NVIDIA GPU PCI function")
        return Verdict(gate_id, SKIP, f"no AER counters readable: {what}", "nothing to do", found)
    fatal = [_line(d, "fatal") for d in readable if (total(d["fatal"], "fatal") or 0) > 0]
    if fatal:
        return Verdict(gate_id, FAIL, f"fatal uncorrectable PCIe errors since boot: {_named(fatal)}", remedy(gate_id),
                       found, action="HW_INSPECTION")
    nonfatal = [_line(d, "nonfatal") for d in readable if (total(d["nonfatal"], "nonfatal") or 0) > 0]
    if nonfatal:
        return Verdict(gate_id, WARN, f"non-fatal uncorrectable PCIe errors since boot: {_named(nonfatal)}",
                       remedy(gate_id + ".nonfatal"), found, action="HW_INSPECTION")
    cor = [_line(d, "correctable") for d in readable if (total(d["correctable"], "correctable") or 0) > 0]
    names = ", ".join(f"{one_line(d['bdf'])} ({d['kind']})" for d in readable[:MAX_NAMED])
    more = f" and {len(readable) - MAX_NAMED} more" if len(readable) > MAX_NAMED else ""
    return Verdict(gate_id, PASS, f"no uncorrectable PCIe error since boot on {names}{more}"
                   + (f"; correctable since boot (not judged on one reading): {_named(cor)}" if cor else
                      "; no correctable error either"), "nothing to do", found)


GATES = declared(__name__)
