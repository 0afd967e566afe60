"""Bi-Partition as a planner: every worker count, empty ranges in the Plan, one memory truth with the
simulator, and the transfers between a layer's forward and backward owners (each failed before)."""

from dataclasses import replace

import pytest

from paraplan.costs.memory import stage_memory
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.model import analytic_cost_model
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.planners.bipartition.planner import plan_bipartition, worker_memory
from paraplan.planners.registry import simulator_judge
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import LayerRange, Plan, PlanError, Stage, validate
from paraplan.plans.plan_file import plan_from_json, plan_to_json
from paraplan.simulator.predict import simulate_plan


def _cm(model, cluster, **build):
    return analytic_cost_model(measure.measure(zoo.build(model, **build)), load_cluster(cluster))


def _plan(cm, name, batch, **kw):
    request = PlanRequest(costs=cm, model_name=name, cluster_name=cm.cluster.name, batch=batch, **kw)
    return plan_bipartition(request, simulator_judge(request), **{k: v for k, v in kw.items() if k == "layerwise"})


def test_expensive_links_make_one_worker_the_best():
    # LeNet-5 on the paper's 7 VMs (11.75 MB/s): the 5-worker plan simulated at 56.8 ms, one worker at 6.4 ms
    cm = _cm("lenet-5", "bipartition-7vm")
    request = PlanRequest(costs=cm, model_name="lenet-5", cluster_name="bipartition-7vm", batch=64)
    plan, table = plan_bipartition(request, simulator_judge(request))
    one = min(r["iteration_s"] for r in table if r["workers"] == 1)
    assert plan.prediction.iteration_s <= one * (1 + 1e-12)
    assert plan.n_stages == 1


def _bi_plan(stages, n_layers=5, n_micro=4):
    return Plan(model="lenet-5", cluster="bipartition-7vm", n_layers=n_layers, global_batch=16, n_micro=n_micro,
                schedule="1f1b", grad_sync="none",
                stages=tuple(Stage(LayerRange(*f), (i,), backward_layers=LayerRange(*b))
                             for i, (f, b) in enumerate(stages)))


def test_empty_ranges_are_plans_that_validate_simulate_and_round_trip():
    # worker 1 runs only the backward of layers 1..2; worker 0 only forwards 0..2
    plan = validate(_bi_plan([((0, 3), (0, 1)), ((3, 3), (1, 3)), ((3, 5), (3, 5))]))
    assert plan_from_json(plan_to_json(plan)) == plan
    sim = simulate_plan(plan, _cm("lenet-5", "bipartition-7vm"))
    # worker 1 computes only backwards: its compute stream holds no forward
    assert not [r for r in sim.timeline.rows() if r[0] == 1 and r[2] == "forward" and r[6] - r[5] > 1e-9]
    with pytest.raises(PlanError, match=r"stages\[1\]: both the forward and the backward range are empty"):
        validate(_bi_plan([((0, 3), (0, 3)), ((3, 3), (3, 3)), ((3, 5), (3, 5))]))


def test_forward_and_backward_owners_exchange_activations_and_weights():
    cm = _cm("lenet-5", "bipartition-7vm")
    # layer 2: forward on worker 0, backward on worker 1; the paper's scheme (the runtime's:
    # tests/unit/test_bipartition_recompute.py)
    plan = replace(_bi_plan([((0, 3), (0, 2)), ((3, 5), (2, 5))]), split_layers="send-activations")
    sim = simulate_plan(plan, cm)
    rows = list(sim.timeline.rows())
    micro = plan.global_batch / plan.n_micro
    link = cm.cluster.link(0, 1)
    sends = [r for r in rows if r[2] == "send_activation" and r[1] == "send"]
    assert len(sends) == plan.n_micro and all(r[0] == 0 for r in sends)
    expected = link.transfer_s(cm.model.layers[2].saved_bytes.at(micro))
    assert all(r[6] - r[5] == pytest.approx(expected, rel=1e-9) for r in sends)
    weights = [r for r in rows if r[2] == "send_weights" and r[1] == "send"]
    assert len(weights) == 1 and weights[0][0] == 1
    assert weights[0][6] - weights[0][5] == pytest.approx(link.transfer_s(cm.model.layers[2].param_bytes), rel=1e-9)
    # the same ranges without the split pay neither
    same = simulate_plan(_bi_plan([((0, 3), (0, 3)), ((3, 5), (3, 5))]), cm)
    assert not [r for r in same.timeline.rows() if r[2] in ("send_activation", "send_weights")]


