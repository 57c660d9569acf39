"""The pair test's verbs objects through pyverbs (:class:`_Rdma`: context, PD, CQ, MR, RC QPs and their
RESET→INIT→RTR→RTS steps) and completion polling (:func:`idle_wait`). Split out of
:mod:`afddiag.probes.pair`, which re-exports these names."""

from __future__ import annotations

import os
import random
import time
from typing import Any

from afddiag.probes.pair_wire import PairError
from afddiag.probes.qp import (
    AH_HOP_LIMIT,
    RTR_MAX_DEST_RD_ATOMIC,
    RTR_MIN_RNR_TIMER,
    RTS_MAX_RD_ATOMIC,
    RTS_RETRY_CNT,
    RTS_RNR_RETRY,
    RTS_TIMEOUT,
    _err_code,
    decode_errno,
)

QUEUE_DEPTH = 32
# Waiting for completions: spin this long (a latency phase's next completion comes within it), then
# sleep, growing to POLL_SLEEP_MAX_S: a peer that never sends costs about nothing.
POLL_SPIN_S = 0.002
POLL_SLEEP_MAX_S = 0.01


class _Rdma:
    """Device context, PD, CQ, MR and one RC QP; :meth:`close` destroys them in reverse order."""

    def __init__(self, pv: dict[str, Any], device: str, port: int, gid_index: int, buf_bytes: int) -> None:
        import pyverbs.mr as mrmod
        import pyverbs.wr as wrmod

        self.pv, self.e, self.wr = pv, pv["enums"], wrmod
        self.port, self.gid_index = port, gid_index
        self.created: list[Any] = []
        e = self.e
        self.ctx = self._keep(pv["device"].Context(name=device))
        self.pd = self._keep(pv["pd"].PD(self.ctx))
        self.cq = self._keep(pv["cq"].CQ(self.ctx, 2 * QUEUE_DEPTH + 4))
        self.mr = self._keep(mrmod.MR(self.pd, buf_bytes, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                                      | e.IBV_ACCESS_REMOTE_READ))
        cap = pv["qp"].QPCap(max_send_wr=QUEUE_DEPTH, max_recv_wr=QUEUE_DEPTH, max_send_sge=1, max_recv_sge=1)
        self.qp = self._keep(pv["qp"].QP(self.pd, pv["qp"].QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq,
                                                                         rcq=self.cq, cap=cap)))
        self.mtu_enum = self.ctx.query_port(port).active_mtu
        self.psn = random.randrange(1 << 24)

    def _keep(self, obj: Any) -> Any:
        self.created.append(obj)
        return obj

    def connect(self, peer: dict[str, Any], qp: Any = None, psn: int | None = None) -> int:
        """RESET→INIT→RTR→RTS of ``qp`` (default: the handshake QP, with its PSN ``self.psn``) toward
        ``peer`` (its qpn, gid, psn, mtu enum); returns the path MTU enum."""
        e, qpm, addr = self.e, self.pv["qp"], self.pv["addr"]
        qp = qp if qp is not None else self.qp
        psn = self.psn if psn is None else psn
        a = qpm.QPAttr()
        a.qp_state, a.pkey_index, a.port_num = e.IBV_QPS_INIT, 0, self.port
        a.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self._step(qp, "INIT", a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
        mtu = min(self.mtu_enum, int(peer["mtu"]))
        gr = addr.GlobalRoute(dgid=addr.GID(peer["gid"]), sgid_index=self.gid_index, hop_limit=AH_HOP_LIMIT)
        a = qpm.QPAttr()
        a.qp_state, a.path_mtu, a.dest_qp_num, a.rq_psn = e.IBV_QPS_RTR, mtu, int(peer["qpn"]), int(peer["psn"])
        a.max_dest_rd_atomic, a.min_rnr_timer = RTR_MAX_DEST_RD_ATOMIC, RTR_MIN_RNR_TIMER
        a.ah_attr = addr.AHAttr(gr=gr, is_global=1, port_num=self.port)
        self._step(qp, "RTR", a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
                   | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        a = qpm.QPAttr()
        a.qp_state, a.timeout, a.retry_cnt, a.rnr_retry = e.IBV_QPS_RTS, RTS_TIMEOUT, RTS_RETRY_CNT, RTS_RNR_RETRY
        a.sq_psn, a.max_rd_atomic = psn, RTS_MAX_RD_ATOMIC
        self._step(qp, "RTS", a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY
                   | e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
        return mtu

    def _step(self, qp: Any, to: str, attr: Any, mask: int) -> None:
        try:
            qp.modify(attr, mask)
        except Exception as exc:  # noqa: BLE001

            err = _err_code(exc)
            why = f"QP →{to} failed: errno {err} ({decode_errno(err)})" if err else f"QP →{to}: {exc}"
            raise PairError(why) from exc

    def post_recv(self, offset: int, size: int, wr_id: int = 0) -> None:
        sge = self.wr.SGE(self.mr.buf + offset, size, self.mr.lkey)
        self.qp.post_recv(self.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[sge]))

    def post_send(self, offset: int, size: int, wr_id: int = 0, rdma: tuple[int, int] | None = None,
                  qp: Any = None, mr: Any = None) -> None:
        """One signalled SEND (or RDMA WRITE to ``rdma`` = (rkey, remote address)) of ``size`` bytes at
        ``offset`` of ``mr`` (default: the handshake MR) on ``qp`` (default: the handshake QP)."""
        e = self.e
        mr = mr if mr is not None else self.mr
        sge = self.wr.SGE(mr.buf + offset, size, mr.lkey)
        wr = self.wr.SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE if rdma else e.IBV_WR_SEND, num_sge=1,
                            sg=[sge], send_flags=e.IBV_SEND_SIGNALED)
        if rdma:
            wr.set_wr_rdma(rdma[0], rdma[1])
        (qp if qp is not None else self.qp).post_send(wr)

    def bandwidth_objects(self, qps: int, depth: int, buf_bytes: int) -> tuple[Any, Any, list[Any], list[int]]:
        """A CQ of ``qps * depth`` entries, an MR of ``buf_bytes`` (local write, remote write) and ``qps``
        RC QPs of send depth ``depth`` on the session's PD → ``(cq, mr, qps, psns)``; all destroyed by
        :meth:`close`. Raises :class:`PairError` naming what could not be created."""
        import pyverbs.mr as mrmod

        e, qpm = self.e, self.pv["qp"]
        try:
            cq = self._keep(self.pv["cq"].CQ(self.ctx, qps * depth + 16))
            mr = self._keep(mrmod.MR(self.pd, buf_bytes, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE))
            cap = qpm.QPCap(max_send_wr=depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
            out = [self._keep(qpm.QP(self.pd, qpm.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)))
                   for _ in range(qps)]
        except Exception as exc:  # noqa: BLE001
            raise PairError(f"bandwidth run: create CQ ({qps * depth + 16} entries), MR ({buf_bytes} bytes) or "
                            f"{qps} QPs of depth {depth} failed: {exc}") from None
        return cq, mr, out, [random.randrange(1 << 24) for _ in out]

    def poll(self, n: int, deadline: float) -> list[Any]:
        """``n`` completions (any kind), in order; raises PairError on a bad status or the deadline.
        An empty CQ is polled in a spin for :data:`POLL_SPIN_S`, then between sleeps that grow to
        :data:`POLL_SLEEP_MAX_S` (:func:`idle_wait`): a peer that never sends costs no core."""
        out: list[Any] = []
        idle_since: float | None = None
        while len(out) < n:
            got, wcs = self.cq.poll(num_entries=n - len(out))
            for wc in wcs[:got]:
                if wc.status != 0:
                    raise PairError(f"work completion status {wc.status} ({_wc_status(wc.status)}) on wr_id "
                                    f"{wc.wr_id}")
                out.append(wc)
            if got:
                idle_since = None
                continue
            now = time.monotonic()
            if now > deadline:
                raise PairError(f"timed out waiting for {n - len(out)} of {n} completion(s)")
            idle_since = now if idle_since is None else idle_since
            idle_wait(now - idle_since, deadline - now)
        return out

    def release(self, *objs: Any) -> bool:
        """Destroy ``objs`` (a bandwidth run's QPs, then its MR and CQ) now, before the session ends;
        False when one would not close (``close`` then tries it again)."""
        ok = True
        for obj in objs:
            try:
                obj.close()
            except Exception:  # noqa: BLE001
                ok = False
                continue
            self.created = [c for c in self.created if c is not obj]
        return ok

    def close(self) -> bool:
        ok = True
        for obj in reversed(self.created):
            try:
                obj.close()
            except Exception:  # noqa: BLE001
                ok = False
        self.created.clear()
        return ok


def idle_wait(idle_s: float, left_s: float) -> None:
    """One wait of a completion poll that found nothing for ``idle_s`` seconds: a yield within
    :data:`POLL_SPIN_S`, then a sleep of a tenth of the idle time, at most :data:`POLL_SLEEP_MAX_S`
    and never past the deadline (``left_s``)."""
    if idle_s < POLL_SPIN_S:
        os.sched_yield()
    else:
        time.sleep(max(0.0, min(POLL_SLEEP_MAX_S, idle_s / 10, left_s)))


WC_STATUS = {1: "local length error", 4: "local protection error", 5: "flushed", 10: "remote access error",
             12: "transport retry counter exceeded (no ACK: path MTU or route)", 13: "RNR retry exceeded"}


def _wc_status(s: int) -> str:
    return WC_STATUS.get(s, "see ibv_wc_status_str")
