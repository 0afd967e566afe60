"""ZeRO-1 and ZeRO-2 (Rajbhandari et al. 2020, §5.1-5.2) for the replicated (dp) layers of a
plan with per-layer strategies: each dp replica keeps the optimizer states (ZeRO-1) and the
gradients (ZeRO-2) of 1/dp of the parameters, steps that part, and an all-gather gives every
replica all the updated parameters.

Why our own and not torch's: `ZeroRedundancyOptimizer` all-reduces the whole gradient and
broadcasts each parameter from its owner (1.5x the bytes of reduce-scatter + all-gather, and no
gradient sharding); FSDP2 with `reshard_after_forward=False` shards the parameters between steps
too (ZeRO-3's memory between steps) and keeps whole gradients across the micro-batches of a
pipeline. Here, as in DeepSpeed's stage 1 and 2 and as the simulator prices them
(simulator/plan_work.py, costs/strategy.py):

  layout    the group's parameters (their local shards under tp) flattened in order, padded to a
            multiple of dp; replica r owns the r-th of dp equal chunks. The optimizer steps views of
            the owned ranges (`nn.Parameter`s sharing the parameters' storage), so there is no
            second fp32 copy of the master weights, and Adam's states exist for 1/dp of them;
  ZeRO-1    the whole gradients accumulate over the micro-batches as without ZeRO; once per
            iteration one reduce-scatter (a sum, as every dp reduction here) gives each replica
            its chunk, written back into its own range of the gradients, which the optimizer's
            views read (the whole gradients stay allocated until the step is over, as ZeRO-1's do);
  ZeRO-2    after each micro-batch's backward (when every parameter of the group has its
            gradient: DeepSpeed's bucket, here the group's parameters) one reduce-scatter adds the
            micro-batch's gradients into the owned chunk's fp32 accumulator, and the whole
            gradients are freed: they never outlive one micro-batch's backward (DeepSpeed's stage 2
            also reduces at every micro-batch, not only at the accumulation boundary);
  after the step  one all-gather of the owned chunks into every replica's parameters.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from paraplan.runtime.measure.memory_meter import local_value


class ZeroSync:
    """ZeRO-`stage` (1 or 2) over one dp process group for `params` (replicated across it)."""

    def __init__(self, group, params: list[nn.Parameter], stage: int, recorder=None):
        if stage not in (1, 2):
            raise ValueError(f"ZeRO stage {stage}: this runs 1 and 2 (ZeRO-3 is FSDP2's sdp)")
        self.group, self.params, self.stage, self.recorder = group, params, stage, recorder
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        sizes = [local_value(p).numel() for p in params]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        total = self.offsets[-1]
        self.chunk = -(-total // self.size)
        lo, hi = self.rank * self.chunk, min((self.rank + 1) * self.chunk, total)
        self.owned: list[tuple[int, int, int]] = []  # (parameter index, start, stop) within its flattened local value
        for i in range(len(params)):
            a, b = max(lo, self.offsets[i]), min(hi, self.offsets[i + 1])
            if a < b:
                self.owned.append((i, a - self.offsets[i], b - self.offsets[i]))
        # the optimizer's parameters: views of the owned ranges, sharing the parameters' storage
        self.views = [nn.Parameter(_flat_local(params[i])[a:b]) for i, a, b in self.owned]
        self.accumulated: torch.Tensor | None = None  # ZeRO-2: this replica's chunk of the gradients, fp32
        self.pending: set[int] = set()
        if stage == 2:
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad)

    # --- ZeRO-2: one reduce-scatter per micro-batch --------------------------------------------------
    def _on_grad(self, p: nn.Parameter) -> None:
        self.pending.add(id(p))
        if len(self.pending) == len(self.params):
            self._reduce_scatter_into_accumulator()

    def _reduce_scatter_into_accumulator(self) -> None:
        chunk = self._reduce_scatter()
        self.accumulated = chunk if self.accumulated is None else self.accumulated.add_(chunk)
        for p in self.params:  # the whole gradients are not needed any more
            p.grad = None
        self.pending.clear()

    # --- both stages ------------------------------------------------------------------------------------
    def _reduce_scatter(self) -> torch.Tensor:
        """This replica's chunk of the sum over the group of the parameters' gradients (fp32)."""
        start = time.time()
        parts = []
        for p in self.params:
            g = None if p.grad is None else local_value(p.grad)
            parts.append(g.reshape(-1).float() if g is not None else torch.zeros(local_value(p).numel()))
        pad = self.chunk * self.size - self.offsets[-1]
        if pad:
            parts.append(torch.zeros(pad))
        flat = torch.cat(parts)
        out = torch.empty(self.chunk, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_single(out, flat, group=self.group)
        if self.recorder is not None:
            self.recorder.add("allreduce", "allreduce", -1, start, time.time())
        return out

    def finish(self) -> None:
        """After the schedule: give the optimizer's views this replica's reduced gradients."""
        if self.stage == 2:
            if self.pending or self.accumulated is None:  # a parameter without a gradient this step
                self._reduce_scatter_into_accumulator()
            chunk = self.accumulated
        else:
            chunk = self._reduce_scatter()
        lo = self.rank * self.chunk
        for view, (i, a, b) in zip(self.views, self.owned, strict=True):
            part = chunk[self.offsets[i] + a - lo:self.offsets[i] + b - lo]
            p = self.params[i]
            if self.stage == 1 and p.grad is not None:
                # into the whole gradient's own range: the views read it there, no second copy
                target = _flat_local_grad(p)[a:b]
                target.copy_(part)
                view.grad = target
            else:
                view.grad = part.view_as(view)

    def held_grad_bytes(self) -> int:
        """ZeRO-2's accumulator (the whole gradients are freed): what this replica holds for them."""
        return 0 if self.accumulated is None else self.accumulated.numel() * self.accumulated.element_size()

    def gather(self) -> None:
        """After the optimizer step: every replica gets every chunk; the step's gradients go."""
        start = time.time()
        owned = torch.cat([v.detach().reshape(-1) for v in self.views]) if self.views else torch.zeros(0)
        mine = torch.zeros(self.chunk, dtype=owned.dtype, device=owned.device)
        mine[:owned.numel()] = owned
        everything = torch.empty(self.chunk * self.size, dtype=mine.dtype, device=mine.device)
        dist.all_gather_single(everything, mine, group=self.group)
        with torch.no_grad():
            for i, p in enumerate(self.params):
                _flat_local(p).copy_(everything[self.offsets[i]:self.offsets[i + 1]])
        if self.recorder is not None:
            self.recorder.add("allreduce", "allreduce", -1, start, time.time())
        for p in self.params:
            p.grad = None
        for view in self.views:
            view.grad = None
        self.accumulated = None


def _flat_local(p: nn.Parameter) -> torch.Tensor:
    """The parameter's local values, flattened, sharing its storage (a DTensor's local shard)."""
    value = local_value(p.detach())
    if not value.is_contiguous():
        raise RuntimeError("ZeRO needs contiguous parameters")
    return value.view(-1)


def _flat_local_grad(p: nn.Parameter) -> torch.Tensor:
    g = local_value(p.grad)
    return g.view(-1)
