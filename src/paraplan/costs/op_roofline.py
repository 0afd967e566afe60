"""A layer's time as the sum of its kernels' times, each priced by its own roofline (issue 48, item 1).

The layer roofline (costs/timefn.py `ComputeTime`) prices a whole layer at one efficiency,
max(compute, memory) over all its kernels, as if the norms and residual adds hid under the GEMMs'
compute. On a GPU they do not: kernels run one after another, each bound by its own resource. Here
a pass of a layer (its kernels by class, models/op_inventory.py) is priced kernel by kernel:

  GEMM (batch B, M x K @ K x N, e-byte operands): cuBLAS tiles the output into thread-block tiles
      of tm x tn; a GPU with S SMs runs one wave of S tiles at a time, so the work done is
          waves = ceil(B * ceil(M / tm) * ceil(N / tn) / S)  (tile and wave quantisation)
          compute = waves * 2 tm tn K / (peak * MAMF / S)
      (NVIDIA, "Matrix Multiplication Background User's Guide": tile quantisation and wave
      quantisation; its example, the A100's 108 SMs with 256 x 128 tiles, one tile per SM per
      wave). Both tile orientations are tried, as cuBLAS's heuristics would. The ceiling is the
      Maximum Achievable Matmul FLOPS (MAMF) measured for the device (the presets'
      max_efficiency), reached by a full wave of full tiles. Memory: e (B M K + B K N + B M N)
      bytes at the achievable bandwidth. time = max(compute, memory).
  fused attention (FlashAttention-2 as PyTorch's SDPA runs it): its FLOPs (causal: half) at the
      kernel's published fraction of peak (`attention_efficiency`), its bytes (q, k, v, output) at
      the achievable bandwidth, whichever is longer.
  other compute (convolutions, ...): FLOPs at MAMF, bytes at the achievable bandwidth.
  memory-bound kernels (norms, activations, residual adds, softmax, dropout, casts): the bytes they
      read and write at the achievable bandwidth (`memory_efficiency` of the datasheet's).

Every kernel takes at least the launch interval (`kernel_overhead_s`): the host issues kernels one
after another, and a kernel shorter than that leaves the GPU waiting (in eager PyTorch the launch
and dispatch cost is paid on the host while earlier kernels run, so it adds only where kernels
are shorter). Time per sample still falls with the micro-batch and flattens (CSIMD Fig. 1): small
micro-batches leave waves part-empty and kernels launch-bound.

Only devices described down to their SMs (`DeviceSpec.sm_count`) are priced this way; CPUs and the
papers' older testbeds keep the layer roofline with their fitted constants (costs/analytic.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from paraplan.hardware.cluster import DeviceSpec
from paraplan.models.spec import Affine, Gemm, PassOps


def _at(value: Affine, b: np.ndarray) -> np.ndarray:
    return value.fixed + value.per_sample * b


def gemm_seconds(batch, m, n, k, element_bytes: int, device: DeviceSpec, scale_bytes: float = 0.0) -> np.ndarray:
    """One GEMM's time on `device` (batch independent M x K @ K x N products; arrays broadcast):
    the wave-quantised compute at the device's MAMF, or its operands' traffic, whichever is longer,
    and at least one launch. `element_bytes` 1: an FP8 GEMM (costs/fp8_linear.py) at the device's
    FP8 peak and its FP8 efficiency, FP8 operands (with `scale_bytes` of block scales per element)
    and a bf16 output."""
    batch, m, n, k = (np.asarray(x, dtype=float) for x in (batch, m, n, k))
    tm, tn = device.gemm_tile
    tiles = np.minimum(batch * np.ceil(m / tm) * np.ceil(n / tn), batch * np.ceil(m / tn) * np.ceil(n / tm))
    waves = np.ceil(tiles / device.sm_count)
    if element_bytes == 1:
        if device.fp8_gemm_flops <= 0:
            raise ValueError(f"{device.name}: an FP8 GEMM on a device view without its FP8 peak "
                             "(DeviceSpec.for_precision('fp8', recipe))")
        per_sm = device.fp8_gemm_flops * device.fp8_gemm_efficiency / device.sm_count
        traffic = batch * ((1.0 + scale_bytes) * (m * k + k * n) + 2.0 * m * n)
    else:
        per_sm = device.peak_flops * device.max_efficiency / device.sm_count
        traffic = element_bytes * batch * (m * k + k * n + m * n)
    compute = waves * 2.0 * tm * tn * k / per_sm
    memory = traffic / achievable_bandwidth(device)
    t = np.maximum(compute, memory)
    return np.where(batch * m * n * k > 0, np.maximum(t, device.kernel_overhead_s), 0.0)


def achievable_bandwidth(device: DeviceSpec) -> float:
    return device.memory_bandwidth_bytes_per_s * device.memory_efficiency


def pass_seconds(ops: PassOps, device: DeviceSpec, batch) -> np.ndarray:
    """The pass's time at micro-batch `batch` (a float or an array): the sum of its kernels' times."""
    b = np.asarray(batch, dtype=float)
    total = np.zeros_like(b)
    bandwidth = achievable_bandwidth(device)
    launch = device.kernel_overhead_s
    for g in ops.gemms:
        total = total + g.count * _gemm(g, device, b)
    for op in ops.memory_ops:
        total = total + op.count * np.maximum(_at(op.nbytes, b) / bandwidth, launch)
    if ops.attention_kernels:
        attention = np.maximum(_at(ops.attention_flops, b) / (device.peak_flops * device.attention_efficiency),
                               _at(ops.attention_bytes, b) / bandwidth)
        total = total + np.maximum(attention, ops.attention_kernels * launch)
    if ops.other_kernels:
        other = np.maximum(_at(ops.other_flops, b) / (device.peak_flops * device.max_efficiency),
                           _at(ops.other_bytes, b) / bandwidth)
        total = total + np.maximum(other, ops.other_kernels * launch)
    return total


def _gemm(g: Gemm, device: DeviceSpec, b: np.ndarray) -> np.ndarray:
    return gemm_seconds(_at(g.batch, b), _at(g.m, b), _at(g.n, b), _at(g.k, b), g.element_bytes, device, g.scale_bytes)


@dataclass(frozen=True)
class OperatorTime:
    """A TimeFunction (costs/timefn.py): one pass of one layer, priced kernel by kernel.
    `replicated`: the part of `ops` every tensor-parallel rank runs whole unless sequence
    parallelism splits it (an engine profile's norms and residual adds: costs/engine_profile.py);
    None: all of it splits over tp (costs/strategy.py: layer_time). `selective`: the part the
    engine's selective recomputation runs again, where the profile knows it."""

    ops: PassOps
    device: DeviceSpec
    replicated: PassOps | None = None
    selective: PassOps | None = None  # the kernels the engine's selective recomputation runs again; None: unknown
    # (which pass, micro-batch) -> seconds: a search asks the same layer at the same few micro-batches
    # tens of thousands of times (the Megatron grid at 1,024 GPUs: 100,000 calls, 13 s of its 40)
    _memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def _seconds(self, which: str, ops: PassOps, batch) -> float:
        key = (which, float(batch))
        if key not in self._memo:
            self._memo[key] = float(pass_seconds(ops, self.device, batch))
        return self._memo[key]

    def __call__(self, batch):
        if np.ndim(batch):
            return pass_seconds(self.ops, self.device, batch)
        return self._seconds("all", self.ops, batch)

    def selective_s(self, batch) -> float | None:
        return self._seconds("selective", self.selective, batch) if self.selective is not None else None

    def replicated_s(self, batch) -> float:
        return self._seconds("replicated", self.replicated, batch) if self.replicated is not None else 0.0
