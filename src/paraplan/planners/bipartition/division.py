"""Bi-Partition's divisions (../shared/papers/bi-partition.md): the types the dynamic program
(planners/bipartition/dp.py), its memory steps (planners/bipartition/dp_memory.py), the paper's
Algorithm 2 (planners/bipartition/algorithm2.py) and the runtime-cost search
(planners/bipartition/recompute.py) share, and reading a division back from each worker count's
best predecessors. The model (ranges, empty ranges, links, memory) is dp.py's module docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

CutFn = Callable[[int | None, int | None], float]
FitsFn = Callable[[int, tuple[int, int], tuple[int, int]], bool]

_INF = float("inf")


class DoesNotFit(ValueError):
    """No division into the asked number of workers fits the workers' memory."""


@dataclass(frozen=True)
class Worker:
    forward: tuple[int, int]  # layers start..stop-1; (s, s) is an empty range
    backward: tuple[int, int]


@dataclass(frozen=True)
class BiPartition:
    workers: tuple[Worker, ...]
    bottleneck_s: float  # the slowest worker (or link) per micro-batch in the steady state


def max_workers(n_layers: int, layerwise: bool = False, allow_empty: bool = True) -> int:
    """The most workers a division can use: every worker needs at least one layer's forward or
    backward (2L parts with empty ranges allowed), or one layer each way (L) otherwise."""
    return 2 * n_layers if allow_empty and not layerwise else n_layers


def last_argmin(values: np.ndarray) -> int:
    """The index of the last minimum (ties: the largest index)."""
    return values.size - 1 - int(np.argmin(values[::-1]))


def prefix_sums(times: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(times)))


@dataclass(frozen=True)
class Predecessors:
    """Each state's best predecessor for one worker count: arrays where the memory check needed
    them anyway; otherwise found when a division is read back (a few states) from the h(q) the
    count was solved with, so the DP itself need not track them."""

    arrays: tuple[np.ndarray, np.ndarray] | None = None
    prefix_bottleneck: np.ndarray | None = None
    allow_empty: bool = True

    def of(self, p1: int, p2: int, done: np.ndarray) -> tuple[int, int]:
        if self.arrays is not None:
            return int(self.arrays[0][p1, p2]), int(self.arrays[1][p1, p2])
        if self.prefix_bottleneck is None:
            return -1, -1
        top1, top2 = (p1, p2) if self.allow_empty else (p1 - 1, p2 - 1)
        if top1 < 0 or top2 < 0:
            return -1, -1
        candidate = np.maximum(self.prefix_bottleneck[:top1 + 1, :top2 + 1],
                               done[p1, p2] - done[:top1 + 1, :top2 + 1])
        if self.allow_empty:
            candidate[p1, p2] = _INF  # a worker with nothing
        q1, q2 = divmod(last_argmin(candidate.ravel()), candidate.shape[1])  # ties: the largest q
        return (q1, q2) if np.isfinite(candidate[q1, q2]) else (-1, -1)


# ---------------------------------------------------------------------------------------------
# reading a division back


def read_division(predecessors: list[Predecessors], n_workers: int, rows) -> BiPartition:
    """The division into n_workers that the predecessors lead to from (L, L); `rows`: the
    workers' times and the boundaries' charges (planners/bipartition/worker_rows.py WorkerRows)."""
    n_layers = rows.n_layers
    workers = []
    p1 = p2 = n_layers
    for m in range(n_workers, 0, -1):
        # count m's predecessors were chosen with its last worker's times (worker m - 1's)
        q1, q2 = (0, 0) if m == 1 else predecessors[m - 1].of(p1, p2, rows.done(m - 1))
        if q1 < 0 or q2 < 0:
            raise RuntimeError(f"bipartition: broken predecessor chain at worker {m - 1} (a bug)")
        workers.append(Worker(forward=(q1, p1), backward=(q2, p2)))
        p1, p2 = q1, q2
    workers.reverse()
    return BiPartition(workers=tuple(workers), bottleneck_s=bottleneck(workers, rows))


def bottleneck(workers: Sequence[Worker], rows) -> float:
    """The slowest worker, each at its own speed, or boundary, each over its own link."""
    times = []
    for k, w in enumerate(workers):
        prefix_f, prefix_b, _ = rows.prefix(k)
        times.append(float(prefix_f[w.forward[1]] - prefix_f[w.forward[0]]
                           + prefix_b[w.backward[1]] - prefix_b[w.backward[0]]))
    links = [float(rows.cut(k)[w.forward[1], w.backward[1]]) for k, w in enumerate(workers[:-1])]
    return max([max(times), *links])
