"""QP probe: walk a real RC queue pair RESET→INIT→RTR→RTS on every RDMA device (pyverbs).

Why: an inference engine's transfer layer opens one device (the first enumerated one, or the one its
device map names), picks a source GID and moves an RC QP to RTR toward the peer's GID. RTR is where
the kernel resolves the destination (ARP/ND for RoCE): a source GID that cannot reach the peer fails
there, with an errno that names the problem. This probe does exactly that walk, one transition at a
time (``QP.to_rts()`` would silently run the earlier steps and hide which one failed; rdma-core's own
``tests/base.py`` style), and records every step.

Sources:
- ``ibv_modify_qp(3)``, ``ibv_create_qp(3)``, ``ibv_query_port(3)`` (rdma-core man pages).
- pyverbs (``python3-pyverbs``; rdma-core ``pyverbs/qp.pyx``, ``addr.pyx``, ``device.pyx``).
- Errno meanings for RoCE address resolution: Linux ``drivers/infiniband/core/addr.c``
  (``rdma_resolve_ip``/``ib_resolve_eth_dmac``: ETIMEDOUT when the neighbour never answers,
  ENETUNREACH when there is no route, EINVAL when the source GID's netdev/address cannot reach the
  destination) and ``cache.c`` (``rdma_get_gid_attr`` → ENODATA for an empty slot).

Command-line equivalent (roughly): ``ibv_rc_pingpong -d <dev> -i <port> -g <sgid_index> <peer>``
without the data exchange.

Everything is bounded and never raises: failures become facts (``QpResult.errno``/``error``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from afddiag.endpoint import choose_sgid
from afddiag.model.fabric import FabricFacts, QpFacts, QpResult, QpStep, errno_words, gid_for_ipv4
from afddiag.probes.registry import LIVE, Probe, Run
from afddiag.progress import steps

NO_PYVERBS_WHY = (
    "pyverbs is not installed: apt install python3-pyverbs (it must match the host's rdma-core) "
    "and create the venv with --system-site-packages"
)

# RTR/RTS attributes (ibv_modify_qp(3)); the values most RC users (perftest, NCCL, engines) pass.
RTR_RQ_PSN = 0
RTR_MAX_DEST_RD_ATOMIC = 1
RTR_MIN_RNR_TIMER = 12  # 0.64 ms (IBTA encoding)
AH_HOP_LIMIT = 64
RTS_TIMEOUT = 14  # 4.096 us * 2^14 ≈ 67 ms local ACK timeout
RTS_RETRY_CNT = 7
RTS_RNR_RETRY = 7  # 7 = infinite
RTS_SQ_PSN = 0
RTS_MAX_RD_ATOMIC = 1


def decode_errno(err: int | None) -> str | None:
    """Words for an errno (sign ignored: call sites differ), or None for None
    (:func:`afddiag.model.fabric.errno_words`)."""
    return None if err is None else errno_words(err)


def mtu_enum_to_bytes(mtu: int | None) -> int | None:
    """``enum ibv_mtu`` (1=256 … 5=4096) to bytes; None when out of range."""
    if isinstance(mtu, int) and 1 <= mtu <= 5:
        return 256 << (mtu - 1)
    return None


def destination_gid(target: str, own_sgid: str | None) -> str | None:
    """The destination GID for ``target``: a peer IPv4's mapped GID, or ``own_sgid`` for
    ``"loopback"``. None when ``target`` is not an IPv4 address (or loopback has no sgid)."""
    if target == "loopback":
        return own_sgid
    try:
        return gid_for_ipv4(target)
    except ValueError:
        return None


def _import_pyverbs() -> dict[str, Any] | None:
    """The pyverbs modules the walk needs, or None when pyverbs cannot be imported."""
    try:
        import pyverbs.addr as addr
        import pyverbs.cq as cq
        import pyverbs.device as device
        import pyverbs.enums as enums
        import pyverbs.pd as pd
        import pyverbs.qp as qp
    except Exception:  # ImportError, or a pyverbs built for another Python/rdma-core
        return None
    return {"addr": addr, "cq": cq, "device": device, "enums": enums, "pd": pd, "qp": qp}


def _err_code(exc: BaseException) -> int | None:
    """The errno carried by a pyverbs exception (``error_code``) or an OSError, as a positive int."""
    code = getattr(exc, "error_code", None)
    if not isinstance(code, int) or code == -1:
        code = getattr(exc, "errno", None)
    if isinstance(code, int) and code not in (0, -1):
        return abs(code)
    return None


def _modify(qp: Any, res: QpResult, to: str, attr: Any, mask: int) -> bool:
    """One ``ibv_modify_qp`` of ``qp`` to state ``to``, recorded as a :class:`QpStep` of ``res`` (its
    errno and time in ms; ``res.reached`` on success, ``res.errno``/``res.error`` on failure)."""
    s0 = time.monotonic()
    st = QpStep(to=to, ok=False)
    res.steps.append(st)
    try:
        qp.modify(attr, mask)
        st.ok = True
        res.reached = to
    except Exception as exc:  # noqa: BLE001
        st.errno = _err_code(exc)
        st.message = str(exc)
        res.errno = st.errno
        meaning = decode_errno(st.errno) if st.errno is not None else str(exc)
        res.error = f"{to}: errno {st.errno}, {meaning}" if st.errno else f"{to}: {exc}"
    st.elapsed_ms = round((time.monotonic() - s0) * 1000.0, 3)
    return st.ok


def _init_attr(pv: dict[str, Any], port: int) -> tuple[Any, int]:
    """RESET→INIT: the QP attributes (P_Key index 0, ``port``, local write/remote read/write access) and mask."""
    e = pv["enums"]
    a = pv["qp"].QPAttr()
    a.qp_state = e.IBV_QPS_INIT
    a.pkey_index = 0
    a.port_num = port
    a.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE
    return a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS


def _rtr_attr(pv: dict[str, Any], qp: Any, port: int, mtu_enum: Any, dgid: str, sgid_index: int) -> tuple[Any, int]:
    """INIT→RTR: the QP attributes (a global route to ``dgid`` from the GID at ``sgid_index``, the
    port's active MTU, the QP's own number as the destination) and mask. Address resolution happens here."""
    e = pv["enums"]
    gr = pv["addr"].GlobalRoute(dgid=pv["addr"].GID(dgid), sgid_index=sgid_index, hop_limit=AH_HOP_LIMIT)
    a = pv["qp"].QPAttr()
    a.qp_state = e.IBV_QPS_RTR
    a.path_mtu = mtu_enum
    a.dest_qp_num = qp.qp_num
    a.rq_psn = RTR_RQ_PSN
    a.max_dest_rd_atomic = RTR_MAX_DEST_RD_ATOMIC
    a.min_rnr_timer = RTR_MIN_RNR_TIMER
    a.ah_attr = pv["addr"].AHAttr(gr=gr, is_global=1, port_num=port)
    return a, (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
               | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)


def _rts_attr(pv: dict[str, Any]) -> tuple[Any, int]:
    """RTR→RTS: the QP attributes (timeout, retry counts, send PSN, outstanding reads) and mask."""
    e = pv["enums"]
    a = pv["qp"].QPAttr()
    a.qp_state = e.IBV_QPS_RTS
    a.timeout = RTS_TIMEOUT
    a.retry_cnt = RTS_RETRY_CNT
    a.rnr_retry = RTS_RNR_RETRY
    a.sq_psn = RTS_SQ_PSN
    a.max_rd_atomic = RTS_MAX_RD_ATOMIC
    return a, (e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN
               | e.IBV_QP_MAX_QP_RD_ATOMIC)


def _open_rc_qp(pv: dict[str, Any], device: str, port: int, created: list[Any]) -> tuple[Any, Any]:
    """Open ``device`` and create a PD, a CQ and an RC QP on it, each appended to ``created`` as it is
    made (the caller closes them, reversed); ``(qp, the port's attributes)``. Raises what pyverbs raises."""
    e = pv["enums"]
    ctx = pv["device"].Context(name=device)
    created.append(ctx)
    pd = pv["pd"].PD(ctx)
    created.append(pd)
    cq = pv["cq"].CQ(ctx, 4)
    created.append(cq)
    cap = pv["qp"].QPCap(max_send_wr=1, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    qp = pv["qp"].QP(pd, pv["qp"].QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    created.append(qp)
    return qp, ctx.query_port(port)


def _walk(pv: dict[str, Any], res: QpResult, port: int, sgid_index: int | None) -> None:
    """Open ``res.device``, create PD/CQ/RC QP, and step it RESET→INIT→RTR→RTS, filling ``res``.

    Runs in the probe's worker thread. Every object created is closed in reverse order in
    ``finally``; ``res.destroyed`` says whether that succeeded.
    """
    created: list[Any] = []  # in creation order; closed reversed
    t0 = time.monotonic()
    res.destroyed = False
    try:
        try:
            qp, port_attr = _open_rc_qp(pv, res.device, port, created)
        except Exception as exc:  # noqa: BLE001 - every failure is a fact
            res.errno = _err_code(exc)
            res.error = f"open {res.device} port {port} / create PD, CQ, QP failed: {exc}"
            return
        mtu_enum = port_attr.active_mtu
        res.path_mtu = mtu_enum_to_bytes(mtu_enum)
        if not _modify(qp, res, "INIT", *_init_attr(pv, port)):
            return
        if sgid_index is None or res.dgid is None:
            res.error = (
                f"RTR not attempted: no source GID ({res.sgid_choice})"
                if sgid_index is None
                else f"RTR not attempted: no destination GID for {res.target!r}"
            )
            return
        if not _modify(qp, res, "RTR", *_rtr_attr(pv, qp, port, mtu_enum, res.dgid, sgid_index)):
            return
        _modify(qp, res, "RTS", *_rts_attr(pv))
    except Exception as exc:  # noqa: BLE001 - never raise out of the worker
        res.error = res.error or f"unexpected error: {exc!r}"
    finally:
        ok = True
        for obj in reversed(created):
            try:
                obj.close()
            except Exception as exc:  # noqa: BLE001
                ok = False
                res.error = res.error or f"destroy failed: {exc}"
        res.destroyed = ok
        res.elapsed_ms = round((time.monotonic() - t0) * 1000.0, 3)


#: The whole QP walk takes at most this many walks' time (``qp_s`` each), however many devices
#: and peers there are (:func:`total_bound`); walks past it are recorded as not tried.
QP_WALKS_IN_BOUND = 8


def total_bound(timeout_s: float) -> float:
    """Seconds the whole QP walk may take when one walk may take ``timeout_s``."""
    return timeout_s * QP_WALKS_IN_BOUND


def probe_qp(
    fabric: FabricFacts,
    fabric_ip: str | None,
    peers: list[str],
    timeout_s: float = 5.0,
    total_s: float | None = None,
) -> QpFacts:
    """Walk an RC QP RESET→INIT→RTR→RTS on every device of ``fabric`` (enumeration order).

    - ``fabric``: the fabric probe's facts (devices, ports, GIDs); port and source GID come from
      them (:func:`choose_sgid`), not from a second read of sysfs.
    - ``fabric_ip``: the address the launcher uses (dotted IPv4) or None.
    - ``peers``: peer fabric IPv4 addresses; one :class:`QpResult` per (device, peer), destination
      GID ``::ffff:<peer>``. Empty: one loopback walk per device toward its own source GID
      (``target="loopback"``; a weaker test: a QP aimed at its own GID reaches RTR even from the
      wrong port).
    - ``timeout_s``: seconds each walk may take. The walk runs in a daemon thread; past the bound
      the result says ``"timed out after Ns"`` with the steps seen so far. pyverbs holds the GIL
      inside ``ibv_modify_qp``, so the bound is noticed only once the kernel call returns (the
      kernel's own address resolution is itself bounded, ~1–2 s for RoCE).
    - ``total_s``: seconds the whole walk may take (default :func:`total_bound`); each walk gets the
      smaller of ``timeout_s`` and what is left, and a walk that cannot start in time is recorded
      ``"timed out: not tried ..."`` (its gate says ERROR, not judged), so peers × devices never
      stretch the run.

    Returns ``QpFacts(ran=False, why=...)`` when pyverbs cannot be imported. Never raises.
    """
    try:
        pv = _import_pyverbs()
        if pv is None:
            return QpFacts(ran=False, why=NO_PYVERBS_WHY)
        facts = QpFacts(ran=True)
        if not fabric.devices:
            facts.notes.append("no RDMA devices in the fabric facts: nothing to walk")
            return facts
        targets: list[str] = list(peers) if peers else ["loopback"]
        with steps("QP walk", len(fabric.devices) * len(targets)) as bar:
            deadline = time.monotonic() + (total_bound(timeout_s) if total_s is None else total_s)
            _walk_all(pv, fabric, fabric_ip, targets, timeout_s, facts, bar, deadline)
        return facts
    except Exception as exc:  # noqa: BLE001 - never raise
        return QpFacts(ran=False, why=f"QP probe failed unexpectedly: {exc!r}")


def _walk_all(pv: Any, fabric: FabricFacts, fabric_ip: str | None, targets: list[str], timeout_s: float,
              facts: QpFacts, bar: Any, deadline: float = float("inf")) -> None:
    """One bounded walk per (device, target), in enumeration order, all before ``deadline``
    (``time.monotonic()``); ``bar`` shows which is running."""
    skipped = 0
    for dev in fabric.devices:
        choice = choose_sgid(dev, fabric_ip)
        for target in targets:
            bar.step(f"{dev.name} → {target}")
            res = QpResult(
                device=dev.name,
                port=choice.port,
                sgid_index=choice.sgid_index,
                sgid=choice.sgid,
                sgid_choice=choice.choice,
                target=target,
                dgid=destination_gid(target, choice.sgid),
            )
            facts.results.append(res)
            left = deadline - time.monotonic()
            if left < min(timeout_s, 0.1):
                res.error = "timed out: not tried, the QP walk's time bound was used up by the walks before it"
                skipped += 1
                continue
            each = min(timeout_s, left)
            t = threading.Thread(
                target=_walk,
                args=(pv, res, choice.port, choice.sgid_index),
                name=f"afddiag-qp-{dev.name}-{target}",
                daemon=True,
            )
            t0 = time.monotonic()
            t.start()
            t.join(each)
            if t.is_alive():
                res.elapsed_ms = round((time.monotonic() - t0) * 1000.0, 3)
                res.error = f"timed out after {each:g}s" + (
                    f" (last: {res.error})" if res.error else ""
                )
                res.destroyed = False
                facts.notes.append(
                    f"{dev.name} → {target}: walk still running after {each:g}s; "
                    "its QP is released when this process exits"
                )
    if skipped:
        facts.notes.append(f"{skipped} QP walk(s) not tried: the whole walk's time bound was used up "
                           f"({QP_WALKS_IN_BOUND} walks of {timeout_s:g} s; give fewer peers or a smaller "
                           "--qp-timeout)")


# ---------------------------------------------------------------------------------------------
# the probe (live only: a snapshot holds no QP walk)


def _bound(run: Run) -> float:
    """The runner's bound on the walk: its own deadline (:func:`total_bound`), whatever the peer count."""
    return total_bound(run.inputs.timeout("qp_s")) + 2


def _not_run(why: str, failed: bool = False) -> dict[str, Any]:
    """``{"qp": QpFacts}`` of a QP walk that did not run (``failed``: it timed out or crashed)."""
    return {"qp": QpFacts(ran=False, why=why, failed=why if failed else None)}


def _read(run: Run, progress: Any) -> dict[str, Any]:
    fab = run.obs.fabric
    if not run.inputs.run_qp:
        return {"qp": QpFacts(ran=False, why="QP test not requested (--no-qp)")}
    if fab is None or fab.failed:
        return {"qp": QpFacts(ran=False, why="fabric probe failed: no devices to walk",
                              failed=f"not run: {fab.failed}" if fab else "not run")}
    if not fab.devices:
        return {"qp": QpFacts(ran=False, why="no RDMA device to open")}
    if run.src.qp is None:
        return {"qp": QpFacts(ran=False, why="QP walk not run: this run reads no live verbs source")}
    progress.doing = "walking QPs RESET→INIT→RTR→RTS"
    walk = probe_qp if run.src.qp is LIVE else run.src.qp
    return {"qp": walk(fab, run.fabric_ip(), list(run.inputs.peers), run.inputs.timeout("qp_s"))}


PROBE = Probe("qp", "QP probe", _bound, (), _read, lambda run, r, progress: {"qp": r["qp"]},
              lambda why: _not_run(why, failed=True), live_only=True,
              replay=lambda run: _not_run("not captured: a snapshot holds no live QP test"))
