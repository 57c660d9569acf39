"""The gate catalog (``checks/gates.toml``): what each gate checks, reads, and its remedy.

``checks/`` is installed as the package ``afddiag.checks``; from a source tree it is read in place.

``checks/gates.json`` is the same catalog parsed, with the size and CRC-32 of the ``gates.toml`` it was
made from: a run reads it when they match (``tomllib`` parsing the catalog was a tenth of a whole
`afddiag gpu` run), else parses the TOML, so an edited catalog is never shadowed by a stale twin.
``python -m afddiag.catalog`` rewrites the twin; a test keeps it current, as it does docs/GATES.md.
"""

from __future__ import annotations

import functools
import json
import sys
import zlib
from pathlib import Path
from typing import Any

from afddiag import packaged
from afddiag.exitcodes import CatalogError  # defined there so the CLI catches it without loading this module
from afddiag.shellcmd import fill
from afddiag.textlayout import wrap

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def listing(width: int | None = None) -> list[str]:
    """``afddiag catalog``'s lines: each gate id padded to the longest, then its title; with ``width``
    (a terminal's columns) the title wraps between words under itself (:func:`afddiag.textlayout.wrap`)."""
    gates = load()["gates"]
    pad = max(len(g) for g in gates) + 1
    if width is None or width < pad + 20:
        return [f"{gid:<{pad}}{g['title']}" for gid, g in gates.items()]
    return [ln for gid, g in gates.items() for ln in wrap(g["title"], width, f"{gid:<{pad}}", " " * pad)]


@functools.lru_cache(maxsize=1)
def load() -> dict[str, Any]:
    """The parsed catalog: ``{"gates": {id: {...}}, "remedies": {key: text}}``, from the JSON twin
    (checks/gates.json) when it matches the TOML's size and CRC-32, else from checks/gates.toml.

    Raises :class:`CatalogError` when checks/gates.toml is missing, unreadable or not valid TOML
    (a corrupt or stale twin is ignored, never an error).
    """
    try:
        text = packaged.read_text("checks", "gates.toml")
    except (OSError, UnicodeError) as e:
        raise CatalogError(f"gate catalog checks/gates.toml unreadable ({getattr(e, 'strerror', None) or e}): "
                           "reinstall afddiag (./scripts/setup.sh) or restore the file "
                           "(git checkout checks/gates.toml)") from None
    try:
        twin = json.loads(packaged.read_text("checks", TWIN))
        if twin.get("source_digest") == _digest(text):
            return twin["catalog"]
    except (OSError, ValueError, KeyError, AttributeError):  # no twin, or not ours: parse the TOML
        pass
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"gate catalog checks/gates.toml is not valid TOML ({e}): undo the last edit "
                           "(git diff checks/gates.toml) or restore it (git checkout checks/gates.toml)") from None


TWIN = "gates.json"


def _digest(text: str) -> str:
    """``"<bytes>:<crc32 hex>"`` of the catalog's UTF-8 text (zlib: hashlib's OpenSSL import alone
    would cost a fifth of what the twin saves); it tells an edited catalog, not a forged one."""
    data = text.encode("utf-8")
    return f"{len(data)}:{zlib.crc32(data):08x}"


def compiled(text: str) -> str:
    """The twin of catalog TOML ``text``: JSON ``{"source_digest", "catalog"}`` (keys in the
    TOML's order), ending in a newline. Raises ``tomllib.TOMLDecodeError`` on a bad catalog."""
    doc = {"source_digest": _digest(text), "catalog": tomllib.loads(text)}
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def remedy(key: str) -> str:
    """The catalog's remedy for a gate id or an extra remedy key; "" when there is none."""
    cat = load()
    gate = cat.get("gates", {}).get(key)
    if gate:
        return gate.get("remedy", "")
    return cat.get("remedies", {}).get(key, "")


def commands(key: str, **values: object) -> list[str]:
    """The catalog's remedy commands for a gate id (its ``commands``) or an extra key (``[commands]``),
    each template filled with ``values`` quoted as one word each (:func:`afddiag.shellcmd.fill`);
    [] when there are none. Raises KeyError when a template names a field ``values`` lacks."""
    cat = load()
    gate = cat.get("gates", {}).get(key)
    templates = gate.get("commands", []) if gate else cat.get("commands", {}).get(key, [])
    return [fill(t, values) for t in templates]


def _drain_word(action: str, actions: dict[str, Any]) -> str:
    return f"`{action}`" + (" (drains on FAIL)" if actions.get(action, {}).get("drain") else "")


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
        acts = cat["actions"]
        out += [f"- Remedy: {g['remedy']}"]
        out += [f"- Commands: {', '.join(f'`{c}`' for c in g['commands'])}"] if g.get("commands") else []
        out += [f"- Action: {_drain_word(g.get('action', 'NONE'), acts)}"
                + (f" (WARN: `{g['warn_action']}`)" if g.get("warn_action") else "")
                + ("; also " + ", ".join(_drain_word(a, acts) for a in g["also_actions"]) if g.get("also_actions")
                   else "")]
        if g.get("depends"):
            mode = g.get("on_dependency_failure", "own concern")
            out.append(f"- Depends on: {', '.join(f'`{d}`' for d in g['depends'])} (when one FAILs: "
                       + ("judges only its own concern" if mode == "own concern" else
                          "SKIP \"not judged: <gate> failed\"") + ")")
        out.append(f"- From: {g['source']}")
    out += ["", "## Actions", "",
            "Every remedy carries one action from this closed set (JSON `action` on each gate and diagnosis entry). "
            "The drain flag is one rule: a FAIL whose action is marked drain takes the node out (JSON `\"drain\": "
            "true`, the tag `[ACTION, drain]`; `preflight --drain` and the Slurm hooks drain it); a WARN or ERROR "
            "never drains, and no remedy says to drain where the flag is false.", "",
            "A remedy is prose plus commands (JSON `commands`): each a complete shell command `bash -n` accepts, the "
            "host's values quoted as one word; a launch-file setting is `export NAME=value`; a remedy with no safe "
            "command has none. The templates above show a field such as `{netdev}` where the host's value goes.",
            "",
            "| action | drain | meaning |", "| --- | --- | --- |"]
    out += [f"| `{name}` | {'yes' if a.get('drain') else 'no'} | {a['meaning']} |"
            for name, a in cat["actions"].items()]
    return "\n".join(out) + "\n"


def main() -> None:
    """``python -m afddiag.catalog``: rewrite ``checks/gates.json`` from ``checks/gates.toml`` (source tree)."""
    src = Path(__file__).resolve().parent.parent / "checks"
    (src / TWIN).write_text(compiled((src / "gates.toml").read_text(encoding="utf-8")), encoding="utf-8")
    print(src / TWIN)


if __name__ == "__main__":
    main()
