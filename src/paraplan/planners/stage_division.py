"""The stage-division objective of CSIMD (../shared/papers/csimd.md eqs. (6)-(8)) that every
planner dividing a model into contiguous pipeline stages is judged on: CSIMD's searches
(planners/csimd/), the partition baselines (planners/baselines/), GroPipe's memory-capped split
(planners/gropipe/) and the fast memory checks (planners/fit.py).

Arrays, 0-based over the K layers (the paper counts from 1):
    h_p[k]  forward compute of layer k                      (H^P_{k+1})
    h_m[k]  sending layer k's output forward                (H^M_{k+1})
    j_p[k]  backward compute of layer k                     (J^P_{k+1})
    j_m[k]  sending the gradient of layer k's input back    (J^M_{k+1})
A partition is the list `cuts` of the last layer of every stage but the final one (alpha_1 ..
alpha_{N-1}, 0-based). A cut after layer a costs h_m[a] forward and j_m[a + 1] backward, eq. (7).
For several micro-batch counts at once the arrays are 2-D: one row per candidate p. Times must be
finite and non-negative (ValueError otherwise, `time_arrays`): every search relies on prefix sums
that never decrease.

The final stage has no outgoing communication (F_N^M = B_N^M = 0 in eq. (6)); a division's rho1
and rho2 are its stages' largest forward and backward terms (`evaluate`), and T(lambda, p) of
eq. (8) adds the compute sums and every cut's communication (`total_time`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Division:
    cuts: tuple[int, ...]  # last layer of each stage but the final one (0-based)
    rho1: float  # max over stages of max(F^P, F^M)
    rho2: float  # max over stages of max(B^P, B^M)

    @property
    def objective(self) -> float:
        return self.rho1 + self.rho2

    @property
    def n_stages(self) -> int:
        return len(self.cuts) + 1


def time_arrays(h_p, h_m, j_p, j_m, ndim: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four time functions as float arrays, checked: same shape, at least one layer, finite, >= 0."""
    arrays = []
    for name, x in (("h_p", h_p), ("h_m", h_m), ("j_p", j_p), ("j_m", j_m)):
        a = np.atleast_2d(np.asarray(x, float)) if ndim == 2 else np.asarray(x, float)
        if a.ndim != ndim or a.shape[-1] == 0:
            raise ValueError(f"{name}: expected a non-empty {ndim}-D array of per-layer times, got shape {a.shape}")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ValueError(f"{name}: times must be finite and non-negative")
        arrays.append(a)
    if len({a.shape for a in arrays}) != 1:
        raise ValueError(f"h_p, h_m, j_p, j_m must have one shape, got {[a.shape for a in arrays]}")
    return arrays[0], arrays[1], arrays[2], arrays[3]


def stage_limit(n_stages: int, n_layers: int) -> int:
    if n_stages < 1:
        raise ValueError(f"need at least one stage, got {n_stages}")
    return min(n_stages, n_layers)  # at most one stage per layer


def prefix_sums(x: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(x, dtype=float)))


