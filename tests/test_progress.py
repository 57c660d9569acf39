"""Progress on stderr (issue 16): drawn only on a terminal, never on stdout, gone before the report."""

import io
import sys
import time

import pytest

from afddiag import progress


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("AFDDIAG_NO_PROGRESS", raising=False)
    monkeypatch.setitem(progress._state, "off", False)
    yield
    progress.stop()


def _fake_load(monkeypatch, seen):
    from afddiag.probes import load

    def run_load_probe(ordinal, budget_s):
        seen.append(ordinal)
        time.sleep(0.3)  # long enough for a refresh of the bar
        return {"device": {"uuid": f"GPU-{ordinal}"}, "clock_sm_mhz": 1980}

    monkeypatch.setattr(load, "run_load_probe", run_load_probe)
    return load


def test_load_probe_draws_a_bar_per_gpu_on_a_terminal(monkeypatch, capsys):
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    seen = []
    load = _fake_load(monkeypatch, seen)
    readings = {"devices": [{"uuid": "GPU-0", "name": "NVIDIA H200"}, {"uuid": "GPU-1", "name": "NVIDIA H200"}]}
    load.attach_load(readings, 0.1)
    assert seen == [0, 1] and readings["devices"][1]["under_load"]["clock_sm_mhz"] == 1980
    text = err.getvalue()
    assert "GPU load probe: GPU 0 NVIDIA H200" in text and "GPU load probe: GPU 1 NVIDIA H200" in text
    assert capsys.readouterr().out == ""  # stdout holds only the report
    assert progress._state["progress"] is None  # the display ended with its steps


def test_no_progress_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    load = _fake_load(monkeypatch, [])
    load.attach_load({"devices": [{"uuid": "GPU-0"}]}, 0.1)
    assert err.getvalue() == "" and capsys.readouterr().out == ""


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("AFDDIAG_NO_PROGRESS", "1")
    assert not progress.enabled(Tty())
    monkeypatch.delenv("AFDDIAG_NO_PROGRESS")
    assert progress.enabled(Tty()) and not progress.enabled(io.StringIO())


def test_stop_ends_a_bar_a_hung_probe_left_open(monkeypatch):
    monkeypatch.setattr(sys, "stderr", Tty())
    cm = progress.steps("QP walk", 3)
    bar = cm.__enter__()
    bar.step("mlx5_0 → loopback")
    assert progress._state["progress"] is not None
    progress.stop()  # what the CLI does before it writes the report
    assert progress._state["progress"] is None
    bar.step("mlx5_1 → loopback")  # the abandoned thread goes on: harmless
    cm.__exit__(None, None, None)


def test_qp_walk_steps_per_device(monkeypatch):
    from afddiag.model.fabric import FabricFacts, RdmaDevice
    from afddiag.probes import qp

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(qp, "_import_pyverbs", lambda: {})
    walked = []

    def walk(pv, res, port, sgid_index):
        walked.append(res.device)
        time.sleep(0.25)
        res.reached = "RTS"

    monkeypatch.setattr(qp, "_walk", walk)
    facts = qp.probe_qp(FabricFacts(devices=[RdmaDevice("mlx5_0"), RdmaDevice("mlx5_1")]), None, [], 2.0)
    assert walked == ["mlx5_0", "mlx5_1"] and [r.reached for r in facts.results] == ["RTS", "RTS"]
    assert "QP walk: mlx5_0 → loopback" in err.getvalue() and "QP walk: mlx5_1 → loopback" in err.getvalue()
