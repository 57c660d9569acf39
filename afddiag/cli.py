"""Command line: ``afddiag fabric|gpu|all|devicemap|catalog``.

click parses; :func:`diagnose` gathers facts and runs gates; a reporter renders; the command
returns the exit code (2 FAIL, 3 ERROR, 1 WARN, 0 clean, 64 usage error).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from afddiag import __version__, termsafe
from afddiag.exitcodes import EXIT_ABORT, EXIT_ERROR, EXIT_SIGPIPE, EXIT_USAGE, CatalogError, help_text

if TYPE_CHECKING:
    from afddiag.model.run import Inputs

# Everything else is imported where it is used: `afddiag --version` and `--help` load click alone.

FAMILIES = {"fabric": {"fabric"}, "gpu": {"gpu"}, "all": {"fabric", "gpu", "host", "launch"},
            "preflight": {"fabric", "gpu", "host", "launch"}}


def _ipv4(ctx, param, value):
    vals = value if isinstance(value, tuple) else ((value,) if value else ())
    for v in vals:
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise click.BadParameter(f"{v!r} is not an IPv4 address (give the dotted form, e.g. 10.9.0.2)") from None
    return value


def diagnose(inputs: Inputs, families: set[str]) -> dict:
    """The JSON report of :func:`afddiag.runner.diagnose` for the gates of ``families``.

    Raises :class:`~afddiag.collect.SnapshotError` when ``inputs.snapshot`` is not a directory.
    """
    return diagnose_full(inputs, families)[0]


def diagnose_full(inputs: Inputs, families: set[str]):
    """:func:`afddiag.runner.diagnose` for ``families`` → ``(report, observation)``."""
    import dataclasses

    from afddiag import runner

    return runner.diagnose(dataclasses.replace(inputs, families=frozenset(families)))


def common(f):
    f = click.option("--snapshot", type=click.Path(), help="Read a snapshot directory (or an `afddiag capture` "
                     "bundle, FILE.tar.gz) instead of this host.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print the JSON report alone on stdout.")(f)
    f = click.option("--format", "fmt", type=click.Choice(["table", "json", "prometheus"]), default=None,
                     help="table (default), json (= --json), or prometheus (node_exporter textfile collector).")(f)
    f = click.option("--output", "output", type=click.Path(dir_okay=False),
                     help="Write the report to FILE (atomically: temp file + rename) instead of stdout.")(f)
    f = click.option("--no-history", is_flag=True, help="Do not append this run to the local history store.")(f)
    f = click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=None,
                     help="Time bound of each probe, seconds (default: the playbook's [timeouts], 10 s); a probe "
                     "past it gives ERROR for its own gates.")(f)
    return f


def fabric_opts(f):
    f = click.option("--fabric-ip", callback=_ipv4, help="The launcher's fabric IPv4 address.")(f)
    f = click.option("--peer", "peers", multiple=True, callback=_ipv4,
                     help="A peer's fabric IPv4 address to aim the QP test at (repeatable); with `fabric --serve`: "
                     "the one client the pair server accepts.")(f)
    f = click.option("--no-qp", is_flag=True, help="Skip the QP walk (fabric.qp-rtr says SKIP).")(f)
    f = click.option("--qp-timeout", type=click.FloatRange(0.1, 120), default=None,
                     help="Time bound of one device's QP walk, seconds (default: the playbook's qp_s, 5 s).")(f)
    return f


def gpu_opts(f):
    f = click.option("--expect-sm", type=click.IntRange(1, 100000),
                     help="SM count the image's kernels were exported for.")(f)
    f = click.option("--load", is_flag=True, help="Run the GPU load probe (FP32, BF16, GEMV, copy; ~3 s a GPU) "
                     "for gpu.slow-state (the expert playbook turns it on).")(f)
    f = click.option("--no-load", is_flag=True, help="No load probe, even where the playbook asks for it (a node "
                     "running jobs: the slurm health check passes it on allocated nodes).")(f)
    f = click.option("--baseline", "baseline_path", type=click.Path(exists=True, dir_okay=False),
                     help="Baseline file (default: the user's state directory).")(f)
    f = click.option("--xid-log", type=click.Path(dir_okay=False, exists=True),
                     help="A saved kernel log (dmesg, journalctl -k) to read Xid events from instead of /dev/kmsg.")(f)
    return f


def launch_opts(f):
    f = click.option("--role", help="Role playbook: coordinator, expert, generic, or a site's "
                     "(default: AFD_ROLE from --launch-env, else generic).")(f)
    f = click.option("--playbook", "playbook_path", type=click.Path(dir_okay=False),
                     help="A playbook file instead of a role name.")(f)
    f = click.option("--launch-env", "launch_env_path", type=click.Path(dir_okay=False),
                     help="The launcher's KEY=VALUE env file (AFD_FABRIC_IP, capacities, AFD_IMAGE, the map).")(f)
    f = click.option("--expect-capacity", type=click.IntRange(1, 1 << 20),
                     help="The other side's capacity flag (ranks' for a coordinator, coordinator's for a rank).")(f)
    return f


def make_inputs(snapshot=None, timeout_s=None, fabric_ip=None, peers=(), no_qp=False, qp_timeout=None,
                expect_sm=None, role=None, playbook_path=None, launch_env_path=None, expect_capacity=None,
                load=False, baseline_path=None, xid_log=None, no_load=False) -> Inputs:
    """Flags → :class:`Inputs`; a bad launch env or playbook is a usage error naming the file and line."""
    from afddiag import playbook as pbmod
    from afddiag.envvars import LaunchEnvError, parse_launch_env
    from afddiag.model.run import Inputs

    launch_env = None
    pb = None
    try:
        if playbook_path or role:
            pb = pbmod.load(role, playbook_path)
        if launch_env_path:
            from afddiag.reader import InputError, read_text

            try:
                text = read_text(launch_env_path)  # bounded: 1 MiB, a regular file, strict UTF-8
            except InputError as e:
                raise click.UsageError(f"launch env {e}: give the launcher's KEY=VALUE env file") from e
            except OSError as e:
                raise click.UsageError(f"launch env {launch_env_path}: {e.strerror}: give the launcher's env file") from e
            launch_env = parse_launch_env(text, launch_env_path, pb.aliases if pb else None)
            if pb is not None and launch_env.get("AFD_ROLE") and launch_env["AFD_ROLE"] != pb.name:
                click.echo(f"afddiag: judging as role {pb.name} (--role/--playbook), although {launch_env_path} "
                           f"says AFD_ROLE={launch_env['AFD_ROLE']}", err=True)
            if pb is None and launch_env.get("AFD_ROLE"):
                pb = pbmod.load(launch_env["AFD_ROLE"])
                if pb.aliases:  # the role's aliases apply to the file that named it
                    launch_env = parse_launch_env(text, launch_env_path, pb.aliases)
    except (LaunchEnvError, pbmod.PlaybookError) as e:
        raise click.UsageError(str(e)) from e
    if no_load:
        if load:
            raise click.UsageError("--load and --no-load: give one of them")
        if pb is not None and pb.load_probe:
            import dataclasses

            pb = dataclasses.replace(pb, load_probe=False)
    inputs = Inputs(fabric_ip=fabric_ip, peers=list(peers), expect_sm=expect_sm, snapshot=snapshot,
                    probe_timeout_s=timeout_s, qp_timeout_s=qp_timeout, run_qp=not no_qp, launch_env=launch_env,
                    launch_env_path=launch_env_path, expect_capacity=expect_capacity, playbook=pb, load=load,
                    baseline_path=baseline_path, xid_log=xid_log)
    from afddiag.probes.reach import bounds_problem, parse_ports

    ports = parse_ports((launch_env or {}).get("AFD_ENGINE_PORTS", "")) or list(pb.engine_ports if pb else [])
    if not snapshot and (why := bounds_problem(inputs.peers, ports)):  # the control-plane probe's bound
        raise click.UsageError(why)
    return inputs


def _diagnose(cmd: str, inputs: Inputs):
    from afddiag.collect import SnapshotError
    from afddiag.progress import stop as stop_progress
    from afddiag.reader import InputError

    try:
        return diagnose_full(inputs, FAMILIES[cmd])
    except (SnapshotError, InputError) as e:  # a file the user named (snapshot, --baseline) refused
        raise click.UsageError(str(e)) from e
    finally:
        stop_progress()  # the report follows: no bar (one a timed-out probe left open) is drawn over it


def output_format(as_json: bool, fmt: str | None) -> str:
    """``--json`` and ``--format`` → one format; a usage error when they disagree (``--json --format
    prometheus``)."""
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json and --format {fmt} ask for two outputs: give one of them")
    return fmt or ("json" if as_json else "table")


def need_prometheus() -> None:
    """A usage error, before any probing, when prometheus_client cannot be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as e:
        raise click.UsageError(f"--format prometheus needs prometheus_client ({e}): pip install prometheus-client, "
                               "or apt install python3-prometheus-client") from e


