"""Slurm integration: drain this node when afddiag finds it unfit (as LBNL NHC does).

Slurm ignores a ``HealthCheckProgram``'s exit code, so ``afddiag preflight --drain`` calls
``scontrol update nodename=<node> state=drain reason="afddiag: <failing gates>"`` itself. The node
name is ``$SLURMD_NODENAME`` (set by slurmd for prolog and health-check programs), else
``hostname -s``. ``$AFDDIAG_SCONTROL`` replaces the ``scontrol`` command (split like a shell word
list, e.g. ``sudo -n scontrol``; tests point it at a fake that records its arguments).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys

REASON_MAX_CHARS = 200  # Slurm keeps long reasons, but `sinfo -R` shows the first few dozen characters


def node_name() -> str:
    """This host's Slurm node name: ``$SLURMD_NODENAME``, else the short hostname (``hostname -s``)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def drain_command(failing: list[str], node: str | None = None) -> list[str]:
    """The argv that drains ``node`` (default :func:`node_name`) with reason ``afddiag: <gate ids>``
    (cut to :data:`REASON_MAX_CHARS`). The command is ``$AFDDIAG_SCONTROL`` or ``scontrol``."""
    exe = shlex.split(os.environ.get("AFDDIAG_SCONTROL") or "scontrol")
    reason = "afddiag: " + (", ".join(failing) or "not fit")
    if len(reason) > REASON_MAX_CHARS:
        reason = reason[: REASON_MAX_CHARS - 3] + "..."
    return exe + ["update", f"nodename={node or node_name()}", "state=drain", f"reason={reason}"]


def drain_node(failing: list[str], node: str | None = None, timeout_s: float = 30.0) -> bool:
    """Run :func:`drain_command`; say on stderr what was done or why it failed. Returns True when
    scontrol exited 0. Never raises (a missing scontrol, a timeout or a non-zero exit is reported)."""
    argv = drain_command(failing, node)
    if os.sep not in argv[0] and shutil.which(argv[0]) is None:
        print(f"afddiag preflight --drain: {argv[0]} not found: the node was NOT drained (install Slurm's "
              "client or set AFDDIAG_SCONTROL)", file=sys.stderr)
        return False
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"afddiag preflight --drain: {shlex.join(argv)}: {e}: the node was NOT drained", file=sys.stderr)
        return False
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
        print(f"afddiag preflight --drain: {shlex.join(argv)} failed ({msg}): the node was NOT drained",
              file=sys.stderr)
        return False
    print(f"afddiag preflight --drain: drained {argv[argv.index('update') + 1].split('=', 1)[1]} "
          f"({argv[-1]})", file=sys.stderr)
    return True
