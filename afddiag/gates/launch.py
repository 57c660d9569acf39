"""Launch gates: what the launcher passes (fabric address, capacity flags) and what the engine's
process needs from the host (locked-memory limit, RDMA device nodes)."""

from __future__ import annotations

from afddiag.catalog import remedy
from afddiag.envvars import FLAG_WORDS
from afddiag.gates import Context, declared, gate, probe_failed
from afddiag.model.found import Advertised, AdvertisedAddress, CapacityFlag
from afddiag.shellcmd import command, export
from afddiag.verdict import FAIL, PASS, SKIP, WARN, Verdict

ENGINE_DEFAULT_CAPACITY = 1024
OTHER_SIDE = {"AFD_PREFILL_CAPACITY": "ranks'", "AFD_EXPERT_CAPACITY": "coordinator's"}
NO_ENV = "no launch env file given (--launch-env FILE)"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _held_fabric_ip(ctx: Context) -> str | None:
    """The run's fabric IP when it is decided (given, or the only IPv4 RoCE v2 address) and a netdev of
    this host holds it: the value AFD_FABRIC_IP should take; None otherwise (the prose lists candidates)."""
    ip, fab = ctx.fabric_ip.ip, ctx.obs.fabric
    if not ip or fab is None or not fab.captured or not any(n.holds_ipv4(ip) for n in fab.netdevs.values()):
        return None
    return ip


@gate("launch.fabric-address")
def fabric_address(ctx: Context, gate_id: str) -> Verdict:
    le = ctx.inputs.launch_env
    if le is None:
        return Verdict(gate_id, SKIP, NO_ENV, "pass the launcher's env file with --launch-env")
    ip = le.get("AFD_FABRIC_IP", "")
    path = ctx.inputs.launch_env_path
    if not ip:
        verdict = FAIL if ctx.playbook.require_fabric_address else WARN
        found = _held_fabric_ip(ctx)
        return Verdict(gate_id, verdict, f"{path}: AFD_FABRIC_IP is not set: the launcher will refuse to start",
                       (f"set AFD_FABRIC_IP in the launch env to this host's fabric IPv4, {found} "
                        f"({ctx.fabric_ip.source})" if found else remedy(gate_id)), {"launch_env": path},
                       commands=[export("AFD_FABRIC_IP", found)] if found else [])
    fab = ctx.obs.fabric
    if fab is not None and fab.captured and fab.netdevs:
        holders = [n.name for n in fab.netdevs.values() if n.holds_ipv4(ip)]
        if not holders:
            return Verdict(gate_id, FAIL, f"{path}: AFD_FABRIC_IP={ip} is on no netdev of this host",
                           "set AFD_FABRIC_IP to this host's fabric address (`afddiag devicemap` lists them)",
                           {"launch_env": path, "fabric_ip": ip})
        return Verdict(gate_id, PASS, f"{path}: AFD_FABRIC_IP={ip} (on {', '.join(holders)})", "nothing to do",
                       {"launch_env": path, "fabric_ip": ip, "netdevs": holders})
    return Verdict(gate_id, PASS, f"{path}: AFD_FABRIC_IP={ip}", "nothing to do", {"launch_env": path, "fabric_ip": ip})


@gate("launch.capacity")
def capacity(ctx: Context, gate_id: str) -> Verdict:
    le = ctx.inputs.launch_env
    if le is None:
        return Verdict(gate_id, SKIP, NO_ENV, "pass the launcher's env file with --launch-env")
    key = ctx.expect.value("capacity_key") or ""
    if not key:
        return Verdict(gate_id, SKIP, "role unknown: neither the playbook nor AFD_ROLE says which capacity flag is "
                       "this host's", "set AFD_ROLE=coordinator|expert in the launch env or pass --role")
    raw = le.get(key)
    own = int(raw) if raw else ENGINE_DEFAULT_CAPACITY
    spelled = ctx.inputs.spelled(key)  # the file's own name for it (the site's aliases): what a remedy names
    own_txt = (f"{spelled}={own}" + (f" (alias of {key})" if spelled != key else "")
               + ("" if raw else " (not set: the engine default)"))
    e = ctx.expect.capacity  # --expect-capacity, else the other side's flag in the same file
    want, src = (e.value, e.source) if e is not None else (None, "--expect-capacity")
    facts = {"key": key, "value": own, "set": bool(raw), "expected": want, "expected_from": src if want else None,
             "spelled": spelled}
    flag = CapacityFlag(key, own, bool(raw), spelled if spelled != key else None)
    if want is None:
        return Verdict(gate_id, SKIP, f"{own_txt}; nothing to compare with: give --expect-capacity with the "
                       f"{OTHER_SIDE.get(key, 'other side')} value",
                       "pass --expect-capacity N (the other side's flag)", facts, found=flag)
    if own != want:
        return Verdict(gate_id, FAIL, f"{own_txt} but {src} is {want}: the coordinator's batch flag and the ranks' "
                       "capacity flag must agree", remedy(gate_id), facts, found=flag)
    return Verdict(gate_id, PASS, f"{own_txt} equals {src}", "nothing to do", facts, found=flag)


