"""Engine evidence gate: what NCCL says it chose (the engine's log, ``--engine-log``) against the
fabric IP's device, port and GID index and the role's need for RDMA. A log without NCCL's net lines
is SKIP (they are printed only with ``NCCL_DEBUG=INFO``), never PASS. Pure: facts in, verdicts out."""

from __future__ import annotations

from typing import Any

from afddiag.catalog import remedy
from afddiag.endpoint import fabric_entry
from afddiag.gates import Context, declared, gate, probe_failed
from afddiag.model.engine import EngineFacts
from afddiag.shellcmd import export
from afddiag.termsafe import line
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

NO_NET_LINES = "no NCCL NET lines: run the engine with NCCL_DEBUG=INFO"


def _devs(f: EngineFacts) -> str:
    return ", ".join(f"{line(d['device'])}:{d['port']}/{line(d['link_layer'])}" for d in f.ib_devices[:8])


def _socket(f: EngineFacts) -> bool:
    """NCCL's network is sockets: its last ``Using network`` says so, or it listed only socket devices."""
    return (f.networks[-1] == "Socket") if f.networks else bool(f.socket_devices and not f.ib_devices)


def _fallback(ctx: Context, gate_id: str, f: EngineFacts, facts: dict[str, Any]) -> Verdict:
    ifs = ", ".join(f"{line(d['netdev'])} {line(d['ip'] or '')}".strip() for d in f.socket_devices[:8]) or "?"
    forced = {k: v for k, v in f.env.items() if (k, v) in (("NCCL_IB_DISABLE", "1"), ("NCCL_NET", "Socket"))}
    why = f" ({', '.join(f'{k}={line(v)} set by the environment' for k, v in forced.items())})" if forced else ""
    verdict = FAIL if ctx.requires("rdma") else WARN
    text = (f"NCCL fell back to sockets{why}: Using network Socket over {ifs}; no RDMA between the ranks"
            + (" (this role requires RDMA)" if verdict == FAIL else ""))
    rem = ("unset NCCL_IB_DISABLE / NCCL_NET=Socket in the launch env" if forced else
           "make the HCA visible to the engine: /dev/infiniband passed into its container, NCCL_IB_HCA naming a "
           "device of this host (afddiag devicemap), rdma-core's libibverbs in the image; then run it again "
           "with NCCL_DEBUG=INFO")
    return Verdict(gate_id, verdict, text, rem, facts, action="SET_ENV" if forced else "CHECK_FABRIC")


@gate("launch.engine-net")
def engine_net(ctx: Context, gate_id: str) -> Verdict:
    f = ctx.obs.engine
    if (v := probe_failed(gate_id, f)) is not None:
        return v
    if f is None or f.lines is None:
        why = "; ".join(f.notes) if f is not None and f.notes else "no engine log given (--engine-log FILE)"
        return Verdict(gate_id, SKIP, why, remedy(gate_id))
    facts: dict[str, Any] = {"source": f.source, "networks": f.networks, "ib_devices": f.ib_devices,
                             "socket_devices": f.socket_devices, "oob": f.oob, "env": f.env,
                             "connections": f.connections}
    if not f.has_net_lines:
        return Verdict(gate_id, SKIP, f"{line(f.source)}: {NO_NET_LINES} ({len(f.lines)} NCCL lines read)",
                       remedy(gate_id), facts)
    if _socket(f):
        return _fallback(ctx, gate_id, f, facts)
    fab, ip = ctx.obs.fabric, ctx.fabric_ip.ip
    want = fabric_entry(fab, ip) if fab is not None and getattr(fab, "captured", False) else None
    if not f.ib_devices:
        return Verdict(gate_id, SKIP, f"NCCL uses network {line(f.networks[-1])} but the log has no 'NET/IB : Using' "
                       "line: the HCA it chose is not known", remedy(gate_id), facts)
    chose = f"NCCL uses {_devs(f)}"
    if want is None:
        return Verdict(gate_id, SKIP, f"{chose}; no fabric IP device on this host to check it against "
                       f"({'fabric IP ' + ip if ip else 'no fabric IP'})", remedy(gate_id), facts)
    facts["expected"] = {"device": want.device, "port": want.port, "gid_index": want.gid_index, "ip": ip}
    where = f"the fabric IP {ip} is on {want.device} port {want.port} (GID index {want.gid_index})"
    if not any(d["device"] == want.device and d["port"] == want.port for d in f.ib_devices):
        return Verdict(gate_id, FAIL, f"{chose}, but {where}: the engine's traffic leaves on another HCA",
                       f"select the fabric IP's HCA for NCCL in the launch env (NCCL_IB_HCA={want.device}:{want.port}) "
                       "and restart the engine", facts, action="SET_ENV",
                       commands=[export("NCCL_IB_HCA", f"={want.device}:{want.port}")])
    used = sorted({c["gid_index"] for c in f.connections}) or (
        [int(f.env["NCCL_IB_GID_INDEX"])] if f.env.get("NCCL_IB_GID_INDEX", "").isdigit() else [])
    wrong = [g for g in used if g != want.gid_index]
    if wrong:
        return Verdict(gate_id, FAIL, f"{chose} with GID index {', '.join(map(str, used))}, but {where}",
                       f"set NCCL_IB_GID_INDEX={want.gid_index} in the launch env (or unset it: NCCL then picks the "
                       "RoCE v2 GID by address family) and restart the engine", facts, action="SET_ENV",
                       commands=[export("NCCL_IB_GID_INDEX", want.gid_index)])
    gid = f", GID index {used[0]}" if used else ""
    return Verdict(gate_id, PASS, f"{chose}{gid}: the fabric IP {ip}'s HCA and port", "nothing to do", facts)


GATES = declared(__name__)
