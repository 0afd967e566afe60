"""Planning an LLM as it is trained today (issue 29): a Llama-2-7B-like `hf:llama` config (h 4096,
32 layers, 32 heads, FFN 11008, vocabulary 32000, 4,096 tokens) on 16 A100-80GB (the
`dgx-a100-80gb` preset: 2 nodes of 8) at a global batch of 64 sequences in bf16, the preset's
default. docs/guide/llm-bf16.md walks through the same example.

Galvatron-BMW searches, per layer, the paper's DP / SDP / TP trees with CKPT and, in mixed
precision, ZeRO-1 / ZeRO-2 and selective recomputation too (planners/galvatron/space.py). Its
choice among ZeRO stages and recomputation kinds is checked against the simulator, the yardstick:
holding the plan's partition, micro-batches and per-layer degrees fixed, every other ZeRO stage
and recomputation kind is enumerated, per stage for the whole stage at once and per layer one at
a time, and none the simulator can run in memory is faster than the planner's choice."""

import itertools
from dataclasses import replace

import pytest

from paraplan.planners.registry import make_plan
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import workload

LLAMA_2_7B = ("hf:llama?hidden_size=4096&intermediate_size=11008&num_hidden_layers=32&num_attention_heads=32"
              "&num_key_value_heads=32&vocab_size=32000&max_position_embeddings=4096&seq_len=4096")
RECOMPUTE = ("none", "selective", "full")


@pytest.fixture(scope="module")
def planned():
    # 1F1B, the schedule BMW's dynamic program prices: by default its plan is rewritten as interleaved
    # 1F1B afterwards with each layer's strategy kept (planners/galvatron/planner.py: _interleaved),
    # where another ZeRO stage can be a hair faster (layer 1 with ZeRO-2: 3.3995 s against 3.4018)
    # the whole 80 GB (no planning headroom): the problem these checks were made on; at 95% BMW's
    # choice is 0.4% behind a per-stage ZeRO / recomputation variant (2026-11-28)
    request = workload(LLAMA_2_7B, "dgx-a100-80gb", batch=64, schedule="1f1b", headroom=0.0).request
    plan = make_plan(request, "galvatron-bmw")
    return request.costs, plan, simulate_plan(plan, request.costs)


def _options(strategy):
    """Every (ZeRO stage, recomputation) the layer's tree can take."""
    zeros = (0, 1, 2) if strategy.dp > 1 and strategy.sdp == 1 else (strategy.zero,)
    return [(z, r) for z in zeros for r in RECOMPUTE]


def _with(plan, choice):
    """The plan with choice[(stage, layer)] = (zero, recompute) applied."""
    stages = []
    for s, stage in enumerate(plan.stages):
        strategies = tuple(replace(st, zero=choice.get((s, i), (st.zero, st.recompute))[0],
                                   recompute=choice.get((s, i), (st.zero, st.recompute))[1])
                           for i, st in zip(stage.layers, stage.strategies, strict=True))
        stages.append(replace(stage, strategies=strategies))
    return replace(plan, stages=tuple(stages), prediction=None)


def _time(costs, plan) -> float:
    sim = simulate_plan(plan, costs)
    return sim.prediction.iteration_s if sim.prediction.feasible else float("inf")


def test_the_plan_is_bf16_and_shows_memory_by_stage_and_category(planned):
    costs, plan, sim = planned
    assert plan.precision == "bf16" and costs.precision == "bf16"
    assert sim.prediction.feasible
    assert all(st.dp * st.sdp * st.tp == len(stage.devices) for stage in plan.stages for st in stage.strategies)
    for breakdown in sim.memory:  # every stage's peak, by category, sums to the peak
        moment, parts = breakdown.at_peak()
        assert sum(nbytes for _, nbytes in parts) == pytest.approx(breakdown.peak_bytes, rel=1e-9)
        assert dict(parts)["16-bit weight copies"] > 0  # bf16: autocast's copies are counted
        assert breakdown.peak_bytes <= 80 * 2**30
    # bf16 on 16 A100s: thousands of tokens per second per GPU (the fp32 model predicted ~220)
    tokens_per_gpu = 64 * 4096 / sim.prediction.iteration_s / 16
    assert 1500 < tokens_per_gpu < 8000


def test_no_zero_stage_or_recomputation_kind_beats_the_planners_choice(planned):
    costs, plan, sim = planned
    chosen = sim.prediction.iteration_s
    layers = [(s, i, st) for s, stage in enumerate(plan.stages) for i, st in zip(stage.layers, stage.strategies,
                                                                                 strict=True)]
    # one option for a whole stage at once, every combination over the stages
    per_stage = []
    for s, stage in enumerate(plan.stages):
        shared = set.intersection(*(set(_options(st)) for st in stage.strategies))
        per_stage.append([(s, option) for option in sorted(shared)])
    tried = 0
    for combo in itertools.product(*per_stage):
        choice = {(s, i): option for s, option in combo for (t, i, _) in layers if t == s}
        assert _time(costs, _with(plan, choice)) >= chosen * (1 - 1e-9), combo
        tried += 1
    # and each layer alone changed to each other option
    for s, i, st in layers:
        for option in _options(st):
            if option != (st.zero, st.recompute):
                assert _time(costs, _with(plan, {(s, i): option})) >= chosen * (1 - 1e-9), (s, i, option)
                tried += 1
    assert tried > 60  # 83 on 2026-11-28: its SDP layers have 3 options each, its DP layers 9
