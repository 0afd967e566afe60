"""What a real PyTorch run holds beyond model states and activations (costs/memory.py): each term
against the size its documented rule gives, on small cases, and the Table II cells it was made for."""

import pytest

from paraplan.costs.memory import GIB, MemoryConfig, plan_memory, stage_memory
from paraplan.costs.strategy import layer_memory
from paraplan.hardware import load_cluster
from paraplan.hardware.presets import local_cluster
from paraplan.models import measure, zoo
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage


@pytest.fixture(scope="module")
def tiny():
    return measure.measure(zoo.build("gpt2-tiny"))


def _group(spec, strategy, batch=8, grad_sync="none", n_devices=4):
    n = spec.n_layers
    return Plan(model=spec.name, cluster="c", n_layers=n, global_batch=batch, n_micro=1, schedule="gpipe",
                grad_sync=grad_sync,
                stages=(Stage(LayerRange(0, n), tuple(range(n_devices)), strategies=(strategy,) * n),))


def _pipeline(spec, n_stages=2, n_micro=2, batch=8):
    cuts = [round(i * spec.n_layers / n_stages) for i in range(n_stages + 1)]
    return Plan(model=spec.name, cluster="c", n_layers=spec.n_layers, global_batch=batch, n_micro=n_micro,
                schedule="gpipe", grad_sync="none",
                stages=tuple(Stage(LayerRange(cuts[s], cuts[s + 1]), (s,)) for s in range(n_stages)))


def _params(spec):
    """Parameters of every layer (the tied head's weight is owned by the embedding, on the same device)."""
    return sum(layer.param_count for layer in spec.layers)


def test_ddp_buckets_are_a_flat_copy_of_the_gradients_of_the_dp_layers(tiny):
    # rule: DDP with gradient_as_bucket_view=False (the default) copies every gradient into its
    # buckets: bucket bytes = 4 bytes x the parameters the dp group replicates
    ddp = stage_memory(_group(tiny, LayerStrategy(dp=4), grad_sync="bucketed"), tiny, 0)
    assert ddp.ddp_bucket_bytes == pytest.approx(4 * _params(tiny))
    # not DDP (another sync), or no data parallelism: no buckets
    assert stage_memory(_group(tiny, LayerStrategy(dp=4), grad_sync="after-backward"), tiny, 0).ddp_bucket_bytes == 0
    assert stage_memory(_group(tiny, LayerStrategy(tp=4), grad_sync="bucketed"), tiny, 0).ddp_bucket_bytes == 0
    # gradient_as_bucket_view=True: the buckets are the gradients
    view = stage_memory(_group(tiny, LayerStrategy(dp=4), grad_sync="bucketed"), tiny, 0,
                        MemoryConfig(ddp_bucket_fraction=0.0))
    assert view.ddp_bucket_bytes == 0


def test_ddp_buckets_count_at_the_step_not_while_the_activations_peak(tiny):
    b = stage_memory(_group(tiny, LayerStrategy(dp=4), grad_sync="bucketed"), tiny, 0)
    assert b.forward_peak_bytes == pytest.approx(b.states_bytes + b.activation_bytes + b.allocator_bytes
                                                 + b.reserve_bytes + b.loss_gradient_bytes)
    assert b.step_peak_bytes == pytest.approx(b.states_bytes + b.reserve_bytes + b.ddp_bucket_bytes)
    assert b.peak_bytes == max(b.forward_peak_bytes, b.step_peak_bytes)
    # a tiny batch: the step (gradients and buckets both alive) is the peak
    small = stage_memory(_group(tiny, LayerStrategy(dp=4), batch=4, grad_sync="bucketed"), tiny, 0)
    if small.ddp_bucket_bytes > small.activation_bytes + small.allocator_bytes:
        assert small.peak_bytes == pytest.approx(small.step_peak_bytes)


