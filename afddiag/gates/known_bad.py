"""The known-bad matrix (``checks/known_bad.toml``) and ``host.known-bad``, which judges this host's
versions against it: kernel (the versions probe), DGX OS and board (the platform probe), HCA firmware
(the fabric probe), NVIDIA driver (the GPU probe), NCCL builds (the NCCL probe's libnccl copies). An
entry matches when every version it names is in its range and its signature, where it defines one, is
seen in the facts (the evidence of its own cause); a version in range whose signature was not read is
listed as not checked, never a verdict. Pure: facts in, verdicts out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from afddiag import packaged
from afddiag.catalog import load, remedy, tomllib
from afddiag.gates import Context, declared, gate
from afddiag.gates.fabric import cma_signature
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

COMPONENTS = ("kernel", "dgx_os", "firmware", "driver", "nccl", "board")
RANK = {PASS: 0, WARN: 1, FAIL: 2}
STALE_BAND_GBPS = (8.0, 25.0)  # the reports' ~13 Gb/s rails (dgx-spark-playbooks PR 108: 8-25 Gb/s)


class MatrixError(ValueError):
    """checks/known_bad.toml is not a valid matrix: the message names the entry and field."""


def version_key(text: str) -> tuple[int, ...]:
    """A version's numbers in order: ``"6.17.0-1008-nvidia"`` → ``(6, 17, 0, 1008)``. Pure."""
    return tuple(int(n) for n in re.findall(r"\d+", text)[:12])


def in_range(version: str, rng: dict[str, Any]) -> bool:
    """``version`` within ``rng`` (``min``, and ``max`` inclusive: a longer version under it counts,
    ``6.17.0-1008-nvidia-64k`` under ``6.17.0-1008``; or ``max_below`` exclusive). Pure."""
    v = version_key(version)
    if not v:
        return False
    if "min" in rng and v < version_key(rng["min"]):
        return False
    if "max" in rng and v[:len(version_key(rng["max"]))] > version_key(rng["max"]):
        return False
    return not ("max_below" in rng and v >= version_key(rng["max_below"]))


def _versions(ctx: Context) -> dict[str, list[str] | None]:
    """Each component's versions on this host (a list: several HCAs, several NCCL copies); None: not read."""
    obs = ctx.obs
    ver = obs.versions if isinstance(obs.versions, dict) else {}
    plat = obs.platform if obs.platform is not None and getattr(obs.platform, "captured", False) else None
    fab = obs.fabric if obs.fabric is not None and obs.fabric.captured else None
    fw = sorted({d.fw_ver for d in fab.devices if d.fw_ver}) if fab is not None else []
    nccl = _nccl_copies(ctx)
    return {"kernel": [ver["kernel"]] if ver.get("kernel") else None,
            "dgx_os": [plat.dgx_os] if plat is not None and plat.dgx_os else None,
            "firmware": fw or None,
            "driver": [obs.gpu.driver_version] if obs.gpu is not None and obs.gpu.driver_version else None,
            "nccl": sorted({str(n.get("version")) for n in nccl if n.get("version")}) or None if nccl else None,
            "board": [plat.board] if plat is not None and plat.board else None}


def _cma(ctx: Context, entry: dict[str, Any]) -> bool | None:
    m = ctx.obs.memreg
    if m is None or not getattr(m, "captured", True) or m.cma_total_kb is None or m.cma_free_kb is None:
        return None
    return cma_signature(m)


def _stale(ctx: Context, entry: dict[str, Any]) -> bool | None:
    bw = getattr(ctx.obs.pair, "bandwidth", None)
    if bw is None or bw.gbps is None or not bw.bytes:
        return None
    lo, hi = ctx.playbook.rail_stale_init_gbps or STALE_BAND_GBPS
    return lo <= bw.gbps <= hi


def _nccl_copies(ctx: Context) -> list[dict[str, Any]] | None:
    """The libnccl copies ``[{"version", "build_id", "path"}]``: the NCCL probe's (None: not searched),
    else what the platform facts carry."""
    f = ctx.obs.nccl
    if f is not None and getattr(f, "captured", False) and f.copies is not None:
        return [{"version": c.version, "build_id": c.build_id, "path": c.real_path} for c in f.copies]
    plat = ctx.obs.platform
    copies = getattr(plat, "nccl", None) if plat is not None and getattr(plat, "captured", False) else None
    return copies if isinstance(copies, list) else None


def _nccl_builds(ctx: Context, entry: dict[str, Any]) -> bool | None:
    copies = _nccl_copies(ctx)
    if not isinstance(copies, list):
        return None
    builds = {str(c.get("build_id")) for c in copies
              if c.get("build_id") and in_range(str(c.get("version") or ""), entry)}
    return len(builds) > 1


#: The signatures an entry may name: ``(ctx, entry) -> True (seen) | False (read, not seen) | None (not read)``.
SIGNATURES: dict[str, tuple[str, Callable[[Context, dict[str, Any]], bool | None]]] = {
    "cma_free_above_total": ("CmaFree above CmaTotal in /proc/meminfo without kho=off", _cma),
    "rail_stale_band": ("a pair-test bandwidth run in the stale-initialization band", _stale),
    "nccl_builds_differ": ("two different builds of the same NCCL version on the host", _nccl_builds),
}


