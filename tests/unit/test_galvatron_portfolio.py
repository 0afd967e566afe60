"""Galvatron-Base and -BMW never lose to a variant inside their space (issue 31, item 1): their
final candidates (their own search's plan and the plans of the variants whose spaces lie inside
theirs, planners/galvatron/planner.py: PORTFOLIO) are ranked by the simulator, the yardstick. A
property test over random small GPT-2s, budgets and batches on 8 TITANs, and the case that showed
the miss: ViT-Huge-32 at 12 GiB, batch 64 (BMW's eq. (8) search chose 732.3 ms where Galvatron's
plan without CKPT estimates 725.6 and simulates 682.4: the DP does not count DDP's buckets, alive
at the gradient sync, so the memory model sent it to ever smaller budgets)."""

import random

import pytest

from paraplan.planners.galvatron.planner import PORTFOLIO
from paraplan.planners.registry import make_plan
from paraplan.workload import workload

TITANS = "galvatron-8xtitan"


def _throughput(plan):
    p = plan.prediction
    return p.throughput_samples_per_s if p.feasible else 0.0


def _cases(n=16, seed=31):
    rng = random.Random(seed)
    for _ in range(n):
        layers, width = rng.choice((4, 6, 8)), rng.choice((256, 512, 768))
        model = (f"hf:gpt2?n_layer={layers}&n_embd={width}&n_head=8&vocab_size=8192&n_positions=512"
                 f"&seq_len={rng.choice((256, 512))}")
        yield model, rng.choice((8, 16, 32, 64)), f"{rng.choice((0.6, 1.0, 1.5, 3.0))}GiB"


@pytest.mark.parametrize("model, batch, memory", list(_cases()))
def test_bmw_and_base_are_never_beaten_by_a_variant_in_their_space(model, batch, memory):
    request = workload(model, TITANS, batch=batch, memory=memory).request
    plans = {name: make_plan(request, name) for name in ("galvatron-bmw", *PORTFOLIO["galvatron-bmw"])}
    for full in ("galvatron-base", "galvatron-bmw"):
        for name in PORTFOLIO[full]:
            assert _throughput(plans[full]) >= _throughput(plans[name]) * (1 - 1e-9), (full, name, memory, batch)


def test_vit_huge_32_at_12_gib():
    request = workload("vit-huge-32", TITANS, batch=64, memory="12GiB").request
    bmw, galvatron = make_plan(request, "galvatron-bmw"), make_plan(request, "galvatron")
    assert bmw.prediction.feasible and bmw.prediction.iteration_s <= galvatron.prediction.iteration_s * (1 + 1e-9)
    # measured: 1.436 s on the TITAN terms fitted by benchmarks/paper_fidelity.py (with the assumed
    # ones: 0.682 s, and 0.732 before the simulator ranked the candidates)
    assert bmw.prediction.iteration_s < 1.45


def test_more_micro_batches_where_memory_forces_recomputation():
    """Issue 31: Galvatron tried P, 2P and 4P micro-batches only, so at large batches memory forced
    recomputation that smaller micro-batches avoid. At a given batch the variants with CKPT now go on
    doubling the count while the estimate improves: BERT-Huge-32 at batch 256 on 8 TITANs at 8 GiB,
    measured when written 9.617 s with the paper's counts (2 stages x 8) and 7.913 s with 128
    micro-batches on 4 stages."""
    from dataclasses import replace

    request = workload("bert-huge-32", TITANS, batch=256, memory="8GiB").request
    plan = make_plan(request, "galvatron-bmw")
    assert plan.prediction.feasible and plan.n_micro > 4 * plan.n_stages
    paper = make_plan(replace(request, n_stages=plan.n_stages, n_micro=4 * plan.n_stages), "galvatron-bmw")
    assert plan.prediction.iteration_s < 0.9 * paper.prediction.iteration_s


def test_every_pipeline_degree_s_best_is_judged_by_the_simulator():
    """Eq. (8) sums every stage's gradient sync (the paper's form) where the stages sync at once, so
    its least cost can be the simulator's slowest; the search keeps every (pipeline degree,
    micro-batch count)'s best (`SearchResult.finalists`) and `judge_candidates` takes the one the simulator
    finds fastest (Llama-2-70B-like on 1,024 A100s: 4.10 s before, 2.57 s after). Here with a
    stand-in judge that reverses eq. (8)'s order, each plan marked by its micro-batch count."""
    from dataclasses import replace

    from paraplan.planners.galvatron.judging import judge_candidates
    from paraplan.planners.galvatron.searcher import SearchResult
    from paraplan.plans.plan import Prediction

    request = workload("gpt2-tiny", TITANS, batch=16, seq_len=128).request
    base = make_plan(request, "dp")
    results = [SearchResult(estimate_s=1.0 + k, plan=replace(base, n_micro=2 ** k)) for k in range(3)]
    chosen = replace(results[0], finalists=tuple(results))

    def judge(plan):  # the more micro-batches (eq. (8)'s worst here), the faster
        return Prediction(iteration_s=1.0 / plan.n_micro, throughput_samples_per_s=16.0 * plan.n_micro)

    plan, prediction, estimate, *_ = judge_candidates(request, False, chosen, judge)
    assert plan.n_micro == 4 and estimate == 3.0 and prediction.iteration_s == 0.25
    # the request's stage count, when it fixes one, is kept: other degrees are not candidates
    fixed = replace(request, n_stages=base.n_stages + 1)
    assert judge_candidates(fixed, False, chosen, judge)[0].n_micro == 1
