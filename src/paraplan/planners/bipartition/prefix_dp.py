"""Bi-Partition's exact prefix dynamic program (planners/bipartition/dp.py has the model: workers,
ranges, links and what memory may assume; this is its search).

The algorithm (exact)
---------------------
Workers are ordered, so an optimal division into m workers is a division of a prefix into m - 1
workers plus one last worker: eq. (2)'s split m' collapses to m' = 1 and only prefix sub-problems
are needed. With p = (p1, p2) the numbers of forward and backward layers done by the first workers,
F and B the prefix sums of the forward and backward times and G(p) = F(p1) + B(p2):

    V[1](p) = G(p),   V[m](p) = min over q < p of max(V[m-1](q), cut(q), G(p) - G(q))

(q < p: q <= p in both coordinates and q != p; both strictly with allow_empty=False). The optimum
for m workers is V[m](L, L), and one pass over m = 1..M gives every worker count (bipartition_all).
Workers of different speeds (planners/bipartition/worker_rows.py): the m-th worker is worker m - 1
of every count, so the step to m reads its own times and the link before it,
V[m](p) = min over q < p of max(V[m-1](q), cut_{m-1}(q), G_m(p) - G_m(q)), G_m from worker m - 1's
F and B and cut_{m-1} the boundary between workers m - 2 and m - 1; everything below holds per step.
Each state's min over q is O(L^2) if done naively (O(L^4 M) in all, minutes for GPT-3's 98 layers).
For one q1, write h(q2) = max(V[m-1](q), cut(q)) and K = G(p) - F(q1); the max is h(q2) exactly
when h(q2) + B(q2) >= K, so the min over q2 <= p2 is

    min( min{h(q2) : h(q2) + B(q2) >= K},  K - max{B(q2) : h(q2) + B(q2) < K} )

and both terms are read from tables over (p2, rank of h + B among the row) built with cumulative
min / max. A worker count costs O(L^3 log L) numpy work instead of O(L^4) Python steps.
With memory, each worker first gets, for O(L) calls, the furthest end a forward-only range from
each start can reach: a bound on every forward range it can hold, which prunes the rows above.
Then each state's best predecessor is asked about; only where it does not fit does the DP search
the predecessors that fit: rows q1 in the order of their best value ignoring memory, in each the
lowest q2 that fits binary-searched (by (a), a row's fitting q2 run from there to the top), until
no row left can do better; what one state learns bounds the lowest q2 of the states after it (by
(a) and (c)). Both stay exact.
"""

from __future__ import annotations

import numpy as np

from paraplan.planners.bipartition.division import FitsFn, Predecessors
from paraplan.planners.bipartition.dp_memory import (
    apply_fits,
    apply_fits_first,
    apply_fits_layerwise,
    forward_reach,
)

_INF = float("inf")


def prefix_dp(rows, n_workers: int, fits: FitsFn | None, layerwise: bool, allow_empty: bool, every_count: bool,
              mirrored: bool = False) -> tuple[list[float], list[Predecessors]]:
    """V[m](L, L) for m = 1..n_workers (inf where none) and, per m, every state's best predecessor.

    rows (planners/bipartition/worker_rows.py WorkerRows): worker w's times and the charge at the
    boundary after worker w; the m-th worker is worker m - 1 whatever the count, so one pass over
    m = 1..M prices each worker at its own speed (G and cut above, per worker and per boundary).
    every_count=False only needs V[n_workers](L, L), so the last count is solved at (L, L) alone.
    mirrored: the problem is the mirror image of the caller's (what memory may assume flips)."""
    n_layers = rows.n_layers
    size = n_layers + 1
    done = rows.done(0)  # G(p): time of the layers a prefix p has run, at the first worker's speed
    finals: list[float] = []
    predecessors: list[Predecessors] = []
    # one worker: everything up to p; with layerwise, only the diagonal is a state
    value = np.full((size, size), _INF)
    if layerwise:
        diagonal = np.arange(1, size)
        value[diagonal, diagonal] = done[diagonal, diagonal]
    elif allow_empty:
        value[:] = done
        value[0, 0] = _INF
    else:
        value[1:, 1:] = done[1:, 1:]
    if fits is not None:
        apply_fits_first(value, fits, n_layers, layerwise)
    finals.append(float(value[n_layers, n_layers]))
    predecessors.append(Predecessors(arrays=(np.zeros((size, size), np.int64),) * 2))  # all from (0, 0)
    for m in range(2, n_workers + 1):
        worker = m - 1
        # the last worker's own G (its speed), and the link between it and the worker before
        prefix_f, prefix_b, done = rows.prefix(worker)
        # h(q) = max(V[m-1](q), cut(q)): the first m - 1 workers ending at q, and the link after them
        prefix_bottleneck = np.where(np.isfinite(value), np.maximum(value, rows.cut(worker - 1)), _INF)
        last = m == n_workers and not every_count
        if layerwise:
            value, parent = _step_layerwise(prefix_bottleneck, done, last)
            if fits is not None:
                apply_fits_layerwise(value, parent, prefix_bottleneck, done, fits, worker)
            predecessors.append(Predecessors(arrays=parent))
        elif fits is None:
            value, _ = _step(prefix_bottleneck, prefix_f, prefix_b, allow_empty, last, None, track=False)
            predecessors.append(Predecessors(prefix_bottleneck=prefix_bottleneck, allow_empty=allow_empty))
        else:
            furthest_forward = forward_reach(fits, worker, n_layers)
            value, parent = _step(prefix_bottleneck, prefix_f, prefix_b, allow_empty, last, furthest_forward,
                                  track=True)
            apply_fits(value, parent, prefix_bottleneck, done, fits, worker, allow_empty, furthest_forward,
                        mirrored)
            predecessors.append(Predecessors(arrays=parent))
        finals.append(float(value[n_layers, n_layers]))
        if not np.isfinite(value).any():
            # no prefix fits this many workers: more workers cannot fit either
            for _ in range(m + 1, n_workers + 1):
                finals.append(_INF)
                predecessors.append(Predecessors())
            break
    return finals, predecessors


