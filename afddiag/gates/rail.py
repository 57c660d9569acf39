"""Rail gates: what one fabric rail does between two hosts, the pair test's view.

``fabric.link-speed`` (the negotiated speed of the fabric IP's netdev), ``fabric.rail-bandwidth``
(the pair test's RDMA WRITE run against the role's Gb/s bands) and ``fabric.port-counters`` (the
port counters read around that run). The family is ``fabric``; the host's own fabric gates are in
:mod:`afddiag.gates.fabric`.
"""

from __future__ import annotations

import errno as _errno
import os
from typing import Any

from afddiag.catalog import commands, remedy
from afddiag.gates import Context, declared, gate, probe_failed
from afddiag.gates.fabric import carrier_entry, port_of
from afddiag.gates.nic import hotplug_note
from afddiag.model.pair import LINK_FLAPS as LINK_FLAP_NAMES
from afddiag.model.pair import BandwidthRun, counter_kind
from afddiag.shellcmd import command
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN, Verdict

#: A payload rate within this share of the one bytes and seconds give agrees with them (the client rounds
#: seconds and Gb/s to 6 decimals); a rate above the link's speed by more than it is impossible.
RATE_SLACK = 0.02


def bandwidth_problem(bw: BandwidthRun, link_speed_mbps: int | None = None) -> str | None:
    """None when a bandwidth run's figures can all be true; else one line naming the figure that
    cannot (a saved result edited or corrupted, a peer that reported garbage): negative bytes or
    Gb/s, bytes moved with no (or a non-positive) duration or no Gb/s figure, a Gb/s that does not follow
    from bytes and seconds (``bytes * 8 / seconds / 1e9``, within :data:`RATE_SLACK`), negative per-QP
    bytes, a payload rate above the link's negotiated speed
    (``link_speed_mbps``, Mb/s; unknown or <= 0: not compared). Pure."""
    if bw.bytes < 0:
        return f"bytes {bw.bytes} is negative"
    if bw.gbps is not None and bw.gbps < 0:
        return f"gbps {bw.gbps:g} is negative"
    if bw.seconds is not None and bw.seconds <= 0:
        return f"seconds {bw.seconds:g} is not a duration"
    if not bw.bytes:
        return None if not bw.gbps else f"{bw.gbps:g} Gb/s with no byte moved"
    if bw.seconds is None:
        return f"{bw.bytes} bytes moved but no duration (seconds missing or not a number)"
    if bw.gbps is None:
        return f"{bw.bytes} bytes moved in {bw.seconds:g} s but no Gb/s figure (missing or not a number)"
    rate = bw.bytes * 8 / bw.seconds / 1e9
    if abs(bw.gbps - rate) > max(0.001, RATE_SLACK * rate):
        return f"{bw.gbps:g} Gb/s does not follow from {bw.bytes} bytes in {bw.seconds:g} s ({rate:.6g} Gb/s)"
    if any(q.bytes < 0 for q in bw.per_qp):
        return f"a QP's bytes are negative ({', '.join(str(q.bytes) for q in bw.per_qp)})"
    if link_speed_mbps and link_speed_mbps > 0 and bw.gbps * 1000 > link_speed_mbps * (1 + RATE_SLACK):
        return (f"{bw.gbps:g} Gb/s of payload is faster than the link's negotiated {link_speed_mbps} Mb/s: "
                "no port moves more than its line rate")
    return None


def speed_unread(errno_: int | None, snapshot: bool, netdev: str | None) -> str:
    """Why a netdev's ``speed`` was not read, in words: in a snapshot an absent file is "not captured";
    live, the read's errno (EINVAL: the kernel refuses the read while the link is down). Pure."""
    if snapshot and errno_ in (None, _errno.ENOENT):
        return f"not read: not captured in this snapshot (no sys/class/net/{netdev}/speed)"
    if not errno_:
        return "not read"
    name = _errno.errorcode.get(errno_, str(errno_))
    if errno_ == _errno.EINVAL:
        return f"not read: the kernel refused the read ({name}), as it does while the link is down"
    return f"not read: reading sys/class/net/{netdev}/speed failed ({name}: {os.strerror(errno_)})"


