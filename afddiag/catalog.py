"""The gate catalog (``checks/gates.toml``): what each gate checks, reads, and its remedy.

``checks/`` is installed as the package ``afddiag.checks``; from a source tree it is read in place.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    """The parsed catalog: ``{"gates": {id: {...}}, "remedies": {key: text}}``.

    Raises FileNotFoundError when the catalog is not installed (a broken install).
    """
    try:
        text = resources.files("afddiag.checks").joinpath("gates.toml").read_text(encoding="utf-8")
    except ModuleNotFoundError:  # run from a source tree (PYTHONPATH=repo) without installing
        text = (Path(__file__).resolve().parent.parent / "checks" / "gates.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def remedy(key: str) -> str:
    """The catalog's remedy for a gate id or an extra remedy key; "" when there is none."""
    cat = load()
    gate = cat.get("gates", {}).get(key)
    if gate:
        return gate.get("remedy", "")
    return cat.get("remedies", {}).get(key, "")


def markdown() -> str:
    """docs/GATES.md, generated from the catalog."""
    cat = load()
    out = [
        "# Gates",
        "",
        "Generated from `checks/gates.toml` by `afddiag catalog --markdown`; do not edit by hand.",
        "",
        "Verdicts: PASS, WARN, FAIL, SKIP (could not look: the summary says why), ERROR (the probe or "
        "gate broke). Exit code: 2 if any FAIL, else 3 if any ERROR, else 1 if any WARN, else 0; usage error 64.",
        "",
        "A report opens with the diagnosis: the independent faults, each with one remedy and one action, in the "
        "order to fix them, each naming the gates it explains (a gate whose dependency FAILed either judges only "
        "its own concern or says \"not judged: <gate> failed\").",
        "",
        "| gate | title | worst verdict |",
        "| --- | --- | --- |",
    ]
    for gid, g in cat["gates"].items():
        out.append(f"| [`{gid}`](#{gid.replace('.', '')}) | {g['title']} | {g['severity']} |")
    for gid, g in cat["gates"].items():
        out += ["", f"## {gid}", "", f"**{g['title']}** ({g['family']}; worst verdict: {g['severity']})", "",
                f"- Checks: {g['checks']}", f"- Reads: {g['reads']}", "- Verdicts:"]
        out += [f"  - {v}: {meaning}" for v, meaning in g["verdicts"].items()]
        out += [f"- Remedy: {g['remedy']}", f"- Action: `{g.get('action', 'NONE')}`"
                + (f" (WARN: `{g['warn_action']}`)" if g.get("warn_action") else "")
                + ("; also " + ", ".join(f"`{a}`" for a in g["also_actions"]) if g.get("also_actions") else "")]
        if g.get("depends"):
            mode = g.get("on_dependency_failure", "own concern")
            out.append(f"- Depends on: {', '.join(f'`{d}`' for d in g['depends'])} (when one FAILs: "
                       + ("judges only its own concern" if mode == "own concern" else
                          "SKIP \"not judged: <gate> failed\"") + ")")
        out.append(f"- From: {g['source']}")
    out += ["", "## Actions", "",
            "Every remedy carries one action from this closed set (JSON `action` on each gate and diagnosis entry). "
            "`preflight --drain` and the Slurm hooks drain a node only for an action marked drain.", "",
            "| action | drain | meaning |", "| --- | --- | --- |"]
    out += [f"| `{name}` | {'yes' if a.get('drain') else 'no'} | {a['meaning']} |" for name, a in cat["actions"].items()]
    return "\n".join(out) + "\n"
