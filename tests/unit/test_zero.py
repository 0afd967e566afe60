"""ZeRO-1 and ZeRO-2 over a layer's data-parallel replicas (issue 29, item 3), and sequence
parallelism, in the memory model and the simulator, against the ZeRO paper's own accounting (Rajbhandari et al. 2020, §3.1, §5,
§7.2.1), written from the paper: per parameter and replica, with Adam, parameters P, gradients G
and optimizer states K bytes, N_d replicas:
    DP      P + G + K;  ZeRO-1  P + G + K/N_d;  ZeRO-2  P + (G + K)/N_d;  ZeRO-3  (P + G + K)/N_d.
paraplan's runtime keeps fp32 parameters (the master weights) and fp32 gradients: P = G = 4, K = 8
(momentum and variance). The communication: ZeRO-1/2 reduce-scatter the gradients and all-gather
the parameters, "the same communication volume as baseline data parallelism" (§7.2.1).
"""

from dataclasses import replace

import pytest

from paraplan.hardware import load_cluster
from paraplan.plans.axes import DATA, SHARDED_DATA, TENSOR
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import cost_model, measured_model

P, G, K = 4.0, 4.0, 8.0
N_D = 8


@pytest.fixture(scope="module")
def setup():
    spec = measured_model("gpt2-tiny")[1]
    return spec, cost_model(spec, load_cluster("dgx-a100-80gb"), precision="fp32")


def _plan(spec, strategy: LayerStrategy, grad_sync="after-backward") -> Plan:
    return Plan(model="gpt2-tiny", cluster="dgx-a100-80gb", n_layers=spec.n_layers, global_batch=64, n_micro=1,
                schedule="1f1b", grad_sync=grad_sync,
                stages=(Stage(LayerRange(0, spec.n_layers), tuple(range(N_D)),
                              strategies=(strategy,) * spec.n_layers),))


@pytest.mark.parametrize("strategy, per_param", [
    (LayerStrategy(dp=N_D), P + G + K),
    (LayerStrategy(dp=N_D, zero=1), P + G + K / N_D),
    (LayerStrategy(dp=N_D, zero=2), P + (G + K) / N_D),
    (LayerStrategy(sdp=N_D), (P + G + K) / N_D),
])
def test_states_per_replica_are_the_papers(setup, strategy, per_param):
    spec, cm = setup
    psi = sum(layer.param_bytes for layer in spec.layers) / spec.dtype_bytes
    memory = simulate_plan(_plan(spec, strategy), cm).memory[0]
    assert memory.states_bytes == pytest.approx(psi * per_param, rel=1e-12)


def test_zero_2_has_no_full_gradient_buckets(setup):
    spec, cm = setup
    dp, zero1, zero2 = (simulate_plan(_plan(spec, LayerStrategy(dp=N_D, zero=z), "bucketed"), cm).memory[0]
                        for z in (0, 1, 2))
    assert dp.ddp_bucket_bytes == zero1.ddp_bucket_bytes > 0 and zero2.ddp_bucket_bytes == 0


def test_zero_moves_the_same_bytes_as_data_parallelism(setup):
    """Reduce-scatter + all-gather = all-reduce on a ring: with the sync after the backward (nothing
    to overlap) and no measured optimizer cost, ZeRO-1 takes the time of plain DP. ZeRO-2 moves the
    same bytes per micro-batch, but its reduce-scatter runs as each micro-batch's backward ends
    (DeepSpeed's stage 2, runtime/layers/zero.py), overlapping the backward: never slower at one micro-batch."""
    spec, cm = setup
    times = [simulate_plan(_plan(spec, LayerStrategy(dp=N_D, zero=z)), cm).prediction.iteration_s for z in (0, 1, 2)]
    assert times[1] == pytest.approx(times[0], rel=1e-12)
    assert times[2] <= times[0]
    single = simulate_plan(replace(_plan(spec, LayerStrategy(dp=N_D)), grad_sync="none"), cm).prediction.iteration_s
    assert times[0] > single  # the sync is priced at all