def judge_link_speed(subject: str, speed_mbps: int | None, expect_mbps: int, role: str,
                     why: str = "not read") -> tuple[str, str]:
    """``(verdict, summary)`` for a RoCE netdev's negotiated speed (Mb/s, ``/sys/class/net/<if>/speed``)
    against the role's expectation (Mb/s; 0: none): FAIL below half of it, WARN below it, PASS at or
    above; SKIP when not read (``why``: :func:`speed_unread`) or SPEED_UNKNOWN (-1). Pure."""
    if speed_mbps is None:
        return SKIP, f"{subject}: negotiated speed {why}"
    if speed_mbps <= 0:
        return SKIP, f"{subject}: the netdev reports no speed (SPEED_UNKNOWN: a virtual NIC)"
    got = f"{speed_mbps / 1000:g} Gb/s"
    if not expect_mbps:
        return PASS, f"{subject}: negotiated {got} (role {role} sets no expected speed)"
    want = f"{expect_mbps / 1000:g} Gb/s"
    if speed_mbps * 2 <= expect_mbps:
        return FAIL, f"{subject}: negotiated {got}, role {role} expects {want}"
    if speed_mbps < expect_mbps:
        return WARN, f"{subject}: negotiated {got}, below the {want} role {role} expects"
    return PASS, f"{subject}: negotiated {got} (role {role} expects {want})"


@gate("fabric.link-speed")
def link_speed(ctx: Context, gate_id: str) -> Verdict:
    e = carrier_entry(ctx, gate_id)
    if isinstance(e, Verdict):
        return e
    _, port = port_of(ctx, e)
    fabric = ctx.obs.fabric  # read, or carrier_entry would have stopped the gate
    nd = fabric.netdevs.get(e.netdev or "") if fabric else None
    speed = nd.speed_mbps if nd else None
    expect = ctx.playbook.link_speed_mbps
    facts = {"netdev": e.netdev, "speed_mbps": speed, "expected_mbps": expect or None, "device": e.device,
             "port": e.port, "port_rate": port.rate if port else None}
    subject = f"{e.netdev} ({e.device} port {e.port}, fabric IP {ctx.fabric_ip.ip})"
    why = speed_unread(nd.speed_errno if nd else None, ctx.obs.source.startswith("snapshot"), e.netdev)
    verdict, summary = judge_link_speed(subject, speed, expect, ctx.playbook.name, why)
    rem = {PASS: "nothing to do",
           SKIP: "read it on the host (`ethtool <netdev>`; capture includes sys/class/net/<if>/speed)"}
    return Verdict(gate_id, verdict, summary, rem.get(verdict) or remedy(gate_id).format(netdev=e.netdev), facts,
                   commands=[] if verdict in rem else commands(gate_id, netdev=e.netdev))


def _bandwidth_run(ctx: Context, gate_id: str):
    """``(pair facts, bandwidth run)``, or the SKIP/ERROR verdict that stops a gate judging it."""
    p = ctx.obs.pair
    if (v := probe_failed(gate_id, p)) is not None:
        return v
    how = ("`afddiag fabric --pair <peer-fabric-ip> --bandwidth --fabric-ip <this rail's IP>` with `afddiag fabric "
           "--serve --fabric-ip <its IP> --peer <this rail's IP>` on the peer, one session per rail")
    if p is None:
        where = ("the snapshot holds no pair-test result" if ctx.obs.source.startswith("snapshot")
                 else "no bandwidth run in this command")
        return Verdict(gate_id, SKIP, f"{where}: the pair test's bandwidth mode measures a rail", f"run {how}")
    if (v := _local_stop(gate_id, p)) is not None:
        return v
    if p.bandwidth is None:
        return Verdict(gate_id, SKIP, "the pair test ran its short SEND/WRITE phases only (no --bandwidth)",
                       f"run {how}")
    return p, p.bandwidth


def _route_check(p) -> list[str]:
    """``ip route get <peer> from <fabric IP>`` for the pair test ``p`` when both are known, else []."""
    peer = (p.peer or "").rsplit(":", 1)[0]
    return [command("ip", "route", "get", peer, "from", p.fabric_ip)] if peer and p.fabric_ip else []


def _ethtool(p) -> list[str]:
    """``ethtool <netdev>`` (speed, link partner) for the pair test ``p``'s netdev when known, else []."""
    return [command("ethtool", p.netdev)] if p.netdev else []


def _rail(p) -> str:
    """The rail a pair test ran on, unknowns in words: "rail mlx5_0 port 1 (10.0.0.1 <-> 10.0.0.2)";
    "rail of 10.0.0.1 (no device carries it here) <-> 10.0.0.2" when the endpoint was never found."""
    peer = (p.peer or "no peer").rsplit(":", 1)[0]
    if p.device is None:
        return f"rail of {p.fabric_ip or 'no fabric IP'} (no RDMA device chosen here) <-> {peer}"
    port = p.port if p.port is not None else "not read"
    return f"rail {p.device} port {port} ({p.fabric_ip or 'no fabric IP'} <-> {peer})"


