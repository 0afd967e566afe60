"""calibrate runs a training run that died after finishing its steps (a rank aborted at exit) once
more, and says so; a run that failed before finishing is not retried. The launcher is replaced by
a fake that writes what a finished run writes."""

import json
import subprocess

import pytest

from paraplan.errors import ParaplanError
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.profiling.calibrate import runtime_costs as calibrate

PLAN = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=2, schedule="1f1b",
            grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,))))
DIED_AT_EXIT = "training stopped: rank 1 exited with code -6; the other ranks were stopped"


def _fake_launcher(outcomes, write_steps):
    """Each call pops (return code, last stderr line); writes the files of `write_steps` steps."""
    calls = []

    def run(plan_path, steps, out):
        calls.append(out)
        code, line = outcomes.pop(0)
        out.mkdir(parents=True, exist_ok=True)
        (out / "losses.json").write_text(json.dumps([1.0] * write_steps))
        for r in range(2):
            (out / f"steps_rank{r}.json").write_text(json.dumps([0.01] * write_steps))
            (out / f"timeline_rank{r}.json").write_text(json.dumps({"rank": r, "events": []}))
        return subprocess.CompletedProcess([], code, "", f"paraplan: {line}\n")

    return run, calls


def test_a_run_that_died_at_exit_after_its_steps_is_retried_once_and_said(tmp_path, monkeypatch):
    run, calls = _fake_launcher([(2, DIED_AT_EXIT), (0, "")], write_steps=4)
    monkeypatch.setattr(calibrate, "_run_train", run)
    said = []
    out = calibrate._train(PLAN, 4, tmp_path, "run0", notice=said.append)
    assert len(calls) == 2 and out == tmp_path / "run0"
    assert said == ["run run0 died at exit (code -6) after finishing its steps; retrying once"]


def test_the_retry_is_said_on_the_console_by_default(tmp_path, monkeypatch, capsys):
    run, _ = _fake_launcher([(2, DIED_AT_EXIT), (0, "")], write_steps=4)
    monkeypatch.setattr(calibrate, "_run_train", run)
    calibrate._train(PLAN, 4, tmp_path, "tp0")
    assert capsys.readouterr().err == "run tp0 died at exit (code -6) after finishing its steps; retrying once\n"


def test_a_second_death_and_an_unfinished_run_end_the_calibration(tmp_path, monkeypatch):
    run, calls = _fake_launcher([(2, DIED_AT_EXIT), (2, DIED_AT_EXIT)], write_steps=4)
    monkeypatch.setattr(calibrate, "_run_train", run)
    with pytest.raises(ParaplanError, match="the run of run0 failed: .*exited with code -6"):
        calibrate._train(PLAN, 4, tmp_path, "run0", notice=lambda line: None)
    assert len(calls) == 2
    run, calls = _fake_launcher([(2, "training stopped: rank 0 failed: RuntimeError: boom")], write_steps=2)
    monkeypatch.setattr(calibrate, "_run_train", run)
    said = []
    with pytest.raises(ParaplanError, match="RuntimeError: boom"):
        calibrate._train(PLAN, 4, tmp_path, "run1", notice=said.append)
    assert len(calls) == 1 and said == []  # 2 of 4 steps: it did not finish, no retry