@pytest.mark.parametrize("model", ["vgg-tiny", "gpt2-tiny"])  # gpt2-tiny: a tied embedding and head
def test_planner_and_simulator_count_memory_the_same_way(model):
    # VGG-tiny on 8 workers: worker 5 had 6.41 MiB by the planner (the whole span of its two ranges)
    # and 0.28 MiB by the simulator (its forward range only); both now count exactly the layers held,
    # the planner's in-flight count being the most the simulator's could be
    cm = _cm(model, "gropipe-8xt4")
    config = MemoryConfig()
    request = PlanRequest(costs=cm, model_name=model, cluster_name="gropipe-8xt4", batch=64, n_stages=8)
    plan, _ = plan_bipartition(request, simulator_judge(request), mode="paper")
    micro = plan.global_batch / plan.n_micro
    count = worker_memory(cm, micro, plan.n_micro, 8, config)
    for w, stage in enumerate(plan.stages):
        simulated = stage_memory(plan, cm.model, w, config)
        planned = count(w, (stage.layers.start, stage.layers.stop), (stage.backward.start, stage.backward.stop))
        assert planned >= simulated.peak_bytes * (1 - 1e-12)
        assert planned == pytest.approx(_count_layer_by_layer(cm, plan, w, config), rel=1e-12)
        # the same model states: only the activations' in-flight count may differ
        assert planned - simulated.peak_bytes <= simulated.activation_bytes * 8 + 1e-6


def test_layerwise_ranges_count_exactly_the_same():
    cm = _cm("vgg-tiny", "gropipe-8xt4")
    config = MemoryConfig()
    plan = _bi_plan([((0, 3), (0, 3)), ((3, 6), (3, 6)), ((6, cm.model.n_layers), (6, cm.model.n_layers))],
                    n_layers=cm.model.n_layers, n_micro=4)
    plan = replace(plan, model="vgg-tiny")
    count = worker_memory(cm, plan.global_batch / plan.n_micro, plan.n_micro, 3, config)
    for w, stage in enumerate(plan.stages):
        assert count(w, (stage.layers.start, stage.layers.stop), (stage.backward.start, stage.backward.stop)) == \
            pytest.approx(stage_memory(plan, cm.model, w, config).peak_bytes, rel=1e-12)


def _count_layer_by_layer(cm, plan, w, config):
    """The planner's count written out layer by layer (independent of its prefix sums)."""
    import math

    from paraplan.costs.strategy import layer_memory
    from paraplan.plans.plan import LayerStrategy

    stage, m_total, micro = plan.stages[w], 8, plan.global_batch / plan.n_micro
    held = set(stage.layers) | set(stage.backward)
    total = config.reserve_bytes
    for i in held:
        layer = cm.model.layers[i]
        tied = bool(layer.shared_param_bytes) and any(o not in held for o in layer.shared_owners)
        m = layer_memory(cm.model, i, LayerStrategy(), micro, config, tied)
        if i in stage.backward:
            a = w if i in stage.layers else (0 if i < stage.layers.start else w + 1)
            total += m.states_bytes + max(1, min(plan.n_micro, math.ceil(m_total - (a + w) / 2))) * m.saved_bytes
        else:
            total += m.weights_bytes
    head = cm.model.layers[-1]
    if cm.model.n_layers - 1 in stage.backward:  # the loss's backward: its gradients and the logits'
        total += head.loss_gradient_bytes.at(micro) + head.output_grad_bytes.at(micro)
    return total


def test_an_empty_backward_range_at_the_end_holds_no_loss_gradients():
    """A worker with no backward (an empty range, wherever it sits) holds none of the loss's
    gradients. The count added them for an empty range at the model's end, which a language model
    with a wide vocabulary made large enough that the memory DP stopped with a ValueError (Llama 3.1
    70B on 8 H100s) instead of answering."""
    from paraplan.costs.memory import loss_gradient_bytes
    from paraplan.plans.layer_strategy import LayerStrategy

    spec = measure.measure(zoo.build("gpt2-tiny"))
    cm = analytic_cost_model(spec, load_cluster("gropipe-8xt4"))
    n = cm.model.n_layers
    assert loss_gradient_bytes(cm.model, LayerStrategy(), 4.0) > 0
    count = worker_memory(cm, 4.0, 2, 2, MemoryConfig())
    assert count(0, (0, 1), (n, n)) == count(0, (0, 1), (0, 0))
    assert count(1, (1, n), (0, n)) - count(1, (1, n), (0, n - 1)) > 0  # the last layer's backward holds them
