"""Time functions: seconds as a function of micro-batch size b.

A planner sees only `TimeFunction`s, never where they came from, so an analytic device model
and a measured profile plug in the same way. Each takes a float or a numpy array of sizes (so
CSIMD's ODPA can evaluate every candidate micro-batch count at once) and returns the same shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from paraplan.hardware.cluster import DeviceSpec, LinkSpec
from paraplan.models.spec import Affine


class TimeFunction(Protocol):
    def __call__(self, batch: float | np.ndarray) -> float | np.ndarray: ...


@dataclass(frozen=True)
class ComputeTime:
    """Roofline with per-kernel overhead and an efficiency that falls for small kernels.

        t(b) = n_ops * overhead + max(compute(b), memory(b))
        compute(b) = F(b) / (peak * eff),  eff = max_eff * w / (w + w_half),  w = F(b) / n_ops
                   = (F(b) + n_ops * w_half) / (peak * max_eff)
        memory(b) = bytes(b) / memory_bandwidth

    The intercepts make time per sample fall with batch size and flatten out, the shape CSIMD
    Fig. 1 measures (compute: H^P forward, J^P backward in CSIMD).
    """

    flops: Affine
    memory_bytes: Affine
    n_ops: int
    device: DeviceSpec

    def __call__(self, batch):
        b = np.asarray(batch, dtype=float)
        flops = self.flops.fixed + self.flops.per_sample * b
        traffic = self.memory_bytes.fixed + self.memory_bytes.per_sample * b
        d = self.device
        compute = (flops + self.n_ops * d.half_efficiency_flops) / (d.peak_flops * d.max_efficiency)
        compute = np.where(flops > 0, compute, 0.0)
        memory = traffic / d.memory_bandwidth_bytes_per_s
        t = self.n_ops * d.kernel_overhead_s + np.maximum(compute, memory)
        return t if t.ndim else float(t)


@dataclass(frozen=True)
class TransferTime:
    """alpha + bytes(b) / beta over one link (communication: H^M forward, J^M backward in CSIMD;
    FD-DPS Definition 4)."""

    nbytes: Affine
    link: LinkSpec

    def __call__(self, batch):
        b = np.asarray(batch, dtype=float)
        nbytes = self.nbytes.fixed + self.nbytes.per_sample * b
        t = np.where(nbytes > 0, self.link.latency_s + nbytes / self.link.bandwidth_bytes_per_s, 0.0)
        return t if t.ndim else float(t)


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer time functions (CSIMD eq. (7): H is forward, J backward; ^P compute, ^M communication):
    forward H^P, backward J^P, send_forward H^M (this layer's output across a cut after it),
    send_backward J^M (the gradient of that output back). The two transfer functions are priced on
    one representative link and serve `paraplan inspect`'s table; planners and the simulator price
    every transfer from the layer's bytes on the actual link between two devices."""

    forward: tuple[TimeFunction, ...]
    backward: tuple[TimeFunction, ...]
    send_forward: tuple[TimeFunction, ...]
    send_backward: tuple[TimeFunction, ...]
    source: str  # "analytic:<device>" or "profile:<file>"
    # the engine prefetches FSDP's all-gathers (FSDP2: the next layer's gather runs while this one
    # computes), so they overlap the forward (costs/engine_profile.py; costs/strategy.py: layer_time)
    fsdp_prefetch: bool = False

    @property
    def n_layers(self) -> int:
        return len(self.forward)

    def arrays(self, batch: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(forward, backward, send_forward, send_backward) at one micro-batch size, as numpy arrays
        over layers: CSIMD's H^P, J^P, H^M, and J^M shifted by one (send_backward[k] is the
        gradient of layer k's output, which is J^M_{k+1}, the gradient of layer k+1's input)."""
        return tuple(np.array([float(f(batch)) for f in fns])
                     for fns in (self.forward, self.backward, self.send_forward, self.send_backward))


@dataclass(frozen=True)
class PiecewiseLinear:
    """A measured time function: linear between measured micro-batch sizes.

    Beyond the measurements (stated rule): below the smallest size the time stays at the smallest
    size's time (small batches are dominated by fixed overheads, so time does not fall to zero);
    above the largest it continues with the slope of the last segment, never below the last point.
    """

    sizes: tuple[float, ...]  # increasing
    seconds: tuple[float, ...]

    def __call__(self, batch):
        b = np.asarray(batch, dtype=float)
        xs, ys = np.asarray(self.sizes), np.asarray(self.seconds)
        t = np.interp(b, xs, ys)
        if len(xs) > 1:
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            t = np.where(b > xs[-1], ys[-1] + slope * (b - xs[-1]), t)
        return t if t.ndim else float(t)
