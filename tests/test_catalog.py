"""The gate catalog (checks/gates.toml), the registered gates and docs/GATES.md agree."""

from afddiag import catalog
from afddiag.gates import registry
from conftest import REPO

REQUIRED = {"family", "severity", "title", "checks", "reads", "verdicts", "remedy", "source"}


def test_catalog_ids_equal_registered_gates():
    assert list(catalog.load()["gates"]) == [gid for gid, _, _ in registry()]


def test_every_gate_documents_every_field():
    for gid, g in catalog.load()["gates"].items():
        assert REQUIRED <= set(g), (gid, REQUIRED - set(g))
        assert gid.split(".")[0] == g["family"]
        assert set(g["verdicts"]) <= {"PASS", "WARN", "FAIL", "SKIP", "ERROR"}, gid
        assert g["remedy"].strip() and g["checks"].strip(), gid


def test_docs_gates_md_is_generated_from_catalog():
    on_disk = (REPO / "docs" / "GATES.md").read_text()
    assert on_disk == catalog.markdown(), "docs/GATES.md is stale: run `afddiag catalog --markdown > docs/GATES.md`"


def test_remedy_keys_used_by_gates_exist():
    import re

    src = "".join((REPO / "afddiag" / "gates" / f).read_text() for f in ("fabric.py", "gpu.py"))
    keys = set(re.findall(r'remedy\("([^"]+)"\)', src))
    cat = catalog.load()
    known = set(cat["gates"]) | set(cat["remedies"])
    assert keys <= known, keys - known
    for dyn in ("fabric.qp-rtr.no-pyverbs", "fabric.qp-rtr.timeout", "gpu.clock-events.hw", "gpu.clock-events.thermal"):
        assert catalog.remedy(dyn), dyn


def test_compiled_twin_is_current():
    """checks/gates.json is what a run reads instead of parsing the TOML: it must be the TOML's."""
    toml_text = (REPO / "checks" / "gates.toml").read_text(encoding="utf-8")
    on_disk = (REPO / "checks" / catalog.TWIN).read_text(encoding="utf-8")
    assert on_disk == catalog.compiled(toml_text), "checks/gates.json is stale: run `python -m afddiag.catalog`"


def test_stale_twin_is_ignored(monkeypatch):
    """An edited gates.toml beside an old twin: the run parses the TOML (the edit is what it sees)."""
    import afddiag.packaged as packaged

    real = packaged.read_text
    edited = (REPO / "checks" / "gates.toml").read_text(encoding="utf-8").replace(
        'title = "Control connections', 'title = "EDITED Control connections', 1)
    assert "EDITED" in edited
    with monkeypatch.context() as m:
        m.setattr(packaged, "read_text", lambda sub, name: edited if name == "gates.toml" else real(sub, name))
        catalog.load.cache_clear()
        try:
            assert catalog.load()["gates"]["launch.control-plane"]["title"].startswith("EDITED")
        finally:
            catalog.load.cache_clear()
    assert not catalog.load()["gates"]["launch.control-plane"]["title"].startswith("EDITED")


def test_twin_is_read_when_current(monkeypatch):
    """With a current twin the TOML parser is not called at all."""
    import afddiag.catalog as cat_mod

    def boom(_text):
        raise AssertionError("tomllib parsed the catalog although the twin is current")

    monkeypatch.setattr(cat_mod.tomllib, "loads", boom)
    catalog.load.cache_clear()
    try:
        assert "gpu.present" in catalog.load()["gates"]
    finally:
        monkeypatch.undo()
        catalog.load.cache_clear()


def test_gpu_errors_catalog_lists_the_xids_the_gate_fails():
    """The catalog's FAIL list of Xids is the gate's table (afddiag.gates.gpu.XID_FATAL): a held-out
    case written from the catalog expected FAIL for Xid 94, which NVIDIA's catalog (and the gate)
    resolve by restarting the application (WARN)."""
    import re
    import tomllib
    from pathlib import Path

    from afddiag.gates.gpu import XID_APP, XID_FATAL

    text = tomllib.loads((Path(__file__).parent.parent / "checks" / "gates.toml").read_text())["gates"]["gpu.errors"]["checks"]
    listed = re.search(r"\(([\d, -]+)\) in the kernel log FAIL", text)
    assert listed, text
    fail = set()
    for part in listed.group(1).split(","):
        lo, _, hi = part.strip().partition("-")
        fail |= set(range(int(lo), int(hi or lo) + 1))
    assert fail == set(XID_FATAL)
    assert not fail & set(XID_APP)
