"""The NCCL probe: which libnccl an engine on this host will load (path, version, ELF build id), from
``LD_PRELOAD`` and ``LD_LIBRARY_PATH`` of the launch env, the Python wheels (``nvidia-nccl-cu12``/``-cu13``:
``nvidia/nccl/lib/libnccl.so.2`` in a venv or the system's site-packages) and the system's library
directories (``/etc/ld.so.conf`` and its includes, the standard ones); the launch env's ``NCCL_*``
variables; ``/etc/nccl.conf``, ``~/.nccl.conf`` and ``NCCL_CONF_FILE`` (their ``NCCL_*`` lines). All
under a root path, read only, bounded in files, bytes and time; ``nccl.json`` in a capture. Never raises.

The build id is the ELF ``NT_GNU_BUILD_ID`` note (``readelf -n libnccl.so.2``), read by a small parser of
the program headers' ``PT_NOTE`` segments; the version comes from the file name (``libnccl.so.2.28.9``),
else the wheel's ``METADATA``, else the library's own ``NCCL version 2.28.9+cuda13.0`` string.
"""

from __future__ import annotations

import glob
import os
import re
import struct
import time
from dataclasses import asdict
from typing import Any

from afddiag.model.nccl import ORIGINS, NcclConfFile, NcclCopy, NcclFacts
from afddiag.probes.registry import Artifact, Probe, Run

TRIPLETS = ("aarch64-linux-gnu", "x86_64-linux-gnu")
STANDARD_DIRS = tuple(f"/{p}/{t}" for p in ("usr/lib", "lib") for t in TRIPLETS) + (
    "/usr/lib64", "/lib64", "/usr/lib", "/lib", "/usr/local/lib", "/usr/local/cuda/lib64", "/usr/local/nccl/lib")
#: Read after NCCL_CONF_FILE, else $HOME/.nccl.conf (NCCL's src/misc/param.cc initEnv; the environment wins).
CONF_FILES = ("/etc/nccl.conf",)
WHEEL_LIB = "nvidia/nccl/lib/libnccl.so.2"
MAX_DIRS = 64  # directories searched
MAX_COPIES = 32  # libnccl files kept
MAX_LINES = 200  # NCCL_* lines kept per configuration file
MAX_CONF_BYTES = 1 << 20
NOTE_MAX_BYTES = 1 << 16  # a PT_NOTE segment read at most
SCAN_MAX_BYTES = 256 << 20  # bytes of a library scanned for its version string
_SONAME_VERSION = re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$")
# "NCCL version 2.28.9+cuda13.0" (the wheel's), "NCCL version 2.28.3 compiled with CUDA 13.0" (a libnccl2 package's)
_VERSION_STRING = re.compile(rb"NCCL version (\d{1,3}\.\d{1,3}\.\d{1,3})"
                             rb"(?:\+cuda| compiled with CUDA )?(\d{1,3}\.\d{1,3})?")
_META_VERSION = re.compile(r"^Version:\s*([0-9][0-9A-Za-z.+-]{0,40})\s*$", re.M)
_CONF_LINE = re.compile(r"^(NCCL_[A-Z0-9_]{1,64})=(.{0,200})$")  # NCCL trims nothing: "KEY=VALUE" as written


