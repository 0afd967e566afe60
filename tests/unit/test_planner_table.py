"""The planner table, the request validated once, and defects found in review (each failed before)."""

import json
import os

import pytest
from paraplan_process import run_paraplan

from paraplan.costs.model import RuntimeOverheads, analytic_cost_model
from paraplan.errors import FieldError, ParaplanError
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.planners.registry import PLANNERS, make_plan, planner_names
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.runtime.config import TrainConfig
from paraplan.simulator.plan_work import plan_work
from paraplan.simulator.predict import simulate_plan

ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _cli(*args):
    return run_paraplan(*args, env=ENV,
                          timeout=300)


@pytest.fixture(scope="module")
def lenet():
    spec = measure.measure(zoo.build("lenet-5"))
    return analytic_cost_model(spec, load_cluster("gropipe-8xt4"))


def _request(cm, **kw):
    return PlanRequest(costs=cm, model_name="lenet-5", cluster_name="gropipe-8xt4", **kw)


def test_every_registered_planner_plans_through_the_one_table(lenet):
    from dataclasses import replace

    from paraplan.models.op_trace import build_op_graph

    names = planner_names()
    assert {"csimd", "gropipe", "bipartition", "pipedream-layerwise", "brute-force", "fddps"} <= set(names)
    with_graph = replace(lenet, operators=build_op_graph(zoo.build("lenet-5")))
    for name in names:
        cm = with_graph if PLANNERS[name].needs_operators else lenet
        plan = make_plan(_request(cm, batch=16, n_stages=2), name)
        assert plan.prediction is not None and plan.search.planner == name
        assert plan.schedule in PLANNERS[name].schedules


@pytest.mark.parametrize("kw,field", [
    ({"batch": 0}, "batch"), ({"batch": 16, "n_stages": 16}, "stages"), ({"batch": 16, "n_micro": 5}, "micro_batches"),
    ({"batch": 16, "schedule": "zigzag"}, "schedule"), ({"batch": 16, "n_stages": 0}, "stages"),
])
def test_requests_are_validated_once_and_name_the_field(lenet, kw, field):
    with pytest.raises(FieldError) as caught:
        _request(lenet, **kw)
    assert caught.value.field == field and "--" not in str(caught.value)


def test_planner_options_are_checked(lenet):
    with pytest.raises(FieldError, match="options.eta"):
        make_plan(_request(lenet, batch=16, options={"eta": 1}), "csimd")  # IMD needs eta >= 2
    with pytest.raises(FieldError, match="has no such option"):
        make_plan(_request(lenet, batch=16, options={"eta": 10}), "gropipe")
    with pytest.raises(FieldError, match="plans 1f1b, not gpipe"):
        make_plan(_request(lenet, batch=16, schedule="gpipe"), "bipartition")


@pytest.mark.parametrize("planner,stages,needle", [
    ("gropipe", "8", "--stages: 8 stages for a model of 5 layers"),  # was a traceback, exit 1
    ("gropipe", "3", "--stages: 3 stages do not split 8 devices"),
    ("gropipe", "16", "--stages: 16 stages need 16 devices"),  # was silently ignored
    ("csimd", "16", "--stages: 16 stages need 16 devices"),
    ("pipedream-layerwise", "8", "--stages: the layer-wise partition gives every worker at least one"),  # was clamped
])
def test_impossible_stage_counts_are_one_line_and_exit_2(tmp_path, planner, stages, needle):
    out = tmp_path / "plan.json"
    res = _cli("plan", "--model", "lenet-5", "--cluster", "gropipe-8xt4", "--batch", "64", "--planner", planner,
               "--stages", stages, "--out", str(out))
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not out.exists()


def test_more_bipartition_workers_than_work_is_said(lenet):
    from dataclasses import replace

    from paraplan.hardware.cluster import Cluster, NodeSpec

    cluster = lenet.cluster  # 8 devices; give it 16 so that 12 workers fit the world but not the 5 layers
    node = cluster.nodes[0]
    big = Cluster(name="x16", nodes=(NodeSpec(node.name, node.devices * 2, node.intra_link, node.network),),
                  description="")
    cm = replace(lenet, cluster=big)
    with pytest.raises(FieldError, match="at most 10 workers, got 12"):  # was silently cut
        make_plan(PlanRequest(costs=cm, model_name="lenet-5", cluster_name="x16", batch=64, n_stages=12),
                  "bipartition")
    plan = make_plan(PlanRequest(costs=cm, model_name="lenet-5", cluster_name="x16", batch=64), "bipartition")
    assert dict(plan.search.options)["idle_devices"] == 6


