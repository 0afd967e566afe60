"""What one rank holds, measured on the real tensors: parameters, gradients and optimizer states
(this rank's shards), and the peak of the activations autograd keeps for the backward.

Activations are counted the way the profiler counts them (models/measure.py, profiling/layers.py):
a `saved_tensors_hooks` pack hook sees every tensor autograd saves (and hands autograd a detached
alias of it, whose lifetime is followed: see `_pack`); parameters are left out (an
FSDP2-gathered weight is a Parameter too: the planner counts it as a gather buffer, not as an
activation; a TP weight's local shard by its storage. Not yet: a layer both SDP and TP, whose
gathered local shard is neither, counts as activations), and each storage counts once. Here the hook also follows each storage until it is
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
    def __init__(self, parameters=()):
        # the storages of this rank's parameters: a tensor-parallel weight is a DTensor whose local
        # shard autograd saves as a plain tensor; it is a parameter, not an activation (AlexNet's
        # column-parallel classifier counted its 72 MiB weight shard as activations)
        self.param_storages = {local_value(p).untyped_storage().data_ptr() for p in parameters}
        self.live: dict[int, tuple[int, bool]] = {}  # storage address -> (bytes, a weight copy)
        self.holders: dict[int, int] = {}  # storage address -> how many saved aliases still hold it
        self.live_bytes = 0
        self.peak_activation_bytes = 0
        # mixed precision: autocast's bf16 weight copies, which autograd saves too; filed apart
        # (the planner counts them as "16-bit weight copies", not activations)
        self.live_copy_bytes = 0
        self.peak_copy_bytes = 0

    def _countable(self, t: torch.Tensor) -> bool:
        base = _storage_of(t)
        return not (isinstance(t, nn.Parameter) or isinstance(base, nn.Parameter) or base.device.type == "meta"
                    or base.untyped_storage().data_ptr() in self.param_storages)

    def _add(self, t: torch.Tensor, holder: torch.Tensor | None = None) -> None:
        """Count t's storage while `holder` (what autograd keeps: the pack hook's alias) lives; a
        storage saved several times counts once, until its last holder goes."""
        if not self._countable(t):
            return
        base = _storage_of(t)
        storage = base.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() == 0:
            return
        weakref.finalize(holder if holder is not None else base, self._release, key)
        if key in self.live:
            self.holders[key] += 1
            return
        self.holders[key] = 1
        copy = _is_weight_copy(t)
        self.live[key] = (storage.nbytes(), copy)
        if copy:
            self.live_copy_bytes += storage.nbytes()
            self.peak_copy_bytes = max(self.peak_copy_bytes, self.live_copy_bytes)
        else:
            self.live_bytes += storage.nbytes()
            self.peak_activation_bytes = max(self.peak_activation_bytes, self.live_bytes)

    def _release(self, key: int) -> None:
        self.holders[key] = self.holders.get(key, 1) - 1
        if self.holders[key] > 0:
            return
        self.holders.pop(key, None)
        nbytes, copy = self.live.pop(key, (0, False))
        if copy:
            self.live_copy_bytes -= nbytes
        else:
            self.live_bytes -= nbytes

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """What autograd keeps: an alias of t without its autograd history. Returning t itself would
        make an op's saved output hold its own grad_fn, a reference cycle inside autograd that
        nothing collects while the graph is retained: under torch's split backward (zero-bubble's
        input pass runs with retain_graph=True) every micro-batch's input-path tensors then stayed
        alive to the end of the step, measured here as 52 MiB of gpt2-tiny's where autograd itself
        holds none (benchmarks/split_backward_memory.py)."""
        if not self._countable(t):
            return t
        alias = t.detach()
        self._add(t, holder=alias)
        return alias

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