def _local_stop(gate_id: str, p) -> Verdict | None:
    """ERROR naming this host's cause when the pair test stopped here before contacting the peer
    (``local_error``): the remedy is this host's, never the peer's."""
    if not getattr(p, "local_error", None):
        return None
    if gate_id != "fabric.rail-bandwidth":  # one fault, named once: by the rail's bandwidth gate
        return Verdict(gate_id, SKIP, f"{_rail(p)}: not read: the pair test stopped on this host "
                       "(fabric.rail-bandwidth names why)", "see fabric.rail-bandwidth", {"local_error": p.local_error})
    return Verdict(gate_id, ERROR, f"{_rail(p)}: not measured: stopped on this host before contacting the peer: "
                   f"{p.local_error}", remedy("fabric.rail-bandwidth.local"),
                   {"local_error": p.local_error, "fabric_ip": p.fabric_ip, "peer": p.peer}, action="RERUN")


def grown(pc, kind: str) -> dict[str, int]:
    """``{name: growth}`` of one side's counters of ``kind`` ("error", "congestion", "unknown") that grew. Pure."""
    return {k: v for k, v in sorted(pc.counters().items()) if v > 0 and counter_kind(k) == kind}


def judge_rail_bandwidth(gbps: float, healthy: float, stale: tuple[float, ...], fail_below: float,
                         link_ok: bool | None, errors: bool) -> tuple[str, str]:
    """``(verdict, band)`` for one rail's Gb/s against the role's bands (Gb/s = 1e9 bits/s of payload):

    - ``healthy`` 0: PASS "no-band"; at or above ``healthy``: PASS "healthy";
    - inside ``stale`` = (low, high) inclusive: FAIL "stale-init" (the NIC's stale-initialization
      signature) only when ``link_ok`` is True (the link negotiated the role's speed) and no error
      counter grew (``errors`` False); with ``link_ok`` None (speed not read) FAIL "stale-unconfirmed";
      otherwise the link or the loss explains the figure and it is judged as below the band;
    - below ``fail_below``: FAIL "far-below"; else below ``healthy``: WARN "below".
    Pure."""
    if healthy <= 0:
        return PASS, "no-band"
    if gbps >= healthy:
        return PASS, "healthy"
    if len(stale) == 2 and stale[0] <= gbps <= stale[1] and not errors:
        if link_ok is True:
            return FAIL, "stale-init"
        if link_ok is None:
            return FAIL, "stale-unconfirmed"
    if gbps < fail_below:
        return FAIL, "far-below"
    return WARN, "below"


def _run_facts(p: Any, bw: BandwidthRun, pb: Any, errs: dict[str, dict[str, int]]) -> dict[str, Any]:
    """fabric.rail-bandwidth's facts: the rail, the run's figures, the role's bands (Gb/s) and the error
    counters that grew (by side)."""
    return {"role": p.role, "device": p.device, "port": p.port, "fabric_ip": p.fabric_ip, "peer": p.peer,
            "netdev": p.netdev, "link_speed_mbps": p.link_speed_mbps, "path_mtu": p.path_mtu,
            "gbps": bw.gbps, "seconds": bw.seconds, "seconds_asked": bw.seconds_asked, "bytes": bw.bytes,
            "size": bw.size, "qps": bw.qps, "depth": bw.depth, "verified": bw.verified, "stage": bw.stage,
            "error": bw.error or p.error, "per_qp_gbps": [q.gbps for q in bw.per_qp],
            "bands_gbps": {"healthy": pb.rail_healthy_gbps or None,
                           "stale_init": list(pb.rail_stale_init_gbps) or None,
                           "fail_below": pb.rail_fail_below_gbps or None, "role": pb.name},
            "error_counters_grew": {k: v for k, v in errs.items() if v}}


def _no_figures(gate_id: str, rail: str, p: Any, bw: BandwidthRun, error: str | None,
                facts: dict[str, Any]) -> Verdict:
    """A run that moved no byte or gave no Gb/s: ERROR when it never started (the handshake), FAIL when
    the client's figures never reached this server or no RDMA WRITE completed."""
    if bw.stage == "handshake":
        return Verdict(gate_id, ERROR, f"{rail}: not measured: {error or 'the bandwidth run did not start'}",
                       remedy(gate_id + ".not-run"), facts, action="RERUN")
    if p.role == "server":  # the client measures: its figures never came
        return Verdict(gate_id, FAIL, f"{rail}: the client's end of the run never arrived "
                       f"({error or 'no figures'}, stage {bw.stage})",
                       remedy(gate_id + ".stopped").format(netdev=p.netdev or "the fabric netdev"),
                       facts, action="CHECK_FABRIC")
    return Verdict(gate_id, FAIL,
                   f"{rail}: no RDMA WRITE completed ({error or 'no bytes moved'}, stage {bw.stage})",
                   remedy(gate_id + ".stopped").format(netdev=p.netdev or "the fabric netdev"), facts,
                   commands=_route_check(p),
                   action="CHECK_FABRIC")


