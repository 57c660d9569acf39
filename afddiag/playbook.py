"""Role playbooks: which gates run in a role, what hardware it requires, its thresholds.

A playbook is a TOML file (``playbooks/<role>.toml``). A site adds a role by adding a file: roles are
looked up in ``$AFDDIAG_PLAYBOOK_DIR``, then ``/etc/afddiag/playbooks``, then the packaged ones;
``--playbook FILE`` names one directly.
"""

from __future__ import annotations

import fnmatch
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from afddiag.atomic import written_by_others
from afddiag.packaged import names, read_text
from afddiag.reader import InputError
from afddiag.reader import read_text as read_bounded

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SITE_DIRS = ("/etc/afddiag/playbooks",)
_TOP = {"name", "description", "gates", "requires", "gpu", "launch", "host", "fabric", "plan", "aliases"}
_GPU = {"model", "reserve_fraction", "reserve_bytes", "min_memory_bytes", "load_probe"}
_HOST = {"cpu_min_mhz"}
_FABRIC = {"link_speed_mbps", "engine_registers", "rail_healthy_gbps", "rail_stale_init_gbps", "rail_fail_below_gbps"}
REGISTERS = ("", "host", "gpu")  # [fabric] engine_registers: which memory the engine hands the NIC
# [plan]: the engine's memory constants (launch.memory-plan); bytes unless named otherwise.
PLAN_KEYS = {"weights_bytes", "drafter_bytes", "runtime_headroom_bytes", "fit_offset_bytes",
             "activation_bytes_per_capacity", "kv_bytes_per_token", "max_context_tokens", "default_capacity",
             "drafter_default"}
_LAUNCH = {"capacity_key", "memlock_min_bytes", "require_fabric_address", "engine_ports"}
# [timeouts]: each probe's time bound, seconds (--timeout overrides all but qp_s and load_s; --qp-timeout qp_s).
# A probe past its bound gives ERROR for its own gates and the run goes on.
DEFAULT_TIMEOUTS = {"fabric_s": 10.0, "qp_s": 5.0, "gpu_s": 10.0, "load_s": 30.0, "cpu_s": 10.0,
                    "image_s": 10.0, "limits_s": 5.0}
_TIMEOUTS = set(DEFAULT_TIMEOUTS)


#: The gate that judges each component a role ``requires`` (its absence FAILs there): a playbook
#: whose gates leave one out would pass a host without it.
REQUIRED_BY = {"gpu": "gpu.present", "rdma": "fabric.rdma-present"}


#: The control-plane probe's bound (afddiag.probes.reach): at most this many TCP connects a run,
#: peers × engine ports; more is a usage error naming it.
MAX_ATTEMPTS = 256


class PlaybookError(ValueError):
    """A playbook that cannot be used (the message names the file or role and the fix)."""


@dataclass
class Playbook:
    """One role's gate set and expectations (units: bytes; fractions 0..1)."""

    name: str = "generic"
    description: str = ""
    gates: list[str] = field(default_factory=lambda: ["*"])
    requires: list[str] = field(default_factory=list)  # "gpu", "rdma": their absence FAILs
    gpu_model: str = ""
    reserve_fraction: float = 0.0
    reserve_bytes: int = 0  # the engine's planned device budget (gpu.headroom; unified memory: of host RAM)
    min_memory_bytes: int = 0
    load_probe: bool = False
    capacity_key: str = ""
    memlock_min_bytes: int = 0  # -1: must be unlimited; 0: not checked
    require_fabric_address: bool = False
    engine_ports: list[int] = field(default_factory=list)  # launch.control-plane: the peers' engine TCP ports
    engine_registers: str = ""  # fabric.mem-registration: "host" (pinned host memory), "gpu" (GPU memory), "" unknown
    link_speed_mbps: int = 0  # fabric.link-speed: the RoCE netdev's expected negotiated speed, Mb/s (0: none)
    # fabric.rail-bandwidth bands, Gb/s (1e9 bits/s of payload) of one rail's bandwidth run:
    rail_healthy_gbps: float = 0.0  # at or above: PASS (0: no expectation, the figure is named)
    rail_stale_init_gbps: tuple[float, ...] = ()  # (low, high): the NIC's stale-initialization signature (REBOOT)
    rail_fail_below_gbps: float = 0.0  # below: FAIL without power advice (0: never)
    cpu_min_mhz: int = 0  # host.cpu-clock: the clock under load must reach this (0: not checked)
    plan: dict[str, float] = field(default_factory=dict)  # [plan]: launch.memory-plan's engine constants
    aliases: dict[str, str] = field(default_factory=dict)
    timeouts: dict[str, float] = field(default_factory=dict)  # [timeouts]: fabric_s, qp_s, gpu_s, ... (seconds)
    path: str = ""

    def runs(self, gate_id: str) -> bool:
        return any(fnmatch.fnmatchcase(gate_id, pat) for pat in self.gates)


