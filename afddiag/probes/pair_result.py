"""The pair test's result as a probe: the JSON ``afddiag fabric --pair HOST --bandwidth --json``
prints (the bandwidth run and the port counters around it), handed in live by the pair command
(:attr:`afddiag.probes.registry.Sources.pair`) or read from a snapshot's ``pair.json``. The test
itself is :mod:`afddiag.probes.pair`."""

from __future__ import annotations

from typing import Any

from afddiag.model.pair import PairFacts, _json_kind, pair_facts
from afddiag.probes.registry import Artifact, Probe, Run

PAIR_ARTIFACT = "pair.json"  # the JSON `afddiag fabric --pair HOST --bandwidth --json` prints


def _wanted(run: Run) -> bool:
    # a replay reads a saved result; a live run only the one the pair command hands in (a capture has none)
    return not run.live or (run.host is not None and run.host.pair is not None and not run.capturing)


def _read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "taking the pair test's result"
    return {PAIR_ARTIFACT: run.src.pair()}


def _failed(why: str) -> dict[str, Any]:
    return {"pair": PairFacts(role="unknown", failed=why, notes=[why])}


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get(PAIR_ARTIFACT)
    if raw is not None and not isinstance(raw, dict):
        return _failed(f"{PAIR_ARTIFACT}: a JSON {_json_kind(raw)}, not the pair test's object: save the output of "
                       "`afddiag fabric --pair HOST --bandwidth --json` unedited")
    return {"pair": pair_facts(raw)}


PROBE = Probe("pair", "pair-test result (bandwidth run, port counters)", "fabric_s", (Artifact(PAIR_ARTIFACT),),
              _read, _facts, _failed, _wanted)