def test_the_context_is_counted_once_per_device_not_per_stage(tiny):
    plan = _pipeline(tiny, n_stages=2)
    memory, breakdown = plan_memory(plan, tiny, {0: GIB, 1: GIB})
    assert [b.reserve_bytes for b in breakdown] == [GIB // 2, GIB // 2]
    # one device holding two stages' worth of layers still has one context
    one = _pipeline(tiny, n_stages=1)
    assert stage_memory(one, tiny, 0).reserve_bytes == GIB // 2
    # a CPU has no CUDA context and no caching allocator
    cpu = plan_memory(plan, tiny, {0: GIB, 1: GIB}, device_kind="cpu-core")[1]
    assert [b.reserve_bytes for b in cpu] == [0, 0] and all(b.allocator_bytes == 0 for b in cpu)
    kinds = {slot.id: slot.spec.name for slot in local_cluster().devices}
    assert all(k.startswith("cpu") for k in kinds.values())
    gpu = load_cluster("galvatron-8xtitan").device(0).name
    assert stage_memory(plan, tiny, 0, device_kind=gpu).reserve_bytes == GIB // 2


def test_the_allocator_reserve_is_a_fraction_of_the_activations(tiny):
    plan = _pipeline(tiny, n_stages=1, n_micro=2)
    config = MemoryConfig()
    b = stage_memory(plan, tiny, 0, config)
    saved = sum(layer_memory(tiny, i, LayerStrategy(), plan.global_batch / plan.n_micro,
                             MemoryConfig(allocator_fraction=0.0)).saved_bytes for i in range(tiny.n_layers))
    assert b.activation_bytes == pytest.approx(plan.n_micro * saved)
    assert b.allocator_bytes == pytest.approx(config.allocator_fraction * b.activation_bytes)
    assert config.activation_scale == pytest.approx(1.0 + config.allocator_fraction)
    assert MemoryConfig(activation_dtype_scale=0.5, allocator_fraction=0.0).activation_scale == 0.5


def test_megatron_holds_the_norm_and_linear_inputs_whole(tiny):
    # rule (Korthikanti et al. 2022): min(saved, 4 x output) per layer is not split tp ways
    tp = 4
    plan = _group(tiny, LayerStrategy(tp=tp))
    b = stage_memory(plan, tiny, 0)
    config = MemoryConfig()
    want = sum(min(layer.saved_bytes.at(8), 4 * layer.output_bytes.at(8)) * (1 - 1 / tp) * config.activation_scale
               for layer in tiny.layers)
    assert b.tp_replicated_bytes == pytest.approx(want)
    assert stage_memory(_group(tiny, LayerStrategy(dp=4)), tiny, 0).tp_replicated_bytes == 0
    # checkpointed layers keep only their input (costs/strategy.py); nothing whole to add
    assert stage_memory(_group(tiny, LayerStrategy(tp=tp, recompute="full")), tiny, 0).tp_replicated_bytes == 0


def test_fsdp_holds_two_gathered_layers_and_one_unsharded_gradient(tiny):
    b = stage_memory(_group(tiny, LayerStrategy(sdp=4)), tiny, 0)
    sizes = sorted((layer.param_count for layer in tiny.layers), reverse=True)
    assert b.sdp_buffer_bytes == pytest.approx(4 * (sizes[0] + sizes[1]) + 4 * sizes[0])
    assert stage_memory(_group(tiny, LayerStrategy(dp=4)), tiny, 0).sdp_buffer_bytes == 0


def test_foreach_adam_temporaries_count_at_the_step_only(tiny):
    plan = _group(tiny, LayerStrategy(sdp=2, dp=2))
    loop = stage_memory(plan, tiny, 0)
    foreach = stage_memory(plan, tiny, 0, MemoryConfig(optimizer_step_bytes_per_param=4.0))
    assert loop.optimizer_step_bytes == 0
    assert foreach.optimizer_step_bytes == pytest.approx(4 * _params(tiny) / 2)  # sharded 2 ways
    assert foreach.forward_peak_bytes == pytest.approx(loop.forward_peak_bytes)


# --------------------------------------------------------------------------- Table II cells
@pytest.fixture(scope="module")
def vit():
    return measure.measure(zoo.build("vit-huge-32"))


def _max_batch(spec, strategy, budget_gib, grad_sync="none"):
    best = 0
    for batch in range(8, 400, 8):
        memory, _ = plan_memory(_group(spec, strategy, batch, grad_sync, n_devices=8), spec,
                                {d: budget_gib * GIB for d in range(8)})
        if not all(m.fits for m in memory):
            break
        best = batch
    return best


def test_table_ii_vit_huge_32_within_one_step(vit):
    # Table II: DDP 64 at 16G and 112 at 20G; Megatron 24 at 8G and 88 at 20G; FSDP 64 at 8G
    assert abs(_max_batch(vit, LayerStrategy(dp=8), 16, "bucketed") - 64) <= 8
    assert abs(_max_batch(vit, LayerStrategy(dp=8), 20, "bucketed") - 112) <= 8
    assert abs(_max_batch(vit, LayerStrategy(tp=8), 8) - 24) <= 8
    assert abs(_max_batch(vit, LayerStrategy(tp=8), 20) - 88) <= 8
    assert abs(_max_batch(vit, LayerStrategy(sdp=8), 8) - 64) <= 8


def test_the_loss_stage_peaks_with_the_losss_gradients(tiny):
    """Issue 48: the stage holding the loss peaks at the loss's backward, every layer's activations
    still held, with a gradient of each tensor the loss saved (the fp32 log-softmax: 4 bytes x
    tokens x vocabulary for a language model's cross-entropy) and the logits' own gradient."""
    plan = _pipeline(tiny, n_stages=2)
    head = tiny.layers[-1]
    assert head.loss_gradient_bytes.per_sample > 0
    first, last = stage_memory(plan, tiny, 0), stage_memory(plan, tiny, 1)
    assert first.loss_gradient_bytes == 0
    micro = plan.global_batch / plan.n_micro
    assert last.loss_gradient_bytes == pytest.approx(head.loss_gradient_bytes.at(micro) + head.output_grad_bytes.at(micro))
    assert dict(last.at_peak()[1])["the loss's gradients"] == last.loss_gradient_bytes
