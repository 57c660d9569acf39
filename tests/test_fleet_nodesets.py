"""Node sets in the fleet inventory and on the command line (ClusterShell's NodeSet), the per-run ssh
config afddiag writes, and the ssh options no config can override. No SSH server needed."""

from __future__ import annotations

import subprocess

import pytest

from afddiag.fleet import InventoryError, load_inventory, remote_args, select_hosts
from afddiag.fleet.ssh import FORCED_OPTIONS, SshSetupError, _targets, ssh_config, ssh_options

pytest.importorskip("ClusterShell")


def _inv(tmp_path, body: str):
    p = tmp_path / "inv.toml"
    p.write_text(body)
    return load_inventory(str(p))


def test_a_node_set_is_several_hosts_with_the_same_settings(tmp_path):
    inv = _inv(tmp_path, '[[host]]\nname = "coord"\nrole = "coordinator"\nfabric_ip = "10.9.0.1"\n'
                         '[[host]]\nname = "spark[01-03,07]"\nrole = "expert"\nssh = "root@%h.mgmt:2222"\n'
                         'launch_env = "/etc/afd/expert.env"\n')
    assert [h.name for h in inv.hosts] == ["coord", "spark01", "spark02", "spark03", "spark07"]
    assert [h.ssh for h in inv.hosts[1:3]] == ["root@spark01.mgmt:2222", "root@spark02.mgmt:2222"]
    assert {h.role for h in inv.hosts[1:]} == {"expert"} and inv.hosts[4].launch_env == "/etc/afd/expert.env"
    # each rank gets the coordinator's fabric IP as its peer, as a [[host]] of its own would
    assert remote_args(inv.hosts[2], inv)[-2:] == ["--peer", "10.9.0.1"]


def test_a_one_node_set_and_plain_names_keep_their_own_settings(tmp_path):
    inv = _inv(tmp_path, '[[host]]\nname = "spark[05]"\nfabric_ip = "10.9.0.5"\nssh = "10.0.0.5"\n')
    assert [(h.name, h.ssh, h.fabric_ip) for h in inv.hosts] == [("spark05", "10.0.0.5", "10.9.0.5")]


@pytest.mark.parametrize("body,words", [
    ('name = "spark[01-02]"\nfabric_ip = "10.9.0.1"\n', "fabric_ip is each host's own"),
    ('name = "spark[01-02]"\nrails = []\n', "rails is each host's own"),
    ('name = "spark[01-02]"\nssh = "root@10.0.0.1"\n', "names each host by %h"),
    ('name = "spark[02-01"\n', "is not a node set"),
    ('name = "spark[1-70000]"\n', "holds 70000 hosts"),
])
def test_node_set_refusals_name_the_entry_and_the_fix(tmp_path, body, words):
    with pytest.raises(InventoryError) as e:
        _inv(tmp_path, "[[host]]\n" + body)
    assert words in str(e.value) and "host #1" in str(e.value), e.value


def test_a_host_named_twice_through_a_set_is_refused(tmp_path):
    with pytest.raises(InventoryError, match="'spark02' used twice"):
        _inv(tmp_path, '[[host]]\nname = "spark02"\n[[host]]\nname = "spark[01-03]"\n')


def test_nodes_selects_inventory_hosts_by_node_set(tmp_path):
    inv = _inv(tmp_path, '[[host]]\nname = "coord"\n[[host]]\nname = "spark[01-16]"\n')
    assert [h.name for h in select_hosts(inv, "spark[02-03],coord").hosts] == ["coord", "spark02", "spark03"]
    with pytest.raises(InventoryError, match="spark17 not in the inventory"):
        select_hosts(inv, "spark[16-17]")


def test_fleet_nodes_unknown_host_is_a_usage_error(tmp_path, capsys):
    from afddiag import cli

    p = tmp_path / "inv.toml"
    p.write_text('[[host]]\nname = "spark[01-02]"\n')
    assert cli.run(["fleet", "--inventory", str(p), "--nodes", "spark09", "--quiet"]) == 64
    assert "spark09 not in the inventory" in capsys.readouterr().err


def test_the_per_run_config_names_every_host_and_ssh_reads_it_so(tmp_path):
    """``ssh -G`` (ssh's own resolution, nothing contacted) with afddiag's options: each alias gets its
    HostName/Port/User/IdentityFile from afddiag's config, and the checking options hold."""
    inv = _inv(tmp_path, '[fleet]\nuser = "afd"\n[[host]]\nname = "spark[01-02]"\nssh = "%h.mgmt:2201"\n'
                         '[[host]]\nname = "coord"\nssh = "root@192.0.2.1"\n')
    ident = tmp_path / "id key"
    ident.write_text("not a key\n")
    targets = _targets(inv.hosts, "afd")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(ssh_config(targets, str(ident)))
    opts = ssh_options(str(cfg), str(tmp_path / "known hosts"), 2.5)
    import shlex

    for alias, host, port, user in (("spark02", "spark02.mgmt", "2201", "afd"), ("coord", "192.0.2.1", "22", "root")):
        r = subprocess.run(["ssh", *shlex.split(opts), "-G", alias], capture_output=True, text=True, check=True)
        got = dict(ln.split(" ", 1) for ln in r.stdout.splitlines())
        assert (got["hostname"], got["port"], got["user"]) == (host, port, user)
        assert got["identityfile"] == str(ident) and got["identitiesonly"] == "yes"
        assert got["userknownhostsfile"] == str(tmp_path / "known hosts")
        assert got["globalknownhostsfile"] == "/dev/null" and got["stricthostkeychecking"] == "true"
        assert got["forwardagent"] == "no" and got["batchmode"] == "yes" and got["connecttimeout"] == "3"
    assert "-oStrictHostKeyChecking=yes" in FORCED_OPTIONS


def test_an_ssh_target_ssh_config_cannot_take_literally_is_refused(tmp_path):
    inv = _inv(tmp_path, '[[host]]\nname = "a"\nssh = "root@host -oProxyCommand=x"\n')
    with pytest.raises(SshSetupError, match="is not \\[user@\\]host\\[:port\\]"):
        _targets(inv.hosts, None)
