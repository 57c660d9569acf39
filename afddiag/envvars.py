"""Launch-environment variables afddiag reads, and their parsers (pure functions)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from afddiag.textnum import digits

MAP_VAR = "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP"
NCCL_HCA_VAR = "NCCL_IB_HCA"
NCCL_GID_VAR = "NCCL_IB_GID_INDEX"
MC_GID_VAR = "MC_GID_INDEX"  # Mooncake transfer engine (overrides its GID auto-selection)
UCX_GID_VAR = "UCX_IB_GID_INDEX"  # UCX (UCT/IB; NIXL and UCX-based engines)
# Every engine's forced GID index: one rule for all of them (the fabric IP's RoCE v2 GID index on the
# port the engine uses); without one set each engine selects its own by address family.
GID_INDEX_VARS = (NCCL_GID_VAR, MC_GID_VAR, UCX_GID_VAR)
WATCHED = (MAP_VAR, NCCL_HCA_VAR) + GID_INDEX_VARS
#: Each role's capacity flag in the launch env (the coordinator's and the ranks' must agree): the one definition.
CAPACITY_KEYS = {"coordinator": "AFD_PREFILL_CAPACITY", "expert": "AFD_EXPERT_CAPACITY"}

# Names whose values are credentials: a whole "_"-separated word of the name, trailing digits aside
# (AFD_PASS2, DB_PWD1), is one of _SECRET_WORDS (AFD_HF_TOKEN, AFD_DB_PASSWORD, AFD_API_KEY,
# AWS_SECRET_ACCESS_KEY, HF_AUTH, AFD_PASS, AFD_PWD, AFD_PRIVKEY, AFD_JWT, AFD_CRED), or a word ends in one
# of _SECRET_SUFFIXES (HFTOKEN, APIKEY, DBPASS). KEY is not a secret before an index/file word
# (AFD_KEY_INDEX, AFD_SSH_KEY_FILE), and PKEY (an InfiniBand partition key index: NCCL_IB_PKEY) is no word
# of the list.
_SECRET_WORDS = ("TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "PASSPHRASE", "PASS", "PWD",
                 "CREDENTIAL", "CREDENTIALS", "CRED", "CREDS", "AUTH", "AUTHORIZATION", "COOKIE", "KEY", "KEYS",
                 "PRIVKEY", "JWT", "BEARER")
_SECRET_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "PRIVATEKEY", "PRIVKEY", "ACCESSKEY",
                    "SECRETKEY", "JWT")
_INDEX_WORDS = ("INDEX", "IDX", "ID", "NUM", "NUMBER", "COUNT", "LEN", "SIZE", "FILE", "PATH", "NAME", "DIR")
REDACTED = "<redacted>"


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name says its value is a credential (token, secret,
    password, key, auth: ``_SECRET_WORDS``, ``_SECRET_SUFFIXES``); False for GID/partition-key indexes
    (``NCCL_IB_GID_INDEX``, ``NCCL_IB_PKEY``) and names of files or indexes (``AFD_KEY_FILE``)."""
    words = [w.rstrip("0123456789") for w in name.upper().split("_")]
    words = [w for w in words if w]
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w in ("KEY", "KEYS") and nxt in _INDEX_WORDS:
            continue
        if w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES):
            return True
    return False


