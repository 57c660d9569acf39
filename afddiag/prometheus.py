"""Render a report for Prometheus' node_exporter textfile collector (the ``prometheus`` entry of
:data:`afddiag.report.REPORTERS`, which writes it to stdout or a file).

The metrics are built in a :class:`prometheus_client.CollectorRegistry` and rendered by
``prometheus_client.generate_latest`` (the library owns the exposition format and its escaping);
the file is written by :func:`afddiag.atomic.atomic_write` rather than ``write_to_textfile``, which
neither fsyncs, keeps an old file's mode and owner, nor refuses a FIFO.

Point node_exporter's ``--collector.textfile.directory`` at the folder and give each command its own
file (``--output DIR/afddiag-all.prom``, ``preflight --prom DIR/afddiag-preflight.prom``).
node_exporter adds ``instance``, so there is no host label. Every series carries ``role`` and
``command``, so the files of several commands in one folder never hold the same series twice
(node_exporter would drop the second and log "collected before"). Labels name only what stays put
across runs (a verdict flipping changes a value, never a series):

- ``afddiag_gate_status{role,command,gate}``: what the gate asks of an operator, by severity:
  **0 PASS or SKIP, 1 WARN, 2 FAIL, 3 ERROR** (as the exit code), so ``afddiag_gate_status > 0`` is
  "something needs attention" and ``max`` is the worst; before issue 23 SKIP was 4, above FAIL;
- ``afddiag_gate_skipped{role,command,gate}``: 1 when the gate said SKIP (nothing to judge), else 0;
- ``afddiag_gates{role,command,verdict}``: how many gates gave each verdict (all five, always);
- ``afddiag_exit_code{role,command}``: 0 clean, 1 WARN, 2 FAIL, 3 ERROR;
- ``afddiag_last_run_timestamp_seconds{role,command}``: when the report was made (Unix time);
- ``afddiag_roce_path_mtu_bytes{role,command,device,port,netdev}``: the RoCE path MTU of each port with
  a populated GID (from the netdev MTU, as the kernel's ``iboe_get_mtu``);
- ``afddiag_qp_rtr_transition_seconds{role,command,device,port}``: how long ``ibv_modify_qp`` to RTR
  took in the QP walk (live runs that walked);
- ``afddiag_gpu_under_load_sm_clock_hertz{role,command,gpu,uuid}``, ``afddiag_gpu_under_load_power_watts``,
  ``afddiag_gpu_load_flops_per_second{...,kind="fp32"|"bf16_mma"}``,
  ``afddiag_gpu_load_bytes_per_second{...,kind="gemv"|"copy"}``: the load probe's figures
  (``--load``; the value in base units, TFLOP/s × 10¹², GB/s × 10⁹);
- ``afddiag_gpu_sm_clock_hertz{role,command,gpu,uuid}`` and ``afddiag_gpu_temperature_celsius`` at idle;
- ``afddiag_device_map_info{role,command,ip,device} 1``: one per entry of the device map;
- ``afddiag_build_info{role,command,version} 1``.

``docs/MONITORING.md`` has alerting rules over these (checked by ``tests/test_alert_rules.py``).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Mapping
from typing import Any

from afddiag.model import roce_mtu
from afddiag.termsafe import cleaned

#: A verdict → ``afddiag_gate_status``'s value: what it asks of an operator, by severity (SKIP asks nothing;
#: ``afddiag_gate_skipped`` tells it from PASS). An unknown verdict counts as ERROR.
STATUS = {"PASS": 0, "SKIP": 0, "WARN": 1, "FAIL": 2, "ERROR": 3}
#: The verdicts ``afddiag_gates`` counts, each always present.
VERDICTS = ("PASS", "WARN", "FAIL", "ERROR", "SKIP")
#: The labels every series carries: a run's role and the command that made it (several commands' files
#: share one textfile folder).
BASE = ("role", "command")


class PrometheusUnavailable(RuntimeError):
    """prometheus_client is not importable (the message says how to install it)."""


def _timestamp(report: dict[str, Any]) -> float:
    try:
        return _dt.datetime.fromisoformat(report["generated_at"]).timestamp()
    except (KeyError, TypeError, ValueError):
        return time.time()


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _dicts(v: Any) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def path_mtus(fabric: dict[str, Any] | None) -> list[tuple[str, str, str, int]]:
    """``(device, port, netdev, RoCE path MTU bytes)`` for each port whose GIDs name a netdev with a
    known MTU, from a report's ``facts.fabric`` (JSON form)."""
    if not isinstance(fabric, dict):
        return []
    netdevs = fabric["netdevs"] if isinstance(fabric.get("netdevs"), dict) else {}
    out = []
    for dev in _dicts(fabric.get("devices")):
        for port in _dicts(dev.get("ports")):
            nds = sorted({g["netdev"] for g in _dicts(port.get("gids")) if isinstance(g.get("netdev"), str)})
            for nd in nds:
                mtu = _num((netdevs.get(nd) or {}).get("mtu")) if isinstance(netdevs.get(nd), dict) else None
                if mtu is not None:
                    out.append((str(dev.get("name")), str(port.get("num")), nd, roce_mtu(int(mtu))))
    return out


