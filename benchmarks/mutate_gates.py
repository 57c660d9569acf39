"""Mutation run of the judging code: how many plausible defects in ``afddiag/gates/*.py`` and
``afddiag/diagnosis.py`` the tests notice. Not part of CI (it takes tens of minutes).

Each mutant is one small change made on the module's syntax tree:

- ``cmp``: a comparison flipped at its edge or negated (``<`` ↔ ``<=``, ``>`` ↔ ``>=``, ``==`` ↔ ``!=``,
  ``in`` ↔ ``not in``, ``is`` ↔ ``is not``);
- ``num``: a numeric threshold moved (an integer by one, a float by 10 %; 0.0 to 0.01): numbers in a
  comparison and in module-level UPPER_CASE constants;
- ``neg``: a condition negated (``if``, ``while``, conditional expressions, comprehension filters);
- ``verdict``: a verdict constant handed to a call swapped (FAIL→WARN, WARN→PASS, PASS→WARN,
  SKIP→PASS, ERROR→SKIP);
- ``action``: a typed action string from ``checks/gates.toml [actions]`` swapped (RESET_GPU→RERUN, RERUN→NONE,
  NONE→RERUN, any other→RERUN);
- ``ret``: an early return dropped (an ``if`` without ``else`` that ends in ``return`` and is not the last
  statement of its block is deleted).

Per mutant, a forked copy of one process that has already imported afddiag and the test modules
patches the mutated functions' code objects in place (tests that imported a function by name see the
mutant too) and writes the mutated file into a private copy of the repository (so a test that runs
``python -m afddiag`` in a subprocess sees it as well), then runs the test files that exercise that
module with ``pytest -x -q``. A failing test kills the mutant; a run past the time bound counts as
killed (timeout). Survivors listed in ``benchmarks/mutation_equivalent.txt`` (with the reason each
changes no behaviour) are counted apart.

``--results FILE`` appends each finished mutant to a JSON-lines file (site, operator, outcome, seconds) and
skips those already there, so a stopped run carries on where it stopped; ``--wall`` bounds a run's time,
``--order random`` makes any prefix of the run a uniform sample, ``--tree`` mutates an exported tree where
there is no git repository, and ``--merge`` builds one report from results files and text reports. Usage::

    .venv/bin/python benchmarks/mutate_gates.py --ref main --limit 40 --seed 21      # a sample
    .venv/bin/python benchmarks/mutate_gates.py --ref HEAD --out benchmarks/results/mutation.txt
    .venv/bin/python benchmarks/mutate_gates.py --list | head                           # the sites only
    # the full set in 14 shards, resumable, each stopping after 8 minutes; then one report
    .venv/bin/python benchmarks/mutate_gates.py --ref HEAD --order random --shard K/14 --wall 480 \
        --results shard-K.jsonl                                                         # K = 0 .. 13
    .venv/bin/python benchmarks/mutate_gates.py --merge shard-*.jsonl --out benchmarks/results/mutation.txt
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parent.parent
TARGETS = ["afddiag/gates/__init__.py", "afddiag/gates/fabric.py", "afddiag/gates/devicemap.py",
           "afddiag/gates/rail.py", "afddiag/gates/gpu.py", "afddiag/gates/gpu_load.py", "afddiag/gates/host.py",
           "afddiag/gates/launch.py", "afddiag/gates/fleet.py", "afddiag/gates/control_plane.py",
           "afddiag/gates/refusals.py", "afddiag/gates/nic.py", "afddiag/diagnosis.py"]
# test files that exercise each module (judging and unit tests; the slow end-to-end ones — SSH, browser,
# signals, fuzz, QEMU lab — and the probes' timing tests, which a loaded machine can fail, are left to the
# full suite). The new tests/test_judging_*.py are added when present.
TESTS = {
    "__init__.py": ["test_judging_preambles.py", "test_runner.py", "test_gates.py", "test_emitted_actions.py",
                    "test_judging_fabric.py", "test_judging_gpu.py", "test_judging_host.py", "test_judging_launch.py",
                    "test_judging_rail.py"],
    "fabric.py": ["test_judging_fabric.py", "test_nic_hotplug.py", "test_gates.py", "test_fabric_remedies.py",
                  "test_rail_bandwidth.py",
                  "test_link_speed.py", "test_policy_route.py", "test_mem_registration.py", "test_pair_unit.py",
                  "test_emitted_actions.py", "test_root_causes.py", "test_launch.py", "test_edges.py",
                  "test_cases.py", "test_runner.py", "test_named_expectations.py"],
    "rail.py": ["test_judging_rail.py", "test_judging_fabric.py", "test_rail_bandwidth.py", "test_link_speed.py",
                "test_pair_unit.py", "test_emitted_actions.py", "test_root_causes.py", "test_gates.py",
                "test_cases.py"],
    "gpu.py": ["test_judging_gpu.py", "test_gates.py", "test_gpu_fixtures.py", "test_gpu_review.py",
               "test_xid_no_gpu.py", "test_headroom.py", "test_memory_plan.py", "test_health.py",
               "test_emitted_actions.py", "test_root_causes.py", "test_h200_busy_replay.py",
               "test_h200_issue15_replay.py", "test_edges.py", "test_cases.py", "test_load_probe.py",
               "test_named_expectations.py"],
    "host.py": ["test_judging_host.py", "test_cpu_clock.py", "test_pcie.py", "test_health.py", "test_policy_route.py",
                "test_emitted_actions.py", "test_root_causes.py", "test_edges.py", "test_cases.py",
                "test_h200_issue15_replay.py"],
    "launch.py": ["test_judging_launch.py", "test_launch.py", "test_control_plane.py", "test_memory_plan.py",
                  "test_emitted_actions.py", "test_root_causes.py", "test_cases.py"],
    "fleet.py": ["test_judging_fleet.py", "test_fleet_like_with_like.py", "test_fleet_control_plane.py",
                 "test_merge.py", "test_emitted_actions.py", "test_root_causes.py", "test_operator.py"],
    "refusals.py": ["test_health.py", "test_cpu_clock.py", "test_root_causes.py", "test_runner.py"],
    "diagnosis.py": ["test_judging_diagnosis.py", "test_root_causes.py", "test_emitted_actions.py", "test_gates.py",
                     "test_cpu_clock.py", "test_gpu_review.py", "test_xid_no_gpu.py", "test_runner.py",
                     "test_cases.py"],
}
# modules the judging moved to: the tests of the module it left, and their own
TESTS["devicemap.py"] = TESTS["fabric.py"]
TESTS["nic.py"] = TESTS["fabric.py"]
TESTS["gpu_load.py"] = TESTS["gpu.py"]
TESTS["control_plane.py"] = [*TESTS["fleet.py"], "test_control_plane.py", "test_judging_launch.py", "test_summary.py"]
VERDICT_SWAP = {"FAIL": "WARN", "WARN": "PASS", "PASS": "WARN", "SKIP": "PASS", "ERROR": "SKIP"}
CMP_SWAP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
CMP_TXT = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.In: "in",
           ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}


def action_names(root: Path) -> set[str]:
    return set(tomllib.loads((root / "checks" / "gates.toml").read_text())["actions"])


@dataclass
class Site:
    file: str  # repository-relative
    index: int  # n-th site of the file, in walk order
    line: int
    func: str  # enclosing function's qualified name ("<module>" at the top)
    op: str
    desc: str
    occurrence: int = 0  # n-th site of the function with this operator and description (they can repeat)

    @property
    def key(self) -> str:
        """Stable across line moves: file, function, operator, what changed, and ``#n`` for the n-th
        repeat of those within the function (``x or 0`` twice in one comparison, say)."""
        return f"{self.file}::{self.func}::{self.op}::{self.desc}" + (f" #{self.occurrence}" if self.occurrence else "")


class _Mutator(ast.NodeTransformer):
    """Walks a module; counts every mutation site; applies the one numbered ``target`` (None: count only)."""

    def __init__(self, actions: set[str], target: int | None = None):
        self.actions, self.target = actions, target
        self.sites: list[tuple[int, str, str, str]] = []  # (line, func, op, desc)
        self.stack: list[str] = []
        self.applied = False
        self.upper_assign = 0  # >0 inside a module-level UPPER_CASE assignment
        self.in_compare = 0

    # ---- bookkeeping
    def _site(self, node: ast.AST, op: str, desc: str) -> bool:
        """Record a site; True when it is the one to apply."""
        n = len(self.sites)
        self.sites.append((getattr(node, "lineno", 0), ".".join(self.stack) or "<module>", op, desc))
        if self.target == n:
            self.applied = True
            return True
        return False

    def _scoped(self, node):
        self.stack.append(node.name)
        node = self.generic_visit(node)
        self.stack.pop()
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    # ---- drop early returns: handled on statement lists
    def _block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out = []
        for i, st in enumerate(body):
            if (isinstance(st, ast.If) and not st.orelse and st.body and isinstance(st.body[-1], ast.Return)
                    and i < len(body) - 1):
                if self._site(st, "ret", f"drop `if {ast.unparse(st.test)[:60]}: return`"):
                    continue
            out.append(st)
        return out

    def generic_visit(self, node):
        for name in ("body", "orelse", "finalbody"):
            b = getattr(node, name, None)
            if isinstance(b, list) and b and isinstance(b[0], ast.stmt):
                new = self._block(b)
                setattr(node, name, new if new else [ast.Pass()])
        return super().generic_visit(node)

    # ---- constants
    def visit_Assign(self, node):
        upper = not self.stack and any(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
        self.upper_assign += upper
        node = self.generic_visit(node)
        self.upper_assign -= upper
        return node

    def visit_Compare(self, node):
        new_ops = list(node.ops)
        for i, o in enumerate(node.ops):
            t = type(o)
            if self._site(node, "cmp", f"{CMP_TXT[t]} -> {CMP_TXT[CMP_SWAP[t]]} in `{ast.unparse(node)[:60]}`"):
                new_ops[i] = CMP_SWAP[t]()
        node.ops = new_ops
        self.in_compare += 1
        node = self.generic_visit(node)
        self.in_compare -= 1
        return node

    def visit_Constant(self, node):
        v = node.value
        if isinstance(v, (int, float)) and not isinstance(v, bool) and (self.in_compare or self.upper_assign):
            nv = v + 1 if isinstance(v, int) else (round(v * 1.1, 6) if v else 0.01)
            if self._site(node, "num", f"{v!r} -> {nv!r}"):
                return ast.copy_location(ast.Constant(nv), node)
        if isinstance(v, str) and v in self.actions:
            nv = {"RESET_GPU": "RERUN", "RERUN": "NONE", "NONE": "RERUN"}.get(v, "RERUN")
            if self._site(node, "action", f"{v} -> {nv}"):
                return ast.copy_location(ast.Constant(nv), node)
        return node

    def visit_Call(self, node):
        node = self.generic_visit(node)
        args = list(node.args) + [k.value for k in node.keywords]
        for a in args:
            if isinstance(a, ast.Name) and a.id in VERDICT_SWAP and self.stack:
                if self._site(a, "verdict", f"{a.id} -> {VERDICT_SWAP[a.id]}"):
                    a.id = VERDICT_SWAP[a.id]
        return node

    # ---- conditions
    def _neg(self, node, attr):
        test = getattr(node, attr)
        if self._site(node, "neg", f"not ({ast.unparse(test)[:60]})"):
            setattr(node, attr, ast.UnaryOp(ast.Not(), test))

    def visit_If(self, node):
        self._neg(node, "test")
        return self.generic_visit(node)

    def visit_While(self, node):
        self._neg(node, "test")
        return self.generic_visit(node)

    def visit_IfExp(self, node):
        self._neg(node, "test")
        return self.generic_visit(node)

    def visit_comprehension(self, node):
        new = []
        for c in node.ifs:
            if self._site(c, "neg", f"not ({ast.unparse(c)[:60]}) in a comprehension"):
                c = ast.UnaryOp(ast.Not(), c)
            new.append(c)
        node.ifs = new
        return self.generic_visit(node)


def sites_of(root: Path, rel: str, actions: set[str]) -> list[Site]:
    m = _Mutator(actions)
    m.visit(ast.parse((root / rel).read_text()))
    seen: dict[tuple, int] = {}
    out = []
    for i, (line, func, op, desc) in enumerate(m.sites):
        n = seen[(func, op, desc)] = seen.get((func, op, desc), -1) + 1
        out.append(Site(rel, i, line, func, op, desc, n))
    return out


def mutant_source(root: Path, site: Site, actions: set[str]) -> str:
    tree = ast.parse((root / site.file).read_text())
    m = _Mutator(actions, target=site.index)
    tree = ast.fix_missing_locations(m.visit(tree))
    assert m.applied, site
    return ast.unparse(tree)


# ---------------------------------------------------------------- running one mutant

def _patch(mod: types.ModuleType, src: str, path: str) -> None:
    """Run the mutated source in a scratch namespace and move what changed into ``mod``: functions and
    methods get the mutant's code objects (so every reference already taken sees them), plain values
    (thresholds, tables) are replaced."""
    ns: dict = {"__name__": mod.__name__, "__file__": path, "__package__": mod.__package__}
    exec(compile(src, path, "exec"), ns)  # noqa: S102 - the mutated judging code, ours

    def move_fn(old, new):
        old = getattr(old, "__func__", old)
        new = getattr(new, "__func__", new)
        if isinstance(old, property):
            for a in ("fget", "fset", "fdel"):
                if getattr(old, a) is not None:
                    move_fn(getattr(old, a), getattr(new, a))
            return
        if isinstance(old, types.FunctionType) and isinstance(new, types.FunctionType):
            if hasattr(old, "__wrapped__") and hasattr(new, "__wrapped__"):  # @gate(...): the judging function
                move_fn(old.__wrapped__, new.__wrapped__)
                return
            old.__code__ = new.__code__
            old.__defaults__, old.__kwdefaults__ = new.__defaults__, new.__kwdefaults__

    for name, new in ns.items():
        old = mod.__dict__.get(name)
        if isinstance(new, types.FunctionType) and isinstance(old, types.FunctionType):
            move_fn(old, new)
        elif isinstance(new, type) and isinstance(old, type):
            for k, v in vars(new).items():
                if k in vars(old):
                    move_fn(vars(old)[k], v)
        elif (not name.startswith("_") and isinstance(new, (int, float, str, tuple, frozenset, dict, list, set))
              and new != old):  # a private table is state (the gate declarations), never a threshold
            mod.__dict__[name] = new


def run_mutant(root: Path, site: Site, src: str, tests: list[str], timeout: float,
               log: Path | None = None) -> tuple[str, float]:
    """Fork; the child patches the module and runs pytest; → (outcome, seconds). ``log``: where the
    child's pytest output goes (default: nowhere)."""
    path = root / site.file
    original = path.read_text()
    path.write_text(src)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        try:
            import importlib

            import pytest

            modname = site.file[:-3].replace("/", ".").removesuffix(".__init__")
            _patch(importlib.import_module(modname), src, str(path))
            if not os.environ.get("MUTATE_SHOW_OUTPUT"):  # set it to see a run's pytest output
                out = os.open(str(log) if log else os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, 1)
                os.dup2(out, 2)
            rc = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-m", "not lab and not gpu", *tests])
            os._exit(int(rc))
        except BaseException:  # noqa: BLE001
            os._exit(99)
    outcome = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                rc = os.waitstatus_to_exitcode(status)
                outcome = {0: "survived", 1: "killed", 2: "killed"}.get(rc, "killed" if rc > 0 and rc != 99
                                                                            and rc != 5 else f"error(rc={rc})")
                break
            if time.monotonic() - t0 > timeout:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                outcome = "killed(timeout)"
                break
            time.sleep(0.05)
    finally:
        path.write_text(original)
    return outcome, time.monotonic() - t0


