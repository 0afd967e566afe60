"""Tensor parallelism applied: a layer's DTensor plan (layers/tensor_parallel.py: `layer_plan`)
put on the materialised layer over its tp mesh, its tied parameters kept tied, the gradients DTensor
leaves in the wrong layout put right; and a TP layer's whole parameters or gradients gathered back
(checkpoints, the comparison with one process).
"""

from __future__ import annotations

import weakref
from functools import partial

import torch
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from paraplan.runtime.layers.sequence_parallel import SUMMED_AFTER_STEP
from paraplan.runtime.layers.tensor_parallel import TPRefused, layer_plan


class LocalHeadBias:
    """Stands in for T5Layer._bias_owner (an `Unregistered` holder: `.module.compute_bias`). T5
    blocks after the first recompute the relative position bias from block 0's table; each rank
    needs its own heads'. If block 0 runs TP on the same mesh its table is head-sharded and the bias
    comes out local already; otherwise the whole bias is sliced here (block 0's table then gets only
    this rank's heads' gradient from this block: run block 0 with TP too)."""

    def __init__(self, owner: nn.Module, rank: int, tp: int):
        self.module, self._owner, self._rank, self._tp = self, owner, rank, tp
        self._full = owner.relative_attention_bias.embedding_dim  # all heads, even once sharded

    def compute_bias(self, query_length, key_length, device=None, **kwargs):
        bias = self._owner.compute_bias(query_length, key_length, device=device, **kwargs)
        if bias.shape[1] == self._full and self._tp > 1:
            local = self._full // self._tp
            bias = bias[:, self._rank * local:(self._rank + 1) * local]
        return bias


def apply_tensor_parallel(layer: nn.Module, mesh: DeviceMesh, memo: dict | None = None,
                          sequence_parallel: bool = False) -> None:
    """In place, on a materialised layer (values identical on every rank of the 1-D `mesh`), as the
    module docstring says; the layer's input and output stay plain tensors identical on every rank,
    except with `sequence_parallel` (runtime/layers/sequence_parallel.py: `sequence_io` says which of them
    are then Shard(1) DTensors). `memo` (id of an original parameter -> its new parameter) keeps a
    parameter tied across the calls that share it (GPT-2's wte: Shard(0) in the embedding and in the
    LM head); a tied parameter that would need two different layouts raises ValueError naming it."""
    tp = mesh.size()
    try:
        plan = layer_plan(layer, tp, sequence_parallel)
    except TPRefused as exc:
        what = "tensor and sequence parallelism" if sequence_parallel else "tensor parallelism"
        raise ValueError(f"no {what} over {tp} ranks: {exc}") from None
    memo = {} if memo is None else memo
    refs = [(path, m, n, p) for path, m in layer.named_modules(remove_duplicate=False)
            for n, p in m._parameters.items() if p is not None]
    for m, attr, value in plan.attrs:
        setattr(m, attr, value)
    # the values are identical on every rank already: each takes its shard, no broadcast
    if (root := plan.styles.pop("", None)) is not None:  # the layer is itself an nn.Embedding
        parallelize_module(layer, mesh, root, src_data_rank=None)
    if plan.styles:
        parallelize_module(layer, mesh, plan.styles, src_data_rank=None)
    layer.register_forward_hook(_plain_outputs)
    if plan.t5_owner is not None:
        layer._bias_owner = LocalHeadBias(plan.t5_owner, mesh.get_local_rank(), tp)
    # ties: one new parameter per original one. References a style replaced go first; an untouched
    # reference to a tensor replaced in this same layer is an alias and follows it (BERT's
    # predictions.bias is predictions.decoder.bias); across layers the layouts must agree
    replaced = {id(p) for _, m, n, p in refs if m._parameters[n] is not p}
    refs.sort(key=lambda r: r[1]._parameters[r[2]] is r[3])
    for path, m, n, p in refs:
        new, have = m._parameters[n], memo.get(id(p))
        if new is p and id(p) in replaced:
            m._parameters[n] = have
        elif have is not None and getattr(have, "_tp_source", lambda: None)() is p:  # not a reused id
            if have is not new and _layout(have) != _layout(new):
                raise ValueError(f"tied parameter '{f'{path}.{n}' if path else n}' would be {_layout(new)} "
                                 f"here but is {_layout(have)} in another layer that uses it")
            m._parameters[n] = have
        else:
            new._tp_source = weakref.ref(p)
            memo[id(p)] = new
    for p in {id(p): p for p in layer.parameters()}.values():
        if isinstance(p, DTensor) and not hasattr(p, "_tp_grad_hook"):
            p._tp_grad_hook = p.register_hook(partial(_grad_like_param, p.device_mesh, p.placements,
                                                      weakref.ref(p)))


