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

Devices of several kinds (issue 52): CSIMD's cost model "doesn't limit the features of devices"
(§II): F_i^P, F_i^M, B_i^P and B_i^M of eq. (6) are stage i's sums on stage i's own device and
link. The arrays then carry a stage axis before the layers, (S, K) for one p and (R, S, K) for
several: row s holds the layer times on the device of stage s and the transfers over its link to
stage s + 1 (`stage_rows`); a 1-D array is every stage alike. Stage i of a division uses row i, so
a division into n stages needs n <= S rows. Eq. (8)'s compute sum then depends on the division
(a layer costs what its stage's device takes), which `total_time` counts; `least_rows` gives the
per-layer minimum over the devices, from which the searches take their lower bounds.

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
    """The four time functions as float arrays, checked: same shape, at least one layer, finite, >= 0.
    One more axis than `ndim` is the stage axis of devices of several kinds (the module docstring)."""
    arrays = []
    for name, x in (("h_p", h_p), ("h_m", h_m), ("j_p", j_p), ("j_m", j_m)):
        a = np.asarray(x, float)
        if ndim == 2 and a.ndim < 2:
            a = np.atleast_2d(a)
        if a.ndim not in (ndim, ndim + 1) or a.shape[-1] == 0:
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
    """Prefix sums along the layers (of every row of a 2-D array)."""
    x = np.asarray(x, float)
    if x.ndim == 2:
        return np.concatenate((np.zeros((x.shape[0], 1)), np.cumsum(x, axis=1, dtype=float)), axis=1)
    return np.concatenate(([0.0], np.cumsum(x, dtype=float)))


def cut_costs(h_m: np.ndarray, j_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward communication of a cut after each layer; 0 after the last layer (per
    row of (S, K) arrays: the cut sent by stage s)."""
    h_m, j_m = np.asarray(h_m, float), np.asarray(j_m, float)
    cut_f = np.zeros(h_m.shape)
    cut_b = np.zeros(h_m.shape)
    cut_f[..., :-1] = h_m[..., :-1]
    cut_b[..., :-1] = j_m[..., 1:]
    return cut_f, cut_b


def stage_rows(x) -> np.ndarray:
    """(S, K): row s for stage s's device; a 1-D array is one row every stage shares (S = 1)."""
    a = np.asarray(x, float)
    return a[None, :] if a.ndim == 1 else a


def least_rows(x) -> np.ndarray:
    """The per-layer minimum over the stage axis of (R, S, K) arrays, for lower bounds; (R, K)
    arrays (one row per p, devices alike) come back as they are."""
    a = np.asarray(x, float)
    return a.min(axis=1) if a.ndim == 3 else a


def stage_index(n_stages: int, n_rows: int) -> np.ndarray:
    """The row of each of n_stages stages: stage i uses row i, or row 0 when every stage shares it."""
    if n_rows == 1:
        return np.zeros(n_stages, dtype=np.int64)
    if n_stages > n_rows:
        raise ValueError(f"{n_stages} stages over the times of {n_rows} devices")
    return np.arange(n_stages)


def _stage_terms(h_p, h_m, j_p, j_m, cuts):
    """Per stage of the division: F^P, F^M, B^P, B^M (eq. (6)), each stage on its own row."""
    rows = [stage_rows(x) for x in (h_p, h_m, j_p, j_m)]
    k = rows[0].shape[1]
    bounds = np.array(bounds_of(cuts, k))
    s = stage_index(len(bounds) - 1, rows[0].shape[0])
    p1, p2 = prefix_sums(rows[0]), prefix_sums(rows[2])
    f = p1[s, bounds[1:]] - p1[s, bounds[:-1]]
    b = p2[s, bounds[1:]] - p2[s, bounds[:-1]]
    c = np.asarray(cuts, dtype=np.int64)
    cf = np.append(rows[1][s[:-1], c], 0.0)
    cb = np.append(rows[3][s[:-1], c + 1], 0.0)
    return f, cf, b, cb


def evaluate(h_p, h_m, j_p, j_m, cuts) -> Division:
    """rho1 and rho2 of a division (CSIMD eq. (8))."""
    f, cf, b, cb = _stage_terms(h_p, h_m, j_p, j_m, cuts)
    return Division(tuple(int(c) for c in cuts), float(np.maximum(f, cf).max()), float(np.maximum(b, cb).max()))


def total_time(h_p, h_m, j_p, j_m, cuts, n_micro: int) -> float:
    """T(lambda, p), CSIMD eq. (8)."""
    if np.ndim(h_p) == 2 and np.shape(h_p)[0] > 1:  # devices of several kinds: compute depends on the division
        f, cf, b, cb = _stage_terms(h_p, h_m, j_p, j_m, cuts)
        rho = np.maximum(f, cf).max() + np.maximum(b, cb).max()
        return float(f.sum() + b.sum() + cf.sum() + cb.sum() + (n_micro - 1) * rho)
    h_p, j_p = (np.ravel(np.asarray(x, float)) for x in (h_p, j_p))
    h_m, j_m = (np.ravel(np.asarray(x, float)) for x in (h_m, j_m))
    d = evaluate(h_p, h_m, j_p, j_m, cuts)
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
    k = h_p.shape[-1]
    if not 1 <= n_stages <= k:
        raise ValueError(f"exactly {n_stages} stages of {k} layers: a stage needs a layer")
    if h_p.ndim == 2 and h_p.shape[0] > 1:
        return _fill_rows(h_p, h_m, j_p, j_m, cuts, n_stages, n_micro)
    h_p, h_m, j_p, j_m = (np.ravel(x) for x in (h_p, h_m, j_p, j_m))
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


def _fill_rows(h_p, h_m, j_p, j_m, cuts, n_stages: int, n_micro: int) -> tuple[int, ...]:
    """`fill_to` on devices of several kinds: a new cut moves every later stage to the next device,
    so each candidate division is priced whole (eq. (8) for every candidate at once)."""
    k = h_p.shape[1]
    p1, p2 = prefix_sums(h_p), prefix_sums(j_p)
    cut_f, cut_b = cut_costs(h_m, j_m)
    cuts = sorted(int(c) for c in cuts)
    while len(cuts) + 1 < n_stages:
        new = np.setdiff1d(np.arange(k - 1), cuts)
        every = np.sort(np.column_stack([np.tile(np.asarray(cuts, dtype=np.int64), (len(new), 1)), new]), axis=1)
        n = every.shape[1] + 1
        s = stage_index(n, h_p.shape[0])
        bounds = np.column_stack([np.zeros(len(new), dtype=np.int64), every + 1, np.full(len(new), k)])
        f = p1[s, bounds[:, 1:]] - p1[s, bounds[:, :-1]]
        b = p2[s, bounds[:, 1:]] - p2[s, bounds[:, :-1]]
        cf, cb = cut_f[s[:-1], every], cut_b[s[:-1], every]
        rho = np.maximum(f[:, :-1], cf).max(axis=1).clip(min=f[:, -1]) + \
            np.maximum(b[:, :-1], cb).max(axis=1).clip(min=b[:, -1])
        t = f.sum(axis=1) + b.sum(axis=1) + cf.sum(axis=1) + cb.sum(axis=1) + (n_micro - 1) * rho
        cuts = [int(c) for c in every[int(np.argmin(t))]]
    return tuple(cuts)