def _step(prefix_bottleneck: np.ndarray, prefix_f: np.ndarray, prefix_b: np.ndarray, allow_empty: bool,
          last: bool, furthest_forward: np.ndarray | None,
          track: bool) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """V[m](p) = min over q < p of max(h(q), G(p) - G(q)) (and its argmin if track), memory aside
    except that a last worker whose forward starts at q1 ends by furthest_forward[q1] (a necessary
    condition). One row q1 at a time; the min over q2 is the hinge of the module docstring."""
    size = prefix_f.size
    width = size + 1  # the tables' rank axis: r = 0..size
    value = np.full((size, size), _INF)
    parent1 = np.full((size, size), -1, dtype=np.int64) if track else None
    parent2 = np.full((size, size), -1, dtype=np.int64) if track else None
    q2s = np.arange(size)
    ranks = np.arange(width)
    end_at_p2 = np.arange(size) * width  # flat offset of table row e = p2
    for q1 in np.flatnonzero(np.isfinite(prefix_bottleneck).any(axis=1)).tolist():
        h = prefix_bottleneck[q1]
        lowest_p1 = q1 if allow_empty else q1 + 1  # the last worker's forward may be empty, or not
        first_p1 = size - 1 if last else lowest_p1
        stop_p1 = size - 1 if furthest_forward is None else int(furthest_forward[q1])
        if first_p1 < lowest_p1 or first_p1 > stop_p1:
            continue
        # the hinge: max(h(q2), K - B(q2)) is h(q2) exactly when key(q2) = h(q2) + B(q2) >= K
        key = h + prefix_b
        order = np.argsort(key, kind="stable")
        sorted_key = key[order]
        rank = np.empty(size, dtype=np.int64)
        rank[order] = q2s
        below = ranks[None, :] > rank[:, None]  # [q2, r]: rank(q2) < r
        # low_h[e, r]: min h(q2) over q2 <= e with rank >= r; high_q2[e, r]: the largest q2 <= e
        # with rank < r (B is non-decreasing, so the largest B(q2) and the smallest K - B(q2))
        masked = np.where(below, _INF, h[:, None])
        low_h = np.minimum.accumulate(masked, axis=0)
        high_q2 = np.maximum.accumulate(np.where(below, q2s[:, None], -1), axis=0).ravel()
        p1s = slice(first_p1, stop_p1 + 1)
        target = (prefix_f[p1s] - prefix_f[q1])[:, None] + prefix_b[None, :]  # K = G(p) - F(q1)
        flat = np.searchsorted(sorted_key, target, side="left")
        # the last q2 allowed is p2 itself, or p2 - 1 where the forward range is empty too (or
        # where ranges must not be empty); p2 = 0 then has none and is masked below
        if not allow_empty:
            shorter = slice(None)  # every row
        elif first_p1 == q1:
            shorter = slice(0, 1)  # the row p1 = q1, whose forward range is empty
        else:
            shorter = slice(0, 0)
        flat += end_at_p2
        flat[shorter] -= width
        flat[shorter, 0] = 0
        by_h = low_h.ravel().take(flat)
        above = high_q2.take(flat)
        by_cost = target - prefix_b.take(above)
        by_cost[above < 0] = _INF
        take_h = by_h <= by_cost
        candidate = np.where(take_h, by_h, by_cost)
        candidate[shorter, 0] = _INF
        rows = value[p1s]
        better = candidate <= rows  # ties: the later q1, a smaller last worker
        np.copyto(rows, candidate, where=better)
        if track:
            low_at = np.maximum.accumulate(np.where(masked == low_h, q2s[:, None], -1), axis=0).ravel()
            parent1[p1s][better] = q1
            np.copyto(parent2[p1s], np.where(take_h, low_at.take(flat), above), where=better)
    return value, ((parent1, parent2) if track else None)


def _step_layerwise(prefix_bottleneck: np.ndarray, done: np.ndarray,
                    last: bool) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    size = done.shape[0]
    h = np.diagonal(prefix_bottleneck)
    g = np.diagonal(done)
    cost = np.maximum(h[None, :], g[:, None] - g[None, :])  # [a, c]: last worker c..a-1
    cost = np.where(np.tri(size, k=-1, dtype=bool), cost, _INF)
    if last:
        cost[:-1] = _INF
    best_c = size - 1 - np.argmin(cost[:, ::-1], axis=1)  # the last on ties: a smaller last worker
    best = cost[np.arange(size), best_c]
    value = np.full((size, size), _INF)
    parent1 = np.full((size, size), -1, dtype=np.int64)
    diagonal = np.arange(size)
    value[diagonal, diagonal] = best
    parent1[diagonal, diagonal] = best_c
    return value, (parent1, parent1.copy())
