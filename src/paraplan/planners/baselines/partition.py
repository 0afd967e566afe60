"""Partition baselines the pipeline methods are compared with (CSIMD's GPipe-E, GPipe-R, DeepSpeed,
torchgpipe and PipeDream), all judged on the same objective (CSIMD eq. (8)).

Arrays follow planners/stage_division.py (0-based layers; a cut after layer a costs h_m[a] forward and
j_m[a + 1] backward). Each returns the `cuts` of a division; the micro-batch count is chosen by
the caller (fixed, random, or ODPA).

- `min_max_dp`: the exact O(N K^2) dynamic program of PipeDream / the methods CSIMD cites
  ([15], [22], [24]): minimise the slowest stage, a stage costing
  max(forward + backward compute, forward + backward communication of its cut). It optimises this
  one-dimensional surrogate exactly, not rho1 + rho2.
- `min_max_recursive`: the same recurrence evaluated top-down with memoisation (the "recursive
  algorithm" of CSIMD Fig. 9); same answers, different speed.
- `brute_force_rho`: every division into at most N stages, for small K: the oracle for
  rho1 + rho2 alone (what IMD and `exact_rho` minimise). It is not the optimum of eq. (8): that
  also charges every cut's communication, and a rho-optimal division can take 1.95x as long
  (docs/csimd.md).
- `brute_force_time`: every division into at most N stages, for small K: the oracle for the whole
  of eq. (8) at one p (what `csimd.search.exact_time` and the planner's "brute-force" minimise).
- `even`: equal layer counts (GPipe-E); `random_cuts`: uniform random cuts (GPipe-R);
  `balanced_1d`: the exact min-max split of one per-layer weight, used for parameter balance
  (DeepSpeed's partition_method="parameters") and for time balance (torchgpipe's balance_by_time).
"""

from __future__ import annotations

import itertools
import sys
from functools import cache

import numpy as np

from paraplan.planners.stage_division import Division, cut_costs, evaluate, even_cuts, stage_limit, total_time

__all__ = ["balanced_1d", "brute_force_rho", "brute_force_time", "even", "min_max_dp", "min_max_recursive",
           "random_cuts"]


def _stage_table(h_p, h_m, j_p, j_m):
    compute = np.concatenate(([0.0], np.cumsum(np.asarray(h_p, float) + np.asarray(j_p, float))))
    cut_f, cut_b = cut_costs(np.asarray(h_m, float), np.asarray(j_m, float))
    return compute, cut_f + cut_b


def min_max_dp(h_p, h_m, j_p, j_m, n_stages: int, exactly: bool = False) -> tuple[int, ...]:
    """A[n][j] = min_i max(A[n-1][i], cost(i+1..j)); O(N K^2), vectorised over i. Fewer stages
    are taken when they are no slower, unless `exactly` (then n_stages <= K)."""
    compute, comm = _stage_table(h_p, h_m, j_p, j_m)
    k = len(comm)
    n_stages = stage_limit(n_stages, k)
    inf = np.inf
    best = np.full((n_stages + 1, k), inf)  # best[n][j]: layers 0..j in n stages
    choice = np.full((n_stages + 1, k), -1, dtype=np.int64)
    best[1] = np.maximum(compute[1:], comm)
    for n in range(2, n_stages + 1):
        # every j at once: cost[j, i] for the previous stage ending at i (n-2 <= i < j; the rest inf,
        # after them, so that argmin's first least is the loop's: an all-inf row gives i = n-2 as it did)
        j = np.arange(n - 1, k)[:, None]
        i = np.arange(n - 2, k - 1)[None, :]
        cost = np.where(i < j, np.maximum(best[n - 1][i], np.maximum(compute[j + 1] - compute[i + 1], comm[j])), inf)
        m = np.argmin(cost, axis=1)
        best[n][n - 1:] = cost[np.arange(len(m)), m]
        choice[n][n - 1:] = m + (n - 2)
    # fewer stages are allowed when they are no slower
    n = n_stages if exactly else int(np.argmin(best[1:, k - 1])) + 1
    cuts, j = [], k - 1
    while n > 1:
        j = int(choice[n][j])
        cuts.append(j)
        n -= 1
    return tuple(reversed(cuts))


