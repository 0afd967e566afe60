"""What the model returns against what its loss needs, checked before any rank starts.

The ranks apply the loss to the last stage's output and each micro-batch's targets (models/built.py:
cross-entropy for integer targets, mean squared error for float ones, the mean of the outputs
without targets). A model whose output does not fit (a user's build function returning targets of
another shape, classes beyond the model's outputs) used to fail in the ranks, half a minute after
the launch, or worse, to train on a silently broadcast loss. Here the whole model runs once on the
meta device (shapes only, no values: milliseconds) and the loss is applied to its output.
"""

from __future__ import annotations

import torch

from paraplan.errors import ParaplanError
from paraplan.plans.kinds import PlanKind


def check_model_fits_loss(built, plan, layers=None, seed: int = 0) -> None:
    """Refuse, in one line, a model whose output the loss cannot take. `built` is the model built
    on meta (as the CLI measures it), `layers` its layer list if already cut."""
    if plan.kind is PlanKind.OPERATORS:  # operator placements compute their loss in the replayed graph
        return
    layers = built.layers() if layers is None else layers
    # a stage's group shares every micro-batch under per-layer strategies; else each device is a replica
    replicas = 1 if plan.kind is PlanKind.LAYERS else len(plan.stages[0].devices)
    micro = max(1, plan.global_batch // max(1, replicas * plan.n_micro))  # what one loss call sees
    inputs, targets = built.batch(micro, device="meta")
    out = inputs
    try:
        with torch.no_grad():
            for _, _, layer in layers:  # as runtime/rank/materialize.StageModule chains them
                out = layer(out)
    except NotImplementedError:
        return  # an operator without a meta kernel: nothing can be said before the run
    except Exception as exc:  # the layers ran on meta when the model was measured: say what broke
        raise ParaplanError(f"{built.name}: running the model on its sample batch fails: {_line(exc)}") from None
    what = _describe(out)
    if built.sample is not None and targets is not None:  # a user's module: its own targets
        if not isinstance(out, torch.Tensor):
            raise ParaplanError(f"{built.name}: the model returns {what}, but its targets need one tensor for the "
                                "loss (cross-entropy or mean squared error)")
        if targets.is_floating_point() and tuple(out.shape) != tuple(targets.shape):
            raise ParaplanError(f"{built.name}: the model returns {tuple(out.shape[1:])} per sample but the float "
                                f"targets are {tuple(targets.shape[1:])}: mean squared error needs the same shape")
    try:
        with torch.no_grad():
            loss = built.loss(out, targets)
    except NotImplementedError:
        return
    except Exception as exc:
        raise ParaplanError(f"{built.name}: the loss cannot take what the model returns ({what}): {_line(exc)}") from None
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ParaplanError(f"{built.name}: the loss of the model's output is {_describe(loss)}, not one number")
    if built.sample is not None and targets is not None and not targets.is_floating_point():
        _check_classes(built, out, seed)


def _check_classes(built, out: torch.Tensor, seed: int) -> None:
    """Integer targets are classes: the training data draws them below the sample's largest + 1,
    so that must not pass the model's scores per sample. Values need the sample on the CPU (the
    meta build has shapes only): built again as the ranks build it, parameters on meta."""
    from paraplan.runtime.rank.materialize import build_layers

    real, _, _ = build_layers(built.ref or built.name, seed)
    targets = real.sample[1]
    if targets is None or targets.device.type == "meta" or targets.numel() == 0:
        return
    classes, largest = int(out.shape[-1]), int(targets.max())
    if largest >= classes or int(targets.min()) < 0:
        raise ParaplanError(f"{built.name}: the sample targets are classes up to {largest} (from "
                            f"{int(targets.min())}) but the model returns {classes} scores per sample: cross-entropy "
                            f"needs classes 0..{classes - 1}")


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
