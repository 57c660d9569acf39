"""GPU gates: presence, SM count vs the image, memory, clocks event reasons, slow state."""

from __future__ import annotations

import re
from typing import Any

from afddiag.catalog import commands, remedy
from afddiag.expect import SM_LABEL  # noqa: F401 - image label holding the exported SM count
from afddiag.gates import PROBE_FAILED_REMEDY, Context, declared, gate, probe_failed
from afddiag.gates.gpu_load import (
    BASELINE_IGNORED_REMEDY,
    BUSY_REMEDY,
    EXPLAINED_REMEDY,
    FAIL_BITS,
    POWER_LIMITED_REMEDY,
    WARN_BITS,
    SlowSeen,
    gpu_label,
    mig_instance,
    own_pids,
    reason_names,
    slow_device,
)
from afddiag.gates.gpu_memory import display_only, display_remedy, shm_holders_text
from afddiag.gates.gpu_xid import (  # noqa: F401 - the Xid tables, importable from here
    ACTION_RANK,
    EARLIER_BOOT,
    EARLIER_BOOT_REMEDY,
    REMAP_FAILED_REMEDY,
    XID_APP,
    XID_FATAL,
    XID_UNKNOWN,
    judge_xids,
    this_boot,
    xid_judgment,
)
from afddiag.model import to_jsonable
from afddiag.model.found import GpuBusy
from afddiag.model.gpu import (
    GpuDevice,
    GpuFacts,
    is_own_process,
)
from afddiag.textnum import digits
from afddiag.verdict import ERROR, FAIL, PASS, SKIP, WARN, Verdict

