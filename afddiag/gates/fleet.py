"""Fleet gates: judge several hosts' reports together (what one host's view cannot see).

Pure functions over per-host JSON reports (``afddiag all --json``, schema 1), however they were
collected (``afddiag fleet`` over SSH, or ``afddiag merge`` over files from Slurm, Ansible, pdsh,
clush). They never touch a host. Each gate returns one :class:`~afddiag.verdict.Verdict` for the
fleet; the summary names the host(s) first.

What each gate compares comes from the per-host summary of each report (``summary``,
:mod:`afddiag.summary`, with its schema; built from an older report that has none): role, fabric
IP and its prefix length, capacity flag, RoCE MTU, GID index (and a forced ``NCCL_IB_GID_INDEX``),
the device maps and ``fabric.devicemap-env``'s verdict, the GPUs' under-load figures and
``gpu.slow-state``'s verdict, the
rails (``[{port, ip, subnet, gid_index}]``), versions. The gates never read another gate's free-form facts.
"""

from __future__ import annotations

import ipaddress
import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from afddiag import summary
from afddiag.catalog import commands, remedy
from afddiag.diagnosis import fill_actions
from afddiag.envvars import CAPACITY_KEYS, MAP_VAR, NCCL_GID_VAR, parse_device_map
from afddiag.gates import declared, fleet_engine, fleet_known_bad, fleet_nccl, gate
from afddiag.gates.control_plane import (
    REACHED,
    asymmetric,
    connect_matrix,
    control_remedy,
    not_tested,
    owners,
    ports_txt,
    root_fixes,
)
from afddiag.gates.fleet_address import fabric_subnets, off_subnet_pairs
from afddiag.gates.fleet_address import minority as _minority
from afddiag.model import ROCE_MTUS
from afddiag.model.gpu import LOAD_FIGURES
from afddiag.model.summary import Summary
from afddiag.summary import as_int as _int  # one reading of an integer, with the summary
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN, Verdict

COORDINATOR = "coordinator"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # a variable name a launch env file can hold
OUTLIER_FRACTION = 0.8  # a load figure below 80 % of the same-role median names the host
MAX_NAMED = 8  # hosts named in one summary before "and N more"


