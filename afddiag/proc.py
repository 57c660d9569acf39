"""Child processes (``ip``, ``docker``/``podman``, ``scontrol``, ``dpkg-query``, ``rdma``) run bounded
in their own process group: at the bound the whole group is killed, so a hung tool and anything it
started (a docker CLI's helper, a shell wrapper's children) are gone when afddiag exits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def run(argv: list[str], timeout_s: float, text: bool = True) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=text, timeout=timeout_s)`` with the child in
    a new session (its own process group). Past ``timeout_s`` seconds the group gets SIGKILL and
    :class:`subprocess.TimeoutExpired` is raised (as subprocess.run does). Raises FileNotFoundError
    when ``argv[0]`` is not installed, OSError when it cannot be started."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=text, start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(p)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.communicate(timeout=1.0)
            raise subprocess.TimeoutExpired(argv, timeout_s) from None
        except BaseException:  # KeyboardInterrupt, SystemExit from SIGTERM: no orphan left behind
            kill_group(p)
            raise
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def kill_group(p: subprocess.Popen) -> None:
    """SIGKILL ``p``'s process group (it leads one: started with ``start_new_session``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        p.kill()
