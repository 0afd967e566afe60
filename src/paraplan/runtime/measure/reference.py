"""The single-process run every distributed run is checked against: same model, init, data, seed,
and the same mixed-precision recipe (runtime/rank/mixed_precision.py)."""

from __future__ import annotations

import torch

from paraplan.plans.kinds import PlanKind
from paraplan.runtime.rank.data import batch_source
from paraplan.runtime.rank.materialize import StageModule, build_layers, materialize
from paraplan.runtime.rank.mixed_precision import LossScaler, reference_layer, step_context
from paraplan.runtime.rank.rank_base import RunConfig, make_optimizer


def reference_run(config: RunConfig, resume_from: str | None = None) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`resume_from`: a checkpoint directory (any plan's): the run starts from its state and step, as
    one process (the uninterrupted run of a plan from the state a checkpoint holds:
    tests/distributed/test_replan_resume.py); the losses returned are those of the steps run."""
    torch.manual_seed(config.seed)
    built, layers, names = build_layers(config.model, config.seed, config.seq_len, config.image_size,
                                        dropout=config.dropout)
    modules = [m for _, _, m in layers]
    materialize(modules, names, config.seed, torch.device("cpu"))  # one call: tied weights stay tied
    plan = config.plan
    # the plan's mixed-precision recipe, layer by layer (runtime/rank/mixed_precision.py): an SDP layer
    # computes with bf16 weights as FSDP2's MixedPrecisionPolicy does; the rest under autocast
    sharded = {i for stage in plan.stages for i in stage.layers
               if plan.kind is PlanKind.LAYERS and stage.strategy(i).sdp > 1}
    model = StageModule([reference_layer(m, plan.precision, i in sharded) for i, m in enumerate(modules)])
    model.train()
    params = list(model.parameters())
    optim = make_optimizer(config, params)
    n_replicas = len(plan.stages[0].devices) if plan.stages else 1  # an operator placement: one replica
    shard = plan.global_batch // n_replicas
    micro = shard // plan.n_micro
    losses = []
    scaler = LossScaler(plan.precision)
    batches = batch_source(built, plan.global_batch, config.seed, config.data, config.data_dtype)
    first = 0
    if resume_from is not None:
        from paraplan.runtime.state.checkpoints import load_checkpoint

        first, _, _ = load_checkpoint(resume_from, {names.get(id(p)): p for p in params}, optim)
    for step in range(first, config.steps):
        inputs, targets = batches(step)
        optim.zero_grad(set_to_none=True)
        total = 0.0
        # the same micro-batches as the pipeline: losses averaged over micro-batches and replicas
        with step_context(plan.precision, torch.device("cpu")):
            for r in range(n_replicas):
                for j in range(plan.n_micro):
                    lo = r * shard + j * micro
                    out = model(inputs[lo:lo + micro])
                    target = None if targets is None else targets[lo:lo + micro]
                    loss = built.loss(out, target) / (plan.n_micro * n_replicas)
                    (loss * scaler.scale).backward()
                    total += float(loss.detach())
        if not scaler.unscale_and_check([p.grad for p in params if p.grad is not None]):
            losses.append(total)  # fp16 overflow: the step is skipped, as on every rank of the run
            continue
        if config.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, config.clip_norm)
        optim.step()
        losses.append(total)
    return losses, {names.get(id(p)): p.detach().clone() for p in params}
