"""planners/cut_search.py: an interleaved plan's chunks re-cut by swapping neighbouring layer counts,
judged by a stand-in judge with a known optimum, and by the simulator on a real plan."""

import os

from paraplan.planners.cut_search import recut, search_cut
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.prediction import Prediction

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _plan(sizes: list[int], ranks: int = 2) -> Plan:
    stages, start = [], 0
    for i, size in enumerate(sizes):
        stages.append(Stage(LayerRange(start, start + size), (i % ranks,)))
        start += size
    return Plan(model="m", cluster="c", n_layers=start, global_batch=8, n_micro=4, schedule="interleaved-1f1b",
                virtual_stages=len(sizes) // ranks, stages=tuple(stages))


def _sizes(plan: Plan) -> list[int]:
    return [len(s.layers) for s in plan.stages]


class _Weighted:
    """iteration = sum of chunk i's layers x weight i: the best cut puts the most layers where the
    weights are least (a sort, which swaps of neighbours reach); `refused` cuts do not fit."""

    def __init__(self, weights, refused=()):
        self.weights, self.refused, self.calls = weights, {tuple(r) for r in refused}, 0

    def __call__(self, plan: Plan) -> Prediction:
        self.calls += 1
        t = sum(w * n for w, n in zip(self.weights, _sizes(plan), strict=True))
        return Prediction(t, 8 / t, feasible=tuple(_sizes(plan)) not in self.refused)


def test_the_search_reaches_the_best_order_of_the_same_layer_counts():
    start = _plan([2, 2, 1, 1, 2, 1])
    judge = _Weighted([1.0, 3.0, 2.0, 0.5, 4.0, 0.7])
    plan, prediction, judged = search_cut(start, judge(start), judge)
    # brute force over every order of the counts: the most layers on the least weights
    assert _sizes(plan) == [2, 1, 1, 2, 1, 2]
    assert prediction.iteration_s == min(judge(_plan(list(p))).iteration_s
                                         for p in {(a, b, c, d, e, f) for a in (1, 2) for b in (1, 2) for c in (1, 2)
                                                   for d in (1, 2) for e in (1, 2) for f in (1, 2)}
                                         if sorted(p) == [1, 1, 1, 2, 2, 2])
    assert sorted(_sizes(plan)) == sorted(_sizes(start)) and judged > 0
    # every stage stays on its rank's devices; the layers stay contiguous from 0
    assert [s.devices for s in plan.stages] == [s.devices for s in start.stages]
    assert [s.layers.start for s in plan.stages] == [0, 2, 3, 4, 6, 7]


def test_a_cut_that_does_not_fit_is_never_taken_and_the_budget_holds():
    start = _plan([2, 2, 1, 1, 2, 1])
    judge = _Weighted([1.0, 3.0, 2.0, 0.5, 4.0, 0.7], refused=[[2, 1, 1, 2, 1, 2]])
    plan, prediction, _ = search_cut(start, judge(start), judge)
    assert _sizes(plan) != [2, 1, 1, 2, 1, 2] and prediction.feasible
    assert prediction.iteration_s <= judge(start).iteration_s
    judge.calls = 0
    _, _, judged = search_cut(start, judge(start), judge, most=3)
    assert judged == 3 and judge.calls == 4  # the start's own judgement, then three cuts


def test_one_chunk_per_rank_and_equal_chunks_are_left_as_they_are():
    judge = _Weighted([1.0, 2.0])
    one = _plan([3, 2], ranks=2)
    assert search_cut(one, judge(one), judge)[1:] == (judge(one), 0)
    even = _plan([2, 2, 2, 2])
    judge = _Weighted([1.0, 2.0, 3.0, 4.0])
    assert search_cut(even, judge(even), judge)[2] == 0


def test_a_real_interleaved_plan_is_never_slower_by_the_simulator():
    """GPT-2 with 5 blocks (7 layers with the embedding and head) on 2 ranks x 2 chunks: counts 2, 2,
    2, 1 in some order; the search's cut is the fastest of the four orders it can reach, by the simulator."""
    from dataclasses import replace

    from paraplan.planners.registry import simulator_judge
    from paraplan.planners.schedule_variants import rewrite
    from paraplan.workload import workload

    w = workload("hf:gpt2?n_layer=5&n_embd=64&n_head=2&vocab_size=512&n_positions=64&seq_len=64",
                 "dgx-a100-80gb", batch=16)
    layers = w.costs.model.n_layers
    assert layers == 7
    plain = Plan(model=w.request.model_name, cluster=w.request.cluster_name, n_layers=layers, global_batch=16,
                 n_micro=4, schedule="1f1b", stages=(Stage(LayerRange(0, 4), (0, 1)), Stage(LayerRange(4, 7), (2, 3))),
                 grad_sync="bucketed")
    plain = replace(plain, **w.costs.plan_precision)
    candidate = rewrite(plain, w.costs, "interleaved-1f1b", 2)
    judge = simulator_judge(w.request)
    start = judge(candidate)
    plan, prediction, judged = search_cut(candidate, start, judge)
    assert prediction.feasible and prediction.iteration_s <= start.iteration_s and judged >= 1
    assert sorted(_sizes(plan)) == [1, 2, 2, 2]
    # every order of the counts that differs from the start by one swap of neighbours is no faster
    for i in range(3):
        trial = _sizes(plan)
        trial[i], trial[i + 1] = trial[i + 1], trial[i]
        assert judge(recut(candidate, trial)).iteration_s >= prediction.iteration_s - 1e-12
