"""`paraplan plan --try-top K` (issue 31, item 6): the K best predicted plans run for real and the
measured best chosen (runtime/launcher/prove.py: measured_best). Here with a stand-in runner and its own
clock; the real runs are tests/distributed/test_try_top.py."""

from paraplan_process import run_paraplan

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.runtime.launcher.prove import Measured, measured_best

PLAN = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=1, schedule="gpipe",
            grad_sync="none", stages=(Stage(LayerRange(0, 6), (0,)),))


def _runner(true_s: dict):
    """A stand-in for run_interleaved: every plan's rounds take its true time, interleaved A B C."""
    order = []

    def run(candidates, rounds, steps, progress):
        for r in range(rounds):
            for name in candidates:
                progress(f"round {r + 1}: {name}")
                order.append(name)
        return [Measured(name, predicted, tuple(true_s[name] for _ in range(rounds)))
                for name, (_, predicted) in candidates.items()]
    return run, order


def test_the_measured_best_of_three_is_chosen():
    run, order = _runner({"a": 0.30, "b": 0.20, "c": 0.25})
    chosen, measured = measured_best({"a": (PLAN, 0.10), "b": (PLAN, 0.11), "c": (PLAN, 0.12)}, 3, 5, run=run)
    assert chosen == "b" and [m.name for m in measured] == ["a", "b", "c"]
    assert order == ["a", "b", "c"] * 3  # interleaved rounds


def test_a_wrong_prediction_loses_to_the_measurement():
    run, _ = _runner({"predicted best": 1.0, "other": 0.4})
    chosen, _ = measured_best({"predicted best": (PLAN, 0.1), "other": (PLAN, 0.9)}, 2, 5, run=run)
    assert chosen == "other"
    run, _ = _runner({"predicted best": 0.4, "other": 1.0})
    assert measured_best({"predicted best": (PLAN, 0.1), "other": (PLAN, 0.9)}, 2, 5, run=run)[0] == "predicted best"


def _plan_cli(*args):
    return run_paraplan("plan", "--model", "gpt2-tiny", "--batch", "8", *args, timeout=300)


def test_refused_in_one_line_for_another_machine_and_bad_counts(tmp_path):
    out = str(tmp_path / "p.json")
    r = _plan_cli("--cluster", "galvatron-8xtitan", "--try-top", "2", "--out", out)
    assert r.returncode == 2 and "not this machine" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = _plan_cli("--cluster", "local", "--try-top", "1", "--out", out)
    assert r.returncode == 2 and "at least 2" in r.stderr
    r = _plan_cli("--cluster", "local", "--planner", "csimd", "--try-top", "2", "--out", out)
    assert r.returncode == 2 and "--try-top: only with --planner auto" in r.stderr