@gate("launch.memlock")
def memlock(ctx: Context, gate_id: str) -> Verdict:
    lim = ctx.obs.limits
    if (v := probe_failed(gate_id, lim)) is not None:
        return v
    if lim is None or not lim.captured:
        notes = "; ".join(lim.notes) if lim and lim.notes else ""
        return Verdict(gate_id, SKIP, notes if notes.startswith("limits not captured") else
                       "limits not captured" + (f" ({notes})" if notes else ""),
                       "run on the host, or replay a capture of it (`afddiag capture`)")
    soft = lim.memlock_soft_bytes
    facts = {"memlock_soft_bytes": soft, "memlock_hard_bytes": lim.memlock_hard_bytes, "user": lim.user,
             "in_container": lim.in_container}
    if soft is None:
        return Verdict(gate_id, SKIP, "RLIMIT_MEMLOCK not read: " + "; ".join(lim.notes), remedy(gate_id), facts)
    if soft == -1:
        return Verdict(gate_id, PASS, f"RLIMIT_MEMLOCK unlimited for {lim.user}", "nothing to do", facts)
    need = ctx.playbook.memlock_min_bytes
    text = f"RLIMIT_MEMLOCK {_gib(soft)} for {lim.user}" + (" (in a container)" if lim.in_container else "")
    if need == -1:
        return Verdict(gate_id, FAIL, f"{text}; role {ctx.playbook.name} needs unlimited (verbs registrations pin "
                       "memory)", remedy(gate_id), facts)
    if need > 0 and soft < need:
        return Verdict(gate_id, FAIL, f"{text}, below the {_gib(need)} role {ctx.playbook.name} needs",
                       remedy(gate_id), facts)
    if need == 0:
        return Verdict(gate_id, WARN, f"{text}: RDMA engines register GPU and host buffers; unlimited is expected",
                       remedy(gate_id), facts)
    return Verdict(gate_id, PASS, f"{text}, at least the {_gib(need)} the role needs", "nothing to do", facts)


@gate("launch.uverbs-access")
def uverbs_access(ctx: Context, gate_id: str) -> Verdict:
    lim = ctx.obs.limits
    if (v := probe_failed(gate_id, lim)) is not None:
        return v
    if lim is None or not lim.captured:
        return Verdict(gate_id, SKIP, "device nodes not captured",
                       "run on the host, or replay a capture of it (`afddiag capture`)")
    fab = ctx.obs.fabric
    has_rdma = bool(fab and fab.devices)
    nodes = lim.device_nodes
    facts = {"device_nodes": [vars(n) for n in nodes], "user": lim.user, "in_container": lim.in_container}
    uverbs = [n for n in nodes if "uverbs" in n.path]
    where = "inside this container" if lim.in_container else "on this host"
    if not uverbs:
        if not has_rdma and not ctx.requires("rdma"):
            return Verdict(gate_id, SKIP, "no RDMA device and no /dev/infiniband/uverbs*", "nothing to check", facts)
        return Verdict(gate_id, FAIL, f"no /dev/infiniband/uverbs* {where}"
                       + (" although RDMA devices are registered" if has_rdma else ""), remedy(gate_id), facts)
    bad = [n for n in nodes if not (n.readable and n.writable)]
    if bad:
        return Verdict(gate_id, FAIL, f"{', '.join(n.path for n in bad)} not readable and writable by {lim.user}",
                       remedy(gate_id), facts)
    if not any(n.path.endswith("rdma_cm") for n in nodes):
        return Verdict(gate_id, WARN, f"{len(uverbs)} uverbs node(s) usable by {lim.user}, but no "
                       f"/dev/infiniband/rdma_cm {where} (engines that connect through RDMA CM need it)",
                       remedy(gate_id), facts)
    return Verdict(gate_id, PASS,
                   f"{len(uverbs)} uverbs node(s) and rdma_cm readable and writable by {lim.user} {where}",
                   "nothing to do", facts)


