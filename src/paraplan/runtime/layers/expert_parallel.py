"""Expert parallelism for real (issue 50 item 5): a mixture-of-experts layer's routed experts split
over the ep ranks of its group, each token's routed copies sent to their experts' ranks and the
results sent back, by all-to-all, as costs/expert_costs.py prices it.

Why our own and not a library's MoE layer: torchtitan's (`torchtitan.models.moe` with its
`ExpertParallel` style) wraps its own MoE module and needs its grouped-GEMM kernels (CUDA); Megatron's
token dispatchers need Transformer Engine and CUDA; DeepSpeed's `deepspeed.moe.layer.MoE` is a model
rewrite. transformers' own experts module is kept here: its router and shared experts run as the
model has them, and its `experts` module runs only its local experts (models/moe_static.py's
`one_expert`, the same per-expert computation every family's fused weights take).

Each expert parameter (transformers 5 stacks them [E, ...]) becomes a DTensor sharded on its expert
dimension over the ep sub-mesh, so that torch.distributed.checkpoint saves and loads it under the
model's own name and shape (a run resumes under another expert layout: DCP re-shards), the stage's
`full_state` gathers it whole, and clipping sees every expert's gradient; the forward uses each
rank's local shard. The routed experts' gradients are summed over their edp replicas (the devices
holding the same experts: layers/parallelize.py `apply_zero` groups them apart from the dense
parameters'). Runs with etp 1, tp 1 and no sdp (layers/hybrid.py refuses the rest in one line).

With a capacity factor (models/moe_capacity.py) the copies over an expert's capacity are dropped on
each rank's own tokens before dispatch: their weights are 0 (no output, no gradient); they are
still sent and computed, which costs time here but not correctness.

The all-to-alls (torch.distributed's `all_to_all_single` for the counts and the experts' ids, its
autograd form `torch.distributed.nn.functional.all_to_all_single` for the tokens, deprecated in
torch 2.13 but working on gloo) carry, per direction, each device's T x k routed copies, of which
the (ep - 1) / ep bound for other ranks leave it.
"""

from __future__ import annotations

import warnings
from types import MethodType, SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from paraplan.models.moe_capacity import capacity_weights
from paraplan.models.moe_spec import moe_parts
from paraplan.models.moe_static import one_expert
from paraplan.plans.axes import EXPERT
from paraplan.plans.plan import LayerStrategy


def expert_params(layer: nn.Module) -> list[nn.Parameter]:
    """The routed experts' stacked parameters of a layer's MoE parts (leading dimension E)."""
    return [p for _, part in moe_parts(layer) for p in part.experts.parameters(recurse=False)]


def apply_ep(layer: nn.Module, strategy: LayerStrategy, meshes) -> list[nn.Parameter]:
    """Split the layer's routed experts over the ep sub-mesh (module docstring) and run its experts
    expert-parallel; the expert parameters (for their own gradient sync), [] without ep."""
    if strategy.ep <= 1:
        return []
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = meshes.expert_sub(strategy, EXPERT)
    group = mesh.get_group()
    out = []
    for _, part in moe_parts(layer):
        experts = part.experts
        for name, p in list(experts.named_parameters(recurse=False)):
            # every rank holds the same whole tensor (materialised from the model's seed): keep its shard
            sharded = nn.Parameter(distribute_tensor(p.detach(), mesh, [Shard(0)], src_data_rank=None),
                                   requires_grad=p.requires_grad)
            setattr(experts, name, sharded)
            out.append(sharded)
        experts.forward = MethodType(_expert_parallel_forward, experts)
        experts._ep_group = group
        experts._ep_size = strategy.ep
    return out


def _local(experts: nn.Module) -> SimpleNamespace:
    """The experts module's parameters as this rank's local shards, for `one_expert`."""
    from torch.distributed.tensor import DTensor

    local = {name: p.to_local() if isinstance(p, DTensor) else p for name, p in experts.named_parameters(recurse=False)}
    return SimpleNamespace(**local, act_fn=getattr(experts, "act_fn", None))


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    from torch.distributed.nn.functional import all_to_all_single

    with warnings.catch_warnings():  # deprecated in torch 2.13 (still the autograd all-to-all gloo runs)
        warnings.simplefilter("ignore")
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        return all_to_all_single(out, x, out_splits, in_splits, group=group)


def _expert_parallel_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """transformers' experts forward (tokens, their top-k experts, their weights) -> the weighted sum
    of each token's experts' outputs, with the experts spread over the ep ranks."""
    group, ep = self._ep_group, self._ep_size
    # a capacity factor drops copies on this rank's own tokens before dispatch, as Megatron-core does
    top_k_weights = capacity_weights(self, top_k_index, top_k_weights)
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])
    tokens, k = top_k_index.reshape(x.shape[0], -1).shape
    local = _local(self)
    per_rank = next(iter(vars(local).values())).shape[0]  # experts on each rank: E / ep
    expert = top_k_index.reshape(-1)
    destination = torch.div(expert, per_rank, rounding_mode="floor")
    order = torch.argsort(destination, stable=True)  # the routed copies, grouped by the rank they go to
    send_counts = torch.bincount(destination, minlength=ep)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    sends, receives = send_counts.tolist(), recv_counts.tolist()
    local_expert = torch.empty(sum(receives), dtype=expert.dtype, device=expert.device)
    dist.all_to_all_single(local_expert, (expert % per_rank)[order].contiguous(), receives, sends, group=group)
    copies = x.index_select(0, torch.div(order, k, rounding_mode="floor"))  # token of each copy, in send order
    received = _all_to_all(copies, receives, sends, group)
    results = torch.zeros_like(received)
    for e in range(per_rank):
        rows = torch.nonzero(local_expert == e).reshape(-1)
        if rows.numel():
            results = results.index_copy(0, rows, one_expert(local, e, received.index_select(0, rows)).to(received.dtype))
    back = _all_to_all(results, sends, receives, group)  # in send order
    per_copy = back.index_select(0, torch.argsort(order))  # back in the copies' own order (token-major)
    weighted = per_copy.reshape(tokens, k, -1) * top_k_weights.reshape(tokens, k, 1).to(per_copy.dtype)
    return weighted.sum(dim=1).reshape(*shape[:-1], -1)
