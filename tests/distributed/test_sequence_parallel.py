"""Megatron sequence parallelism (runtime/layers/sequence_parallel.py) on 2 gloo ranks against one process.

Every run is a one-stage plan on ranks 0 and 1 trained by `train_rank` as `paraplan train` trains
it (tests/distributed/many.py: one launch of the ranks for all of them), 2 SGD steps without
dropout, compared with `reference_run` (one process, the same recipe):
  - fp32, every transformer block TP2+SP: GPT-2 (its embedding TP2 without SP: it adds a
    whole-sequence position embedding, refused below; the head with SP) and Llama (every layer
    with SP: the embedding's reduce-scatter, the blocks, the head); and a GPT-2 plan that enters and
    leaves SP regions in the middle of the stage (a data-parallel block between two SP ones, a
    checkpointed SP block, selective recomputation in one): parameters within 1e-5 of the reference
    (max |a - b|, and relative to the size of the update as in test_mixed_precision.py);
  - bf16, Llama with SP everywhere: within 2G of the one-process bf16 run, G its distance from the
    one-process fp32 run (test_mixed_precision.py's rule: TP and SP round each rank's partial sums to
    bf16 before the reduce-scatter, a second draw of bf16's own rounding);
  - with dropout and a sequence that does not split evenly, the ranks' generators stay in step, and
    checkpointing the SP blocks gives the same parameters (their recomputation draws the same masks);
  - that SP ran: a global forward pre-hook (installed in the ranks by the step hook) sees every
    norm's input as a Shard(1) DTensor holding 16 of the 32 positions on each rank; and the
    activations measured on rank 0 (memory_rank0.json) under TP+SP are those of TP less half of
    what SP splits, to 2%;
  - the layers SP cannot run are refused before launch in one line (no ranks).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.plan import LayerStrategy as S
from paraplan.runtime.config import TrainConfig
from paraplan.runtime.measure.reference import reference_run

from .expected import initial_parameters, predicted_memory
from .many import train_many

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SP = S(tp=2, sequence_parallel=True)
NORMS = ("LayerNorm", "LlamaRMSNorm")


def _one_stage(model, strategies, precision="fp32", n_micro=2):
    return Plan(model=model, cluster="local", n_layers=len(strategies), global_batch=8, n_micro=n_micro,
                schedule="1f1b", grad_sync="none", precision=precision,
                stages=(Stage(LayerRange(0, len(strategies)), (0, 1), strategies=tuple(strategies)),))


# name -> plan; compared with one process after 2 SGD steps
RUNS = {
    "gpt2": _one_stage("gpt2-tiny", [S(tp=2)] + [SP] * 5),
    "llama": _one_stage("llama-tiny", [SP] * 6),
    "gpt2-in-and-out": _one_stage("gpt2-tiny", [S(tp=2), SP, S(tp=2, sequence_parallel=True, recompute="full"),
                                                S(dp=2), S(tp=2, sequence_parallel=True, recompute="selective"), SP]),
    "llama-bf16": _one_stage("llama-tiny", [SP] * 6, "bf16"),
}
PROBED = ("gpt2", "llama")
# dropout on, 31 tokens (the tp ranks hold 16 and 15): the ranks' generators must stay in step
DROPOUT = _one_stage("gpt2-tiny", [S(tp=2)] + [SP] * 5)
# the same with the blocks checkpointed: their recomputation must draw the same masks
DROPOUT_CKPT = _one_stage("gpt2-tiny", [S(tp=2)] + [S(tp=2, sequence_parallel=True, recompute="full")] * 4 + [SP])
# the activations measured on rank 0, TP against TP+SP (dropout on, as the model is measured)
MEMORY = {"tp": [S(tp=2)] * 6, "sp": [S(tp=2)] + [SP] * 5}


def _norm_inputs(out_dir: str, rank: int, step: int) -> None:
    """The step hook of the probed runs: before step 0, a global forward pre-hook records how every
    norm's input is laid out; before step 1, the records of step 0 are written and the hook removed."""
    from torch.distributed.tensor import DTensor
    from torch.nn.modules.module import register_module_forward_pre_hook

    if step == 0:
        seen: dict[str, int] = {}

        def hook(module, args):
            x = args[0] if args else None
            if type(module).__name__ in NORMS and isinstance(x, torch.Tensor) and x.device.type != "meta":
                local = x.to_local() if isinstance(x, DTensor) else x
                key = f"{getattr(x, 'placements', 'plain')} {local.shape[1]}/{x.shape[1]}"
                seen[key] = seen.get(key, 0) + 1

        _norm_inputs.state = (register_module_forward_pre_hook(hook), seen)
    elif step == 1:
        handle, seen = _norm_inputs.state
        handle.remove()
        Path(out_dir, f"norm_inputs_rank{rank}.json").write_text(json.dumps(seen))


