"""Simulating real plans: the wiring from Plan to tasks agrees with the closed forms."""

from dataclasses import replace

import numpy as np
import pytest

from paraplan.costs import closed_forms as cf
from paraplan.costs.model import analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, PlanError, Stage
from paraplan.simulator.engine import KINDS
from paraplan.simulator.predict import simulate_plan


@pytest.fixture(scope="module")
def gpt2():
    spec = measure.measure(zoo.build("gpt2-large"))
    return spec, analytic_cost_model(spec, load_cluster("csimd-v100-1gbe"))


def _plan(spec, cuts, schedule="gpipe", n_micro=8, batch=64, devices=None, grad_sync="none"):
    bounds = [0, *cuts, spec.n_layers]
    devices = devices or [(i,) for i in range(len(bounds) - 1)]
    return Plan(model=spec.name, cluster="csimd-v100-1gbe", n_layers=spec.n_layers, global_batch=batch,
                n_micro=n_micro, schedule=schedule, grad_sync=grad_sync,
                stages=tuple(Stage(LayerRange(a, b), d) for a, b, d in zip(bounds[:-1], bounds[1:], devices, strict=True)))


def test_simulated_gpipe_plan_equals_csimd_eq8(gpt2):
    spec, cm = gpt2
    costs = cm.compute(0)
    micro = 8.0
    h_p, j_p, _, _ = costs.arrays(micro)  # forward and backward compute per layer
    link = cm.cluster.link(0, 1)
    h_m = np.array([link.transfer_s(layer.output_bytes.at(micro)) for layer in spec.layers])
    # j_m[k]: the gradient of layer k's input, i.e. of layer k-1's output
    j_m = np.array([0.0] + [link.transfer_s(layer.output_grad_bytes.at(micro)) for layer in spec.layers[:-1]])
    for cuts in ([9, 18, 27], [5, 30], [20]):
        sim = simulate_plan(_plan(spec, cuts), cm)
        closed = cf.csimd_eq8(h_p, h_m, j_p, j_m, [c - 1 for c in cuts], 8)
        assert sim.prediction.iteration_s == pytest.approx(closed, rel=1e-9)
        assert sim.prediction.throughput_samples_per_s == pytest.approx(64 / closed)


def test_1f1b_uses_less_memory_and_async_is_no_slower(gpt2):
    spec, cm = gpt2
    g = simulate_plan(_plan(spec, [9, 18, 27]), cm)
    o = simulate_plan(_plan(spec, [9, 18, 27], schedule="1f1b"), cm)
    a = simulate_plan(_plan(spec, [9, 18, 27], schedule="async-1f1b"), cm)
    assert o.prediction.memory[0].peak_bytes < g.prediction.memory[0].peak_bytes
    assert a.prediction.iteration_s <= o.prediction.iteration_s * (1 + 1e-9)
    assert 0 < g.bubble_fraction < 1


def test_bipartition_backward_ranges_are_what_runs(gpt2):
    spec, cm = gpt2
    plan = _plan(spec, [19], schedule="1f1b")
    bi = replace(plan, stages=(replace(plan.stages[0], backward_layers=LayerRange(0, 15)),
                               replace(plan.stages[1], backward_layers=LayerRange(15, spec.n_layers))))
    sim = simulate_plan(bi, cm)
    tl = sim.timeline
    backward = tl.kind == KINDS.index("backward")
    assert set(zip(tl.device[backward], tl.layer_start[backward], tl.layer_stop[backward], strict=True)) == {
        (0, 0, 15), (1, 15, spec.n_layers)}
    forward = tl.kind == KINDS.index("forward")
    assert set(zip(tl.device[forward], tl.layer_start[forward], strict=True)) == {(0, 0), (1, 19)}


def test_gropipe_groups_all_reduce_per_stage():
    spec = measure.measure(zoo.build("resnet-50"))
    cm = analytic_cost_model(spec, load_cluster("gropipe-8xt4"))
    cuts = [0, 5, 10, 14, 18]
    base = Plan(model="resnet-50", cluster="gropipe-8xt4", n_layers=18, global_batch=256, n_micro=8, schedule="1f1b",
                grad_sync="gropipe-delayed",
                stages=tuple(Stage(LayerRange(cuts[i], cuts[i + 1]), (i, i + 4)) for i in range(4)))
    sims = {mode: simulate_plan(replace(base, grad_sync=mode), cm) for mode in
            ("none", "gropipe-delayed", "after-backward", "bucketed")}
    tl = sims["gropipe-delayed"].timeline
    groups = {tl.groups[i] for i in np.flatnonzero(tl.kind == KINDS.index("allreduce"))}
    assert groups == {(0, 4), (1, 5), (2, 6), (3, 7)}
    t = {mode: s.prediction.iteration_s for mode, s in sims.items()}
    assert t["none"] < t["gropipe-delayed"] <= t["after-backward"]
    assert t["bucketed"] <= t["after-backward"]


def test_hybrid_strategies_cost_what_galvatron_says():
    spec = measure.measure(zoo.build("bert-huge-32"))
    cm = analytic_cost_model(spec, load_cluster("galvatron-8xtitan"))
    n = spec.n_layers

    def one_stage(strategy, batch=8):
        return Plan(model=spec.name, cluster="galvatron-8xtitan", n_layers=n, global_batch=batch, n_micro=1,
                    schedule="gpipe", grad_sync="none",
                    stages=(Stage(LayerRange(0, n), tuple(range(8)), strategies=(strategy,) * n),))

    dp = simulate_plan(one_stage(LayerStrategy(dp=8)), cm).prediction
    tp = simulate_plan(one_stage(LayerStrategy(tp=8)), cm).prediction
    sdp = simulate_plan(one_stage(LayerStrategy(sdp=8)), cm).prediction
    ckpt = simulate_plan(one_stage(LayerStrategy(dp=8, recompute="full")), cm).prediction
    # the compute of 8 samples spread 8 ways is the same; what differs is communication
    assert tp.iteration_s > dp.iteration_s  # activations all-reduced on every layer over PCIe
    assert sdp.iteration_s > dp.iteration_s  # weights gathered for each pass
    assert ckpt.iteration_s > dp.iteration_s  # the forward runs twice
    # memory: sdp and tp shard the model states 8 ways, checkpointing drops activations
    assert sdp.memory[0].peak_bytes < dp.memory[0].peak_bytes
    assert ckpt.memory[0].peak_bytes < dp.memory[0].peak_bytes


def test_plans_that_do_not_fit_the_world(gpt2):
    spec, cm = gpt2
    with pytest.raises(PlanError, match="uses device 9"):
        simulate_plan(_plan(spec, [20], devices=[(0,), (9,)]), cm)
    # plain stages may differ in width (tests/unit/test_unequal_widths.py); stages of per-layer
    # strategies may not yet
    uneven = _plan(spec, [20], devices=[(0, 1), (2,)])
    assert simulate_plan(uneven, cm).plan.prediction.iteration_s > 0
    layered = replace(uneven, stages=tuple(replace(s, strategies=(LayerStrategy(dp=len(s.devices)),) * len(s.layers))
                                           for s in uneven.stages))
    with pytest.raises(PlanError, match="per-layer strategies on different numbers of devices"):
        simulate_plan(layered, cm)