def elf_build_id(path: str) -> str | None:
    """The ``NT_GNU_BUILD_ID`` note of the ELF file at ``path`` in hex, or None (not ELF, no note,
    unreadable). Reads the ELF header, at most 64 program headers and :data:`NOTE_MAX_BYTES` of each
    ``PT_NOTE`` segment. Never raises."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
                return None
            is64, end = head[4] == 2, "<" if head[5] == 1 else ">"
            if is64:
                phoff, = struct.unpack_from(end + "Q", head, 0x20)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 0x36)
            else:
                phoff, = struct.unpack_from(end + "I", head, 0x1C)
                phentsize, phnum = struct.unpack_from(end + "HH", head, 0x2A)
            if phentsize < (56 if is64 else 32) or phnum > 64:
                return None
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            for i in range(len(table) // phentsize):
                ph = table[i * phentsize:(i + 1) * phentsize]
                if struct.unpack_from(end + "I", ph, 0)[0] != 4:  # PT_NOTE
                    continue
                if is64:  # Elf64_Phdr: p_offset at 8, p_filesz at 32; Elf32_Phdr: at 4 and 16
                    off, size = struct.unpack_from(end + "Q", ph, 8)[0], struct.unpack_from(end + "Q", ph, 32)[0]
                else:
                    off, size = struct.unpack_from(end + "I", ph, 4)[0], struct.unpack_from(end + "I", ph, 16)[0]
                f.seek(off)
                found = _gnu_build_id(f.read(min(size, NOTE_MAX_BYTES)), end)
                if found:
                    return found
    except (OSError, struct.error, ValueError, OverflowError):
        return None
    return None


def _gnu_build_id(notes: bytes, end: str) -> str | None:
    """The build id among the notes of one ``PT_NOTE`` segment (namesz, descsz, type, name, desc; each
    padded to 4 bytes). Pure."""
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from(end + "III", notes, pos)
        name_at = pos + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        nxt = desc_at + (descsz + 3) // 4 * 4
        if nxt > len(notes) or nxt <= pos:
            return None
        if kind == 3 and notes[name_at:name_at + namesz].rstrip(b"\0") == b"GNU" and 0 < descsz <= 64:
            return notes[desc_at:desc_at + descsz].hex()
        pos = nxt
    return None


def version_string(path: str, deadline: float, max_bytes: int = SCAN_MAX_BYTES) -> tuple[str | None, str | None]:
    """``(version, cuda)`` from the first ``NCCL version X.Y.Z+cudaA.B`` string in the file, reading
    at most ``max_bytes`` in 1 MiB chunks (overlapping by 64 bytes) until ``deadline``. Never raises."""
    try:
        with open(path, "rb") as f:
            tail, read = b"", 0
            while read < max_bytes and time.monotonic() < deadline:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                read += len(chunk)
                m = _VERSION_STRING.search(tail + chunk)
                if m:
                    return m.group(1).decode(), m.group(2).decode() if m.group(2) else None
                tail = chunk[-64:]
    except OSError:
        pass
    return None, None


def _under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def _ld_so_conf_dirs(root: str) -> list[str]:
    """The directories ``/etc/ld.so.conf`` names, its ``include`` globs followed one level (64 files)."""
    out: list[str] = []
    todo, seen = ["/etc/ld.so.conf"], 0
    while todo and seen < 64:
        path = todo.pop(0)
        seen += 1
        try:
            with open(_under(root, path), encoding="utf-8", errors="replace") as f:
                text = f.read(1 << 16)
        except OSError:
            continue
        for line in text.splitlines()[:500]:
            line = line.split("#", 1)[0].strip()
            if line.startswith("include "):
                pat = line[8:].strip()
                pat = pat if pat.startswith("/") else os.path.join("/etc", pat)
                base = _under(root, "/")
                todo += sorted("/" + os.path.relpath(p, base) if root not in ("", "/") else p
                               for p in glob.glob(_under(root, pat)))[:64]
            elif line.startswith("/"):
                out.append(line)
    return out


def _site_dirs(root: str, env: dict[str, str]) -> list[str]:
    """Site-packages directories an engine's Python may use: the launch env's ``VIRTUAL_ENV`` and
    ``PYTHONPATH``, then the system's (``/usr/lib/python3/dist-packages``, ``/usr/local/lib/python3*/``)."""
    pats = []
    if env.get("VIRTUAL_ENV"):
        pats.append(env["VIRTUAL_ENV"].rstrip("/") + "/lib/python3*/site-packages")
    pats += [p for p in env.get("PYTHONPATH", "").split(":") if p.startswith("/")]
    pats += ["/usr/lib/python3/dist-packages", "/usr/local/lib/python3*/dist-packages",
             "/usr/local/lib/python3*/site-packages"]
    out: list[str] = []
    for pat in pats[:16]:
        hits = sorted(glob.glob(_under(root, pat)))[:8]
        out += ["/" + os.path.relpath(h, root) if root not in ("", "/") else h for h in hits]
    return out


def _wheel_version(root: str, site: str) -> tuple[str | None, str | None]:
    for meta in sorted(glob.glob(_under(root, site.rstrip("/") + "/nvidia_nccl_cu*.dist-info/METADATA")))[:4]:
        try:
            with open(meta, encoding="utf-8", errors="replace") as f:
                m = _META_VERSION.search(f.read(1 << 16))
        except OSError:
            continue
        if m:
            return m.group(1), f"wheel metadata {os.path.basename(os.path.dirname(meta))}"
    return None, None


