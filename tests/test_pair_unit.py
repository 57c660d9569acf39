"""The pair test's parts that need no RDMA device (the real exchange runs in the lab: test_lab_pair.py)."""

from __future__ import annotations

import json

import pytest

from afddiag import cli
from afddiag.model.fabric import FabricFacts
from afddiag.probes import pair as pm
from conftest import CASES


def _case_fabric():
    from afddiag.model.run import Inputs
    from afddiag.runner import gather

    return gather(Inputs(snapshot=str(CASES / "fabric" / "02-spark-map-set-healthy"),
                         families=frozenset({"fabric"}))).fabric


def test_parse_hostport():
    assert pm.parse_hostport("10.9.0.1") == ("10.9.0.1", pm.DEFAULT_PORT)
    assert pm.parse_hostport("10.9.0.1:7000") == ("10.9.0.1", 7000)
    with pytest.raises(ValueError, match="not 1..65535"):
        pm.parse_hostport("h:99999")


def test_pick_endpoint_is_the_fabric_ips_rocev2_gid():
    fab = _case_fabric()
    dev, port, idx, gid, ip = pm.pick_endpoint(fab, "192.168.100.11")
    assert (dev, port, idx, ip) == ("rocep1s0f1", 1, 3, "192.168.100.11")
    assert gid.endswith("ffff:c0a8:640b")
    with pytest.raises(pm.PairError, match="2 candidates"):
        pm.pick_endpoint(fab, None)
    with pytest.raises(pm.PairError, match="no IPv4 RoCE v2 GID"):
        pm.pick_endpoint(fab, "10.1.1.1")


def test_pair_without_a_device_says_why_and_never_raises():
    f = pm.pair("127.0.0.1", 9, fabric=FabricFacts(), timeout_s=2)
    assert f.error and f.error.startswith("no RDMA device on this host")  # the root, before pyverbs or a GID
    assert f.destroyed and f.phases == []
    assert f"stopped on this host before contacting the peer 127.0.0.1:9: {f.error}" in pm.format_pair(f)


def test_cli_pair_and_serve_together_is_a_usage_error(capsys):
    assert cli.run(["fabric", "--serve", "--pair", "h"]) == 64
    assert cli.run(["fabric", "--pair", "h:0x"]) == 64


def test_cli_pair_json_exit_2_on_failure(capsys):
    rc = cli.run(["fabric", "--pair", "127.0.0.1:9", "--json", "--fabric-ip", "10.1.1.1", "--pair-timeout", "2"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 2 and out["role"] == "client" and out["error"]


def test_cli_pair_fabric_read_takes_timeout(capsys, monkeypatch):
    """--timeout bounds the pair test's fabric read (rxe's GID tables under emulation outrun the 10 s default)."""
    from afddiag import runner

    seen = []
    real = runner.observe

    def spy(inputs, *a, **kw):
        seen.append(inputs.timeout("fabric_s"))
        return real(inputs, *a, **kw)

    monkeypatch.setattr(runner, "observe", spy)
    cli.run(["fabric", "--pair", "127.0.0.1:9", "--json", "--timeout", "42", "--fabric-ip", "10.1.1.1",
             "--pair-timeout", "2"])
    cli.run(["fabric", "--pair", "127.0.0.1:9", "--json", "--fabric-ip", "10.1.1.1", "--pair-timeout", "2"])
    capsys.readouterr()
    assert seen[0] == 42.0 and seen[1] != 42.0
