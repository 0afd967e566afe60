"""What one rank holds, measured on the real tensors: parameters, gradients and optimizer states
(this rank's shards), and the peak of the activations autograd keeps for the backward.

Activations are counted the way the profiler counts them (models/measure.py, profiling/layers.py):
a `saved_tensors_hooks` pack hook sees every tensor autograd saves; parameters are left out (an
FSDP2-gathered weight is a Parameter too: the planner counts it as a gather buffer, not as an
activation), and each storage counts once. Here the hook also follows each storage until it is
freed (a weak reference's finalizer), so the peak over the schedule is the most bytes alive at
once with several micro-batches in flight. A checkpointed layer keeps its input: the non-reentrant
checkpoint saves it under its own hook, so `StrategyLayer` reports it here (`note_checkpoint_input`).
Autocast's low-precision weight copies (mixed precision) are saved by autograd too: they are
counted apart (`peak_copy_bytes`), as the planner files them under parameters. Two things the
hooks cannot see: the copies of checkpointed layers (autocast's cache holds them for the step,
autograd does not save them) and a checkpointed layer's recomputation (saved under the
checkpoint's own hooks, during its backward).
On a GPU the allocator's peak is recorded too.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch import nn

_ACTIVE: list[MemoryMeter] = []  # the meter of the running step, if any (one per process)


def _storage_of(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t._local_tensor
    return t._base if t._base is not None else t


def _is_weight_copy(t: torch.Tensor) -> bool:
    """A low-precision copy of a parameter made by autocast (its weight cache): a cast whose
    input is a leaf that autograd accumulates into, possibly seen through a view (a transpose)."""
    for candidate in (t, t._base):
        fn = getattr(candidate, "grad_fn", None)
        while fn is not None and type(fn).__name__ in ("TBackward0", "TransposeBackward0", "ViewBackward0",
                                                        "PermuteBackward0", "ExpandBackward0"):
            fn = fn.next_functions[0][0] if fn.next_functions else None
        if fn is not None and type(fn).__name__ == "ToCopyBackward0" and fn.next_functions and \
                type(fn.next_functions[0][0]).__name__ == "AccumulateGrad":
            return True
    return False


class MemoryMeter:
    def __init__(self):
        self.live: dict[int, tuple[int, bool]] = {}  # storage address -> (bytes, a weight copy)
        self.live_bytes = 0
        self.peak_activation_bytes = 0
        # mixed precision: autocast's bf16 weight copies, which autograd saves too; filed apart
        # (the planner counts them as "16-bit weight copies", not activations)
        self.live_copy_bytes = 0
        self.peak_copy_bytes = 0

    def _add(self, t: torch.Tensor) -> None:
        base = _storage_of(t)
        if isinstance(t, nn.Parameter) or isinstance(base, nn.Parameter) or base.device.type == "meta":
            return
        storage = base.untyped_storage()
        key = storage.data_ptr()
        if key in self.live or storage.nbytes() == 0:
            return
        copy = _is_weight_copy(t)
        self.live[key] = (storage.nbytes(), copy)
        if copy:
            self.live_copy_bytes += storage.nbytes()
            self.peak_copy_bytes = max(self.peak_copy_bytes, self.live_copy_bytes)
        else:
            self.live_bytes += storage.nbytes()
            self.peak_activation_bytes = max(self.peak_activation_bytes, self.live_bytes)
        weakref.finalize(base, self._free, key)

    def _free(self, key: int) -> None:
        nbytes, copy = self.live.pop(key, (0, False))
        if copy:
            self.live_copy_bytes -= nbytes
        else:
            self.live_bytes -= nbytes

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._add(t)
        return t

    @contextlib.contextmanager
    def watching(self):
        """Count what autograd saves while the block runs (the schedule's forwards)."""
        _ACTIVE.append(self)
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                yield
        finally:
            _ACTIVE.remove(self)


def note_checkpoint_input(value) -> None:
    """A checkpointed layer's input stays alive for its recomputation: count it."""
    if not _ACTIVE:
        return
    for t in value if isinstance(value, tuple) else (value,):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            _ACTIVE[-1]._add(t)


def local_value(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard, any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def state_bytes(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This rank's parameters, gradients and optimizer states in bytes (local shards of DTensors)."""
    local = local_value
    out = {"params": 0, "grads": 0, "optimizer": 0}
    for p in params:
        out["params"] += local(p).numel() * p.element_size()
        if p.grad is not None:
            out["grads"] += local(p.grad).numel() * p.grad.element_size()
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                out["optimizer"] += local(value).numel() * value.element_size()
    return out