def cut_costs(h_m: np.ndarray, j_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward communication of a cut after each layer; 0 after the last layer."""
    k = len(h_m)
    cut_f = np.zeros(k)
    cut_b = np.zeros(k)
    cut_f[:-1] = h_m[:-1]
    cut_b[:-1] = j_m[1:]
    return cut_f, cut_b


def evaluate(h_p, h_m, j_p, j_m, cuts) -> Division:
    """rho1 and rho2 of a division (CSIMD eq. (8))."""
    h_p, h_m, j_p, j_m = (np.asarray(x, float) for x in (h_p, h_m, j_p, j_m))
    bounds = [0, *[c + 1 for c in cuts], len(h_p)]
    p1, p2 = prefix_sums(h_p), prefix_sums(j_p)
    f = np.array([p1[b] - p1[a] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    b = np.array([p2[e] - p2[a] for a, e in zip(bounds[:-1], bounds[1:], strict=True)])
    cf = np.array([h_m[c] for c in cuts] + [0.0])
    cb = np.array([j_m[c + 1] for c in cuts] + [0.0])
    return Division(tuple(int(c) for c in cuts), float(np.maximum(f, cf).max()), float(np.maximum(b, cb).max()))


def total_time(h_p, h_m, j_p, j_m, cuts, n_micro: int) -> float:
    """T(lambda, p), CSIMD eq. (8)."""
    d = evaluate(h_p, h_m, j_p, j_m, cuts)
    h_m, j_m = np.asarray(h_m, float), np.asarray(j_m, float)
    cut_comm = sum(h_m[c] + j_m[c + 1] for c in cuts)
    return float(np.sum(h_p) + np.sum(j_p) + cut_comm + (n_micro - 1) * d.objective)


def even_cuts(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Equal layer counts (GPipe-E's division); at most one stage per layer."""
    n_stages = max(1, min(n_stages, n_layers))
    bounds = [round(i * n_layers / n_stages) for i in range(n_stages + 1)]
    return tuple(b - 1 for b in bounds[1:-1])


def bounds_of(cuts, n_layers: int) -> list[int]:
    """[0, first layer of stage 1, ..., n_layers]: stage i holds layers bounds[i]..bounds[i + 1] - 1."""
    return [0, *[int(c) + 1 for c in cuts], n_layers]


def fill_to(h_p, h_m, j_p, j_m, cuts, n_stages: int, n_micro: int) -> tuple[int, ...]:
    """The division with exactly n_stages stages (n_stages <= K) from one with fewer: while there
    are fewer, add the one cut that raises T(lambda, p) (eq. (8)) least at p = n_micro, every
    candidate cut priced at once. For searches that may stop below N (IMD's MASP packs into at
    most N bins, a min-max DP takes fewer stages when no slower) when exactly N are asked for."""
    h_p, h_m, j_p, j_m = (np.asarray(x, float) for x in (h_p, h_m, j_p, j_m))
    k = len(h_p)
    if not 1 <= n_stages <= k:
        raise ValueError(f"exactly {n_stages} stages of {k} layers: a stage needs a layer")
    p1, p2 = np.concatenate(([0.0], np.cumsum(h_p))), np.concatenate(([0.0], np.cumsum(j_p)))
    cut_f, cut_b = cut_costs(h_m, j_m)
    cuts = sorted(int(c) for c in cuts)
    while len(cuts) + 1 < n_stages:
        b = np.array(bounds_of(cuts, k))
        n = len(b) - 1
        out_f = np.array([cut_f[c] for c in cuts] + [0.0])  # each stage's outgoing cut
        out_b = np.array([cut_b[c] for c in cuts] + [0.0])
        f = np.maximum(p1[b[1:]] - p1[b[:-1]], out_f)  # per stage: max(F^P, F^M), eq. (6)
        g = np.maximum(p2[b[1:]] - p2[b[:-1]], out_b)
        # the largest f (g) over the stages other than i: prefix and suffix maxima
        before_f = np.concatenate(([0.0], np.maximum.accumulate(f)[:-1]))
        after_f = np.concatenate((np.maximum.accumulate(f[::-1])[::-1][1:], [0.0]))
        before_g = np.concatenate(([0.0], np.maximum.accumulate(g)[:-1]))
        after_g = np.concatenate((np.maximum.accumulate(g[::-1])[::-1][1:], [0.0]))
        c = np.setdiff1d(np.arange(k - 1), cuts)  # a new cut after layer c
        i = np.searchsorted(b, c, side="right") - 1  # the stage it splits
        start, stop = b[i], b[i + 1]
        rho1 = np.maximum.reduce([before_f[i], after_f[i], np.maximum(p1[c + 1] - p1[start], cut_f[c]),
                                  np.maximum(p1[stop] - p1[c + 1], out_f[i])])
        rho2 = np.maximum.reduce([before_g[i], after_g[i], np.maximum(p2[c + 1] - p2[start], cut_b[c]),
                                  np.maximum(p2[stop] - p2[c + 1], out_b[i])])
        added = cut_f[c] + cut_b[c] + (n_micro - 1) * (rho1 + rho2)  # T less what every candidate shares
        cuts = sorted([*cuts, int(c[int(np.argmin(added))])])
        assert len(cuts) + 1 == n + 1
    return tuple(cuts)