def _copy(root: str, path: str, origin: str, where: str, deadline: float) -> NcclCopy | None:
    full = _under(root, path)
    if not os.path.isfile(full):
        return None
    real = os.path.realpath(full)
    shown = "/" + os.path.relpath(real, root) if root not in ("", "/") else real
    c = NcclCopy(path=path, real_path=shown, origin=origin, where=where, build_id=elf_build_id(real))
    try:
        c.size_bytes = os.stat(real).st_size
    except OSError:
        pass
    m = _SONAME_VERSION.match(os.path.basename(real))
    if m:
        c.version, c.version_source = m.group(1), "file name"
    if c.version is None and origin == "wheel":
        c.version, c.version_source = _wheel_version(root, path[:-len(WHEEL_LIB)])
    if c.version is None:
        c.version, c.cuda = version_string(real, deadline)
        c.version_source = "NCCL version string" if c.version else None
    return c


def _candidates(root: str, env: dict[str, str]) -> tuple[list[tuple[str, str, str]], list[str]]:
    """``(path, origin, where)`` of every place a libnccl may be, in loader order (:data:`ORIGINS`), and
    the directories looked in."""
    out: list[tuple[str, str, str]] = []
    for p in re.split(r"[\s:]+", env.get("LD_PRELOAD", "")):
        if "libnccl" in os.path.basename(p) and p.startswith("/"):
            out.append((p, "LD_PRELOAD", "LD_PRELOAD"))
    dirs = [("LD_LIBRARY_PATH", d) for d in env.get("LD_LIBRARY_PATH", "").split(":") if d.startswith("/")]
    dirs += [("wheel", s) for s in _site_dirs(root, env)]
    dirs += [("system", d) for d in dict.fromkeys(_ld_so_conf_dirs(root) + list(STANDARD_DIRS))]
    for origin, d in dirs[:MAX_DIRS]:
        if origin == "wheel":
            out.append((d.rstrip("/") + "/" + WHEEL_LIB, "wheel", d))
            continue
        try:
            names = sorted(n for n in os.listdir(_under(root, d)) if n == "libnccl.so" or n.startswith("libnccl.so."))
        except OSError:
            continue
        names.sort(key=lambda n: n != "libnccl.so.2")  # the soname the loader asks for first
        out += [(d.rstrip("/") + "/" + n, origin, d) for n in names[:8]]
    return out, [d for _, d in dirs[:MAX_DIRS]]


