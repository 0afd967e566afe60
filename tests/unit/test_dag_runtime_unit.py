"""The operator runtime's static side (runtime/dag/program.py, analysis.py) and the planners' `runnable` constraint:
names resolve to the traced calls, the transfers are the graph's cross-device edges, plans that
autograd cannot run are refused in one line, and constrained planners keep every backward node on
its forward op's device (unconstrained ones are untouched)."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.costs.model import analytic_cost_model
from paraplan.hardware.presets import load_cluster
from paraplan.models import measure, source
from paraplan.models.op_split import PART
from paraplan.models.op_trace import build_op_graph
from paraplan.planners.fddps.baselines import schedule_fastt, schedule_heft, schedule_mpdps
from paraplan.planners.fddps.dps import schedule_fddps
from paraplan.planners.fddps.problem import DagProblem
from paraplan.planners.registry import make_plan
from paraplan.planners.request import FieldError, PlanRequest
from paraplan.plans.plan import OperatorPlacement
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.dag.analysis import analyse
from paraplan.runtime.dag.dag_runtime import dag_refusal
from paraplan.runtime.dag.program import DagRefusal, build_program

PLANNERS = ["fddps", "fddps-nosplit", "fddps-ports", "fastt", "heft", "mpdps"]


def _costs(model, cluster):
    built = source.build(model, device="meta")
    spec = measure.measure(built)
    return analytic_cost_model(spec, load_cluster(cluster), operators=build_op_graph(built))


@pytest.fixture(scope="module")
def costs():
    return {(m, c): _costs(m, c) for m in ("lenet-5", "resnet-tiny", "gpt2-tiny") for c in ("local", "fddps-8xp100")}


def _plan(cm, model, cluster, planner, batch=8, stages=None, **options):
    request = PlanRequest(costs=cm, model_name=model, cluster_name=cluster, batch=batch, n_stages=stages,
                          options=options)
    return make_plan(request, planner)


def _where(plan):
    return {op: p.device for p in plan.operators for op in p.ops}


def _colocation_broken(graph, plan):
    """(backward, forward) pairs on different devices, by the graph's forward_of (parts pairwise)."""
    where = _where(plan)
    bad = []
    for n in graph.nodes:
        if not n.forward_of:
            continue
        if n.name in where:
            pairs = [(n.name, n.forward_of)]
        else:
            parts = sorted(op for op in where if op.startswith(n.name + PART))
            pairs = [(p, n.forward_of + p[len(n.name):]) for p in parts]
        for b, f in pairs:
            if f not in where or where[b] != where[f]:
                bad.append((b, f))
    return bad


@pytest.mark.parametrize("planner", PLANNERS)
def test_runnable_plans_keep_every_backward_with_its_forward(costs, planner):
    broken_free = 0
    for (model, cluster), cm in costs.items():
        for stages in ((None,) if cluster == "local" else (2, 3, 4)):
            plan = _plan(cm, model, cluster, planner, stages=stages)
            assert dict(plan.search.options)["runnable"] is True
            assert not _colocation_broken(cm.operators, plan), (model, cluster, stages)
            free = _plan(cm, model, cluster, planner, stages=stages, runnable=False)
            broken_free += bool(_colocation_broken(cm.operators, free))
    if planner != "mpdps":  # the paper's free placement does break it: the constraint is not vacuous
        assert broken_free


def test_the_unconstrained_placement_is_the_paper_schedulers_own(costs):
    """runnable=false is exactly the scheduler on the plain problem (no colocation, no extra edges)."""
    from paraplan.planners.fddps.planner import dag_problem, search_graph

    cm = costs[("resnet-tiny", "fddps-8xp100")]
    request = PlanRequest(costs=cm, model_name="resnet-tiny", cluster_name="fddps-8xp100", batch=8, n_stages=4)
    graph = search_graph(request, True, runnable=False)
    problem = dag_problem(request, graph, runnable=False)
    assert problem.colocate is None and problem.n_edges == len(graph.edges)
    schedule = schedule_fddps(problem)
    plan = make_plan(replace(request, options={"runnable": False}), "fddps")
    assert [p.ops for p in plan.operators] == [tuple(graph.nodes[i].name for i in o) for o in schedule.order if o]


def _random_problem(rng, n, d):
    edges = {(int(a), int(b)) for a, b in rng.integers(0, n, size=(3 * n, 2)) if a < b}
    src, dst = zip(*sorted(edges), strict=True)
    colocate = np.full(n, -1)
    for i in range(1, n):
        if rng.random() < 0.4:
            colocate[i] = rng.integers(0, i)
    pinned = [(int(colocate[i]), i) for i in range(n) if colocate[i] >= 0]
    src, dst = list(src) + [a for a, _ in pinned], list(dst) + [b for _, b in pinned]
    alpha = np.full((d, d), 1e-4)
    return DagProblem(exec_s=rng.random((n, d)) * 1e-3, edge_src=src, edge_dst=dst,
                      edge_bytes=rng.random(len(src)) * 1e6, link_alpha_s=alpha, link_bytes_per_s=np.full((d, d), 1e9),
                      resident_bytes=np.zeros(n), output_bytes=np.zeros(n), capacity_bytes=np.full(d, np.inf),
                      colocate=colocate)


