"""CSIMD (../shared/papers/csimd.md): joint pipeline partition and micro-batch count.

Its building blocks: MASP (Algorithm 3), IMD (Algorithm 2), the exact minimum of rho1 + rho2
(`exact_rho`, beyond the paper) and ODPA (Algorithm 4). The objective they serve, eq. (8), and its
array conventions (h_p, h_m, j_p, j_m per layer; `cuts`) are planners/stage_division.py's, shared
with the partition baselines and GroPipe.

Deviations from the printed pseudo-code, with eq. (8) as the truth (CSIMD eqs. (6)-(8)):
  1. Backward communication index: Algorithm 3 (line 4) and Algorithm 4 (P^(2)) use J^M at the
     last layer of a stage; eq. (7) says B_i^M = J^M_{alpha_i + 1}, the gradient entering the
     next stage. We use j_m[a + 1].
  2. MASP's cut condition (Algorithm 3, line 6) cuts only when *both* limits are exceeded; a bin
     must satisfy both, so we stop extending a bin as soon as *either* compute sum exceeds its
     limit, and cut at the furthest end that satisfied both (compute and communication). This
     greedy is optimal for the fewest bins (an exchange argument: its k-th bin never ends before
     any other packing's k-th bin).
  3. The final stage has no outgoing communication (F_N^M = B_N^M = 0 in eq. (6)); Algorithm 4's
     P^(2) would count H^M of the last layer.
  4. Algorithm 1 line 8 breaks on equality only; IMD minimises rho1 + rho2, not the whole of
     T(lambda, p) (eq. (8) also has the cut-communication sum), so a new division can be worse for
     T. We keep whichever of the two is better and stop when neither p nor lambda improves T.
  5. IMD's search range: Algorithm 2 starts at D_min = max(max(H^P, J^P), min(H^M, J^M)) and
     D_max = D1 + D2. With finitely many weights the paper's D_max need not be feasible, and a
     tighter range only saves iterations, so we start from the valid lower bound
     max(max h_p, sum h_p / N) + max(max j_p, sum j_p / N) and an upper bound that is feasible
     for the weight grid (the even split's rho1 + rho2 times eta / (eta - 1), doubled until MASP
     accepts it). eps defaults to 1e-7 of the lower bound (of the upper one when the lower bound
     is 0, as with zero compute), far below the eta error of Property 3; the dichotomy also stops
     when halving no longer changes a float, so it ends on zeros and on huge ratios.
  6. A stage count below N is allowed when MASP packs into fewer bins (tau <= N, as Algorithm 2
     accepts); the planner then leaves the extra devices idle rather than add a cut that costs
     more, and says so in the plan (SearchInfo.note); exact_stages in the request asks for N.
Beyond the paper: `imd` runs all eta + 1 weights of one dichotomy step together in numpy (the
paper's Table II slopes imply minutes at K = 50,000); `exact_rho` returns the true optimum of
rho1 + rho2 by walking the staircase of Pareto-optimal (rho1, rho2) pairs. The searches that
compose these blocks live in planners/csimd/search.py: `exact_time` (the true optimum of the whole
of eq. (8) for one p, by branch and bound), Algorithm 1's `cross_search`, and `search` with
`SearchMethod.AUTO` (eq. (8) bounded over every candidate p at once; its docstring says what it
guarantees).
"""

from __future__ import annotations

import numpy as np

from paraplan.planners.stage_division import (
    Division,
    bounds_of,
    cut_costs,
    evaluate,
    even_cuts,
    prefix_sums,
    stage_index,
    stage_limit,
    stage_rows,
    time_arrays,
)

_TOL = 1e-12  # relative slack on limits, so that a sum equal to a limit is not lost to rounding
_MAX_HALVINGS = 2000  # a float range halves to adjacent floats in < 1100 steps; a guard, not a limit


