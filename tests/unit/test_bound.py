"""The lower bound (planners/bound.py) is a bound: no feasible plan of any planner beats it, and its
memory term is the Lagrangian dual of the recomputation choice it relaxes (issue 31, item 4)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

from paraplan.planners.auto import skip_reason
from paraplan.planners.bound import _dual, lower_bound
from paraplan.planners.registry import make_plan, planner_names
from paraplan.simulator.predict import simulate_plan
from paraplan.simulator.time_split import against_bound
from paraplan.workload import workload

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _exact(work: np.ndarray, saved: np.ndarray, room: float) -> float:
    """The least work over every choice of one mode per layer within `room` bytes (brute force)."""
    best = np.inf
    for choice in itertools.product(range(work.shape[0]), repeat=work.shape[1]):
        idx = (np.array(choice), np.arange(work.shape[1]))
        if saved[idx].sum() <= room:
            best = min(best, float(work[idx].sum()))
    return best


def test_the_dual_never_exceeds_the_least_recomputation_and_is_exact_when_memory_is_loose():
    rng = np.random.default_rng(7)
    tight = 0
    for _ in range(300):
        layers = int(rng.integers(1, 7))
        base = rng.uniform(1, 10, layers)
        # modes: none, selective, full: more work, less memory (as recomputation trades them)
        work = np.stack([base, base * rng.uniform(1.0, 1.2, layers), base * rng.uniform(1.2, 1.5, layers)])
        mem = rng.uniform(1, 10, layers)
        saved = np.stack([mem, mem * rng.uniform(0.5, 1.0, layers), mem * rng.uniform(0.05, 0.5, layers)])
        room = float(rng.uniform(saved.min(axis=0).sum(), saved[0].sum() * 1.2))
        exact, dual = _exact(work, saved, room), _dual(work, saved, room)
        assert dual <= exact * (1 + 1e-12)
        if saved[0].sum() <= room:
            assert dual == pytest.approx(exact, rel=1e-12)
        else:
            tight += 1
            assert dual >= work[0].sum() * (1 - 1e-12)  # never below the work without recomputation
    assert tight > 100


# small models on presets whose memory budgets force recomputation or small micro-batches (the
# memory term binds) or leave them free (the work term binds): every planner's feasible plan
CASES = [
    ("gpt2-tiny", "galvatron-8xtitan", 64, "0.52GiB", 512),
    ("gpt2-tiny", "galvatron-8xtitan", 64, "0.505GiB", 512),
    ("llama-tiny", "galvatron-16xa100", 32, "0.51GiB", 1024),
    ("bert-tiny", "galvatron-8xtitan", 64, "0.51GiB", 512),
    ("vgg-tiny", "fddps-8xp100", 32, None, None),
    ("gpt2-tiny", "dgx-a100-80gb", 32, "0.51GiB", 1024),
]


def _random_cases(n: int = 4):
    """Random small requests (seeded): tiny models, paper and today's presets, tight and loose budgets."""
    rng = np.random.default_rng(31)
    for _ in range(n):
        model = str(rng.choice(("gpt2-tiny", "llama-tiny", "bert-tiny")))
        cluster = str(rng.choice(("galvatron-8xtitan", "galvatron-16xa100", "dgx-a100-80gb", "gropipe-8xt4")))
        memory = rng.choice((None, "0.52GiB", "0.6GiB", "1GiB"))
        yield model, cluster, int(rng.choice((16, 32, 64))), memory, int(rng.choice((256, 512, 1024)))


@pytest.mark.parametrize("model,cluster,batch,memory,seq", CASES + list(_random_cases()))
def test_no_feasible_plan_of_any_planner_beats_the_bound(model, cluster, batch, memory, seq):
    w = workload(model, cluster, batch=batch, memory=memory, seq_len=seq, operators="optional")
    bound = lower_bound(w.request.costs, batch)
    checked = 0
    for name in planner_names():
        if skip_reason(name, w.request) is not None:
            continue
        try:
            plan = make_plan(w.request, name)
        except Exception:  # a planner that cannot plan this request has no plan to check
            continue
        if plan.prediction.feasible:
            checked += 1
            assert plan.prediction.iteration_s >= bound.iteration_s * (1 - 1e-9), (name, bound)
            # stronger: the bound is a least compute per device, so every plan's average compute is at
            # least that (operator placements' own, cheaper, operator costs included: W_op / n), and
            # the rest of its iteration is communication, the step and idle time (simulator/time_split.py)
            split = simulate_plan(plan, w.request.costs).split
            assert split.compute_s >= bound.iteration_s * (1 - 1e-9), (name, split, bound)
            parts = against_bound(split, bound.iteration_s)
            total = parts.bound_s + parts.extra_compute_s + parts.exposed_comm_s + parts.after_s + parts.idle_s
            assert total == pytest.approx(plan.prediction.iteration_s, rel=1e-9), (name, parts)
    assert checked >= 1


def test_operator_placements_are_bounded_by_their_own_operator_costs():
    """On small models the operators cost less than the layers (vgg-tiny: 4.8 vs 11.6 device-ms):
    the layers' work bound would not hold for an operator placement, which is priced per operator."""
    w = workload("vgg-tiny", "fddps-8xp100", batch=32, operators="optional")
    bound = lower_bound(w.request.costs, 32)
    assert bound.binding == "operators" and bound.operator_work_s < bound.work_s
    assert bound.iteration_s == pytest.approx(bound.operator_work_s / 8)
    plan = make_plan(w.request, "fddps-nosplit")
    assert plan.prediction.feasible
    compute = simulate_plan(plan, w.request.costs).split.compute_s
    assert bound.work_s / 8 > compute >= bound.iteration_s * (1 - 1e-9)  # below the layers' bound, above W_op / n


def test_memory_binds_where_the_budget_forces_recomputation():
    w = workload("gpt2-tiny", "galvatron-8xtitan", batch=64, memory="0.505GiB", seq_len=512)
    bound = lower_bound(w.request.costs, 64)
    assert bound.binding == "memory" and bound.iteration_s > 1.3 * bound.work_s / bound.n_devices
    assert bound.micro_batch < 64 and "memory binds" in bound.describe()
    free = lower_bound(workload("gpt2-tiny", "galvatron-8xtitan", batch=64, seq_len=512).request.costs, 64)
    assert free.binding == "work" and free.iteration_s == pytest.approx(free.work_s / free.n_devices)