_PCI_RE = re.compile(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?$")


def pci_key(text: object) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address as an Xid line prints it (``0000:3b:00``) or NVML's
    busId (``00000000:3B:00.0``); None when it does not parse."""
    m = _PCI_RE.search(str(text or "").strip())
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)) if m else None


def lost_gpus(g: GpuFacts) -> tuple[set[int], str]:
    """The GPUs that fell off the bus: devices NVML gave no readings for (their handle failed:
    NVML_ERROR_GPU_IS_LOST, "Unable to determine the device handle") on a host whose kernel log has
    an Xid 79 (GPU has fallen off the bus) on a PCI address no readable GPU has. Returns
    ``({device index}, words)``, ``(set(), "")`` when there are none. gpu.errors FAILs on that Xid
    (REBOOT); what other gates cannot read on these devices is that one fault's symptom. Pure."""
    unread = {d.index for d in g.devices if not d.nvml_read}
    if not unread:
        return set(), ""
    readable = {pci_key(d.pci_bus_id) for d in g.devices if d.nvml_read} - {None}
    xid79 = [e for e in this_boot(g.xid_events) if str(e.get("xid")).strip() == "79"
             and pci_key(e.get("pci")) not in readable]
    if not xid79:
        return set(), ""
    where = ", ".join(sorted({str(e.get("pci") or "an unnamed GPU") for e in xid79}))
    return unread, (f"Xid 79, GPU has fallen off the bus on {where}: GPU "
                    f"{', '.join(str(i) for i in sorted(unread))} not readable by NVML")


def _lost_not_judged(gate_id: str, why: str, judged: str, facts: dict) -> Verdict:
    """SKIP pointing at gpu.errors for a gate whose only gap is a GPU that fell off the bus (the
    diagnosis lists it under gpu.errors' root: one fault, one remedy); ``judged``: what the gate
    found on the readable GPUs."""
    return Verdict(gate_id, SKIP,
                   f"not judged: gpu.errors failed ({why})" + (f"; readable: {judged}" if judged else ""),
                   "fix gpu.errors first (see its remedy), then re-run", {**facts, "lost": why})


NOT_RECORDED_REMEDY = ("nothing to judge on this replay: capture the host with this afddiag (`afddiag capture`) "
                       "or run on the host to judge it")


def read_failures(g: GpuFacts, d: GpuDevice, calls: tuple[str, ...]) -> list[str]:
    """The probe's notes (the host's and ``d``'s, as a capture records them) saying one of ``calls``
    (NVML/CUDA function names, ``libcuda``) failed, on ``d`` or on no device in particular: the
    evidence that a figure was unreadable on the host, not merely left out of a snapshot. Pure."""
    out = []
    for n in [*(g.notes or []), *(d.notes or [])]:
        names_dev = "device " in n
        if any(c in n for c in calls) and (not names_dev or f"device {d.index}" in n):
            out.append(n)
    cuda_why = (g.cuda_view or {}).get("why") if isinstance(g.cuda_view, dict) else None
    if isinstance(cuda_why, str) and any(c in cuda_why for c in calls):
        out.append(cuda_why)
    return list(dict.fromkeys(out))


def missing_figure(ctx: Context, d: GpuDevice, what: str, calls: tuple[str, ...], live: Verdict) -> Verdict:
    """A figure ``what`` of ``d`` that is None: ``live`` (the gate's WARN about an unreadable reading and
    its remedy for the host) on a live run, or on a replay whose capture notes that one of ``calls``
    failed (quoted); on a replay without such a note the figure was simply not recorded: SKIP "not
    recorded in the snapshot", not a claim about the live driver. Pure."""
    if not (ctx.obs.source or "").startswith("snapshot"):
        return live
    why = read_failures(ctx.obs.gpu, d, calls) if ctx.obs.gpu is not None else []
    if why:
        live.summary += f" (the capture says: {'; '.join(why[:2])})"
        return live
    return Verdict(live.id, SKIP, f"{gpu_label(d)}: {what} not recorded in the snapshot"
                   + (f", {live.summary.split(', ', 1)[1]}" if ", cannot check" in live.summary else ""),
                   NOT_RECORDED_REMEDY, live.facts)


def _need_gpu(ctx: Context, gate_id: str) -> GpuFacts | Verdict:
    """The GPU facts a gate judges (captured, a GPU listed), else the SKIP/ERROR Verdict to return
    (a gate's preamble: ``g = _need_gpu(...)``; ``if isinstance(g, Verdict): return g``)."""
    g = ctx.obs.gpu
    if (v := probe_failed(gate_id, g)) is not None:
        return v
    if g is None or not g.captured:
        return Verdict(gate_id, SKIP, (g.why if g and g.why else "GPU not probed"), remedy("snapshot.gpu"),
                       commands=commands("snapshot.gpu"))
    if not g.devices:
        reason = g.why or "no devices"
        reason = reason if reason.lower().startswith("no ") else f"no GPU seen: {reason}"
        why = reason if gate_id == "gpu.present" else "no GPU seen (gpu.present says why)"
        return Verdict(gate_id, SKIP, why, remedy("gpu.present"))
    return g


def xid_faults_without_gpu(g: GpuFacts | None) -> list[str]:
    """On a host where NVML and CUDA list no GPU, the kernel log's Xids that FAIL by
    :func:`xid_judgment` (a GPU fallen off the bus, Xid 79; a reset or node reboot the driver asks
    for, Xid 154; NVIDIA's catalog's fatal Xids), in words: a GPU in that state is one NVML does not
    list, so the Xid, not a missing driver, is the root. [] when a GPU is listed or no such Xid is
    there. Pure."""
    if g is None or not g.captured or g.devices or not g.xid_events:
        return []
    return list(dict.fromkeys(w for v, w, _ in (xid_judgment(e) for e in this_boot(g.xid_events)) if v == FAIL))


@gate("gpu.present")
def present(ctx: Context, gate_id: str) -> Verdict:
    if isinstance(v := _need_gpu(ctx, gate_id), Verdict):
        if v.verdict == SKIP and (xids := xid_faults_without_gpu(ctx.obs.gpu)):
            # the GPU fell off the bus (or needs a reset/reboot): gpu.errors names that root once;
            # "install the driver" would send the operator after the wrong fault
            return Verdict(gate_id, SKIP, f"not judged: gpu.errors failed ({'; '.join(xids)}): NVML lists no GPU "
                           f"({v.summary}), as it does not list a GPU in that state",
                           "fix gpu.errors first (see its remedy), then re-run", {"xid_faults": xids, "why": v.summary})
        if v.verdict == SKIP and ctx.requires("gpu"):  # absent or not looked at: the role cannot pass
            v.verdict = FAIL
            v.summary += f"; role {ctx.playbook.name} requires a GPU"
            g = ctx.obs.gpu
            v.action = "INSTALL" if g is not None and g.captured else "RERUN"  # not looked at: nothing to fix
        return v
    g = v
    model = ctx.playbook.gpu_model
    wrong = [d for d in g.devices if model and model.lower() not in (d.name or "").lower()]
    if wrong:
        # another model than the role's: the operator's --role (or the playbook) is wrong, not the driver
        return Verdict(gate_id, FAIL, f"{gpu_label(wrong[0])}: role {ctx.playbook.name} expects a {model}",
                       remedy(gate_id + ".role"),
                       {"devices": [to_jsonable(d) for d in g.devices], "expected_model": model}, action="SET_ENV")
    devs = [to_jsonable(d) for d in g.devices]
    cuda_read = (g.cuda_view or {}).get("read") is not False  # False: not asked (nothing needed it), not unread
    names = "; ".join(
        f"{gpu_label(d)} ("
        + (f"{d.sm_count} SMs, " if d.sm_count is not None else ("? SMs, " if cuda_read else ""))
        + f"cc {'.'.join(map(str, d.compute_capability)) if d.compute_capability else '?'})" for d in g.devices)
    return Verdict(gate_id, PASS, f"{len(g.devices)} GPU(s): {names}; driver {g.driver_version or '?'}",
                   "nothing to do",
                   {"devices": devs, "driver_version": g.driver_version, "cuda_driver_version": g.cuda_driver_version,
                    "versions": g.versions, "notes": g.notes})


ARCH_LABEL = "afd.cuda_arch_list"  # image label; else the image's TORCH_CUDA_ARCH_LIST


def expected_sm(ctx: Context) -> tuple[int | None, str]:
    """The image's exported SM count and where it came from (``ctx.expect.sm_count``:
    :mod:`afddiag.expect` gives the precedence)."""
    e = ctx.expect.sm_count
    return (e.value, e.source) if e is not None else (None, "")


@gate("gpu.sm-count")
def sm_count(ctx: Context, gate_id: str) -> Verdict:
    if isinstance(v := _need_gpu(ctx, gate_id), Verdict):
        want, src = expected_sm(ctx)
        g = ctx.obs.gpu
        if (v.verdict == SKIP and want is not None and g is not None and g.captured and not g.devices
                and not ctx.requires("gpu") and not xid_faults_without_gpu(g)):
            # an expectation the operator named that nothing could check is no pass (a role that requires
            # the GPU already FAILs gpu.present; a fatal Xid is gpu.errors')
            return Verdict(gate_id, WARN, f"the image is expected to run on {want} SMs ({src}), but no GPU is seen "
                           f"({g.why or 'none listed'}): nothing to check it against",
                           "run on the GPU host, or see gpu.present for why no GPU is listed",
                           {"expected": want, "expected_from": src}, action="RERUN")
        return v
    g = v
    want, src = expected_sm(ctx)
    have = {d.index: d.sm_count for d in g.devices}
    facts: dict[str, Any] = {"expected": want, "expected_from": src if want is not None else None, "sm_count": have}
    if want is None:
        return Verdict(gate_id, SKIP, "no expected SM count (the image's export): give --expect-sm N",
                       "pass --expect-sm with the SM count the image's kernels were exported for", facts)
    lost, lost_why = lost_gpus(g)
    devs = [d for d in g.devices if d.index not in lost]
    unknown = [d for d in devs if d.sm_count is None]
    wrong = [d for d in devs if d.sm_count is not None and d.sm_count != want]
    if wrong:
        d = wrong[0]
        mig = mig_instance(d)
        # the partition is the cause: a slice of a GPU, not another model
        if mig and d.sm_count is not None and d.sm_count < want:
            facts["mig_instance"] = {"device": d.index, "profile": mig, "sm_count": d.sm_count}
            return Verdict(gate_id, FAIL, f"{gpu_label(d)}: a MIG instance ({mig}, {d.sm_count} SMs), "
                           "the image was exported "
                           f"for {want} SMs: MIG mode partitions this GPU",
                           remedy("gpu.sm-count.mig").format(gpu=d.index), facts, action="RESET_GPU",
                           commands=commands("gpu.sm-count.mig", gpu=d.index))
        return Verdict(gate_id, FAIL, f"{gpu_label(d)}: image built for {want} SMs, this GPU has {d.sm_count}",
                       remedy(gate_id).format(have=d.sm_count), facts)
    if unknown:
        return missing_figure(ctx, unknown[0], "SM count",
                              ("cuDeviceGetAttribute", "libcuda", "cuInit", "cuDeviceGet("),
                              Verdict(gate_id, WARN,
                                      f"{gpu_label(unknown[0])}: SM count could not be read (CUDA attribute 16)",
                                      "check that libcuda.so.1 loads (driver installed, /dev/nvidia* visible)", facts))
    if lost:
        return _lost_not_judged(gate_id, lost_why, f"{len(devs)} GPU(s) with {want} SMs" if devs else "", facts)
    return Verdict(gate_id, PASS, f"{len(g.devices)} GPU(s) have {want} SMs, as the image expects ({src})",
                   "nothing to do", facts)


@gate("gpu.memory")
def memory(ctx: Context, gate_id: str) -> Verdict:
    g = _need_gpu(ctx, gate_id)
    if isinstance(g, Verdict):
        return g
    facts: dict[str, Any] = {str(d.index): {"total_bytes": d.memory_total_bytes, "free_bytes": d.memory_free_bytes,
                            "used_bytes": d.memory_used_bytes, "source": d.memory_source, "unified": d.unified}
             for d in g.devices}
    lost, lost_why = lost_gpus(g)
    devs = [d for d in g.devices if d.index not in lost]
    # a MIG instance CUDA lists has no NVML reading of its own: NVML reads its whole GPU, judged here
    slices = [d for d in devs if mig_instance(d) and not d.nvml_read]
    if slices:
        facts["mig_instances_judged_through_their_gpu"] = [d.index for d in slices]
        devs = [d for d in devs if d not in slices]
    missing = [d for d in devs if not d.memory_total_bytes]
    if missing:
        d = missing[0]
        return missing_figure(ctx, d, "total memory", ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetHandleByIndex"),
                              Verdict(gate_id, WARN, f"{gpu_label(d)}: total memory not read "
                                      f"({'; '.join(d.notes) or 'no reading'})", remedy(gate_id), facts))
    pb = ctx.playbook
    sized = [(d, total) for d in devs if (total := d.memory_total_bytes)]  # every one of devs, after `missing`
    for d, total in sized:
        if pb.min_memory_bytes and total < pb.min_memory_bytes:
            return Verdict(gate_id, FAIL, f"{gpu_label(d)}: {total / 2**30:.1f} GiB, role {pb.name} needs "
                           f"{pb.min_memory_bytes / 1e9:.0f} GB", "run this role on a GPU with enough memory", facts)
        if pb.reserve_fraction and not d.unified:
            need = pb.reserve_fraction * total
            if d.memory_free_bytes is None:
                return missing_figure(ctx, d, "free memory", ("nvmlDeviceGetMemoryInfo",),
                                      Verdict(gate_id, WARN, f"{gpu_label(d)}: free memory not read, cannot check the "
                                              f"{pb.reserve_fraction:.0%} reservation", remedy(gate_id), facts))
            if d.memory_free_bytes < need:
                txt = (f"{gpu_label(d)}: {d.memory_free_bytes / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB; a "
                       f"{pb.reserve_fraction:.0%} reservation needs {need / 2**30:.2f} GiB")
                if shown := display_only(d, g):  # gpu.processes passes these: no process to stop
                    return Verdict(gate_id, FAIL, txt + ": a display server holds the rest (no compute tenant)",
                                   display_remedy(shown, d.memory_free_bytes, total), facts, action="SET_ENV")
                return Verdict(gate_id, FAIL, txt, "stop the other processes holding GPU memory "
                               "(`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`)", facts)
    parts = [f"{gpu_label(d)}: {total / 2**30:.1f} GiB ({d.memory_source})" for d, total in sized]
    if lost:
        return _lost_not_judged(gate_id, lost_why, "; ".join(parts), facts)
    return Verdict(gate_id, PASS, "; ".join(parts), "nothing to do", facts)


@gate("gpu.clock-events")
def clock_events(ctx: Context, gate_id: str) -> Verdict:
    g = _need_gpu(ctx, gate_id)
    if isinstance(g, Verdict):
        return g
    worst, lines, facts = PASS, [], {}
    unread: list[GpuDevice] = []
    lost, lost_why = lost_gpus(g)
    for d in g.devices:
        if d.index in lost:  # no reading is no "no reason bit"
            continue
        if (d.clocks_event_reasons is None and (d.under_load is None or d.under_load.clocks_event_reasons is None)
                and not d.clocks_event_reason_counters_us):
            unread.append(d)  # no mask read: no evidence either way, never "no reason"
            continue
        idle = d.clocks_event_reasons or 0
        load = (d.under_load.clocks_event_reasons or 0) if d.under_load else 0
        mask = idle | load
        counters = d.clocks_event_reason_counters_us or {}
        facts[str(d.index)] = {"idle_mask": hex(idle), "under_load_mask": hex(load), "names": reason_names(mask),
                               "counters_us": counters}
        if mask & FAIL_BITS:
            worst = FAIL
            lines.append(f"{gpu_label(d)}: {', '.join(reason_names(mask & FAIL_BITS))} active")
        elif mask & WARN_BITS:
            worst = FAIL if worst == FAIL else WARN
            lines.append(f"{gpu_label(d)}: sw_thermal_slowdown active"
                         + (f" (temperature {d.temperature_c:g} C)" if d.temperature_c is not None else ""))
        else:
            hw = {k: v for k, v in counters.items() if k.startswith("hw_") and isinstance(v, int) and v > 0}
            th = counters.get("sw_thermal_slowdown")
            if hw or (isinstance(th, int) and th > 0):
                worst = FAIL if worst == FAIL else WARN
                spent = {**hw, **({"sw_thermal_slowdown": th} if th else {})}
                lines.append(f"{gpu_label(d)}: no bit now, but has spent time in " +
                             ", ".join(f"{k} {v / 1e6:.2f} s" for k, v in spent.items()))
    if worst == PASS and unread and len(unread) + len(lost) == len(g.devices) and not lost:
        d = unread[0]
        return missing_figure(ctx, d, "clock event reasons", CLOCK_EVENT_CALLS,
                              Verdict(gate_id, SKIP, f"{gpu_label(d)}: clock event reasons not read "
                                      f"({'; '.join(read_failures(g, d, CLOCK_EVENT_CALLS)) or 'no reading'})",
                                      "check NVML on the host: `nvidia-smi -q -d PERFORMANCE`", facts))
    judged = len(g.devices) - len(lost) - len(unread)
    if worst == PASS and lost:
        return _lost_not_judged(gate_id, lost_why, f"{len(g.devices) - len(lost)} GPU(s) without a thermal, "
                                "HW slowdown "
                                "or power-brake reason" if len(lost) < len(g.devices) else "", facts)
    if worst == PASS:
        seen = sorted({n for f in facts.values() for n in f["names"]})
        return Verdict(gate_id, PASS, f"{judged} GPU(s): no thermal, HW slowdown or power-brake reason"
                       + (f" (seen: {', '.join(seen)}, not faults)" if seen else "")
                       + (f"; reasons not read on {', '.join(gpu_label(d) for d in unread)}" if unread else ""),
                       "nothing to do", facts)
    return Verdict(gate_id, worst, "; ".join(lines), remedy(gate_id + (".hw" if worst == FAIL else ".thermal")), facts)


CLOCK_EVENT_CALLS = ("ClocksEventReasons", "ClocksThrottleReasons")  # NVML's names for the reasons' reads


def _load_named(ctx: Context) -> str | None:
    """Who asked for the load probe (``--load``, or the playbook's ``load_probe``), None when nobody did."""
    if ctx.inputs.load:
        return "--load"
    pb = ctx.inputs.playbook
    return f"role {pb.name}'s load_probe" if pb is not None and pb.load_probe else None


@gate("gpu.slow-state")
def slow_state(ctx: Context, gate_id: str) -> Verdict:
    g = _need_gpu(ctx, gate_id)
    if isinstance(g, Verdict):
        gpu = ctx.obs.gpu
        if (g.verdict == SKIP and (named := _load_named(ctx)) and gpu is not None and gpu.captured
                and not gpu.devices and not ctx.requires("gpu") and not xid_faults_without_gpu(gpu)):
            # the load run the operator asked for checked nothing: no pass (as gpu.sm-count with --expect-sm;
            # a role that requires the GPU already FAILs gpu.present, a fatal Xid is gpu.errors')
            return Verdict(gate_id, WARN, f"the load probe was asked for by {named}, but no GPU is seen: nothing "
                           "was loaded or measured (gpu.present says why)",
                           "run on the GPU host, or see gpu.present for why no GPU is listed",
                           {"load_asked_by": named}, action="RERUN")
        return g
    if g.load_failed:
        return Verdict(gate_id, ERROR, f"not judged: {g.load_failed}", PROBE_FAILED_REMEDY,
                       {"probe_failed": g.load_failed})
    facts: dict = {"host_baseline": (ctx.obs.baseline or {}).get("path") or ctx.obs.baseline_why or None,
                   "versions": {"driver": g.driver_version, "cuda_driver": g.cuda_driver_version, **(g.versions or {})}}
    seen = SlowSeen()
    verdicts = [line for d in g.devices for line in slow_device(ctx, d, g, facts, seen)]
    order = [FAIL, WARN, PASS, SKIP]
    worst = min((v for v, _ in verdicts), key=order.index)
    summary = "; ".join(s for v, s in verdicts if v == worst)
    rem = {FAIL: remedy(gate_id), WARN: BASELINE_IGNORED_REMEDY if seen.ignored else BUSY_REMEDY if seen.busy else
           EXPLAINED_REMEDY if seen.explained else
           POWER_LIMITED_REMEDY if seen.power else
           "run the load probe (`afddiag gpu --load`) on an otherwise idle GPU",
           PASS: "nothing to do", SKIP: "run the load probe: `afddiag gpu --load`"}[worst]
    return Verdict(gate_id, worst, summary, rem, facts, found=GpuBusy(bool(seen.busy)))


def parse_arch_list(text: str) -> list[tuple[int, int, str, bool]]:
    """A CUDA arch list (``TORCH_CUDA_ARCH_LIST`` "8.0 9.0a 12.0+PTX", ``sm_120a``, ``compute_90``,
    ``120``) → ``[(major, minor, suffix, is_ptx)]``; unparseable tokens are skipped."""
    out = []
    for tok in text.replace(";", " ").replace(",", " ").split():
        t = tok.strip().lower()
        ptx = t.endswith("+ptx") or t.startswith("compute_")
        t = t.removesuffix("+ptx").removeprefix("sm_").removeprefix("compute_")
        suffix = t[-1] if t and t[-1] in "af" else ""
        t = t.rstrip("af")
        if "." in t:
            maj, _, mnr = t.partition(".")
        elif digits(t) and len(t) >= 2:
            maj, mnr = t[:-1], t[-1]
        else:
            continue
        if digits(maj) and digits(mnr):
            out.append((int(maj), int(mnr), suffix, ptx))
    return out


def _cuda_needed(img) -> tuple[int, int] | None:
    """The CUDA version an image needs: NVIDIA_REQUIRE_CUDA "cuda>=12.8 ..." else CUDA_VERSION "12.8.1"."""
    m = re.search(r"cuda>=(\d+)\.(\d+)", img.env.get("NVIDIA_REQUIRE_CUDA", ""))
    if not m:
        m = re.match(r"(\d+)\.(\d+)", img.env.get("CUDA_VERSION", ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


@gate("gpu.image-arch")
def image_arch(ctx: Context, gate_id: str) -> Verdict:
    g = _need_gpu(ctx, gate_id)
    if isinstance(g, Verdict):
        return g
    img = ctx.obs.image
    le = ctx.inputs.launch_env or {}
    if (v := probe_failed(gate_id, img)) is not None:
        return v
    if img is None or img.why:
        why = img.why if img and img.why else ("no AFD_IMAGE in the launch env" if le or ctx.inputs.launch_env_path
                                               else "no image given (--launch-env with AFD_IMAGE)")
        return Verdict(gate_id, SKIP, f"image not inspected: {why}", "give the launch env's AFD_IMAGE on a host with "
                       "docker or podman, or a capture of that host (`afddiag capture`)")
    arch_text = img.labels.get(ARCH_LABEL) or img.env.get("TORCH_CUDA_ARCH_LIST", "")
    archs = parse_arch_list(arch_text)
    need = _cuda_needed(img)
    drv = g.cuda_driver_version
    have = (drv // 1000, (drv % 1000) // 10) if isinstance(drv, int) and drv > 0 else None
    facts = {"image": img.ref, "arch_list": arch_text, "cuda_needed": need, "driver_cuda": have,
             "compute_capability": {str(d.index): d.compute_capability for d in g.devices}}
    fails, warns = [], []
    if need and have and have < need:
        fails.append(f"the driver supports CUDA {have[0]}.{have[1]}, image {img.ref} needs {need[0]}.{need[1]}")
    for d in g.devices:
        cc = d.compute_capability
        if not archs or cc is None:
            continue
        sm = f"sm_{cc[0]}{cc[1]}"
        built = ", ".join(f"sm_{a}{b}{s}{'+PTX' if p else ''}" for a, b, s, p in archs)
        if any((a, b) == cc and not p for a, b, s, p in archs):
            continue
        plain_lower = [(a, b) for a, b, s, p in archs if not p and not s and a == cc[0] and b < cc[1]]
        ptx_ok = [(a, b) for a, b, s, p in archs if p and (a, b) <= cc]
        if plain_lower:
            warns.append(f"{gpu_label(d)} is {sm}; image built for {built}: runs by binary compatibility, but "
                         f"arch-specific kernels will not load")
        elif ptx_ok:
            warns.append(f"{gpu_label(d)} is {sm}; image has only PTX for it ({built}): JIT-compiled at start")
        else:
            fails.append(f"{gpu_label(d)} is {sm}; image {img.ref} built for {built}: no kernel image for this GPU")
    if not archs and not need:
        return Verdict(gate_id, SKIP, f"image {img.ref}: no arch list ({ARCH_LABEL} label or TORCH_CUDA_ARCH_LIST) and "
                       "no CUDA requirement (NVIDIA_REQUIRE_CUDA, CUDA_VERSION)", "label the image with its arch list",
                       facts)
    if fails:
        return Verdict(gate_id, FAIL, "; ".join(fails), remedy(gate_id), facts)
    if warns:
        return Verdict(gate_id, WARN, "; ".join(warns), remedy(gate_id), facts)
    return Verdict(gate_id, PASS, f"image {img.ref} has kernels for "
                   + ", ".join(f"sm_{d.compute_capability[0]}{d.compute_capability[1]}" for d in g.devices
                               if d.compute_capability)
                   + (f"; needs CUDA {need[0]}.{need[1]}, driver has {have[0]}.{have[1]}" if need and have else ""),
                   "nothing to do", facts)


# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing Xid Errors with the Xid Catalog"):
@gate("gpu.errors")
def errors(ctx: Context, gate_id: str) -> Verdict:
    g = _need_gpu(ctx, gate_id)
    if isinstance(g, Verdict):
        if ctx.obs.gpu is None or not xid_faults_without_gpu(ctx.obs.gpu):
            return g  # no GPU listed and no Xid that explains it: nothing to judge (a listed GPU's Xids are below)
        g = ctx.obs.gpu
    if g.xid_events is None and all(d.ecc is None and d.retired_pages is None and d.remapped_rows is None
                                    for d in g.devices):
        return Verdict(gate_id, SKIP, "no ECC, retirement, remapping or kernel-log readings (not captured"
                       + (f"; kernel log {g.xid_source}" if g.xid_source else "") + ")",
                       "run on the host (as root for the kernel log)")
    fails: list[str] = []
    warns: list[str] = []
    facts: dict[str, Any] = {"xid_source": g.xid_source, "xid_events": g.xid_events}
    service: list[str] = []  # GPUs whose row remapping failed: service (RMA), not a reset
    for d in g.devices:
        label = gpu_label(d)
        f = facts[str(d.index)] = {"ecc": d.ecc, "retired_pages": d.retired_pages, "remapped_rows": d.remapped_rows}
        if isinstance(d.ecc, dict):
            vol = d.ecc.get("volatile") or {}
            agg = d.ecc.get("aggregate") or {}
            if (vol.get("uncorrected") or 0) > 0:
                fails.append(f"{label}: {vol['uncorrected']} uncorrected ECC error(s) since the last driver load")
            elif (agg.get("uncorrected") or 0) > 0:
                warns.append(f"{label}: {agg['uncorrected']} uncorrected ECC error(s) over its lifetime")
        if isinstance(d.remapped_rows, dict):
            rr = d.remapped_rows
            if rr.get("failure"):
                fails.append(f"{label}: row remapping failed (no spare rows)")
                service.append(label)
            elif rr.get("pending"):
                fails.append(f"{label}: row remapping pending: the GPU needs a reset")
            elif (rr.get("uncorrectable") or 0) > 0:
                warns.append(f"{label}: {rr['uncorrectable']} rows remapped for uncorrectable errors")
        if isinstance(d.retired_pages, dict) and d.retired_pages.get("pending"):
            fails.append(f"{label}: page retirement pending: the GPU needs a reset")
        f["not_supported"] = [k for k in ("ecc", "retired_pages", "remapped_rows") if getattr(d, k) == "NOT_SUPPORTED"]
    xid_actions: list[str] = ["HW_INSPECTION"] if service else []  # a remap failure is service, whatever the Xids
    driver_said, unknown_xid, earlier = judge_xids(g.xid_events, fails, warns, xid_actions)
    if earlier:
        facts["xid_earlier_boots"] = earlier
    facts["xid_actions"] = xid_actions
    if fails:
        act = max(xid_actions, key=lambda a: ACTION_RANK.get(a, 0)) if xid_actions else "RESET_GPU"
        rem = {"REBOOT": "drain the node and reboot it ("
                         + ("the driver says the GPU needs a node reboot" if "REBOOT" in driver_said
                            else f"Xid 79: {XID_FATAL[79][0]}, NVIDIA's Xid catalog resolves it with a node reboot")
                         + "); a repeating Xid 79 or a second occurrence means service (RMA)",
               "RESET_GPU": remedy(gate_id), "HW_INSPECTION": REMAP_FAILED_REMEDY}[act]
        return Verdict(gate_id, FAIL, "; ".join(dict.fromkeys(fails)), rem, facts, action=act)
    if warns:
        rem = ("application-caused or contained: restart the application that hit it (its log names the "
               "pid); if the same Xid repeats with other applications, drain the host and reset the GPU")
        if all(EARLIER_BOOT in w for w in warns):
            rem = EARLIER_BOOT_REMEDY
        if unknown_xid:
            rem = (f"{XID_UNKNOWN}: look it up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) "
                   "before acting" + ("; for the others: " + rem if any(XID_UNKNOWN not in w for w in warns) else ""))
        return Verdict(gate_id, WARN, "; ".join(dict.fromkeys(warns)), rem, facts, action="NONE")
    xid = (f"no Xid from this boot in the kernel log ({earlier} from earlier boots)" if earlier
           else "no Xid in the kernel log" if g.xid_events is not None
           else f"kernel log not read ({g.xid_source or 'not captured'})")
    na = sorted({k for d in g.devices for k in facts[str(d.index)]["not_supported"]})
    return Verdict(gate_id, PASS, f"{len(g.devices)} GPU(s): no uncorrected ECC, no pending retirement or remap; {xid}"
                   + (f" ({', '.join(na)} N/A on this GPU: not a fault)" if na else ""), "nothing to do", facts)


@gate("gpu.processes")
def processes(ctx: Context, gate_id: str) -> Verdict:
    g = _need_gpu(ctx, gate_id)
    if isinstance(g, Verdict):
        return g
    others, unknown, mine, shown = [], [], [], []
    facts: dict[str, Any] = {}
    for d in g.devices:
        facts[str(d.index)] = d.processes
        if isinstance(d.processes, list):
            own = own_pids(d, g)  # afddiag's own CUDA context is not another tenant: it exits before launch
            for p in d.processes:
                if not isinstance(p, dict):
                    continue
                if is_own_process(p, own):
                    mine.append(p.get("pid"))
                elif p.get("type") == "graphics":  # a display server: its memory is in the free figure
                    shown.append((d, p))
                else:
                    others.append((d, p))
        else:
            unknown.append(d)
    if mine:
        facts["own_pids_left_out"] = sorted({p for p in mine if isinstance(p, int)})

    def listed(pairs: list) -> str:
        return "; ".join(f"{gpu_label(d)}: pid {p.get('pid')} {p.get('name') or '?'}"
                         + (f" {p['used_bytes'] / 2**30:.2f} GiB" if isinstance(p.get("used_bytes"), int) else "")
                         for d, p in pairs)

    if shown:
        facts["graphics"] = [{"device": d.index, **p} for d, p in shown]
    if others:
        names = listed(others)
        pb = ctx.playbook
        reserve = pb.reserve_fraction or pb.reserve_bytes  # a role that reserves memory, by fraction or bytes
        verdict = FAIL if reserve else WARN
        why = ("" if not reserve else f" (a {pb.reserve_fraction:.0%} memory reservation will fail)"
               if pb.reserve_fraction else f" (the {pb.reserve_bytes / 2**30:.1f} GiB reservation of role {pb.name} "
               "may not fit)")
        return Verdict(gate_id, verdict, f"other processes hold GPU memory{why}: {names}", remedy(gate_id), facts)
    if unknown and len(unknown) == len(g.devices):
        return Verdict(gate_id, SKIP, "GPU process list not read (" + ", ".join(
            f"{gpu_label(d)}: {d.processes or 'not captured'}" for d in unknown) + ")",
            "run on the host as a user NVML may ask (root in containers)", facts)
    return Verdict(gate_id, PASS, f"{len(g.devices) - len(unknown)} GPU(s): no other compute process holds GPU memory"
                   + (" (afddiag's own context left out: pid " + ", ".join(str(p) for p in mine) + ")" if mine else "")
                   + (f"; graphics (display server) processes, not tenants: {listed(shown)} (their memory is in the "
                      "free figure gpu.memory and gpu.headroom judge)" if shown else ""),
                   "nothing to do", facts)


GIB = 2**30


def judge_unified_headroom(label: str, meminfo_kb: dict | None, need_bytes: int,
                           plan: str) -> tuple[str, str, dict]:
    """Judge unified memory (GB10) against a planned reservation: ``(verdict, summary, facts)``.

    ``meminfo_kb``: ``/proc/meminfo`` lines in kB (``MemFree``, ``MemAvailable``, ``Cached``,
    ``Buffers``); ``need_bytes``: the reservation; ``plan``: where it comes from (words). On unified
    memory the CUDA free figure follows MemFree, so page cache counts as used: FAIL when
    MemAvailable itself is below the reservation (processes hold it), WARN when MemFree is below it
    but MemAvailable covers it (page cache is what is short), PASS when MemFree covers it. A missing
    MemFree (an older capture) is judged on MemAvailable and said so. Pure."""
    def kb(key: str) -> int | None:
        v = (meminfo_kb or {}).get(key)
        return int(v) * 1024 if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    free, avail, cached, buffers = kb("MemFree"), kb("MemAvailable"), kb("Cached"), kb("Buffers")
    facts = {"need_bytes": need_bytes, "plan": plan, "mem_free_bytes": free, "mem_available_bytes": avail,
             "cached_bytes": cached, "buffers_bytes": buffers}
    g = lambda b: f"{b / GIB:.1f} GiB"  # noqa: E731
    if avail is None:
        return WARN, f"{label} (unified memory): MemAvailable not read, cannot check the {g(need_bytes)} {plan}", facts
    if avail < need_bytes:
        return FAIL, (f"{label} (unified memory): MemAvailable {g(avail)} is below the {g(need_bytes)} {plan}"
                      + (f" (MemFree {g(free)}, Cached {g(cached)})" if free is not None and cached is not None else "")
                      + ": processes hold the memory, dropping caches will not free it"), facts
    if free is None:
        return PASS, (f"{label} (unified memory): MemAvailable {g(avail)} covers the {g(need_bytes)} {plan} "
                      "(MemFree not captured: the CUDA free figure, which follows it, was not checked)"), facts
    if free < need_bytes:
        cache = (cached or 0) + (buffers or 0)
        return WARN, (f"{label} (unified memory): MemFree {g(free)} is below the {g(need_bytes)} {plan}; page cache "
                      f"{g(cache)} holds the difference (MemAvailable {g(avail)} covers it): the CUDA free figure "
                      "follows MemFree, so the engine may refuse to start "
                      "(\"free memory ... less than desired\")"), facts
    return PASS, f"{label} (unified memory): MemFree {g(free)} covers the {g(need_bytes)} {plan}", facts


@gate("gpu.headroom")
def headroom(ctx: Context, gate_id: str) -> Verdict:
    g = _need_gpu(ctx, gate_id)
    if isinstance(g, Verdict):
        return g
    pb = ctx.playbook
    results: list[tuple[str, str, dict]] = []
    lost, lost_why = lost_gpus(g)
    for d in g.devices:
        label = gpu_label(d)
        if d.index in lost:
            results.append((SKIP, f"{label}: not read ({lost_why}; gpu.errors)", {}))
            continue
        if d.unified:
            need = pb.reserve_bytes or int(pb.reserve_fraction * (d.memory_total_bytes or 0))
            if not need:
                results.append((SKIP, f"{label}: role {pb.name} plans no reservation ([gpu] reserve_bytes)", {}))
                continue
            plan = (f"reservation of role {pb.name}" if pb.reserve_bytes
                    else f"{pb.reserve_fraction:.0%} reservation of role {pb.name}")
            verdict, text, f = judge_unified_headroom(label, g.host_meminfo_kb, need, plan)
            if verdict == WARN and "MemAvailable not read" in text:
                m = missing_figure(ctx, d, "MemAvailable (/proc/meminfo)", ("meminfo",),
                                   Verdict(gate_id, WARN, text, "", f))
                verdict, text = m.verdict, m.summary
            results.append((verdict, text, f))
        elif pb.reserve_bytes:
            free = d.memory_free_bytes
            reserve: dict[str, Any] = {"need_bytes": pb.reserve_bytes, "nvml_free_bytes": free,
                                       "total_bytes": d.memory_total_bytes}
            if free is None:
                m = missing_figure(ctx, d, "NVML free memory", ("nvmlDeviceGetMemoryInfo",),
                                   Verdict(gate_id, WARN, f"{label}: NVML free memory not read, cannot check the "
                                           f"{pb.reserve_bytes / GIB:.1f} GiB reservation of role {pb.name}", "",
                                           reserve))
                results.append((m.verdict, m.summary, reserve))
            elif free < pb.reserve_bytes:
                shown = display_only(d, g)  # gpu.processes passes these: no process to stop
                if shown:
                    reserve["display_remedy"] = display_remedy(shown, free, d.memory_total_bytes)
                results.append((FAIL, f"{label}: NVML free {free / GIB:.2f} GiB is below the "
                                f"{pb.reserve_bytes / GIB:.2f} GiB reservation of role {pb.name}"
                                + (": a display server holds the rest (no compute tenant)" if shown else ""), reserve))
            else:
                results.append((PASS, f"{label}: NVML free {free / GIB:.2f} GiB covers the "
                                f"{pb.reserve_bytes / GIB:.2f} GiB reservation of role {pb.name}", reserve))
        elif pb.reserve_fraction:
            results.append((SKIP, f"{label}: discrete GPU: gpu.memory judges NVML free memory against the "
                            f"{pb.reserve_fraction:.0%} reservation", {}))
        else:
            results.append((SKIP, f"{label}: role {pb.name} plans no reservation ([gpu] reserve_bytes)", {}))
    order = [FAIL, WARN, PASS, SKIP]
    worst = min((v for v, _, _ in results), key=order.index)
    summary = "; ".join(s for v, s, _ in results if v == worst)
    facts: dict[str, Any] = {str(d.index): f for d, (_, _, f) in zip(g.devices, results, strict=True)}
    facts["host_meminfo_kb"] = g.host_meminfo_kb
    if lost and worst in (PASS, SKIP):  # nothing wrong on the readable GPUs: the lost one is gpu.errors'
        return _lost_not_judged(gate_id, lost_why, summary if worst == PASS else "", facts)
    cache = worst == WARN and any("page cache" in s for v, s, _ in results if v == WARN)
    unrecorded = worst == SKIP and any("not recorded in the snapshot" in s for v, s, _ in results if v == SKIP)
    rem = {FAIL: remedy(gate_id), WARN: remedy(gate_id + ".cache") if cache
           else "read /proc/meminfo and NVML memory on the host (`afddiag gpu`)",
           PASS: "nothing to do", SKIP: NOT_RECORDED_REMEDY if unrecorded else
           "set the role's planned reservation ([gpu] reserve_bytes in its playbook)"}[worst]
    action = "DROP_CACHES" if cache else ("RERUN" if worst == WARN else "")
    cmds = commands(gate_id + ".cache") if cache else []
    fails = [f for v, _, f in results if v == FAIL]
    if fails and all(f.get("display_remedy") for f in fails):  # only a display server short of the plan
        rem, action = "; ".join(dict.fromkeys(f["display_remedy"] for f in fails)), "SET_ENV"
    short = max((f["need_bytes"] - f["mem_available_bytes"] for f in fails if f.get("mem_available_bytes") is not None),
                default=0)  # unified memory: what MemAvailable lacks
    if short > 0 and (found := shm_holders_text(ctx.obs.shm, short, rem)) is not None:
        summary, rem, action, cmds = summary + found[0], found[1], found[2], found[3]
        facts["shm"] = to_jsonable(ctx.obs.shm)
    return Verdict(gate_id, worst, summary, rem, facts, action=action, commands=cmds)


GATES = declared(__name__)
