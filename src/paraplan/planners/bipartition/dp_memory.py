"""Bi-Partition's dynamic program with memory (planners/bipartition/dp.py's module docstring, "With
memory"): the steps that keep only the predecessors whose worker fits — the furthest end a
forward-only range can reach, the per-state search of fitting predecessors and the bounds one
state passes to the next. Split from planners/bipartition/dp.py, which holds the plain prefix DP
and calls these where a `fits` test is given.
"""

from __future__ import annotations

import numpy as np

from paraplan.planners.bipartition.division import FitsFn, last_argmin

_INF = float("inf")


def apply_fits_first(value: np.ndarray, fits: FitsFn, n_layers: int, layerwise: bool) -> None:
    if not layerwise:
        value[forward_reach(fits, 0, n_layers)[0] + 1:, :] = _INF
    for p1, p2 in np.argwhere(np.isfinite(value)).tolist():
        if not fits(0, (0, p1), (0, p2)):
            value[p1, p2] = _INF


def forward_reach(fits: FitsFn, worker: int, n_layers: int) -> np.ndarray:
    """furthest[q1]: the last end p1 for which a forward-only range q1..p1-1 fits the worker.

    Any worker whose forward range is q1..p1-1 has p1 <= furthest[q1] (its backward range taken
    away, it still fits), which bounds the rows of the search for O(L) calls (two pointers: a
    forward-only worker fits for any part of a range that fits, so the furthest end never moves
    back as the start moves on). An empty backward range must not matter where it sits: each probe
    puts it at both ends of the model."""
    def forward_only(start: int, end: int) -> bool:
        answers = {fits(worker, (start, end), (at, at)) for at in (0, n_layers)}
        if len(answers) > 1:
            raise ValueError(f"fits(worker {worker}, ({start}, {end}), empty backward range) answers differently "
                             f"with the empty range at 0 and at {n_layers}: a worker with no backward runs the "
                             "same layers wherever that range sits")
        return answers.pop()

    furthest = np.empty(n_layers + 1, dtype=np.int64)
    end = 0
    for start in range(n_layers + 1):
        end = max(end, start)
        while end < n_layers and forward_only(start, end + 1):
            end += 1
        furthest[start] = end
    return furthest


def apply_fits(value, parent, prefix_bottleneck, done, fits: FitsFn, worker: int, allow_empty: bool,
                furthest_forward: np.ndarray, mirrored: bool) -> None:
    """Keep each state's best predecessor where the last worker fits; elsewhere search the
    predecessors that fit for the best one (_best_fitting)."""
    n_layers = value.shape[0] - 1
    # the first forward start from which a forward-only range reaches each end at all
    first_start = np.searchsorted(furthest_forward, np.arange(n_layers + 1), side="left").tolist()
    # finite_from[q1, c]: how many q2 >= c in row q1 have a finite h (a predecessor at all)
    finite_from = np.zeros((n_layers + 1, n_layers + 2), dtype=np.int64)
    finite_from[:, :-1] = np.cumsum(np.isfinite(prefix_bottleneck)[:, ::-1], axis=1)[:, ::-1]
    parent1, parent2 = parent
    starts1, starts2 = parent1.tolist(), parent2.tolist()  # faster to index than the arrays
    memo = _LowestFitting(n_layers, across_p1=not mirrored)
    hopeless_row = -1  # the p1 whose last state had no predecessor that fits
    for p1, p2 in np.argwhere(np.isfinite(value)).tolist():  # row by row, p2 rising within a row
        q1, q2 = starts1[p1][p2], starts2[p1][p2]
        # after a state with nothing that fits, the next one most likely has nothing either: the
        # search finds that from what it learnt without a call, so skip asking about the best
        if hopeless_row != p1 and fits(worker, (q1, p1), (q2, p2)):
            continue
        found = _best_fitting(prefix_bottleneck, done, finite_from, fits, worker, p1, p2, allow_empty,
                              first_start[p1], memo)
        value[p1, p2], parent1[p1, p2], parent2[p1, p2] = found
        hopeless_row = p1 if found[1] < 0 else -1


class _LowestFitting:
    """Lower bounds on the lowest q2 that fits in each row q1, learnt from the states searched
    before. A state (p1, p2') with p2' < p2 has a shorter backward range (a); one (p1', p2') <=
    (p1, p2) also a forward range shorter at its end, which (c) makes no harder to fit: where
    nothing fitted below some q2 there, nothing fits now. In the mirror image (worker index from
    the end) the forward range's end is the real start, about which nothing is assumed, so only
    the same p1 counts there."""

    def __init__(self, n_layers: int, across_p1: bool) -> None:
        self.found = np.zeros((n_layers + 1, n_layers + 1), dtype=np.int64)  # [p2, q1], from earlier p1
        self.across_p1 = across_p1
        self.p1 = -1
        self.this_row = np.zeros(n_layers + 1, dtype=np.int64)  # from this p1's smaller p2

    def bounds(self, p1: int, p2: int) -> np.ndarray:
        if p1 != self.p1:  # a new row of states: every smaller p2 of the earlier rows counts
            self.p1 = p1
            if self.across_p1:
                np.maximum.accumulate(self.found, axis=0, out=self.found)
            else:
                self.found[:] = 0
            self.this_row[:] = 0
        return np.maximum(self.found[p2], self.this_row)

    def learnt(self, p2: int, lowest: np.ndarray) -> None:
        self.this_row = lowest
        np.maximum(self.found[p2], lowest, out=self.found[p2])


