"""``afddiag capture``: everything the probes read on this host, as a bundle ``--snapshot`` replays.

The bundle (a ``.tar.gz`` with one top folder ``afddiag-capture-<host>-<UTC time>/``) holds what
each probe of :data:`afddiag.probes.registry.PROBES` reads, as its artifacts (the registry's
docstring and entries list them): the sysfs files of the fabric probe (attributes of empty GID
slots left out, ``gid_attrs/EINVAL-SLOTS`` listing them), the device order, addresses, routes,
ARP sysctls, the GPU, limits and CPU readings, versions, allow-listed variables
(:data:`~afddiag.probes.env.ENV_ALLOW` and ``AFD_*``; nothing else leaves the host), the
host name, a manifest and the operator's inputs (``inputs.json``: fabric IP, peers, role,
expectations, the launch env allow-listed and redacted), which a replay uses where its flags give
none. The reads are the live run's (:func:`afddiag.runner.capture`), so a replay gives the live run's
verdicts, the QP walk aside.

Every host source is a field of :class:`Sources`, so a test points the capture at a fake root and
fake readings (a field it leaves out is not read). Probes only read; the bundle is written
atomically (temp file + rename).
"""

from __future__ import annotations

import datetime as _dt
import os
import re
from pathlib import Path
from typing import Any

from afddiag import runner
from afddiag.bundle import write_tar_gz
from afddiag.inputs import resolve
from afddiag.probes.registry import Sources


def collect_bundle(src: Sources | None = None, timeout_s: float = 10.0, load: bool = False,
                   peers: tuple[str, ...] = (), fabric_ip: str | None = None,
                   **flags: Any) -> tuple[dict[str, bytes], str, list[str]]:
    """Read everything the probes read from ``src`` (None: this host, :meth:`Sources.live`) →
    (``{relative path: bytes}``, host name, notes): :func:`afddiag.runner.capture`. ``load`` runs the
    GPU load probe too; ``peers``/``fabric_ip`` add the routes to the peers; ``flags`` (``role``,
    ``playbook_path``, ``launch_env_path``, ``expect_sm``, ``expect_capacity``: as
    :func:`afddiag.inputs.resolve`'s) are the other inputs the bundle keeps (``inputs.json``) for the
    replay. Each probe runs under ``timeout_s``; one that fails or times out leaves its files out and a
    note (in the manifest). Never raises for a host problem; raises :class:`afddiag.inputs.InputsError`
    for a bad launch env or playbook."""
    inputs = resolve(timeout_s=timeout_s, load=load, peers=list(peers), fabric_ip=fabric_ip, no_qp=True,
                     **flags).inputs
    return runner.capture(inputs, src, timeout_s)


def write_bundle(path: str | os.PathLike, src: Sources | None = None, timeout_s: float = 10.0,
                 **kw) -> tuple[Path, list[str]]:
    """Collect (:func:`collect_bundle`, ``kw`` passed on) and write the bundle atomically at ``path``
    → (path, notes). Raises OSError when ``path``'s folder cannot be written."""
    files, host, notes = collect_bundle(src, timeout_s, **kw)
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    safe_host = re.sub(r"[^A-Za-z0-9_.\-]", "_", host)[:64] or "host"
    return write_tar_gz(path, files, top=f"afddiag-capture-{safe_host}-{stamp}"), notes


__all__ = ["collect_bundle", "write_bundle"]