def _generator_after_step0(out_dir: str, rank: int, step: int) -> None:
    if step == 1:
        import hashlib

        digest = hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()
        Path(out_dir, f"rng_rank{rank}.txt").write_text(digest)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sp")
    configs = {}
    for name, plan in RUNS.items():
        out = root / name
        hook = functools.partial(_norm_inputs, str(out)) if name in PROBED else None
        configs[name] = TrainConfig(plan=plan, model=plan.model, out_dir=str(out), dropout=False, steps=2,
                                    optimizer="sgd", lr=0.1, step_hook=hook)
    for name, plan in (("dropout", DROPOUT), ("dropout-ckpt", DROPOUT_CKPT)):
        out = root / name
        configs[name] = TrainConfig(plan=plan, model=plan.model, out_dir=str(out), steps=2, seq_len=31,
                                    optimizer="sgd", lr=0.1,
                                    step_hook=functools.partial(_generator_after_step0, str(out)))
    for name, strategies in MEMORY.items():
        plan = _one_stage("gpt2-tiny", strategies, n_micro=4)
        configs[f"memory-{name}"] = TrainConfig(plan=plan, model=plan.model, out_dir=str(root / f"memory-{name}"),
                                                steps=2)
    train_many(list(configs.values()), 2)
    return configs


def _distances(config) -> tuple[float, float, float]:
    """(max |distributed - one process|, the same relative to the reference's update as in
    test_mixed_precision.py, G: one-process fp32 against one-process same recipe, alike)."""
    got = torch.load(Path(config.out_dir) / "stage0.pt")
    _, ref = reference_run(config)
    names = sorted(ref)
    assert set(got) == set(names)  # every parameter of the model is compared
    if config.plan.precision == "fp32":
        ref32 = ref
    else:
        _, ref32 = reference_run(replace(config, plan=replace(config.plan, precision="fp32")))
    start = initial_parameters(config)

    def flat(d):
        return torch.cat([d[n].reshape(-1).double() for n in names])

    a, b, b32, theta0 = flat(got), flat(ref), flat(ref32), flat(start)
    update = (b - theta0).norm()
    assert update > 0
    return float((a - b).abs().max()), float((a - b).norm() / update), float((b32 - b).norm() / update)


@pytest.mark.parametrize("name", [n for n, p in RUNS.items() if p.precision == "fp32"])
def test_fp32_parameters_match_one_process(runs, name):
    largest, relative, _ = _distances(runs[name])
    assert largest < 1e-5 and relative < 1e-5, (largest, relative)


def test_bf16_is_within_twice_bf16s_own_rounding(runs):
    _, distance, gap = _distances(runs["llama-bf16"])
    assert gap > 1e-4  # 16 bits really ran
    assert distance < 2 * gap, (distance, gap)


@pytest.mark.parametrize("name", PROBED)
def test_every_norm_sees_half_of_the_sequence(runs, name):
    """Per forward and rank: two norms per block and the head's, every one fed a Shard(1)
    DTensor with 16 of the 32 positions (GPT-2's embedding has no norm; the attention, not probed
    here, sees all 32 after the all-gather, or the losses above would differ)."""
    config = runs[name]
    for rank in range(2):
        seen = json.loads((Path(config.out_dir) / f"norm_inputs_rank{rank}.json").read_text())
        # (step 0 also runs the pipeline stage's shape inference: one forward more)
        assert set(seen) == {"(Shard(dim=1),) 16/32"}, seen
        count = seen["(Shard(dim=1),) 16/32"]
        assert count % (2 * 4 + 1) == 0 and count >= config.plan.n_micro * (2 * 4 + 1), seen


