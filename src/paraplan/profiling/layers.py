"""Measure every layer's forward and backward time at several micro-batch sizes.

Each repeat is one real training step of the whole layer chain (forward, loss, backward), with
timestamps at the layer boundaries:
  - forward: a clock reading after each layer's call (the device is synchronised first);
  - backward: autograd runs a chain's backward one node after another on the calling thread, so
    a hook on each layer's input tensors fires when that layer's backward has finished; the time
    between two such hooks is one layer's backward, run with exactly the saved tensors it keeps in
    training. The first layer's backward ends when `backward()` returns; the last layer's starts
    when `backward()` is called. The loss's forward and backward are counted in the last layer,
    since the last pipeline stage computes it.
Timing each layer in a separate autograd call instead adds a per-call engine start (tens of us on
a CPU) to every layer, which is real per stage but not per layer; the chain keeps it out, so the
per-layer sum can be checked against a plain training step.
Tuple outputs are handled (a tensor that a layer passes through unchanged, like T5's encoder
output, is not used to mark that layer's end); integer tensors carry no gradient.
Peak memory per layer: on a GPU, the allocator's peak during the layer's forward above what was
live before it; on the CPU (no allocator statistics) the bytes the forward leaves alive, its
saved tensors plus its output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from paraplan.costs.profile import Timing
from paraplan.errors import ParaplanError
from paraplan.models.tensors import nbytes, tensors
from paraplan.profiling.timing import now, timing_of


@dataclass(frozen=True)
class LayerTiming:
    batch: int
    forward: Timing
    backward: Timing
    output_bytes: int
    saved_bytes: int  # measured on the real tensors, defined as in models/measure.py
    peak_bytes: int  # memory the layer's forward needs at its peak (see _step)


def _step(layers, x, targets, loss_fn, device, params: set[int]):
    """One training step with per-layer marks: (forward_s, backward_s, output_bytes, saved_bytes) lists."""
    n = len(layers)
    current = [0]
    saved: list[dict[int, int]] = [{} for _ in range(n)]
    alive = []

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if id(base) not in params:
            alive.append(base)
            saved[current[0]][id(base)] = base.numel() * base.element_size()
        return t

    fwd = [0.0] * n
    peaks = [0] * n
    outs = []
    h = x
    cuda = device.type == "cuda"
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        t = now(device)
        for i, (_, _, layer) in enumerate(layers):
            current[0] = i
            if cuda:  # the allocator's peak during this layer's forward, above what was live before it
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            h = layer(h)
            t_next = now(device)
            fwd[i], t = t_next - t, t_next
            if cuda:
                peaks[i] = torch.cuda.max_memory_allocated(device) - base
            outs.append(h)
            if cuda:
                t = now(device)
    loss = loss_fn(h, targets)
    fwd[-1] += now(device) - t  # the last stage computes the loss: it belongs to the last layer
    ends = [0.0] * n
    handles = []
    for i in range(1, n):
        passed = {id(o) for o in tensors(outs[i])}
        marks = [v for v in tensors(outs[i - 1]) if v.requires_grad and id(v) not in passed]
        if not marks:
            raise ParaplanError(f"layer {layers[i][0]}: no floating-point input to time its backward by")
        remaining = [len(marks)]

        def hook(grad, i=i, remaining=remaining):
            remaining[0] -= 1
            if remaining[0] == 0:
                ends[i] = now(device)
            return grad

        handles += [m.register_hook(hook) for m in marks]
    t_start = now(device)
    loss.backward()
    ends[0] = now(device)
    for handle in handles:
        handle.remove()
    bwd = [0.0] * n
    previous = t_start
    for i in reversed(range(n)):
        bwd[i] = max(0.0, ends[i] - previous)
        previous = ends[i]
    saved_sizes = [sum(s.values()) for s in saved]
    if not cuda:  # no allocator statistics on the CPU: what the forward leaves alive (kept + output)
        peaks = [s + nbytes(o) for s, o in zip(saved_sizes, outs, strict=True)]
    return fwd, bwd, [nbytes(o) for o in outs], saved_sizes, peaks


def profile_layers(layers: list[tuple[str, str, nn.Module]], make_batch: Callable[[int], tuple], loss_fn,
                   batch_sizes: list[int], device: torch.device, warmup: int, repeats: int,
                   progress: Callable[[], None] | None = None) -> list[list[LayerTiming]]:
    """timings[layer][k] for batch_sizes[k]."""
    params = {id(p) for _, _, m in layers for p in m.parameters()}
    timings: list[list[LayerTiming]] = [[] for _ in layers]
    for batch in batch_sizes:
        x, targets = make_batch(batch)
        f_all, b_all = [], []
        out_bytes = saved_bytes = peak_bytes = []
        for r in range(warmup + repeats):
            try:
                f, b, out_bytes, saved_bytes, peak_bytes = _step(layers, x, targets, loss_fn, device, params)
            except (RuntimeError, ValueError) as exc:
                raise ParaplanError(f"the model fails at micro-batch {batch}: {str(exc).splitlines()[0]}") from None
            for _, _, layer in layers:
                layer.zero_grad(set_to_none=True)
            if r >= warmup:
                f_all.append(f)
                b_all.append(b)
            if progress is not None:
                progress()
        for i in range(len(layers)):
            timings[i].append(LayerTiming(batch=batch, forward=timing_of([f[i] for f in f_all]),
                                          backward=timing_of([b[i] for b in b_all]),
                                          output_bytes=out_bytes[i], saved_bytes=saved_bytes[i],
                                          peak_bytes=peak_bytes[i]))
    return timings


def step_check(layers: list[tuple[str, str, nn.Module]], make_batch: Callable[[int], tuple], loss_fn, batch: int,
               device: torch.device, warmup: int, repeats: int) -> tuple[Timing, float]:
    """The honesty check: a plain training step (no hooks, no marks) against the sum of the
    per-layer times, the two interleaved step by step so that both see the same machine (on a
    shared CPU, conditions drift between runs by more than the gap being checked).
    Returns (plain step timing, median over steps of the per-layer sum)."""
    params = {id(p) for _, _, m in layers for p in m.parameters()}
    inputs, targets = make_batch(batch)
    plain, sums = [], []
    for r in range(warmup + repeats):
        t0 = now(device)
        h = inputs
        for _, _, layer in layers:
            h = layer(h)
        loss_fn(h, targets).backward()
        t1 = now(device)
        for _, _, layer in layers:
            layer.zero_grad(set_to_none=True)
        f, b, _, _, _ = _step(layers, inputs, targets, loss_fn, device, params)
        for _, _, layer in layers:
            layer.zero_grad(set_to_none=True)
        if r >= warmup:
            plain.append(t1 - t0)
            sums.append(sum(f) + sum(b))
    return timing_of(plain), sorted(sums)[len(sums) // 2]