def _gather_fabric(inputs: Inputs):
    """Fabric facts only (no QP walk), live or from ``inputs.snapshot`` (a folder or a bundle)."""
    import dataclasses

    from afddiag import runner
    from afddiag.collect import SnapshotError

    inputs = dataclasses.replace(inputs, run_qp=False, families=frozenset({"fabric"}))
    try:  # a folder, or a capture bundle extracted safely
        return runner.observe(inputs, only={"host", "env", "fabric"})
    except SnapshotError as e:
        raise click.UsageError(str(e)) from e


def _gids(inputs: Inputs, fmt: str, obs=None) -> int:
    """The GID table (``table`` or ``csv``) of this host or the snapshot; exit 2 without devices."""
    from afddiag.endpoint import no_map_reason, resolve_fabric_ip
    from afddiag.gates.fabric import engine_device_for
    from afddiag.gidtable import gid_rows, legend, write_gid_table
    from afddiag.render import terminal_width

    obs = obs or _gather_fabric(inputs)
    if obs.fabric and obs.fabric.failed:
        click.echo(termsafe.line(f"afddiag: {obs.fabric.failed}"), err=True)
        return 3
    if not (obs.fabric and obs.fabric.devices):
        click.echo(termsafe.line(f"afddiag: {no_map_reason(obs.fabric)}"), err=True)
        return 2
    fip = resolve_fabric_ip(obs.fabric, inputs.fabric_ip).ip
    dev, how = engine_device_for(obs.fabric, obs.env, fip)
    rows = gid_rows(obs.fabric, dev, fip)
    width = terminal_width() if fmt == "table" else None  # a terminal narrower than the table: the narrow layout
    write_gid_table(rows, legend(rows, dev, how, fip) if fmt == "table" else [], fmt, width=width)
    return 0