def test_sequence_parallelism_keeps_half_of_what_tp_keeps_whole(runs):
    """GPT-2, micro-batches of b = 2 sequences of s = 32 tokens, h = 64, fp32 (e = 4 bytes), dropout
    on. Per SP block, SP halves its two norms' inputs (e bsh each), their mean and rstd (4 bs each)
    and its two dropout masks (e bsh each: on the CPU, dropout saves its scaled mask in the input's
    dtype); in the head, the final norm's input and statistics. The column-parallel linears' inputs
    stay whole: DTensor's ColwiseParallel saves the all-gathered input (Megatron keeps it sharded and
    gathers it again in the backward). Peak on rank 0 with one micro-batch in flight (one stage)."""
    measured = {k: json.loads((Path(runs[f"memory-{k}"].out_dir) / "memory_rank0.json").read_text())
                for k in MEMORY}
    tp, sp = measured["tp"]["activations"], measured["sp"]["activations"]
    b, s, h, e, blocks = 2, 32, 64, 4, 4
    per_block = 4 * e * b * s * h + 2 * 2 * 4 * b * s
    head = e * b * s * h + 2 * 4 * b * s
    assert tp - sp == pytest.approx((blocks * per_block + head) / 2, rel=0.02), (tp, sp)
    # the memory model's saving (costs/memory.py: MemoryConfig.sp_whole_share, the linears' inputs
    # kept whole) within 10% of the measured one
    predicted = {k: _predicted_activations(runs[f"memory-{k}"].plan) for k in ("tp", "sp")}
    assert predicted["tp"] - predicted["sp"] == pytest.approx(tp - sp, rel=0.10), (predicted, tp, sp)
    # parameters, gradients and optimizer states are TP's (the norms' weights stay replicated)
    assert all(measured["sp"][k] == measured["tp"][k] for k in ("params", "grads", "optimizer"))


def _predicted_activations(plan) -> float:
    b = predicted_memory(plan)[0]
    return b.activation_bytes + b.tp_replicated_bytes


def test_dropout_keeps_the_ranks_generators_in_step(runs):
    """GPT-2 with dropout and a sequence of 31 (16 and 15 tokens per rank): each SP dropout draws
    one seed from the default generator on every rank and its mask from a per-rank fork, so the
    generators the replicated regions' dropouts use agree after a step (drawing the masks from the
    default generator itself would advance it by 16 and 15 tokens' worth: they would differ)."""
    for name in ("dropout", "dropout-ckpt"):
        out = Path(runs[name].out_dir)
        assert (out / "rng_rank0.txt").read_text() == (out / "rng_rank1.txt").read_text()


def test_checkpointed_sp_blocks_draw_the_same_dropout_masks_again(runs):
    """Dropout on: checkpointing the SP blocks changes nothing (a recomputation that drew other masks
    than its forward would give other gradients), and the dropout really acted."""
    plain, ckpt = (torch.load(Path(runs[n].out_dir) / "stage0.pt") for n in ("dropout", "dropout-ckpt"))
    assert max(float((plain[k] - ckpt[k]).abs().max()) for k in plain) < 1e-6
    _, without = reference_run(replace(runs["dropout"], dropout=False))
    assert max(float((plain[k] - without[k]).abs().max()) for k in plain) > 1e-4


def test_layers_sequence_parallelism_cannot_run_are_refused_before_launch(tmp_path):
    """One line naming the layer, from the checks `paraplan train` runs before any rank starts."""
    from paraplan.errors import ParaplanError
    from paraplan.models import source
    from paraplan.runtime.launcher.launch import check_before_launch
    from paraplan.runtime.layers.hybrid import hybrid_refusal
    from paraplan.runtime.layers.tensor_parallel import tp_refusal

    gpt2 = source.build("gpt2-tiny").layers()
    bad = _one_stage("gpt2-tiny", [SP] * 6)  # GPT-2's embedding adds a whole-sequence position embedding
    reason = hybrid_refusal(bad, gpt2)
    assert reason.startswith("layer 0 (embedding, TP2+SP): no sequence parallelism: GPT2Embedding: SP runs on")
    assert "\n" not in reason
    config = TrainConfig(plan=bad, model=bad.model)  # the runtime takes sequence_parallel plans now
    with pytest.raises(ParaplanError, match="this plan cannot run: layer 0 .embedding, TP2\\+SP.: no sequence"):
        check_before_launch(config, 2, 6, gpt2)
    bert = source.build("bert-tiny").layers()
    assert "BertLayer: SP runs on pre-norm blocks" in hybrid_refusal(_one_stage("bert-tiny", [S(tp=2)] + [SP] * 5),
                                                                     bert)
    for model, plan in RUNS.items():
        assert hybrid_refusal(plan, source.build(plan.model).layers()) is None, model
    # what tp_refusal accepts without SP and refuses with it
    assert tp_refusal(gpt2[0][2], 2) is None and tp_refusal(gpt2[0][2], 2, sequence_parallel=True)