@pytest.mark.parametrize("seed", range(6))
def test_every_scheduler_honours_colocation_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    problem = _random_problem(rng, int(rng.integers(20, 80)), int(rng.integers(2, 5)))
    pinned = np.flatnonzero(problem.colocate >= 0)
    for schedule in (schedule_fddps(problem), schedule_fddps(problem, links="ports", fallback="earliest_finish"),
                     schedule_fastt(problem), schedule_heft(problem), schedule_mpdps(problem, groups_per_device=4)):
        assert (schedule.device[pinned] == schedule.device[problem.colocate[pinned]]).all()


def test_colocate_must_point_to_an_earlier_node():
    rng = np.random.default_rng(0)
    p = _random_problem(rng, 10, 2)
    with pytest.raises(Exception, match="colocate"):
        replace(p, colocate=np.arange(10))


def test_runnable_is_a_boolean_option(costs):
    with pytest.raises(FieldError, match="options.runnable"):
        _plan(costs[("lenet-5", "local")], "lenet-5", "local", "fddps", runnable="yes")


# --- the runtime's static side ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lenet():
    cm = _costs("lenet-5", "fddps-8xp100")
    plan = _plan(cm, "lenet-5", "fddps-8xp100", "fddps", batch=8, stages=2)
    return cm, plan, build_program("lenet-5", 8)


def test_the_program_has_the_graphs_names_and_one_call_per_forward_node(lenet):
    cm, _, program = lenet
    graph = build_op_graph(source.build("lenet-5", device="meta"))
    assert program.names == [n.name for n in graph.nodes]
    forward = [i for i, n in enumerate(graph.nodes) if n.phase == "forward"]
    assert sorted(program.node_call) == forward
    by_name = {n.name: n for n in graph.nodes}
    for b, f in enumerate(program.forward_of):
        if f >= 0:
            assert by_name[program.names[b]].forward_of == program.names[f]


def test_the_transfers_are_the_graphs_cross_device_edges(lenet):
    """Every receive of a storage version is an edge (writer -> a reader on another device) of the
    split graph the plan names, and every such edge with data is served by one receive."""
    _, plan, program = lenet
    an = analyse(plan, program)
    where = _where(plan)
    sim_graph = _split_graph(plan)
    index = {n.name: i for i, n in enumerate(sim_graph.nodes)}
    cross = {(e.src, where[sim_graph.nodes[e.dst].name]) for e in sim_graph.edges
             if where[sim_graph.nodes[e.src].name] != where[sim_graph.nodes[e.dst].name]
             and sim_graph.nodes[e.src].phase == "forward" and sim_graph.nodes[e.dst].phase == "forward"}
    got = set()
    for r, w in enumerate(an.work):
        for (_, v), (src, _) in w.recvs.items():
            writer = program.names[program.calls[v].node]
            name = writer + "/gather" if writer + "/gather" in index else writer
            assert where[name] == src
            got.add((index[name], r))
        for (ci, k), _ in w.part_recvs.items():
            got.add((index[f"{program.names[program.calls[ci].node]}/part{k}"], r))
    assert got == cross and got


def _split_graph(plan):
    from paraplan.models.op_split import split_as_named

    graph = build_op_graph(source.build("lenet-5", device="meta"))
    return split_as_named(graph, (op for p in plan.operators for op in p.ops))


def _config(plan, **kw):
    return TrainConfig(plan=plan, model=plan.model, dropout=False, **kw)


def _moved(plan, name, to):
    ops = [[op for op in p.ops if op != name] for p in plan.operators]
    ops[to].append(name)
    return replace(plan, operators=tuple(OperatorPlacement(d, tuple(o)) for d, o in enumerate(ops)))


def test_refusals_are_one_line(lenet):
    cm, plan, program = lenet
    assert dag_refusal(_config(plan)) is None
    where = _where(plan)
    bwd = next(op for op in where if op.startswith("bwd:") and op.endswith("addmm_backward"))
    moved = _moved(plan, bwd, 1 - where[bwd])
    reason = dag_refusal(_config(moved))
    assert reason and "\n" not in reason and "runnable=true" in reason and f"on device {1 - where[bwd]}" in reason
    free = _plan(cm, "lenet-5", "fddps-8xp100", "fddps", batch=8, stages=2, runnable=False)
    assert _colocation_broken(cm.operators, free) and "runnable=true" in dag_refusal(_config(free))
    renamed = replace(plan, operators=(OperatorPlacement(0, plan.operators[0].ops + ("fwd:nowhere:mm",)),
                                       *plan.operators[1:]))
    assert "not in the model's operator graph" in dag_refusal(_config(renamed))
    dropped = replace(plan, operators=(OperatorPlacement(0, plan.operators[0].ops[1:]), *plan.operators[1:]))
    assert "on no device" in dag_refusal(_config(dropped))
    first = plan.operators[0].ops
    backwards = replace(plan, operators=(OperatorPlacement(0, first[1:] + first[:1]), *plan.operators[1:]))
    assert "do not run" in dag_refusal(_config(backwards))
    assert "checkpoints" in dag_refusal(_config(plan, checkpoint_dir="/tmp/x"))


def test_a_split_forward_needs_its_backward_split_alike(lenet):
    _, plan, program = lenet
    where = _where(plan)
    part = next(op for op in where if op.startswith("bwd:") and op.endswith(f"{PART}1"))
    base = part[: -len(f"{PART}1")]
    ops = [[op for op in p.ops if not op.startswith(base + PART) and op != base + "/gather"] for p in plan.operators]
    ops[0].append(base)
    unsplit = replace(plan, operators=tuple(OperatorPlacement(d, tuple(o)) for d, o in enumerate(ops)))
    with pytest.raises(DagRefusal, match="is split in 1 but its forward"):
        analyse(unsplit, program)
