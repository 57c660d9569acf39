"""The data files installed beside the code: ``checks/`` (package ``afddiag.checks``) and ``playbooks/``
(package ``afddiag.playbooks``), wherever afddiag runs from.

Installed or editable, each is a directory next to its package's ``__init__.py`` and is read
directly (``importlib.resources`` costs about 10-25 ms of imports at every start, a quarter of a
`afddiag gpu` run's own time); inside the zipapp that ``afddiag fleet --push`` builds, the files are
in the archive and ``importlib.resources`` reads them; run from a source tree without installing
(``PYTHONPATH=repo``), the repository's ``checks/`` and ``playbooks/`` are read.
"""

from __future__ import annotations

import importlib
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def data_dir(sub: str) -> Path | None:
    """The directory of package ``afddiag.<sub>`` on disk, or None when it is not a plain directory
    (a zipapp) or not importable (a source tree)."""
    try:
        mod = importlib.import_module(f"afddiag.{sub}")
    except ModuleNotFoundError:
        return _REPO / sub
    file = getattr(mod, "__file__", None)  # None for a namespace package
    d = Path(file).parent if file else None
    return d if d is not None and d.is_dir() else None


def read_text(sub: str, name: str) -> str:
    """The text of data file ``name`` in ``sub`` ("checks" or "playbooks"), UTF-8.

    Raises FileNotFoundError (OSError) when the file is not there (a broken install)."""
    d = data_dir(sub)
    if d is not None:
        return (d / name).read_text(encoding="utf-8")
    from importlib import resources

    return resources.files(f"afddiag.{sub}").joinpath(name).read_text(encoding="utf-8")


def names(sub: str) -> list[str]:
    """The file names in ``sub`` ("checks" or "playbooks"), sorted."""
    d = data_dir(sub)
    if d is not None:
        return sorted(p.name for p in d.iterdir())
    from importlib import resources

    return sorted(p.name for p in resources.files(f"afddiag.{sub}").iterdir())