def _run(cmd: str, as_json, fmt=None, output=None, no_history=False, **kw) -> int:
    from afddiag import report
    from afddiag.history import record_run

    fmt = output_format(as_json, fmt)
    if fmt == "prometheus":
        need_prometheus()
    inputs = make_inputs(**kw)
    if "gpu" in FAMILIES[cmd] and not kw.get("snapshot"):
        import dataclasses

        from afddiag.probes.gpu import cuda_reason, preinit_cuda

        if cuda_reason(dataclasses.replace(inputs, families=frozenset(FAMILIES[cmd]))):
            preinit_cuda()  # the CUDA driver initialises while the rest of the pipeline is imported
    rep, _ = _diagnose(cmd, inputs)
    record_run(rep, cmd, enabled=not no_history, busy_s=kw.get("timeout_s"))
    if output or fmt == "prometheus":
        from afddiag.prometheus import write_report

        try:
            write_report(rep, fmt, output, cmd)
        except OSError as e:
            from afddiag.atomic import output_error

            raise click.UsageError(output_error(f"--output {output}", e)) from e
    elif fmt == "json":
        report.write_json(rep)
    else:
        report.write_table(rep)
    return rep["exit_code"]


# Commands that live in their own modules, imported only when named (start-up stays cheap).
LAZY_COMMANDS = {
    "fleet": "afddiag.commands.fleet:fleet",
    "merge": "afddiag.commands.fleet:merge",
    "capture": "afddiag.commands.capture:capture",
    "history": "afddiag.commands.history:history",
}


class PipeClosed(Exception):
    """stdout's reader went away (EPIPE). Not an OSError, so click's own handler (exit 1) lets it pass."""


