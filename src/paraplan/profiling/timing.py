"""Timing primitives: a clock that waits for the device, and statistics of repeats."""

from __future__ import annotations

import statistics
import time

import torch

from paraplan.costs.profile import Timing


def timing_of(samples: list[float]) -> Timing:
    s = sorted(samples)
    if len(s) >= 4:
        q1, _, q3 = statistics.quantiles(s, n=4)
    else:
        q1, q3 = s[0], s[-1]
    return Timing(median_s=statistics.median(s), min_s=s[0], max_s=s[-1], q1_s=q1, q3_s=q3, repeats=len(s))


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