def load_equivalent(path: Path) -> dict[str, str]:
    """``key  # reason`` lines → {key: reason}."""
    out = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                key, _, why = line.partition("  # ")
                out[key.strip()] = why.strip()
    return out


# ---------------------------------------------------------------- results files (JSON lines)
#
# One object a line, appended as each mutant finishes (so a run stopped at any point keeps what it did):
#   {"rev": "64f4ff9", "file": "afddiag/gates/gpu.py", "index": 17, "line": 96, "func": "read_failures",
#    "op": "cmp", "desc": "in -> not in in `...`", "outcome": "killed", "seconds": 4.2}
# "index" -1 with op "none" is the unmutated run of a file's tests (its time sets that file's bound).

def load_results(paths: list[str], rev: str | None = None) -> dict[tuple[str, int], dict]:
    """The rows of results files, by (file, site index); the last row of a site wins. ``rev``: keep only
    rows of that revision (a resumed run never mixes sites numbered on another tree)."""
    rows: dict[tuple[str, int], dict] = {}
    for p in paths:
        if not Path(p).is_file():
            continue
        for n, line in enumerate(Path(p).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                key = (r["file"], int(r["index"]))
            except (ValueError, KeyError, TypeError):
                print(f"{p}:{n}: not a results row, left out", file=sys.stderr)
                continue
            if rev is None or r.get("rev") == rev:
                rows[key] = r
    return rows


def append_result(path: str, row: dict) -> None:
    """One JSON line, written with a single write of an append-mode file (a line stays whole)."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def row_text(outcome: str, secs: float, file: str, line: int, op: str, desc: str, func: str,
             occurrence: int = 0) -> str:
    row = f"{outcome:16s} {secs:6.1f}s {file}:{line} {op}: {desc}  [{func}]"
    return row + (f" #{occurrence}" if occurrence else "")


def result_row(r: dict) -> str:
    """row_text of a results-file row."""
    return row_text(r["outcome"], r["seconds"], r["file"], r["line"], r["op"], r["desc"], r["func"],
                    int(r.get("occurrence") or 0))


def report(first: str, rows: list[str], equivalent: dict[str, str]) -> tuple[str, list[str]]:
    """The report of ``rows`` (row_text lines), survivors listed in ``equivalent`` counted apart;
    → (report text, its head lines)."""
    row_re = re.compile(r"^survived\s+\S+s (\S+?):\d+ (\w+): (.*)  \[(.*)\]( #\d+)?$")
    rows = list(rows)
    for i, r in enumerate(rows):
        m = row_re.match(r)
        if m and (k := f"{m[1]}::{m[4]}::{m[2]}::{m[3]}{m[5] or ''}") in equivalent:
            rows[i] = r + f"  (equivalent: {equivalent[k]})"
    counts = {"killed": 0, "survived": 0, "equivalent": 0, "error": 0}
    per_file: dict[str, list[int]] = {}
    for r in rows:
        kind = "equivalent" if "(equivalent: " in r else r.split()[0].split("(")[0]
        counts[kind] = counts.get(kind, 0) + 1
        pf = per_file.setdefault(r.split()[2].rsplit(":", 1)[0], [0, 0])
        if kind in ("killed", "survived"):
            pf[0] += kind == "killed"
            pf[1] += 1
    changed = counts["killed"] + counts["survived"]
    head = [first,
            f"killed {counts['killed']}, survived {counts['survived']}, equivalent (no behaviour change, listed in "
            f"benchmarks/mutation_equivalent.txt) {counts['equivalent']}, errors {counts['error']}",
            f"kill rate of behaviour-changing mutants: {counts['killed']}/{changed} = "
            f"{100 * counts['killed'] / max(changed, 1):.1f} %",
            "per file: " + ", ".join(f"{Path(f).name} {k}/{n}" for f, (k, n) in sorted(per_file.items())), ""]
    survivors = [r for r in rows if r.startswith("survived") and "(equivalent: " not in r]
    text = "\n".join(head + ["survivors:"] + (survivors or ["(none)"]) + ["", "every mutant:"] + rows) + "\n"
    return text, head


# ---------------------------------------------------------------- the run

def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="HEAD", help="git ref whose afddiag and tests are mutated and run (default HEAD); "
                    "with --tree, the name recorded for that tree")
    ap.add_argument("--tree", default="", help="mutate this exported tree (a copy of the repository's files) "
                    "instead of `git archive REF` (for a machine without the git repository)")
    ap.add_argument("--limit", type=int, default=0, help="run this many mutants, sampled per file (0: all)")
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--order", choices=["file", "random"], default="file",
                    help="file: in file and site order; random: a uniform shuffle by --seed (a run stopped "
                         "early is then an unbiased sample)")
    ap.add_argument("--only", default="", help="only files whose path contains this")
    ap.add_argument("--list", action="store_true", help="list the sites and stop")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant before it counts as killed")
    ap.add_argument("--wall", type=float, default=0.0, help="start no mutant after this many seconds; one still "
                    "running then is stopped and not recorded (a resumed run does it again); 0: no bound")
    ap.add_argument("--out", default="", help="also write the report here")
    ap.add_argument("--results", default="", help="JSON-lines file: each finished mutant is appended; the mutants "
                    "already in it (and in --resume files) are skipped, so a rerun carries on")
    ap.add_argument("--resume", nargs="+", default=[], help="more results files whose mutants are done")
    ap.add_argument("--baseline-only", action="store_true", help="run only the unmutated checks (with --shard: "
                    "that share of the files), record them in --results, and stop")
    ap.add_argument("--shard", default="", help="K/N: run every N-th mutant of the sample from the K-th (0-based)")
    ap.add_argument("--merge", nargs="+", default=[], help="combine shards' reports or results files into --out "
                    "and stop")
    return ap.parse_args()


def _select(a: argparse.Namespace, sites: list[Site]) -> list[Site]:
    """The sample (--limit), its order (--order) and this shard's share (--shard)."""
    rng = random.Random(a.seed)
    if a.limit and a.limit < len(sites):
        by_file: dict[str, list[Site]] = {}
        for s in sites:
            by_file.setdefault(s.file, []).append(s)
        chosen: list[Site] = []
        for ss in by_file.values():
            chosen += rng.sample(ss, max(1, round(a.limit * len(ss) / len(sites))))
        sites = sorted(chosen, key=lambda s: (TARGETS.index(s.file), s.index))
    if a.order == "random":
        sites = sorted(sites, key=lambda s: (TARGETS.index(s.file), s.index))
        random.Random(a.seed).shuffle(sites)
    if a.shard:
        k, n = (int(x) for x in a.shard.split("/"))
        sites = sites[k::n]
    return sites


def _prepare(a: argparse.Namespace) -> tuple[Path, str]:
    """A private copy of the tree to mutate: → (its root, the revision's name)."""
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    root = Path(tempfile.mkdtemp(prefix="afddiag-mutants-")) / "repo"
    if a.tree:
        shutil.copytree(a.tree, root, ignore=shutil.ignore_patterns(".venv", "__pycache__", ".git"))
        return root, a.ref
    root.mkdir()
    subprocess.run(f"git -C {REPO} archive {a.ref} | tar -x -C {root}", shell=True, check=True)
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", a.ref], capture_output=True,
                         text=True).stdout.strip()
    return root, rev