@dataclass
class HostResult:
    """One host of the fleet: its per-host report, or why there is none.

    ``report`` is the parsed ``afddiag all --json`` object (None when collection failed; then
    ``error`` says why: unreachable, timed out, not JSON, ...). ``role``/``fabric_ip`` are the
    inventory's (None from ``merge``); ``target`` the SSH target or the report's file. ``merge``
    keeps a report only when asked (``--full-reports``, ``--html``): otherwise it reduces each one as
    it is read to ``brief`` (``{"gates": [[id, verdict], ...], "exit_code", "afddiag_version"}``,
    :func:`afddiag.fleet.judge.brief_of`) and its summary (given as ``_summary``), all the fleet
    report and the fleet gates read.
    """

    name: str
    role: str | None = None
    target: str | None = None
    fabric_ip: str | None = None
    report: dict[str, Any] | None = None
    error: str | None = None
    elapsed_s: float | None = None
    brief: dict[str, Any] | None = None
    _gates: dict[str, dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    _summary: Summary | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the host gave a report (kept whole, or reduced to ``brief`` and its summary)."""
        return self.report is not None or self.brief is not None

    def gate(self, gate_id: str) -> dict[str, Any]:
        """The report's gate ``gate_id`` as a dict ({} when absent)."""
        if self._gates is None:
            self._gates = {g["id"]: g for g in (self.report or {}).get("gates") or []
                           if isinstance(g, dict) and isinstance(g.get("id"), str)}
        return self._gates.get(gate_id) or {}

    @property
    def inputs(self) -> dict[str, Any]:
        """The report's ``inputs`` (fabric IP, role, env, launch_env path); {} without a report."""
        i = (self.report or {}).get("inputs")
        return i if isinstance(i, dict) else {}

    @property
    def facts(self) -> dict[str, Any]:
        """The report's ``facts`` (fabric, qp, gpu, cpu, route, versions); {} without a report."""
        f = (self.report or {}).get("facts")
        return f if isinstance(f, dict) else {}

    @property
    def env(self) -> dict[str, str]:
        """The launch environment the host judged (``inputs.env``: the launch env file's device
        selection variables when --launch-env was given, else the process's)."""
        e = self.inputs.get("env")
        return e if isinstance(e, dict) else {}

    @property
    def summary(self) -> Summary:
        """The report's per-host summary (:mod:`afddiag.summary`; built from an older report that has
        none); {} without a report. The fleet gates read only this."""
        if self._summary is None:
            self._summary = summary.of(self.report)
        return self._summary

    @property
    def host_role(self) -> str:
        """The inventory's role, else the report's role, else "generic"."""
        return self.role or self.summary.get("role") or "generic"

    @property
    def fip(self) -> str | None:
        """The fabric IP the report judged, else the inventory's."""
        return self.summary.get("fabric_ip") or self.fabric_ip


Fleet = list[HostResult]
FleetGate = Callable[[Fleet, dict[str, Any]], Verdict]


def _names(hosts: list[str], total: int | None = None) -> str:
    """At most MAX_NAMED of ``hosts``, then "and N more" (``total``: how many there are in all, when
    ``hosts`` holds only the first of them)."""
    hosts = list(hosts)
    total = len(hosts) if total is None else total
    if total <= MAX_NAMED:
        return ", ".join(hosts)
    return ", ".join(hosts[:MAX_NAMED]) + f" and {total - MAX_NAMED} more"


BRIEF_CHARS = 160  # a host gate's summary quoted in a fleet summary: longer ones shortened by whole items


def _brief(text: Any, limit: int = BRIEF_CHARS) -> str:
    """A host gate's summary for quoting in a fleet summary: whole "; "-separated items kept while they
    fit in ``limit`` characters (the first always, however long), the rest counted ("(+2 more)").
    Never cuts inside an item, so no variable, device or address is cut mid-token; the full text
    stays in the fleet gate's facts and in the host's own report."""
    items = [i for i in str(text or "").split("; ") if i]
    if not items:
        return ""
    kept = [items[0]]
    for it in items[1:]:
        if len("; ".join(kept + [it])) > limit:
            break
        kept.append(it)
    rest = len(items) - len(kept)
    return "; ".join(kept) + (f" (+{rest} more)" if rest else "")


def _not_judged(fleet: Fleet) -> list[str]:
    return [f"{h.name} ({h.error})" for h in fleet if not h.ok]


def _tail(fleet: Fleet) -> str:
    bad = [h.name for h in fleet if not h.ok]
    return f" ({len(bad)} host(s) without a report not judged: {_names(bad)})" if bad else ""


# ---------------------------------------------------------------- fleet.capacity

def _spelled(f: Mapping[str, Any]) -> str:
    """The capacity flag as the host's launch env file spells it (summary ``capacity.spelled``, the site's
    alias; a name the file could hold, else afddiag's ``key``)."""
    sp = f.get("spelled")
    return sp if isinstance(sp, str) and ENV_NAME.fullmatch(sp) else str(f["key"])


@gate("fleet.capacity")
def capacity(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """The coordinator's batch flag (AFD_PREFILL_CAPACITY) equals every rank's capacity flag
    (AFD_EXPERT_CAPACITY) and the inventory's ``capacity`` when given. Facts: ``launch.capacity``
    gate facts ``{key, value, set, spelled}`` of each report; ``inputs.launch_env`` names the file. Each
    flag is named as its host's file spells it (a site alias such as ``CAPACITY``)."""
    flags: dict[str, tuple[str, int, bool, str]] = {}
    keys: dict[str, str] = {}  # host -> afddiag's name of its flag
    unknown: list[str] = []
    for h in fleet:
        if not h.ok:
            continue
        f: Mapping[str, Any] = h.summary.get("capacity") or {}
        val = _int(f.get("value"))
        if f.get("key") in CAPACITY_KEYS.values() and val is not None:
            flags[h.name] = (_spelled(f), val, bool(f.get("set")), h.summary.get("launch_env") or "?")
            keys[h.name] = f["key"]
        else:
            unknown.append(h.name)
    facts = {"flags": {n: {"key": keys[n], "spelled": k, "value": v, "set": s, "launch_env": p}
                       for n, (k, v, s, p) in flags.items()},
             "unknown": unknown, "expected": expect.get("capacity"), "not_judged": _not_judged(fleet)}
    if not flags:
        return Verdict(gate_id, SKIP, "no host reported a capacity flag (launch.capacity needs --launch-env and a role)"
                       + _tail(fleet), remedy("fleet.no-launch-env"), facts)
    want = _int(expect.get("capacity"))
    coords = {n: v for n, (_, v, _, _) in flags.items() if keys[n] == "AFD_PREFILL_CAPACITY"}
    if want is not None:
        ref, ref_src = want, f"the inventory's capacity {want}"
    elif coords:
        ref, c_off = _minority(coords)
        c = next(n for n, v in coords.items() if v == ref)
        ref_src = f"coordinator {c}'s {flags[c][0]}={ref}"
    else:
        ref, _ = _minority({n: v for n, (_, v, _, _) in flags.items()})
        ref_src = f"the most common flag {ref} (no coordinator reported its batch flag)"
    off = [n for n, (_, v, _, _) in flags.items() if v != ref]
    if off:
        parts = [f"{n} {flags[n][0]}={flags[n][1]}" + ("" if flags[n][2] else " (engine default)")
                 + f" in {flags[n][3]}" for n in off]
        sets = [f"{flags[n][0]}={ref} in {flags[n][3]} on {n}" for n in off]
        return Verdict(gate_id, FAIL, f"{_names(parts)}: {'differs' if len(parts) == 1 else 'differ'} from "
                       f"{ref_src}: the coordinator's batch flag and every rank's capacity flag must be equal"
                       + _tail(fleet), f"set {_names(sets)}; " + remedy(gate_id), facts)
    if unknown:
        return Verdict(gate_id, WARN, f"{_names(unknown)}: no capacity flag reported (no --launch-env or role "
                       f"unknown); the {len(flags)} other host(s) agree on {ref}" + _tail(fleet),
                       remedy("fleet.no-launch-env"), facts)
    return Verdict(gate_id, PASS, f"{len(flags)} host(s) agree: capacity {ref} ({ref_src})" + _tail(fleet),
                   "nothing to do", facts)


# ---------------------------------------------------------------- fleet.fabric-ip

@gate("fleet.fabric-ip")
def fabric_ip(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """Every host has a fabric IP, no two share one, and all are on one subnet (the prefix length
    read from the netdev that holds each address; a host whose prefix is unseen is judged with the
    others' prefix). The inventory's fabric IP must equal the report's when both are given."""
    ips: dict[str, str] = {}
    fails: list[str] = []
    missing: list[str] = []
    for h in fleet:
        if not h.ok:
            continue
        rep_ip = h.summary.get("fabric_ip")
        if h.fabric_ip and rep_ip and rep_ip != h.fabric_ip:
            fails.append(f"{h.name}: inventory says {h.fabric_ip} but the host judged {rep_ip}")
        ip = h.fip
        if not ip:
            src = h.summary.get("fabric_ip_source") or "none"
            missing.append(f"{h.name} ({src})")
            continue
        ips[h.name] = ip
    facts: dict[str, Any] = {"fabric_ips": ips, "missing": missing, "not_judged": _not_judged(fleet)}
    if not ips and not missing:
        return Verdict(gate_id, SKIP, "no host report to judge" + _tail(fleet), remedy("fleet.unreachable"), facts)
    by_ip: dict[str, list[str]] = defaultdict(list)
    for n, ip in ips.items():
        by_ip[ip].append(n)
    for ip, ns in by_ip.items():
        if len(ns) > 1:
            fails.append(f"{_names(ns)} share fabric IP {ip}")
    sub = fabric_subnets(fleet, ips)
    nets = sub.nets
    facts.update({"subnets": nets, "prefix_assumed_for": sub.assumed, "fleet_subnet": sub.common,
                  "fleet_subnet_from": sub.source})
    if len(set(nets.values())) > 1:
        off = [f"{n} {ips[n]} ({nets[n]})" for n in sub.off]
        fails.append(f"{_names(off)}: not on the fleet's subnet {sub.common}")
    if missing:
        fails.append(f"{_names(missing)}: no fabric IP (give fabric_ip in the inventory or AFD_FABRIC_IP)")
    unsaid = [m.split(" (")[0] for m in missing if m.endswith("(ambiguous)")]
    if fails and len(fails) == 1 and missing and len(unsaid) == len(missing):
        # the hosts hold addresses; which one the launcher uses was not given: a missing input, no host change
        return Verdict(gate_id, FAIL, "; ".join(fails) + _tail(fleet),
                       f"give --fabric-ip / AFD_FABRIC_IP (or fabric_ip in the inventory) for {_names(unsaid)}: "
                       "the address its launcher uses", facts, action="SET_ENV")
    if fails:
        return Verdict(gate_id, FAIL, "; ".join(fails) + _tail(fleet), remedy(gate_id), facts)
    return Verdict(gate_id, PASS, f"{len(ips)} unique fabric IPs, all on {next(iter(nets.values()))}" + _tail(fleet),
                   "nothing to do", facts)


# ---------------------------------------------------------------- fleet.mtu

@gate("fleet.mtu")
def mtu(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """Every host's RoCE path MTU (summary ``roce_mtu_bytes``, bytes) against the target: the inventory's
    ``mtu`` when given, else the role's (RoCE path MTU 4096, what ``fabric.mtu`` passes), never the
    majority: four ranks at 1024 and a coordinator at 4096 name the four. Hosts that disagree FAIL (a
    1024 side against a 4096 side fails with retry-exceeded); a fleet that agrees below the target WARNs."""
    mtus: dict[str, int] = {}
    netdev: dict[str, str] = {}
    unknown: list[str] = []
    for h in fleet:
        if not h.ok:
            continue
        s = h.summary
        m = _int(s.get("roce_mtu_bytes"))
        if m is None:
            unknown.append(h.name)
            continue
        mtus[h.name] = m
        netdev[h.name] = f"{s.get('netdev')} MTU {s.get('netdev_mtu_bytes')}"
    want = _int(expect.get("mtu"))
    ref = want if want is not None else ROCE_MTUS[0]
    facts = {"roce_mtu": mtus, "netdev": netdev, "unknown": unknown, "target": ref, "not_judged": _not_judged(fleet)}
    if not mtus:
        return Verdict(gate_id, SKIP, "no host reported a RoCE MTU (fabric.mtu did not judge: fabric IP unknown or "
                       "fabric not captured)" + _tail(fleet), remedy("fleet.unreachable"), facts)
    off = [n for n, m in mtus.items() if m != ref]
    if off:
        parts = [f"{n} RoCE MTU {mtus[n]} ({netdev[n]})" for n in off]
        src = "the inventory's" if want is not None else "the role's target RoCE MTU"
        agree = len(set(mtus.values())) == 1
        return Verdict(gate_id, WARN if agree else FAIL,
                       f"{_names(parts)}: {'differs' if len(parts) == 1 else 'differ'} from {src} {ref}"
                       + ("" if agree else f" ({len(mtus) - len(off)} host(s) at {ref})") + _tail(fleet),
                       remedy(gate_id), facts, action="SET_MTU")
    if unknown:
        return Verdict(gate_id, WARN, f"{_names(unknown)}: RoCE MTU not reported; {len(mtus)} host(s) at {ref}"
                       + _tail(fleet), remedy("fleet.unreachable"), facts)
    return Verdict(gate_id, PASS, f"{len(mtus)} host(s) at RoCE MTU {ref}" + _tail(fleet), "nothing to do", facts)


# ---------------------------------------------------------------- fleet.gid-index

@gate("fleet.gid-index")
def gid_index(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """The fabric IP's RoCE v2 GID index per host (``fabric.rocev2-ipv4`` facts ``entry.gid_index``).
    Different indexes are fine for stacks that pick the GID per host. WARN names a host where a forced
    index reaches another GID: an engine's forced GID index in that host's own env (summary
    ``gid_index_envs``: ``NCCL_IB_GID_INDEX``, Mooncake's ``MC_GID_INDEX``, ``UCX_IB_GID_INDEX``, each
    compared with the host's own index, never pooled across hosts or engines; older summaries'
    ``gid_index_env``, NCCL's) that differs from its own index, or, when the inventory forces
    ``gid_index``, a host whose index differs from it. A host that forces nothing picks its own GID."""
    idx: dict[str, int] = {}
    unknown: list[str] = []
    forced: dict[str, dict[str, str]] = {}
    for h in fleet:
        if not h.ok:
            continue
        envs = h.summary.get("gid_index_envs")
        if not isinstance(envs, dict):
            one = h.summary.get("gid_index_env")
            envs = {NCCL_GID_VAR: one} if isinstance(one, str) else {}
        envs = {k: v for k, v in envs.items() if isinstance(k, str) and isinstance(v, str)}
        if envs:
            forced[h.name] = envs
        i = _int(h.summary.get("gid_index"))
        if i is None:
            unknown.append(h.name)
        else:
            idx[h.name] = i
    want = _int(expect.get("gid_index"))
    # per host, the forced values that are not its own index (a value that is no number counts: it is wrong too)
    wrong = {n: {k: v for k, v in forced.get(n, {}).items() if _int(v.strip()) != i} for n, i in idx.items()}
    wrong = {n: w for n, w in wrong.items() if w}
    facts = {"gid_index": idx, "unknown": unknown, "forced_by_env": forced, "forced_elsewhere": wrong,
             "expected": want, "not_judged": _not_judged(fleet)}
    if not idx:
        return Verdict(gate_id, SKIP, "no host reported its fabric GID index (fabric.rocev2-ipv4 found no entry)"
                       + _tail(fleet), remedy("fleet.unreachable"), facts)
    force_txt = "; ".join(f"{var} is set on " + _names([f"{n}={e[var][:20]}" for n, e in forced.items() if var in e])
                          for var in sorted({k for e in forced.values() for k in e}))
    off = [n for n, i in idx.items() if want is not None and i != want or n in wrong]
    if off:
        parts = [f"{n} GID index {idx[n]}" + (" while " + ", ".join(f"{k}={v[:20]}" for k, v in wrong[n].items())
                                              + " is forced there" if n in wrong else "") for n in off]
        return Verdict(gate_id, WARN, f"{_names(parts)}: a forced index reaches another GID there"
                       + (f"; the inventory forces gid_index {want}" if want is not None else "")
                       + (f"; {force_txt}" if force_txt else "") + _tail(fleet), remedy(gate_id), facts)
    if len(set(idx.values())) > 1:
        how = ("each host that forces one forces its own index: " + force_txt if force_txt else
               "nothing forces one index (each host picks its own)")
        return Verdict(gate_id, PASS, f"GID indexes differ ({_names([f'{n}={i}' for n, i in idx.items()])}) but {how}"
                       + _tail(fleet), "nothing to do", facts)
    ref = next(iter(idx.values()))
    return Verdict(gate_id, PASS, f"{len(idx)} host(s) at GID index {ref}" + (f"; {force_txt}" if force_txt else "")
                   + _tail(fleet), "nothing to do", facts)


# ---------------------------------------------------------------- fleet.devicemap

@gate("fleet.devicemap")
def devicemap(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """Each host's engine opens the device carrying its fabric IP, and fleet-wide maps agree.

    Per host (summary ``device_map_env``, ``first_device``, ``devicemap_env``): a map that is not set
    is a fault only where the host's own ``fabric.first-device`` FAILs (the first enumerated device
    does not carry the fabric IP); where it PASSes (the fallback device carries it: a single-device
    host) the host is fine without one and is named in the facts, and where it WARNs (order unknown,
    IP ambiguous) this gate WARNs too. A host without fabric data (GPU-only report; first-device
    SKIP or absent) is "not judged: no fabric data", never "not set". A host whose
    ``fabric.devicemap-env`` FAILs is named. Across hosts (the new evidence one host cannot see): a
    map's entry for another host's fabric IP must name the device that host's own ``device_map``
    gives. The fleet never contradicts a host gate without such evidence."""
    unset: list[str] = []
    unset_warn: list[str] = []
    unset_ok: list[str] = []
    no_fabric: list[str] = []
    bad_local: list[str] = []
    wrong_remote: list[str] = []
    by_ip = {h.fip: h for h in fleet if h.ok and h.fip}
    maps: dict[str, str] = {}
    for h in fleet:
        if not h.ok:
            continue
        dm_env: Mapping[str, Any] = h.summary.get("devicemap_env") or {}
        if dm_env.get("verdict") == FAIL:
            bad_local.append(f"{h.name} ({_brief(dm_env.get('summary'))})")
        val = h.summary.get("device_map_env")
        if val is None:
            first: Mapping[str, Any] = h.summary.get("first_device") or {}
            verdict = first.get("verdict") if isinstance(first, dict) else None
            if dm_env.get("verdict") == FAIL:
                continue  # named once, as its devicemap-env FAIL (which explains first-device's)
            if verdict == FAIL:
                unset.append(h.name)
            elif verdict == WARN:
                unset_warn.append(f"{h.name} ({_brief(first.get('summary'))})")
            elif verdict == PASS:
                unset_ok.append(h.name)
            else:
                no_fabric.append(h.name)
            continue
        maps[h.name] = val
        entries, _ = parse_device_map(val)
        for ip, dev in entries.items():
            other = by_ip.get(ip)
            if other is None or other is h:
                continue
            theirs = other.summary.get("device_map") or {}
            if ip in theirs and theirs[ip] != dev:
                wrong_remote.append(f"{h.name}'s map sends {other.name}'s {ip} to {dev}, but {other.name} carries it "
                                    f"on {theirs[ip]}")
    facts = {"maps": maps, "unset": unset, "unset_warn": unset_warn, "unset_first_device_carries": unset_ok,
             "no_fabric_data": no_fabric, "local_fail": bad_local, "cross_host": wrong_remote,
             "not_judged": _not_judged(fleet)}
    judged = [h for h in fleet if h.ok and h.name not in no_fabric]
    nofab = f"; not judged: no fabric data: {_names(no_fabric)}" if no_fabric else ""
    if not judged:
        why = "no host report to judge" if not no_fabric else f"no host report with fabric data{nofab}"
        return Verdict(gate_id, SKIP, why + _tail(fleet), remedy("fleet.unreachable"), facts)
    problems = []
    if unset:
        problems.append(f"{_names(unset)}: {MAP_VAR} not set and the first enumerated device (the engine's "
                        "fallback) does not carry the fabric IP (fabric.first-device FAIL)")
    if bad_local:
        problems.append(f"{_names(bad_local)}: fabric.devicemap-env FAIL")
    problems += wrong_remote
    if problems:
        return Verdict(gate_id, FAIL, "; ".join(problems) + nofab + _tail(fleet), remedy(gate_id), facts,
                       commands=commands(gate_id))
    ok_txt = (f"; {_names(unset_ok)}: not set, the first enumerated device carries the fabric IP"
              if unset_ok else "")
    if unset_warn:
        return Verdict(gate_id, WARN, f"{_names(unset_warn)}: {MAP_VAR} not set and fabric.first-device could not tell "
                       "which device the engine opens" + ok_txt + nofab + _tail(fleet), remedy(gate_id), facts,
                       action="SET_ENV", commands=commands(gate_id))
    return Verdict(gate_id, PASS, f"{len(judged)} host(s): each engine opens the device carrying its fabric IP"
                   + (f" ({len(maps)} by the map)" if maps else "") + ", maps consistent" + ok_txt + nofab
                   + _tail(fleet), "nothing to do", facts)


# ---------------------------------------------------------------- fleet.gpu

def _load_figures(h: HostResult) -> dict[str, dict[str, float]]:
    """GPU model → the slowest under-load figure of each kind across the host's GPUs of that model
    (summary ``gpus``: ``name`` as NVML gives it, "NVIDIA GB10"; "unknown GPU" when not read).
    Figures of different models are never mixed: an H200's clock is no yardstick for a GB10."""
    out: dict[str, dict[str, float]] = {}
    for d in h.summary.get("gpus") or []:
        ul = (d or {}).get("under_load") if isinstance(d, dict) else None
        if not isinstance(ul, dict):
            continue
        model = str(d.get("name") or "unknown GPU")
        for k, _ in LOAD_FIGURES:
            v = ul.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                per = out.setdefault(model, {})
                per[k] = min(per.get(k, v), v)
    return out


def _busy(h: HostResult) -> bool:
    """True when the host's gpu.slow-state found its GPU busy with another job (summary ``gpu_busy``)."""
    return bool(h.summary.get("gpu_busy"))


@gate("fleet.gpu")
def gpu(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """One slow GPU slows every rank in lockstep: name the host whose ``gpu.slow-state`` is
    FAIL/WARN, or whose under-load figure (SM clock, TFLOP/s, GB/s) is below 80 % of the median of
    the hosts with its role and GPU model (like with like; needs three such hosts with that figure).
    Facts ``medians``: role → GPU model → figure → median."""
    slow: list[str] = []
    warn: list[str] = []
    figs: dict[str, dict[str, dict[str, float]]] = {}  # host → GPU model → figure → value
    for h in fleet:
        if not h.ok:
            continue
        g: Mapping[str, Any] = h.summary.get("slow_state") or {}
        if g.get("verdict") == FAIL:
            slow.append(f"{h.name} ({_brief(g.get('summary'))})")
        elif g.get("verdict") == WARN:
            warn.append(f"{h.name} ({_brief(g.get('summary'))})")
        f = _load_figures(h)
        if f and not _busy(h):  # a GPU shared with another job is no outlier: its figures are a share
            figs[h.name] = f
    roles = {h.name: h.host_role for h in fleet if h.ok}
    outliers: list[str] = []
    medians: dict[str, dict[str, dict[str, float]]] = {}
    groups = sorted({(roles[n], model) for n in figs for model in figs[n]})
    for role, model in groups:  # like with like: one role, one GPU model
        members = [n for n in figs if roles[n] == role and model in figs[n]]
        for k, unit in LOAD_FIGURES:
            vals = {n: figs[n][model][k] for n in members if k in figs[n][model]}
            if len(vals) < 3:
                continue
            med = statistics.median(vals.values())
            medians.setdefault(role, {}).setdefault(model, {})[k] = med
            for n, v in vals.items():
                if med > 0 and v < OUTLIER_FRACTION * med:
                    outliers.append(f"{n} {k} {v:g} {unit} is {v / med:.0%} of the {role} median {med:g}"
                                    f" ({model}, {len(vals)} hosts)")
    facts = {"slow_state_fail": slow, "slow_state_warn": warn, "outliers": outliers, "medians": medians,
             "figures": figs, "not_judged": _not_judged(fleet)}
    if slow or outliers:
        parts = slow + outliers
        return Verdict(gate_id, FAIL, f"{_names(parts)}: one slow GPU slows every rank in lockstep" + _tail(fleet),
                       remedy(gate_id), facts)
    if warn:
        return Verdict(gate_id, WARN, f"{_names(warn)}: gpu.slow-state inconclusive" + _tail(fleet),
                       "re-run `afddiag gpu --load` on the named hosts when their GPUs are idle: nothing is proven "
                       "wrong with them", facts, action="RERUN")
    judged = [h.name for h in fleet
              if h.ok and (h.summary.get("slow_state") or {"verdict": None}).get("verdict") == PASS]
    if not judged and not figs:
        return Verdict(gate_id, SKIP, "no host reported GPU load figures (run with --load, or the expert role)"
                       + _tail(fleet), "run `afddiag all --load` on every rank", facts)
    return Verdict(gate_id, PASS, f"{len(judged or figs)} host(s) with GPU load figures, none slow or an outlier"
                   + _tail(fleet), "nothing to do", facts)


# ---------------------------------------------------------------- fleet.versions

def host_versions(h: HostResult) -> dict[str, str]:
    """What a host says about versions (summary ``versions``: ``afddiag``, ``driver``, ``kernel``,
    ``bios``, ``rdma_core``, ``firmware`` per HCA type)."""
    v = h.summary.get("versions")
    return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else {}


def host_firmware(h: HostResult) -> list[dict[str, str]]:
    """The host's firmware per HCA model (summary ``firmware``: ``[{hca, fw_ver}]``)."""
    rows = h.summary.get("firmware")
    return [{"hca": str(r.get("hca")), "fw_ver": str(r.get("fw_ver"))} for r in rows or []
            if isinstance(r, dict) and r.get("fw_ver")] if isinstance(rows, list) else []


NODE_VERSION_KINDS = ("firmware", "driver", "kernel", "bios")  # updating these takes a reboot or a driver reload
NODE_UPDATES = {"firmware": "the NIC firmware with mlxfwmanager", "driver": "the NVIDIA driver package",
                "kernel": "the kernel package", "bios": "the BIOS update"}
PACKAGE_VERSION_KINDS = {"rdma_core": "rdma-core", "afddiag": "afddiag"}  # userspace: a package update, no drain


def versions_remedy(kinds: set[str]) -> tuple[str, str]:
    """``(remedy, action)`` for the drifted version ``kinds`` (``fleet.versions`` drift keys: ``driver``,
    ``kernel``, ``bios``, ``rdma_core``, ``afddiag``, ``firmware <hca>``). Firmware, driver, kernel or
    BIOS drift: UPDATE_VERSIONS, the remedy says to drain before that update (it takes a reboot or a
    driver reload), naming only those kinds; a userspace-only drift (afddiag, rdma-core):
    UPDATE_PACKAGE, no drain. Both: the node kinds' remedy, then the packages' without a drain. Pure."""
    node = [k for k in NODE_VERSION_KINDS if any(x == k or x.startswith(k + " ") for x in kinds)]
    pkgs = [v for k, v in PACKAGE_VERSION_KINDS.items() if k in kinds]
    pkg_text = remedy("fleet.versions.package").format(what=" and ".join(pkgs)) if pkgs else ""
    if not node:
        return pkg_text, "UPDATE_PACKAGE"
    text = remedy("fleet.versions.node").format(what=", ".join(NODE_UPDATES[k] for k in node))
    return text + (f"; also {pkg_text}" if pkg_text else ""), "UPDATE_VERSIONS"


@gate("fleet.versions")
def versions(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """Firmware, NVIDIA driver, kernel, BIOS, rdma-core and afddiag versions that differ between hosts
    of one role (:func:`host_versions`); the odd host(s) are named against the role's most common value.
    Firmware is compared only between hosts with the same HCA (board id when read, else HCA type:
    :func:`host_firmware`): a ConnectX-4's version line says nothing about a ConnectX-7's."""
    per = {h.name: host_versions(h) for h in fleet if h.ok}
    fw = {h.name: host_firmware(h) for h in fleet if h.ok}
    roles = {h.name: h.host_role for h in fleet if h.ok}
    drift: list[str] = []
    detail: dict[str, dict[str, dict[str, str]]] = {}
    for role in sorted(set(roles.values())):
        members = [n for n in per if roles[n] == role]
        if len(members) < 2:
            continue
        for hca in sorted({r["hca"] for n in members for r in fw[n]}):  # firmware: like HCA with like
            vals = {n: ", ".join(sorted(r["fw_ver"] for r in fw[n] if r["hca"] == hca)) for n in members
                    if any(r["hca"] == hca for r in fw[n])}
            if len(vals) > 1 and len(set(vals.values())) > 1:
                common, off = _minority(vals)
                detail.setdefault(role, {})[f"firmware {hca}"] = vals
                drift.append(f"{_names([f'{n} firmware {hca} {vals[n]}' for n in off])} "
                             f"(other {role} hosts with {hca}: {common})")
        for key in ("driver", "kernel", "bios", "rdma_core", "afddiag"):
            vals = {n: per[n][key] for n in members if key in per[n]}
            if len(set(vals.values())) > 1:
                common, off = _minority(vals)
                detail.setdefault(role, {})[key] = vals
                drift.append(f"{_names([f'{n} {key} {vals[n]}' for n in off])} (other {role} hosts: {common})")
    facts = {"versions": per, "firmware": fw, "drift": detail, "not_judged": _not_judged(fleet)}
    if not per:
        return Verdict(gate_id, SKIP, "no host report to judge" + _tail(fleet), remedy("fleet.unreachable"), facts)
    if drift:
        rem, action = versions_remedy({k for d in detail.values() for k in d})
        return Verdict(gate_id, WARN, "; ".join(drift) + _tail(fleet), rem, facts, action=action)
    keys = [k if k != "firmware" else "firmware per HCA model" for k in sorted({k for v in per.values() for k in v})]
    return Verdict(gate_id, PASS, f"{len(per)} host(s): same {', '.join(keys) or 'versions'} within each role"
                   + _tail(fleet), "nothing to do", facts)


# ---------------------------------------------------------------- fleet.rails

@gate("fleet.rails")
def rails(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """Every rail a host's NCCL_IB_HCA selects (a port with its own routable IPv4 RoCE v2 GID, the
    ``fabric.devicemap-env`` facts ``rails``) must have a peer: some other host holds an address on
    its subnet (summary ``ipv4_prefixlen``). A rail on a subnet no other host
    has is a port NCCL uses and nobody answers on: FAIL, named."""
    subnets: dict[str, set[str]] = defaultdict(set)  # subnet -> hosts with an address on it
    for h in fleet:
        if not h.ok:
            continue
        addrs = [f"{ip}/{plen}" for ip, plen in (h.summary.get("ipv4_prefixlen") or {}).items()]
        for a in addrs:
            try:
                subnets[str(ipaddress.IPv4Interface(a).network)].add(h.name)
            except ValueError:
                continue
    seen, lonely = [], []
    for h in fleet:
        if not h.ok:
            continue
        for r in h.summary.get("rails") or []:
            if not isinstance(r, dict) or not r.get("subnet"):
                continue
            seen.append(f"{h.name} {r.get('port')} {r.get('subnet')}")
            if not subnets.get(str(r["subnet"]), set()) - {h.name}:
                lonely.append(f"{h.name} {r.get('port')} ({r.get('ip')} on {r['subnet']})")
    facts = {"rails": seen, "lonely": lonely, "subnets": {k: sorted(v) for k, v in subnets.items()},
             "not_judged": _not_judged(fleet)}
    if lonely:
        return Verdict(gate_id, FAIL, f"{_names(lonely)}: NCCL_IB_HCA selects a rail on a subnet no other host has "
                       "an address on: NCCL's connections over it time out" + _tail(fleet), remedy(gate_id), facts)
    if not seen:
        return Verdict(gate_id, SKIP, "no host reported a rail beside its fabric port (NCCL_IB_HCA selecting a second "
                       "addressed port)" + _tail(fleet), "nothing to judge", facts)
    return Verdict(gate_id, PASS, f"{len(seen)} rail(s), each with a peer on its subnet" + _tail(fleet),
                   "nothing to do", facts)


# ---------------------------------------------------------------- fleet.control-plane



@gate("fleet.control-plane")
def control_plane(fleet: Fleet, expect: dict[str, Any], gate_id: str) -> Verdict:
    """Cross-host control-plane reach, as one matrix: which host reached which peer's engine port
    (summary ``control_plane.attempts``: each host's ``launch.control-plane`` TCP connects from its
    fabric IP). FAIL names each (source host, peer, port) that timed out or was unreachable (refused
    counts as reached: the peer answered), an asymmetric pair (A reaches B, B cannot reach A: the
    side that drops is named), and launch-env addresses advertised as a wildcard or loopback on any
    host. WARN names the pairs a role requires (coordinator ↔ every rank) that a host never tested
    (the fleet member is not in its peer list). Hosts whose report has no connects are not judged."""
    fip = {h.name: h.fip for h in fleet if h.ok}
    matrix, not_tried, advertised, unjudged = connect_matrix(fleet, owners(fleet))
    down = {(s, d): {p: o for p, o in cells.items() if o not in REACHED}
            for s, row in matrix.items() for d, cells in row.items()}
    down = {k: v for k, v in down.items() if v}
    # a host whose own fabric.link FAILs explains every connection to and from it: that is the root
    link_down = {h.name: str(link.get("summary") or "") for h in fleet
                 if h.ok and isinstance(link := h.summary.get("fabric_link"), dict)
                 and link.get("verdict") == FAIL}
    by_link = {k: v for k, v in down.items() if k[0] in link_down or k[1] in link_down}
    # a host off the fleet's subnet (fleet.fabric-ip) explains the connects to and from it across subnets
    sub = fabric_subnets(fleet)
    by_addr = {k: n for k, n in off_subnet_pairs(sub, down).items() if k not in by_link}
    asym = asymmetric(matrix, down, set(by_link) | set(by_addr))
    roles = {h.name: h.host_role for h in fleet if h.ok}
    untested_pairs, untested_counts = not_tested(matrix, [n for n, r in roles.items() if r == COORDINATOR],
                                                 [n for n, r in roles.items() if r != COORDINATOR], fip, MAX_NAMED)
    facts: dict[str, Any] = {
        "matrix": {s: {d: {str(p): o for p, o in sorted(cells.items())} for d, cells in row.items()}
                   for s, row in matrix.items()},
        "unreachable": [{"source": s, "peer": d, "peer_ip": fip.get(d) or d, "port": p, "outcome": o}
                        for (s, d), cells in down.items() for p, o in sorted(cells.items())],
        "asymmetric": asym, "not_tested": untested_pairs,  # at most MAX_NAMED peers a host; counts beside
        "not_tested_count": untested_counts,
        "link_down": link_down,
        "explained_by_link_down": [{"source": s, "peer": d} for (s, d) in by_link],
        "explained_by_address": [{"source": s, "peer": d, "off_subnet": n} for (s, d), n in by_addr.items()],
        "not_tried": {n: sorted(v) for n, v in not_tried.items()},
        "advertised_bad": advertised, "hosts_not_judged": unjudged, "not_judged": _not_judged(fleet)}
    tail = (f" ({len(unjudged)} host(s) not judged: {_names([u.split(' (')[0] for u in unjudged])})" if unjudged
            else "") + _tail(fleet)
    if not matrix and not advertised:
        return Verdict(gate_id, SKIP, "no host report holds control-plane connects (launch.control-plane needs "
                       "peers and engine ports)" + tail, remedy("fleet.control-plane.not-tested"), facts)
    fails: list[str] = []
    asym_keys = {(a["cannot_reach_back"], a["reaches"]) for a in asym}
    for (s, d), cells in down.items():
        if (s, d) in asym_keys:
            continue
        why = (f": {s}'s fabric link is down" if s in link_down else
               f": {d}'s fabric link is down" if d in link_down else
               f": {by_addr[(s, d)]} is not on the fleet's subnet {sub.common} (fleet.fabric-ip)" if (s, d) in by_addr
               else "")
        fails.append(f"{s} cannot reach {d} ({fip.get(d) or d}) port {ports_txt(cells)}{why}")
    for a in asym:
        s, d = a["cannot_reach_back"], a["reaches"]
        fails.append(f"asymmetric: {d} reaches {s}, but {s} cannot reach {d} ({fip.get(d) or d}) port "
                     f"{ports_txt(down[(s, d)])}: {d}'s side drops incoming connections")
    for n, bad in advertised.items():
        fails.append(f"{n} advertises " + ", ".join(f"{b.get('key')}={b.get('value')} ({b.get('why')})" for b in bad))
    untested = [f"{s} never tested {_names(ds, untested_counts[s])}" + (
                " (time bound used up)" if set(ds) & not_tried.get(s, set())
                or (len(ds) < untested_counts[s] and not_tried.get(s)) else " (not in its peer list)")
                for s, ds in untested_pairs.items()]
    if fails:
        txt = "; ".join(fails) + (f"; also {'; '.join(untested)}" if untested else "")
        rem, action = control_remedy(gate_id, down, len(by_link) + len(by_addr),
                                      root_fixes(by_link, link_down, _names(sorted(set(by_addr.values()))),
                                                 len(set(by_addr.values())), sub.common),
                                      "FIX_LINK" if by_link else "FIX_ADDRESS", asym, advertised, fip)
        return Verdict(gate_id, FAIL, txt + tail, rem, facts, action=action)
    n_att = sum(len(c) for row in matrix.values() for c in row.values())
    n_ref = sum(1 for row in matrix.values() for c in row.values() for o in c.values() if o == "refused")
    if untested:
        return Verdict(gate_id, WARN,
                       "; ".join(untested) + f": not tested ({n_att} connection(s) tested reached)" + tail,
                       remedy("fleet.control-plane.not-tested"), facts)
    note = f", {n_ref} refused (the peer answered, nothing listens yet: start order)" if n_ref else ""
    return Verdict(gate_id, PASS, f"{n_att} control connection(s) between {len(matrix)} host(s) and their peers reached"
                   f"{note}" + tail, "nothing to do", facts)


GATES = declared(__name__) + fleet_known_bad.GATES + fleet_nccl.GATES + fleet_engine.GATES  # each in its own module


def run_fleet_gates(fleet: Fleet, expect: dict[str, Any] | None = None) -> list[Verdict]:
    """Run every fleet gate over ``fleet``; a gate that raises gives ERROR, never a traceback.

    ``expect``: the inventory's fleet-wide expectations (``capacity``, ``gid_index``, ``mtu``)."""
    out: list[Verdict] = []
    for gate_id, fn in GATES:
        try:
            out.append(fn(fleet, expect or {}))
        except Exception as e:  # noqa: BLE001 - one broken gate must not hide the others
            out.append(Verdict(gate_id, ERROR, f"{gate_id}: gate failed on these reports ({type(e).__name__}: {e})",
                               "report this as an afddiag bug with the per-host reports attached"))
    fill_actions(out)  # every remedy carries its typed action
    return out