def min_max_recursive(h_p, h_m, j_p, j_m, n_stages: int) -> tuple[int, ...]:
    compute, comm = _stage_table(h_p, h_m, j_p, j_m)
    k = len(comm)
    n_stages = stage_limit(n_stages, k)

    @cache
    def solve(j: int, n: int) -> tuple[float, tuple[int, ...]]:
        """The best division of layers 0..j into at most n stages."""
        whole = max(compute[j + 1], comm[j])
        if n == 1 or j == 0:
            return whole, ()
        best = (whole, ())
        for i in range(j):
            sub, cuts = solve(i, n - 1)
            cost = max(sub, compute[j + 1] - compute[i + 1], comm[j])
            if cost < best[0]:
                best = (cost, (*cuts, i))
        return best

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * n_stages + 1000))
    try:
        return solve(k - 1, n_stages)[1]
    finally:
        sys.setrecursionlimit(limit)


def _divisions(n_layers: int, n_stages: int, exactly: bool = False):
    """Every division (its cuts) into at most (or exactly) n_stages stages, fewest stages first."""
    n_stages = stage_limit(n_stages, n_layers)
    for n in [n_stages] if exactly else range(1, n_stages + 1):
        yield from itertools.combinations(range(n_layers - 1), n - 1)


def brute_force_rho(h_p, h_m, j_p, j_m, n_stages: int, exactly: bool = False) -> Division:
    """Minimum rho1 + rho2 over every division into at most (or exactly) n_stages stages.

    Only rho1 + rho2: eq. (8) also charges every cut's communication, so this is the oracle for IMD
    and `csimd.algorithms.exact_rho`, not for the planner (see `brute_force_time`)."""
    best = None
    for cuts in _divisions(np.shape(h_p)[-1], n_stages, exactly):  # (S, K) on devices of several kinds
        d = evaluate(h_p, h_m, j_p, j_m, cuts)
        if best is None or d.objective < best.objective:
            best = d
    return best


def brute_force_time(h_p, h_m, j_p, j_m, n_stages: int, n_micro: int, exactly: bool = False,
                     fits=None) -> tuple[int, ...] | None:
    """The cuts minimising the whole of T(lambda, p) (CSIMD eq. (8), `stage_division.total_time`) at
    p = n_micro over every division into at most (or exactly) n_stages stages; the fewest stages
    win ties. fits(cuts) -> bool: only divisions that fit count (None when none does)."""
    best_cuts, best_t = None, np.inf
    for cuts in _divisions(np.shape(h_p)[-1], n_stages, exactly):  # (S, K) on devices of several kinds
        t = total_time(h_p, h_m, j_p, j_m, cuts, n_micro)
        if t < best_t and (fits is None or fits(cuts)):
            best_cuts, best_t = cuts, t
    return None if best_cuts is None else tuple(int(c) for c in best_cuts)


def random_cuts(n_layers: int, n_stages: int, rng: np.random.Generator) -> tuple[int, ...]:
    n_stages = stage_limit(n_stages, n_layers)
    return tuple(sorted(int(c) for c in rng.choice(n_layers - 1, size=n_stages - 1, replace=False)))


def balanced_1d(weights, n_stages: int, exactly: bool = False) -> tuple[int, ...]:
    """The exact min-max contiguous split of one weight per layer (no communication)."""
    w = np.asarray(weights, float)
    zeros = np.zeros_like(w)
    return min_max_dp(w, zeros, zeros, zeros, n_stages, exactly)


def even(n_layers: int, n_stages: int) -> tuple[int, ...]:
    return even_cuts(n_layers, n_stages)