def parse(text: str, path: str) -> Playbook:
    """Parse a playbook's TOML. Raises :class:`PlaybookError` naming ``path`` on bad content."""
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PlaybookError(f"playbook {path}: not valid TOML ({e})") from None
    _check_shape(d, path)
    pb = _playbook_from(d, path)
    _check_values(pb, path)
    return pb


def _check_shape(d: dict[str, Any], path: str) -> None:
    """PlaybookError naming ``path`` for an unknown table or key, or a list that is not one of strings."""
    for table, allowed in (("", _TOP | {"timeouts"}), ("gpu", _GPU), ("launch", _LAUNCH), ("host", _HOST),
                           ("fabric", _FABRIC), ("plan", PLAN_KEYS), ("timeouts", _TIMEOUTS)):
        got = d if not table else d.get(table, {})
        if not isinstance(got, dict):
            raise PlaybookError(f"playbook {path}: [{table}] must be a table")
        extra = set(got) - allowed
        if extra:
            raise PlaybookError(f"playbook {path}: unknown key(s) {', '.join(sorted(extra))}"
                                f"{' in [' + table + ']' if table else ''}; known: {', '.join(sorted(allowed))}")
    for key in ("gates", "requires"):
        if not isinstance(d.get(key, []), list) or not all(isinstance(x, str) for x in d.get(key, [])):
            raise PlaybookError(f"playbook {path}: {key} must be a list of strings (e.g. [\"gpu\", \"rdma\"])")
    bad_req = set(d.get("requires", [])) - {"gpu", "rdma"}
    if bad_req:
        raise PlaybookError(f"playbook {path}: requires may hold 'gpu' and 'rdma', not {sorted(bad_req)}")


def _playbook_from(d: dict[str, Any], path: str) -> Playbook:
    """The :class:`Playbook` of the parsed TOML ``d`` (keys checked by :func:`_check_shape`), its values
    converted; PlaybookError naming ``path`` for one that does not convert."""
    g, la = d.get("gpu", {}), d.get("launch", {})
    if not isinstance(d.get("fabric", {}).get("rail_stale_init_gbps", []), list):
        raise PlaybookError(f"playbook {path}: [fabric] rail_stale_init_gbps: give [low, high] Gb/s (or [] for none)")
    try:
        pb = Playbook(
            name=str(d.get("name") or Path(path).stem),
            description=str(d.get("description", "")),
            gates=[str(x) for x in d.get("gates", ["*"])],
            requires=list(d.get("requires", [])),
            gpu_model=str(g.get("model", "")),
            reserve_fraction=float(g.get("reserve_fraction", 0.0)),
            reserve_bytes=int(g.get("reserve_bytes", 0)),
            min_memory_bytes=int(g.get("min_memory_bytes", 0)),
            load_probe=bool(g.get("load_probe", False)),
            capacity_key=str(la.get("capacity_key", "")),
            memlock_min_bytes=int(la.get("memlock_min_bytes", 0)),
            require_fabric_address=bool(la.get("require_fabric_address", False)),
            engine_ports=[int(x) for x in la.get("engine_ports", [])],
            cpu_min_mhz=int(d.get("host", {}).get("cpu_min_mhz", 0)),
            link_speed_mbps=int(d.get("fabric", {}).get("link_speed_mbps", 0)),
            engine_registers=str(d.get("fabric", {}).get("engine_registers", "")),
            rail_healthy_gbps=float(d.get("fabric", {}).get("rail_healthy_gbps", 0.0)),
            rail_stale_init_gbps=tuple(float(x) for x in d.get("fabric", {}).get("rail_stale_init_gbps", ())),
            rail_fail_below_gbps=float(d.get("fabric", {}).get("rail_fail_below_gbps", 0.0)),
            plan={str(k): (bool(v) if k == "drafter_default" else float(v)) for k, v in d.get("plan", {}).items()},
            aliases={str(k): str(v) for k, v in d.get("aliases", {}).items()},
            timeouts={str(k): float(v) for k, v in d.get("timeouts", {}).items()},
            path=path,
        )
    except (TypeError, ValueError, AttributeError, OverflowError) as e:
        raise PlaybookError(f"playbook {path}: bad value ({e})") from None
    return pb


