"""FD-DPS and the operator-placement baselines as planners (issue 14): plans of real models' operator
graphs, the simulator against the schedule's own critical-path length, memory verdicts, plan files
and the command line."""

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import run_cli_here

from paraplan.costs.model import analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.models.op_split import split_degrees
from paraplan.models.op_trace import build_op_graph
from paraplan.planners.fddps.planner import dag_problem, search_graph
from paraplan.planners.fddps.problem import replay
from paraplan.planners.registry import make_plan, planner
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan_file import plan_from_json, plan_to_json
from paraplan.simulator.predict import simulate_plan

DAG_PLANNERS = ("fddps", "fddps-nosplit", "fastt", "heft", "mpdps")


def four_p100s():
    cluster = load_cluster("fddps-8xp100")
    return replace(cluster, name="fddps-4xp100", nodes=(replace(cluster.nodes[0], devices=cluster.nodes[0].devices[:4]),))


@pytest.fixture(scope="module", params=["resnet-tiny", "gpt2-tiny"])
def costs(request):
    built = zoo.build(request.param)
    return built.ref, replace(analytic_cost_model(measure.measure(built), four_p100s()), operators=build_op_graph(built))


def _request(model, cm, batch=8, **kw):
    return PlanRequest(costs=cm, model_name=model, cluster_name=cm.cluster.name, batch=batch, **kw)


def test_the_dag_planners_are_registered_and_need_the_graph():
    for name in DAG_PLANNERS:
        assert planner(name).needs_operators and planner(name).schedules == ("dag",)
    assert not planner("dp").needs_operators  # data parallelism: one name, one meaning (Galvatron's)


@pytest.mark.parametrize("name", DAG_PLANNERS)
def test_simulated_makespan_equals_the_schedule_length_without_contention(costs, name):
    """Without link contention the simulator runs the plan exactly as the scheduler timed it: its
    makespan is the schedule's dynamic critical-path length (eq. (10)); with contention it can only
    be longer."""
    model, cm = costs
    plan = make_plan(_request(model, cm), name)
    length = dict(plan.search.options)["schedule_length_s"]
    free = simulate_plan(plan, cm, contention=False)
    assert free.prediction.iteration_s == pytest.approx(length, rel=1e-9, abs=1e-12)
    assert simulate_plan(plan, cm).prediction.iteration_s >= length * (1 - 1e-9)
    # and the scheduler's own replay of its placement agrees
    problem = dag_problem(_request(model, cm), search_graph(_request(model, cm), name == "fddps"))
    index = {n: i for i, n in enumerate(problem.names)}
    device = np.empty(problem.n_nodes, dtype=int)
    order = [[] for _ in range(problem.n_devices)]
    for p in plan.operators:
        for op in p.ops:
            device[index[op]] = p.device
            order[p.device].append(index[op])
    assert replay(problem, device, order).makespan_s == pytest.approx(length, rel=1e-9, abs=1e-12)


def test_every_operator_is_placed_once_and_dependencies_hold(costs):
    model, cm = costs
    plan = make_plan(_request(model, cm), "fddps")
    names = [op for p in plan.operators for op in p.ops]
    graph = simulate_plan(plan, cm).dag.graph
    assert sorted(names) == sorted(n.name for n in graph.nodes) and len(set(names)) == len(names)
    sim = simulate_plan(plan, cm, contention=False)
    start, finish = sim.timeline.start[sim.dag.tasks], sim.timeline.end[sim.dag.tasks]
    for e in graph.edges:
        assert start[e.dst] >= finish[e.src] - 1e-12


def test_fddps_splits_compute_heavy_operators_and_the_plan_file_keeps_them(costs, tmp_path):
    model, cm = costs
    plan = make_plan(_request(model, cm), "fddps")
    degrees = split_degrees(op for p in plan.operators for op in p.ops)
    assert degrees and all(d == 4 for d in degrees.values())  # the devices, capped by the batch of 8
    again = plan_from_json(plan_to_json(plan))
    assert again == plan
    assert simulate_plan(again, cm).prediction.iteration_s == pytest.approx(plan.prediction.iteration_s)


def test_memory_verdicts_agree_with_the_simulator(costs):
    """Under a budget that one device cannot meet, every placement the planners return either fits
    by the simulator's count too, or says it does not."""
    model, cm = costs
    one = make_plan(_request(model, cm, n_stages=1), "fddps-nosplit")
    need = max(m.peak_bytes for m in simulate_plan(one, cm).prediction.memory)
    reserve = cm.memory.reserve_bytes
    for fraction in (0.6, 0.01):
        budget = int(reserve + (need - reserve) * fraction)
        tight = replace(cm, cluster=cm.cluster.with_memory(budget))
        for name in DAG_PLANNERS:
            plan = make_plan(_request(model, tight), name)
            sim = simulate_plan(plan, tight)
            if plan.prediction.feasible:
                assert sim.prediction.feasible, (name, fraction, sim.prediction.reason)
            else:
                assert "finds no placement that fits" in plan.prediction.reason


def test_plan_and_simulate_dag_plans_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "fd.json"
    r = run_cli_here(capsys, "plan", "--planner", "fddps", "--model", "resnet-tiny", "--cluster", "fddps-8xp100", "--batch", "8",
             "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "critical path" in r.stdout and "operators" in r.stdout and "simulated with link contention" in r.stdout
    saved = json.loads(out.read_text())
    assert saved["schedule"]["kind"] == "dag" and saved["operators"]
    gantt, trace = tmp_path / "g.png", tmp_path / "t.json"
    r = run_cli_here(capsys, "simulate", str(out), "--gantt", str(gantt), "--trace", str(trace), "--json")
    assert r.returncode == 0, r.stderr
    assert abs(json.loads(r.stdout)["iteration_s"] - saved["prediction"]["iteration_s"]) < 1e-9
    assert gantt.stat().st_size > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["name"].startswith("fwd:") for e in events)
    # --no-contention on the command line: the README's example runs it (tests/unit/test_readme_commands.py)
    # a plan whose operators are not the model's is refused in one line
    saved["operators"][0]["ops"][0] = "fwd:nowhere:mm"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(saved))
    r = run_cli_here(capsys, "simulate", str(bad))
    assert r.returncode == 2 and "not an operator of" in r.stderr and "Traceback" not in r.stderr


def test_an_operator_profile_measured_here_prices_the_plan(tmp_path, capsys):
    """`paraplan profile --operators` times every operator of the iteration on this CPU; a plan made
    with it is priced by those times (and the profile of another model is refused in one line)."""
    ops = tmp_path / "ops.json"
    r = run_cli_here(capsys, "profile", "resnet-tiny", "--operators", "--repeats", "1", "--out", str(ops))
    assert r.returncode == 0, r.stderr
    saved = json.loads(ops.read_text())
    assert saved["kind"] == "operator-profile" and len(saved["seconds"]) == 127
    out = tmp_path / "p.json"
    r = run_cli_here(capsys, "plan", "--planner", "fddps", "--model", "resnet-tiny", "--cluster", "local", "--batch", "8",
             "--profile", str(ops), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["search"]["options"]["costs"] == f"operator profile {tmp_path / 'ops.json'}"
    r = run_cli_here(capsys, "plan", "--planner", "fddps", "--model", "gpt2-tiny", "--cluster", "local", "--batch", "8",
             "--profile", str(ops), "--out", str(tmp_path / "q.json"))
    assert r.returncode == 2 and "an operator profile of resnet-tiny" in r.stderr and "Traceback" not in r.stderr
