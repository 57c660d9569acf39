"""``afddiag fleet`` and ``afddiag merge`` (click commands): options, usage errors and output;
:mod:`afddiag.fleet` reads the inventory, collects over SSH and judges."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import click

from afddiag import __version__
from afddiag.atomic import output_error
from afddiag.fleet import (
    MAX_OUTPUT_MIB,
    HostResult,
    InventoryError,
    Progress,
    SshOptions,
    SshSetupError,
    build_zipapp,
    check_identity,
    collect,
    judge,
    load_inventory,
    load_reports,
    select_hosts,
    write_fleet_json,
    write_fleet_table,
)
from afddiag.fleet.rails import format_plan, plan_inventory
from afddiag.html import write_page
from afddiag.reader import InputError
from afddiag.termsafe import clean, line


def _emit(fr: dict[str, Any], as_json: bool, hosts: list[HostResult] | None = None,
          html_path: str | None = None) -> int:
    """Print the fleet report (JSON or table) and, with ``html_path``, write the fleet page there."""
    if html_path:

        try:
            write_page(html_path, fr, {h.name: h.report for h in hosts or [] if h.ok and h.report})
        except OSError as e:
            raise click.UsageError(output_error(f"--html {html_path}", e)) from e
        click.echo(f"afddiag: fleet page written to {html_path}", err=True)
    if as_json:
        write_fleet_json(fr, sys.stdout)
    else:
        write_fleet_table(fr)
    return fr["exit_code"]


def _rail_plan(inv: Any, rails: bool, plan_only: bool, as_json: bool) -> int:
    """``--rails --plan``: print the rail plan (text or ``--json``) → exit 0."""
    if not (rails and plan_only):
        raise click.UsageError("--plan goes with --rails (fleet --rails --plan prints the rail schedule); running "
                               "the rail tests over the fleet is not built yet: run each round's pairs with "
                               "`afddiag fabric --serve` / `fabric --pair` as the plan lists them")
    try:
        p = plan_inventory(inv)
    except InventoryError as e:
        raise click.UsageError(str(e)) from e
    if as_json:
        json.dump(p.as_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        click.echo(clean(format_plan(p), keep_newlines=True))  # names and IPs are checked at load; cleaned all the same
    return 0


def _ssh_options(s: dict[str, Any], known_hosts: str | None, identity: str | None, concurrency: int | None,
                 timeout_s: float | None, connect_timeout_s: float | None) -> SshOptions:
    """The command line over the inventory's [fleet] settings; a missing known_hosts file or an identity
    that is not a regular file is a usage error (one line)."""
    opts = SshOptions(known_hosts=known_hosts or s.get("known_hosts"), identity=identity or s.get("identity"),
                      user=s.get("user"), concurrency=concurrency or int(s.get("concurrency", 16)),
                      timeout_s=timeout_s or float(s.get("timeout_s", 120)),
                      connect_timeout_s=connect_timeout_s or float(s.get("connect_timeout_s", 10)),
                      max_output_mib=int(s.get("max_output_mib", MAX_OUTPUT_MIB)))
    if opts.known_hosts and not os.path.isfile(os.path.expanduser(opts.known_hosts)):
        raise click.UsageError(f"known_hosts {opts.known_hosts}: no such file: give --known-hosts with the fleet's "
                               "host keys (afddiag always verifies them)")
    if opts.identity:
        try:
            check_identity(opts.identity)
        except SshSetupError as e:
            raise click.UsageError(str(e)) from e
    return opts


@contextlib.contextmanager
def _zipapp(push: bool) -> Iterator[str | None]:
    """--push: the zipapp of this afddiag, built in the user's cache (kept: the next run reuses the
    folder), or in a private temporary folder removed when the run ends; None without --push."""
    if not push:
        yield None
        return
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    try:
        built: str | None = build_zipapp(os.path.join(cache, "afddiag", f"afddiag-{__version__}.pyz"))
    except (OSError, ImportError):
        built = None
    if built:
        yield built
        return
    tmp = tempfile.mkdtemp(prefix="afddiag-")
    try:
        yield build_zipapp(os.path.join(tmp, f"afddiag-{__version__}.pyz"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@click.command()
@click.option("--inventory", "inventory_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The fleet's inventory (TOML: [fleet], [expect], [[host]]).")
@click.option("--json", "as_json", is_flag=True, help="Print the fleet report (with every host's report) on stdout.")
@click.option("--known-hosts", type=click.Path(dir_okay=False),
              help="The one known_hosts file host keys are checked against, whatever ~/.ssh/config says (default: "
                   "the inventory's, else ~/.ssh/known_hosts).")
@click.option("--identity", type=click.Path(),
              help="Client private key, a regular file (default: agent and ~/.ssh/id_*).")
@click.option("-w", "--nodes", "nodes", metavar="NODESET",
              help="Collect only these inventory hosts: a node set (spark[01-16],coord).")
@click.option("--concurrency", type=click.IntRange(1, 1024),
              help="Fan-out window: ssh processes at once (ClusterShell's fanout; default 16).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, 3600),
              help="Per-host time bound, seconds, connect to last byte (default 120).")
@click.option("--connect-timeout", "connect_timeout_s", type=click.FloatRange(0.5, 600),
              help="SSH connect bound (TCP and the SSH banner), seconds, rounded up to whole (default 10).")
@click.option("--push", is_flag=True, help="Copy a self-contained zipapp of this afddiag (scp; named by its "
              "sha256, checked before it runs) and run it (click, rich, pynvml vendored; the host needs python3 "
              "≥ 3.10, and python3-psutil/python3-pyverbs for the probes that use them).")
@click.option("--quiet", is_flag=True, help="No per-host progress on stderr.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False),
              help="Also write one self-contained HTML page (no network fetches): the diagnosis first, each gate's "
                   "verdict per host, hosts → HCAs → ports → IPs.")
@click.option("--rails", is_flag=True, help="The rail plan: pair tests over every rail of every host (the hosts' "
              "rails, [fleet] wiring and rail_pairs in the inventory). With --plan, print the schedule.")
@click.option("--plan", "plan_only", is_flag=True, help="With --rails: print the rounds of pair tests and stop "
              "(offline: no host is contacted).")
def fleet(inventory_path, as_json, known_hosts, identity, nodes, concurrency, timeout_s, connect_timeout_s, push,
          quiet, html_path, rails, plan_only) -> int:
    """Run `afddiag all --json` on every host of the inventory over SSH, then the cross-host gates.

    An unreachable, timed-out or failing host is an ERROR row for that host; the others go on.
    Exit codes: 2 any FAIL, 3 any ERROR (a host without a report), 1 any WARN, 0 clean.
    """
    try:
        inv = load_inventory(inventory_path)
    except InventoryError as e:
        raise click.UsageError(str(e)) from e
    if plan_only or rails:
        return _rail_plan(inv, rails, plan_only, as_json)
    if nodes:
        try:
            inv = select_hosts(inv, nodes)
        except InventoryError as e:
            raise click.UsageError(str(e)) from e
    try:
        import ClusterShell.Task  # noqa: F401
    except ImportError:
        raise click.UsageError("afddiag fleet needs ClusterShell on this machine (pip install ClusterShell, or "
                               "python3-clustershell); or collect the reports another way and use `afddiag merge`"
                               ) from None
    opts = _ssh_options(inv.settings, known_hosts, identity, concurrency, timeout_s, connect_timeout_s)
    with _zipapp(push) as zipapp:
        opts.push = zipapp
        try:
            hosts = collect(inv, opts, Progress(quiet=quiet))
        except SshSetupError as e:
            raise click.UsageError(str(e)) from e
    fr = judge(hosts, inv.expect, source=f"fleet {inventory_path}", keep_reports=as_json)
    return _emit(fr, as_json, hosts, html_path)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, readable=True))
@click.option("--json", "as_json", is_flag=True, help="Print the fleet report on stdout.")
@click.option("--inventory", "inventory_path", type=click.Path(exists=True, dir_okay=False),
              help="Take [expect] and each host's role and fabric IP (matched by name) from this inventory.")
@click.option("--expect-capacity", type=click.IntRange(1, 1 << 20), help="Fleet-wide capacity flag.")
@click.option("--expect-gid-index", type=click.IntRange(0, 1 << 16), help="The GID index a stack forces.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False),
              help="Also write one self-contained HTML page (no network fetches): the diagnosis first, each gate's "
                   "verdict per host, hosts → HCAs → ports → IPs (holds every report in memory).")
@click.option("--full-reports", is_flag=True, help="With --json: embed every host's whole report under `reports` "
              "(default: each host's row carries its per-host summary; the reports are not kept).")
def merge(files, as_json, inventory_path, expect_capacity, expect_gid_index, html_path, full_reports) -> int:
    """Run the cross-host gates over per-host `afddiag all --json` reports collected by anything
    (Slurm srun, Ansible, pdsh, clush). A FILE holds one report, a JSON array of them, or JSON lines.

    Each report is checked, then reduced to its per-host summary as it is read (whole reports are
    kept only for --full-reports and --html). Exit codes as `afddiag fleet`.
    """
    notes: list[str] = []
    try:
        hosts = load_reports(list(files), notes, keep_reports=full_reports or bool(html_path))
    except InputError as e:
        raise click.UsageError(f"merge input {e}") from e

    for n in notes:  # a duplicate input is not a second host: say so, judge it once (its host name is data)
        click.echo(line(f"afddiag merge: {n}"), err=True)
    expect: dict[str, Any] = {}
    if inventory_path:
        try:
            inv = load_inventory(inventory_path)
        except InventoryError as e:
            raise click.UsageError(str(e)) from e
        expect.update(inv.expect)
        by_name = {h.name: h for h in inv.hosts}
        for h in hosts:
            ih = by_name.get(h.name)
            if ih:
                h.role, h.fabric_ip = ih.role, ih.fabric_ip
    if expect_capacity is not None:
        expect["capacity"] = expect_capacity
    if expect_gid_index is not None:
        expect["gid_index"] = expect_gid_index
    fr = judge(hosts, expect, source=f"merge of {len(files)} file(s)", keep_reports=full_reports and as_json)
    return _emit(fr, as_json, hosts, html_path)
