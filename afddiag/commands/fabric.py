"""``afddiag fabric`` (click command): the fabric gates, or the pair test (:mod:`afddiag.pairtest`),
or the GID table (:func:`afddiag.devicemap.gid_table`)."""

from __future__ import annotations

import json

import click

from afddiag import devicemap as dmlib
from afddiag.commands.check import run_check
from afddiag.commands.devicemap import show_gids
from afddiag.commands.options import (
    common,
    fabric_opts,
    inputs_from,
    launch_opts,
    output_format,
    table_view,
    usage_errors,
)
from afddiag.pairtest import PairResult, bandwidth_spec, pair_test, peer_and_key
from afddiag.probes.pair import format_pair
from afddiag.render import DEFAULT_VIEW, View
from afddiag.report import write_table


def show_pair(result: PairResult, as_json: bool, view: View = DEFAULT_VIEW) -> int:
    """The pair test's text (or JSON); a bandwidth run's report follows its facts."""
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, default=str))
    else:
        click.echo(format_pair(result.facts))
        if result.report is not None:
            write_table(result.report, view=view)
    return result.code


@click.command()
@common
@fabric_opts
@launch_opts
@click.option("--serve", is_flag=True, help="Pair test, server side: serve one pair session on --port to the client "
              "named by --peer (its fabric IP), then exit; any other connection is refused, listed in the result, "
              "and the server keeps listening.")
@click.option("--pair", "pair_target", metavar="HOST[:PORT]",
              help="Pair test, client side: RC QPs to a `--serve` host, RDMA SEND and WRITE from 64 B past the path "
                   "MTU; prints latency (µs) and bandwidth (GB/s).")
@click.option("--port", "pair_port", type=click.IntRange(1, 65535), default=18515, show_default=True,
              help="TCP port of the pair test's handshake.")
@click.option("--pair-timeout", type=click.FloatRange(1, 3600), default=60.0, show_default=True,
              help="Time bound of the pair session (and of --serve's wait for a client), seconds.")
@click.option("--pair-key", "pair_key_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Pair test on a shared fabric: a key both hosts hold (at least 16 bytes; a regular file owned by "
              "root or you, mode 0600) for an HMAC-SHA256 challenge-response each way; give the same file to "
              "--serve and --pair.")
@click.option("--bandwidth", "bw_seconds", type=click.FloatRange(0.5, 600), is_flag=False, flag_value=5.0, default=None,
              metavar="[SECONDS]", help="With --pair: the bandwidth run instead of the short phases: RDMA WRITEs kept "
              "queued on several RC QPs for SECONDS (default 5) over this rail, judged in Gb/s (1e9 bits/s of payload) "
              "against the role's [fabric] rail bands, with both ports' error counters around it. One rail per "
              "session: --fabric-ip picks it (run once per rail).")
@click.option("--bw-size", type=click.IntRange(4096, 64 << 20), default=1 << 20, show_default=True,
              help="Bandwidth run: bytes per RDMA WRITE.")
@click.option("--bw-qps", type=click.IntRange(1, 64), default=4, show_default=True, help="Bandwidth run: RC QPs.")
@click.option("--bw-depth", type=click.IntRange(1, 256), default=8, show_default=True,
              help="Bandwidth run: RDMA WRITEs kept outstanding per QP.")
@click.option("--gids", is_flag=True, help="Print the GID table instead (show_gids: DEV PORT INDEX GID IPv4 VER "
              "NETDEV, enumeration order, marking the device the engine opens and the fabric IP's GID); no gates.")
def fabric(serve, pair_target, pair_port, pair_timeout, pair_key_path, bw_seconds, bw_size, bw_qps, bw_depth, gids,
           **kw) -> int:
    """RDMA devices, GIDs, the device the engine opens, and a QP walk to RTR.

    With --serve / --pair HOST[:PORT]: the host-to-host pair test instead (exit 0 when every phase
    moved and verified its bytes, 2 otherwise). With --pair HOST --bandwidth [SECONDS]: one rail's
    bandwidth run, judged (fabric.rail-bandwidth, fabric.port-counters with the link gates; exit code
    as for `fabric`). With --gids: the GID table alone.
    """
    words = {k: kw.get(k) for k in ("timeout_s", "fabric_ip", "role", "playbook_path", "launch_env_path")}
    if gids:
        if serve or pair_target:
            raise click.UsageError("--gids prints the GID table; give it without --serve/--pair")
        if kw.get("as_json") or kw.get("fmt") not in (None, "table") or kw.get("output"):
            raise click.UsageError("--gids prints a table on stdout; for CSV use `afddiag devicemap --format csv`, "
                                   "for JSON the report's facts.fabric (`afddiag fabric --json`)")
        inputs = inputs_from(snapshot=kw.get("snapshot"), no_qp=True, **words)
        with usage_errors():
            return show_gids(dmlib.gid_table(inputs))
    fmt = output_format(kw.get("as_json", False), kw.get("fmt"))
    view = table_view(fmt, kw.pop("all_rows", False), kw.pop("quiet", False))
    if not (serve or pair_target or bw_seconds is not None):
        if pair_key_path:
            raise click.UsageError("--pair-key is for the pair test: give it with --serve or --pair")
        return run_check("fabric", all_rows=view.all_rows, quiet=view.quiet, **kw)
    with usage_errors():
        bw = (bandwidth_spec(bw_seconds, bw_size, bw_qps, bw_depth, pair_timeout, pair_target)
              if bw_seconds is not None else None)
        peer, key = peer_and_key(serve, kw.get("peers") or (), pair_key_path)
    inputs = inputs_from(no_qp=True, **words)
    with usage_errors():
        result = pair_test(inputs, serve, pair_target, pair_port, pair_timeout, bw, peer, key)
    return show_pair(result, fmt == "json", view)