def predict_pool(total_bytes: int, reserve_fraction: float, capacity: int, drafter: bool,
                 plan: dict) -> dict:
    """The engine's KV pool before launch, from the GPU's memory (bytes), the reservation (0..1 of it),
    the capacity flag and the drafter flag, with the playbook's ``[plan]`` constants (bytes):

        pool = reservation x total - runtime_headroom - weights - drafter (when on) - fit_offset
               - activation_bytes_per_capacity x capacity

    Returns ``{"reserved_bytes", "occupied_bytes" (weights + drafter + offset + activations), "pool_bytes"
    (negative: out of memory), "pool_tokens" (pool / kv_bytes_per_token, 0 when out of memory),
    "full_contexts" (pool_tokens // max_context_tokens)}``. Pure; raises KeyError when ``plan`` lacks
    ``weights_bytes`` or ``kv_bytes_per_token``."""
    reserved = reserve_fraction * total_bytes
    occupied = (plan["weights_bytes"] + (plan.get("drafter_bytes", 0) if drafter else 0)
                + plan.get("fit_offset_bytes", 0) + plan.get("activation_bytes_per_capacity", 0) * capacity)
    pool = reserved - plan.get("runtime_headroom_bytes", 0) - occupied
    tokens = int(pool // plan["kv_bytes_per_token"]) if pool > 0 else 0
    ctx_tokens = int(plan.get("max_context_tokens", 0))
    return {"reserved_bytes": int(reserved), "occupied_bytes": int(occupied), "pool_bytes": int(pool),
            "pool_tokens": tokens, "full_contexts": tokens // ctx_tokens if ctx_tokens else None}


@gate("launch.memory-plan")
def memory_plan(ctx: Context, gate_id: str) -> Verdict:
    pb, le = ctx.playbook, ctx.inputs.launch_env
    if not pb.plan.get("weights_bytes") or not pb.plan.get("kv_bytes_per_token"):
        return Verdict(gate_id, SKIP, f"role {pb.name} has no memory plan ([plan] weights_bytes, kv_bytes_per_token)",
                       "add the engine's constants as a [plan] table in the role's playbook (coordinator.toml has one)")
    if le is None:
        return Verdict(gate_id, SKIP, NO_ENV, "pass the launcher's env file with --launch-env")
    g = ctx.obs.gpu
    if (v := probe_failed(gate_id, g)) is not None:
        return v
    dev = g.devices[0] if g is not None and g.devices else None
    if dev is None or not dev.memory_total_bytes:
        why = (g.why if g is not None and g.why else "no GPU memory reading")
        return Verdict(gate_id, SKIP, f"GPU memory unknown ({why}): nothing to plan against",
                       "run on the engine's host, or replay a capture of it (`afddiag capture`)")
    key = ctx.expect.value("capacity_key") or ""
    raw = le.get(key) if key else None
    cap = int(raw) if raw else int(pb.plan.get("default_capacity", ENGINE_DEFAULT_CAPACITY))
    d_raw = le.get("AFD_DRAFTER")
    drafter = FLAG_WORDS[d_raw.lower()] if d_raw else bool(pb.plan.get("drafter_default", True))
    r_raw = le.get("AFD_GPU_MEMORY_RESERVATION")
    reserve = float(r_raw) if r_raw else pb.reserve_fraction
    src = {"capacity": f"{key}={cap}" if raw else f"capacity {cap} (default)",
           "drafter": f"AFD_DRAFTER={d_raw}" if d_raw else f"drafter {'on' if drafter else 'off'} (default)",
           "reservation": (f"AFD_GPU_MEMORY_RESERVATION={r_raw}" if r_raw
                           else f"reservation {reserve:.0%} (role {pb.name})")}
    if not reserve:
        return Verdict(gate_id, SKIP, f"role {pb.name} sets no memory reservation (gpu.reserve_fraction or "
                       "AFD_GPU_MEMORY_RESERVATION)", "give the engine's reservation", {"sources": src})
    p = predict_pool(dev.memory_total_bytes, reserve, cap, drafter, pb.plan)
    facts = {**p, "total_bytes": dev.memory_total_bytes, "capacity": cap, "drafter": drafter,
             "reserve_fraction": reserve, "sources": src, "plan": pb.plan}
    subject = (f"{_label_gpu(dev)} {dev.memory_total_bytes / 2**30:.2f} GiB, {src['reservation']}, "
               f"{src['capacity']}, {src['drafter']}")
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    if p["pool_bytes"] <= 0:
        return Verdict(gate_id, FAIL, f"{subject}: out of memory predicted: weights, drafter and activations need "
                       f"{gib(p['occupied_bytes'])} of the "
                       f"{gib(p['reserved_bytes'] - pb.plan.get('runtime_headroom_bytes', 0))} left after the "
                       f"runtime headroom ({gib(-p['pool_bytes'])} short)", remedy(gate_id), facts)
    pool = (f"KV pool {gib(p['pool_bytes'])} = {p['pool_tokens'] / 1e6:.2f} M tokens"
            + (f" = {p['full_contexts']} full {int(pb.plan['max_context_tokens']):,}-token context(s)"
               if p["full_contexts"] is not None else ""))
    if p["full_contexts"] == 0:
        return Verdict(gate_id, WARN, f"{subject}: {pool}: not one request at the maximum context fits",
                       remedy(gate_id), facts)
    return Verdict(gate_id, PASS, f"{subject}: {pool}", "nothing to do", facts)


def _label_gpu(dev) -> str:
    return f"GPU {dev.index} {dev.name or '?'}"


ADDR_SUFFIXES = ("_ADDR", "_ADDRESS", "_HOST", "_URL", "_ENDPOINT")
LISTEN_WORDS = ("BIND", "LISTEN")  # a key holding one of these words names where the engine listens


def _address_keys(env: dict) -> list[tuple[str, str, str]]:
    """``[(key, value, host part)]`` of the launch-env addresses: AFD_* keys ending in _ADDR, _ADDRESS,
    _HOST, _URL or _ENDPOINT, and MASTER_ADDR."""
    out = []
    for key, val in sorted(env.items()):
        if not ((key.startswith("AFD_") and key.endswith(ADDR_SUFFIXES)) or key == "MASTER_ADDR") or not val:
            continue
        host = val.split("://", 1)[-1].split("/", 1)[0]
        if host.startswith("["):
            host = host[1:].split("]", 1)[0]
        elif host.count(":") == 1:
            host = host.split(":", 1)[0]
        out.append((key, val, host))
    return out


def is_listen_key(key: str) -> bool:
    """True when ``key`` names a listen (bind) address, where the engine accepts connections
    (``AFD_BIND_ADDR``, ``AFD_LISTEN_HOST``), not one peers are told to connect to."""
    return any(w in key.split("_") for w in LISTEN_WORDS)


def _host_kind(host: str) -> str | None:
    """"wildcard", "loopback" or None for an address's host part (a name other than localhost: None)."""
    import ipaddress

    if host.lower() == "localhost":
        return "loopback"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    return "wildcard" if ip.is_unspecified else "loopback" if ip.is_loopback else None


def bad_advertised(env: dict) -> list[tuple[str, str, str]]:
    """Launch-env addresses peers would be told to connect to that cannot work across hosts:
    ``[(key, value, why)]`` for AFD_* keys ending in _ADDR, _ADDRESS, _HOST, _URL or _ENDPOINT (and
    MASTER_ADDR) whose host part is a wildcard (0.0.0.0, ::) or loopback (127.0.0.0/8, ::1, localhost).
    A listen (bind) address (:func:`is_listen_key`) is no advertised one: 0.0.0.0 there is how an engine
    listens on every address (:func:`bad_listen` judges it). Pure."""
    out = []
    for key, val, host in _address_keys(env):
        kind = None if is_listen_key(key) else _host_kind(host)
        if kind == "wildcard":
            out.append((key, val, "a wildcard (listen-on-all) address, not one a peer can reach"))
        elif kind == "loopback":
            out.append((key, val, "loopback"))
    return out


def bad_listen(env: dict) -> list[tuple[str, str, str]]:
    """Listen (bind) addresses no peer can connect to: ``[(key, value, why)]`` for the listen keys
    (:func:`is_listen_key`) on loopback. A wildcard (0.0.0.0, ::) listens on every address and is fine. Pure."""
    return [(key, val, "a listen address on loopback: no peer can connect to it")
            for key, val, host in _address_keys(env) if is_listen_key(key) and _host_kind(host) == "loopback"]


@gate("launch.control-plane")
def control_plane(ctx: Context, gate_id: str) -> Verdict:
    le = ctx.inputs.launch_env
    bad = bad_advertised(le or {})
    r = ctx.obs.reach
    if (v := probe_failed(gate_id, r)) is not None:
        return v
    listen = bad_listen(le or {})
    facts: dict = {"advertised_bad": [{"key": k, "value": val, "why": w} for k, val, w in bad],
                   "listen_bad": [{"key": k, "value": val, "why": w} for k, val, w in listen]}
    found = Advertised(tuple(AdvertisedAddress(k, val, w) for k, val, w in bad))
    if r is not None and r.captured:
        facts.update(source=r.source, peers=r.peers, ports=r.ports, attempts=r.attempts, notes=r.notes)
    if bad or listen:
        said = (["; ".join(f"{k}={val} is {w}" for k, val, w in bad)
                 + ": peers told this address connect to themselves or nowhere"] if bad else [])
        said += [f"{k}={val} is {w}" for k, val, w in listen]
        rem = "; and ".join(([remedy(gate_id + ".advertised")] if bad else [])
                            + ([remedy(gate_id + ".listen")] if listen else []))
        return Verdict(gate_id, FAIL, f"{ctx.inputs.launch_env_path}: " + "; ".join(said), rem, facts,
                       action="SET_ENV", found=found)
    if r is None or not r.captured or not r.attempts:
        why = ("no peers (--peer or AFD_PEER_FABRIC_IPS)" if not ctx.inputs.peers else
               "no engine ports (AFD_ENGINE_PORTS in the launch env, or the playbook's [launch] engine_ports)")
        summary = f"control-plane reach not tried: {why}"
        if r is not None and r.notes and not r.captured:  # a snapshot without the readings: say that alone
            summary = "control-plane reach " + "; ".join(r.notes)
        return Verdict(gate_id, SKIP, summary,
                       "give the peers and the engine ports to test the control connections", facts, found=found)
    down = [a for a in r.attempts if a.get("outcome") in ("timeout", "unreachable", "bind failed", "error")]
    refused = [a for a in r.attempts if a.get("outcome") == "refused"]
    ok = [a for a in r.attempts if a.get("ok")]
    src = f"from {r.source}" if r.source else "from any address"
    if down:
        txt = "; ".join(f"{a['peer']}:{a['port']} {a['outcome']}" + (f" ({a['error']})" if a.get("error") else "")
                        for a in down[:6])
        routes = [command("ip", "route", "get", peer, "from", r.source)
                  for peer in dict.fromkeys(str(a["peer"]) for a in down)] if r.source else []
        return Verdict(gate_id, FAIL, f"{len(down)} of {len(r.attempts)} control connection(s) {src} fail: {txt}",
                       remedy(gate_id), facts, found=found, commands=routes)
    note = (f"; {len(refused)} refused (the peer answered, nothing listens yet: start order)" if refused else "")
    return Verdict(gate_id, PASS, f"{len(r.attempts)} control connection(s) {src} to {', '.join(r.peers)} on port(s) "
                   f"{', '.join(map(str, r.ports))}: {len(ok)} connected{note}", "nothing to do", facts, found=found)


GATES = declared(__name__)