@gate("fabric.rail-bandwidth")
def rail_bandwidth(ctx: Context, gate_id: str) -> Verdict:
    got = _bandwidth_run(ctx, gate_id)
    if isinstance(got, Verdict):
        return got
    p, bw = got
    pb = ctx.playbook
    rail = _rail(p)
    errs = {c.side: grown(c, "error") for c in bw.counters}
    facts = _run_facts(p, bw, pb, errs)
    error = bw.error or p.error
    if (bad := bandwidth_problem(bw, p.link_speed_mbps)) is not None:
        facts["inconsistent"] = bad
        if error and bw.stage != "handshake":  # the stop is the finding; the figure is not judged
            return Verdict(gate_id, FAIL, f"{rail}: the run stopped: {error} (its figures are not judged: {bad})",
                           remedy(gate_id + ".stopped").format(netdev=p.netdev or "the fabric netdev"), facts,
                           commands=_route_check(p),
                           action="CHECK_FABRIC")
        return Verdict(gate_id, ERROR, f"{rail}: not judged: the run's figures cannot all be true ({bad}); "
                       + ("they are the client's, as it reported them" if p.role == "server" else
                          "the result was edited or corrupted"),
                       remedy(gate_id + ".inconsistent"), facts, action="RERUN")
    if not bw.bytes or bw.gbps is None:
        return _no_figures(gate_id, rail, p, bw, error, facts)
    per = [q.gbps for q in bw.per_qp if q.gbps is not None]
    figure = (f"{bw.gbps:.2f} Gb/s over {bw.qps} QPs ({bw.size} B RDMA WRITEs, {bw.depth} deep, {bw.seconds:.1f} s"
              + (f"; per QP {min(per):.2f}-{max(per):.2f} Gb/s" if per else "") + ")")
    if error:
        return Verdict(gate_id, FAIL, f"{rail}: the run stopped at {figure}: {error}",
                       remedy(gate_id + ".stopped").format(netdev=p.netdev or "the fabric netdev"), facts,
                       commands=_route_check(p),
                       action="CHECK_FABRIC")
    if not bw.verified:
        return Verdict(gate_id, FAIL, f"{rail}: {figure}, but the peer's buffer does not hold what each QP wrote "
                       "(or the peer's check was not received)",
                       remedy(gate_id + ".stopped").format(netdev=p.netdev or "the fabric netdev"), facts,
                       commands=_route_check(p),
                       action="CHECK_FABRIC")
    want_mbps = pb.link_speed_mbps or int(pb.rail_healthy_gbps * 1000)
    speed = p.link_speed_mbps
    link_ok = None if speed is None or speed <= 0 else speed >= want_mbps
    any_err = any(errs.values())
    verdict, band = judge_rail_bandwidth(bw.gbps, pb.rail_healthy_gbps, pb.rail_stale_init_gbps,
                                         pb.rail_fail_below_gbps, link_ok, any_err)
    facts["band"] = band
    h, st = pb.rail_healthy_gbps, pb.rail_stale_init_gbps
    link = f"link {speed} Mb/s" if speed and speed > 0 else "link speed not read"
    because = []
    if any_err:
        because.append("error counters grew during the run (" + "; ".join(
            f"{side}: " + ", ".join(f"{k} +{v}" for k, v in e.items()) for side, e in errs.items() if e) + ")")
    if link_ok is False:
        because.append(f"the {link} is below the role's {want_mbps} Mb/s (fabric.link-speed)")
    why = ("; " + "; ".join(because)) if because else ""
    fmt = {"netdev": p.netdev or "the fabric netdev", "healthy": f"{h:g}"}
    if band == "no-band":
        return Verdict(gate_id, PASS, f"{rail}: {figure}; role {pb.name} sets no band ([fabric] rail_healthy_gbps)",
                       "nothing to do (set [fabric] rail_healthy_gbps in the role's playbook to judge it)", facts)
    if band == "healthy":
        return Verdict(gate_id, PASS, f"{rail}: {figure}, at or above role {pb.name}'s {h:g} Gb/s", "nothing to do",
                       facts)
    if band == "stale-init":
        return Verdict(gate_id, FAIL, f"{rail}: {figure}, in the {st[0]:g}-{st[1]:g} Gb/s stale-initialization band "
                       f"with the {link} and no error counter grown: the NIC's stale-initialization signature"
                       + hotplug_note(ctx),
                       remedy(gate_id + ".stale"), facts, action="REBOOT")
    if band == "stale-unconfirmed":
        return Verdict(gate_id, FAIL, f"{rail}: {figure}, in the {st[0]:g}-{st[1]:g} Gb/s stale-initialization band, "
                       "but the link speed was not read, so the signature is not confirmed",
                       remedy(gate_id + ".unconfirmed").format(**fmt), facts, action="CHECK_FABRIC",
                       commands=_ethtool(p))
    if band == "far-below":
        return Verdict(gate_id, FAIL, f"{rail}: {figure}, below role {pb.name}'s {pb.rail_fail_below_gbps:g} Gb/s{why}",
                       remedy(gate_id + ".far-below").format(**fmt), facts, action="CHECK_FABRIC",
                       commands=_ethtool(p))
    return Verdict(gate_id, WARN, f"{rail}: {figure}, below role {pb.name}'s {h:g} Gb/s"
                   + (f" (not the {st[0]:g}-{st[1]:g} Gb/s stale-initialization signature)" if len(st) == 2 else "")
                   + why, remedy(gate_id).format(**fmt), facts, action="CHECK_FABRIC", commands=_ethtool(p))


