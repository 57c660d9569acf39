"""One fleet page: ``afddiag fleet|merge --html FILE`` writes a single self-contained HTML file.

No script, no network fetch (styles inline, the favicon a ``data:`` URL), so it opens from a
ticket attachment, a shared folder or ``file://`` as it is. Top to bottom:

1. the diagnosis: per host, the independent faults each with its one remedy (the report's
   ``diagnosis`` list when it has one, else its FAIL/ERROR gates with their remedies), the hosts
   without a report and why, and the cross-host gates that FAIL, ERROR or WARN;
2. each gate's verdict per host (gates down, hosts across; the fleet gates below);
3. per host: HCAs in enumeration order → ports (state, rate, netdev, MTU and RoCE path MTU) → the
   IPv4 GIDs on them (GID index, RoCE version), marking the device the engine opens and the fabric
   IP; and the GID index of each rail's IPv4 RoCE v2 GID.

Everything shown is read from the per-host JSON reports (``afddiag/schema/report.schema.json``) and
the fleet report; text is escaped, never trusted as markup.
"""

from __future__ import annotations

from typing import Any

from afddiag.atomic import atomic_write
from afddiag.catalog import load
from afddiag.prometheus import path_mtus
from afddiag.render import action_tag
from afddiag.termsafe import html as esc
from afddiag.verdict import ERROR, FAIL, VERDICTS, WARN

TELLS = (FAIL, ERROR, WARN)
_ORDER = {FAIL: 0, ERROR: 1, WARN: 2}

CSS = """
*{box-sizing:border-box}
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;padding:16px 20px;
color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px}
h2{font-size:16px;margin:18px 0 6px;border-bottom:1px solid #d0d7de;padding-bottom:2px}
h3{font-size:15px;margin:12px 0 4px}
.sub{color:#57606a;margin:0 0 10px}
.v{display:inline-block;min-width:44px;padding:0 5px;border-radius:3px;font-weight:600;font-size:12px;text-align:center}
.PASS{background:#dafbe1;color:#116329}.WARN{background:#fff8c5;color:#7d4e00}
.FAIL{background:#ffebe9;color:#a40e26}.ERROR{background:#fbefff;color:#8250df}.SKIP{background:#f6f8fa;color:#6e7781}
.host{border-left:4px solid #a40e26;padding:4px 10px;margin:6px 0;background:#fffafa}
.host.warn{border-color:#bf8700;background:#fffdf0}.host.err{border-color:#8250df;background:#fdfaff}
.host.ok{border-color:#1a7f37;background:#f6fff8}
.fault{margin:3px 0}
.gate{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:13px}
.remedy{margin:2px 0 4px 52px;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:13px;
background:#f6f8fa;padding:3px 6px;border-radius:3px;overflow-wrap:anywhere;white-space:pre-wrap}
pre.cmd{margin:0 0 2px 64px;font-size:13px;white-space:pre;overflow-x:auto}
.explains{margin-left:52px;color:#57606a;font-size:12px}
table{border-collapse:collapse;margin:4px 0 8px}
th,td{border:1px solid #d0d7de;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}
td.mono,span.mono{font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12px}
.tag{display:inline-block;font-size:11px;padding:0 4px;border-radius:3px;margin-left:4px;
background:#ddf4ff;color:#0969da}
.tag.fip{background:#fff1e5;color:#bc4c00}
.muted{color:#6e7781}
"""


def _e(v: Any) -> str:
    return esc(v)


def _v(verdict: str | None) -> str:
    v = verdict if verdict in VERDICTS else "ERROR"
    return f'<span class="v {v}">{_e(verdict or "?")}</span>'


def _rank(verdict: object) -> int:
    """Fix order of a verdict: FAIL 0, ERROR 1, WARN 2, anything else 3."""
    return _ORDER.get(verdict, 3) if isinstance(verdict, str) else 3