# --------------------------------------------------------------------------- MASP (Algorithm 3)
def masp(h_p, h_m, j_p, j_m, v1: float, v2: float, max_bins: int | None = None) -> tuple[int, tuple[int, ...]]:
    """Fewest contiguous bins with every bin's forward terms <= v1 and backward terms <= v2.

    Returns (tau, cuts); tau is a large number when no packing exists, and counting stops at
    max_bins + 1 when max_bins is given. Every step starts the next bin after the last cut, so it
    ends after at most K bins. With (S, K) arrays (devices of several kinds) bin b is priced on
    row b and there are at most S bins: a bin that starts later still reaches at least as far,
    so the greedy stays optimal for the fewest bins.
    """
    h_p, h_m, j_p, j_m = (stage_rows(x) for x in (h_p, h_m, j_p, j_m))
    n_rows, k = h_p.shape
    p1, p2 = prefix_sums(h_p), prefix_sums(j_p)
    cut_f, cut_b = cut_costs(h_m, j_m)
    valid = (cut_f <= v1 * (1 + _TOL)) & (cut_b <= v2 * (1 + _TOL))
    last_valid = np.maximum.accumulate(np.where(valid, np.arange(k), -1), axis=1)
    limit = max_bins + 1 if max_bins is not None else k + 1
    start, cuts = 0, []
    while True:
        r = 0 if n_rows == 1 else len(cuts)
        if r >= n_rows:
            return k + 1, tuple(cuts)  # a bin for every device and layers left: no packing
        e1 = np.searchsorted(p1[r], p1[r, start] + v1 * (1 + _TOL), side="right") - 2
        e2 = np.searchsorted(p2[r], p2[r, start] + v2 * (1 + _TOL), side="right") - 2
        end = min(e1, e2, k - 1)
        if end < start:
            return k + 1, tuple(cuts)  # one layer alone exceeds a limit: no packing
        if end == k - 1:
            return len(cuts) + 1, tuple(cuts)
        a = int(last_valid[r, end])
        if a < start:
            return k + 1, tuple(cuts)
        cuts.append(a)
        start = a + 1
        if len(cuts) + 1 > limit:
            return len(cuts) + 1, tuple(cuts)


def _masp_weights(p1, p2, cut_f, cut_b, v1: np.ndarray, v2: np.ndarray, n_stages: int):
    """MASP for many (v1, v2) at once; returns (feasible mask, cut history (steps x W)). Arrays
    are per row (S, K + 1) and (S, K): step b forms every weight's bin b, on row b."""
    k = cut_f.shape[1]
    w = len(v1)
    start = np.zeros(w, dtype=np.int64)
    done = np.zeros(w, dtype=bool)
    dead = np.zeros(w, dtype=bool)
    history = []
    lim1, lim2 = v1 * (1 + _TOL), v2 * (1 + _TOL)
    for step in range(n_stages):
        active = ~(done | dead)
        if not active.any():
            break
        r = 0 if len(p1) == 1 else step
        end = np.minimum(np.searchsorted(p1[r], p1[r][start] + lim1, side="right") - 2,
                         np.searchsorted(p2[r], p2[r][start] + lim2, side="right") - 2)
        end = np.minimum(end, k - 1)
        dead |= active & (end < start)
        finish = active & ~dead & (end == k - 1)
        done |= finish
        cont = active & ~dead & ~finish
        a = end.copy()
        idx = np.clip(a, 0, k - 1)
        bad = cont & ~((cut_f[r][idx] <= lim1) & (cut_b[r][idx] <= lim2))
        while bad.any():  # step back to the furthest end whose cut communication also fits
            a[bad] -= 1
            bad &= a >= start
            idx = np.clip(a, 0, k - 1)
            bad &= ~((cut_f[r][idx] <= lim1) & (cut_b[r][idx] <= lim2))
        dead |= cont & (a < start)
        cont &= ~dead
        history.append(np.where(cont, a, -1))
        start = np.where(cont, a + 1, start)
    return done, history


# --------------------------------------------------------------------------- IMD (Algorithm 2)
def imd(h_p, h_m, j_p, j_m, n_stages: int, eta: int = 1000, eps: float | None = None) -> Division:
    """Improved multi-dimensional dichotomy: minimise rho1 + rho2 for a fixed micro-batch count.

    All eta + 1 weight vectors w_i = (i/eta, 1 - i/eta) of a dichotomy step are checked together;
    the first feasible one (lowest i, as Algorithm 2's `break`) gives the division. eta >= 2:
    with the weights (0, 1) and (1, 0) alone no division with both rho1 and rho2 positive is ever
    accepted (Property 3's error bound opt / (eta - 1) needs eta >= 2 as well).
    """
    h_p, h_m, j_p, j_m = (stage_rows(x) for x in time_arrays(h_p, h_m, j_p, j_m))
    if eta < 2:
        raise ValueError(f"eta must be at least 2, got {eta}")
    k = h_p.shape[1]
    n_stages = stage_limit(n_stages, k)
    p1, p2 = prefix_sums(h_p), prefix_sums(j_p)
    cut_f, cut_b = cut_costs(h_m, j_m)
    weights = np.arange(eta + 1) / eta
    # a layer costs at least its fastest device's time (the plain arrays on devices alike)
    least1, least2 = h_p.min(axis=0), j_p.min(axis=0)
    lower = max(least1.max(), least1.sum() / n_stages) + max(least2.max(), least2.sum() / n_stages)
    even = evaluate(h_p, h_m, j_p, j_m, even_cuts(k, n_stages))
    # The even split fits limits (w_i D, (1 - w_i) D) for some i once D >= its objective *
    # eta / (eta - 1): the interval [rho1 / D, 1 - rho2 / D] is then at least 1 / eta wide.
    upper = even.objective * eta / (eta - 1) * (1 + 1e-9)

    def check(d: float):
        ok, history = _masp_weights(p1, p2, cut_f, cut_b, weights * d, (1 - weights) * d, n_stages)
        if not ok.any():
            return None
        i = int(np.argmax(ok))
        return tuple(int(h[i]) for h in history if h[i] >= 0)

    best = check(upper)
    for _ in range(64):  # rounding on the grid's edge only: each doubling widens the interval
        if best is not None:
            break
        upper *= 2
        best = check(upper)
    if best is None:  # unreachable for finite times; the even split is always a valid answer
        return even
    if eps is None:
        eps = 1e-7 * (lower if lower > 0 else upper)
    for _ in range(_MAX_HALVINGS):
        if upper - lower <= eps:
            break
        mean = (upper + lower) / 2
        if not lower < mean < upper:  # no float between the ends: the range cannot shrink further
            break
        cuts = check(mean)
        if cuts is not None:
            upper, best = mean, cuts
        else:
            lower = mean
    return evaluate(h_p, h_m, j_p, j_m, best)