class LazyGroup(click.Group):
    """A click group whose extra commands are imported on first use (click's lazy-loading pattern)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError as e:
            raise PipeClosed() from e

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | {n for n in LAZY_COMMANDS if self._load(n)})

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name) or self._load(name)
        if cmd is None and name in LAZY_COMMANDS:
            why = self._why.get(name, "")
            raise click.UsageError(f"'{name}' is not available: {why} (pip install 'afddiag' with its dependencies)")
        return cmd

    _why: dict[str, str] = {}

    @classmethod
    def _load(cls, name):
        import importlib

        target = LAZY_COMMANDS.get(name)
        if not target:
            return None
        mod, _, attr = target.partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            cls._why[name] = str(e)
            return None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             help="Bring-up diagnostics for an attention-FFN-disaggregated fleet: RoCE v2 fabric and GPUs.\n\n"
             + help_text())
@click.version_option(__version__, prog_name="afddiag")
def cli() -> None:
    """The command group; its help (with every exit code, :mod:`afddiag.exitcodes`) is set above."""


@cli.command()
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
    if gids:
        if serve or pair_target:
            raise click.UsageError("--gids prints the GID table; give it without --serve/--pair")
        if kw.get("as_json") or kw.get("fmt") not in (None, "table") or kw.get("output"):
            raise click.UsageError("--gids prints a table on stdout; for CSV use `afddiag devicemap --format csv`, "
                                   "for JSON the report's facts.fabric (`afddiag fabric --json`)")
        inputs = make_inputs(snapshot=kw.get("snapshot"), timeout_s=kw.get("timeout_s"),
                             fabric_ip=kw.get("fabric_ip"), no_qp=True, role=kw.get("role"),
                             playbook_path=kw.get("playbook_path"), launch_env_path=kw.get("launch_env_path"))
        return _gids(inputs, "table")
    output_format(kw.get("as_json"), kw.get("fmt"))
    bw = None
    if bw_seconds is not None:
        if not pair_target:
            raise click.UsageError("--bandwidth runs on the client side: give --pair HOST (the peer runs `afddiag "
                                   "fabric --serve`, which serves whichever mode the client asks)")
        from afddiag.probes.pair import BandwidthSpec

        bw = BandwidthSpec(bw_seconds, bw_size, bw_qps, bw_depth)
        if (why := bw.problem()) is not None:
            raise click.UsageError(f"--bandwidth: {why}")
        if bw_seconds + 20 > pair_timeout:
            raise click.UsageError(f"--bandwidth {bw_seconds:g} s needs --pair-timeout of at least {bw_seconds + 20:g} s "
                                   f"(set up, run, drain, the peer's check); got {pair_timeout:g}")
    if serve or pair_target:
        return _pair(serve, pair_target, pair_port, pair_timeout, kw, bw, *_pair_peer(serve, kw, pair_key_path))
    if pair_key_path:
        raise click.UsageError("--pair-key is for the pair test: give it with --serve or --pair")
    return _run("fabric", **kw)


def _pair_peer(serve: bool, kw: dict, key_path: str | None) -> tuple[str | None, bytes | None]:
    """The pair test's peer rule from the options: ``(--peer for --serve, the pair key's bytes)``.
    --serve needs exactly one --peer (the client it accepts); a key file that is unsafe or too short is
    a usage error naming it."""
    peers = kw.get("peers") or ()
    if serve and len(peers) != 1:
        raise click.UsageError("--serve accepts one client: give its fabric IP as --peer (exactly one)" if peers else
                               "--serve needs --peer IP: the client's fabric IP (the server accepts that client only)")
    key = None
    if key_path:
        from afddiag.probes.pair import load_key

        try:
            key = load_key(key_path)
        except ValueError as e:
            raise click.UsageError(f"--pair-key {e}") from None
    return (peers[0] if serve else None), key


def _pair(serve: bool, target: str | None, port: int, timeout_s: float, kw: dict, bandwidth=None,
          peer: str | None = None, key: bytes | None = None) -> int:
    """The pair test's CLI: run one side, print text (or JSON with --json). The short phases: exit 0
    when every phase verified, 2 otherwise. A bandwidth run (client with --bandwidth, or a server whose
    client asked for one): its facts go through the registry's pair entry and are judged with the
    link gates (:data:`PAIR_GATES`); the report follows the facts (JSON: under ``report``), exit code
    as the report's (2 as well when an object was not destroyed)."""
    import json as _json

    from afddiag import runner
    from afddiag.model import to_jsonable
    from afddiag.model.run import Inputs
    from afddiag.probes import pair as pairmod

    if serve and target:
        raise click.UsageError("give --serve or --pair, not both")
    inputs = make_inputs(timeout_s=kw.get("timeout_s"), fabric_ip=kw.get("fabric_ip"), no_qp=True, role=kw.get("role"),
                         playbook_path=kw.get("playbook_path"), launch_env_path=kw.get("launch_env_path"))
    # --timeout bounds this fabric read too (rxe's 1024-slot GID tables under emulation outrun 10 s)
    fab = runner.observe(Inputs(run_qp=False, families=frozenset({"fabric"}), probe_timeout_s=kw.get("timeout_s")),
                         only={"fabric"}).fabric
    if serve:
        facts = pairmod.serve(port, fabric_ip=inputs.fabric_ip, timeout_s=timeout_s, fabric=fab, peer=peer or "",
                              key=key)
    else:
        try:
            host, port = pairmod.parse_hostport(target, port)
        except ValueError as e:
            raise click.UsageError(f"--pair {e}") from e
        facts = pairmod.pair(host, port, fabric_ip=inputs.fabric_ip, timeout_s=timeout_s, fabric=fab,
                             bandwidth=bandwidth, key=key)
    as_json = kw.get("as_json") or kw.get("fmt") == "json"
    if facts.bandwidth is None:
        if as_json:
            click.echo(_json.dumps(to_jsonable(facts), indent=2))
        else:
            click.echo(pairmod.format_pair(facts))
        ok = facts.error is None and facts.destroyed and all(p.verified for p in facts.phases)
        return 0 if ok else 2
    rep = judge_pair(inputs, fab, to_jsonable(facts))
    if as_json:
        click.echo(_json.dumps({**to_jsonable(facts), "report": rep}, indent=2, default=str))
    else:
        from afddiag import report

        click.echo(pairmod.format_pair(facts))
        report.write_table(rep)
    return rep["exit_code"] if facts.destroyed else 2


#: What a bandwidth run is judged by: the rail's link, its speed and MTU, the run, the counters.
PAIR_GATES = ("fabric.link", "fabric.mtu", "fabric.link-speed", "fabric.rail-bandwidth", "fabric.port-counters")