def host_faults(report: dict[str, Any]) -> list[dict[str, Any]]:
    """What a host needs fixed, in fix order: the report's ``diagnosis`` entries (gate, verdict,
    summary, remedy, explains) when it has them, else its FAIL and ERROR gates, then WARN."""
    diag = report.get("diagnosis")
    if isinstance(diag, list) and all(isinstance(d, dict) for d in diag):
        return [{"gate": d.get("gate"), "verdict": d.get("verdict") or FAIL, "summary": d.get("summary"),
                 "remedy": d.get("remedy"), "commands": d.get("commands"), "action": d.get("action"),
                 "drain": d.get("drain"), "explains": d.get("explains") or []} for d in diag]
    gates = [g for g in report.get("gates") or [] if isinstance(g, dict) and g.get("verdict") in TELLS]
    gates.sort(key=lambda g: _rank(g.get("verdict")))
    return [{"gate": g.get("id"), "verdict": g.get("verdict"), "summary": g.get("summary"), "remedy": g.get("remedy"),
             "commands": g.get("commands"), "action": g.get("action"), "drain": g.get("drain"), "explains": []}
            for g in gates]


def _remedy(entry: dict[str, Any]) -> str:
    """The remedy line with its action and drain as the text reports show them
    (:func:`afddiag.render.action_tag`: ``[FIX_ADDRESS, drain]``), then each of its commands alone in
    a block of its own (a report from elsewhere: only strings, escaped)."""
    tag = action_tag(entry)
    cmds = [c for c in _list(entry.get("commands")) if isinstance(c, str)]
    return (f'<div class="remedy">{_e(entry["remedy"])}'
            + (f' <span class="action">{_e(tag)}</span>' if tag else "") + "</div>"
            + "".join(f'<pre class="cmd">{_e(c)}</pre>' for c in cmds))


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _gate(report: dict[str, Any], gid: str) -> dict[str, Any]:
    return next((g for g in _list(report.get("gates")) if isinstance(g, dict) and g.get("id") == gid), {})


def engine_device(report: dict[str, Any]) -> str | None:
    """The device the engine opens, as fabric.first-device judged it; else the first enumerated."""
    facts = _dict(_gate(report, "fabric.first-device").get("facts"))
    if isinstance(facts.get("engine_device"), str):
        return facts["engine_device"]
    devs = _list(_dict(_dict(report.get("facts")).get("fabric")).get("devices"))
    return devs[0].get("name") if devs and isinstance(devs[0], dict) else None


def _diagnosis(fr: dict[str, Any], reports: dict[str, dict[str, Any]]) -> list[str]:
    out = ['<section id="diagnosis"><h2>Diagnosis</h2>']
    bad = 0
    for row in fr.get("hosts") or []:
        name = row.get("name")
        rep = reports.get(name)
        if rep is None:
            bad += 1
            out.append(f'<div class="host err" id="diag-{_e(name)}" data-host="{_e(name)}"><b>{_e(name)}</b> '
                       f'{_v(ERROR)} no report: {_e(row.get("error"))}</div>')
            continue
        faults = host_faults(rep)
        if not faults:
            continue
        bad += 1
        worst = min((_rank(f["verdict"]) for f in faults), default=3)
        cls = "" if worst == 0 else " err" if worst == 1 else " warn"
        out.append(f'<div class="host{cls}" id="diag-{_e(name)}" data-host="{_e(name)}"><b>{_e(name)}</b>'
                   f' <span class="muted">{_e(row.get("role") or "")} · exit {_e(row.get("exit_code"))}</span>')
        for f in faults:
            out.append(f'<div class="fault">{_v(f["verdict"])} <span class="gate">{_e(f["gate"])}</span>: '
                       f'{_e(f["summary"])}</div>')
            if f.get("remedy"):
                out.append(_remedy(f))
            if f.get("explains"):
                out.append(f'<div class="explains">explains: {_e(", ".join(map(str, f["explains"])))}</div>')
        out.append("</div>")
    fleet_bad = [g for g in fr.get("gates") or [] if g.get("verdict") in TELLS]
    if fleet_bad:
        out.append('<div class="host" id="diag-fleet"><b>across hosts</b>')
        for g in sorted(fleet_bad, key=lambda g: _rank(g.get("verdict"))):
            out.append(f'<div class="fault">{_v(g["verdict"])} <span class="gate">{_e(g["id"])}</span>: '
                       f'{_e(g["summary"])}</div>')
            if g.get("remedy"):
                out.append(_remedy(g))
        out.append("</div>")
    if not bad and not fleet_bad:
        out.append('<div class="host ok">every host fit, the fleet gates agree: nothing to fix</div>')
    out.append("</section>")
    return out


