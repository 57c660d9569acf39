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
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from afddiag import playbook as pbmod
from afddiag.envvars import LaunchEnvError, parse_launch_env
from afddiag.model.run import Inputs
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
          notes: list[str]) -> tuple[pbmod.Playbook | None, str, dict[str, str] | None]:
    """(playbook, where the role came from, the parsed launch env): the module docstring's precedence."""
    pb, source = None, "default (no --role, --playbook or AFD_ROLE)"
    if playbook_path or role:
        pb = pbmod.load(role, playbook_path)
        source = f"--playbook {playbook_path}" if playbook_path else f"--role {role}"
    if not launch_env_path:
        return pb, source, None
    text = _launch_env_text(launch_env_path)
    launch_env = parse_launch_env(text, launch_env_path, pb.aliases if pb else None)
    named = launch_env.get("AFD_ROLE")
    if pb is not None and named and named != pb.name:
        notes.append(f"judging as role {pb.name} (--role/--playbook), although {launch_env_path} says "
                     f"AFD_ROLE={named}")
    if pb is None and named:
        pb, source = pbmod.load(named), f"AFD_ROLE in {launch_env_path}"
        if pb.aliases:  # the role's aliases apply to the file that named it
            launch_env = parse_launch_env(text, launch_env_path, pb.aliases)
    return pb, source, launch_env


def resolve(snapshot: str | None = None, timeout_s: float | None = None, fabric_ip: str | None = None,
            peers: tuple[str, ...] | list[str] = (), no_qp: bool = False, qp_timeout: float | None = None,
            expect_sm: int | None = None, role: str | None = None, playbook_path: str | None = None,
            launch_env_path: str | None = None, expect_capacity: int | None = None, load: bool = False,
            baseline_path: str | None = None, xid_log: str | None = None, no_load: bool = False,
            families: frozenset[str] = FAMILIES["all"]) -> Resolved:
    """The operator's words (flag names as the CLI's) → :class:`Resolved`. Raises :class:`InputsError`
    for a bad launch env or playbook (naming the file and line), ``load`` with ``no_load``, or (live)
    more peers x engine ports than the control-plane probe connects to (:func:`afddiag.probes.reach.bounds_problem`)."""
    notes: list[str] = []
    try:
        pb, role_source, launch_env = _role(role, playbook_path, launch_env_path, notes)
    except (LaunchEnvError, pbmod.PlaybookError) as e:
        raise InputsError(str(e)) from None
    if no_load:
        if load:
            raise InputsError("--load and --no-load: give one of them")
        if pb is not None and pb.load_probe:
            pb = dataclasses.replace(pb, load_probe=False)
    inputs = Inputs(fabric_ip=fabric_ip, peers=list(peers), expect_sm=expect_sm, snapshot=snapshot,
                    probe_timeout_s=timeout_s, qp_timeout_s=qp_timeout, run_qp=not no_qp, launch_env=launch_env,
                    launch_env_path=launch_env_path, expect_capacity=expect_capacity, playbook=pb, load=load,
                    baseline_path=baseline_path, xid_log=xid_log, families=families, role_source=role_source)
    ports = parse_ports((launch_env or {}).get("AFD_ENGINE_PORTS", "")) or list(pb.engine_ports if pb else [])
    if not snapshot and (why := bounds_problem(inputs.peers, ports)):  # the control-plane probe's bound
        raise InputsError(why)
    return Resolved(inputs, notes)


def make_inputs(**flags) -> Inputs:
    """:func:`resolve`'s inputs alone (its notes dropped): for library callers and tests."""
    return resolve(**flags).inputs