def _check_values(pb: Playbook, path: str) -> None:
    """PlaybookError naming ``path`` for a value out of its range (finite numbers, ports, fractions,
    timeouts, the rail bands) or a required feature whose gate the playbook does not run."""
    numbers = {"gpu.reserve_fraction": pb.reserve_fraction, "fabric.rail_healthy_gbps": pb.rail_healthy_gbps,
               "fabric.rail_fail_below_gbps": pb.rail_fail_below_gbps,
               **{f"fabric.rail_stale_init_gbps[{i}]": x for i, x in enumerate(pb.rail_stale_init_gbps)},
               **{f"plan.{k}": v for k, v in pb.plan.items()}, **{f"timeouts.{k}": v for k, v in pb.timeouts.items()}}
    bad_num = [k for k, v in numbers.items() if not math.isfinite(v)]
    if bad_num:
        raise PlaybookError(f"playbook {path}: {', '.join(bad_num)}: give a finite number (not inf or nan)")
    unjudged = [f"{what} (gate {gate})" for what, gate in REQUIRED_BY.items()
                if what in pb.requires and not pb.runs(gate)]
    if unjudged:
        raise PlaybookError(f"playbook {path}: requires {', '.join(unjudged)}, but its gates "
                            f"{pb.gates} do not run that gate: add it to gates or drop it from requires")
    if len(pb.engine_ports) > MAX_ATTEMPTS:
        raise PlaybookError(f"playbook {path}: launch.engine_ports lists {len(pb.engine_ports)} ports, over the "
                            f"control-plane probe's limit of {MAX_ATTEMPTS} peer × port connects: "
                            "name the engines' ports")
    if not 0.0 <= pb.reserve_fraction <= 1.0:
        raise PlaybookError(f"playbook {path}: gpu.reserve_fraction {pb.reserve_fraction} is not within 0..1")
    if any(not 0 < x < 65536 for x in pb.engine_ports):
        raise PlaybookError(f"playbook {path}: launch.engine_ports {pb.engine_ports}: give TCP ports 1..65535")
    if pb.engine_registers not in REGISTERS:
        raise PlaybookError(f"playbook {path}: fabric.engine_registers {pb.engine_registers!r}: "
                            "give \"host\" or \"gpu\"")
    if (bad := rail_band_problem(pb)) is not None:
        raise PlaybookError(f"playbook {path}: [fabric] {bad}")
    if pb.reserve_bytes < 0:
        raise PlaybookError(f"playbook {path}: gpu.reserve_bytes {pb.reserve_bytes} is negative; "
                            "give bytes (0: none planned)")
    bad_plan = sorted(k for k, v in pb.plan.items()
                      if k in ("kv_bytes_per_token", "max_context_tokens", "weights_bytes") and v <= 0)
    if bad_plan:
        raise PlaybookError(f"playbook {path}: [plan] {', '.join(bad_plan)} must be positive")
    bad_t = {k: v for k, v in pb.timeouts.items() if not 0.1 <= v <= 600}
    if bad_t:
        raise PlaybookError(f"playbook {path}: [timeouts] {', '.join(f'{k} = {v:g}' for k, v in bad_t.items())}: "
                            "give seconds within 0.1..600")