# Credentials recognised by their value, whatever the variable's name. Every quantifier is bounded
# (a test checks it) and no group repeats another, so a hostile megabyte costs one linear scan.
SECRET_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # user:password@, or a long user part alone (a token as the user: https://ghp_...@host); ssh://root@a is none
    ("URL userinfo", re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://(?:[^/\s@?#:]{0,256}:[^/\s@?#]{0,256}|"
                                r"[^/\s@?#:]{20,256})@")),
    # Bearer and a long opaque token; Basic and base64 with its padding or a digit (not "basic checks")
    ("Bearer/Basic credential", re.compile(r"\b(?i:bearer)[ \t]{1,8}[A-Za-z0-9._~+/=-]{16,4096}|"
                                           r"\b(?i:basic)[ \t]{1,8}(?=[A-Za-z+/]{0,4096}[0-9=])"
                                           r"[A-Za-z0-9+/]{8,4096}={0,2}")),
    ("Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,64}\b")),
    ("AWS access key", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("API key (sk-)", re.compile(r"\bsk-[A-Za-z0-9_-]{20,256}")),
    ("JWT", re.compile(r"\beyJ[A-Za-z0-9_-]{4,4096}\.eyJ[A-Za-z0-9_-]{4,8192}\.[A-Za-z0-9_-]{0,4096}")),
    ("PEM block", re.compile(r"-----BEGIN [A-Z0-9 ]{1,40}-----")),
    ("GitHub token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{30,255})")),
    ("Slack token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,255}")),
    ("Google API key", re.compile(r"\bAIza[A-Za-z0-9_-]{35}")),
    # a credential as one key=value of a connection string or a URL query (password=, token=, sig=,
    # X-Amz-Signature=); the key stays. "bypass=1", "token bucket" are none.
    ("credential key=value", re.compile(r"\b(?i:(pass(?:word|wd|phrase)?|pwd|secret|(?:access_|auth_|refresh_)?token|"
                                        r"api[_-]?key|sig|signature|x-amz-signature|x-amz-security-token))"
                                        r"=[^\s&;,]{4,4096}")),
)
_PEM_END = re.compile(r"-----END [A-Z0-9 ]{1,40}-----")


def secret_shape(value: str) -> str | None:
    """The kind of credential ``value`` holds or contains (``SECRET_SHAPES``: URL userinfo, a Bearer or
    Basic credential, ``hf_``, ``AKIA``, ``sk-``, a JWT, a PEM block, GitHub/Slack/Google tokens, a
    ``password=``/``token=``/``sig=`` key=value), else None."""
    for kind, pat in SECRET_SHAPES:
        if pat.search(value):
            return kind
    return None


def redact_text(text: str) -> tuple[str, list[str]]:
    """``text`` with every credential-shaped part (``SECRET_SHAPES``) replaced: URL userinfo becomes
    ``scheme://<redacted>@``, a Bearer/Basic credential ``Bearer <redacted>``, a PEM block (to its END
    line, else to the end) and any token ``<redacted>``. Returns the text and the kinds found."""
    kinds: list[str] = []
    for kind, pat in SECRET_SHAPES:
        if not pat.search(text):
            continue
        kinds.append(kind)
        if kind == "URL userinfo":
            text = pat.sub(lambda m: m.group().split("://", 1)[0] + "://" + REDACTED + "@", text)
        elif kind == "Bearer/Basic credential":
            text = pat.sub(lambda m: m.group().split(None, 1)[0] + " " + REDACTED, text)
        elif kind == "credential key=value":
            text = pat.sub(lambda m: m.group(1) + "=" + REDACTED, text)
        elif kind == "PEM block":
            out, pos = [], 0
            while (m := pat.search(text, pos)) is not None:
                end = _PEM_END.search(text, m.end())
                out.append(text[pos:m.start()] + REDACTED)
                pos = end.end() if end else len(text)
            text = "".join(out) + text[pos:]
        else:
            text = pat.sub(REDACTED, text)
    return text, kinds