def _import_tests(root: Path, every: list[str]) -> None:
    """One parent that has imported afddiag and the test modules (the root copy first on the path)."""
    os.chdir(root)
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ.setdefault("AFDDIAG_CASES", str(REPO.parent / "shared" / "cases"))
    for m in [m for m in sys.modules if m == "afddiag" or m.startswith("afddiag.")]:
        del sys.modules[m]
    import pytest

    with open(os.devnull, "w") as dn:
        old = sys.stdout
        sys.stdout = dn
        try:
            pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *every])
        finally:
            sys.stdout = old


def _baselines(a, root: Path, rev: str, files: list[str], done: dict, tests_for) -> dict[str, float]:
    """Each file's bound per mutant (4x its unmutated run, 60 s at least, --timeout at most), from a
    recorded unmutated run or a new one (recorded); a file whose tests fail unmutated gets none (every
    mutant would count as killed): its mutants are left out, said on stderr."""
    bound: dict[str, float] = {}
    for f in files:
        r = done.get((f, -1))
        if r is None:
            src = (root / f).read_text()
            log = root.parent / f"baseline-{Path(f).name}.log"
            for _attempt in range(2):  # once more: a timing test can fail on a loaded machine
                outcome, secs = run_mutant(root, Site(f, -1, 0, "<module>", "none", "unmutated"), src,
                                           tests_for(f), a.timeout, log)
                if outcome == "survived":
                    break
            print(f"unmutated {f}: {outcome} in {secs:.0f} s", flush=True)
            if outcome != "survived":
                print(f"{f}: its tests fail without a mutation ({outcome}); its mutants are left out. The end of "
                      f"its log:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]),
                      file=sys.stderr, flush=True)
            r = {"rev": rev, "file": f, "index": -1, "line": 0, "func": "<module>", "op": "none",
                 "desc": "unmutated", "outcome": outcome, "seconds": round(secs, 2)}
            append_result(a.results, r)
            done[(f, -1)] = r
        if r["outcome"] == "survived":
            bound[f] = min(a.timeout, max(60.0, 4 * float(r["seconds"])))
    return bound


