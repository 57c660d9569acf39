"""The gate catalog (checks/gates.toml), the registered gates and docs/GATES.md agree."""

import pytest

from afddiag import catalog
from afddiag.gates import registry
from conftest import CASES, REPO

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

    src = "".join(f.read_text() for f in sorted((REPO / "afddiag" / "gates").glob("*.py")))
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
    from pathlib import Path

    import tomllib

    from afddiag.gates.gpu import XID_APP, XID_FATAL

    catalog = tomllib.loads((Path(__file__).parent.parent / "checks" / "gates.toml").read_text())
    text = catalog["gates"]["gpu.errors"]["checks"]
    listed = re.search(r"\(([\d, -]+)\) in the kernel log FAIL", text)
    assert listed, text
    fail = set()
    for part in listed.group(1).split(","):
        lo, _, hi = part.strip().partition("-")
        fail |= set(range(int(lo), int(hi or lo) + 1))
    assert fail == set(XID_FATAL)
    assert not fail & set(XID_APP)


@pytest.mark.parametrize("toml,words", [("x = [\n", "is not valid TOML"), (None, "unreadable")])
def test_a_broken_catalog_is_one_line_naming_the_file_and_the_fix(monkeypatch, capsys, toml, words):
    """A bad local edit of checks/gates.toml (or a missing file) ends the run with one line on stderr
    naming the file and how to restore it, exit 3 (nothing judged), not a traceback; a corrupt twin
    beside it is ignored, never trusted."""
    from afddiag import catalog, cli, packaged

    real = packaged.read_text

    def fake(sub, name):
        if (sub, name) == ("checks", "gates.json"):
            return '{"source_digest": "garbage'
        if (sub, name) == ("checks", "gates.toml"):
            if toml is None:
                raise FileNotFoundError(2, "No such file or directory")
            return toml
        return real(sub, name)

    monkeypatch.setattr(packaged, "read_text", fake)
    catalog.load.cache_clear()
    try:
        for argv in (["catalog"],
                     ["all", "--json", "--snapshot", str(CASES / "fabric" / "12-cx7-single-port-healthy")]):
            assert cli.run(argv) == 3
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "checks/gates.toml" in err[0] and words in err[0] and "git checkout" in err[0], err
    finally:
        catalog.load.cache_clear()


def says_drain(remedy: str) -> bool:
    """Whether ``remedy`` tells a person to drain now: "drain" in a clause (between ; : .) that does not
    make it conditional ("if ... repeats, drain") or deny it ("no drain")."""
    import re

    for clause in re.split(r"[;:.]", remedy):
        for m in re.finditer(r"\bdrain", clause):
            if not re.search(r"\bif\b", clause[:m.start()]) and not clause[:m.start()].rstrip().endswith("no"):
                return True
    return False


def test_drain_is_one_rule_and_the_prose_follows_it():
    """A drain takes the node out until a person acts: a FAIL whose action is marked drain. Setting an MTU
    leaves the node in service (set between jobs), as does a version drift until its update: neither
    action drains and neither remedy says to; every catalog remedy that says "drain" belongs to a gate
    whose action drains (issue 23: fabric.mtu's remedy said "drain the node" while its JSON said
    ``"drain": false``; GATES.md said SET_MTU drains)."""
    from afddiag.catalog import load, markdown
    from afddiag.diagnosis import drains, needs_drain

    cat = load()
    assert not needs_drain("SET_MTU") and not needs_drain("UPDATE_VERSIONS") and not needs_drain("UPDATE_PACKAGE")
    assert needs_drain("FIX_LINK") and drains("FAIL", "FIX_LINK") and not drains("WARN", "FIX_LINK")
    for gid, g in cat["gates"].items():
        if says_drain(g["remedy"]):
            assert needs_drain(g["action"]), (gid, g["remedy"])
    for key in ("fleet.versions.package", "fleet.versions.node"):
        assert not says_drain(cat["remedies"][key]), key
    assert not says_drain(cat["gates"]["fleet.versions"]["remedy"])
    assert says_drain("drain the node, then") and not says_drain("if it repeats, drain the host")
    assert not says_drain("(no drain, no reboot)")
    md = markdown()
    assert "| `SET_MTU` | no |" in md and "| `FIX_LINK` | yes |" in md
    assert "- Action: `SET_MTU`;" in md and "- Action: `FIX_LINK` (drains on FAIL)" in md
