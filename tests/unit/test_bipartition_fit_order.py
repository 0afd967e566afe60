"""Bi-Partition's search over micro-batch counts, largest first (planners/bipartition/fit_order.py): a
kind that fits nowhere at a count is skipped at a smaller count whose memory terms all dominate, and
the answer is the same as searching every count."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

import paraplan.planners.bipartition.planner as bipartition
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.model import analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.planners.bipartition.fit_order import dominated
from paraplan.planners.bipartition.recompute import worker_memory_recompute
from paraplan.planners.registry import simulator_judge
from paraplan.planners.request import PlanRequest, divisors

BATCH = 1024


@pytest.fixture(scope="module")
def lenet():
    return measure.measure(zoo.build("lenet-5"))


def _cm(spec, memory_bytes=None):
    cluster = load_cluster("bipartition-7vm")
    if memory_bytes:
        cluster = replace(cluster, nodes=tuple(replace(n, devices=tuple(replace(d, memory_bytes=int(memory_bytes))
                                                                         for d in n.devices)) for n in cluster.nodes))
    return analytic_cost_model(spec, cluster)


def test_a_dominated_count_needs_at_least_the_larger_counts_memory_for_every_worker(lenet):
    """Brute force on LeNet-5 over 7 workers: wherever `dominated` says so, both dynamic programs' counts
    of every worker and range are at least as large at the smaller count. A fixed part of a layer's
    saved bytes (LeNet's 4 bytes) breaks it where more micro-batches are in flight than the smaller
    count has: then it says no."""
    cm, config, n, rng = _cm(lenet), MemoryConfig(), lenet.n_layers, random.Random(7)
    counts = list(divisors(BATCH))
    pairs = [(s, big) for s, big in itertools.combinations(counts, 2) if dominated(lenet, BATCH, s, big, 7, config)]
    assert len(pairs) >= 10
    ranges = [tuple(sorted(rng.choices(range(n + 1), k=2))) for _ in range(14)]
    for s, big in pairs:
        for make in (bipartition.worker_memory, worker_memory_recompute):
            small_count, large_count = (make(cm, BATCH / p, p, 7, config) for p in (s, big))
            for w, fr, br in itertools.product(range(7), ranges, ranges[:6]):
                args = (w, fr, br) if make is bipartition.worker_memory else (w, *fr, *br)
                assert float(small_count(*args)) >= float(large_count(*args))
    assert not dominated(lenet, BATCH, 32, 64, 64, config)  # in flight up to 64: the 4 bytes count 64 times


@pytest.mark.parametrize("memory_bytes", [540e6, 560e6])
def test_searching_the_largest_count_first_gives_the_same_plan_and_table(lenet, memory_bytes, monkeypatch):
    """At 540 MB a device, some kinds fit at large counts only, and are skipped below them; the plan and
    every judged row are those of searching every count (dominated patched to never hold)."""
    cm = _cm(lenet, memory_bytes)
    request = PlanRequest(costs=cm, model_name="lenet-5", cluster_name=cm.cluster.name, batch=BATCH)
    skipped = []
    search = bipartition.largest_first

    def spy(counts, search_at, is_dominated):
        def at(p, skip, failed):
            skipped.extend(skip)
            return search_at(p, skip, failed)
        return search(counts, at, is_dominated)

    monkeypatch.setattr(bipartition, "largest_first", spy)
    plan, table = bipartition.plan_bipartition(request, simulator_judge(request))
    assert skipped
    monkeypatch.setattr(bipartition, "dominated", lambda *args: False)
    every_plan, every_table = bipartition.plan_bipartition(request, simulator_judge(request))
    assert (plan.stages, plan.n_micro, plan.prediction) == (every_plan.stages, every_plan.n_micro, every_plan.prediction)
    assert table == every_table