# gauge(name, doc, label names, rows of (label values, value)): registry_for's family maker, which puts
# the BASE labels first on every family
AddGauge = Callable[[str, str, tuple[str, ...], Any], None]


def _verdict_gauges(gauge: AddGauge, report: dict[str, Any]) -> None:
    """The run's own families: each gate's verdict, the verdict counts, the exit code, the run's time."""
    gates = _dicts(report.get("gates"))
    gauge("afddiag_gate_status", "What one afddiag gate asks of an operator: 0 PASS or SKIP, 1 WARN, 2 FAIL, 3 ERROR.",
          ("gate",), [({"gate": g.get("id")}, STATUS.get(str(g.get("verdict")), 3)) for g in gates])
    gauge("afddiag_gate_skipped", "1 when one afddiag gate said SKIP (nothing to judge), else 0.",
          ("gate",), [({"gate": g.get("id")}, int(g.get("verdict") == "SKIP")) for g in gates])
    counts = report.get("counts") or {}
    gauge("afddiag_gates", "Number of gates of the last run that gave each verdict.", ("verdict",),
          [({"verdict": v}, counts.get(v, 0)) for v in VERDICTS])
    gauge("afddiag_exit_code", "Exit code of the last afddiag run: 0 clean, 1 WARN, 2 FAIL, 3 ERROR.",
          (), [({}, report.get("exit_code", 3))])
    gauge("afddiag_last_run_timestamp_seconds", "When the last afddiag run made its report (Unix time).",
          (), [({}, round(_timestamp(report), 3))])


def _fabric_gauges(gauge: AddGauge, facts: dict[str, Any]) -> None:
    """The fabric families: each port's RoCE path MTU, each QP walk's time to RTR."""
    gauge("afddiag_roce_path_mtu_bytes", "RoCE path MTU of an RDMA port: the largest of 256..4096 that fits its "
          "netdev MTU (kernel iboe_get_mtu).", ("device", "port", "netdev"),
          [({"device": d, "port": p, "netdev": n}, m) for d, p, n, m in path_mtus(facts.get("fabric"))])
    qp = facts["qp"] if isinstance(facts.get("qp"), dict) else {}
    rtr = []
    for r in _dicts(qp.get("results")):
        step = next((s for s in _dicts(r.get("steps")) if s.get("to") == "RTR" and s.get("ok")), None)
        ms = _num(step.get("elapsed_ms")) if step else None
        if ms is not None:
            rtr.append(({"device": str(r.get("device")), "port": str(r.get("port"))}, ms / 1e3))
    gauge("afddiag_qp_rtr_transition_seconds", "Time of the QP walk's ibv_modify_qp to RTR (address resolution "
          "included) on a device.", ("device", "port"), rtr)


