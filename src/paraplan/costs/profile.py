"""A measured profile as pure data, and the time functions it gives (in place of analytic ones).

Made by `paraplan profile` (profiling/profiler.py), stored as JSON (profiling/profile_file.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.costs.timefn import LayerCosts, PiecewiseLinear, TransferTime
from paraplan.hardware.cluster import LinkSpec
from paraplan.models.spec import Affine


@dataclass(frozen=True)
class Timing:
    """Median of repeated measurements with the spread (seconds)."""

    median_s: float
    min_s: float
    max_s: float
    q1_s: float
    q3_s: float
    repeats: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.q3_s - self.q1_s) / self.median_s if self.median_s > 0 else 0.0


@dataclass(frozen=True)
class LayerProfile:
    name: str
    kind: str
    batch_sizes: tuple[int, ...]
    forward: tuple[Timing, ...]  # one per batch size
    backward: tuple[Timing, ...]
    output_bytes: tuple[int, ...]
    saved_bytes: tuple[int, ...]
    peak_bytes: tuple[int, ...] = ()  # per batch size (profiling/layers.py says how it is measured)

    def nonlinearity(self) -> float:
        """Seconds per sample (forward + backward) at the smallest size over that at the largest:
        1 when time is proportional to batch, larger when small batches waste the device."""
        small = (self.forward[0].median_s + self.backward[0].median_s) / self.batch_sizes[0]
        large = (self.forward[-1].median_s + self.backward[-1].median_s) / self.batch_sizes[-1]
        return small / large if large > 0 else float("inf")


@dataclass(frozen=True)
class StepCheck:
    """Sum of per-layer forward+backward medians against a measured whole training step."""

    batch: int
    measured: Timing
    sum_of_layers_s: float

    @property
    def gap(self) -> float:
        return self.sum_of_layers_s / self.measured.median_s - 1.0


@dataclass(frozen=True)
class Profile:
    model: str
    inputs: str
    device: str  # "cpu" or "cuda:0"
    device_name: str  # the processor or GPU model
    machine: str
    torch_version: str
    threads: int
    date: str
    warmup: int
    repeats: int
    layers: tuple[LayerProfile, ...]
    step_check: StepCheck | None = None
    repeatability: tuple[float, ...] = ()  # per layer: second run's median / first run's, largest batch
    format_version: int = 1

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return self.layers[0].batch_sizes if self.layers else ()


def profile_costs(profile: Profile, link: LinkSpec) -> LayerCosts:
    """Time functions from medians, piecewise linear (PiecewiseLinear states the rule beyond the
    measured sizes); transfers priced from the measured output bytes over `link`."""
    forward, backward, send = [], [], []
    for layer in profile.layers:
        sizes = tuple(float(b) for b in layer.batch_sizes)
        forward.append(PiecewiseLinear(sizes, tuple(t.median_s for t in layer.forward)))
        backward.append(PiecewiseLinear(sizes, tuple(t.median_s for t in layer.backward)))
        slope, intercept = np.polyfit(sizes, layer.output_bytes, 1) if len(sizes) > 1 else (
            layer.output_bytes[0] / sizes[0], 0.0)
        send.append(TransferTime(Affine(max(0.0, float(intercept)), max(0.0, float(slope))), link))
    return LayerCosts(forward=tuple(forward), backward=tuple(backward), send_forward=tuple(send),
                      send_backward=tuple(send), source=f"profile:{profile.model}@{profile.device_name}")
