"""Launch probes: the container image's labels and env (:data:`IMAGE`), RLIMIT_MEMLOCK and RDMA
device-node access (:data:`LIMITS`).

Read-only; bounded in time (the image inspect is one subprocess with a timeout); never raises.
"""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import subprocess
from typing import Any

from afddiag import proc
from afddiag.model import to_jsonable
from afddiag.model.host import DeviceNode, HostLimits, ImageFacts
from afddiag.probes.registry import Artifact, Probe, Run, read_source


def _env_list(items: object) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, str) and "=" in item:
            k, _, v = item.partition("=")
            out[k] = v
    return out


def image_from_inspect(data: object, ref: str | None, source: str) -> ImageFacts:
    """``docker|podman image inspect`` JSON (a list of one object) → :class:`ImageFacts`."""
    obj = data[0] if isinstance(data, list) and data else data
    if not isinstance(obj, dict):
        return ImageFacts(ref=ref, source=source, why=f"{source}: not an image inspect object")
    cfg = obj["Config"] if isinstance(obj.get("Config"), dict) else {}
    labels = cfg["Labels"] if isinstance(cfg.get("Labels"), dict) else {}
    tags = obj["RepoTags"] if isinstance(obj.get("RepoTags"), list) else []
    return ImageFacts(ref=ref or (tags[0] if tags else obj.get("Id")), source=source,
                      labels={str(k): str(v) for k, v in labels.items()}, env=_env_list(cfg.get("Env")))


def run_inspect(ref: str | None, timeout_s: float = 10.0) -> tuple[object | None, str | None, str | None]:
    """``docker|podman image inspect <ref>`` (local image store only: never pulls) → ``(inspect JSON
    or None, engine or None, why None)``; docker first, else podman. Never raises."""
    if not ref:
        return None, None, "no AFD_IMAGE in the launch env"
    for engine in ("docker", "podman"):
        exe = shutil.which(engine)
        if not exe:
            continue
        try:
            p = proc.run([exe, "image", "inspect", "--", ref], timeout_s)  # "--": a ref is never an option
        except subprocess.TimeoutExpired:
            return None, engine, f"{engine} image inspect timed out after {timeout_s:g} s"
        except OSError as e:
            return None, engine, f"{engine}: {e}"
        if p.returncode != 0:
            msg = (p.stderr.strip().splitlines() or ["failed"])[-1]
            return None, engine, f"{engine} image inspect {ref}: {msg}"
        try:
            return json.loads(p.stdout), engine, None
        except ValueError as e:
            return None, engine, f"{engine} printed no JSON: {e}"
    return None, None, "neither docker nor podman is installed: give AFD_IMAGE_SM_COUNT in the launch env"


def _limit(v: int) -> int:
    return -1 if v == resource.RLIM_INFINITY else int(v)


def read_limits(dev_glob: str = "/dev/infiniband/*") -> HostLimits:
    """RLIMIT_MEMLOCK (bytes, -1 unlimited) of this process and access to ``/dev/infiniband/*``."""
    lim = HostLimits()
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        lim.memlock_soft_bytes, lim.memlock_hard_bytes = _limit(soft), _limit(hard)
    except (OSError, ValueError) as e:
        lim.notes.append(f"getrlimit(RLIMIT_MEMLOCK): {e}")
    for path in sorted(glob.glob(dev_glob)):
        name = os.path.basename(path)
        if name.startswith("uverbs") or name == "rdma_cm":
            lim.device_nodes.append(DeviceNode(path, True, os.access(path, os.R_OK), os.access(path, os.W_OK)))
    lim.in_container = os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")
    try:
        import pwd

        lim.user = pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError):
        lim.user = str(os.geteuid())
    return lim


def limits_from_json(data: object) -> HostLimits:
    """The limits readings (:func:`read_limits` as JSON, live or replayed) → :class:`HostLimits`
    (missing fields stay None)."""
    if not isinstance(data, dict):
        return HostLimits(captured=False, notes=["limits readings are not a JSON object"])
    nodes = [DeviceNode(str(n.get("path")), bool(n.get("exists", True)), bool(n.get("readable")),
                        bool(n.get("writable"))) for n in data.get("device_nodes", []) if isinstance(n, dict)]
    num = lambda k: data.get(k) if isinstance(data.get(k), int) else None  # noqa: E731
    return HostLimits(memlock_soft_bytes=num("memlock_soft_bytes"), memlock_hard_bytes=num("memlock_hard_bytes"),
                      device_nodes=nodes, in_container=bool(data.get("in_container")), user=data.get("user"),
                      notes=[n for n in data.get("notes") or [] if isinstance(n, str)]
                      if isinstance(data.get("notes"), list) else [])


# ---------------------------------------------------------------------------------------------
# the limits probe (RLIMIT_MEMLOCK, /dev/infiniband access)


def _limits_read(run: Run, progress: Any) -> dict[str, Any]:
    progress.doing = "getrlimit(RLIMIT_MEMLOCK), access(/dev/infiniband/*)"
    return {"limits.json": read_source(run.src.limits, lambda: to_jsonable(read_limits()))}


def _limits_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    raw = r.get("limits.json")
    if raw is None:
        return {"limits": HostLimits(captured=False, notes=["limits not captured (no limits.json in the snapshot)"])}
    return {"limits": limits_from_json(raw)}


LIMITS = Probe("limits", "limits probe (getrlimit, /dev/infiniband)", "limits_s", (Artifact("limits.json"),),
               _limits_read, _limits_facts, lambda why: {"limits": HostLimits(captured=False, failed=why, notes=[why])})


# ---------------------------------------------------------------------------------------------
# the launch image probe (docker|podman image inspect)


def _image_wanted(run: Run) -> bool:
    return not run.live or bool(run.launch_value("AFD_IMAGE"))


def _image_read(run: Run, progress: Any) -> dict[str, Any]:
    ref = run.launch_value("AFD_IMAGE")
    progress.doing = f"image inspect {ref}"
    got = read_source(run.src.image, lambda: run_inspect(ref, run.inputs.timeout("image_s")))
    raw, engine, why = got if got is not None else (None, None, "image not inspected (no image source)")
    return {"image.json": raw, "engine": engine, "why": why}


def _image_facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    ref = run.launch_value("AFD_IMAGE")
    raw = r.get("image.json")
    if raw is not None:
        return {"image": image_from_inspect(raw, ref, r.get("engine") or "image.json")}
    if ref:
        return {"image": ImageFacts(ref=ref, source=r.get("engine"),
                                    why=r.get("why") or "image not captured (no image.json)")}
    return {}


IMAGE = Probe("image", "image probe (docker|podman image inspect)", lambda run: run.inputs.timeout("image_s") + 1.0,
              (Artifact("image.json"),), _image_read, _image_facts,
              lambda why: {"image": ImageFacts(why=why, failed=why)},
              _image_wanted)