MAX_UNKNOWN_GATES = 20  # gate ids this afddiag's catalog lacks (a newer version, a forged report) shown as rows
TITLE_CHARS = 200  # a cell's tooltip: the gate's summary, cut


def _matrix(fr: dict[str, Any], reports: dict[str, dict[str, Any]]) -> list[str]:
    """Gates down, hosts across. Rows: the catalog's gate ids that some host reported, then at most
    :data:`MAX_UNKNOWN_GATES` ids the catalog lacks (the rest counted), so the page grows linearly in
    hosts whatever ids the reports carry; each host's gates are indexed once (no scan per cell)."""
    names = [r.get("name") for r in fr.get("hosts") or []]
    known = load().get("gates") or {}
    by_host: dict[Any, dict[str, dict[str, Any]]] = {}
    seen: dict[str, None] = {}
    for n in names:
        idx = by_host.setdefault(n, {})
        for g in _list((reports.get(n) or {}).get("gates")):
            if isinstance(g, dict) and isinstance(g.get("id"), str):
                idx.setdefault(g["id"], g)
                seen.setdefault(g["id"], None)
    unknown = [gid for gid in seen if gid not in known]
    gids = [gid for gid in known if gid in seen] + unknown[:MAX_UNKNOWN_GATES]
    out = ['<section id="verdicts"><h2>Gates per host</h2><table><tr><th>gate</th>']
    out += [f"<th>{_e(n)}</th>" for n in names] + ["</tr>"]
    for gid in gids:
        out.append(f'<tr><td class="mono">{_e(gid)}</td>')
        for n in names:
            g = by_host.get(n, {}).get(gid)
            out.append(f'<td title="{_e(str(g.get("summary"))[:TITLE_CHARS])}">{_v(g.get("verdict"))}</td>' if g
                       else "<td><span class=muted>—</span></td>")
        out.append("</tr>")
    out.append("</table>")
    if len(unknown) > MAX_UNKNOWN_GATES:
        out.append(f'<p class="muted">{len(unknown) - MAX_UNKNOWN_GATES} more gate id(s) this afddiag does not know '
                   "are not shown (each host's JSON report has them)</p>")
    if fr.get("gates"):
        out.append('<table><tr><th>fleet gate</th><th>verdict</th><th>summary</th></tr>')
        for g in fr["gates"]:
            out.append(f'<tr><td class="mono">{_e(g["id"])}</td><td>{_v(g["verdict"])}</td>'
                       f'<td>{_e(g["summary"])}</td></tr>')
        out.append("</table>")
    out.append("</section>")
    return out


