"""NCCL audit gate: which libnccl the engine loads, whether another build of the same version is
reachable on this host, and whether an NCCL configuration file sets variables the launch env does not.
Pure: facts in, verdicts out (:mod:`afddiag.probes.nccl` reads them)."""

from __future__ import annotations

from typing import Any

from afddiag.catalog import remedy
from afddiag.gates import Context, declared, gate, not_probed
from afddiag.model.nccl import NcclCopy, NcclFacts
from afddiag.termsafe import line as safe
from afddiag.verdict import PASS, SKIP, WARN, Verdict

MAX_NAMED = 4  # copies or conf lines named in a summary, then a count


def describe(c: NcclCopy) -> str:
    """``/usr/lib/.../libnccl.so.2.28.9 (system; NCCL 2.28.9, build 1a2b3c4d…)``, host text escaped."""
    ver = f"NCCL {safe(c.version)}" if c.version else "version not read"
    bid = f"build {c.build_id[:12]}" if c.build_id else "no build id"
    return f"{safe(c.real_path)} ({c.origin}; {ver}, {bid})"


def builds_differ(copies: list[NcclCopy]) -> dict[str, list[NcclCopy]]:
    """``{version: copies}`` of each version with two or more different build ids among ``copies``. Pure."""
    by_version: dict[str, dict[str, NcclCopy]] = {}
    for c in copies:
        if c.version and c.build_id:
            by_version.setdefault(c.version, {}).setdefault(c.build_id, c)
    return {v: list(b.values()) for v, b in by_version.items() if len(b) > 1}


def conf_overrides(f: NcclFacts) -> list[tuple[str, dict[str, Any]]]:
    """``(file, line)`` of each configuration-file ``NCCL_*`` line whose variable the launch env does not
    set: NCCL applies those to the engine (NCCL reads the files at init for variables not in its
    environment). Pure."""
    env = f.env or {}
    return [(cf.path, ln) for cf in f.conf_files for ln in cf.lines if ln["key"] not in env]


def _named(items: list[str]) -> str:
    more = f" and {len(items) - MAX_NAMED} more" if len(items) > MAX_NAMED else ""
    return "; ".join(items[:MAX_NAMED]) + more


@gate("launch.nccl")
def nccl(ctx: Context, gate_id: str) -> Verdict:
    f = ctx.obs.nccl
    if (v := not_probed(gate_id, f, "NCCL", remedy(gate_id))) is not None:
        return v
    assert isinstance(f, NcclFacts)
    copies = f.copies or []
    over = conf_overrides(f)
    facts: dict[str, Any] = {
        "loaded": f.loaded.real_path if f.loaded else None,
        "copies": [{"path": c.real_path, "origin": c.origin, "version": c.version, "build_id": c.build_id}
                   for c in copies],
        "conf_lines": [{"file": p, **ln} for p, ln in over], "launch_env_given": f.env is not None}
    differ = builds_differ(copies)
    if differ:
        parts = [f"NCCL {safe(v)} in {len(cs)} builds: {_named([describe(c) for c in cs])}" for v, cs in differ.items()]
        load = f"; the engine loads {describe(f.loaded)}" if f.loaded else ""
        return Verdict(gate_id, WARN, f"{'; '.join(parts)}{load}: ranks loading different builds of one version "
                       "are reported hanging in collectives (known-bad nccl-2.28.9-two-builds)",
                       "make every rank load the same libnccl build: name one copy in LD_PRELOAD or first in "
                       "LD_LIBRARY_PATH of the launch env on every host, or remove the other copy (the wheel or "
                       "the system package)", facts, action="SET_ENV")
    if over:
        lines = [f"{safe(p)}:{ln['line']} {safe(ln['key'])}={safe(ln['value'][:60])}" for p, ln in over]
        whose = "the launch env does not set" if f.env is not None else "no launch env was given to compare"
        return Verdict(gate_id, WARN, f"NCCL configuration file sets {len(over)} variable(s) {whose}: "
                       f"{_named(lines)}; NCCL applies them to every engine on this host",
                       "remove those lines from the file (a leftover /etc/nccl.conf froze an engine's warm-up), "
                       "or set the variables in the launch env so the launcher decides them", facts,
                       action="SET_ENV")
    if not copies:
        return Verdict(gate_id, SKIP, f"no libnccl found in {len(f.searched)} places searched (LD_PRELOAD, "
                       "LD_LIBRARY_PATH, Python wheels, system library directories): an engine in a container "
                       "brings its own; capture inside it", remedy(gate_id), facts)
    loaded = f.loaded
    assert loaded is not None
    others = f" ({len(copies) - 1} other copies, no second build of one version)" if len(copies) > 1 else ""
    conf = f"; {', '.join(safe(c.path) for c in f.conf_files)} set nothing the launch env does not" \
        if f.conf_files else ""
    return Verdict(gate_id, PASS, f"the engine loads {describe(loaded)}{others}{conf}", "nothing to do", facts)


GATES = declared(__name__)