def read_conf(root: str, path: str) -> NcclConfFile | None:
    """The ``NCCL_*`` lines of an NCCL configuration file (None: absent or unreadable). Never raises."""
    try:
        with open(_under(root, path), "rb") as f:
            text = f.read(MAX_CONF_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    out = NcclConfFile(path)
    for n, line in enumerate(text.splitlines(), 1):
        m = _CONF_LINE.match(line)
        if m and len(out.lines) < MAX_LINES:
            out.lines.append({"line": n, "key": m.group(1), "value": m.group(2).strip()})
    return out


def read_nccl(root: str, env: dict[str, str], home: str | None, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """The probe's readings under ``root`` for a launch env ``env``: ``{"copies": [NcclCopy as dict],
    "conf_files": [...], "searched": [...], "notes": [...]}``; None when ``root`` holds none of the
    directories searched and no configuration file. Never raises."""
    deadline = time.monotonic() + timeout_s
    copies: list[NcclCopy] = []
    seen: set[str] = set()
    notes: list[str] = []
    cands, looked = _candidates(root, env)
    for path, origin, where in cands:
        if len(copies) >= MAX_COPIES or time.monotonic() > deadline:
            notes.append(f"nccl: stopped after {len(copies)} copies (bound)")
            break
        c = _copy(root, path, origin, where, deadline)
        if c is not None and c.real_path not in seen:
            seen.add(c.real_path)
            copies.append(c)
    if env.get("NCCL_CONF_FILE", "").startswith("/"):  # NCCL reads it instead of ~/.nccl.conf
        confs = [env["NCCL_CONF_FILE"]]
    else:
        confs = [home.rstrip("/") + "/.nccl.conf"] if home else []
    confs += list(CONF_FILES)
    files = [c for c in (read_conf(root, p) for p in confs) if c is not None]
    if not copies and not files and not any(os.path.isdir(_under(root, d)) for d in looked):
        return None  # no library directory at all under root (a snapshot folder without them): not captured
    return {"copies": [asdict(c) for c in copies], "conf_files": [asdict(c) for c in files],
            "searched": list(dict.fromkeys(looked + confs)), "notes": notes}


# ---------------------------------------------------------------------------------------------
# the probe


def _home(run: Run) -> str | None:
    """The engine user's home (``~/.nccl.conf``): the launch env's HOME, else this user's on a live root."""
    given = run.launch_value("HOME")
    return given or (os.path.expanduser("~") if run.src.root == "/" else None)


def _read(run: Run, progress: Any) -> dict[str, Any]:
    root = run.src.root
    if root is None:
        return {"nccl.json": None}
    progress.doing = "looking for libnccl copies and NCCL configuration files"
    return {"nccl.json": read_nccl(root, dict(run.inputs.launch_env or {}), _home(run),
                                   run.inputs.timeout("fabric_s"))}


def _s(v: Any, n: int = 4096) -> str | None:
    return v[:n] if isinstance(v, str) else None


def facts_from_json(raw: Any, env: dict[str, str] | None) -> NcclFacts:
    """``nccl.json`` (live or replayed: untrusted, every field checked and bounded) → :class:`NcclFacts`."""
    if not isinstance(raw, dict):
        return NcclFacts(captured=False, env=env, notes=["nccl.json is not a JSON object"])
    copies = []
    for c in raw.get("copies") or [] if isinstance(raw.get("copies"), list) else []:
        if not isinstance(c, dict) or not isinstance(c.get("path"), str) or c.get("origin") not in ORIGINS:
            continue
        bid = c.get("build_id") if isinstance(c.get("build_id"), str) and re.fullmatch(r"[0-9a-f]{2,128}",
                                                                                      c["build_id"]) else None
        size = c.get("size_bytes") if isinstance(c.get("size_bytes"), int) else None
        copies.append(NcclCopy(path=c["path"][:4096], real_path=_s(c.get("real_path")) or c["path"][:4096],
                               origin=c["origin"], where=_s(c.get("where")) or "", version=_s(c.get("version"), 64),
                               version_source=_s(c.get("version_source"), 200), build_id=bid, size_bytes=size,
                               cuda=_s(c.get("cuda"), 16)))
    files = []
    for f in raw.get("conf_files") or [] if isinstance(raw.get("conf_files"), list) else []:
        if isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("lines"), list):
            lines = [{"line": x["line"], "key": x["key"][:80], "value": str(x.get("value", ""))[:200]}
                     for x in f["lines"] if isinstance(x, dict) and isinstance(x.get("line"), int)
                     and isinstance(x.get("key"), str) and x["key"].startswith("NCCL_")][:MAX_LINES]
            files.append(NcclConfFile(f["path"][:4096], lines))
    searched = [s[:4096] for s in raw.get("searched") or [] if isinstance(s, str)][:MAX_DIRS + 4] \
        if isinstance(raw.get("searched"), list) else []
    notes = [n[:300] for n in raw.get("notes") or [] if isinstance(n, str)][:20] \
        if isinstance(raw.get("notes"), list) else []
    return NcclFacts(copies=copies[:MAX_COPIES], env=env, conf_files=files[:8], searched=searched, notes=notes)


def _facts(run: Run, r: dict[str, Any], progress: Any) -> dict[str, Any]:
    le = run.inputs.launch_env
    env = {k: v for k, v in le.items() if k.startswith("NCCL_")} if le is not None else None
    raw = r.get("nccl.json")
    if raw is None:
        why = "NCCL not captured (no nccl.json in the snapshot)" if not run.live else "no filesystem root read"
        return {"nccl": NcclFacts(captured=False, env=env, notes=[why])}
    return {"nccl": facts_from_json(raw, env)}


PROBE = Probe("nccl", "NCCL probe (libnccl copies, nccl.conf)", "fabric_s", (Artifact("nccl.json"),),
              _read, _facts, lambda why: {"nccl": NcclFacts(captured=False, failed=why, notes=[why])})
