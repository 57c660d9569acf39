#!/usr/bin/env python3
"""How long `afddiag merge` takes over N per-host reports (goal: ≤ 3 s for 1,000 on a 2-core machine).

    .venv/bin/python benchmarks/merge_scaling.py [N ...]        # default: 100 1000

Generates N reports (:func:`make_reports`: one coordinator and N-1 expert ranks, from one real
`afddiag all --json` of the shared case 02 with a launch env, with a few planted faults), writes one
file per host, then times the whole command in a fresh process (`python -m afddiag merge --json`:
interpreter start, imports, reading and parsing every file, the fleet gates, the JSON report) and,
in-process, the parse and the gates alone. Prints one line per N. Not a test: tests/test_merge.py
checks the verdicts on the same generated reports.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CASE = Path(os.environ.get("AFDDIAG_CASES", REPO.parent / "shared" / "cases")) / "fabric" / "02-spark-map-set-healthy"

#: host index → what is wrong with it (tests assert that the fleet gates name exactly these)
FAULTS = {17: "capacity", 42: "mtu", 99: "subnet", 500: "map", 777: "kernel", 900: "slow"}
DUPLICATE = (100, 101)  # these two share one fabric IP


def base_report(tmp: Path) -> dict:
    """One real expert report: case 02's snapshot, a launch env with AFD_EXPERT_CAPACITY=256."""
    from afddiag.check import diagnose
    from afddiag.inputs import make_inputs

    env = tmp / "expert.env"
    env.write_text("AFD_ROLE=expert\nAFD_EXPERT_CAPACITY=256\n"
                   "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP=192.168.100.11=rocep1s0f1\n")
    inputs = make_inputs(snapshot=str(CASE), fabric_ip="192.168.100.11", role="expert", launch_env_path=str(env))
    return diagnose(inputs, {"fabric", "gpu", "host", "launch"})[0]


def _ip(i: int) -> str:
    return str(ipaddress.IPv4Address("10.64.0.0") + 10 + i)


def make_reports(n: int, out: Path) -> list[Path]:
    """Write ``n`` per-host reports to ``out`` (``host-00000.json`` …); host 0 is the coordinator.
    Fabric IPs 10.64.0.10+i on 10.64.0.0/16; faults per :data:`FAULTS` and :data:`DUPLICATE`."""
    out.mkdir(parents=True, exist_ok=True)
    base = base_report(out)
    paths = []
    for i in range(n):
        r = copy.deepcopy(base)
        name = f"node{i:05d}"
        ip = _ip(DUPLICATE[0]) if i == DUPLICATE[1] else _ip(i)
        r["host"] = name
        r["inputs"]["fabric_ip"] = ip
        r["inputs"]["launch_env"] = f"/etc/afd/{name}.env"
        nds = r["facts"]["fabric"]["netdevs"]
        nds["enp1s0f1np1"]["ipv4"] = [f"{ip}/16"]
        r["facts"]["versions"] = {"kernel": "6.11.0-1016-nvidia", "bios": "5.36", "rdma_core": "50.0"}
        gates = {g["id"]: g for g in r["gates"]}
        cap = gates["launch.capacity"]["facts"]
        if i == 0:
            r["inputs"]["role"] = "coordinator"
            cap.update({"key": "AFD_PREFILL_CAPACITY", "value": 256, "set": True})
        fault = FAULTS.get(i)
        if fault == "capacity":
            cap["value"] = 128
        elif fault == "mtu":
            gates["fabric.mtu"]["facts"].update({"roce_mtu": 1024, "netdev_mtu": 1500})
        elif fault == "subnet":
            r["inputs"]["fabric_ip"] = "10.65.0.9"
            nds["enp1s0f1np1"]["ipv4"] = ["10.65.0.9/16"]
        elif fault == "map":  # the map left out: the host's own first-device FAILs (case 02's first device
            # does not carry the fabric IP), as that host's afddiag reports it
            r["inputs"]["env"].pop("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", None)
            gates["fabric.first-device"].update({"verdict": "FAIL", "summary": "rocep1s0f0 (first enumerated device, "
                                                 "DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP not set) does not carry "
                                                 f"fabric IP {ip}"})
        elif fault == "kernel":
            r["facts"]["versions"]["kernel"] = "6.8.0-1009-nvidia"
        elif fault == "slow":
            gates["gpu.slow-state"].update({"verdict": "FAIL", "summary": "GPU 0 NVIDIA GB10: class A: SM clock "
                                            "under load 799 MHz is 27% of max 3003 MHz"})
        # the per-host summary the fleet gates read, as the host's afddiag builds it from its report;
        # odd hosts carry none (an older afddiag): merge builds it from the report the same way
        r.pop("summary", None)
        if i % 2 == 0:
            from afddiag import summary

            r["summary"] = summary.from_report(r)
        p = out / f"host-{i:05d}.json"
        p.write_text(json.dumps(r))
        paths.append(p)
    return paths


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [100, 1000]
    from afddiag.fleet import judge, load_reports

    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="afddiag-merge-") as d:
            paths = make_reports(n, Path(d))
            mb = sum(p.stat().st_size for p in paths) / 1e6
            t = time.monotonic()
            p = subprocess.run([sys.executable, "-m", "afddiag", "merge", "--json", *map(str, paths)],
                               capture_output=True, text=True, cwd=REPO)
            wall = time.monotonic() - t
            fr = json.loads(p.stdout)
            t = time.monotonic()
            hosts = load_reports([str(x) for x in paths])
            t_parse = time.monotonic() - t
            t = time.monotonic()
            judge(hosts)
            t_gates = time.monotonic() - t
            print(f"merge of {n} reports ({mb:.1f} MB): {wall:.2f} s wall in a fresh process (exit {p.returncode}, "
                  f"{fr['hosts_ok']} hosts ok); in-process: parse {t_parse:.2f} s, fleet gates {t_gates:.2f} s; "
                  f"goal <= 3 s for 1000: {'met' if n != 1000 or wall <= 3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