def _gpu_gauges(gauge: AddGauge, facts: dict[str, Any]) -> None:
    """The GPU families: clocks, power, rates and temperature, per GPU (under load and at the probe's read)."""
    gpu = facts["gpu"] if isinstance(facts.get("gpu"), dict) else {}
    devs = _dicts(gpu.get("devices"))

    def per_gpu(pick) -> list:
        out = []
        for d in devs:
            ids = {"gpu": str(d.get("index")), "uuid": str(d.get("uuid") or "")}
            for extra, v in pick(d):
                if v is not None:
                    out.append(({**ids, **extra}, v))
        return out

    def ul(d: dict[str, Any]) -> dict[str, Any]:
        return d["under_load"] if isinstance(d.get("under_load"), dict) else {}

    def scaled(v: Any, k: float) -> float | None:
        n = _num(v)
        return None if n is None else n * k

    g2 = ("gpu", "uuid")
    gauge("afddiag_gpu_under_load_sm_clock_hertz", "SM clock while the load probe ran.", g2,
          per_gpu(lambda d: [({}, scaled(ul(d).get("clock_sm_mhz"), 1e6))]))
    gauge("afddiag_gpu_under_load_power_watts", "Board power while the load probe ran.", g2,
          per_gpu(lambda d: [({}, scaled(ul(d).get("power_mw"), 1e-3))]))
    gauge("afddiag_gpu_load_flops_per_second", "Arithmetic rate the load probe achieved (fp32 FMA, bf16 mma.sync).",
          g2 + ("kind",), per_gpu(lambda d: [({"kind": "fp32"}, scaled(ul(d).get("fp32_tflops"), 1e12)),
                                             ({"kind": "bf16_mma"}, scaled(ul(d).get("bf16_tflops"), 1e12))]))
    gauge("afddiag_gpu_load_bytes_per_second", "Memory bandwidth the load probe achieved (GEMV-shaped read, "
          "device copy read+write).", g2 + ("kind",),
          per_gpu(lambda d: [({"kind": "gemv"}, scaled(ul(d).get("gemv_gbps"), 1e9)),
                             ({"kind": "copy"}, scaled(ul(d).get("copy_gbps"), 1e9))]))
    gauge("afddiag_gpu_sm_clock_hertz", "SM clock when the GPU probe read it.", g2,
          per_gpu(lambda d: [({}, scaled(d.get("clock_sm_mhz"), 1e6))]))
    gauge("afddiag_gpu_temperature_celsius", "GPU temperature when the GPU probe read it.", g2,
          per_gpu(lambda d: [({}, _num(d.get("temperature_c")))]))


def registry_for(report: dict[str, Any], command: str = "all"):
    """A :class:`prometheus_client.CollectorRegistry` holding the report's gauges (see the module
    docstring). Raises :class:`PrometheusUnavailable` when prometheus_client is not installed."""
    try:
        from prometheus_client import CollectorRegistry, Gauge
    except ImportError as e:
        raise PrometheusUnavailable(f"--format prometheus needs prometheus_client ({e}): pip install "
                                    "prometheus-client, or apt install python3-prometheus-client") from e
    reg = CollectorRegistry(auto_describe=True)
    role = (report.get("inputs") or {}).get("role") or "generic"
    base = {"role": role, "command": command}

    def gauge(name: str, doc: str, labels: tuple[str, ...], rows) -> None:
        rows = [(lv, v) for lv, v in rows if v is not None]
        if not rows:  # nothing read (no GPU, no QP walk): no family, rather than an empty one
            return
        g = Gauge(name, doc, BASE + labels, registry=reg)
        for lv, v in rows:
            g.labels(**base, **lv).set(v)

    _verdict_gauges(gauge, report)
    facts = report["facts"] if isinstance(report.get("facts"), dict) else {}
    _fabric_gauges(gauge, facts)
    _gpu_gauges(gauge, facts)
    gauge("afddiag_device_map_info", "One entry of DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP: fabric IP -> RDMA device.",
          ("ip", "device"), [({"ip": ip, "device": dev}, 1) for ip, dev in (report.get("device_map") or {}).items()])
    gauge("afddiag_build_info", "afddiag version that made the report.", ("version",),
          [({"version": report.get("afddiag_version", "")}, 1)])
    return reg


def render(report: Mapping[str, Any], command: str = "all") -> str:
    """The report (``afddiag/schema/report.schema.json`` shape) as textfile-collector text
    (``prometheus_client.generate_latest``), ending with a newline. ``command`` is the afddiag command
    that made it (a label). Raises :class:`PrometheusUnavailable` without prometheus_client."""
    from prometheus_client import generate_latest

    # label values from the host (device names: a non-UTF-8 one is a lone surrogate) as escapes
    return generate_latest(registry_for(cleaned(report), command)).decode("utf-8")
