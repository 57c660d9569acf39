"""Slurm integration the LBNL NHC way: drain this node when afddiag finds it unfit, resume it when
afddiag drained it and it is fit again, and never touch a drain someone else set.

Slurm ignores a ``HealthCheckProgram``'s exit code, so ``afddiag preflight --drain`` calls
``scontrol update nodename=<node> state=drain reason="afddiag: <gate>: <summary>"`` itself (the first
fault that needs the drain, `` (+N)`` more; one line of at most 80 characters). Every
reason afddiag sets starts with :data:`REASON_PREFIX`; that prefix is how a later run knows the drain
is its own (NHC does the same with ``NHC:``):

- ``--drain`` on an unfit node: drains it, unless the node is already drained/down for a reason that
  does not start with ``afddiag:`` (an admin's, slurmd's): that drain is left as it is;
- ``--resume`` on a fit node: ``scontrol update nodename=<node> state=resume`` only when the node is
  drained with an ``afddiag:`` reason; any other drain stays;
- when the node's state cannot be read (``sinfo`` missing or failing), neither is done: without the
  reason, afddiag could overwrite an admin's.

The node name is ``$SLURMD_NODENAME`` (set by slurmd for prolog and health-check programs), else
``hostname -s``. ``$AFDDIAG_SCONTROL`` and ``$AFDDIAG_SINFO`` replace the ``scontrol`` and ``sinfo``
commands (split like a shell word list, e.g. ``sudo -n scontrol``; tests point them at fakes).
The node's state and reason come from ``sinfo -h -N -n <node> -o '%T|%E'`` (long state, reason).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass

from afddiag import proc
from afddiag.termsafe import bounded_line

REASON_MAX_CHARS = 80  # Slurm keeps long reasons, but `sinfo -R` shows the first few dozen characters
REASON_PREFIX = "afddiag:"
_OUT_OF_SERVICE = ("drain", "down", "fail", "maint", "reboot")  # sinfo %T words of a node taken out


def node_name() -> str:
    """This host's Slurm node name: ``$SLURMD_NODENAME``, else the short hostname (``hostname -s``)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _exe(var: str, default: str) -> list[str]:
    return shlex.split(os.environ.get(var) or default)


def drain_reason(failing: list[str]) -> str:
    """``afddiag: <first fault>`` (``<gate>: <summary>``), `` (+N)`` when N more need the drain too: one
    escaped line of at most :data:`REASON_MAX_CHARS` bytes (`sinfo -R -o '%80E %N'` shows it whole; its
    default ``%20E`` column still shows ``afddiag: <gate>``)."""
    more = f" (+{len(failing) - 1})" if len(failing) > 1 else ""
    return bounded_line(f"{REASON_PREFIX} {failing[0] if failing else 'not fit'}", REASON_MAX_CHARS, more)


def drain_command(failing: list[str], node: str | None = None) -> list[str]:
    """The argv that drains ``node`` (default :func:`node_name`) with :func:`drain_reason`'s reason for
    ``failing`` (each ``<gate>: <summary>``, or a gate id). The command is ``$AFDDIAG_SCONTROL`` or
    ``scontrol``."""
    reason = drain_reason(failing)
    return _exe("AFDDIAG_SCONTROL", "scontrol") + ["update", f"nodename={node or node_name()}", "state=drain",
                                                   f"reason={reason}"]


def resume_command(node: str | None = None) -> list[str]:
    """The argv that resumes ``node``: ``scontrol update nodename=<node> state=resume``."""
    return _exe("AFDDIAG_SCONTROL", "scontrol") + ["update", f"nodename={node or node_name()}", "state=resume"]


@dataclass
class NodeState:
    """A node's Slurm state as ``sinfo`` prints it: ``state`` the long state (``idle``, ``allocated``,
    ``mixed``, ``drained``, ``draining``, ``down*``...), ``reason`` the drain/down reason (None when
    none), or ``why`` it could not be read."""

    state: str | None = None
    reason: str | None = None
    why: str | None = None

    @property
    def out_of_service(self) -> bool:
        """Drained, draining, down, failed or in maintenance: someone (or something) took it out."""
        s = (self.state or "").lower()
        return any(w in s for w in _OUT_OF_SERVICE)

    @property
    def ours(self) -> bool:
        """The reason is afddiag's own (starts with ``afddiag:``)."""
        return bool(self.reason and self.reason.startswith(REASON_PREFIX))

    @property
    def busy(self) -> bool:
        """Jobs run on it (allocated, mixed, completing)."""
        s = (self.state or "").lower()
        return any(w in s for w in ("alloc", "mix", "completing"))


