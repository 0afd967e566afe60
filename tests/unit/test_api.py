"""The Python API (paraplan.plan / simulate / train / compare / load_plan) equals the command line
on the same inputs."""

import json
import os

import pytest
from paraplan_process import run_paraplan

import paraplan
from paraplan.errors import ParaplanError
from paraplan.plans.plan_file import plan_to_dict

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _cli(*args):
    return run_paraplan(*args, env=ENV,
                          timeout=300)


def _same(a: dict, b: dict) -> None:
    for d in (a, b):
        d["search"].pop("search_s")
    assert a == b


@pytest.mark.parametrize("planner,args,kw", [
    ("csimd", ["--stages", "4"], {"stages": 4}),
    ("galvatron-bmw", ["--memory", "8GiB"], {"memory": "8GiB"}),
    ("bipartition", [], {}),
])
def test_one_planner_from_python_equals_the_command_line(tmp_path, planner, args, kw):
    out = tmp_path / "p.json"
    res = _cli("plan", "--planner", planner, "--model", "gpt2-tiny", "--cluster", "galvatron-8xtitan", "--batch", "16",
               *args, "--out", str(out))
    assert res.returncode == 0, res.stderr
    plan = paraplan.plan("gpt2-tiny", "galvatron-8xtitan", batch=16, planner=planner, **kw)
    _same(plan_to_dict(plan), json.loads(out.read_text()))
    # simulate: the same prediction as the file's
    assert paraplan.simulate(out).prediction.iteration_s == pytest.approx(plan.prediction.iteration_s, rel=1e-12)
    assert paraplan.load_plan(out).stages == plan.stages


def test_auto_from_python_equals_the_command_line(tmp_path):
    out = tmp_path / "best.json"
    res = _cli("plan", "--model", "lenet-5", "--cluster", "local", "--batch", "16", "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    best = paraplan.plan("lenet-5", "local", batch=16)
    assert best.search.planner == json.loads(res.stdout)["best"]
    _same(plan_to_dict(best), json.loads(out.read_text()))
    table = paraplan.compare("lenet-5", "local", batch=16)
    assert table.best == best.search.planner and table.bound.iteration_s <= best.prediction.iteration_s


def test_train_from_python_runs_the_plan(tmp_path):
    plan = paraplan.plan("lenet-5", "local", batch=8, planner="even", stages=2, micro_batches=2)
    result = paraplan.train(plan, steps=2, out_dir=tmp_path / "run", dropout=False)
    assert len(result["losses"]) == 2 and len(result["step_s"]) == 2


def test_bad_input_is_a_paraplan_error():
    with pytest.raises(ParaplanError, match="unknown"):
        paraplan.plan("no-such-model", "local", batch=8, planner="csimd")
    with pytest.raises(ParaplanError, match="memory"):
        paraplan.plan("lenet-5", "local", batch=8, planner="csimd", memory="lots")
