"""Collective communication times on a ring (the standard bandwidth-optimal algorithms).

With n members, M bytes, the ring's bottleneck link of bandwidth beta and latency alpha:
    all-reduce:      2 (n-1)/n * M / beta + 2 (n-1) alpha   (reduce-scatter then all-gather)
    all-gather:        (n-1)/n * M / beta +   (n-1) alpha   (M = the gathered size)
    reduce-scatter:    (n-1)/n * M / beta +   (n-1) alpha   (M = the size before scattering)
"""

from __future__ import annotations

from paraplan.hardware.cluster import LinkSpec


def ring_allreduce_s(nbytes: float, n: int, link: LinkSpec) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + 2 * (n - 1) * link.latency_s


def ring_allgather_s(nbytes: float, n: int, link: LinkSpec) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + (n - 1) * link.latency_s


ring_reducescatter_s = ring_allgather_s