def test_a_plan_that_does_not_fit_is_exit_2_and_feasible_false(tmp_path):
    out = tmp_path / "plan.json"
    res = _cli("plan", "--model", "gpt2-xl", "--cluster", "gropipe-8xt4", "--batch", "64", "--planner", "gropipe",
               "--stages", "1", "--micro-batches", "8", "--out", str(out), "--json")
    assert res.returncode == 2 and "out of memory" in res.stderr, res.stderr
    assert json.loads(res.stdout)["feasible"] is False and not out.exists()


def _hybrid(grad_sync, n_micro=4):
    return Plan(model="lenet-5", cluster="gropipe-8xt4", n_layers=5, global_batch=16, n_micro=n_micro,
                schedule="gpipe", grad_sync=grad_sync,
                stages=(Stage(LayerRange(0, 5), (0, 1), strategies=(LayerStrategy(dp=2),) * 5),))


def test_hybrid_stages_charge_the_runtime_overheads(lenet):
    # one stage, 4 micro-batches: 4 forward and 4 backward actions, and one step
    overheads = RuntimeOverheads(action_s=1e-3, step_s=5e-3, source="test")
    base = simulate_plan(_hybrid("none"), lenet).prediction.iteration_s
    charged = simulate_plan(_hybrid("none"), replace_overheads(lenet, overheads)).prediction.iteration_s
    assert charged - base == pytest.approx(8 * 1e-3 + 5e-3, rel=1e-9)
    assert plan_work(_hybrid("none"), replace_overheads(lenet, RuntimeOverheads(rendezvous=True))).rendezvous


def test_hybrid_stages_keep_bucketed_sync(lenet):
    # was silently turned into gropipe-delayed
    assert plan_work(_hybrid("bucketed"), lenet).grad_sync == "bucketed"


def replace_overheads(cm, overheads):
    from dataclasses import replace

    return replace(cm, overheads=overheads)


def test_train_config_is_validated_once():
    plan = _hybrid("none")
    with pytest.raises(FieldError, match="^optimizer: unknown 'adagrad'"):  # was silently SGD
        TrainConfig(plan=plan, model="lenet-5", optimizer="adagrad")
    with pytest.raises(FieldError, match="^steps: must be positive"):
        TrainConfig(plan=plan, model="lenet-5", steps=0)
    with pytest.raises(FieldError, match="^resume: needs a checkpoint directory"):
        TrainConfig(plan=plan, model="lenet-5", resume=True)


def test_library_messages_never_quote_a_flag():
    import ast
    import pathlib

    import paraplan

    root = pathlib.Path(paraplan.__file__).parent
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] == "cli":  # the command line quotes flags
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                for const in ast.walk(node.exc):
                    if isinstance(const, ast.Constant) and isinstance(const.value, str):
                        assert " --" not in f" {const.value}", f"{path.name}: {const.value!r}"


def test_unknown_planner_is_one_line(lenet):
    with pytest.raises(ParaplanError, match="unknown planner 'magic'"):
        make_plan(_request(lenet, batch=16), "magic")


def test_a_new_planner_is_one_registration(lenet):
    # what docs/architecture.md promises: a function registered in the table plans through make_plan
    from paraplan.planners.table import PLANNERS as TABLE
    from paraplan.planners.table import register

    @register("test-one-stage", "everything on device 0")
    def one_stage(request, options, judge):
        return Plan(model=request.model_name, cluster=request.cluster_name, n_layers=request.n_layers,
                    global_batch=request.batch, n_micro=1, schedule="gpipe", grad_sync="none",
                    stages=(Stage(LayerRange(0, request.n_layers), (0,)),))

    try:
        plan = make_plan(_request(lenet, batch=16), "test-one-stage")
        assert plan.prediction.iteration_s == simulate_plan(plan, lenet).prediction.iteration_s
    finally:
        del TABLE["test-one-stage"]


def test_a_memory_budget_in_the_request_reaches_planner_and_judge(lenet):
    request = _request(lenet, batch=16, memory_bytes=3 * 2**30)
    plan = make_plan(request, "gropipe")
    assert {m.capacity_bytes for m in plan.prediction.memory} == {3 * 2**30}
    with pytest.raises(FieldError, match="^memory_bytes: must be positive"):
        _request(lenet, batch=16, memory_bytes=0)
    # below the reserve every plan is out of memory: Bi-Partition's search finds no division at all
    with pytest.raises(FieldError, match="fits their memory"):
        make_plan(_request(lenet, batch=16, memory_bytes=2**20), "bipartition")


def test_plan_cli_honours_a_memory_budget(tmp_path):
    out = tmp_path / "plan.json"
    res = _cli("plan", "--model", "lenet-5", "--cluster", "gropipe-8xt4", "--batch", "16", "--planner", "gropipe",
               "--memory-gib", "0.001", "--out", str(out))
    assert res.returncode == 2 and "of 0.00 GiB" in res.stderr and not out.exists(), res.stderr
