"""Issue 22, attack on main: inputs that choose how a node is judged (a playbook, a baseline) reached
through a link. A link another user planted is theirs to swap after afddiag looks at it, and a link of
root's that leads into another user's folder reaches a file that user can replace: both are input
others could have written, refused like the file itself would be."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from afddiag import baseline, playbook
from afddiag.atomic import written_by_others

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's link needs root")


def _shared(tmp_path: Path) -> Path:
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def _good_playbook(tmp_path: Path) -> Path:
    d = tmp_path / "mine"
    d.mkdir(mode=0o755)
    p = d / "generic.toml"
    shutil.copy(REPO / "playbooks" / "generic.toml", p)
    os.chmod(p, 0o644)
    return p


@root_only
def test_a_playbook_named_through_another_users_link_is_refused(tmp_path):
    good = _good_playbook(tmp_path)
    link = _shared(tmp_path) / "pb.toml"
    link.symlink_to(good)
    os.lchown(link, NOBODY, NOBODY)
    assert "link owned by uid 65534" in (written_by_others(link, sticky_ok=True) or "")
    with pytest.raises(playbook.PlaybookError, match="link owned by uid 65534"):
        playbook.load(path=str(link))


@root_only
def test_a_link_of_roots_into_another_users_folder_is_refused(tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir(mode=0o755)
    shutil.copy(REPO / "playbooks" / "generic.toml", evil / "generic.toml")
    os.chown(evil, NOBODY, NOBODY)  # the file is root's, but its folder lets uid 65534 swap it
    link = _good_playbook(tmp_path).parent / "lnk.toml"
    link.symlink_to(evil / "generic.toml")
    assert "owned by uid 65534" in (written_by_others(link, sticky_ok=True) or "")
    with pytest.raises(playbook.PlaybookError, match="owned by uid 65534"):
        playbook.load(path=str(link))


@root_only
def test_a_baseline_through_another_users_link_is_ignored(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    real = mine / "baseline.json"
    real.write_text("{}")
    link = _shared(tmp_path) / "baseline.json"
    link.symlink_to(real)
    os.lchown(link, NOBODY, NOBODY)
    data, why = baseline.load(str(link))
    assert data is None
    assert isinstance(why, baseline.IgnoredWhy) and "link owned by uid 65534" in why


def test_a_playbook_through_a_link_of_ones_own_to_a_safe_file_is_read(tmp_path):
    good = _good_playbook(tmp_path)
    link = good.parent / "lnk.toml"
    link.symlink_to(good)
    assert written_by_others(link, sticky_ok=True) is None
    assert playbook.load(path=str(link)).gates