def test_zero_2_reduce_scatters_every_micro_batch(setup):
    """Per micro-batch, a ZeRO-2 layer's backward carries one reduce-scatter of its gradients over
    the dp group (added in full without overlap), and leaves nothing to the end-of-step sync."""
    from paraplan.costs.collectives import ring_reducescatter_s
    from paraplan.costs.strategy import layer_time, strategy_links

    spec, cm = setup
    costs = cm.compute(0)
    plain, zero2 = LayerStrategy(dp=N_D), LayerStrategy(dp=N_D, zero=2)
    links = strategy_links(cm.cluster, zero2, tuple(range(N_D)))
    for i in range(spec.n_layers):
        a = layer_time(costs, spec, i, plain, 8.0, links[TENSOR], links[SHARDED_DATA], dp_link=links[DATA])
        b = layer_time(costs, spec, i, zero2, 8.0, links[TENSOR], links[SHARDED_DATA], dp_link=links[DATA])
        assert b.grad_allreduce_bytes == 0 and a.grad_allreduce_bytes == spec.layers[i].param_bytes
        assert b.backward_s - a.backward_s == pytest.approx(
            ring_reducescatter_s(spec.layers[i].param_bytes, N_D, links[DATA]), rel=1e-12)


def test_zero_needs_data_parallel_replicas():
    from paraplan.plans.plan import PlanError, validate

    spec_plan = Plan(model="m", cluster="c", n_layers=1, global_batch=4, n_micro=1, schedule="1f1b",
                     stages=(Stage(LayerRange(0, 1), (0, 1), strategies=(LayerStrategy(tp=2, zero=1),)),))
    with pytest.raises(PlanError, match="ZeRO-1 shards over the dp replicas, and dp is 1"):
        validate(spec_plan)


def test_sequence_parallelism_splits_what_tensor_parallelism_keeps_whole(setup):
    """Korthikanti et al. §4.2.2: with sequence parallelism the norms' and dropouts' tensors, whole
    on every tp rank under plain TP, are split tp ways too; the all-reduces become a reduce-scatter
    and an all-gather of the same tensors, the same time on a ring. As DTensor runs it (paraplan's
    runtime, torchtitan) the column-parallel linears' gathered inputs stay whole: 4 of the paper's
    10 sbh (MemoryConfig.sp_whole_share); Megatron-LM's way (share 0) splits everything."""
    from dataclasses import replace

    spec, cm = setup
    tp = simulate_plan(_plan(spec, LayerStrategy(tp=N_D)), cm)
    sp = simulate_plan(_plan(spec, LayerStrategy(tp=N_D, sequence_parallel=True)), cm)
    assert tp.memory[0].tp_replicated_bytes > 0
    assert sp.memory[0].tp_replicated_bytes == pytest.approx(cm.memory.sp_whole_share * tp.memory[0].tp_replicated_bytes)
    assert sp.memory[0].activation_bytes == tp.memory[0].activation_bytes
    assert sp.prediction.iteration_s == pytest.approx(tp.prediction.iteration_s, rel=1e-12)
    megatron = replace(cm, memory=replace(cm.memory, sp_whole_share=0.0))
    sp_megatron = simulate_plan(_plan(spec, LayerStrategy(tp=N_D, sequence_parallel=True)), megatron)
    assert sp_megatron.memory[0].tp_replicated_bytes == 0
    assert sp_megatron.memory[0].peak_bytes == pytest.approx(tp.memory[0].peak_bytes - tp.memory[0].tp_replicated_bytes)


def test_selective_recomputation_keeps_all_but_the_attention_core(setup):
    """Korthikanti et al. 2022 §5: selective recomputation drops the attention core's tensors
    (measured per layer: LayerSpec.attention_core_bytes) from what each layer keeps, holds one
    layer's core again while its backward recomputes it, and pays the core's forward again: more
    time than none, less than full recomputation; less memory than none, more than full."""
    spec, cm = setup
    core = [layer.attention_core_bytes.at(64 / N_D) for layer in spec.layers]
    assert sum(core) > 0  # GPT-2's blocks keep their s x s probabilities (meta measures the math path)
    sims = {r: simulate_plan(_plan(spec, LayerStrategy(dp=N_D, recompute=r)), cm) for r in ("none", "selective", "full")}
    none, selective, full = (sims[r].memory[0] for r in ("none", "selective", "full"))
    kept = {k: m.activation_bytes - m.recompute_bytes for k, m in (("none", none), ("selective", selective))}
    assert kept["none"] - kept["selective"] == pytest.approx(sum(core), rel=1e-9)
    assert selective.recompute_bytes == pytest.approx(max(core), rel=1e-9)
    assert full.activation_bytes < selective.activation_bytes < none.activation_bytes
    times = {r: sims[r].prediction.iteration_s for r in sims}
    assert times["none"] < times["selective"] < times["full"]


