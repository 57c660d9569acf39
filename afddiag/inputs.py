"""What a run is asked, from the operator's words: flags and the files they name → one :class:`Inputs`.

The one place that reads the playbook and the launch env file and decides the role, each with its
source (:attr:`Inputs.role_source`): ``--playbook FILE``, else ``--role NAME``, else ``AFD_ROLE`` in
the launch env (``--launch-env FILE``; its aliases then apply to that file), else ``generic``. A role
given on the command line wins over the file's ``AFD_ROLE``, and :attr:`Resolved.notes` says so.
The fabric IP and the expectations are resolved from these inputs and the facts by
:func:`afddiag.endpoint.fabric_ip_of` (once a run, by the runner, right after the fabric probe: the
given one with its source, ``--fabric-ip`` or ``AFD_FABRIC_IP in FILE``, else the facts') and
:func:`afddiag.expect.resolve` (every expectation with its source; the role's is :attr:`Inputs.role_source`).

Bad input raises :class:`InputsError`, one line naming the file (and line) and the fix.

A capture keeps the operator's inputs (:func:`to_store`: fabric IP, peers, role, expectations, the
launch env allow-listed and redacted) as the bundle's ``inputs.json``; a replay takes each one its own
flags leave unset from there (:func:`with_stored`), and :attr:`Inputs.sources` says where each came from
(``--peer``, ``captured with --peer``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import ipaddress
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from afddiag import catalog
from afddiag import playbook as pbmod
from afddiag.envvars import LaunchEnvError, parse_launch_env, redact_env
from afddiag.model.run import Inputs
from afddiag.probes.env import env_allowed
from afddiag.probes.reach import bounds_problem, parse_ports
from afddiag.reader import InputError, read_text

#: The gate families each command judges.
FAMILIES: dict[str, frozenset[str]] = {
    "fabric": frozenset({"fabric"}), "gpu": frozenset({"gpu"}),
    "all": frozenset({"fabric", "gpu", "host", "launch"}), "preflight": frozenset({"fabric", "gpu", "host", "launch"}),
}


class InputsError(ValueError):
    """A flag combination or a named file that cannot be used: one line naming it and the fix."""


@dataclass
class Resolved:
    """:func:`resolve`'s answer: the inputs, and lines for the operator (a role given twice)."""

    inputs: Inputs
    notes: list[str] = field(default_factory=list)


def _launch_env_text(path: str) -> str:
    try:
        return read_text(path)  # bounded: 1 MiB, a regular file, strict UTF-8
    except InputError as e:
        raise InputsError(f"launch env {e}: give the launcher's KEY=VALUE env file") from None
    except OSError as e:
        raise InputsError(f"launch env {path}: {e.strerror}: give the launcher's env file") from None


def _role(role: str | None, playbook_path: str | None, launch_env_path: str | None,
          notes: list[str], spelled: dict[str, str]) -> tuple[pbmod.Playbook | None, str, dict[str, str] | None]:
    """(playbook, where the role came from, the parsed launch env): the module docstring's precedence."""
    pb, source = None, "default (no --role, --playbook or AFD_ROLE)"
    if playbook_path or role:
        pb = pbmod.load(role, playbook_path)
        source = f"--playbook {playbook_path}" if playbook_path else f"--role {role}"
    if not launch_env_path:
        return pb, source, None
    text = _launch_env_text(launch_env_path)
    launch_env = parse_launch_env(text, launch_env_path, pb.aliases if pb else None, spelled)
    named = launch_env.get("AFD_ROLE")
    if pb is not None and named and named != pb.name:
        notes.append(f"judging as role {pb.name} (--role/--playbook), although {launch_env_path} says "
                     f"AFD_ROLE={named}")
    if pb is None and named:
        pb, source = pbmod.load(named), f"AFD_ROLE in {launch_env_path}"
        if pb.aliases:  # the role's aliases apply to the file that named it
            launch_env = parse_launch_env(text, launch_env_path, pb.aliases, spelled)
    return pb, source, launch_env


