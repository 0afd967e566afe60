"""Planning at the sizes people plan (issue 31, item 5): what keeps a comparison at 1,024 GPUs
within its minute, checked on small requests: the vectorised layout ranks equal the per-position
ones, the searches offer their best plans as they go, and the operator placements are bounded."""

from __future__ import annotations

import itertools
import os

import pytest

from paraplan.costs.slice_gather import context_rank, data_rank, layout_ranks, slice_gather_fraction
from paraplan.planners import progress
from paraplan.planners.fddps.planner import MAX_PLACEMENT_DEVICES
from paraplan.planners.registry import make_plan
from paraplan.plans.plan import LayerStrategy
from paraplan.workload import workload

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _strategies(n: int):
    for dp, sdp, tp, cp in itertools.product((1, 2, 4), repeat=4):
        if dp * sdp * tp * cp == n:
            for order in ("tp,sdp,dp", "dp,sdp,tp", "sdp,tp,dp"):
                yield LayerStrategy(dp=dp, sdp=sdp, tp=tp, cp=cp, order=order)


def test_the_vectorised_layout_ranks_are_the_per_position_ones():
    for n in (4, 8, 16):
        strategies = list(_strategies(n))
        assert strategies
        for s in strategies:
            data, context = layout_ranks(s)
            assert list(data) == [data_rank(s, p) for p in range(n)]
            assert list(context) == [context_rank(s, p) for p in range(n)]


def _slow_fraction(a: LayerStrategy, b: LayerStrategy) -> float:
    """The per-position definition (before the vectorisation), as a reference."""
    def overlap(x, y):
        return max(0.0, min(x[1], y[1]) - max(x[0], y[0]))
    worst = 0.0
    for p in range(a.degree):
        held, need = [], []
        for st, out in ((a, held), (b, need)):
            r, c = data_rank(st, p), context_rank(st, p)
            out += [(r / st.data_degree, (r + 1) / st.data_degree), (c / st.cp, (c + 1) / st.cp)]
        worst = max(worst, 1 / (b.data_degree * b.cp) - overlap(held[0], need[0]) * overlap(held[1], need[1]))
    return worst if worst > 1e-12 else 0.0


def test_slice_gather_fractions_are_unchanged_by_the_vectorisation():
    strategies = list(_strategies(8))
    for a, b in itertools.product(strategies, repeat=2):
        assert slice_gather_fraction(a, b) == pytest.approx(_slow_fraction(a, b), abs=1e-12)


def test_galvatron_offers_its_best_plan_as_it_searches():
    progress.reset()
    w = workload("gpt2-tiny", "galvatron-8xtitan", batch=16)
    plan = make_plan(w.request, "galvatron-base")
    offered, where = progress.best()
    assert offered is not None and ("pipeline degrees searched" in where or "portfolio" in where)
    assert plan.prediction.feasible


def test_operator_placements_are_bounded_on_large_clusters_and_say_so():
    n = 9 * 8
    w = workload("gpt2-tiny", f"dgx-a100-80gb?nodes={n // 8}", batch=8, operators="optional")
    plan = make_plan(w.request, "heft")
    assert max(p.device for p in plan.operators) < MAX_PLACEMENT_DEVICES
    assert f"places operators on {MAX_PLACEMENT_DEVICES} of the {n} devices" in plan.search.note


@pytest.mark.parametrize("gpus", [64, 256, 1024])
def test_the_example_clusters_are_the_a100_preset_at_their_size(gpus):
    """examples/a100-80gb-x{64,256,1024}.toml (the 70B-like comparison's clusters) are the preset's
    machine: a copy that drifted from a refitted preset would plan on other numbers."""
    from pathlib import Path

    from paraplan.hardware import load_cluster

    root = Path(__file__).resolve().parents[2]
    example = load_cluster(str(root / "examples" / f"a100-80gb-x{gpus}.toml"))
    preset = load_cluster(f"dgx-a100-80gb?nodes={gpus // 8}")
    assert example.n_devices == gpus
    assert example.nodes == preset.nodes and example.default_precision == preset.default_precision


def test_a_placement_out_of_its_reach_is_skipped_before_it_starts_with_its_reason():
    """An operator placement whose operators x devices at its fastest measured rate per pair would
    outlast the comparison's time limit is skipped, its reason in the row; within the limit it runs."""
    from paraplan.planners.auto import skip_reason

    w = workload("gpt2-tiny", "dgx-a100-80gb?nodes=8", batch=8, operators="required")
    pairs = w.costs.operators.n_nodes * MAX_PLACEMENT_DEVICES  # 64 of the 64 devices
    assert skip_reason("fddps", w.request, time_limit_s=60.0) is None
    reason = skip_reason("fddps", w.request, time_limit_s=pairs * 4.9e-6 / 2)
    assert reason.startswith(f"out of an operator placement's reach: {w.costs.operators.n_nodes:,} operators x 64 "
                             f"devices = {pairs:,} pairs") and "\n" not in reason
    assert skip_reason("heft", w.request, time_limit_s=pairs * 4.9e-6 / 2) is None  # 1.1 us a pair: within
    assert skip_reason("megatron-grid", w.request, time_limit_s=1e-9) is None  # no reach rule: it always runs