def judge_pair(inputs: Inputs, fabric, pair_json: dict) -> dict:
    """The JSON report of one side's bandwidth run: ``pair_json`` (the pair test's JSON) read through
    the probe registry's pair entry (as a replay of a saved one is), this host's fabric facts, and the
    gates of :data:`PAIR_GATES` the role runs, on the rail the pair test used."""
    import dataclasses

    from afddiag import runner
    from afddiag.playbook import Playbook
    from afddiag.probes.registry import Sources

    pb = inputs.playbook or Playbook()
    pb = dataclasses.replace(pb, gates=[g for g in PAIR_GATES if pb.runs(g)])
    inp = dataclasses.replace(inputs, families=frozenset({"fabric"}), playbook=pb, run_qp=False,
                              fabric_ip=pair_json.get("fabric_ip") or inputs.fabric_ip)
    obs = runner.gather(inp, host=Sources(pair=lambda: pair_json), only={"pair"})
    obs.fabric = fabric
    return runner.judge(inp, obs)


@cli.command()
@common
@gpu_opts
@launch_opts
def gpu(**kw) -> int:
    """GPUs through NVML and the CUDA driver: SM count, memory, clocks event reasons, slow state."""
    return _run("gpu", **kw)


@cli.command(name="all")
@common
@fabric_opts
@gpu_opts
@launch_opts
def all_(**kw) -> int:
    """Every gate of the role: fabric, GPU and launch."""
    return _run("all", **kw)


@cli.command()
@click.option("--snapshot", type=click.Path(), help="Read a snapshot directory (or a capture bundle) instead of this host.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0.1, 600), default=None,
              help="Time bound of each probe, seconds (default: the playbook's [timeouts]).")
@click.option("--drain", is_flag=True, help="When not fit, drain this Slurm node: `scontrol update nodename=<node> "
              "state=drain reason=\"afddiag: <gates>\"` (for HealthCheckProgram; $AFDDIAG_SCONTROL overrides scontrol); "
              "a drain someone else set is never overwritten.")
@click.option("--resume", is_flag=True, help="When fit, resume this Slurm node if afddiag drained it (its reason "
              "starts with 'afddiag:'); any other drain stays.")
@click.option("--prom", "prom_path", type=click.Path(dir_okay=False),
              help="Also write this run's metrics for node_exporter's textfile collector to FILE (atomically).")
@click.option("--no-history", is_flag=True, help="Do not append this run to the local history store.")
@fabric_opts
@gpu_opts
@launch_opts
@click.option("--strict", is_flag=True, help="WARN fails the preflight too (exit 1).")
@click.option("--exit-for", "exit_for", type=click.Choice(["any", "drain"]), default="any", show_default=True,
              help="drain: exit non-zero only when a fault's action needs the node drained (RESET_GPU, REBOOT, "
                   "AC_POWER_CYCLE, HW_INSPECTION, FIX_LINK, ...), for a Slurm Prolog, whose failure drains the node.")
@click.option("--export", "export", is_flag=True,
              help="Print the lines the launcher evaluates (device map, NCCL_IB_HCA, NCCL_IB_GID_INDEX, "
                   "UCX_NET_DEVICES, MC_GID_INDEX) on stdout, and judge the launch as it will be with them (a fault "
                   "they fix, such as no device map, no longer stops the launch; any other still does); one the "
                   "launch env already sets is kept, not printed, unless fabric.devicemap-env FAILed on that variable (named on stderr). NCCL_IB_GID_INDEX printed is always the index "
                   "of the NCCL_IB_HCA in effect (kept or printed); when none suits it, it is left out and stderr says why.")