def _topology(name: str, rep: dict[str, Any]) -> list[str]:
    fab = _dict(_dict(rep.get("facts")).get("fabric"))
    devs = [d for d in _list(fab.get("devices")) if isinstance(d, dict)]
    fip = _dict(rep.get("inputs")).get("fabric_ip")
    engine = engine_device(rep)
    out = [f'<h3 id="host-{_e(name)}">{_e(name)} <span class="muted">{_e(_dict(rep.get("inputs")).get("role"))} · '
           f'fabric IP {_e(fip or "not resolved")} · engine opens {_e(engine or "—")}</span></h3>']
    if not devs:
        out.append('<div class="muted">no RDMA device in this report (fabric not probed or none on the host)</div>')
        return out
    netdevs = fab["netdevs"] if isinstance(fab.get("netdevs"), dict) else {}
    pmtu = {(d, str(p), n): m for d, p, n, m in path_mtus(fab)}
    out.append('<table><tr><th>HCA (index)</th><th>port</th><th>state</th><th>rate</th><th>netdev</th>'
               '<th>MTU → path MTU</th><th>IPv4 GIDs (index, type)</th><th>RoCE v2 IPv4 GID index</th></tr>')
    for d in devs:
        ports = [p for p in _list(d.get("ports")) if isinstance(p, dict)] or [{}]
        for i, p in enumerate(ports):
            gids = [g for g in _list(p.get("gids")) if isinstance(g, dict)]
            nds = sorted({g["netdev"] for g in gids if isinstance(g.get("netdev"), str)})
            ips, v2 = [], []
            for g in gids:
                if not g.get("ipv4"):
                    continue
                tag = ' <span class="tag fip">fabric IP</span>' if g.get("ipv4") == fip else ""
                ips.append(f'{_e(g["ipv4"])} ({_e(g.get("index"))}, {_e(g.get("type"))}){tag}')
                if g.get("type") == "RoCE v2":
                    v2.append(str(g.get("index")))
            mtus = []
            for n in nds:
                mtu = (netdevs.get(n) or {}).get("mtu") if isinstance(netdevs.get(n), dict) else None
                pm = pmtu.get((str(d.get("name")), str(p.get("num")), n))
                mtus.append(f"{_e(mtu)} → {_e(pm)}" if mtu is not None else "—")
            head = ""
            if i == 0:
                tag = ' <span class="tag">engine opens</span>' if d.get("name") == engine else ""
                head = (f'<td rowspan="{len(ports)}" class="mono">{_e(d.get("name"))} ({_e(d.get("index"))})'
                        f'{tag}</td>')
            out.append(f'<tr>{head}<td>{_e(p.get("num"))}</td><td>{_e(p.get("state"))}</td><td>{_e(p.get("rate"))}'
                       f'</td><td class="mono">{_e(", ".join(nds))}</td><td>{"<br>".join(mtus)}</td>'
                       f'<td class="mono">{"<br>".join(ips) or "<span class=muted>none</span>"}</td>'
                       f'<td>{_e(", ".join(v2)) or "—"}</td></tr>')
    out.append("</table>")
    return out


def render(fr: dict[str, Any], reports: dict[str, dict[str, Any]]) -> str:
    """The fleet page for the fleet report ``fr`` (``afddiag/schema/fleet.schema.json``) and each
    host's report by host name (hosts without one are listed with their error). Returns the whole
    HTML document as a string."""
    c = fr.get("counts") or {}
    code = fr.get("exit_code")
    words = {0: "clean", 1: "WARN", 2: "FAIL", 3: "ERROR"}.get(code, "?") if isinstance(code, int) else "?"
    parts = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width,initial-scale=1">',
             '<link rel="icon" href="data:,">',
             f"<title>afddiag fleet — {_e(len(fr.get('hosts') or []))} hosts — exit {_e(code)}</title>",
             f"<style>{CSS}</style></head><body>",
             f"<h1>afddiag fleet: {_e(words)} (exit {_e(code)})</h1>",
             f'<p class="sub">{_e(fr.get("hosts_ok"))} host(s) reported, '
             f'{_e(fr.get("hosts_error"))} without a report · '
             f'fleet gates {_e(c.get("PASS", 0))} pass, {_e(c.get("WARN", 0))} warn, {_e(c.get("FAIL", 0))} fail, '
             f'{_e(c.get("ERROR", 0))} error · {_e(fr.get("source"))} · {_e(fr.get("generated_at"))} · '
             f'afddiag {_e(fr.get("afddiag_version"))}</p>']
    parts += _diagnosis(fr, reports)
    parts += _matrix(fr, reports)
    parts.append('<section id="hosts"><h2>Hosts: HCAs → ports → IPs</h2>')
    for row in fr.get("hosts") or []:
        rep = reports.get(row.get("name"))
        if rep is None:
            parts.append(f'<h3>{_e(row.get("name"))}</h3><div class="muted">no report: {_e(row.get("error"))}</div>')
        else:
            parts += _topology(row.get("name"), rep)
    parts.append("</section></body></html>\n")
    return "\n".join(parts)


def write_page(path: str, fr: dict[str, Any], reports: dict[str, dict[str, Any]]) -> None:
    """Write :func:`render`'s page to ``path`` atomically. Raises OSError (an
    :class:`afddiag.atomic.OutputTargetError` for a FIFO, socket or folder) when it cannot."""
    with atomic_write(path, device_ok=True) as f:
        f.write(render(fr, reports))