@pytest.mark.parametrize("name", ["heft", "fddps"])
def test_the_placement_memory_bound_is_never_above_a_placements_peaks(name):
    """costs/op_memory.py `least_held_bytes` bounds the devices' peaks summed of any placement from
    below (what the reach rule below relies on): checked against real placements' simulated peaks."""
    from paraplan.costs.op_memory import least_held_bytes

    w = workload("gpt2-tiny", "galvatron-8xtitan", batch=8, operators="required")
    plan = make_plan(w.request, name)
    peaks = sum(m.peak_bytes - w.costs.memory.reserve_bytes for m in plan.prediction.memory)
    bound = least_held_bytes(w.costs.operators, 8)
    assert 0 < bound <= peaks
    assert bound > 0.3 * peaks  # and not a vacuous one (FD-DPS's split parts each hold their weights: more)


def test_a_placement_that_cannot_fit_is_skipped_before_it_starts_and_would_not_have_fitted():
    """A method that cannot fit the model is skipped with its reason (issue 51 item 2): an operator
    placement holds the states and the forward's saved outputs of the whole batch at once; where
    those exceed its devices' memory together, the row says so, and running it anyway finds no
    placement that fits."""
    from paraplan.costs.op_memory import least_held_bytes
    from paraplan.planners.auto import skip_reason

    w = workload("gpt2-tiny", "galvatron-8xtitan", batch=8, operators="required")
    need = least_held_bytes(w.costs.operators, 8)
    small = workload("gpt2-tiny", "galvatron-8xtitan", batch=8, operators="required",
                     memory=int(need / 8 * 0.9))
    reason = skip_reason("fddps", small.request)
    assert reason.startswith("cannot fit: an operator placement runs the whole batch of 8") and "\n" not in reason
    assert not make_plan(small.request, "heft").prediction.feasible
    roomy = workload("gpt2-tiny", "galvatron-8xtitan", batch=8, operators="required", memory=int(need + 2 * w.costs.memory.reserve_bytes))
    assert skip_reason("fddps", roomy.request) is None


def test_a_row_too_large_to_time_that_does_not_fit_keeps_its_memory_verdict(monkeypatch):
    """The comparison's row of a plan that does not fit and whose timeline would be larger than
    comparison_rows.ROW_TIMELINE_TASKS carries the memory's verdict alone (CSIMD at 1,024 GPUs: 1.3 million
    tasks, 16 s, for a plan 21,000 GiB over): the same peaks and reason, no time; below the limit,
    or when the plan fits, the row is simulated as before."""
    from paraplan.planners import comparison_rows

    w = workload("gpt2-tiny", "galvatron-8xtitan", batch=64, memory="1MiB")
    plan = make_plan(w.request, "even", predict=False)
    timed = comparison_rows.row_of("even", plan, w.request.costs, 0.0)
    assert timed.status == "infeasible" and timed.iteration_s is not None
    monkeypatch.setattr(comparison_rows, "ROW_TIMELINE_TASKS", 0)
    untimed = comparison_rows.row_of("even", plan, w.request.costs, 0.0)
    assert untimed.status == "infeasible" and untimed.iteration_s is None and untimed.split is None
    assert untimed.peak_bytes == timed.peak_bytes and untimed.capacity_bytes == timed.capacity_bytes
    assert untimed.reason == timed.reason + "; its timeline not simulated (it does not fit)"
    roomy = workload("gpt2-tiny", "galvatron-8xtitan", batch=64)
    fits = comparison_rows.row_of("even", make_plan(roomy.request, "even", predict=False), roomy.request.costs, 0.0)
    assert fits.status == "ok" and fits.iteration_s is not None


def test_a_planner_of_few_devices_is_skipped_where_their_least_work_outlasts_a_plan_found():
    """Bi-Partition and PipeDream's layer-wise partition run one worker a device (at most 2L and L):
    before either starts, a plan already found that is faster than their devices' least work alone
    (planners/skips.py) skips it, its reason in the row; the bound holds for the plan it would have made."""
    from paraplan.planners.auto import Row
    from paraplan.planners.bound import lower_bound
    from paraplan.planners.skips import cannot_beat

    w = workload("gpt2-tiny", "dgx-a100-80gb?nodes=8", batch=64)
    n_layers = w.request.n_layers
    assert 2 * n_layers < 64  # the method cannot use every device here
    bound = lower_bound(w.costs, 64)
    least = bound.work_s / (2 * n_layers)
    fast = Row(planner="megatron-grid", status="ok", iteration_s=0.9 * least)
    slow = Row(planner="megatron-grid", status="ok", iteration_s=1.1 * least)
    unfit = Row(planner="dp", status="infeasible", iteration_s=0.1 * least)
    reason = cannot_beat("bipartition", w.request, bound, [slow, fast, unfit])
    assert reason.startswith(f"cannot beat megatron-grid's plan ({0.9 * least:.4g} s): its plans use at most "
                             f"{2 * n_layers} of the 64 devices") and "\n" not in reason
    assert cannot_beat("bipartition", w.request, bound, [slow, unfit]) is None  # it might still win
    assert cannot_beat("bipartition", w.request, bound, []) is None  # nothing to beat yet
    assert cannot_beat("pipedream-layerwise", w.request, bound, [slow]) is not None  # L devices: 2x the work each
    assert cannot_beat("megatron-grid", w.request, bound, [fast]) is None  # every device: never skipped so
    for name, n in (("bipartition", 2 * n_layers), ("pipedream-layerwise", n_layers)):
        plan = make_plan(w.request, name)
        assert len(set(plan.devices)) <= n
        assert plan.prediction.iteration_s >= bound.work_s / n
