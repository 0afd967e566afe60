"""Megatron sequence parallelism in Galvatron-BMW's space ("Today's training II", item 3): in mixed
precision the searcher may give a layer with TP the sequence-parallel form (Korthikanti et al.
2022 §4.2.2: norms, dropouts and residuals split along the sequence; all-gather + reduce-scatter in
place of each all-reduce, the same ring volume), but only on the layers paraplan's runtime runs it
on (PlanRequest.sequence_parallel, from runtime/layers/tensor_parallel.sequence_parallel_support), so the
planner never picks a plan `train` refuses."""

from dataclasses import replace

import pytest

from paraplan.planners.registry import make_plan
from paraplan.runtime.layers.hybrid import hybrid_refusal
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import workload

# a Llama-2-7B-wide model of 4 blocks at 16k tokens: at a batch of 2 on 8 A100s a sample's
# activations are what memory is short of, the case sequence parallelism is for
LLAMA = ("hf:llama?num_hidden_layers=4&hidden_size=4096&num_attention_heads=32&num_key_value_heads=32"
         "&intermediate_size=11008&vocab_size=32000&max_position_embeddings=16384&seq_len=16384")
A100 = "dgx-a100-80gb?nodes=1"


@pytest.fixture(scope="module")
def tight():
    w = workload(LLAMA, A100, batch=2, memory="10GiB")
    return w, make_plan(w.request, "galvatron-bmw")


def _sp_layers(plan):
    return [i for s in plan.stages for i, st in zip(s.layers, s.strategies, strict=True) if st.sequence_parallel]


def test_the_request_names_the_layers_the_runtime_runs_sp_on(tight):
    w, _ = tight
    pairs = w.request.sequence_parallel
    # embedding (vocabulary-parallel), the 4 blocks and the norm + projection head, at TP 2, 4, 8
    assert {(i, d) for i in range(6) for d in (2, 4, 8)} == pairs
    assert workload(LLAMA, A100, batch=2, precision="fp32").request.sequence_parallel == frozenset()  # the papers' space
    bert = workload("hf:bert?num_hidden_layers=2&hidden_size=128&num_attention_heads=4&intermediate_size=256"
                    "&vocab_size=1000&seq_len=64", A100, batch=8).request
    assert not any(i > 0 for i, _ in bert.sequence_parallel)  # post-norm blocks: the runtime refuses them


def test_bmw_uses_sp_where_memory_is_short_and_train_would_run_it(tight):
    w, plan = tight
    assert plan.prediction.feasible
    assert _sp_layers(plan), [str(st) for s in plan.stages for st in s.strategies]
    layers = w.built.layers()
    assert hybrid_refusal(plan, layers) is None
    sim = simulate_plan(plan, w.request.costs).prediction
    assert sim.feasible and sim.iteration_s == pytest.approx(plan.prediction.iteration_s, rel=1e-6)


def test_sp_buys_time_under_the_budget(tight):
    """Without SP in the space BMW's best plan is slower (it recomputes more to fit), and the SP
    plan with SP switched off does not fit: measured when written 0.242 s with SP."""
    w, plan = tight
    without = make_plan(replace(w.request, sequence_parallel=frozenset()), "galvatron-bmw")
    assert not _sp_layers(without)
    assert without.prediction.iteration_s > plan.prediction.iteration_s * 1.01
    off = replace(plan, prediction=None, stages=tuple(
        replace(s, strategies=tuple(replace(st, sequence_parallel=False) for st in s.strategies)) for s in plan.stages))
    assert not simulate_plan(off, w.request.costs).prediction.feasible