# --------------------------------------------------------------------------- exact rho1 + rho2
def _least_limit(h_p, h_m, j_p, j_m, n_stages, other, lo, hi, forward: bool):
    """The least forward limit (forward=True; the backward limit fixed at `other`) or the least
    backward limit (forward=False; the forward limit fixed at `other`) that MASP can pack into
    n_stages bins, by bisection in [lo, hi] to 1e-10 relative; None if even hi fails."""
    def feasible(x):
        v1, v2 = (x, other) if forward else (other, x)
        return masp(h_p, h_m, j_p, j_m, v1, v2, n_stages)[0] <= n_stages

    if not feasible(hi):
        return None
    if lo >= hi or feasible(lo):  # a zero lower bound that already fits ends here, not after 1000 halvings
        return min(lo, hi)
    for _ in range(_MAX_HALVINGS):
        if hi - lo <= _TOL * 100 * hi:
            break
        # geometric steps while the ends differ by orders of magnitude (1e-9 next to 1e9), so the
        # search takes tens of steps, not hundreds
        mid = float(np.sqrt(lo * hi)) if lo > 0 and hi > 16 * lo else (lo + hi) / 2
        if not lo < mid < hi:
            break
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return hi


def exact_rho(h_p, h_m, j_p, j_m, n_stages: int, eta_bound: int = 100) -> Division:
    """The true minimum of rho1 + rho2 (not an eta-approximation).

    The feasible (rho1, rho2) pairs form a staircase: f(v1) = the least v2 that MASP can pack with
    v1 is non-increasing. The optimum of v1 + v2 lies on a corner, so we walk the corners: from
    v1, take v2 = f(v1); the next corner has the least v1 that allows any v2 below this one.
    Only corners that can beat a known division matter: IMD with a coarse weight grid gives one
    (objective U), and a corner (v1, v2) can win only if v1 <= U - r2 and v2 <= U - r1, where r1
    and r2 are the least rho1 and rho2 any division reaches on its own; that confines the walk to
    a narrow window. Limits are found by bisection to 1e-10 relative and snapped to the division
    MASP returns, whose rho values are achieved exactly. Every corner has a strictly smaller rho2
    than the one before (a value some division achieves), so the walk ends, also when rho2 is 0.
    """
    h_p, h_m, j_p, j_m = (stage_rows(x) for x in time_arrays(h_p, h_m, j_p, j_m))
    k = h_p.shape[1]
    n_stages = stage_limit(n_stages, k)
    cut_f, cut_b = cut_costs(h_m, j_m)
    top1 = float(h_p.sum(axis=1).max() + cut_f.max())
    top2 = float(j_p.sum(axis=1).max() + cut_b.max())
    least1, least2 = h_p.min(axis=0), j_p.min(axis=0)  # on devices of several kinds, the fastest
    low1 = max(least1.max(), least1.sum() / n_stages)
    low2 = max(least2.max(), least2.sum() / n_stages)
    best = imd(h_p, h_m, j_p, j_m, n_stages, eta=eta_bound)
    r1 = _least_limit(h_p, h_m, j_p, j_m, n_stages, top2, low1, top1, forward=True)
    r2 = _least_limit(h_p, h_m, j_p, j_m, n_stages, top1, low2, top2, forward=False)
    # the first corner worth visiting: the least v1 that allows v2 <= U - r1
    v1 = _least_limit(h_p, h_m, j_p, j_m, n_stages, best.objective - r1, r1, top1, forward=True)
    previous_rho2 = np.inf
    while v1 is not None and v1 <= best.objective - r2:
        v2 = _least_limit(h_p, h_m, j_p, j_m, n_stages, v1, low2, top2, forward=False)
        if v2 is None:
            break
        _, cuts = masp(h_p, h_m, j_p, j_m, v1, v2, n_stages)
        d = evaluate(h_p, h_m, j_p, j_m, cuts)
        if d.objective < best.objective:
            best = d
        if not d.rho2 < previous_rho2:  # no progress down the staircase: nothing left below
            break
        previous_rho2 = d.rho2
        below = d.rho2 * (1 - 1e-9)  # strictly below the current corner's rho2
        if below < r2 or below <= 0:  # rho2 cannot go lower
            break
        v1 = _least_limit(h_p, h_m, j_p, j_m, n_stages, below, max(r1, d.rho1), top1, forward=True)
    return best


