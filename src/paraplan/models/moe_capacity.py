"""Token dropping at a capacity factor (issue 50 items 2 and 5): each routed expert takes at most
`ceil(factor x T x k / E)` of the routed copies of the T tokens it is offered (T: the tokens of one
forward call, one data slice: Megatron-core computes the capacity on each rank's own tokens before
dispatch, `moe_expert_capacity_factor`); the copies over it are dropped, those of the lowest
routing weight first (Megatron-core's default drop policy, "probs"), ties by token order. A dropped
copy's weight becomes 0, so it contributes nothing to the output and no gradient to its expert or
to its router weight (Megatron masks the probabilities the same way).

The model reference's `capacity_factor` setting turns it on (models/ref.py); without it the experts
are dropless, as Megatron-core's default. The same rule runs in the one-process forward (the
installed `drop_over_capacity` wrapper around transformers' experts) and in the expert-parallel one
(runtime/layers/expert_parallel.py calls `capacity_weights` before dispatch), so the two agree.
"""

from __future__ import annotations

import math
from types import MethodType

import torch
from torch import nn

from paraplan.models.moe_spec import moe_parts


def capacity_keep(top_k_index: torch.Tensor, top_k_weights: torch.Tensor, experts: int,
                  factor: float) -> torch.Tensor:
    """A bool mask of the [T, k] routed copies each expert keeps (module docstring)."""
    index = top_k_index.reshape(-1)
    weight = top_k_weights.reshape(-1).detach().float()
    capacity = math.ceil(factor * index.numel() / experts)
    # per expert, copies ordered by weight (descending), then token order: a stable sort of -weight
    # within a stable sort by expert gives each copy its rank among its expert's copies
    order = torch.argsort(-weight, stable=True)
    order = order[torch.argsort(index[order], stable=True)]
    sorted_experts = index[order]
    starts = torch.searchsorted(sorted_experts, sorted_experts, right=False)
    rank = torch.arange(index.numel(), device=index.device) - starts
    keep = torch.empty_like(index, dtype=torch.bool)
    keep[order] = rank < capacity
    return keep.reshape(top_k_index.shape)


def capacity_weights(module: nn.Module, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
    """The routing weights with the dropped copies' set to 0 (`module._capacity_factor`, as
    `drop_over_capacity` installed it); the weights themselves where there is none."""
    factor = getattr(module, "_capacity_factor", None)
    if factor is None:
        return top_k_weights
    keep = capacity_keep(top_k_index, top_k_weights, module._capacity_experts, factor)
    return top_k_weights * keep.reshape(top_k_weights.shape).to(top_k_weights.dtype)


def _dropping_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return self._undropped_forward(hidden_states, top_k_index, capacity_weights(self, top_k_index, top_k_weights),
                                   *args, **kwargs)


def drop_over_capacity(model: nn.Module, factor: float) -> int:
    """Every MoE part's experts drop the copies over `factor`'s capacity (module docstring), in front
    of whatever forward they run; how many parts (0 for a dense model)."""
    parts = moe_parts(model)
    for _, part in parts:
        experts = part.experts
        count = len(experts) if isinstance(experts, nn.ModuleList) else next(experts.parameters(recurse=False)).shape[0]
        experts._capacity_factor, experts._capacity_experts = float(factor), int(count)
        experts._undropped_forward = experts.forward
        experts.forward = MethodType(_dropping_forward, experts)
    return len(parts)
