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
