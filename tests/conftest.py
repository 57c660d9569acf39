import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CASES = Path(os.environ.get("AFDDIAG_CASES", REPO.parent / "shared" / "cases"))


def case_dirs(kind: str) -> list[Path]:
    """The shared real-world cases of one kind; a missing folder is an error, never an empty list."""
    d = CASES / kind
    if not d.is_dir():
        raise RuntimeError(f"shared cases not found at {d}: set AFDDIAG_CASES or clone beside ../shared")
    return sorted(p for p in d.iterdir() if (p / "case.json").is_file())


def load_case(path: Path) -> dict:
    return json.loads((path / "case.json").read_text())


@pytest.fixture(scope="session")
def report_schema() -> dict:
    return json.loads((REPO / "afddiag" / "schema" / "report.schema.json").read_text())


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path, monkeypatch):
    """Each test has its own state directory: a baseline recorded on this machine never leaks in."""
    monkeypatch.setenv("AFDDIAG_STATE_DIR", str(tmp_path / "state"))


def fleet_table(reports: list[dict], folder: Path, hosts: list[str], width: int = 80):
    """Write each report (its host renamed to the matching name in ``hosts``) under ``folder``, judge
    them as a fleet and render the fleet table at ``width`` → ``(fleet result, table text)``."""
    import io

    from afddiag.fleet import judge, load_reports, write_fleet_table

    files = []
    for i, (rep, host) in enumerate(zip(reports, hosts, strict=True)):
        rep = {**rep, "host": host}
        (folder / f"{i}.json").write_text(json.dumps(rep))
        files.append(str(folder / f"{i}.json"))
    fr = judge(load_reports(files))
    buf = io.StringIO()
    write_fleet_table(fr, buf, width=width)
    return fr, buf.getvalue()
