"""`--schedule best` (planners/schedule_search.py) against brute force: every schedule kind and
chunk count of planners/schedule_variants.py, every micro-batch count dividing the batch and every
cut of the model into p x v contiguous stages, each judged by the simulator; the fastest that fits.
Small cases, some with a memory budget that rules the fastest schedules out."""

import itertools

import pytest

from paraplan.planners.registry import make_plan, simulator_judge
from paraplan.planners.schedule_variants import DEFAULT_VARIANTS
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.schedules import schedule_problem, stage_ranks
from paraplan.workload import workload

LLAMA = ("hf:llama?num_hidden_layers=8&hidden_size=1024&num_attention_heads=8&num_key_value_heads=8"
         "&intermediate_size=2816&vocab_size=8192&seq_len=1024")  # 10 layers
A100 = "dgx-a100-80gb?nodes=1"
CASES = [  # (model, cluster, batch, pipeline ranks, memory budget)
    ("gpt2-tiny", "local", 8, 2, None),
    (LLAMA, A100, 16, 4, None),
    (LLAMA, A100, 16, 4, "2.4GiB"),  # the unlimited winner (interleaved zero-bubble) does not fit
    (LLAMA, A100, 16, 4, "2.1GiB"),  # nothing faster than 1F1B fits
    (LLAMA, A100, 16, 4, "1.9GiB"),
    (LLAMA, A100, 16, 4, "1.7GiB"),
]


def _every_plan(request, n_ranks):
    """Every schedule kind and chunk count, micro-batch count and cut of the model (module docstring)."""
    n_layers = request.n_layers
    for kind, virtual in DEFAULT_VARIANTS:
        n = n_ranks * virtual
        ranks = stage_ranks(kind, n_ranks, virtual)
        for n_micro in (d for d in range(1, request.batch + 1) if request.batch % d == 0):
            if schedule_problem(kind, n_ranks, virtual, n_micro):
                continue
            for cuts in itertools.combinations(range(1, n_layers), n - 1):
                bounds = (0, *cuts, n_layers)
                yield Plan(model=request.model_name, cluster=request.cluster_name, n_layers=n_layers,
                           global_batch=request.batch, n_micro=n_micro, schedule=kind, grad_sync="none",
                           virtual_stages=virtual,
                           stages=tuple(Stage(LayerRange(bounds[i], bounds[i + 1]), (ranks[i],)) for i in range(n)))


def _brute_force(judge, by_time):
    """The fastest plan that fits under `judge`'s memory budget, and (infeasible, its time). A plan's
    time does not depend on the budget, so the plans are judged in the order of their unlimited
    times (`by_time`) until the first that fits: the same optimum as judging every plan under the
    budget, in a fifth of the time (asserted: each plan judged keeps its unlimited time)."""
    for unlimited_s, plan in by_time:
        p = judge(plan)
        assert p.iteration_s == pytest.approx(unlimited_s, rel=1e-12)
        if p.feasible:
            return plan, (False, p.iteration_s)
    return by_time[0][1], (True, by_time[0][0])


@pytest.fixture(scope="module")
def outcomes():
    out, shapes = [], {}
    for model, cluster, batch, n_ranks, memory in CASES:
        request = workload(model, cluster, batch=batch, stages=n_ranks, exact_stages=True, schedule="best",
                           memory=memory).request
        judge = simulator_judge(request)
        plan = make_plan(request, "csimd", judge)
        shape = (model, cluster, batch, n_ranks)
        if shape not in shapes:  # the first case of each shape has no budget: every plan's own time
            assert memory is None
            shapes[shape] = sorted(((judge(p).iteration_s, p) for p in _every_plan(request, n_ranks)),
                                   key=lambda x: x[0])
        best, (infeasible, best_s) = _brute_force(judge, shapes[shape])
        out.append((memory, plan, best, not infeasible, best_s))
    return out


def test_the_planner_finds_the_brute_force_optimum_or_within_2_percent(outcomes):
    exact = 0
    for memory, plan, best, fits, best_s in outcomes:
        assert fits and plan.prediction.feasible, (memory, plan.prediction.reason)
        assert plan.prediction.iteration_s <= best_s * 1.02, (memory, plan.schedule, best.schedule)
        exact += plan.prediction.iteration_s <= best_s * (1 + 1e-9)
    # measured: 6 of the 6 exact (with the fitted dgx-a100-80gb preset, 2026-11-26; before the
    # refinement took the best move of each round and the nearest-to-fitting candidates, 4 of 6,
    # worst 3.3%: interleaved 1F1B's cut at 2.4 GiB)
    assert exact >= 5, exact


def test_memory_changes_the_winner(outcomes):
    """The unlimited winner is a zero-bubble schedule; tighter budgets rule it out, and the planner's
    choice fits them."""
    by_memory = {memory: plan for memory, plan, *_ in outcomes[1:]}
    unlimited = by_memory[None]
    assert unlimited.schedule in ("interleaved-zb", "zbv", "dualpipev")
    tight = by_memory["2.1GiB"]
    assert tight.schedule == "1f1b" and tight.prediction.feasible
    assert max(m.peak_bytes for m in unlimited.prediction.memory) > 2.1 * 2**30  # it would not fit there


def test_planners_that_cannot_search_schedules_plan_their_own_under_best():
    from paraplan.planners.auto import describe, skip_reason

    request = workload("gpt2-tiny", "local", batch=8, schedule="best").request
    assert skip_reason("galvatron-base", request) is None and skip_reason("gropipe", request) is None
    plan = make_plan(request, "gropipe")  # GroPipe's own schedule: its model is GPipe's (gropipe/planner.py)
    assert plan.schedule in ("gpipe", "1f1b") and plan.prediction.feasible
    searched = make_plan(request, "csimd")
    assert "schedules_judged" in dict(searched.search.options)
    if searched.schedule not in ("gpipe", "1f1b"):
        assert searched.schedule in describe(searched)


def test_a_named_multi_chunk_schedule_is_planned_with_its_chunk_counts_searched(capsys, tmp_path):
    from conftest import run_cli_here

    request = workload("gpt2-tiny", "local", batch=8, schedule="interleaved-1f1b").request
    plan = make_plan(request, "csimd")
    assert plan.schedule == "interleaved-1f1b" and plan.virtual_stages >= 2 and plan.n_ranks == 2
    assert plan.prediction.feasible
    res = run_cli_here(capsys, "plan", "--planner", "csimd", "--model", "gpt2-tiny", "--cluster", "local", "--batch",
                       "8", "--stages", "1", "--schedule", "zbv", "--out", str(tmp_path / "p.json"))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "paraplan: error: --schedule: no zbv plan: zbv needs a pipeline of at least 2 ranks; this plan has one stage"]
    assert not (tmp_path / "p.json").exists()