def _grad_like_param(mesh, placements, param, grad):
    """DTensor (torch 2.13) has no row-sharded strategy for the embedding's backward: a
    vocab-parallel embedding's weight gradient comes out whole (Replicate; computed with the global
    ids and padding_idx, so right) on every rank. Keep this rank's shard only, like the parameter
    (a local slice, no communication), so the gradient takes the sharded parameter's memory.
    A sequence-parallel norm's weight gradient comes out Partial (each rank's sum over its tokens):
    all-reduced here, unless its stage sums it once per step (sequence_parallel.sum_partial_grads)."""
    if getattr(param(), SUMMED_AFTER_STEP, False):
        return grad
    if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(placements):
        return grad.redistribute(mesh, placements)
    return grad


def _plain_outputs(module, args, out):
    """The styles' output collectives run with async_op=True, so a layer ending in one (Llama's
    embedding is a bare nn.Embedding) would return an AsyncCollectiveTensor, which a pipeline's
    send should not see. An op on it waits and returns a plain tensor; clone keeps the graph. A
    sequence-parallel layer's Shard(1) DTensor output gets the same for its local shard (the next
    layer saves it for its backward, where the memory meter reads its storage)."""
    if isinstance(out, AsyncCollectiveTensor) or (isinstance(out, DTensor) and
                                                  isinstance(out._local_tensor, AsyncCollectiveTensor)):
        return out.clone()
    if isinstance(out, tuple) and any(isinstance(t, AsyncCollectiveTensor) for t in out):
        return tuple(t.clone() if isinstance(t, AsyncCollectiveTensor) else t for t in out)
    return out


def _layout(p: torch.Tensor) -> str:
    return f"sharded {list(p.placements)} over {p.device_mesh}" if isinstance(p, DTensor) else "replicated"


def _gather(layer: nn.Module, grads: bool) -> dict[str, torch.Tensor]:
    out, done = {}, {}
    with torch.no_grad():
        for path, p in layer.named_parameters(remove_duplicate=False):
            t = p.grad if grads else p
            if t is None:
                continue
            if id(p) not in done:  # a collective: every rank walks the same parameters in order
                done[id(p)] = (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()
            value = done[id(p)]
            mod_path, _, name = path.rpartition(".")
            order = getattr(layer.get_submodule(mod_path), "_tp_column_order", None)
            if order is not None:  # GPT-2's fused QKV: back to the [q; k; v] column order
                value = value.index_select(1 if name == "weight" else 0, torch.argsort(order))
            out[path] = value
    return out


def full_parameters(layer: nn.Module) -> dict[str, torch.Tensor]:
    """layer.named_parameters(remove_duplicate=False) path -> the full tensor in the original (pre-TP)
    layout. A collective over the mesh: every rank of it must call it."""
    return _gather(layer, grads=False)


def full_gradients(layer: nn.Module) -> dict[str, torch.Tensor]:
    """As full_parameters, for the gradients (parameters without one are left out)."""
    return _gather(layer, grads=True)