def select_gates(patterns: Collection[str], families: Collection[str]) -> frozenset[str]:
    """``--gate PATTERN`` (shell globs on gate ids, ``fabric.*``, ``gpu.memory``) → the ids of the
    catalog's gates in ``families`` that match, with every gate they depend on (catalog ``depends``,
    followed to the end), so the diagnosis still names a root and not its symptom. Raises
    :class:`InputsError` for a pattern that matches none of them."""
    gates = catalog.load()["gates"]
    pool = [gid for gid, g in gates.items() if g.get("family") in families]
    chosen: set[str] = set()
    for pat in patterns:
        hit = [gid for gid in pool if fnmatch.fnmatchcase(gid, pat)]
        if not hit:
            raise InputsError(f"--gate {pat}: matches none of this command's gates ({', '.join(sorted(families))}); "
                              "`afddiag catalog` lists the ids")
        chosen.update(hit)
    todo = list(chosen)
    while todo:
        for dep in gates[todo.pop()].get("depends", []):
            if dep in pool and dep not in chosen:
                chosen.add(dep)
                todo.append(dep)
    return frozenset(chosen)


def resolve(snapshot: str | None = None, timeout_s: float | None = None, fabric_ip: str | None = None,
            peers: tuple[str, ...] | list[str] = (), no_qp: bool = False, qp_timeout: float | None = None,
            expect_sm: int | None = None, role: str | None = None, playbook_path: str | None = None,
            launch_env_path: str | None = None, expect_capacity: int | None = None, load: bool = False,
            baseline_path: str | None = None, xid_log: str | None = None, no_load: bool = False,
            engine_log: str | None = None,
            families: frozenset[str] = FAMILIES["all"], gates: Collection[str] = ()) -> Resolved:
    """The operator's words (flag names as the CLI's) → :class:`Resolved`. Raises :class:`InputsError`
    for a bad launch env or playbook (naming the file and line), ``load`` with ``no_load``, a ``gates``
    pattern that matches nothing (:func:`select_gates`), or (live) more peers x engine ports than the
    control-plane probe connects to (:func:`afddiag.probes.reach.bounds_problem`)."""
    notes: list[str] = []
    spelled: dict[str, str] = {}  # afddiag's name -> the launch env file's own (the site's aliases)
    try:
        pb, role_source, launch_env = _role(role, playbook_path, launch_env_path, notes, spelled)
    except (LaunchEnvError, pbmod.PlaybookError) as e:
        raise InputsError(str(e)) from None
    if no_load:
        if load:
            raise InputsError("--load and --no-load: give one of them")
        if pb is not None and pb.load_probe:
            pb = dataclasses.replace(pb, load_probe=False)
    selected = select_gates(gates, families) if gates else None
    if selected is not None and pb is not None:
        notes += [f"role {pb.name} does not run {gid} (its playbook's gates): not judged" for gid in sorted(selected)
                  if not pb.runs(gid) and any(fnmatch.fnmatchcase(gid, p) for p in gates)]
    inputs = Inputs(fabric_ip=fabric_ip, peers=list(peers), expect_sm=expect_sm, snapshot=snapshot,
                    probe_timeout_s=timeout_s, qp_timeout_s=qp_timeout, run_qp=not no_qp, launch_env=launch_env,
                    launch_env_path=launch_env_path, expect_capacity=expect_capacity, playbook=pb, load=load,
                    baseline_path=baseline_path, xid_log=xid_log, engine_log=engine_log, families=families,
                    role_source=role_source, gates=selected, launch_env_spelled=spelled)
    inputs.sources = _flag_sources(inputs, bool(peers))
    ports = parse_ports((launch_env or {}).get("AFD_ENGINE_PORTS", "")) or list(pb.engine_ports if pb else [])
    if not snapshot and (why := bounds_problem(inputs.peers, ports)):  # the control-plane probe's bound
        raise InputsError(why)
    return Resolved(inputs, notes)


def make_inputs(**flags) -> Inputs:
    """:func:`resolve`'s inputs alone (its notes dropped): for library callers and tests."""
    return resolve(**flags).inputs


