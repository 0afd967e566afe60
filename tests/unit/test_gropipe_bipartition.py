"""GroPipe (AMPA, grouped search) and Bi-Partition on hand-made instances and real models."""

import itertools
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paraplan_process import run_paraplan

from paraplan.costs.model import analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.planners.bipartition.dp import bipartition
from paraplan.planners.bipartition.planner import plan_bipartition
from paraplan.planners.gropipe.planner import ampa, normalise, plan_gropipe
from paraplan.planners.registry import simulator_judge
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import validate


def _request(cm, model, cluster, batch, **kw):
    return PlanRequest(costs=cm, model_name=model, cluster_name=cluster, batch=batch, **kw)

FREE = lambda a, b: 0.0  # noqa: E731


def test_bipartition_worked_example():
    # Bi-Partition §3: F = {1, 3, 2, 3}, B = {2, 6, 4, 6}, 3 workers, free communication
    bi = bipartition([1, 3, 2, 3], [2, 6, 4, 6], FREE, 3)
    lw = bipartition([1, 3, 2, 3], [2, 6, 4, 6], FREE, 3, layerwise=True)
    assert lw.bottleneck_s == 12 and bi.bottleneck_s == 9
    # D1 = {F1}, {B1, B2}; D2 = {F2, F3}, {B3}; D3 = {F4}, {B4}
    assert [(w.forward, w.backward) for w in bi.workers] == [((0, 1), (0, 2)), ((1, 3), (2, 3)), ((3, 4), (3, 4))]


def _brute_bipartition(f, b, m, cut):
    n = len(f)
    best = float("inf")
    for fc in itertools.combinations(range(n - 1), m - 1):
        for bc in itertools.combinations(range(n - 1), m - 1):
            fb, bb = [0, *[c + 1 for c in fc], n], [0, *[c + 1 for c in bc], n]
            worst = max(sum(f[fb[i]:fb[i + 1]]) + sum(b[bb[i]:bb[i + 1]]) for i in range(m))
            worst = max([worst] + [cut(fc[i], bc[i]) for i in range(m - 1)])
            best = min(best, worst)
    return best


def test_bipartition_with_non_empty_ranges_is_optimal():
    # every worker with both ranges non-empty (allow_empty=False) against brute force; empty ranges,
    # every worker count and Algorithm 2's binary search are checked in test_bipartition_dp.py
    rng = np.random.default_rng(0)
    for _ in range(60):
        n, m = int(rng.integers(2, 7)), int(rng.integers(1, 4))
        m = min(m, n)
        f, b = rng.uniform(1, 5, n), rng.uniform(1, 10, n)
        a = rng.uniform(0, 3, n)
        cut = lambda s1, s2: (a[s1] if s1 is not None else 0.0) + (a[s2] if s2 is not None else 0.0)  # noqa: E731
        exact = bipartition(f, b, cut, m, allow_empty=False).bottleneck_s
        assert exact == pytest.approx(_brute_bipartition(f, b, m, cut))
        # the layer-wise partition is a special case, never better; empty ranges never worse
        assert exact <= bipartition(f, b, cut, m, layerwise=True).bottleneck_s
        assert bipartition(f, b, cut, m).bottleneck_s <= exact * (1 + 1e-12)


def test_bipartition_respects_memory():
    # worker 0 may hold at most 2 layers' worth of forward range
    def fits(w, fr, br):
        return w != 0 or fr[1] - fr[0] <= 1

    d = bipartition([5, 1, 1, 1], [5, 1, 1, 1], FREE, 2, fits=fits)
    assert d.workers[0].forward[1] - d.workers[0].forward[0] <= 1


def test_ampa_isolates_a_dominant_layer_and_keeps_a_balanced_split():
    assert ampa([1, 1, 1, 1, 1, 1, 1, 10], 4)[-1] == 1  # the heavy layer ends up alone
    assert ampa([5.0] * 8, 4) == (2, 2, 2, 2)
    assert sum(ampa([3, 1, 4, 1, 5, 9, 2, 6], 3)) == 8