def preflight(strict, exit_for, export, drain, resume, prom_path, no_history, **kw) -> int:
    """Launch hook: run the role's gates; one line on success, the failing gates otherwise.

    Exit codes as `afddiag all`, except that WARN exits 0 unless --strict. With --drain a host that
    is not fit also drains its Slurm node (Slurm ignores a HealthCheckProgram's exit code), only when
    a fault's typed action needs it (a launch-setting fix or a busy GPU never drains) and unless
    someone else drained it; with --resume the node is resumed when afddiag drained it and no fault
    left needs a drain (afddiag/slurm.py). --prom FILE writes the same run's metrics.
    """
    from afddiag import report
    from afddiag.history import record_run

    if (drain or resume) and kw.get("snapshot"):
        raise click.UsageError(f"--{'drain' if drain else 'resume'} acts on this Slurm node, and --snapshot judges "
                               "another host's data: give one of them")
    if prom_path:
        need_prometheus()
    from afddiag.render import action_tag
    from afddiag.termsafe import one_line

    inputs = make_inputs(**kw)
    rep, obs = _diagnose("preflight", inputs)
    ex = None
    if export:  # judge the launch as it will be: the launch env with the lines printed below laid over it
        import dataclasses

        from afddiag import runner

        rep, obs, ex = runner.judge_with_exports(
            dataclasses.replace(inputs, families=frozenset(FAMILIES["preflight"])), obs, rep)
        if ex["fixed"]:
            click.echo(f"afddiag preflight --export: judged with the lines it prints, which fix {', '.join(ex['fixed'])}",
                       err=True)
    # history keeps the report whose verdicts give the exit code (with --export: the launch as it will be)
    record_run(rep, "preflight", enabled=not no_history, busy_s=kw.get("timeout_s"))
    shown = one_line({"diagnosis": rep.get("diagnosis", []), "host": rep["host"], "gates": rep["gates"],
                      "role": rep["inputs"]["role"]})  # host and playbook text: escaped, one line each
    code = rep["exit_code"]
    if code == 1 and not strict:
        code = 0
    c = rep["counts"]
    role = shown["role"]
    if code == 0:
        warned = [g["id"] for g in shown["gates"] if g["verdict"] == "WARN"]
        line = (f"afddiag preflight: {role} on {shown['host']}: OK ({c['PASS']} pass, {c['WARN']} warn, "
                f"{c['SKIP']} skip)" + (f"; warn: {', '.join(warned)}" if warned else ""))
        click.echo(line, err=export)
        if resume:
            from afddiag.slurm import resume_node

            resume_node(timeout_s=kw.get("timeout_s") or 30.0)
    else:
        faults = [d for d in shown["diagnosis"] if d["verdict"] in ("FAIL", "ERROR")
                  or (strict and d["verdict"] == "WARN")]
        click.echo(f"afddiag preflight: {role} on {shown['host']}: NOT FIT (exit {code})", err=True)
        for d in faults:
            click.echo(f"  {d['verdict']} {d['gate']}: {d['summary']}", err=True)
            click.echo(f"       remedy: {d['remedy']} {action_tag(d)}", err=True)
            if d["explains"]:
                click.echo(f"       explains: {', '.join(d['explains'])}", err=True)
        needs = [d for d in faults if d.get("drain")]
        if drain and needs:
            from afddiag.slurm import drain_node

            drain_node([d["gate"] for d in needs], timeout_s=kw.get("timeout_s") or 30.0)
        elif drain:
            click.echo("afddiag preflight --drain: not drained: no fault's action needs the node drained ("
                       + ", ".join(sorted({d["action"] for d in faults})) + "): the remedies above need no person on the node",
                       err=True)
        if resume and not needs:  # what is left does not take the node out: an afddiag drain is lifted
            from afddiag.slurm import resume_node

            resume_node(timeout_s=kw.get("timeout_s") or 30.0)
        if exit_for == "drain" and not needs:
            code = 0
    if ex is not None and code == 0:
        pairs, kept, notes = ex["pairs"], ex["kept"], ex["notes"]
        if kept:
            click.echo(f"afddiag preflight --export: kept the launch env's {', '.join(kept)} "
                       f"({ex['env_source']}); printing only what it does not set"
                       + (f" or fabric.devicemap-env FAILed on ({', '.join(ex['replaced'])})" if ex.get("replaced")
                          else ""), err=True)
        for note in notes:
            click.echo(f"afddiag preflight --export: {note}", err=True)
        if pairs:
            click.echo(report.format_exports(pairs, "shell"))
    if prom_path:
        from afddiag.prometheus import write_report

        try:
            write_report(rep, "prometheus", prom_path, "preflight")
        except OSError as e:
            from afddiag.atomic import output_error

            raise click.UsageError(output_error(f"--prom {prom_path}", e)) from e
    return code


@cli.command()
@click.option("--snapshot", type=click.Path(), help="Read a snapshot directory (or a capture bundle) instead of this host.")
@click.option("--format", "fmt", type=click.Choice(["env", "shell", "json", "nccl", "table", "csv"]), default="env",
              show_default=True, help="nccl: NCCL_IB_HCA==dev:port and NCCL_IB_GID_INDEX for the fabric IP; table, "
              "csv: every GID (DEV PORT INDEX GID IPv4 VER NETDEV, show_gids order), marking the device the engine "
              "opens and the fabric IP's GID.")