#: The inputs a capture keeps and the flag that gives each one at a replay.
STORED_FLAGS = {"fabric_ip": "--fabric-ip", "peers": "--peer", "role": "--role", "expect_sm": "--expect-sm",
                "expect_capacity": "--expect-capacity", "launch_env": "--launch-env"}
_MAX_PEERS = 1024
_MAX_TEXT = 4096
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")  # a variable name a launch env file holds


def _flag_sources(inputs: Inputs, peers_given: bool) -> dict[str, str]:
    """Where each input the operator gave came from, by :data:`STORED_FLAGS` key (unset ones left out)."""
    out: dict[str, str] = {}
    if inputs.fabric_ip:
        out["fabric_ip"] = "--fabric-ip"
    if inputs.peers:
        out["peers"] = "--peer" if peers_given else f"AFD_PEER_FABRIC_IPS in {inputs.launch_env_path}"
    if inputs.playbook is not None:
        out["role"] = inputs.role_source
    for k in ("expect_sm", "expect_capacity"):
        if getattr(inputs, k) is not None:
            out[k] = STORED_FLAGS[k]
    if inputs.launch_env is not None:
        out["launch_env"] = f"--launch-env {inputs.launch_env_path}"
    return out


def to_store(inputs: Inputs) -> dict[str, Any]:
    """What a capture keeps of ``inputs`` (the bundle's ``inputs.json``): ``{"fabric_ip", "peers", "role",
    "expect_sm", "expect_capacity", "launch_env" (allow-listed variables, :func:`afddiag.probes.env.env_allowed`,
    credentials ``<redacted>``: :func:`afddiag.envvars.redact_env`), "launch_env_path", "launch_env_spelled"
    (afddiag's name → the file's own, for the kept variables it spells through the site's aliases), "sources"}``;
    an input not given is None (peers: [])."""
    le = None
    if inputs.launch_env is not None:
        le, _ = redact_env({k: v for k, v in inputs.launch_env.items() if env_allowed(k)})
    return {"fabric_ip": inputs.fabric_ip, "peers": list(inputs.peers),
            "role": inputs.playbook.name if inputs.playbook is not None else None,
            "expect_sm": inputs.expect_sm, "expect_capacity": inputs.expect_capacity,
            "launch_env": le, "launch_env_path": inputs.launch_env_path if le is not None else None,
            "launch_env_spelled": {k: v for k, v in inputs.launch_env_spelled.items() if le and k in le},
            "sources": dict(inputs.sources)}


def _ipv4(v: Any) -> bool:
    try:
        ipaddress.IPv4Address(v)
    except ValueError:
        return False
    return isinstance(v, str)


