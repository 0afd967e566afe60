"""A mixture-of-experts model made measurable on the meta device (issue 50 item 1).

transformers 5 runs a block's routed experts data-dependently: the eager kernel loops over the
experts some token chose (`nonzero()` on the routing, which meta tensors cannot answer) and the
grouped one wants bf16 inputs (both crash on meta; such models were refused until this). To measure such a
model as paraplan measures every other (FLOPs by torch's flop counter, saved tensors, kernels, on
meta), `route_statically` swaps each `experts` module's forward (`static_routing`: for as long as
a context lasts) for one that sends every token through the first top-k experts, weighted by the router's own
weights. The router and the shared experts run as the model has them. A token then multiplies
what real routing makes it multiply (top-k experts of the same size, each expert's weights the
same shape), so the counted FLOPs are the routed ones (models/moe_spec.py's closed form, checked
in tests/unit/test_moe_static.py) and each expert's intermediate tensors hold k x tokens rows in
all, as the gathered tokens do under real routing when it is balanced. Which experts a token
reaches and how unevenly is the routing's own business: the cost model takes imbalance as a
factor (issue 50 item 2), not from this.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import MethodType, SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from paraplan.models.moe_spec import moe_parts


def _project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight for a weight stored [out, in] (nn.Linear's) or [in, out] (gpt-oss's), by which
    of its sizes is x's."""
    if weight.shape[-1] == x.shape[-1]:
        return F.linear(x, weight, bias)
    y = x @ weight
    return y + bias if bias is not None else y


def one_expert(experts, e: int, x: torch.Tensor) -> torch.Tensor:
    """Routed expert `e` of an `experts` module (or anything holding its stacked parameters by the
    same names: runtime/layers/expert_parallel.py's local shards) applied to tokens `x`."""
    if isinstance(experts, nn.ModuleList):
        return experts[e](x)
    bias = getattr(experts, "gate_up_proj_bias", None)
    gate, up = _project(x, experts.gate_up_proj[e], None if bias is None else bias[e]).chunk(2, dim=-1)
    act = getattr(experts, "act_fn", None) or F.silu
    bias = getattr(experts, "down_proj_bias", None)
    return _project(act(gate) * up, experts.down_proj[e], None if bias is None else bias[e])


def _unbound(experts: nn.Module):
    """The experts' stacked parameters as tuples of per-expert views, split once (`unbind`): indexing
    a stacked parameter per expert (`p[e]`) costs a zero-filled gradient of the whole stack per
    expert in the backward (select's), which a grouped GEMM never writes; one unbind's backward
    stacks the experts' gradients once, as the grouped GEMM writes them."""
    if isinstance(experts, nn.ModuleList):
        return experts
    parts = {name: p.unbind(0) for name, p in experts.named_parameters(recurse=False)}
    return SimpleNamespace(**parts, act_fn=getattr(experts, "act_fn", None))


def _static_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Every token through experts 0..k-1, each weighted by the router's j-th weight."""
    k = top_k_index.shape[-1]
    out = None
    experts = _unbound(self)
    # each expert's tokens gathered into a copy of their own, as real routing gathers them (eager's
    # `hidden_states[token_idx]`, megatron-core's permutation): k copies of the tokens kept in all
    rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
    for j in range(k):
        y = one_expert(experts, j, hidden_states[rows]) * top_k_weights[..., j:j + 1].to(hidden_states.dtype)
        out = y if out is None else out + y
    return out


def route_statically(model: nn.Module) -> int:
    """Every MoE part's experts route statically (module docstring), for good: a model built on
    meta to be measured (it never trains). How many parts it swapped (0 for a dense model)."""
    parts = moe_parts(model)
    for _, part in parts:
        part.experts.forward = MethodType(_static_forward, part.experts)
    return len(parts)


@contextmanager
def static_routing(model: nn.Module) -> Iterator[int]:
    """`route_statically` for as long as the context lasts, each experts' own forward back after."""
    before = [(part.experts, part.experts.__dict__.get("forward")) for _, part in moe_parts(model)]
    try:
        yield route_statically(model)
    finally:
        for experts, forward in before:
            if forward is None:
                del experts.forward
            else:
                experts.forward = forward


def eager_experts(model: nn.Module) -> None:
    """A model that trains for real runs its experts with transformers' eager kernel: the grouped
    one wants bf16 inputs (`grouped_mm`), and paraplan trains fp32 too."""
    config = getattr(model, "config", None)
    if config is not None and moe_parts(model):
        config._experts_implementation = "eager"
