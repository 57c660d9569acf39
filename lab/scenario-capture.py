#!/usr/bin/env python3
"""Lab guest script for the capture round trip (runs as root inside the lab VM; see lab/README.md).

Usage (lab/boot.sh with ``AFDDIAG_LAB_SCRIPT=lab/scenario-capture.py``): ``python lab/scenario-capture.py OUTDIR``

Builds the incident host of lab/run-scenario.py (rxe ``zrxe0`` on va without IPv4, created first;
``arxe1`` on vc 10.9.0.2/24; the peer 10.9.0.1 in netns ``peer``), then, in this one process:

1. ``afddiag all --json --fabric-ip 10.9.0.2 --peer 10.9.0.1`` live (device map unset: the incident);
2. ``afddiag capture -o OUTDIR/capture.tar.gz --fabric-ip 10.9.0.2 --peer 10.9.0.1`` (the bundle the
   host side replays: every registered probe's readings, the route to the peer included);
3. ``afddiag fabric --no-qp --format prometheus --output OUTDIR/afddiag.prom``;
4. ``afddiag history --json --all-gates``.

``SECRET_TOKEN`` is set in the environment to check that it does not leave the host;
``NCCL_SOCKET_IFNAME`` (allow-listed) to check that it does. Writes OUTDIR/results.json and run.log.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from labkit import FABRIC_IP, LOG, PEER_IP, T0, build, log, run_cli, teardown, wait_ready  # noqa: E402


def main() -> int:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-lab"
    os.makedirs(outdir, exist_ok=True)
    os.environ["AFDDIAG_STATE_DIR"] = "/tmp/afddiag-state"  # the host root is shared read-only
    os.environ.pop("DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP", None)
    os.environ["SECRET_TOKEN"] = "must-not-leave"
    os.environ["NCCL_SOCKET_IFNAME"] = "vc"
    results: dict = {"kernel": os.uname().release, "runs": {}, "errors": []}
    try:
        build()
        results["ready"] = wait_ready()["ready"]
        # --timeout 60: under TCG the first read of rxe's 1024-slot GID tables takes longer than the 10 s default
        live = ["all", "--json", "--timeout", "60", "--fabric-ip", FABRIC_IP, "--peer", PEER_IP]
        results["runs"]["live"] = run_cli("live", live)
        bundle = os.path.join(outdir, "capture.tar.gz")
        results["runs"]["capture"] = run_cli("capture", ["capture", "--timeout", "60", "-o", bundle,
                                                         "--fabric-ip", FABRIC_IP, "--peer", PEER_IP])
        results["runs"]["prometheus"] = run_cli("prometheus", ["fabric", "--no-qp", "--fabric-ip", FABRIC_IP,
                                                               "--format", "prometheus", "--output",
                                                               os.path.join(outdir, "afddiag.prom")])
        results["runs"]["history"] = run_cli("history", ["history", "--json", "--all-gates"])
    except Exception:
        results["errors"].append(traceback.format_exc())
        log(traceback.format_exc())
    finally:
        teardown()
        results["elapsed_s"] = round(time.monotonic() - T0, 3)
        with open(os.path.join(outdir, "results.json"), "w") as f:
            json.dump(results, f, indent=2, default=str)
        with open(os.path.join(outdir, "run.log"), "w") as f:
            f.write("\n".join(LOG) + "\n")
        log(f"done in {results['elapsed_s']}s")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