@settings(deadline=None, max_examples=150)
@given(st.lists(st.sampled_from([0.0, 0.0, 1e-9, 1.0, 1.0, 7.5, 1e9]), min_size=1, max_size=12), st.integers(1, 14))
def test_ampa_ends_with_a_valid_split_on_zeros_ties_and_huge_ratios(times, k):
    if k > len(times):
        with pytest.raises(ValueError):
            ampa(times, k)
        return
    sizes = ampa(times, k)
    assert len(sizes) == k and sum(sizes) == len(times) and min(sizes) >= 1


def test_ampa_never_worse_than_the_even_split():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n, k = int(rng.integers(2, 20)), int(rng.integers(1, 6))
        k = min(k, n)
        t = rng.uniform(0.1, 10, n)
        sizes = ampa(t, k)
        assert sum(sizes) == n and len(sizes) == k and min(sizes) >= 1
        base, extra = divmod(n, k)
        even = [base + (1 if i < extra else 0) for i in range(k)]

        def bottleneck(sz):
            b = np.concatenate(([0], np.cumsum(sz)))
            return max(t[b[i]:b[i + 1]].sum() for i in range(k))

        assert bottleneck(sizes) <= bottleneck(even) + 1e-12


def test_normalisation_is_eq9():
    assert np.allclose(normalise([2.0, 4.0, 6.0]), [0.0, 0.5, 1.0])


@pytest.fixture(scope="module")
def resnet():
    spec = measure.measure(zoo.build("resnet-50"))
    return analytic_cost_model(spec, load_cluster("gropipe-8xt4"))


def test_gropipe_search_covers_shapes_and_picks_the_fastest(resnet):
    request = _request(resnet, "resnet-50", "gropipe-8xt4", 256)
    plan, table = plan_gropipe(request, simulator_judge(request), micro_batches=(1, 4, 8),
                               shapes=[(2, 4), (4, 2), (8, 1)])
    validate(plan)
    assert {(r["groups"], r["stages"]) for r in table} == {(2, 4), (4, 2), (8, 1)}
    assert plan.prediction.iteration_s == pytest.approx(min(r["iteration_s"] for r in table))
    # pure data parallelism syncs as DDP does (bucketed), pipelines with GroPipe's delayed all-reduce
    assert {r["grad_sync"] for r in table if r["stages"] == 1} == {"bucketed"}
    assert {r["grad_sync"] for r in table if r["stages"] > 1} == {"gropipe-delayed"}
    # replica r of the pipeline is devices[r] of every stage
    assert sorted(d for s in plan.stages for d in s.devices) == list(range(8))


def test_bipartition_plans_run_in_the_simulator():
    spec = measure.measure(zoo.build("alexnet", image_size=64))
    cm = analytic_cost_model(spec, load_cluster("bipartition-7vm"))
    request = _request(cm, "alexnet", "bipartition-7vm", 64, n_stages=4)
    bi, table = plan_bipartition(request, simulator_judge(request))
    lw, _ = plan_bipartition(request, simulator_judge(request), layerwise=True)
    validate(bi), validate(lw)
    assert bi.schedule == "1f1b" and all(s.backward_layers is not None for s in bi.stages)
    # every worker count up to 4 and every micro-batch count (>= workers) dividing 64 was judged
    assert {r["workers"] for r in table} == {1, 2, 3, 4}
    assert bi.prediction.iteration_s == min(r["iteration_s"] for r in table if r["feasible"])
    assert all(s.backward_layers is None for s in lw.stages)


ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


@pytest.mark.parametrize("args", [
    ("--model", "resnet-50", "--cluster", "gropipe-8xt4", "--batch", "256", "--planner", "gropipe"),
    ("--model", "lenet-5", "--cluster", "bipartition-7vm", "--batch", "64", "--planner", "bipartition"),
])
def test_plan_cli_for_gropipe_and_bipartition(tmp_path, args):
    out = tmp_path / "plan.json"
    res = run_paraplan("plan", *args, "--out", str(out), "--json",
                         env=ENV, timeout=300)
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["prediction"]["iteration_s"] > 0
