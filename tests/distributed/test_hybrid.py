"""Plans with per-layer strategies (Galvatron-BMW) on real gloo processes, against one process of
the same model, data and seed: after 3 steps, losses and every parameter (gathered from its shards)
within 1e-5 relative (against max(|reference|, 1e-3): see tests/distributed/test_any_model.py).
SGD, as in test_runtime.py: Adam turns rounding noise in zero gradients into full-size steps."""

import json

import pytest
import torch

from paraplan.plan.plan import LayerRange, Plan, Stage
from paraplan.plan.plan import LayerStrategy as S
from paraplan.runtime.launch import spawn
from paraplan.runtime.reference import reference_run
from paraplan.runtime.worker import TrainConfig


def _plan(model, stages, n_layers=6, batch=8, micro=2, schedule="1f1b"):
    return Plan(model=model, cluster="local", n_layers=n_layers, global_batch=batch, n_micro=micro,
                schedule=schedule, grad_sync="none", stages=stages)


def _one_stage(model, strategies, world):
    return _plan(model, (Stage(LayerRange(0, len(strategies)), tuple(range(world)), strategies=tuple(strategies)),))


def check_against_one_process(tmp_path, plan, world, **kw):
    config = TrainConfig(plan=plan, model=plan.model, steps=3, out_dir=str(tmp_path), dropout=False,
                         optimizer="sgd", lr=0.1, **kw)
    spawn(config, world)
    losses = json.loads((tmp_path / "losses.json").read_text())
    ref_losses, ref_params = reference_run(config)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    seen = set()
    for s in range(plan.n_stages):
        for name, value in torch.load(tmp_path / f"stage{s}.pt").items():
            ref = ref_params[name]
            assert value.shape == ref.shape, name
            assert float((value - ref).norm() / ref.norm().clamp_min(1e-3)) < 1e-5, name
            seen.add(name)
    assert seen == set(ref_params)  # every parameter of the model was checked
    assert losses[-1] != losses[0]
    return [json.loads((tmp_path / f"memory_rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-tiny"])
def test_sharded_data_parallel_on_two_ranks(tmp_path, model):
    """(a) SDP2 on every layer: FSDP2; GPT-2's tied embedding and head are one FSDP2 unit."""
    memory = check_against_one_process(tmp_path, _one_stage(model, [S(sdp=2)] * 6, 2), 2)
    full = check_states_of_one_process(model)
    for m in memory:  # each rank holds half of the parameters (and their gradients)
        assert m["params"] == pytest.approx(full / 2, rel=0.02)


def check_states_of_one_process(model):
    from paraplan.runtime.materialize import build_layers

    _, layers, _ = build_layers(model)
    seen = {}
    for _, _, m in layers:
        for p in m.parameters():
            seen[id(p)] = p.numel() * 4
    return sum(seen.values())


def test_two_stages_with_different_strategies_and_checkpointing(tmp_path):
    """(d) 2 stages x 2 devices, DP / SDP / CKPT mixed in each stage, Slice-Gather between them,
    the tied GPT-2 weight across stages, gradient clipping over the sharded layers."""
    stages = (Stage(LayerRange(0, 3), (0, 1), strategies=(S(dp=2), S(sdp=2, checkpoint=True), S(dp=2))),
              Stage(LayerRange(3, 6), (2, 3), strategies=(S(sdp=2), S(dp=2, checkpoint=True), S(dp=2))))
    check_against_one_process(tmp_path, _plan("gpt2-tiny", stages), 4, clip_norm=0.05)


def test_hybrid_sharding_in_both_layouts_on_four_ranks(tmp_path):
    """DP2 x SDP2 (HSDP) with sdp inner-most, then with dp inner-most."""
    strategies = [S(dp=2, sdp=2)] * 3 + [S(dp=2, sdp=2, order="dp,sdp,tp")] * 3
    check_against_one_process(tmp_path, _one_stage("llama-tiny", strategies, 4), 4)


def test_checkpointing_lowers_the_measured_activations_as_predicted(tmp_path):
    """The same SDP2 plan with and without CKPT on every block: the measured saved activations drop,
    and by about what the memory model predicts."""
    from paraplan.costs.memory import plan_memory
    from paraplan.models import measure, source

    spec = measure.measure(source.build("gpt2-tiny"))
    measured, predicted = {}, {}
    for ckpt in (False, True):
        strategies = [S(dp=2)] + [S(dp=2, checkpoint=ckpt)] * 4 + [S(dp=2)]
        plan = _one_stage("gpt2-tiny", strategies, 2)
        out = tmp_path / str(ckpt)
        out.mkdir()
        config = TrainConfig(plan=plan, model=plan.model, steps=2, out_dir=str(out), dropout=False)
        spawn(config, 2)
        measured[ckpt] = json.loads((out / "memory_rank0.json").read_text())["activations"]
        _, breakdowns = plan_memory(plan, spec, {0: 2**34, 1: 2**34}, device_kind="cpu-core")
        predicted[ckpt] = breakdowns[0].activation_bytes
    assert measured[True] < 0.6 * measured[False]
    saved_measured, saved_predicted = measured[False] - measured[True], predicted[False] - predicted[True]
    assert saved_measured == pytest.approx(saved_predicted, rel=0.25)
