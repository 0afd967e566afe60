"""Fit the analytic device model (costs/timefn.py: ComputeTime) to measured layer times.

`paraplan calibrate` profiles a few reference models on this machine's cores and fits the device
figures so that planning a model it never profiled still predicts this machine's compute. The
model per layer pass (forward or backward) at batch b is the roofline of ComputeTime:

    t(b) = n_ops * k + max(F(b) / E, bytes(b) / M)

with E the effective FLOP rate of large kernels (peak x max efficiency), k the per-kernel
dispatch cost and M the memory bandwidth. ComputeTime's half-efficiency term n_ops * w_half / E
multiplies n_ops exactly as k does, so on these measurements the two cannot be told apart: the fit
folds it into k (w_half is set to a negligible 1 FLOP). Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.costs.analytic import analytic_costs
from paraplan.costs.profile import Profile
from paraplan.hardware.cluster import DeviceSpec, LinkSpec
from paraplan.models.spec import ModelSpec


@dataclass(frozen=True)
class LayerSamples:
    """One row per (layer, pass, batch size): what the device model sees and what was measured."""

    flops: np.ndarray
    traffic: np.ndarray
    n_ops: np.ndarray
    seconds: np.ndarray
    model: np.ndarray  # the model each row belongs to (for per-model step errors)
    batch: np.ndarray


@dataclass(frozen=True)
class ComputeFit:
    flops_per_s: float  # E: effective rate of large kernels
    kernel_overhead_s: float  # k
    memory_bandwidth_bytes_per_s: float  # M
    median_abs_error: float  # over layer passes: |predicted / measured - 1|
    step_errors: dict  # model -> {batch: predicted sum / measured sum - 1}
    samples: int


def layer_samples(pairs: list[tuple[ModelSpec, Profile]]) -> LayerSamples:
    """The analytic model's FLOPs, bytes and kernel counts beside the profile's medians."""
    dummy = DeviceSpec("fit", 1.0, 1.0, 1, 0.0, 1.0, 1.0)
    rows: list[tuple] = []
    for spec, profile in pairs:
        costs = analytic_costs(spec, dummy, LinkSpec(1.0, 0.0))
        for i, layer in enumerate(profile.layers):
            for fn, timings in ((costs.forward[i], layer.forward), (costs.backward[i], layer.backward)):
                for b, t in zip(layer.batch_sizes, timings, strict=True):
                    rows.append((fn.flops.fixed + fn.flops.per_sample * b,
                                 fn.memory_bytes.fixed + fn.memory_bytes.per_sample * b, fn.n_ops, t.median_s,
                                 profile.model, b))
    if not rows:
        raise ValueError("no measured layers to fit")
    cols = list(zip(*rows, strict=True))
    return LayerSamples(*(np.asarray(c, dtype=float) for c in cols[:4]), model=np.asarray(cols[4]),
                        batch=np.asarray(cols[5], dtype=int))


def _predict(s: LayerSamples, e, k, m) -> np.ndarray:
    """Vectorised over candidate parameters: e, k, m broadcast against the rows (last axis)."""
    compute = np.where(s.flops > 0, s.flops / e, 0.0)
    return s.n_ops * k + np.maximum(compute, s.traffic / m)


def fit_compute(s: LayerSamples) -> ComputeFit:
    """Least squares of log time, each row weighted by its measured share of the time (the large
    layers decide a step's time), over a log grid of (E, k, M) and then a finer grid around the
    best point. A grid rather than a gradient method: three parameters, a max() that is not
    differentiable everywhere, and no scipy in the dependencies."""
    keep = s.seconds > 0
    s = LayerSamples(*(getattr(s, f)[keep] for f in ("flops", "traffic", "n_ops", "seconds", "model", "batch")))
    weight = s.seconds / s.seconds.sum()
    log_meas = np.log(s.seconds)

    def best(e_grid, k_grid, m_grid):
        e, k, m = np.meshgrid(e_grid, k_grid, m_grid, indexing="ij")
        e, k, m = e.reshape(-1, 1), k.reshape(-1, 1), m.reshape(-1, 1)
        errors = np.empty(len(e))
        for lo in range(0, len(e), 4096):  # bounded memory: 4096 candidates x rows at a time
            pred = _predict(s, e[lo:lo + 4096], k[lo:lo + 4096], m[lo:lo + 4096])
            errors[lo:lo + 4096] = (weight * (np.log(np.maximum(pred, 1e-12)) - log_meas) ** 2).sum(axis=1)
        i = int(np.argmin(errors))
        return float(e[i, 0]), float(k[i, 0]), float(m[i, 0])

    e, k, m = best(np.logspace(7, 13, 49), np.logspace(-8, -3, 41), np.logspace(8, 13, 41))
    for half in (0.5, 0.2, 0.08, 0.03, 0.01, 0.004):  # shrinking boxes (decades) around the best so far
        box = np.logspace(-half, half, 15)
        e, k, m = best(e * box, k * box, m * box)
    pred = _predict(s, e, k, m)
    steps: dict = {}
    for model in sorted(set(s.model.tolist())):
        for b in sorted(set(s.batch[s.model == model].tolist())):
            rows = (s.model == model) & (s.batch == b)
            steps.setdefault(model, {})[int(b)] = float(pred[rows].sum() / s.seconds[rows].sum() - 1.0)
    return ComputeFit(flops_per_s=e, kernel_overhead_s=k, memory_bandwidth_bytes_per_s=m,
                      median_abs_error=float(np.median(np.abs(pred / s.seconds - 1.0))), step_errors=steps,
                      samples=len(s.seconds))


def fitted_device(base: DeviceSpec, fit: ComputeFit, source: str) -> DeviceSpec:
    """`base` (name, memory) with the fitted figures: peak_flops is the fitted effective rate and
    max_efficiency 1, so that peak x max efficiency = E; w_half negligible (folded into k). The fit
    is of fp32 runs: the other dtypes keep the base's effective rate relative to fp32 (peak x
    efficiency; not measured), folded into their peaks."""
    ratio = fit.flops_per_s / base.peak_flops
    return replace(base, peak_flops=fit.flops_per_s, max_efficiency=1.0, half_efficiency_flops=1.0,
                   other_peaks=tuple((dtype, peak * ratio * base.efficiency_for(dtype) / base.max_efficiency)
                                     for dtype, peak in base.other_peaks), other_efficiencies=(),
                   kernel_overhead_s=fit.kernel_overhead_s,
                   memory_bandwidth_bytes_per_s=fit.memory_bandwidth_bytes_per_s, source=source)
