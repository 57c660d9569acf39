"""Issue 22 item 4: text from a host, snapshot, report, history, playbook or pair peer reaches a terminal,
a page, a CSV or a shell only through afddiag.termsafe: control and bidi characters shown as escapes, a
newline never starts a forged row, rich markup never read from data, shell lines refuse odd device names,
CSV cells never start a formula. Checked on a real terminal (a pty) as well as on plain output."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys

import pytest

from afddiag import termsafe
from afddiag.cli import run
from conftest import REPO
from snapfix import derive, fabric_case

OSC52 = "\x1b]52;c;cm0gLXJmIH4=\x07"  # sets the clipboard to `rm -rf ~`
TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J\x1b[H"
BIDI = "\u202e"
FORGED = "\nPASS   fabric.forged          every link is fine"
HOST = "spark-b[/bold]" + TITLE + BIDI + "[red]x[/red]" + FORGED
# What must never reach a terminal raw: OSC (clipboard, title), a clear screen, BEL, a bidi override.
RAW = ("\x1b]", "\x1b[2J", "\x07", BIDI, "\x9b")


def _raw(text: str) -> list[str]:
    return [r for r in RAW if r in text]


def _forged(text: str) -> bool:
    return any(ln.lstrip().startswith("PASS   fabric.forged") for ln in text.splitlines())


def _hostile_snapshot(tmp_path, device_suffix: str = OSC52 + CLEAR) -> tuple:
    """Case 02 with a hostile host name (case.json) and its mapped device renamed in sysfs."""
    src = fabric_case("02-")
    case = json.loads((src / "case.json").read_text())
    case["host"] = HOST
    snap = derive(src, tmp_path / "snap", {"case.json": json.dumps(case)})
    ib = snap / "sys/class/infiniband"
    evil = "rocep1s0f1" + device_suffix
    os.rename(ib / "rocep1s0f1", ib / evil)
    env = (snap / "env").read_text().replace("rocep1s0f1", evil)
    (snap / "env").write_text(env)
    return snap, evil


def _on_a_pty(argv: list[str], env: dict[str, str], timeout: float = 120.0) -> tuple[int, str]:
    """Run ``python -m afddiag argv`` with stdout and stderr on a pseudo-terminal; (exit code, what it showed)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "afddiag", *argv], stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color",
                                            "COLUMNS": "100", "LINES": "40", **env}, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        r, _, _ = select.select([master], [], [], timeout)
        if not r:
            p.kill()
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    rc = p.wait(timeout)
    return rc, b"".join(chunks).decode("utf-8", "replace")


# ---------------------------------------------------------------- the escape functions

@pytest.mark.parametrize("bad", [OSC52, TITLE, CLEAR, BIDI, "\u2066", "\u200f", "\x9b31m", "\ud8ff", "\u2028"])
def test_line_shows_every_unsafe_character_as_an_escape(bad):
    shown = termsafe.line("a" + bad + "b\nc\td")
    assert shown.startswith("a") and shown.endswith("b\\nc\\td")
    assert all(c.isprintable() and c.isascii() for c in shown), repr(shown)


def test_clean_keeps_ordinary_text():
    s = "rocep1s0f1 port 1: GID 3 fe80::1 ↔ 192.168.100.11 — µs"
    assert termsafe.line(s) == termsafe.clean(s) == s


@pytest.mark.parametrize("value,shown", [("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1", "'+1"),
                                         ("-2+3", "'-2+3"), ("@SUM(A1)", "'@SUM(A1)"), ("mlx5_0", "mlx5_0"),
                                         ("a\nb", "a\\nb")])
def test_csv_cell_never_starts_a_formula(value, shown):
    assert termsafe.csv_cell(value) == shown


@pytest.mark.parametrize("name", ["mlx5_0", "rocep1s0f1", "roceP2p1s0f1", "rxe0.1", "ib-0"])
def test_device_names_pass_the_rule(name):
    assert termsafe.device_name_problem(name) is None


@pytest.mark.parametrize("name", ["x;reboot", "x$(id)", "a b", "x`id`", "x'y", "", "a" * 65, "x\ny", "dev" + OSC52])
def test_odd_names_fail_the_rule_and_the_message_is_safe(name):
    why = termsafe.device_name_problem(name)
    assert why and "not an RDMA device name" in why and not _raw(why) and "\n" not in why


# ---------------------------------------------------------------- renderers, on a real terminal

def test_all_on_a_terminal_with_a_markup_host_name_then_history(tmp_path):
    snap, _ = _hostile_snapshot(tmp_path)
    env = {"AFDDIAG_STATE_DIR": str(tmp_path / "state")}
    rc, shown = _on_a_pty(["all", "--snapshot", str(snap)], env)
    assert "Traceback" not in shown and "MarkupError" not in shown, shown[-2000:]
    assert rc in (0, 1, 2), shown[-2000:]
    assert not _raw(shown) and not _forged(shown)
    assert "spark-b[/bold]" in shown and "\\x1b]52;c;" in shown and "\\u202e" in shown
    rc, shown = _on_a_pty(["history", "--replays"], env)  # the stored run, shown later, on a terminal
    assert rc == 0 and "Traceback" not in shown, shown[-2000:]
    assert not _raw(shown) and not _forged(shown) and "spark-b[/bold]" in shown