def _side(pc) -> str:
    return f"{pc.side} {pc.device or '?'} port {pc.port if pc.port is not None else '?'}"


@gate("fabric.port-counters")
def port_counters(ctx: Context, gate_id: str) -> Verdict:
    got = _bandwidth_run(ctx, gate_id)
    if isinstance(got, Verdict):
        return got
    p, bw = got
    read = [c for c in bw.counters if c.read]
    facts = {"seconds": bw.seconds, "stage": bw.stage, "sides": [
        {"side": c.side, "device": c.device, "port": c.port, "netdev": c.netdev, "read": c.read,
         "counters_read": sum(len(v) for v in c.delta.values()), "errors": grown(c, "error"),
         "congestion": grown(c, "congestion"), "unknown": grown(c, "unknown"), "notes": c.notes[:20]}
        for c in bw.counters]}
    if not read:
        notes = "; ".join(n for c in bw.counters for n in c.notes[:3])
        return Verdict(gate_id, SKIP, f"{_rail(p)}: port counters not read around the run"
                       + (f" ({notes})" if notes else f" (the run stopped at stage {bw.stage})"),
                       "read them on the host: `rdma statistic show link <dev>/<port>`, /sys/class/infiniband/<dev>/"
                       "ports/<port>/hw_counters/", facts)
    if bw.seconds and bw.seconds > 0:
        during = f"during the {bw.seconds:.1f} s run"
    else:
        during = f"around the run (stopped at stage {bw.stage})"
    errors = [(c, grown(c, "error")) for c in read]
    errors = [(c, e) for c, e in errors if e]
    cong = "; ".join(f"{_side(c)}: " + ", ".join(f"{k} +{v}" for k, v in g.items())
                     for c in read if (g := grown(c, "congestion")))
    unknown = "; ".join(f"{_side(c)}: " + ", ".join(f"{k} +{v}" for k, v in g.items())
                        for c in read if (g := grown(c, "unknown")))
    tail = ((f"; congestion signals (the fabric paced the traffic, not a port error): {cong}" if cong else "")
            + (f"; changed, not judged (names afddiag does not know): {unknown}" if unknown else "")
            + ("" if len(read) > 1 else "; the peer's counters were not received"))
    if errors:
        flap = any(k in LINK_FLAP_NAMES for _, e in errors for k in e)
        text = "; ".join(f"{_side(c)}: " + ", ".join(f"{k} +{v}" for k, v in e.items()) for c, e in errors)
        return Verdict(gate_id, WARN, f"{_rail(p)}: error counters grew {during}: {text}{tail}",
                       remedy(gate_id + ".flap" if flap else gate_id).format(netdev=p.netdev or "the fabric netdev"),
                       facts, action="FIX_LINK" if flap else "CHECK_FABRIC")
    sides = "; ".join(f"{_side(c)}: {sum(len(v) for v in c.delta.values())} counters" for c in read)
    return Verdict(gate_id, PASS, f"{_rail(p)}: no error counter grew {during} ({sides}){tail}", "nothing to do", facts)


GATES = declared(__name__)