def main() -> int:
    a = _args()
    if a.merge:
        return merge(a.merge, a.out)
    root, rev = _prepare(a)
    actions = action_names(root)
    sites = [s for f in TARGETS if a.only in f and (root / f).is_file() for s in sites_of(root, f, actions)]
    if a.list:
        for s in sites:
            print(f"{s.file}:{s.line} {s.op} {s.desc}  [{s.func}]")
        return 0
    n_all = len(sites)
    sites = _select(a, sites)
    done = load_results([a.results, *a.resume], rev)
    if a.baseline_only:
        files = sorted({s.file for s in sites_of_files(root, a, actions)}, key=TARGETS.index)
        if a.shard:
            k, n = (int(x) for x in a.shard.split("/"))
            files = files[k::n]
        sites = []
    else:
        files = sorted({s.file for s in sites if (s.file, s.index) not in done}, key=TARGETS.index)
    todo = [s for s in sites if (s.file, s.index) not in done]
    print(f"{len(sites)} mutants of {n_all} sites here, {len(sites) - len(todo)} already in the results files",
          flush=True)

    def tests_for(rel: str) -> list[str]:
        return [f"tests/{t}" for t in TESTS[Path(rel).name] if (root / "tests" / t).is_file()]

    _import_tests(root, sorted({t for f in TARGETS for t in tests_for(f)}))
    t_all = time.monotonic()
    bound = _baselines(a, root, rev, files, done, tests_for)
    lines = [result_row(r) for s in sites if (r := done.get((s.file, s.index)))]
    stopped = 0
    for i, s in enumerate(todo, 1):
        left = a.wall - (time.monotonic() - t_all) if a.wall else a.timeout
        if s.file not in bound or left <= 0:
            stopped += left <= 0
            continue
        outcome, secs = run_mutant(root, s, mutant_source(root, s, actions), tests_for(s.file),
                                   min(bound[s.file], left))
        if outcome == "killed(timeout)" and left < bound[s.file]:  # stopped by --wall, not by its bound
            stopped += 1
            continue
        append_result(a.results, {"rev": rev, "file": s.file, "index": s.index, "line": s.line, "func": s.func,
                                  "op": s.op, "desc": s.desc, "occurrence": s.occurrence, "outcome": outcome,
                                  "seconds": round(secs, 2)})
        lines.append(row_text(outcome, secs, s.file, s.line, s.op, s.desc, s.func, s.occurrence))
        print(f"[{i}/{len(todo)}] {lines[-1]}", flush=True)
    first = (f"mutation run of afddiag/gates/*.py and afddiag/diagnosis.py at {a.ref} ({rev}); {len(lines)} of "
             f"{len(sites)} mutants" + (f" (sample --limit {a.limit} --seed {a.seed})" if a.limit else " (all sites)")
             + (f", shard {a.shard}" if a.shard else "") + f", {time.monotonic() - t_all:.0f} s here"
             + (f"; {stopped} not run (--wall)" if stopped else ""))
    text, head = report(first, lines, load_equivalent(REPO / "benchmarks" / "mutation_equivalent.txt"))
    print("\n".join(head))
    if a.out:
        Path(REPO / a.out if not os.path.isabs(a.out) else a.out).write_text(text)
    return 0