def validate(entries: Any, actions: set[str]) -> list[dict[str, Any]]:
    """The matrix's entries, checked: every field present and of its kind, components and signatures
    known, ``action`` in the catalog's ``actions``, at least one https source, ids unique. Raises
    :class:`MatrixError`. Pure."""
    if not isinstance(entries, list) or not entries:
        raise MatrixError("checks/known_bad.toml: no [[entry]]")
    seen: set[str] = set()
    for i, e in enumerate(entries):
        where = f"checks/known_bad.toml entry {i + 1} ({e.get('id') if isinstance(e, dict) else '?'})"
        if not isinstance(e, dict):
            raise MatrixError(f"{where}: not a table")
        for key in ("id", "component", "verdict", "action", "summary", "remedy"):
            if not isinstance(e.get(key), str) or not e[key]:
                raise MatrixError(f"{where}: {key} missing")
        ranges = [e, *(e.get("also") or [])]
        for r in ranges:
            if r.get("component") not in COMPONENTS:
                raise MatrixError(f"{where}: component {r.get('component')!r} is not one of {', '.join(COMPONENTS)}")
            if not any(k in r for k in ("min", "max", "max_below")) or ("max" in r and "max_below" in r):
                raise MatrixError(f"{where}: give min and max (or max_below) for {r['component']}")
        if e["verdict"] not in (WARN, FAIL) or e["action"] not in actions:
            raise MatrixError(f"{where}: verdict must be WARN or FAIL, action one of checks/gates.toml [actions]")
        if e.get("signature") is not None and e["signature"] not in SIGNATURES:
            raise MatrixError(f"{where}: signature {e['signature']!r} is not one of {', '.join(SIGNATURES)}")
        srcs = e.get("sources")
        if not isinstance(srcs, list) or not srcs or not all(isinstance(s, str) and s.startswith("https://")
                                                             for s in srcs):
            raise MatrixError(f"{where}: sources must list the public reports (https URLs)")
        if e["id"] in seen:
            raise MatrixError(f"{where}: id given twice")
        seen.add(e["id"])
    return entries


@lru_cache(maxsize=1)
def matrix() -> tuple[dict[str, Any], ...]:
    """checks/known_bad.toml's entries, validated (:func:`validate`)."""
    data = tomllib.loads(packaged.read_text("checks", "known_bad.toml"))
    return tuple(validate(data.get("entry"), set(load()["actions"])))


def judge_entry(ctx: Context, entry: dict[str, Any], versions: dict[str, list[str] | None]) \
        -> tuple[str, str]:
    """``("match" | "clear" | "unchecked", words)`` for one entry on this host. Pure."""
    got = []
    for r in [entry, *(entry.get("also") or [])]:
        have = versions.get(r["component"])
        if have is None:
            return "unchecked", f"{r['component']} not read"
        hit = [v for v in have if in_range(v, r)]
        if not hit:
            return "clear", f"{r['component']} {', '.join(have)} outside the range"
        got.append(f"{r['component']} {hit[0]}")
    sig = entry.get("signature")
    if sig is None:
        return "match", ", ".join(got)
    what, seen = SIGNATURES[sig][0], SIGNATURES[sig][1](ctx, entry)
    if seen is None:
        return "unchecked", f"{', '.join(got)} in range; its signature not read: {what}"
    return ("match", f"{', '.join(got)} with {what}") if seen else ("clear", f"{', '.join(got)} in range, no {what}")


@gate("host.known-bad")
def known_bad(ctx: Context, gate_id: str) -> Verdict:
    versions = _versions(ctx)
    read = {k: v for k, v in versions.items() if v}
    results = [(e, *judge_entry(ctx, e, versions)) for e in matrix()]
    facts = {"versions": read, "entries": [{"id": e["id"], "result": res, "why": why, "sources": e["sources"]}
                                           for e, res, why in results]}
    if not read:
        return Verdict(gate_id, SKIP, "no version read (kernel, DGX OS, HCA firmware, driver, NCCL, board)",
                       remedy(gate_id), facts)
    unchecked = [f"{e['id']} ({why})" for e, res, why in results if res == "unchecked"]
    tail = f"; not checked: {'; '.join(unchecked)}" if unchecked else ""
    hits = sorted(((e, why) for e, res, why in results if res == "match"), key=lambda h: -RANK[h[0]["verdict"]])
    if not hits and len(unchecked) == len(results):
        return Verdict(gate_id, SKIP, f"no known-bad entry could be checked: {'; '.join(unchecked)}", remedy(gate_id),
                       facts)
    if not hits:
        seen = ", ".join(f"{k} {'/'.join(v)}" for k, v in read.items())
        return Verdict(gate_id, PASS, f"{len(results)} known-bad entries checked against {seen}: none matches{tail}",
                       "nothing to do", facts)
    worst = hits[0][0]
    summary = "; ".join(f"{why}: {e['summary']} ({e['id']})" for e, why in hits)
    text = " Then: ".join(dict.fromkeys(e["remedy"] for e, _ in hits))
    return Verdict(gate_id, worst["verdict"], f"known-bad: {summary}{tail}", text, facts, action=worst["action"])


GATES = declared(__name__)
