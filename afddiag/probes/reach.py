"""Control-plane reach: a bounded TCP connect from the fabric IP to each peer's engine ports.

Each attempt binds the socket to the fabric IP (so it leaves over the fabric, as the engines' control
connections do), connects with a time bound, and records the outcome: connected, refused (the peer
answered: nothing listens there yet), or timed out / unreachable (a firewall drops it, or no route).
Nothing is sent; every socket is closed. Never raises. The readings are plain JSON.

Bounded: only the named peers (literal IPv4 addresses, no name lookup) and at most
:data:`MAX_ATTEMPTS` peer × port pairs (:func:`bounds_problem`: the CLI refuses more as a usage
error, and :func:`read_reach` tries none of a larger set), all within one time bound.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import time
from typing import Any

from afddiag.model.host import ReachFacts, reach_facts
from afddiag.playbook import MAX_ATTEMPTS  # peers × engine ports one run connects to (e.g. 16 ranks × 16 ports)
from afddiag.probes.registry import Artifact, Probe, Run, read_source


def parse_ports(raw: str) -> list[int]:
    """``AFD_ENGINE_PORTS`` ("29500,29501" or space-separated) → the TCP ports 1..65535 in it, in
    order, each once (other tokens are left out: the launch env's own check names them)."""
    out: list[int] = []
    for tok in re.split(r"[,\s]+", raw.strip()):
        if re.fullmatch(r"[0-9]{1,5}", tok) and 0 < int(tok) < 65536 and int(tok) not in out:
            out.append(int(tok))
    return out


def bounds_problem(peers: list[str], ports: list[int]) -> str | None:
    """Why the control-plane probe must not run on ``peers`` × ``ports``, or None: more than
    :data:`MAX_ATTEMPTS` pairs (a port range in AFD_ENGINE_PORTS would make it a port scanner), or a
    peer that is not a literal IPv4 address. One line naming the limit and the fix."""
    bad = [p for p in peers if not _literal_ipv4(p)]
    if bad:
        return f"peer {bad[0][:64]!r} is not an IPv4 address: the control-plane probe connects only to named peers"
    n = len(dict.fromkeys(peers)) * len(dict.fromkeys(ports))
    if n > MAX_ATTEMPTS:
        return (f"{len(dict.fromkeys(peers))} peer(s) × {len(dict.fromkeys(ports))} engine port(s) = {n} TCP "
                f"connects, over the control-plane probe's limit of {MAX_ATTEMPTS}: name only the engines' ports "
                "(AFD_ENGINE_PORTS, the playbook's engine_ports) and the peers this host talks to")
    return None


def _literal_ipv4(peer: str) -> bool:
    try:
        ipaddress.IPv4Address(peer)
    except ValueError:
        return False
    return True


def connect_once(peer: str, port: int, source: str | None, timeout_s: float) -> dict[str, Any]:
    """One TCP connect to ``peer:port`` from ``source`` (an IPv4 address to bind; None: any) within
    ``timeout_s`` seconds: ``{"peer", "port", "source", "ok", "outcome": "connected"|"refused"|
    "timeout"|"unreachable"|"bind failed"|"error", "errno", "error", "elapsed_ms"}``
    (``nc -z -s <source> -w <timeout> <peer> <port>``)."""
    out: dict[str, Any] = {"peer": peer, "port": port, "source": source, "ok": False, "outcome": "error",
                           "errno": None, "error": None}
    t0 = time.monotonic()
    s = None
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        if source:
            try:
                s.bind((source, 0))
            except OSError as e:
                out.update(outcome="bind failed", errno=e.errno, error=f"bind {source}: {e.strerror or e}")
                return out
        s.connect((peer, port))
        out.update(ok=True, outcome="connected")
    except TimeoutError:
        out.update(outcome="timeout", error=f"no answer within {timeout_s:g} s")
    except OSError as e:
        kind = {errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "unreachable", errno.ENETUNREACH: "unreachable",
                errno.ETIMEDOUT: "timeout"}.get(e.errno or 0, "error")
        out.update(outcome=kind, errno=e.errno, error=e.strerror or str(e))
    finally:
        if s is not None:
            s.close()
        out["elapsed_ms"] = round((time.monotonic() - t0) * 1000, 1)
    return out


def read_reach(peers: list[str], ports: list[int], source: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
    """Every (peer, port) once, each bounded by a share of ``timeout_s`` (at most 2 s, at least
    0.2 s); attempts past the whole bound are recorded as not tried; a set over :data:`MAX_ATTEMPTS`
    pairs or with a peer that is no IPv4 address is not tried at all (a note says why). Returns ``{"source", "peers",
    "ports", "attempts": [connect_once(...)], "not_tried": [{"peer", "port"}] (past the bound), "notes"}``.
    Never raises."""
    peers, ports = list(dict.fromkeys(peers)), list(dict.fromkeys(ports))
    out: dict[str, Any] = {"source": source, "peers": peers[:MAX_ATTEMPTS], "ports": ports[:MAX_ATTEMPTS],
                           "attempts": [], "not_tried": [], "notes": []}
    refused = bounds_problem(peers, ports)
    if refused:
        out["notes"].append(f"not tried: {refused}")
        return out
    pairs = [(p, port) for p in peers for port in ports]
    each = max(0.2, min(2.0, timeout_s / max(1, len(pairs))))
    deadline = time.monotonic() + timeout_s
    for peer, port in pairs:
        if time.monotonic() + each > deadline:
            out["notes"].append(f"{peer}:{port} not tried: the {timeout_s:g} s bound was used up")
            out["not_tried"].append({"peer": peer, "port": port})
            continue
        out["attempts"].append(connect_once(peer, port, source, each))
    return out


# ---------------------------------------------------------------------------------------------
# the probe


def engine_ports(run: Run) -> list[int]:
    """The peers' engine ports: the launch env's AFD_ENGINE_PORTS, else the playbook's engine_ports."""
    raw = run.launch_value("AFD_ENGINE_PORTS")
    if raw:
        return parse_ports(raw)
    pb = run.inputs.playbook
    return list(pb.engine_ports) if pb is not None else []


def _wanted(run: Run) -> bool:
    return not run.live or bool(run.inputs.peers and engine_ports(run))


def _read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "TCP connects to the peers' engine ports"
    src = run.fabric_ip()
    return {"reach.json": read_source(run.src.reach, lambda: read_reach(list(run.inputs.peers), engine_ports(run), src,
                                                                         run.inputs.timeout("limits_s")))}


PROBE = Probe("reach", "control-plane probe (TCP connects to the peers' engine ports)",
              lambda run: run.inputs.timeout("limits_s") + 1.0, (Artifact("reach.json"),), _read,
              lambda run, r, progress: {"reach": reach_facts(r.get("reach.json"))},
              lambda why: {"reach": ReachFacts(captured=False, failed=why, notes=[why])}, _wanted)
