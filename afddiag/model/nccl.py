"""NCCL facts: the libnccl copies an engine on this host can load, the NCCL_* variables its launch env
sets, and the NCCL configuration files (``/etc/nccl.conf``, ``~/.nccl.conf``, ``NCCL_CONF_FILE``) that
NCCL reads at init for every variable the environment leaves unset. Data only: the probe is
:mod:`afddiag.probes.nccl`, the gates :mod:`afddiag.gates.nccl` and :mod:`afddiag.gates.known_bad`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Where a copy was found, in the order the engine's loader takes them: ``LD_PRELOAD`` first, then a
#: directory of ``LD_LIBRARY_PATH``, then the Python wheel (torch finds it through its runpath
#: ``$ORIGIN/../../nvidia/nccl/lib``), then the system's library directories (ld.so.conf, the standard ones).
ORIGINS = ("LD_PRELOAD", "LD_LIBRARY_PATH", "wheel", "system")


@dataclass
class NcclCopy:
    """One libnccl file. ``path`` as found, ``real_path`` with links resolved; ``origin`` one of
    :data:`ORIGINS` and ``where`` the directory or variable that named it; ``version`` ("2.28.9") and
    ``version_source`` ("file name", "wheel metadata <dist-info>", "NCCL version string"); ``build_id``:
    the ELF ``NT_GNU_BUILD_ID`` note in hex (``readelf -n``); None where not read."""

    path: str
    real_path: str
    origin: str
    where: str
    version: str | None = None
    version_source: str | None = None
    build_id: str | None = None
    size_bytes: int | None = None
    cuda: str | None = None  # the "+cudaX.Y" of the NCCL version string, where read


@dataclass
class NcclConfFile:
    """An NCCL configuration file that exists: its ``NCCL_*`` lines ``[{"line", "key", "value"}]``."""

    path: str
    lines: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class NcclFacts:
    """What the NCCL probe saw. ``copies`` in loader order (:data:`ORIGINS`; None: not searched);
    ``env``: the launch env's ``NCCL_*`` variables (None: no launch env given); ``conf_files``: the
    configuration files present; ``searched``: the directories looked in."""

    captured: bool = True
    copies: list[NcclCopy] | None = None
    env: dict[str, str] | None = None
    conf_files: list[NcclConfFile] = field(default_factory=list)
    searched: list[str] = field(default_factory=list)
    failed: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def loaded(self) -> NcclCopy | None:
        """The copy the engine's loader takes first (:data:`ORIGINS` order); None when none was found."""
        return self.copies[0] if self.copies else None
