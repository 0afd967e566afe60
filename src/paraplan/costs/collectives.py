"""Collective communication times, by the algorithm the library picks.

The ring (the standard bandwidth-optimal algorithms). With n members, M bytes, the ring's
bottleneck link of bandwidth beta and latency alpha:
    all-reduce:      2 (n-1)/n * M / beta + 2 (n-1) alpha   (reduce-scatter then all-gather)
    all-gather:        (n-1)/n * M / beta +   (n-1) alpha   (M = the gathered size)
    reduce-scatter:    (n-1)/n * M / beta +   (n-1) alpha   (M = the size before scattering)

An all-reduce may also run, where the group's nodes have them (hardware/links.py), on NCCL's tree
or on NVLink SHARP; NCCL runs the one its tuning model predicts fastest (src/graph/tuning.cc,
ncclTopoTuneModel), and so does this module:
    tree:  tree_latency + M / (0.5 * 0.92 * beta)   (tuning.cc: a tree all-reduce's bus bandwidth
           is 0.92 of the ring's, and its algorithm bandwidth half of that: each rank sends and
           receives M up the tree and M down)
    NVLS:  alpha_nvls + 2 (n-1)/n * M / beta_nvls   (fitted to nccl-tests on an H200 node,
           benchmarks/efficiency_fit.py)
Not priced, said here: NCCL's protocols (LL, LL128) as separate choices (the ring's fitted alpha
stands for them), NVLS-tree across nodes, and PAT and NVLS for all-gather and reduce-scatter (PAT
runs with one GPU per node only; NVLS's all-gather bus bandwidth is half its all-reduce's, below
the ring's on an 8-GPU node), so those stay rings.
"""

from __future__ import annotations

from paraplan.hardware.cluster import LinkSpec
from paraplan.hardware.links import GroupLink

TREE_BUS_SHARE = 0.92  # tuning.cc: busBw = min(busBw * .92, ...) for NCCL_ALGO_TREE all-reduces


def ring_allreduce_s(nbytes: float, n: int, link: LinkSpec) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + 2 * (n - 1) * link.latency_s


def allreduce_times(nbytes: float, n: int, link: LinkSpec) -> dict[str, float]:
    """An all-reduce of `nbytes` over `n` members on each algorithm the group has (module docstring)."""
    times = {"ring": ring_allreduce_s(nbytes, n, link)}
    if n <= 1 or nbytes <= 0 or not isinstance(link, GroupLink):
        return times
    if link.tree_latency_s is not None:
        times["tree"] = link.tree_latency_s + nbytes / (0.5 * TREE_BUS_SHARE * link.bandwidth_bytes_per_s)
    if link.nvls is not None:
        times["nvls"] = link.nvls.latency_s + 2 * (n - 1) / n * nbytes / link.nvls.bandwidth_bytes_per_s
    return times


def allreduce_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """An all-reduce of `nbytes` over `n` members: the fastest algorithm the group has."""
    return min(allreduce_times(nbytes, n, link).values())


def allreduce_algorithm(nbytes: float, n: int, link: LinkSpec) -> str:
    """Which algorithm allreduce_s priced: ring, tree or nvls (the ring on a tie)."""
    times = allreduce_times(nbytes, n, link)
    return min(times, key=lambda name: (times[name], name != "ring"))


def ring_allgather_s(nbytes: float, n: int, link: LinkSpec) -> float:
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + (n - 1) * link.latency_s


ring_reducescatter_s = ring_allgather_s