def test_fleet_table_on_a_terminal_and_plain(tmp_path, capsys):
    from afddiag.fleet import judge, write_fleet_table
    from afddiag.gates.fleet import HostResult

    fr = judge([HostResult(name=HOST, target="t", error="exit 1: not JSON; stderr: " + OSC52 + FORGED),
                HostResult(name="[bold]spark-c", target="t", error=CLEAR + "[/]")])
    for width in (80, None):
        buf = io.StringIO()
        write_fleet_table(fr, buf, width=width)
        assert not _raw(buf.getvalue()) and not _forged(buf.getvalue())
        assert "spark-b[/bold]" in buf.getvalue() and "[bold]spark-c" in buf.getvalue()


def test_plain_report_lines_never_split_on_a_newline(tmp_path, capsys):
    snap, _ = _hostile_snapshot(tmp_path, OSC52 + FORGED)  # a newline in a sysfs device name
    code = run(["all", "--snapshot", str(snap), "--no-history"])
    out, err = capsys.readouterr()
    assert code in (0, 1, 2) and not _raw(out + err) and not _forged(out + err)
    assert "\\nPASS   fabric.forged" in out


def test_preflight_lines(tmp_path, capsys):
    snap, _ = _hostile_snapshot(tmp_path)
    run(["preflight", "--snapshot", str(snap), "--no-history"])
    out, err = capsys.readouterr()
    assert not _raw(out + err) and not _forged(out + err) and "spark-b[/bold]" in out + err


def test_gid_table_and_csv(tmp_path, capsys):
    snap, _ = _hostile_snapshot(tmp_path)
    assert run(["fabric", "--gids", "--snapshot", str(snap), "--no-history"]) == 0
    out, err = capsys.readouterr()
    assert not _raw(out + err) and "\\x1b]52" in out


def test_csv_cell_of_a_device_name_that_is_a_formula(tmp_path, capsys):
    snap = derive(fabric_case("02-"), tmp_path / "snap")
    ib = snap / "sys/class/infiniband"
    os.rename(ib / "rocep1s0f0", ib / "=HYPERLINK(A1)")
    assert run(["devicemap", "--format", "csv", "--snapshot", str(snap)]) == 0
    out = capsys.readouterr().out
    cells = [ln.split(",")[0] for ln in out.splitlines()[1:]]
    assert "'=HYPERLINK(A1)" in cells and not any(c.startswith("=") for c in cells)


@pytest.mark.parametrize("fmt", ["env", "shell", "nccl"])
def test_shell_and_env_outputs_refuse_a_name_that_is_no_device_name(tmp_path, capsys, fmt):
    snap, evil = _hostile_snapshot(tmp_path, ";touch${IFS}pwned;" + TITLE)
    code = run(["devicemap", "--format", fmt, "--snapshot", str(snap), "--fabric-ip", "192.168.100.11"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "rocep1s0f1;touch${IFS}pwned;\\x1b]0;pwned\\x07" in err and "not an RDMA device name" in err
    assert not _raw(err) and len(err.strip().splitlines()) == 1


def test_devicemap_json_shows_the_odd_name_as_data(tmp_path, capsys):
    snap, evil = _hostile_snapshot(tmp_path, ";touch${IFS}pwned;")
    assert run(["devicemap", "--format", "json", "--snapshot", str(snap)]) == 0
    assert evil in json.loads(capsys.readouterr().out).values()


def test_html_page_escapes_markup_controls_and_bidi(tmp_path, capsys):
    snap, _ = _hostile_snapshot(tmp_path)
    run(["all", "--json", "--no-history", "--snapshot", str(snap)])
    (tmp_path / "r.json").write_text(capsys.readouterr().out)
    run(["merge", str(tmp_path / "r.json"), "--html", str(tmp_path / "f.html")])
    page = (tmp_path / "f.html").read_text()
    assert not _raw(page) and "<script" not in page
    assert "spark-b[/bold]\\x1b]0;pwned\\x07\\u202e" in page


def test_pair_lines_escape_the_peers_fields():
    from afddiag.model.pair import PairFacts
    from afddiag.probes.pair import format_pair

    f = PairFacts(role="client", peer="10.0.0.2" + TITLE, device="mlx5_0" + CLEAR,
                  error="peer said: " + OSC52 + FORGED)
    shown = format_pair(f)
    assert not _raw(shown) and not _forged(shown) and "\\x1b]0;pwned" in shown


def test_progress_labels_are_data_not_markup(monkeypatch):
    """The QP walk's bar names each device: a device named with markup or escapes is shown as it is."""
    from afddiag import progress

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setattr(progress, "enabled", lambda stream=None: True)
    with progress.steps("QP walk", 1) as bar:
        bar.step("mlx5_0[/bold]" + TITLE + " → 10.0.0.2")
        p = progress._state["progress"]
        buf = io.StringIO()
        from rich.console import Console

        Console(file=buf, force_terminal=True, width=120).print(p.make_tasks_table(p.tasks))
    assert "mlx5_0[/bold]\\x1b]0;pwned\\x07" in buf.getvalue() and not _raw(buf.getvalue())


def test_merge_note_about_a_duplicate_names_the_host_escaped(tmp_path, capsys):
    snap, _ = _hostile_snapshot(tmp_path)
    run(["all", "--json", "--no-history", "--snapshot", str(snap)])
    rep = capsys.readouterr().out
    (tmp_path / "a.json").write_text(rep)
    (tmp_path / "b.json").write_text(rep)
    run(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    out, err = capsys.readouterr()
    assert "a duplicate input, skipped" in err and not _raw(out + err) and not _forged(out + err)