@click.option("--fabric-ip", callback=_ipv4, help="The launcher's fabric IPv4 address (for --format nccl|table|csv).")
def devicemap(snapshot, fmt, fabric_ip) -> int:
    """Print DS41RT_PROTOCOL_V2_VERBS_HOST_DEVICE_MAP for this host (each IPv4 RoCE v2 GID's address → its device,
    whatever the link does: stderr names an entry whose port is down).

    Exits 2 with a message on stderr when no address qualifies (table/csv: when there is no RDMA device),
    naming why (no device, the address there only as RoCE v1, a GID type not read, no IPv4 GID); 64 when
    --format nccl is asked on a host with several fabric IPs and no --fabric-ip (the caller's choice).
    """
    from afddiag import endpoint, report
    from afddiag.endpoint import resolve_fabric_ip
    from afddiag.model.run import Inputs

    inputs = Inputs(snapshot=snapshot, fabric_ip=fabric_ip, run_qp=False)
    obs = _gather_fabric(inputs)
    if fmt in ("table", "csv"):
        return _gids(inputs, fmt, obs)
    dm = endpoint.device_map(obs.fabric)
    if not dm:
        click.echo(termsafe.line(f"afddiag devicemap: {endpoint.no_map_reason(obs.fabric)}"), err=True)
        return 2
    if fabric_ip and fabric_ip not in dm:
        # Every format: a map that lacks the launcher's own address is no answer for it.
        click.echo(termsafe.line(f"afddiag devicemap: {endpoint.no_map_reason(obs.fabric, fabric_ip)}"), err=True)
        return 2
    if fmt != "json":  # env, shell and nccl lines are sourced by a shell: a name that is no device name is refused
        bad = next((why for why in map(termsafe.device_name_problem, dm.values()) if why), None)
        if bad:
            click.echo(f"afddiag devicemap: {bad}; not printed for a shell (--format json shows it as data)", err=True)
            return 2
    for caveat in endpoint.devicemap_caveats(obs.fabric, dm):
        click.echo(termsafe.line(f"afddiag devicemap: {caveat}"), err=True)
    if fmt == "nccl":
        fip = resolve_fabric_ip(obs.fabric, fabric_ip)
        if fip.ip is None:  # the caller's to say, not the host's fault: a usage error (64), not FAIL (2)
            click.echo(f"afddiag devicemap: --format nccl on a host with several fabric IPs ({', '.join(sorted(dm))}): "
                       "give --fabric-ip with the one the launcher uses", err=True)
            return EXIT_USAGE
        pairs = [p for p in endpoint.launch_exports(obs.fabric, fip.ip) if p[0].startswith("NCCL_")]
        if not pairs:
            down = next((e for e in fip.candidates if e.ip == fip.ip), None)
            why = (f"{down.device} port {down.port} carries it, but that port is {down.port_state or 'in an unknown state'} "
                   "and NCCL uses only ACTIVE ports (`afddiag fabric` judges the link in fabric.link)" if down else
                   f"no IPv4 RoCE v2 GID on an ACTIVE port carries it: give --fabric-ip with one of {', '.join(sorted(dm))}")
            click.echo(termsafe.line(f"afddiag devicemap: fabric IP {fip.ip}: {why}"), err=True)
            return 2
        click.echo(report.format_exports(pairs, "env"))
        return 0
    click.echo(report.format_devicemap(dm, fmt))
    return 0


@cli.command()
@click.argument("which", type=click.Choice(["report", "fleet"]), default="report")
def schema(which) -> int:
    """Print the JSON Schema of `afddiag all --json` (report) or of `afddiag fleet|merge --json` (fleet)."""
    from importlib import resources

    click.echo(resources.files("afddiag.schema").joinpath(f"{which}.schema.json").read_text(encoding="utf-8"),
               nl=False)
    return 0


@cli.group()
def baseline() -> None:
    """Record or show this host's healthy load figures (gpu.slow-state and host.cpu-clock compare to them)."""


@baseline.command("record")
@click.option("--path", "baseline_path", type=click.Path(dir_okay=False), help="Where to write (default: state dir).")
@click.option("--budget", "budget_s", type=click.FloatRange(0.5, 60), default=3.0, show_default=True,
              help="Load probe time per GPU, seconds.")
@click.option("--force", is_flag=True, help="Record even when the figures are no healthy baseline (a GPU gate "
              "FAILs, the GPU is busy, a figure is below the reference floor); the record is marked forced.")
def baseline_record(baseline_path, budget_s, force) -> int:
    """Run the GPU load probe and the CPU loop on this (healthy) host and store the figures.

    Refuses (exit 2, saying why) when a GPU gate would FAIL on them, the GPU is busy with another job,
    no GPU gave figures, a figure is below the reference table's floor for the model, the CPU loop
    ran on a busy host (samples that lost their core or disagree) or the CPU clock is stuck low; --force
    records anyway and marks the record forced."""
    from afddiag import baseline as bl
    from afddiag import runner
    from afddiag.gates.refusals import cpu_refusals, gpu_refusals
    from afddiag.model.run import Inputs

    # the runner's GPU (with the load probe) and CPU probes, each under its time bound
    obs = runner.gather(Inputs(load=True, load_budget_s=budget_s, run_qp=False, families=frozenset({"gpu", "host"})),
                        only={"host", "gpu", "cpu"})
    cpu = obs.cpu or {}
    failed = [f for f in (obs.gpu.failed if obs.gpu else None, obs.gpu.load_failed if obs.gpu else None,
                          cpu.get("failed")) if f]
    if failed:
        click.echo(termsafe.line(f"afddiag baseline record: {'; '.join(failed)}: nothing recorded"), err=True)
        return 3
    readings = (obs.gpu.readings if obs.gpu else None) or {}
    cpu_fig = {k: cpu[k] for k in bl.CPU_FIGURES if cpu.get(k) is not None}
    cpu_refused = cpu_refusals(cpu)
    refused = gpu_refusals(readings) + cpu_refused
    if refused and not force:
        click.echo("afddiag baseline record: not recorded: these figures are no healthy baseline:", err=True)
        for why in refused:
            click.echo(termsafe.line(f"  - {why}"), err=True)
        click.echo("  fix that and record again, or give --force to record them anyway (marked forced)", err=True)
        return 2
    try:
        path = bl.record(readings, cpu_fig, obs.host, baseline_path, forced=refused if force else None,
                         cpu_forced=cpu_refused if force else None)
    except ValueError as e:
        click.echo(f"afddiag baseline record: {e}", err=True)
        return 2
    except OSError as e:
        from afddiag.atomic import output_error

        raise click.UsageError(output_error(f"baseline {baseline_path or bl.default_path()}", e)) from e
    data, _ = bl.load(path)
    click.echo(f"recorded {len(data['gpus'])} GPU(s) and the CPU in {path}"
               + (" (FORCED over: " + "; ".join(data.get("forced_over") or []) + ")" if data.get("forced") else ""))
    for uuid, g in data["gpus"].items():
        click.echo(termsafe.line(f"  {g.get('name')} {uuid}: " + ", ".join(f"{k}={v}" for k, v in g.items()
                                                                            if k != "name")))
    return 0


