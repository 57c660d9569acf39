"""Fuzzing the server side of the pair protocol (``afddiag fabric --serve``), CI-sized: hypothesis writes
protocol-shaped sessions (a hello, then control messages whose fields take any JSON value, with or
without the pair key) and raw bytes; the target (``tests/fuzz/pairfuzz.py``, also run by
``tests/fuzz/run_fuzz.py --targets pair_server``) checks the server's promise on each: it ends by its
deadline, names every bad field, frees and caps what a session holds, records every refusal, and
answers in JSON lines only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import fuzzlib  # noqa: E402
import pairfuzz  # noqa: E402

SESSIONS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from([0, 1, 64, 4096, 65536, 1 << 20, 1 << 24, (1 << 24) - 1, 255, 256, 2**63]))
anyjson = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=3),
                                                    st.dictionaries(st.text(max_size=6), c, max_size=3)), max_leaves=8)
small = st.one_of(st.integers(0, 70), scalars)

hello = st.fixed_dictionaries({k: st.one_of(st.just(v), anyjson) for k, v in pairfuzz.HELLO.items()})
peers = st.one_of(st.lists(st.fixed_dictionaries({"qpn": small, "psn": small}), max_size=4), anyjson)
message = st.one_of(
    st.fixed_dictionaries({"op": st.sampled_from(["send_pingpong", "send_stream"]),
                           "size": st.one_of(st.sampled_from([1, 64, 65536, 65537]), scalars), "n": small}),
    st.fixed_dictionaries({"op": st.sampled_from(["write", "check_write"]), "size": small, "seed": small}),
    st.fixed_dictionaries({"op": st.just("bandwidth"),
                           "seconds": st.one_of(st.sampled_from([0.5, 1, 600, 601]), scalars),
                           "size": st.one_of(st.sampled_from([4096, 1 << 20, 64 << 20]), scalars),
                           "qps": small, "depth": small, "peers": peers}),
    st.fixed_dictionaries({"op": st.just("bw_done"), "seconds": scalars, "bytes": scalars, "gbps": scalars,
                           "error": scalars, "seeds": st.one_of(st.lists(small, max_size=4), anyjson),
                           "per_qp": anyjson, "counters": anyjson}),
    st.fixed_dictionaries({"op": st.one_of(st.just("bye"), anyjson)}),
    st.fixed_dictionaries({"op": st.just("auth"), "mac": scalars}),
    anyjson,
    st.sampled_from(['{"op": "by', "NaN\n", "\n", "[" * 50 + "\n", "\x1b]52;c;x\x07\n"]),
)


@SESSIONS
@given(st.booleans(), hello, st.lists(message, max_size=6), st.booleans())
def test_the_server_keeps_its_promise_on_any_session(keyed, first, rest, prove) -> None:
    items = (["KEY", {**first, "nonce": "5a" * 32}, "$PROOF" if prove else "$BADPROOF"] if keyed else [first]) + rest
    why = fuzzlib.run_one("pair_server", json.dumps(items).encode())
    assert why is None, f"{why}\ninput: {json.dumps(items)[:600]}"


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.binary(max_size=400))
def test_the_server_keeps_its_promise_on_raw_bytes(data) -> None:
    why = fuzzlib.run_one("pair_server", data)
    assert why is None, f"{why}\ninput: {data[:300]!r}"
