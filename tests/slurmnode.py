"""afddiag as a node of the test Slurm cluster (tests/test_slurm_cluster.py) runs it: the real CLI with the
node's host replaced by a recorded case, the only seam being the command's inputs (as ``slurm_node`` in
tests/test_slurm.py). The HealthCheckProgram and Prolog of that cluster run it as ``$AFDDIAG``, so
``preflight --drain --resume`` really calls sinfo and scontrol against the cluster's slurmctld.

    python tests/slurmnode.py ARGV...    (ARGV as afddiag's)

``$AFDDIAG_NODE_CASE`` names a file holding "SNAPSHOT FABRIC_IP [BOUND_S]" (one line): the snapshot
folder this node is now and its fabric address (BOUND_S is the hook's). The test rewrites that file to
put a fault in and take it out. SNAPSHOT ``hang`` is a run that never finishes (it sleeps 600 s).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from afddiag.cli import run
from afddiag.commands import options, preflight


def main(argv: list[str]) -> int:
    snapshot, fabric_ip = Path(os.environ["AFDDIAG_NODE_CASE"]).read_text().split()[:2]
    if snapshot == "hang":
        time.sleep(600)
    real = options.inputs_from

    def as_this_node(**flags):
        flags.update(snapshot=snapshot, fabric_ip=fabric_ip)
        return real(**flags)

    preflight.inputs_from = as_this_node  # type: ignore[assignment]  # the command's one read of its inputs
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
