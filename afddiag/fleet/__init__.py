"""``afddiag fleet`` (collect every host's report over SSH) and ``afddiag merge`` (reports collected
by any other engine), then the cross-host gates (:mod:`afddiag.gates.fleet`) and one fleet table.

Both commands share everything after collection: :func:`judge` turns a list of
:class:`~afddiag.gates.fleet.HostResult` into the fleet report, :func:`write_fleet_table`
(:mod:`afddiag.fleet.table`) renders it.

The package, along its seams (every public name is re-exported here, ``from afddiag.fleet import X``):

- :mod:`afddiag.fleet.inventory`: the inventory TOML (``[fleet]``, ``[expect]``, ``[[host]]``; its
  docstring is the format's reference), loaded and checked key by key, and each host's arguments;
- :mod:`afddiag.fleet.ssh`: collection over SSH (OpenSSH fanned out by ClusterShell), progress, and the
  ``--push`` zipapp;
- :mod:`afddiag.fleet.judge`: per-host reports read (``merge``), the fleet gates run, the fleet
  report built and rendered as the fleet table.
"""

from __future__ import annotations

from afddiag.fleet.inventory import (
                                     PEER_POLICIES,
                                     Inventory,
                                     InventoryError,
                                     InvHost,
                                     load_inventory,
                                     parse_target,
                                     peers_for,
                                     remote_args,
                                     select_hosts,
)
from afddiag.fleet.judge import (
                                     FLEET_SCHEMA,
                                     FLEET_SCHEMA_VERSION,
                                     MAX_MERGE_FILE_BYTES,
                                     judge,
                                     load_reports,
                                     parse_report,
                                     write_fleet_json,
)
from afddiag.fleet.ssh import (
                                     MAX_OUTPUT_MIB,
                                     VENDORED,
                                     Progress,
                                     SshOptions,
                                     SshSetupError,
                                     build_zipapp,
                                     check_identity,
                                     collect,
)
from afddiag.fleet.table import write_fleet_table
from afddiag.gates.fleet import HostResult
from afddiag.verdict import Verdict

__all__ = ["HostResult", "Inventory", "InventoryError", "SshOptions", "Verdict", "build_zipapp", "collect",
           "judge", "load_inventory", "load_reports", "parse_report", "write_fleet_json", "write_fleet_table",
           "FLEET_SCHEMA", "FLEET_SCHEMA_VERSION", "MAX_MERGE_FILE_BYTES", "MAX_OUTPUT_MIB", "PEER_POLICIES",
           "VENDORED",
           "InvHost", "Progress", "SshSetupError", "check_identity", "parse_target", "peers_for", "remote_args",
           "select_hosts"]
