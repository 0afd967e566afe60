"""The single-process run every distributed run is checked against: same model, init, data, seed,
and the same mixed-precision recipe (runtime/mixed_precision.py)."""

from __future__ import annotations

import torch

from paraplan.runtime.data import batch_source
from paraplan.runtime.materialize import StageModule, build_layers, materialize
from paraplan.runtime.mixed_precision import LossScaler, reference_layer, step_context
from paraplan.runtime.rank_base import TrainConfig, make_optimizer


def reference_run(config: TrainConfig, plan_from: tuple[int, object] | None = None, resume_from: str | None = None
                  ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """`plan_from` = (step, plan): from that step on, the run continues as `plan` would (its
    precision, micro-batches and replicas). `resume_from`: a checkpoint directory (any plan's): the
    run starts from its state and step, as one process (the uninterrupted run of a plan from the
    state a checkpoint holds: tests/distributed/test_replan_resume.py); the losses returned are those
    of the steps run."""
    torch.manual_seed(config.seed)
    built, layers, names = build_layers(config.model, config.seed, config.seq_len, config.image_size,
                                        dropout=config.dropout)
    modules = [m for _, _, m in layers]
    materialize(modules, names, config.seed, torch.device("cpu"))  # one call: tied weights stay tied
    plans = [config.plan] + ([] if plan_from is None else [plan_from[1]])
    # each plan's mixed-precision recipe, layer by layer (runtime/mixed_precision.py): an SDP layer
    # computes with bf16 weights as FSDP2's MixedPrecisionPolicy does; the rest under autocast (the
    # wrappers share the layers' parameters)
    models = [StageModule([reference_layer(m, p.precision, i in _sharded(p)) for i, m in enumerate(modules)])
              for p in plans]
    for model in models:
        model.train()
    params = list(models[0].parameters())
    optim = make_optimizer(config, params)
    losses = []
    scalers = [LossScaler(p.precision) for p in plans]
    batches = batch_source(built, config.plan.global_batch, config.seed, config.data, config.data_dtype)
    first = 0
    if resume_from is not None:
        import json
        from pathlib import Path

        from paraplan.runtime import layout_state

        manifest = json.loads((Path(resume_from) / "checkpoint.json").read_text())
        layout_state.load({names.get(id(p)): p for p in params}, optim, str(Path(resume_from) / manifest["state"]))
        first = manifest["step"]
    for step in range(first, config.steps):
        k = 0 if plan_from is None or step < plan_from[0] else 1
        plan, model, scaler = plans[k], models[k], scalers[k]
        n_replicas = len(plan.stages[0].devices) if plan.stages else 1  # an operator placement: one replica
        shard = plan.global_batch // n_replicas
        micro = shard // plan.n_micro
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


def _sharded(plan) -> set[int]:
    return {i for stage in plan.stages for i in stage.layers if stage.strategies and stage.strategy(i).sdp > 1}
