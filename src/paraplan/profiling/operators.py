"""Measure every operator of a model's training iteration on a real device (per-node seconds).

FD-DPS prices an operator by its measured execution time on a device (Definition 3, E_{i,v}:
"the end execution time minus the start execution time ... averaged over iterations"; Definition 7
collects "the historical execution time of an operator"). The operator graph (models/op_trace.py)
knows each node's aten calls with their shapes (`operator_calls`); this module replays them:

  - each distinct call (op, shapes, strides, dtypes, other arguments) runs once per batch on fresh
    tensors of those shapes on `device` (floats from a normal distribution, integers and booleans
    zero, so indices - embedding ids, targets, pooling indices - are always valid), a warm-up run
    then the median of `repeats`; nodes running the same call (the blocks of a deep model) share
    the measurement;
  - a node's time is the sum of its calls (a backward Node may run several kernels); a node that
    runs no kernel (a view's backward) takes 0;
  - two batches give an Affine per node (seconds = fixed + per_sample * b), as everywhere else,
    clamped at zero slope and intercept like models/measure.py (timing noise on tiny kernels).
Calls whose tensors together exceed `max_bytes`, or that fail on the device (an op with no kernel
there), are not timed: their nodes are listed in `unmeasured` and get the time of their other calls.
The device's own launch overhead is part of every time (that is what a scheduler pays per operator).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from paraplan.models.built import BuiltModel
from paraplan.models.op_record import TensorSpec
from paraplan.models.op_trace import operator_calls
from paraplan.models.spec import Affine
from paraplan.profiling.timing import now


@dataclass(frozen=True)
class OperatorTimes:
    """Measured seconds of every node of a model's operator graph, affine in the batch."""

    model: str
    device: str
    batches: tuple[int, int]
    seconds: dict[str, Affine]  # node name (as in the OpGraph) -> seconds
    distinct_calls: int  # kernels actually timed (per batch)
    unmeasured: tuple[str, ...] = ()  # nodes with a call that could not be timed


def _span(spec: TensorSpec) -> int:
    """Elements of storage the strided tensor reaches (an expanded view reaches few)."""
    return 0 if 0 in spec.shape else 1 + sum((n - 1) * s for n, s in zip(spec.shape, spec.stride, strict=True))


def _specs(value) -> list[TensorSpec]:
    if isinstance(value, TensorSpec):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _specs(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _specs(v)]
    return []


def _real(value, device: torch.device, gen: torch.Generator):
    """TensorSpecs -> tensors with those strides on `device` (overlapping strides of an expanded
    view included: the storage is made, then viewed); the meta device -> `device`."""
    if isinstance(value, TensorSpec):
        if value.dtype.is_floating_point or value.dtype.is_complex:
            base = torch.randn(_span(value), generator=gen).to(value.dtype)
        else:
            base = torch.zeros(_span(value), dtype=value.dtype)
        return base.to(device).as_strided(value.shape, value.stride)
    if isinstance(value, torch.device):
        return device if value.type == "meta" else value
    if isinstance(value, dict):
        return {k: _real(v, device, gen) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_real(v, device, gen) for v in value)
    return value


def _key(call) -> object:
    try:
        key = repr(call)  # TensorSpecs, ops, numbers and devices all print exactly
        hash(key)
        return key
    except Exception:  # noqa: BLE001  (an argument without a faithful repr: time it every time)
        return None


def time_call(call, device: torch.device, repeats: int, gen: torch.Generator) -> float:
    """Median seconds of one aten call on fresh tensors of its recorded shapes."""
    func, args, kwargs = call
    args, kwargs = _real(args, device, gen), _real(kwargs, device, gen)
    samples = []
    with torch.no_grad():
        func(*args, **kwargs)  # warm-up: allocator, kernel selection, lazy initialisation
        for _ in range(repeats):
            start = now(device)
            func(*args, **kwargs)
            samples.append(now(device) - start)
    return statistics.median(samples)


def _measure(call, device: torch.device, repeats: int, gen: torch.Generator, max_bytes: int) -> float | None:
    if sum(_span(s) * s.dtype.itemsize for s in _specs(call[1:])) > max_bytes:
        return None
    try:
        return time_call(call, device, repeats, gen)
    except Exception:  # noqa: BLE001  (no kernel for it on this device, say: the node is reported)
        return None


def profile_operators(built: BuiltModel, batches: tuple[int, int] = (2, 4), device: str | torch.device = "cpu",
                      repeats: int = 5, max_bytes: int = 1 << 30, seed: int = 0, threads: int | None = None,
                      progress: Callable[[], None] | None = None) -> OperatorTimes:
    """Time every node of `built`'s operator graph on `device` at `batches` (the same batches as
    the graph's `traced_batches`, so the names and the affine fit line up). `threads`: the CPU
    threads torch may use meanwhile (default: as set)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _profile(built, batches, torch.device(device), repeats, max_bytes, seed, progress)
    finally:
        torch.set_num_threads(before)


def _profile(built: BuiltModel, batches: tuple[int, int], device: torch.device, repeats: int, max_bytes: int,
             seed: int, progress: Callable[[], None] | None) -> OperatorTimes:
    gen = torch.Generator().manual_seed(seed)
    b0, b1 = batches
    per_batch: list[dict[str, float]] = []
    unmeasured: set[str] = set()
    distinct = 0
    for batch in batches:
        cache: dict[object, float | None] = {}
        times: dict[str, float] = {}
        for name, calls in operator_calls(built, batch).items():
            total = 0.0
            for call in calls:
                key = _key(call)
                if key is not None and key in cache:
                    seconds = cache[key]
                else:
                    seconds = _measure(call, device, repeats, gen, max_bytes)
                    if key is not None:
                        cache[key] = seconds
                if seconds is None:
                    unmeasured.add(name)
                else:
                    total += seconds
            times[name] = total
            if progress is not None:
                progress()
        distinct = max(distinct, len(cache))
        per_batch.append(times)
    small, large = per_batch
    seconds = {}
    for name, t0 in small.items():  # timing noise must not make a time fall with the batch
        slope = max(0.0, (large[name] - t0) / (b1 - b0))
        seconds[name] = Affine(fixed=max(0.0, t0 - slope * b0), per_sample=slope)
    return OperatorTimes(model=built.ref or built.name, device=str(device), batches=(b0, b1), seconds=seconds,
                         distinct_calls=distinct, unmeasured=tuple(sorted(unmeasured)))
