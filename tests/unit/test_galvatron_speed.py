"""The exact shortcuts that make Galvatron's search fast at scale (issue 51 item 2): each must leave
the answer as it was. The search's own optimum against brute force is tests/unit/test_galvatron.py's."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from paraplan.costs import alike
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.strategy import strategy_arrays
from paraplan.planners.galvatron.dp import INF, memory_floor
from paraplan.plans.plan import LayerStrategy
from paraplan.workload import workload


def _least_within(cost, fmem, bmem, capacity, fresh=None):
    """The least sum of cost over every choice with sum(O_f) + max(O_b) <= capacity (with `fresh`,
    over those that take at least one of its strategies), by brute force."""
    n, s = cost.shape
    rows, best = np.arange(n), INF
    for choice in itertools.product(range(s), repeat=n):
        idx = np.array(choice)
        if fmem[rows, idx].sum() + bmem[rows, idx].max() <= capacity and (fresh is None or fresh[rows, idx].any()):
            best = min(best, cost[rows, idx].sum())
    return best


def _stages(seed: int, least_strategies: int = 1):
    """300 random stages of 1-4 layers: (cost with some inf, O_f, O_b, capacity, a random `fresh` mask)."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        n, s = int(rng.integers(1, 5)), int(rng.integers(least_strategies, 5))
        cost = rng.random((n, s))
        cost[rng.random((n, s)) < 0.1] = INF
        fmem, bmem = rng.random((n, s)) * 4, rng.random((n, s)) * 2
        yield cost, fmem, bmem, float(rng.random() * 12), rng.random((n, s)) < 0.3


def test_the_memory_floor_never_exceeds_the_optimum_and_counts_memory():
    tighter = 0
    for cost, fmem, bmem, capacity, _ in _stages(5):
        optimum = _least_within(cost, fmem, bmem, capacity)
        floor = memory_floor(cost, fmem, bmem, capacity)
        assert floor <= optimum + 1e-12
        blind = cost.min(axis=1).sum()  # the floor with memory ignored, the search's old one
        assert floor >= blind or floor == INF
        tighter += np.isfinite(optimum) and floor > blind + 1e-9
    assert tighter > 20  # where memory binds, the bound says so


def test_the_floor_of_choices_taking_a_fresh_strategy_never_exceeds_their_optimum():
    # the bound that skips a backward level above one searched (dp.search_stage): over the choices
    # that take at least one `fresh` strategy alone, by brute force
    binding = 0
    for cost, fmem, bmem, capacity, fresh in _stages(6, least_strategies=2):
        best = _least_within(cost, fmem, bmem, capacity, fresh)
        floor = memory_floor(cost, fmem, bmem, capacity, fresh=fresh)
        assert floor <= best + 1e-12
        binding += np.isfinite(best) and floor > memory_floor(cost, fmem, bmem, capacity) + 1e-9
    assert binding > 20  # taking a fresh strategy costs more than the cheapest: the bound says so


def test_memory_floor_of_a_knapsack_by_hand():
    # two layers, each cheap-and-big (cost 1, 3 bytes) or dear-and-small (cost 2, 1 byte), 4 bytes:
    # one of each is the optimum (3); the LP relaxation gives 3 too, the memory-blind floor 2
    cost = np.array([[1.0, 2.0], [1.0, 2.0]])
    fmem = np.array([[3.0, 1.0], [3.0, 1.0]])
    assert memory_floor(cost, fmem, np.zeros((2, 2)), 4.0) == pytest.approx(3.0, rel=1e-2)
    # at 1.5 bytes nothing fits (two layers of at least 1 byte): the bound climbs past any choice's cost
    assert memory_floor(cost, fmem, np.zeros((2, 2)), 1.5) > 4


def test_alike_layers_price_as_each_priced_on_its_own(monkeypatch):
    w = workload("hf:llama?hidden_size=256&intermediate_size=512&num_hidden_layers=4&num_attention_heads=4"
                 "&num_key_value_heads=2&vocab_size=1000&seq_len=64", "dgx-h100-80gb?nodes=2", batch=32, precision="bf16")
    cm = w.request.costs
    devices = tuple(range(8))
    strategies = (LayerStrategy(dp=8), LayerStrategy(sdp=4, tp=2), LayerStrategy(dp=2, tp=4, recompute="full"))
    first = alike.first_alike(cm.compute(0), cm.model, range(cm.model.n_layers))
    assert first == [0, 1, 1, 1, 1, 5]  # the embedding, one block priced for four, the head

    def arrays():
        return strategy_arrays(cm.compute(0), cm.model, strategies, 4.0, cm.cluster, devices, MemoryConfig(),
                               runtime=cm.overheads)

    shared = arrays()
    monkeypatch.setattr("paraplan.costs.strategy.first_alike", lambda costs, model, layers: list(range(len(layers))))
    alone = arrays()
    assert shared.keys() == alone.keys()
    for key in shared:
        assert np.array_equal(shared[key], alone[key]), key
