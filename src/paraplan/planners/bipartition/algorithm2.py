"""The paper's Algorithm 2 (../shared/papers/bi-partition.md): the prefix dynamic program of
planners/bipartition/dp.py with a binary search on s2 in place of the scan. A heuristic that can
miss the optimum (dp.py's module docstring has a counterexample), kept as the paper has it: a slow,
plain-Python transcription, never the default (`bipartition(..., binary_search=True)`).
"""

from __future__ import annotations

import numpy as np

from paraplan.planners.bipartition.division import (
    BiPartition,
    DoesNotFit,
    FitsFn,
    Predecessors,
    prefix_sums,
    read_division,
)

_INF = float("inf")


def algorithm2(rows, n_workers: int, fits: FitsFn | None, allow_empty: bool) -> BiPartition:
    """The prefix DP with Algorithm 2's binary search on s2 in place of the scan, as the paper has it:
    workers alike (`rows`, planners/bipartition/worker_rows.py, holds one row and one cut matrix)."""
    if not rows.alike:
        raise ValueError("Algorithm 2 (binary_search=True) searches workers alike, as the paper's: give one "
                         "time per layer each way and one cut_s")
    forward, backward = rows.times(0)
    cuts = rows.cut(0)
    n_layers = forward.size
    size = n_layers + 1
    prefix_f, prefix_b = prefix_sums(forward), prefix_sums(backward)
    ok = fits or (lambda w, fr, br: True)

    def single(worker: int, q1: int, p1: int, q2: int, p2: int) -> float:
        if (q1, q2) == (p1, p2) or not ok(worker, (q1, p1), (q2, p2)):
            return _INF
        return float(prefix_f[p1] - prefix_f[q1] + prefix_b[p2] - prefix_b[q2])

    value = np.full((size, size), _INF)
    first = 0 if allow_empty else 1
    for p1 in range(first, size):
        for p2 in range(first, size):
            value[p1, p2] = single(0, 0, p1, 0, p2)
    predecessors = [Predecessors(arrays=(np.zeros((size, size), dtype=np.int64),) * 2)]
    for m in range(2, n_workers + 1):
        worker = m - 1
        new = np.full((size, size), _INF)
        parent1 = np.full((size, size), -1, dtype=np.int64)
        parent2 = np.full((size, size), -1, dtype=np.int64)
        low = 0 if allow_empty else m - 1  # the fewest layers m - 1 workers can hold in a direction
        for p1 in range(low, size):
            for p2 in range(low, size):
                top = (_INF, -1, -1)
                for q1 in range(low, p1 + 1 if allow_empty else p1):
                    lo, hi = low, (p2 if allow_empty else p2 - 1)
                    if hi < lo:
                        continue
                    while lo < hi:  # first q2 where the prefix is no faster than the last worker
                        mid = (lo + hi) // 2
                        if value[q1, mid] >= single(worker, q1, p1, mid, p2):
                            hi = mid
                        else:
                            lo = mid + 1
                    for q2 in (lo - 1, lo):
                        if q2 < low or q2 > (p2 if allow_empty else p2 - 1):
                            continue
                        v = max(value[q1, q2], cuts[q1, q2], single(worker, q1, p1, q2, p2))
                        if v < top[0]:
                            top = (v, q1, q2)
                new[p1, p2], parent1[p1, p2], parent2[p1, p2] = top
        value = new
        predecessors.append(Predecessors(arrays=(parent1, parent2)))
    if not np.isfinite(value[n_layers, n_layers]):
        if fits is None:
            raise RuntimeError("bipartition: Algorithm 2 found no division without a memory limit (a bug)")
        raise DoesNotFit(f"Algorithm 2 found no division of {n_layers} layers over {n_workers} workers that fits")
    return read_division(predecessors, n_workers, rows)