def _text(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= _MAX_TEXT and not any(ord(c) < 32 or ord(c) == 127 for c in v)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 10**9


def checked_store(stored: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """A snapshot's ``inputs.json`` (untrusted) → ``(stored, "")`` when every field has the shape
    :func:`to_store` writes (the launch env re-checked by :func:`afddiag.envvars.parse_launch_env`), else
    ``(None, why)``: the replay then uses none of it."""
    def bad(field_name: str) -> tuple[None, str]:
        return None, (f"inputs.json refused ({field_name} is not what a capture writes); replayed without the "
                      "captured inputs")

    if stored.get("fabric_ip") is not None and not _ipv4(stored["fabric_ip"]):
        return bad("fabric_ip")
    peers = stored.get("peers") or []
    if not isinstance(peers, list) or len(peers) > _MAX_PEERS or not all(_ipv4(p) for p in peers):
        return bad("peers")
    if stored.get("role") is not None and not (isinstance(stored["role"], str) and _NAME_RE.match(stored["role"])):
        return bad("role")
    if any(stored.get(k) is not None and not _count(stored[k]) for k in ("expect_sm", "expect_capacity")):
        return bad("expect_sm or expect_capacity")
    sources = stored.get("sources") or {}
    if not isinstance(sources, dict) or not all(k in STORED_FLAGS and _text(v) for k, v in sources.items()):
        return bad("sources")
    le = stored.get("launch_env")
    if le is not None:
        if not isinstance(le, dict) or len(le) > 512 or not _text(stored.get("launch_env_path")):
            return bad("launch_env")
        if not all(isinstance(v, str) and "'" not in v and (v == "" or _text(v)) for v in le.values()):
            return bad("launch_env")
        try:  # single-quoted lines: the values come back exactly, each checked as in a launch env file
            text = "\n".join(f"{k}='{v}'" for k, v in le.items())
            if parse_launch_env(text, "inputs.json launch_env") != le:
                return bad("launch_env")
        except LaunchEnvError as e:
            return None, f"{e}; replayed without the captured inputs"
    spelled = stored.get("launch_env_spelled") or {}  # afddiag's name -> the file's own (the site's aliases)
    if not isinstance(spelled, dict) or len(spelled) > 64 or not all(
            isinstance(k, str) and isinstance(v, str) and _ENV_NAME_RE.fullmatch(k) and _ENV_NAME_RE.fullmatch(v)
            for k, v in spelled.items()):
        return bad("launch_env_spelled")
    return {**stored, "peers": list(peers), "sources": dict(sources), "launch_env_spelled": dict(spelled)}, ""


def with_stored(inputs: Inputs, stored: dict[str, Any] | None) -> Inputs:
    """``inputs`` for a replay of a snapshot whose capture kept ``stored`` (:func:`checked_store`'s):
    each input the replay's flags leave unset taken from it, :attr:`Inputs.sources` saying
    ``captured with <the capture's source>``; a flag given at the replay wins. None: ``inputs`` as given
    (a bundle from before inputs were kept)."""
    if not stored:
        return inputs
    src = dict(inputs.sources)
    was = stored.get("sources") or {}
    changes: dict[str, Any] = {}

    def take(key: str, value: Any) -> None:
        changes[key] = value
        src[key] = f"captured with {was.get(key) or STORED_FLAGS[key]}"

    if inputs.launch_env is None and stored.get("launch_env") is not None:
        take("launch_env", dict(stored["launch_env"]))
        changes["launch_env_path"] = f"{stored['launch_env_path']} (captured)"
        changes["launch_env_spelled"] = dict(stored.get("launch_env_spelled") or {})
    if not inputs.fabric_ip and stored.get("fabric_ip") and not (inputs.launch_env or {}).get("AFD_FABRIC_IP"):
        take("fabric_ip", stored["fabric_ip"])
    if not inputs.peers and stored.get("peers"):
        take("peers", list(stored["peers"]))
    for k in ("expect_sm", "expect_capacity"):
        if getattr(inputs, k) is None and stored.get(k) is not None:
            take(k, stored[k])
    if inputs.playbook is None and stored.get("role"):
        try:
            pb = pbmod.load(stored["role"])
        except pbmod.PlaybookError:
            pb = None  # a site's own playbook file: give --playbook at the replay to judge as it
        if pb is not None:
            changes["playbook"] = pb
            src["role"] = changes["role_source"] = f"captured with {was.get('role') or '--role ' + pb.name}"
    if not changes:
        return inputs
    changes["sources"] = src
    return dataclasses.replace(inputs, **changes)


def stored_note(inputs: Inputs) -> str | None:
    """One line naming the inputs a replay took from its capture (``fabric IP 10.9.0.2, peers 10.9.0.1
    (captured with --fabric-ip, --peer)``), None when it took none."""
    taken = [k for k, v in inputs.sources.items() if v.startswith("captured with")]
    if not taken:
        return None
    shown = {"fabric_ip": f"fabric IP {inputs.fabric_ip}", "peers": f"peers {' '.join(inputs.peers)}",
             "role": f"role {inputs.playbook.name if inputs.playbook else 'generic'}",
             "expect_sm": f"expected SMs {inputs.expect_sm}", "expect_capacity": f"capacity {inputs.expect_capacity}",
             "launch_env": f"launch env {inputs.launch_env_path}"}
    return (f"inputs from the capture: {', '.join(shown[k] for k in taken)} (flags given at the replay override "
            "them)")