def _best_fitting(prefix_bottleneck, done, finite_from, fits: FitsFn, worker: int, p1: int, p2: int,
                  allow_empty: bool, first_q1: int, memo: _LowestFitting) -> tuple[float, int, int]:
    """min over q < p whose last worker fits of max(h(q), G(p) - G(q)), best row first.

    Each row q1 (a forward range q1..p1-1) has a best value ignoring memory, a bound on what it can
    give, so rows are taken in that order until the bound is no better than the best found. In a
    row, the q2 that fit run from a lowest one to the top (a shorter backward range fits where a
    longer one does), so the lowest is binary-searched; with empty ranges a row's top, the forward
    range alone, fits within the forward reach. Nothing is inferred from one row to another: a
    worker can need more memory for running fewer forwards (the paper keeps a layer's activations
    at its backward owner, for longer when the forward ran on an earlier worker)."""
    lowest = memo.bounds(p1, p2)
    top_row = p1 if allow_empty else p1 - 1
    if top_row < first_q1:
        return _INF, -1, -1
    rows = slice(first_q1, top_row + 1)
    # below a row's lowest fitting q2 for an earlier state nothing fits now: is anything left?
    if not finite_from[np.arange(first_q1, top_row + 1), lowest[rows]].any():
        return _INF, -1, -1  # (nothing new learnt)
    first_q2 = int(lowest[rows].min())
    values = np.maximum(prefix_bottleneck[rows, first_q2:p2 + 1], done[p1, p2] - done[rows, first_q2:p2 + 1])
    if not allow_empty:
        values[:, -1] = _INF  # q2 = p2: an empty backward range
    elif top_row == p1:
        values[-1, -1] = _INF  # q = p: a worker with nothing
    values[np.arange(first_q2, p2 + 1)[None, :] < lowest[rows, None]] = _INF
    row_best = values.min(axis=1)
    hopeful = np.flatnonzero(np.isfinite(row_best[::-1]))
    if hopeful.size == 0:
        memo.learnt(p2, lowest)
        return _INF, -1, -1
    # best bound first, the larger q1 on ties (rows counted down from the top, a stable sort)
    order = (top_row - hopeful[np.argsort(row_best[::-1][hopeful], kind="stable")]).tolist()
    best = (_INF, -1, -1)
    for q1 in order:
        if row_best[q1 - first_q1] >= best[0]:
            break
        top = p2 if allow_empty and q1 < p1 else p2 - 1
        low = int(lowest[q1])
        forward_alone = allow_empty and q1 < p1  # the top: known to fit (q1 >= first_q1)
        if low > top or not (forward_alone or fits(worker, (q1, p1), (top, p2))):
            lowest[q1] = top + 1  # nothing in this row fits
            continue
        high = top
        while low < high:
            middle = (low + high) // 2
            if fits(worker, (q1, p1), (middle, p2)):
                high = middle
            else:
                low = middle + 1
        lowest[q1] = low
        row = values[q1 - first_q1, low - first_q2:]
        at = last_argmin(row)  # the larger q2 on ties: a smaller last worker
        if row[at] < best[0] or (row[at] == best[0] and q1 > best[1]):
            best = (float(row[at]), q1, low + at)
    memo.learnt(p2, lowest)
    return best if np.isfinite(best[0]) else (_INF, -1, -1)


def apply_fits_layerwise(value, parent, prefix_bottleneck, done, fits: FitsFn, worker: int) -> None:
    """Layer-wise: at most L predecessors per state, tried best first until one fits."""
    parent1, parent2 = parent
    for p, _ in np.argwhere(np.isfinite(value)).tolist():
        q = int(parent1[p, p])
        if fits(worker, (q, p), (q, p)):
            continue
        starts = np.arange(p)
        candidate = np.maximum(prefix_bottleneck[starts, starts], done[p, p] - done[starts, starts])
        best = (_INF, -1)
        for c in (p - 1 - np.argsort(candidate[::-1], kind="stable")).tolist():  # ties: the larger c
            if not np.isfinite(candidate[c]):
                break
            if fits(worker, (c, p), (c, p)):
                best = (float(candidate[c]), c)
                break
        value[p, p], parent1[p, p], parent2[p, p] = best[0], best[1], best[1]
