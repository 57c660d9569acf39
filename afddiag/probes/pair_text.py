"""The pair test's facts as plain text (:func:`format_pair`), peer fields escaped. Split out of
:mod:`afddiag.probes.pair`, which re-exports it."""

from __future__ import annotations

from typing import Any

from afddiag.model.pair import PairFacts
from afddiag.termsafe import line


def format_pair(f: PairFacts) -> str:
    """Plain text: one line per phase (size, latency µs, bandwidth GB/s, verified); for a bandwidth
    run its Gb/s, per QP, and the counters that changed on each side. A test that stopped on this host
    before it opened a device says why in one sentence, and that nothing was sent."""
    def w(v: Any, unknown: str = "not read") -> str:
        return unknown if v is None else str(v)

    if f.local_error and f.device is None:  # nothing opened here: the cause alone, in one sentence
        before = (f"contacting the peer {f.peer}" if f.peer else
                  f"serving the client {f.expected_peer}" if f.expected_peer else "contacting any peer")
        done = "all objects destroyed" if f.destroyed else "NOT all objects destroyed"
        return (line(f"afddiag pair ({f.role}): stopped on this host before {before}: {f.local_error}")
                + f"\nnothing sent; {done} in {f.elapsed_s:.2f} s")
    head = (f"afddiag pair ({f.role}): {w(f.device, 'no device')} port {w(f.port)} GID {w(f.gid_index)} "
            f"({w(f.fabric_ip, 'no fabric IP')}) ↔ {w(f.peer, 'no peer')}, "
            f"QP {w(f.qp_num, 'none')} ↔ {w(f.peer_qp_num, 'none')}, path MTU {w(f.path_mtu)}")
    if f.local_error:
        head += f": stopped on this host before contacting the peer: {f.local_error}"
    lines = [head]
    if f.role == "server" and (f.expected_peer or f.refused_total):
        lines.append(f"  accepts {w(f.expected_peer, 'no peer named')} only"
                     f"{' (pair key proved)' if f.pair_key else ''}; refused {f.refused_total} other connection(s)"
                     + (f", the first {len(f.refused)} below" if f.refused_total > len(f.refused) else ""))
        for rc in f.refused:
            lines.append(f"    refused {rc.address}:{rc.port} at {rc.at} (+{rc.after_s:g} s): {rc.reason}")
    elif f.pair_key:
        lines.append("  pair key proved both ways")
    for p in f.phases:
        lines.append(f"  {p.op:<5} {p.size:>6} B  rtt median {p.rtt_us_median} µs (min {p.rtt_us_min})  "
                     f"bw {p.bw_gbps} GB/s  {'verified' if p.verified else 'NOT verified'}"
                     + (f"  error: {p.error}" if p.error else ""))
    bw = f.bandwidth
    if bw is not None:
        lines.append(f"  bandwidth: {bw.gbps if bw.gbps is not None else '-'} Gb/s (1e9 bits/s of payload) in "
                     f"{bw.seconds if bw.seconds is not None else '-'} s of {bw.seconds_asked:g} s asked, "
                     f"{bw.qps} QPs x {bw.depth} deep RDMA WRITEs of {bw.size} B, {bw.bytes} B moved, "
                     f"{'verified' if bw.verified else 'NOT verified'} (stage {bw.stage})")
        for q in bw.per_qp:
            lines.append(f"    QP {q.qp_num} -> {q.peer_qp_num}: {q.gbps if q.gbps is not None else '-'} Gb/s, "
                         f"{q.writes} WRITEs")
        for c in bw.counters:
            grew = {k: v for k, v in c.counters().items() if v}
            lines.append(f"    counters ({c.side} {c.device} port {c.port}, {c.netdev}): "
                         + (", ".join(f"{k} +{v}" for k, v in sorted(grew.items())) if grew else
                            ("none changed" if c.read else "not read"))
                         + (f"; notes: {'; '.join(c.notes[:3])}" if c.notes else ""))
    lines.append(f"{'ERROR: ' + f.error if f.error else 'OK'} in {f.elapsed_s:.2f} s; "
                 f"{'all objects destroyed' if f.destroyed else 'NOT all objects destroyed'}")

    return "\n".join(line(ln) for ln in lines)  # peer fields and errors: escaped, one line each
