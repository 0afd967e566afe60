"""Slice-Gather (Galvatron-BMW §VI) between the layouts of neighbouring layers, and a layer under
its strategy (`StrategyLayer`).

Between neighbouring layers whose data splits differ, the activation is redistributed: a slice
the device already holds is cut locally; a missing one is all-gathered over the stage group (more
bytes than the minimum the simulator prices for some pairs; said where it applies). The same
happens at the start of a stage, from the previous stage's last layout. The device at position j
processes the micro-batch slice `data_rank(strategy, j)` of `data_degree` slices.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paraplan.costs.slice_gather import data_rank
from paraplan.plans.plan import LayerStrategy


def replicated(group_size: int) -> LayerStrategy:
    """What every device of a group holds when it holds the whole micro-batch (the input batch)."""
    return LayerStrategy(tp=group_size)


def data_rows(strategy: LayerStrategy, position: int, rows: int) -> slice:
    """The rows of a micro-batch of `rows` samples the device at `position` processes."""
    n = strategy.data_degree
    r = data_rank(strategy, position)
    return slice(r * rows // n, (r + 1) * rows // n)


def _gather_rows(local: torch.Tensor, held: LayerStrategy, group, group_size: int) -> torch.Tensor:
    """The whole micro-batch from every device's slice under `held` (one device per slice)."""
    parts = [torch.empty_like(local) for _ in range(group_size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    first = {}
    for position in range(group_size):
        first.setdefault(data_rank(held, position), position)
    return torch.cat([parts[first[r]] for r in range(held.data_degree)])


def _contained(inner: LayerStrategy, outer: LayerStrategy, group_size: int) -> bool:
    """Whether on every device the rows it needs under `inner` lie within what it holds under `outer`
    (uniform over the group, so that all devices take the same branch of a collective)."""
    rows = inner.data_degree * outer.data_degree
    for p in range(group_size):
        a, b = data_rows(inner, p, rows), data_rows(outer, p, rows)
        if not (b.start <= a.start and a.stop <= b.stop):
            return False
    return True


def _redistribute(x: torch.Tensor, held: LayerStrategy, wanted: LayerStrategy, position: int, group,
                  group_size: int) -> torch.Tensor:
    """This device's slice under `wanted`, from every device's slice under `held`."""
    rows = x.shape[0] * held.data_degree
    if _contained(wanted, held, group_size):  # cut what this device has: free
        start = data_rows(held, position, rows).start
        cut = data_rows(wanted, position, rows)
        return x[cut.start - start:cut.stop - start].clone()
    return _gather_rows(x, held, group, group_size)[data_rows(wanted, position, rows)].clone()


class _Regroup(torch.autograd.Function):
    """From the slices of `held` to those of `wanted` (forward), and the gradient back, the same
    redistribution the other way (backward). A value held by several devices (tensor-parallel
    replicas) is the same on each, and so is its gradient: every holder gets the full gradient of
    its slice."""

    @staticmethod
    def forward(ctx, x, held, wanted, position, group, group_size):
        ctx.args = (held, wanted, position, group, group_size)
        return _redistribute(x, held, wanted, position, group, group_size)

    @staticmethod
    def backward(ctx, grad):
        held, wanted, position, group, group_size = ctx.args
        return _redistribute(grad, wanted, held, position, group, group_size), None, None, None, None, None


def regroup(value, held: LayerStrategy, wanted: LayerStrategy, position: int, group, group_size: int):
    """Slice-Gather `value` (a tensor, or a tuple of them, batch-first) from `held` to `wanted`."""
    if held.data_degree == wanted.data_degree and all(
            data_rank(held, p) == data_rank(wanted, p) for p in range(group_size)):
        return value
    if isinstance(value, tuple):
        return tuple(regroup(v, held, wanted, position, group, group_size) for v in value)
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return value
    if not value.requires_grad:  # token ids, images: no gradient to carry back
        return _redistribute(value, held, wanted, position, group, group_size)
    return _Regroup.apply(value, held, wanted, position, group, group_size)


class StrategyLayer(nn.Module):
    """A layer of the model under its strategy: its input regrouped from the previous layer's
    layout, then the layer itself (tensor parallel / sharded inside), under a non-reentrant checkpoint
    with full recomputation (FSDP2 re-gathers inside the recomputation, as its hooks run again).
    Sequence parallelism (runtime/layers/sequence_parallel.py): `enter` (a mesh) cuts the whole input into
    this rank's part of the sequence first, `leave` gathers the sequence-sharded output whole after;
    between consecutive SP layers of one layout neither is set and the Shard(1) DTensor passes."""

    def __init__(self, layer: nn.Module, held: LayerStrategy, strategy: LayerStrategy, position: int, group,
                 group_size: int, enter=None, leave: bool = False, checkpoint: bool = False):
        super().__init__()
        self.layer = layer
        self.held, self.strategy, self.position = held, strategy, position
        self._group, self.group_size = group, group_size
        self._enter, self.leave = enter, leave
        self.checkpoint = checkpoint  # full recomputation (parallelize.py: apply_recompute)

    def forward(self, x):
        x = regroup(x, self.held, self.strategy, self.position, self._group, self.group_size)
        if self._enter is not None or self.leave:
            from paraplan.runtime.layers.sequence_parallel import to_shards, to_whole

            if self._enter is not None:
                x = to_shards(x, self._enter)
        if self.checkpoint:
            from torch.utils.checkpoint import checkpoint

            from paraplan.runtime.measure.memory_meter import note_checkpoint_input

            note_checkpoint_input(x)
            y = checkpoint(self.layer, x, use_reentrant=False)
        else:
            y = self.layer(x)
        return to_whole(y) if self.leave else y