# --------------------------------------------------------------------------- ODPA (Algorithm 4)
def odpa(h_p, h_m, j_p, j_m, cuts, n_micro_values) -> np.ndarray:
    """T(lambda, p) for every candidate p at once, by the matrix products of Algorithm 4.

    Arrays are (n_candidates x K): row r holds the time functions at micro-batch size B / p_r.
    Returns Z, one T per candidate; argmin(Z) is the optimal p for this division. With devices of
    several kinds (n_candidates x S x K) stage i's sums are taken on row i (`_odpa_rows`).
    """
    q1, q2, q3, q4 = (np.atleast_2d(np.asarray(x, float)) for x in (h_p, h_m, j_p, j_m))
    if q1.ndim == 3:
        return _odpa_rows(q1, q2, q3, q4, cuts, n_micro_values)
    k = q1.shape[1]
    bounds = [0, *[c + 1 for c in cuts], k]
    n = len(bounds) - 1
    members = np.zeros((k, n))  # P^(1): layer j in stage i
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        members[a:b, i] = 1.0
    sends = np.zeros((k, n))  # P^(2) for H^M: the stage's last layer, none for the final stage
    grads = np.zeros((k, n))  # for J^M: the layer after the cut (deviation 1)
    for i, c in enumerate(cuts):
        sends[c, i] = 1.0
        grads[c + 1, i] = 1.0
    p = np.asarray(n_micro_values, float)
    f_p, f_m, b_p, b_m = q1 @ members, q2 @ sends, q3 @ members, q4 @ grads
    u1 = np.maximum(f_p.max(axis=1), f_m.max(axis=1)) * (p - 1)
    u2 = np.maximum(b_p.max(axis=1), b_m.max(axis=1)) * (p - 1)
    return f_p.sum(axis=1) + f_m.sum(axis=1) + b_p.sum(axis=1) + b_m.sum(axis=1) + u1 + u2


def _odpa_rows(q1, q2, q3, q4, cuts, n_micro_values) -> np.ndarray:
    """ODPA on devices of several kinds: P^(1) selects stage i's layers from row i (the device of
    stage i), P^(2) its outgoing cut on the same row; the rest is Algorithm 4 unchanged."""
    k = q1.shape[2]
    bounds = np.array(bounds_of(cuts, k))
    n = len(bounds) - 1
    s = stage_index(n, q1.shape[1])
    layer_stage = np.repeat(np.arange(n), np.diff(bounds))  # the stage of every layer
    on_row = s[layer_stage]
    cols = np.arange(k)
    members = np.zeros((k, n))
    members[cols, layer_stage] = 1.0
    f_p = (q1[:, on_row, cols]) @ members  # (R, n): each layer on its stage's row
    b_p = (q3[:, on_row, cols]) @ members
    c = np.asarray(cuts, dtype=np.int64)
    zeros = np.zeros((q1.shape[0], 1))
    f_m = np.concatenate((q2[:, s[:-1], c], zeros), axis=1)
    b_m = np.concatenate((q4[:, s[:-1], c + 1], zeros), axis=1)
    p = np.asarray(n_micro_values, float)
    u1 = np.maximum(f_p.max(axis=1), f_m.max(axis=1)) * (p - 1)
    u2 = np.maximum(b_p.max(axis=1), b_m.max(axis=1)) * (p - 1)
    return f_p.sum(axis=1) + f_m.sum(axis=1) + b_p.sum(axis=1) + b_m.sum(axis=1) + u1 + u2