def parse_sinfo(text: str) -> NodeState:
    """``sinfo -h -N -n <node> -o '%T|%E'`` output → :class:`NodeState` (the first line; reason
    ``none`` → None)."""
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    if "|" not in line:
        return NodeState(why=f"sinfo printed {line[:80]!r}, not 'state|reason'" if line else "sinfo printed nothing "
                         "(is this node in the cluster?)")
    state, _, reason = line.partition("|")
    reason = reason.strip()
    return NodeState(state=state.strip(), reason=None if reason.lower() in ("", "none") else reason)


def node_state(node: str | None = None, timeout_s: float = 30.0) -> NodeState:
    """``node``'s state and reason from ``sinfo`` (``$AFDDIAG_SINFO``). Never raises: a missing sinfo,
    a timeout or a failure gives a NodeState whose ``why`` says so."""
    argv = _exe("AFDDIAG_SINFO", "sinfo") + ["-h", "-N", "-n", node or node_name(), "-o", "%T|%E"]
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        return NodeState(why=f"{argv[0]} not found (install Slurm's client or set AFDDIAG_SINFO)")
    try:
        p = proc.run(argv, timeout_s)
    except (OSError, subprocess.SubprocessError) as e:
        return NodeState(why=f"{shlex.join(argv)}: {e}")
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        return NodeState(why=f"{shlex.join(argv)} failed ({msg})")
    return parse_sinfo(p.stdout)


def _say(what: str, msg: str) -> None:
    print(f"afddiag preflight --{what}: {msg}", file=sys.stderr)


def _scontrol(what: str, argv: list[str], timeout_s: float) -> bool:
    done = {"drain": "drained", "resume": "resumed"}[what]
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        _say(what, f"{argv[0]} not found: the node was NOT {done} (install Slurm's client or set AFDDIAG_SCONTROL)")
        return False
    try:
        p = proc.run(argv, timeout_s)
    except (OSError, subprocess.SubprocessError) as e:
        _say(what, f"{shlex.join(argv)}: {e}: the node was NOT {done}")
        return False
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        _say(what, f"{shlex.join(argv)} failed ({msg}): the node was NOT {done}")
        return False
    return True


def drain_node(failing: list[str], node: str | None = None, timeout_s: float = 30.0) -> bool:
    """Drain ``node`` with reason ``afddiag: <failing>`` unless someone else's drain is on it; say on
    stderr what was done or why not. Returns True when the node is drained by afddiag afterwards (now
    or already, with this reason). Never raises. ``timeout_s`` bounds the whole: sinfo and scontrol
    together (each child killed with its process group at the bound)."""
    import time

    deadline = time.monotonic() + timeout_s
    node = node or node_name()
    argv = drain_command(failing, node)
    reason = argv[-1].split("=", 1)[1]
    st = node_state(node, timeout_s / 2)
    if st.why:
        _say("drain", f"node {node}'s state not read ({st.why}): the node was NOT drained (an admin's reason "
             "could be on it; afddiag never overwrites one)")
        return False
    if st.out_of_service and not st.ours:
        _say("drain", f"node {node} is already {st.state} (reason: {st.reason or 'none'}): left as it is, "
             f"afddiag would have drained it for: {reason}")
        return False
    if st.out_of_service and st.reason == reason:
        _say("drain", f"node {node} stays drained ({reason})")
        return True
    if not _scontrol("drain", argv, max(0.1, deadline - time.monotonic())):
        return False
    _say("drain", f"drained {node} (reason={reason})")
    return True


def resume_node(node: str | None = None, timeout_s: float = 30.0) -> bool:
    """Resume ``node`` when it is out of service with an ``afddiag:`` reason (afddiag drained it and it
    is fit now); leave any other state alone. Returns True when it was resumed. Never raises.
    ``timeout_s`` bounds sinfo and scontrol together."""
    import time

    deadline = time.monotonic() + timeout_s
    node = node or node_name()
    st = node_state(node, timeout_s / 2)
    if st.why:
        _say("resume", f"node {node}'s state not read ({st.why}): the node was NOT resumed")
        return False
    if not st.out_of_service:
        return False  # in service: nothing to do
    if not st.ours:
        _say("resume", f"node {node} is {st.state} (reason: {st.reason or 'none'}), not drained by afddiag: "
             "left as it is")
        return False
    if not _scontrol("resume", resume_command(node), max(0.1, deadline - time.monotonic())):
        return False
    _say("resume", f"resumed {node} (was {st.state}: {st.reason})")
    return True