@baseline.command("show")
@click.option("--path", "baseline_path", type=click.Path(dir_okay=False),
              help="The baseline file to show (default: baseline.json in the state directory, $AFDDIAG_STATE_DIR).")
@click.option("--json", "as_json", is_flag=True, help="Print the baseline as JSON (stdout holds nothing else).")
def baseline_show(baseline_path, as_json) -> int:
    """Print the recorded baseline (exit 1 when none is recorded)."""
    import json as _json

    from afddiag import baseline as bl
    from afddiag.reader import InputError

    try:
        data, why = bl.load(baseline_path, strict=True)
    except InputError as e:
        raise click.UsageError(str(e)) from e
    if data is None:
        click.echo(f"afddiag baseline show: {why}", err=True)
        return 1
    if as_json:
        click.echo(_json.dumps(data, indent=2))
        return 0
    # a baseline file is data (written by a host, maybe edited): each line escaped
    click.echo(termsafe.line(f"{data['path']}: host {data.get('host')}, recorded {data.get('recorded_at')}, versions "
                    + ", ".join(f"{k} {v}" for k, v in (data.get("versions") or {}).items())))
    for uuid, g in (data.get("gpus") or {}).items():
        click.echo(termsafe.line(f"  {g.get('name')} {uuid}: " + ", ".join(f"{k}={v}" for k, v in g.items() if k != "name")))
    if data.get("cpu"):
        click.echo(termsafe.line("  cpu: " + ", ".join(f"{k}={v}" for k, v in data["cpu"].items())))
    return 0


@cli.command()
@click.option("--markdown", is_flag=True, help="Print docs/GATES.md.")
def catalog(markdown) -> int:
    """List the gates (or print docs/GATES.md with --markdown)."""
    from afddiag import catalog as cat
    from afddiag.render import terminal_width

    if markdown:
        click.echo(cat.markdown(), nl=False)
    else:
        for line in cat.listing(terminal_width()):
            click.echo(line)
    return 0


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI in-process and return its exit code (no ``sys.exit``)."""
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, prog_name="afddiag", standalone_mode=False)
    except click.UsageError as e:
        click.echo(f"afddiag: {e.format_message()}", err=True)
        if e.ctx is not None:
            click.echo(f"Try '{e.ctx.command_path} --help'.", err=True)
        return EXIT_USAGE
    except click.Abort:
        click.echo("afddiag: aborted", err=True)
        return EXIT_ABORT
    except PipeClosed:
        return EXIT_SIGPIPE
    except click.ClickException as e:
        e.show()
        return EXIT_USAGE
    except CatalogError as e:
        click.echo(f"afddiag: {e}", err=True)
        return EXIT_ERROR  # nothing could be judged
    return rv if isinstance(rv, int) else 0




def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: run and exit with the code. A reader that closes the pipe early
    (``afddiag all | head -3``) ends the run quietly with 141 (128 + SIGPIPE), not a traceback and not
    a verdict's code."""
    try:
        code = run(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        code = EXIT_SIGPIPE
    except Exception as e:  # noqa: BLE001 - the one place an unhandled error becomes one line and exit 3
        import contextlib
        import os

        from afddiag.exitcodes import unexpected_line

        with contextlib.suppress(OSError, ValueError):
            print(unexpected_line(e), file=sys.stderr, flush=True)
        code = EXIT_SIGPIPE if _stdout_closed() else EXIT_ERROR
        with contextlib.suppress(OSError, ValueError):  # unwritten output must not fail again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if code == EXIT_SIGPIPE or _stdout_closed():
        import os

        try:  # Python flushes stdout again at exit: point it at /dev/null so that flush cannot fail
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        sys.exit(EXIT_SIGPIPE)
    sys.exit(code)


def _stdout_closed() -> bool:
    try:
        sys.stdout.flush()
        return False
    except BrokenPipeError:
        return True
    except (OSError, ValueError):
        return False
