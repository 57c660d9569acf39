#!/usr/bin/env python3
"""Benchmark afddiag against the commands operators run by hand, inside the soft-RoCE lab guest.

    AFDDIAG_LAB_SCRIPT=lab/scenario-bench.py bash lab/boot.sh OUTDIR

Builds the incident host of lab/run-scenario.py (rxe zrxe0, arxe1 with 1,024 GID slots each; peer
10.9.0.1 in a namespace) and times, in this one guest: `afddiag fabric --no-qp` in-process and as a
new process; a show_gids-style walk (bash, one `cat` per file) over one device; `ibv_devinfo -v`;
`rdma link show`; and the QP probe per device toward the peer. QEMU's emulation (no KVM) makes
absolute times meaningless: compare ratios measured in the same guest. Writes OUTDIR/results.json
and OUTDIR/bench.txt.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import labkit as lab  # noqa: E402  build(), wait_ready(), sh(), constants; sys.path gets the repo

WALK_SLOTS = 64  # a full walk of 1,024 slots runs past 400 s under TCG: measure 64 and scale per slot
SHOW_GIDS_ONE = r'''
P=/sys/class/infiniband/$1/ports/1
for g in $(ls $P/gids | head -n "$2"); do
  gid=$(cat $P/gids/$g)
  if [ "$gid" = "0000:0000:0000:0000:0000:0000:0000:0000" ]; then continue; fi
  ver=$(cat $P/gid_attrs/types/$g 2>/dev/null); ndev=$(cat $P/gid_attrs/ndevs/$g 2>/dev/null)
  printf "%s\t1\t%s\t%s\t%s\t%s\n" "$1" "$g" "$gid" "$ver" "$ndev"
done
'''


def timed(cmd: list[str], timeout: float = 400) -> tuple[float, int]:
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return time.monotonic() - t, p.returncode


def main() -> int:
    outdir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/afddiag-bench"
    os.makedirs(outdir, exist_ok=True)
    res: dict = {"kernel": os.uname().release, "errors": []}
    try:
        lab.build()
        res["ready"] = lab.wait_ready()
        from afddiag.cli import run
        from afddiag.probes.qp import probe_qp

        slots = len(os.listdir(f"/sys/class/infiniband/{lab.FIRST_DEV}/ports/1/gids"))
        res["gid_slots_per_device"] = slots
        times = []
        for _ in range(3):
            t = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                run(["fabric", "--json", "--no-qp", "--fabric-ip", lab.FABRIC_IP])
            times.append(time.monotonic() - t)
        res["afddiag_fabric_inprocess_s"] = statistics.median(times[1:])  # the first pays the imports
        res["afddiag_fabric_inprocess_first_s"] = times[0]
        res["afddiag_fabric_process_s"], _ = timed([sys.executable, "-m", "afddiag", "fabric", "--no-qp",
                                                    "--fabric-ip", lab.FABRIC_IP])
        walked, _ = timed(["bash", "-c", SHOW_GIDS_ONE, "show_gids", lab.FIRST_DEV, str(WALK_SLOTS)])
        res["show_gids_walk_slots"] = WALK_SLOTS
        res["show_gids_walk_s"] = walked
        res["show_gids_all_devices_est_s"] = walked / WALK_SLOTS * slots * 2  # per-slot cost x all slots
        res["ibv_devinfo_v_s"], res["ibv_devinfo_rc"] = timed(["ibv_devinfo", "-v"])
        res["rdma_link_show_s"], _ = timed(["rdma", "link", "show"])
        from afddiag import runner
        from afddiag.model.run import Inputs

        fab = runner.gather(Inputs(run_qp=False, families=frozenset({"fabric"})), only={"fabric"}).fabric
        t = time.monotonic()
        qp = probe_qp(fab, lab.FABRIC_IP, [lab.PEER_IP], 5.0)
        res["qp_probe_total_s"] = time.monotonic() - t
        res["qp_probe_per_device_ms"] = {r.device: r.elapsed_ms for r in qp.results}
        res["qp_reached"] = {r.device: r.reached for r in qp.results}
    except Exception:  # noqa: BLE001
        import traceback

        res["errors"].append(traceback.format_exc())
    finally:
        lab.teardown()
    rows = []
    if "qp_reached" in res:
        walk = res["show_gids_all_devices_est_s"]
        rows = [
            ("guest", f"kernel {res['kernel']}, QEMU TCG, 2 rxe devices x {res['gid_slots_per_device']} GID slots"),
            (f"show_gids-style walk, {res['show_gids_walk_slots']} slots measured", f"{res['show_gids_walk_s']:.1f} s"),
            ("  scaled per slot to both devices' 2 x 1,024 slots", f"{walk:.0f} s  (anchor)"),
            ("afddiag fabric --no-qp, new process", f"{res['afddiag_fabric_process_s']:.2f} s  "
             f"({walk / res['afddiag_fabric_process_s']:.1f}x faster than the walk)"),
            ("afddiag fabric --no-qp, in-process (warm)", f"{res['afddiag_fabric_inprocess_s']:.2f} s  "
             f"({walk / res['afddiag_fabric_inprocess_s']:.0f}x faster)"),
            ("ibv_devinfo -v", f"{res['ibv_devinfo_v_s']:.2f} s  "
             f"(afddiag process is {res['ibv_devinfo_v_s'] / res['afddiag_fabric_process_s']:.2f}x of it)"),
            ("rdma link show", f"{res['rdma_link_show_s']:.2f} s"),
            ("QP probe per device (toward the peer)",
             ", ".join(f"{d} {ms:.0f} ms ({res['qp_reached'][d]})" for d, ms in res["qp_probe_per_device_ms"].items())),
        ]
    text = "\n".join(f"{a:<52} {b}" for a, b in rows) or "\n".join(res["errors"])
    with open(os.path.join(outdir, "bench.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)
    print(text, file=sys.stderr)
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
