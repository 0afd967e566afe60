"""The gradient sync of the layers that are not sharded (FSDP2 reduces its own): the dp dimension's
all-reduce once per iteration after the schedule, as the simulator prices the stage's dp sync (one
all-reduce per iteration, `grad_allreduce_bytes`); FSDP2's `replicate` was the other choice, but it
reduces after every micro-batch's backward unless the pipeline stage is itself the FSDP root, and
here the root holds layers of other strategies. ZeRO-1/2 layers go to layers/zero.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paraplan.runtime.measure.memory_meter import local_value


class DataParallelSync:
    """The dp dimension's gradient all-reduce (a sum), once per iteration, one flattened
    all-reduce per dp group; for tensor-parallel parameters, on their local shards. Before it, the
    sequence-parallel norms' Partial gradients are summed over their tp ranks (`sequence_params`). Layers with
    ZeRO-1/2 go to runtime/layers/zero.py's `ZeroSync`, one per (dp group, stage): the optimizer steps
    its `views` instead of those parameters (`optimizer_params`), and `gather` follows the step."""

    def __init__(self, groups: list[tuple[object, int, list[nn.Parameter]]], recorder=None,
                 sequence_params: list[nn.Parameter] | None = None):
        from paraplan.runtime.layers.zero import ZeroSync

        self.sequence_params = sequence_params or []
        self.groups = [(group, params) for group, zero, params in groups if not zero]
        self.zero = [ZeroSync(group, params, zero, recorder) for group, zero, params in groups if zero]
        self.recorder = recorder

    def optimizer_params(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """What the optimizer steps: `params`, with ZeRO's parameters replaced by its owned views."""
        sharded = {id(p) for z in self.zero for p in z.params}
        return [p for p in params if id(p) not in sharded] + [v for z in self.zero for v in z.views]

    def held_grad_bytes(self) -> int:
        """Gradient bytes held outside the parameters' .grad (ZeRO-2's accumulators)."""
        return sum(z.held_grad_bytes() for z in self.zero)

    def gather(self) -> None:
        for z in self.zero:
            z.gather()

    def finish(self) -> None:
        import time

        if self.sequence_params:  # (no ZeRO layer among them; the dp all-reduce below then sums tp sums)
            from paraplan.runtime.layers.sequence_parallel import sum_partial_grads

            start = time.time()
            sum_partial_grads(self.sequence_params)
            if self.recorder is not None:
                self.recorder.add("allreduce", "allreduce", -1, start, time.time())
        for z in self.zero:
            z.finish()
        start = time.time()
        for group, params in self.groups:
            grads = [local_value(p.grad) for p in params if p.grad is not None]
            if not grads:
                continue
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        if self.recorder is not None and self.groups:
            self.recorder.add("allreduce", "allreduce", -1, start, time.time())
