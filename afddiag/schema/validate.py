"""Merge input checked before it is judged: one host's report against ``afddiag/schema/report.schema.json``
(the same file ``afddiag schema`` prints), plus what a schema cannot say (no NaN or infinity anywhere).

:func:`report_problem` gives the first problem as one line (``gates[3]: 'id' is required``) or None;
``afddiag merge`` and ``afddiag fleet`` make a report with a problem an ERROR row naming it and judge
the others.

The schema is compiled once into plain Python checks (:func:`compile_schema`) for the keywords it uses
(type, const, enum, required, properties, additionalProperties, items, anyOf, $ref to ``$defs``,
pattern, minLength, minimum, maximum, propertyNames; ``format`` is an annotation, as jsonschema treats
it by default): about four times faster than ``jsonschema`` (which is a test dependency only, and the
tests' oracle: tests/test_merge_input.py checks both agree on mutated reports), so a merge of
thousands of reports stays linear and quick. A keyword the compiler does not know raises at import,
so the schema cannot grow a rule that is silently skipped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from typing import Any

from afddiag.termsafe import line

Check = Callable[[Any, Any], "str | None"]  # (value, path: text or a lazy path, _at) -> the first problem, or None
_ANNOTATIONS = {"description", "title", "$schema", "$id", "$comment", "format", "examples", "default"}
_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}
MAX_SHOWN = 60  # characters of a bad value quoted in a problem


def _shown(v: Any) -> str:
    s = line(json.dumps(v, default=str) if not isinstance(v, str) else repr(v))
    return s if len(s) <= MAX_SHOWN else s[:MAX_SHOWN] + "..."


def _member(k: Any) -> str:
    """``.name`` for a plain ASCII name of at most 41 characters, else ``[<the name shown>]``."""
    k = str(k)
    return f".{k}" if len(k) <= 41 and k.isascii() and k.isidentifier() else f"[{_shown(k)}]"


def _key(path: str, k: Any) -> str:
    return path + _member(k)


MEMBER, INDEX, NAME = 0, 1, 2  # how a lazy path's last step reads: .key / [i] / " (name)"


def _at(p: Any) -> str:
    """A lazy path as text. The checks pass ``(parent, key, MEMBER|INDEX|NAME)`` tuples down, not
    strings: a path is only written out for the one problem that is reported."""
    steps: list[str] = []
    while isinstance(p, tuple):
        p, k, how = p
        steps.append(_member(k) if how == MEMBER else f"[{k}]" if how == INDEX else " (name)")
    return str(p) + "".join(reversed(steps))


def _scalar_checks(schema: dict[str, Any]) -> list[Check]:
    """The checks of ``schema``'s value keywords, in order: type, const, enum, pattern/minLength,
    minimum/maximum."""
    checks: list[Check] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        tests = [_TYPES[t] for t in types]
        want = " or ".join(types)
        one = tests[0] if len(tests) == 1 else None

        def typed(v: Any, p: Any) -> str | None:
            if one(v) if one is not None else any(t(v) for t in tests):
                return None
            return f"{_at(p)}: {_shown(v)} is not of type {want}"
        checks.append(typed)
    if "const" in schema:
        const = schema["const"]

        def is_const(v: Any, p: Any) -> str | None:
            return None if v == const and type(v) is type(const) else f"{_at(p)}: {_shown(v)} is not {_shown(const)}"
        checks.append(is_const)
    if "enum" in schema:
        allowed = schema["enum"]

        def in_enum(v: Any, p: Any) -> str | None:
            ok = any(v == a and (isinstance(v, bool) == isinstance(a, bool)) for a in allowed)
            return None if ok else f"{_at(p)}: {_shown(v)} is not one of {_shown(allowed)}"
        checks.append(in_enum)
    if "pattern" in schema or "minLength" in schema:
        pat = re.compile(schema["pattern"]) if "pattern" in schema else None
        min_len = schema.get("minLength", 0)

        def text(v: Any, p: Any) -> str | None:
            if not isinstance(v, str):
                return None
            if len(v) < min_len:
                return f"{_at(p)}: {_shown(v)} is shorter than {min_len}"
            if pat is not None and not pat.search(v):
                return f"{_at(p)}: {_shown(v)} does not match {pat.pattern!r}"
            return None
        checks.append(text)
    if "minimum" in schema or "maximum" in schema:
        lo, hi = schema.get("minimum"), schema.get("maximum")

        def bounded(v: Any, p: Any) -> str | None:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                return None
            if lo is not None and v < lo:
                return f"{_at(p)}: {_shown(v)} is less than {lo}"
            if hi is not None and v > hi:
                return f"{_at(p)}: {_shown(v)} is greater than {hi}"
            return None
        checks.append(bounded)
    return checks


def _container_checks(schema: dict[str, Any], root: dict[str, Any]) -> list[Check]:
    """The checks of ``schema``'s object and array keywords, in order: required, properties
    (additionalProperties, propertyNames), items, anyOf; subschemas compiled against ``root``."""
    checks: list[Check] = []
    if "required" in schema:
        required = list(schema["required"])

        def has(v: Any, p: Any) -> str | None:
            if isinstance(v, dict):
                missing = next((k for k in required if k not in v), None)
                if missing is not None:
                    return f"{_at(p)}: {missing!r} is required"
            return None
        checks.append(has)
    if "properties" in schema or "additionalProperties" in schema or "propertyNames" in schema:
        props = {k: compile_schema(s, root) for k, s in (schema.get("properties") or {}).items()}
        extra_schema = schema.get("additionalProperties", True)
        extra = compile_schema(extra_schema, root) if isinstance(extra_schema, dict) else None
        names = compile_schema(schema["propertyNames"], root) if "propertyNames" in schema else None

        def members(v: Any, p: Any) -> str | None:
            if not isinstance(v, dict):
                return None
            for k, item in v.items():
                sub = props.get(k) if isinstance(k, str) else None
                where = (p, k, MEMBER)
                if names is not None and (why := names(k, (where, None, NAME))):
                    return why
                if sub is not None:
                    why = sub(item, where)
                elif extra_schema is False:
                    why = f"{where}: no such property"
                else:
                    why = extra(item, where) if extra is not None else None
                if why:
                    return why
            return None
        checks.append(members)
    if "items" in schema:
        each = compile_schema(schema["items"], root)

        def items(v: Any, p: Any) -> str | None:
            if not isinstance(v, list):
                return None
            for i, item in enumerate(v):
                if why := each(item, (p, i, INDEX)):
                    return why
            return None
        checks.append(items)
    if "anyOf" in schema:
        options = [compile_schema(s, root) for s in schema["anyOf"]]

        def any_of(v: Any, p: Any) -> str | None:
            whys = [o(v, p) for o in options]
            return None if any(w is None for w in whys) else whys[0]
        checks.append(any_of)
    return checks


def compile_schema(schema: dict[str, Any], root: dict[str, Any] | None = None) -> Check:
    """``schema`` (a JSON Schema of the subset above) as one check function."""
    root = root if root is not None else schema
    checks: list[Check] = []
    unknown = set(schema) - _ANNOTATIONS - {"type", "const", "enum", "required", "properties", "additionalProperties",
                                            "items", "anyOf", "$ref", "$defs", "pattern", "minLength", "minimum",
                                            "maximum", "propertyNames"}
    if unknown:
        raise ValueError(f"report schema: keyword(s) {sorted(unknown)} not supported by afddiag.schema.validate")
    if "$ref" in schema:
        ref = schema["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"report schema: $ref {ref!r}: only #/$defs/... is supported")
        target = compile_schema(root["$defs"][ref[len("#/$defs/"):]], root)
        checks.append(target)
    checks += _scalar_checks(schema)
    checks += _container_checks(schema, root)

    if len(checks) == 1:
        return checks[0]

    def check(v: Any, p: Any) -> str | None:
        for c in checks:
            if why := c(v, p):
                return why
        return None
    return check


@lru_cache(maxsize=1)
def report_check() -> Check:
    """``report.schema.json`` compiled (once)."""
    text = resources.files("afddiag.schema").joinpath("report.schema.json").read_text(encoding="utf-8")
    return compile_schema(json.loads(text))


@lru_cache(maxsize=1)
def summary_check() -> Check:
    """The ``summary`` part of ``report.schema.json`` compiled (once): what :func:`afddiag.summary.load` checks."""
    text = resources.files("afddiag.schema").joinpath("report.schema.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    return compile_schema(schema["properties"]["summary"], schema)


def _non_finite(obj: Any) -> str | None:
    """The path of the first NaN or infinity in ``obj`` (JSON allows neither; Python's reader does),
    else None. Iterative: any depth. (``json.dumps`` finds there is none fastest; the walk names where.)"""
    try:
        json.dumps(obj, allow_nan=False, default=str)
        return None
    except (ValueError, RecursionError):
        pass
    stack: list[tuple[Any, str]] = [(obj, "report")]
    while stack:
        v, p = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return f"{p}: {v!r} is not a number JSON allows"
        if isinstance(v, dict):
            stack.extend((item, _key(p, k)) for k, item in reversed(list(v.items())))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in reversed(list(enumerate(v))))
    return None


def report_problem(rep: Any) -> str | None:
    """The first problem of one host's report as one line (schema first, then NaN/infinity), else None."""
    why = report_check()(rep, "report")
    return why or _non_finite(rep)