def sites_of_files(root: Path, a: argparse.Namespace, actions: set[str]) -> list[Site]:
    """One pseudo-site per target file present (for --baseline-only)."""
    return [Site(f, -1, 0, "<module>", "none", "unmutated") for f in TARGETS if a.only in f and (root / f).is_file()]


def merge(paths: list[str], out: str) -> int:
    """One report from shards' text reports (their "every mutant:" rows) and results files (JSON lines;
    a site done in several counts once, its last row), counted again."""
    rows, heads, results = [], [], []
    for p in paths:
        text = Path(p).read_text()
        if text.lstrip().startswith("{"):
            results.append(p)
            continue
        heads.append(text.splitlines()[0])
        rows += [r for r in text.split("every mutant:\n", 1)[1].splitlines() if r.strip()]
    if results:
        done = load_results(results)
        revs = sorted({r.get("rev", "?") for r in done.values()})
        muts = sorted((r for r in done.values() if r["index"] >= 0),
                      key=lambda r: (TARGETS.index(r["file"]) if r["file"] in TARGETS else 99, r["index"]))
        rows += [result_row(r) for r in muts]
        heads.append(f"{len(muts)} mutants from {len(results)} results file(s) at {', '.join(revs)}, "
                     f"{sum(r['seconds'] for r in muts) / 3600:.1f} h of mutant runs (one core each)")
    first = f"merged from {len(paths)} file(s): " + " | ".join(heads)
    text, head = report(first, rows, load_equivalent(REPO / "benchmarks" / "mutation_equivalent.txt"))
    print("\n".join(head))
    if out:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
