"""The memory model against Galvatron-BMW Table II and hand-computed cases."""

import pytest

from paraplan.costs.memory import GIB, MemoryConfig, out_of_memory_reason, plan_memory, stage_memory
from paraplan.models import measure, zoo
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage


@pytest.fixture(scope="module")
def bert():
    return measure.measure(zoo.build("bert-huge-32"))


def _pure_dp(spec, batch, n_devices=8):
    return Plan(model=spec.name, cluster="galvatron-8xtitan", n_layers=spec.n_layers, global_batch=batch, n_micro=1,
                schedule="gpipe", grad_sync="after-backward",
                stages=(Stage(LayerRange(0, spec.n_layers), tuple(range(n_devices))),))


def _fits(plan, spec, budget_gib):
    memory, _ = plan_memory(plan, spec, {d: budget_gib * GIB for d in range(8)})
    return all(m.fits for m in memory)


def test_galvatron_table_ii_pure_data_parallel_boundaries(bert):
    # Table II: PyTorch DDP on BERT-Huge-32 with 8 GPUs is OOM at 8G and 12G, and trains a
    # global batch of 8 (one sample per GPU) at 16G -- and no more.
    assert not _fits(_pure_dp(bert, 8), bert, 8)
    assert not _fits(_pure_dp(bert, 8), bert, 12)
    assert _fits(_pure_dp(bert, 8), bert, 16)
    assert not _fits(_pure_dp(bert, 16), bert, 16)


def test_states_are_16_bytes_per_parameter_and_shard_with_sdp_and_tp(bert):
    plan = _pure_dp(bert, 8)
    b = stage_memory(plan, bert, 0)
    assert b.states_bytes == pytest.approx(16 * bert.param_count)
    sharded = Plan(**{**plan.__dict__, "stages": (Stage(LayerRange(0, bert.n_layers), tuple(range(8)),
                                                         strategies=(LayerStrategy(sdp=4, tp=2),) * bert.n_layers),)})
    assert stage_memory(sharded, bert, 0).states_bytes == pytest.approx(16 * bert.param_count / 8)


def _pipeline(spec, schedule, n_micro, n_stages=4, recompute="none"):
    cuts = [round(i * spec.n_layers / n_stages) for i in range(n_stages + 1)]
    stages = []
    for s in range(n_stages):
        rng = LayerRange(cuts[s], cuts[s + 1])
        strategies = (LayerStrategy(recompute=recompute),) * len(rng) if recompute != "none" else ()
        stages.append(Stage(rng, (s,), strategies=strategies))
    return Plan(model=spec.name, cluster="x", n_layers=spec.n_layers, global_batch=8 * n_micro, n_micro=n_micro,
                schedule=schedule, grad_sync="none", stages=tuple(stages))


def test_gpipe_keeps_every_micro_batch_and_1f1b_keeps_stages_minus_index():
    spec = measure.measure(zoo.build("gpt2-tiny"))
    g = _pipeline(spec, "gpipe", 8)
    o = _pipeline(spec, "1f1b", 8)
    assert [stage_memory(g, spec, s).in_flight for s in range(4)] == [8, 8, 8, 8]
    assert [stage_memory(o, spec, s).in_flight for s in range(4)] == [4, 3, 2, 1]
    assert stage_memory(o, spec, 0).activation_bytes < stage_memory(g, spec, 0).activation_bytes


def test_checkpointing_keeps_only_boundaries(bert):
    full = stage_memory(_pipeline(bert, "gpipe", 4), bert, 1)
    ckpt = stage_memory(_pipeline(bert, "gpipe", 4, recompute="full"), bert, 1)
    assert ckpt.activation_bytes < full.activation_bytes / 5


def test_async_1f1b_stashes_weights():
    spec = measure.measure(zoo.build("gpt2-tiny"))
    a = _pipeline(spec, "async-1f1b", 8)
    assert stage_memory(a, spec, 0).stash_bytes > 0 and stage_memory(a, spec, 3).stash_bytes == 0


def test_tied_head_on_another_stage_is_a_second_copy():
    spec = measure.measure(zoo.build("gpt2-tiny"))
    plan = _pipeline(spec, "1f1b", 4, n_stages=2)
    last = stage_memory(plan, spec, 1, MemoryConfig(reserve_bytes=0))
    head_states = 16 * (spec.layers[-1].param_count + spec.layers[-1].shared_param_bytes / 4)
    blocks_states = 16 * sum(layer.param_count for layer in spec.layers[3:5])
    assert last.states_bytes == pytest.approx(head_states + blocks_states)


def test_oom_reason_names_the_device_and_amount(bert):
    memory, _ = plan_memory(_pure_dp(bert, 8), bert, {d: 12 * GIB for d in range(8)})
    reason = out_of_memory_reason(memory)
    assert reason.startswith("device 0 out of memory by") and "of 12.00 GiB" in reason