def rail_band_problem(pb: Playbook) -> str | None:
    """What is wrong with the ``[fabric]`` rail bands (Gb/s), or None: every value ≥ 0, the stale band
    two values low ≤ high, below the healthy line when one is set, the FAIL line not above the healthy one."""
    h, s, f = pb.rail_healthy_gbps, pb.rail_stale_init_gbps, pb.rail_fail_below_gbps
    if h < 0 or f < 0 or any(x < 0 for x in s):
        return "rail bands must be Gb/s >= 0"
    if s and (len(s) != 2 or s[0] > s[1]):
        return f"rail_stale_init_gbps {list(s)}: give [low, high] Gb/s, low <= high (or [] for none)"
    if h and s and s[1] >= h:
        return f"rail_stale_init_gbps {list(s)} must lie below rail_healthy_gbps {h:g}"
    if h and f > h:
        return f"rail_fail_below_gbps {f:g} is above rail_healthy_gbps {h:g}"
    return None


def timeout_for(pb: Playbook | None, kind: str) -> float:
    """Seconds ``kind`` ("fabric_s", "qp_s", "gpu_s", "load_s", "cpu_s", "image_s", "limits_s") may take:
    the playbook's ``[timeouts]`` value, else :data:`DEFAULT_TIMEOUTS`."""
    return float((pb.timeouts if pb else {}).get(kind, DEFAULT_TIMEOUTS[kind]))


def available() -> dict[str, str]:
    """Role name → playbook path or packaged resource name, site directories first."""
    found: dict[str, str] = {}
    dirs = [os.environ.get("AFDDIAG_PLAYBOOK_DIR", "")] + list(SITE_DIRS)
    for d in dirs:
        if d and os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith(".toml"):
                    found.setdefault(f[:-5], os.path.join(d, f))
    for f in sorted(_packaged()):
        found.setdefault(f[:-5], f"<packaged>/{f}")
    return found


def _packaged() -> list[str]:
    return [n for n in names("playbooks") if n.endswith(".toml")]


MAX_PLAYBOOK_BYTES = 1 << 20  # the packaged playbooks are ~4 KB


def _read(ref: str) -> str:
    """A playbook's text: a packaged one, or a file through the bounded reader (a regular file of at
    most :data:`MAX_PLAYBOOK_BYTES`, UTF-8, read within its time bound: a FIFO, /dev/zero or a
    folder is refused), refused when others could have written it
    (:func:`afddiag.atomic.written_by_others`). Raises :class:`PlaybookError` naming the file and why."""
    if ref.startswith("<packaged>/"):
        return read_text("playbooks", ref.split("/", 1)[1])

    if unsafe := written_by_others(ref, sticky_ok=True):  # it decides which gates run and what they expect
        raise PlaybookError(f"playbook {ref}: refused: {unsafe}, so anyone could choose the gates and thresholds "
                            "a node is judged by: give a file only root or you can write")
    try:
        return read_bounded(ref, max_bytes=MAX_PLAYBOOK_BYTES, timeout_s=10.0)
    except FileNotFoundError:
        raise PlaybookError(f"playbook {ref}: no such file") from None
    except InputError as e:
        raise PlaybookError(f"playbook {e}") from None


def load(role: str | None = None, path: str | None = None) -> Playbook:
    """The playbook for ``role`` (default ``generic``) or the file ``path``.

    Raises :class:`PlaybookError` for an unknown role (listing the known ones) or a bad file.
    """
    if path:
        return parse(_read(path), path)
    role = role or "generic"
    roles = available()
    if role not in roles:
        raise PlaybookError(f"unknown role {role!r}: known roles are {', '.join(sorted(roles))} "
                            f"(a site adds one as $AFDDIAG_PLAYBOOK_DIR/{role}.toml)")
    return parse(_read(roles[role]), roles[role])