def redact_env(env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """``env`` with each credential's value replaced by :data:`REDACTED`: by name
    (:func:`is_secret_name`) or by shape (:func:`secret_shape`: ``AFD_DB_URL=postgres://u:pw@db``,
    ``AFD_HEADERS=Authorization: Bearer ...``). Returns it and the names redacted (sorted). The name
    stays, so a reader sees the variable was set."""
    names = sorted(k for k, v in env.items() if v != REDACTED and (is_secret_name(k) or secret_shape(str(v))))
    return {k: (REDACTED if k in names else v) for k, v in env.items()}, names


def redacted_note(name: str) -> str:
    """The run note for one variable whose value :func:`redact_env` replaced (capture manifest and
    report notes say it in the same words)."""
    if is_secret_name(name):
        return f"env {name}: value redacted (the name looks like a credential)"
    return f"env {name}: value redacted (the value looks like a credential)"


def redact_report(obj: Any) -> Any:
    """A copy of a report (or any JSON: dicts, lists, strings) with every credential gone: each dict
    under an ``env`` key through :func:`redact_env` (by name and shape), every other string through
    :func:`redact_text`. Iterative, so no nesting depth overflows it. For reports that came from
    elsewhere (a merge input, an older snapshot) and for what is stored (history, HTML)."""
    root: list[Any] = [obj]
    stack: list[tuple[Any, Any, Any, bool]] = [(root, 0, obj, False)]
    while stack:
        parent, key, value, is_env = stack.pop()
        if isinstance(value, str):
            if value and _ANY_SHAPE.search(value):
                parent[key] = redact_text(value)[0]
        elif isinstance(value, dict):
            if is_env and all(isinstance(v, str) for v in value.values()):
                value = redact_env({str(k): v for k, v in value.items()})[0]
            new: dict[Any, Any] = {}
            for k, v in value.items():
                k2 = redact_text(k)[0] if isinstance(k, str) and _ANY_SHAPE.search(k) else k
                new[k2] = v
                stack.append((new, k2, v, k2 == "env"))
            parent[key] = new
        elif isinstance(value, list):
            new_list = list(value)
            for i, v in enumerate(new_list):
                stack.append((new_list, i, v, False))
            parent[key] = new_list
    return root[0]


_ANY_SHAPE = re.compile("|".join(f"(?:{p.pattern})" for _, p in SECRET_SHAPES))


_DEV_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def parse_device_map(value: str) -> tuple[dict[str, str], list[str]]:
    """Parse ``ip=device[,ip=device...]`` → (``{ip: device}``, problems).

    Each problem is one line naming the bad entry. Empty entries (``a=b,,``) are ignored.
    """
    entries: dict[str, str] = {}
    problems: list[str] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            continue
        ip, sep, dev = item.partition("=")
        ip, dev = ip.strip(), dev.strip()
        if not sep or not ip or not dev:
            problems.append(f"entry {item!r} is not ip=device")
            continue
        try:
            ipaddress.IPv4Address(ip)
        except ValueError:
            problems.append(f"entry {item!r}: {ip!r} is not an IPv4 address")
            continue
        if not _DEV_RE.match(dev):
            problems.append(f"entry {item!r}: {dev!r} is not an RDMA device name")
            continue
        if ip in entries and entries[ip] != dev:
            problems.append(f"{ip} is mapped twice ({entries[ip]} and {dev})")
            continue
        entries[ip] = dev
    return entries, problems


def format_device_map(entries: dict[str, str]) -> str:
    """``{ip: device}`` → ``ip=device,ip=device`` (the launcher's form)."""
    return ",".join(f"{ip}={dev}" for ip, dev in entries.items())


@dataclass
class HcaSpec:
    """``NCCL_IB_HCA`` parsed: ``^`` excludes, ``=`` asks exact names (else prefix match)."""

    exclude: bool = False
    exact: bool = False
    items: list[tuple[str, int | None]] = field(default_factory=list)  # (name, port or None)

    def selects(self, device: str, port: int) -> bool:
        """True when NCCL would use ``device`` port ``port`` under this spec."""
        hit = any(
            (device == name if self.exact else device.startswith(name))
            and (p is None or p == port)
            for name, p in self.items
        )
        return not hit if self.exclude else hit


def parse_nccl_hca(value: str) -> HcaSpec:
    """Parse ``NCCL_IB_HCA`` (``[^][=]dev[:port][,dev[:port]...]``). Raises ValueError on a bad port."""
    v = value.strip()
    spec = HcaSpec()
    if v.startswith("^"):
        spec.exclude, v = True, v[1:]
    if v.startswith("="):
        spec.exact, v = True, v[1:]
    for item in v.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, port = item.partition(":")
        if port and not digits(port):
            raise ValueError(f"{item[:40]!r}{'...' if len(item) > 40 else ''}: port is not a number")
        spec.items.append((name, int(port) if port else None))
    return spec


def parse_env_file(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (a snapshot's ``env``): blank lines and ``#`` comments skipped,
    ``export`` prefixes and matching outer quotes removed. Lines without ``=`` are ignored."""
    out: dict[str, str] = {}
    for line in text.split("\n"):  # as a shell reads it: \v, \f, U+2028 end no line
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, sep, val = line.partition("=")
        if not sep or not key.strip():
            continue
        val = val.strip()
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "'\"":
            val = val[1:-1]
        out[key.strip()] = val
    return out


_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LaunchEnvError(ValueError):
    """A launch env file that cannot be used: the message names the file, the line and the fix."""


# What a shell sourcing the file does not take literally: unquoted, a blank and
# ; | & < > ( ) $ ` \\ " ' * ? [ ] { } ~ ! (run, expanded, split or globbed); in double quotes
# $ ` \\ (which bash expands).
_BARE_BAD = re.compile(r"[ \t|&;<>()$`\\\"'*?\[\]{}~!]")
_LINE_BREAKS = {"\r": "a carriage return (CRLF line end)", "\v": "a vertical tab", "\f": "a form feed",
                "\x1c": "a file separator", "\x1d": "a group separator", "\x1e": "a record separator",
                "\x85": "a NEL line break", "\u2028": "a U+2028 line separator",
                "\u2029": "a U+2029 paragraph separator"}


def _unquote(val: str, where: str) -> str:
    """The value a shell sourcing ``KEY=val`` would set, when that is exactly the text afddiag reads;
    anything the shell would expand, split or run is a LaunchEnvError naming ``where``."""
    val = val.rstrip(" \t")
    if val[:1] in ("'", '"'):
        q = val[0]
        end = val.find(q, 1)
        if end < 0:
            raise LaunchEnvError(f"{where}: unterminated {q} quote: close it")
        rest = val[end + 1:]
        if rest and not (rest[:1] in (" ", "\t") and rest.strip().startswith("#")):
            raise LaunchEnvError(f"{where}: text after the closing quote ({rest.strip()[:40]!r}): "
                                 "quote the whole value")
        inner = val[1:end]
        if q == '"' and (bad := next((c for c in inner if c in "$`\\"), None)):
            raise LaunchEnvError(f"{where}: {bad!r} inside double quotes: the shell would expand it (command "
                                 "substitution, a variable); use single quotes for a literal value")
        return inner
    bare, _, comment = val.partition(" #") if " #" in val else val.partition("\t#")
    bare = bare.rstrip(" \t")
    if (m := _BARE_BAD.search(bare)) is not None:
        c = m.group()
        what = {"$": "'$' (command substitution or a variable)", "`": "a backtick (command substitution)",
                " ": "a blank (the shell would run the rest as a command)", "\t": "a tab (the shell would run the rest "
                "as a command)"}.get(c, f"the shell metacharacter {c!r}")
        raise LaunchEnvError(f"{where}: unquoted {what} in the value: a shell sourcing this file would not set "
                             "what afddiag reads; quote the value with single quotes, or remove it")
    return bare


FLAG_WORDS = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}


def _check_value(key: str, val: str, where: str) -> None:
    def ipv4(v: str) -> None:
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise LaunchEnvError(f"{where}: {key}={v!r} is not an IPv4 address (dotted form, e.g. 10.9.0.2)") from None

    if key == "AFD_FABRIC_IP" and val:
        ipv4(val)
    elif key == "AFD_PEER_FABRIC_IPS" and val:
        for v in re.split(r"[,\s]+", val.strip()):
            if v:
                ipv4(v)
    elif key in (*CAPACITY_KEYS.values(), "AFD_IMAGE_SM_COUNT") and val:
        if not re.fullmatch(r"[0-9]{1,9}", val) or int(val) <= 0:  # ASCII digits only: '²'.isdigit() is True
            raise LaunchEnvError(f"{where}: {key}={val[:20]!r}{'...' if len(val) > 20 else ''} is not a positive "
                                 "integer (1 to 999999999, ASCII digits)")
    elif key == "AFD_DRAFTER" and val and val.lower() not in FLAG_WORDS:
        raise LaunchEnvError(f"{where}: AFD_DRAFTER={val!r} is not a flag (1/0, true/false, on/off, yes/no)")
    elif key == "AFD_ENGINE_PORTS" and val:
        if not all(digits(v) and 0 < int(v) < 65536 for v in re.split(r"[,\s]+", val.strip()) if v):
            raise LaunchEnvError(f"{where}: AFD_ENGINE_PORTS={val[:40]!r}{'...' if len(val) > 40 else ''} is not a "
                                 "list of TCP ports (e.g. 29500,29501)")
    elif key == "AFD_GPU_MEMORY_RESERVATION" and val:
        try:
            ok = 0.0 < float(val) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            raise LaunchEnvError(f"{where}: AFD_GPU_MEMORY_RESERVATION={val!r} is not a fraction in (0, 1] (e.g. 0.97)")
    elif key == "AFD_ROLE" and val and not _KEY_RE.match(val.replace("-", "_")):
        raise LaunchEnvError(f"{where}: AFD_ROLE={val!r} is not a role name (coordinator, expert, generic)")
    elif key == MAP_VAR and val:
        _, problems = parse_device_map(val)
        if problems:
            raise LaunchEnvError(f"{where}: {MAP_VAR}: {problems[0]} (form: ip=device[,ip=device])")


def parse_launch_env(text: str, path: str = "<launch env>", aliases: dict[str, str] | None = None,
                     spelled: dict[str, str] | None = None) -> dict[str, str]:
    """Parse a launch env file strictly: ``KEY=VALUE`` lines, ``export`` prefixes, single or double
    quotes, blank lines and ``#`` comments. ``aliases`` maps a site's own variable names to afddiag's
    (``{"SITE_IP": "AFD_FABRIC_IP"}``). Returns every key (afddiag's names for aliased ones); ``spelled``,
    when given, receives afddiag's name → the file's own for each aliased key the file sets (a remedy
    names a variable as the operator's file spells it).

    Raises :class:`LaunchEnvError` naming ``path`` and the line for garbage lines, duplicate keys
    (aliases included) and bad values of the keys afddiag reads.
    """
    out: dict[str, str] = {}
    first_line: dict[str, tuple[int, str]] = {}
    for n, raw in enumerate(text.split("\n"), 1):  # bash ends a line at \n alone
        where = f"{path}:{n}"
        brk = next((c for c in raw if c in _LINE_BREAKS), None)
        if brk is not None:
            raise LaunchEnvError(f"{where}: {_LINE_BREAKS[brk]} in the line: bash does not end a line there (it "
                                 "would set a different value or variable); save the file with plain \\n line ends")
        ctl = next((c for c in raw if (ord(c) < 32 and c != "\t") or ord(c) == 127), None)
        if ctl is not None:
            raise LaunchEnvError(f"{where}: control character {ctl!r} in the line: remove it")
        line = raw.strip(" \t")
        if not line or line.startswith("#"):
            continue
        if line.startswith("export ") or line.startswith("export\t"):
            line = line[7:].lstrip()
        key, sep, val = line.partition("=")
        if sep and (key != key.rstrip() or val[:1] in (" ", "\t")):
            raise LaunchEnvError(f"{where}: spaces around '=' ({raw.strip()[:60]!r}): a shell sourcing this file "
                                 "would run a command instead: write KEY=VALUE")
        key = key.strip()
        if not sep or not _KEY_RE.match(key):
            raise LaunchEnvError(f"{where}: not a KEY=VALUE line ({raw.strip()[:60]!r}): fix or comment it out")
        name = (aliases or {}).get(key, key)
        if name in first_line:
            line0, key0 = first_line[name]
            if key0 != key:
                same = f" (as {key0}, an alias of {name})"
            else:
                same = f" (alias of {name})" if name != key else ""
            raise LaunchEnvError(f"{where}: duplicate key {key}, first set on line {line0}{same}: keep one")
        value = _unquote(val, where)
        _check_value(name, value, where)
        out[name] = value
        first_line[name] = (n, key)
        if spelled is not None and name != key:
            spelled[name] = key
    return out
