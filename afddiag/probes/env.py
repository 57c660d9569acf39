"""The environment probe: the launch-relevant variables (:data:`ENV_ALLOW` and ``AFD_*``) of this
process live, of the ``env`` file in a snapshot, with the ``--launch-env`` file laid over them.
A credential's value never enters a bundle (:func:`afddiag.envvars.redact_env`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from afddiag.envvars import WATCHED, parse_env_file, redact_env, redacted_note
from afddiag.probes.registry import LIVE, Artifact, Probe, Run

ENV_ALLOW = ("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME",
             "UCX_NET_DEVICES", "MC_GID_INDEX", "UCX_IB_GID_INDEX", "CUDA_VISIBLE_DEVICES")
ENV_ALLOW_PREFIX = "AFD_"


def env_allowed(name: str) -> bool:
    """True for the variables a bundle may carry: :data:`ENV_ALLOW` and ``AFD_*``."""
    return name in ENV_ALLOW or name.startswith(ENV_ALLOW_PREFIX)


def env_text(environ: Mapping[str, str], notes: list[str]) -> str:
    """The allow-listed variables as ``KEY='value'`` lines (``parse_env_file`` reads them back exactly);
    a value with a newline is left out with a note; a credential's value (the name says token, secret,
    password, key, auth: :func:`afddiag.envvars.is_secret_name`) is written as ``<redacted>``, noted."""
    env, redacted = redact_env({k: environ[k] for k in sorted(environ) if env_allowed(k)})
    notes.extend(redacted_note(k) for k in redacted)  # the name is kept, the credential never enters a bundle
    lines = []
    for k, v in env.items():
        if "\n" in v or "\r" in v:
            notes.append(f"env {k}: value has a newline; not captured")
            continue
        lines.append(f"{k}='{v}'")
    return "\n".join(lines) + ("\n" if lines else "")


def _read(run: Run, progress: Any) -> dict[str, Any]:
    src = run.src.environ
    if src is None:
        return {"env": None}
    notes: list[str] = []
    return {"env": env_text(dict(os.environ) if src is LIVE else src, notes), "notes": notes}


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    if run.live:
        env, source = {k: v for k, v in parse_env_file(r.get("env") or "").items() if k in WATCHED}, \
            "process environment" if r.get("env") is not None else "process environment not read"
    elif r.get("env") is not None:
        env, source = parse_env_file(r["env"]), "snapshot env"
    else:
        env, source = {}, "snapshot without an env file: nothing set"
    env, redacted = redact_env(env)  # a snapshot written before redaction, or by hand
    sources = {k: source for k in env}
    le = run.inputs.launch_env
    if le is not None:
        # Precedence: the launcher sources its env file over the environment it runs in, so each variable
        # the file sets is what the engine gets; one the file does not set is inherited from that
        # environment: live, this process's; replayed, the captured process's (snapshot env). Each
        # variable's source is kept (env_sources) and the gates name it.
        file_source = f"launch env {run.inputs.launch_env_path}"
        for k, v in le.items():
            if k in WATCHED:
                env[k], sources[k] = v, file_source
        inherited = sorted(k for k in env if sources[k] != file_source and k in WATCHED)
        source = file_source + (f" (+ {', '.join(inherited)} from the {sources[inherited[0]]})" if inherited else "")
    return {"env": env, "env_source": source, "env_sources": sources, "notes": [redacted_note(k) for k in redacted]}


PROBE = Probe("env", "environment", "limits_s", (Artifact("env", "text"),), _read, _facts, lambda why: {})
