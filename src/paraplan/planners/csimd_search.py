"""CSIMD's searches over divisions and micro-batch counts (../shared/papers/csimd.md eq. (8)):
the exact optimum of T(lambda, p) for one p by branch and bound (`exact_time`), Algorithm 1's
cross-search (`cross_search`), and the default `search` (branch and bound across every p).

The building blocks they share (MASP, IMD, exact_rho, ODPA, eq. (8) itself) are in
planners/csimd.py; this module only composes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.planners.csimd import (
    SearchMethod,
    _cut_costs,
    _prefix,
    _stage_limit,
    _time_arrays,
    exact_rho,
    imd,
    odpa,
    total_time,
)


# --------------------------------------------------------------------------- exact T(lambda, p)
@dataclass(frozen=True)
class TimeSearchOutcome:
    """What the branch and bound over the divisions for one p found."""

    cuts: tuple[int, ...] | None  # the best division with T <= target_s; None if none reaches it
    finished: bool  # False when max_work stopped it before every division was accounted for
    work: int  # in units of one dominance comparison (`_WORK_PER_LAYER`, `_WORK_PER_LABEL`)


# The cost model of the branch and bound's work, in units of one dominance comparison, fitted on
# the 2-core development machine (about 2.6 ns a unit): a layer's fixed numpy overhead, a label
# extended to a layer, a pair of labels compared.
_WORK_PER_LAYER = 40_000
_WORK_PER_LABEL = 500


def _completion_buckets(n_max: int) -> list[tuple[int, int]]:
    """Ranges of stage counts for the rest of the model: single counts up to 4, then doubling.

    The bound of a range [lo, hi] charges lo - 1 cuts and the balance of hi stages, which is below
    the bound of every count in the range: the ranges keep the bound valid and its cost small."""
    buckets, lo = [], 1
    while lo <= n_max:
        hi = lo if lo <= 4 else min(2 * lo - 1, n_max)
        buckets.append((lo, hi))
        lo = hi + 1
    return buckets


_BLOCK = 128
_EARLIER = np.triu(np.ones((_BLOCK, _BLOCK), dtype=bool), 1)  # row label before column label


def _dominates(r1_a, r2_a, c_a, s_a, r1_b_floor, r2_b_floor, c_b, s_b, weight: float) -> np.ndarray:
    """(a x b) matrix: label a dominates label b (see `_undominated`); in place to spare memory."""
    extra = np.subtract.outer(r1_a, r1_b_floor)
    np.maximum(extra, 0.0, out=extra)
    second = np.subtract.outer(r2_a, r2_b_floor)
    np.maximum(second, 0.0, out=second)
    extra += second
    extra *= weight
    extra += c_a[:, None]
    return (extra <= c_b) & (s_a[:, None] <= s_b)


def _undominated(r1, r2, comm, stages, least1, least2, weight: float):
    """Indices of the labels that no earlier label dominates, and the comparisons spent.

    Label A (ending at the same layer as B) dominates B when A used no more stages and finishing A
    the way B is finished never costs more: c_A + w (pos(r1_A - max(r1_B, L1_B)) +
    pos(r2_A - max(r2_B, L2_B))) <= c_B, with L_B a lower bound on the rest's stage maxima with B's
    remaining stages (max(a, X) - max(b, X) = pos(a - max(b, X)) and X >= L_B). A dominator's lower
    bound is never above its victim's, and the labels come sorted by it, so comparing each label
    with the earlier ones only loses nothing; dropping a label that an earlier, itself dropped one
    dominates is safe too, as dominance chains down to a kept label."""
    m = len(r1)
    floor1, floor2 = np.maximum(r1, least1), np.maximum(r2, least2)
    keep = np.zeros(0, dtype=np.int64)
    spent = 0
    for start in range(0, m, _BLOCK):
        stop = min(start + _BLOCK, m)
        here = slice(start, stop)
        size = stop - start
        dominated = np.zeros(size, dtype=bool)
        if len(keep):  # against every label kept so far
            dominated |= _dominates(r1[keep], r2[keep], comm[keep], stages[keep], floor1[here], floor2[here],
                                    comm[here], stages[here], weight).any(axis=0)
            spent += len(keep) * size
        inside = _dominates(r1[here], r2[here], comm[here], stages[here], floor1[here], floor2[here],
                            comm[here], stages[here], weight)
        dominated |= (inside & _EARLIER[:size, :size]).any(axis=0)
        spent += size * size
        survivors = np.nonzero(~dominated)[0] + start
        keep = np.concatenate((keep, survivors))
    return keep, spent


class _Labels:
    """Growing columns of partial divisions: (rho1, rho2, cut communication, stages, parent, end)."""

    def __init__(self):
        self.size, cap = 1, 1024
        self.rho1, self.rho2, self.comm = np.zeros(cap), np.zeros(cap), np.zeros(cap)
        self.stages = np.zeros(cap, dtype=np.int64)
        self.parent = np.full(cap, -1, dtype=np.int64)
        self.end = np.full(cap, -1, dtype=np.int64)  # label 0: the empty division, "ending" at -1

    def add(self, rho1, rho2, comm, stages, parent, end: int) -> None:
        m = len(rho1)
        while self.size + m > len(self.rho1):
            for name in ("rho1", "rho2", "comm", "stages", "parent", "end"):
                old = getattr(self, name)
                setattr(self, name, np.concatenate((old, np.zeros_like(old))))
        s = slice(self.size, self.size + m)
        self.rho1[s], self.rho2[s], self.comm[s], self.stages[s], self.parent[s] = rho1, rho2, comm, stages, parent
        self.end[s] = end
        self.size += m

    def cuts(self, label: int) -> tuple[int, ...]:
        cuts = []
        while label > 0:
            cuts.append(int(self.end[label]))
            label = int(self.parent[label])
        return tuple(reversed(cuts))


def _time_branch_and_bound(h_p, h_m, j_p, j_m, n_stages: int, n_micro: int, target_s: float,
                           max_work: float = np.inf) -> TimeSearchOutcome:
    """The division into at most n_stages stages minimising T(lambda, p) (eq. (8)) among those with
    T <= target_s (a known division's T), or None when none reaches the target.

    A forward dynamic program over the layer where a stage ends keeps labels (rho1, rho2, cut
    communication, stages used) of partial divisions. A label is dropped when even the best way to
    finish it cannot reach the target: the rest of the model, split into m more stages, adds at
    least m - 1 of its cheapest cuts and has stage maxima at least max(largest layer, sum / m)
    (eq. (8) term by term). Labels another label dominates are dropped too (`_undominated`).
    Arrays must be checked (`_time_arrays`) by the caller."""
    k = len(h_p)
    n_max = _stage_limit(n_stages, k)
    if n_micro < 1:
        raise ValueError(f"need at least one micro-batch, got {n_micro}")
    weight = float(n_micro - 1)  # p - 1 in eq. (8)
    p1, p2 = _prefix(h_p), _prefix(j_p)
    cut_f, cut_b = _cut_costs(h_m, j_m)
    cut_comm = cut_f + cut_b
    base = float(p1[-1] + p2[-1])  # sum of all compute, the same for every division
    slack = 1e-12 * (abs(target_s) + base)  # rounding of sums taken in another order
    budget = target_s - base + slack  # for cut communication + (p - 1)(rho1 + rho2)
    if budget < 0:
        return TimeSearchOutcome(None, True, 0)
    # the rest of the model after a stage ending at layer e: layers e + 1 .. K - 1
    rest_len = k - 1 - np.arange(k)
    rest_max1 = np.append(np.maximum.accumulate(h_p[::-1])[::-1][1:], 0.0)
    rest_max2 = np.append(np.maximum.accumulate(j_p[::-1])[::-1][1:], 0.0)
    rest_sum1, rest_sum2 = p1[-1] - p1[1:], p2[-1] - p2[1:]
    # cheapest cut inside the rest (cut positions e + 1 .. K - 2)
    inner = np.append(cut_comm[:-1], np.inf)
    rest_cut = np.append(np.minimum.accumulate(inner[::-1])[::-1][1:], np.inf)
    rest_cut = np.where(np.isfinite(rest_cut), rest_cut, 0.0)
    least_rho1 = max(h_p.max(), p1[-1] / n_max)  # no division has smaller rho1 (or rho2 below)
    least_rho2 = max(j_p.max(), p2[-1] / n_max)
    buckets = _completion_buckets(n_max)
    widen = 1e-12 * (p1[-1] + p2[-1])
    labels = _Labels()
    first = [0, 1]  # first[j + 1]: the first label of a stage ending at layer j (label 0 ends at -1)
    work = 0
    best_parent = -1  # the label before the final stage of the best complete division
    for e in range(k):
        last = e == k - 1
        j_lo = -1  # stages j + 1 .. e whose own compute already breaks the budget are never tried
        if weight > 0:
            cap1 = budget / weight - least_rho2 + widen
            cap2 = budget / weight - least_rho1 + widen
            j_lo = max(-1, int(np.searchsorted(p1, p1[e + 1] - cap1, side="left")) - 1,
                       int(np.searchsorted(p2, p2[e + 1] - cap2, side="left")) - 1)
        lo, hi = first[min(j_lo, e) + 1], first[e + 1]
        if lo >= hi:
            first.append(labels.size)
            work += _WORK_PER_LAYER
            continue
        ends = labels.end[lo:hi]
        r1 = np.maximum(labels.rho1[lo:hi], p1[e + 1] - p1[ends + 1])
        r2 = np.maximum(labels.rho2[lo:hi], p2[e + 1] - p2[ends + 1])
        stages = labels.stages[lo:hi] + 1
        work += _WORK_PER_LAYER + _WORK_PER_LABEL * (hi - lo)
        if last:  # complete divisions: eq. (8) less the compute sum
            value = labels.comm[lo:hi] + weight * (r1 + r2)
            value = np.where(stages <= n_max, value, np.inf)
            i = int(np.argmin(value))
            if value[i] <= budget:
                best_parent = lo + i
            break
        r1 = np.maximum(r1, cut_f[e])
        r2 = np.maximum(r2, cut_b[e])
        comm = labels.comm[lo:hi] + cut_comm[e]
        rest_stages = np.minimum(n_max - stages, rest_len[e])  # stages the rest may still use
        alive = rest_stages >= 1
        with np.errstate(divide="ignore", invalid="ignore"):
            least1 = np.maximum(rest_max1[e], rest_sum1[e] / rest_stages)
            least2 = np.maximum(rest_max2[e], rest_sum2[e] / rest_stages)
        finish = np.full(hi - lo, np.inf)  # the least the rest can add, over its stage counts
        for few, many in buckets:
            if few > rest_len[e]:
                break
            many_here = np.minimum(many, rest_stages)
            with np.errstate(divide="ignore", invalid="ignore"):
                value = (few - 1) * rest_cut[e] + weight * (
                    np.maximum(r1, np.maximum(rest_max1[e], rest_sum1[e] / many_here))
                    + np.maximum(r2, np.maximum(rest_max2[e], rest_sum2[e] / many_here)))
            finish = np.where(rest_stages >= few, np.minimum(finish, value), finish)
        bound = comm + finish
        keep = np.nonzero(alive & (bound <= budget))[0]
        if len(keep):
            order = keep[np.lexsort((stages[keep], bound[keep]))]
            chosen, spent = _undominated(r1[order], r2[order], comm[order], stages[order],
                                         least1[order], least2[order], weight)
            work += spent
            pick = order[chosen]
            labels.add(r1[pick], r2[pick], comm[pick], stages[pick], lo + pick, e)
        first.append(labels.size)
        if work > max_work:
            return TimeSearchOutcome(None, False, work)
    if best_parent < 0:
        return TimeSearchOutcome(None, True, work)
    return TimeSearchOutcome(labels.cuts(best_parent), True, work)


def exact_time(h_p, h_m, j_p, j_m, n_stages: int, n_micro: int, upper: float | None = None) -> tuple[int, ...]:
    """The division minimising the whole of T(lambda, p) for one p (eq. (8)), exactly.

    IMD (and `exact_rho`) minimise rho1 + rho2, which eq. (8) weighs by p - 1; eq. (8) also adds the
    communication of every cut, which they ignore, so at small p a division with cheaper cuts can
    beat theirs. Branch and bound (`_time_branch_and_bound`) below the better of exact_rho's
    division and a single stage, or below `upper` when that is lower (the T of a division the
    caller knows: when nothing reaches it, that division is the optimum and the better of the two
    is returned). No work limit: at a thousand layers, 64 stages and small p it can take seconds
    to minutes; `search` with SearchMethod.AUTO bounds that work.
    """
    h_p, h_m, j_p, j_m = _time_arrays(h_p, h_m, j_p, j_m)
    n_max = _stage_limit(n_stages, len(h_p))
    known = [exact_rho(h_p, h_m, j_p, j_m, n_max).cuts, ()]
    incumbent = min(known, key=lambda c: total_time(h_p, h_m, j_p, j_m, c, n_micro))
    target = total_time(h_p, h_m, j_p, j_m, incumbent, n_micro)
    if upper is not None:
        target = min(target, upper)
    found = _time_branch_and_bound(h_p, h_m, j_p, j_m, n_max, n_micro, target)
    if found.cuts is None:
        return incumbent
    better = total_time(h_p, h_m, j_p, j_m, found.cuts, n_micro) < total_time(h_p, h_m, j_p, j_m, incumbent, n_micro)
    return found.cuts if better else incumbent



# --------------------------------------------------------------------------- cross-search (Algorithm 1)
@dataclass(frozen=True)
class CrossSearchResult:
    cuts: tuple[int, ...]
    n_micro: int
    time_s: float  # T(lambda, p), eq. (8)
    iterations: int  # cross-search: Algorithm 1's loop turns; AUTO / EXACT_TIME: exact searches run
    exact: bool = False  # proven the optimum of eq. (8) over every division and every candidate p
    lower_bound_s: float = 0.0  # no division and candidate p is faster (AUTO / EXACT_TIME; else 0)


def cross_search(h_p, h_m, j_p, j_m, n_micro_values, n_stages: int, start: int | None = None,
                 method: str = SearchMethod.IMD, eta: int = 1000, cache: dict | None = None) -> CrossSearchResult:
    """Algorithm 1: alternate the best division for p and the best p for a division (ODPA) until
    T stops improving. Arrays are (candidates x K), one row per p. The division comes from IMD
    (the paper), the exact minimum of rho1 + rho2 (EXACT_RHO), or the exact minimum of T itself
    for that p (EXACT_TIME, beyond the paper). `cache` shares divisions between runs. T strictly
    falls every turn and there are finitely many (division, p) pairs, so the loop ends."""
    method = SearchMethod.parse(method)
    if method == SearchMethod.AUTO:
        raise ValueError("cross_search takes imd, exact or exact-time; AUTO is a `search` method")
    q = _time_arrays(h_p, h_m, j_p, j_m, ndim=2)
    ps = list(n_micro_values)
    if len(ps) != q[0].shape[0]:
        raise ValueError(f"{len(ps)} micro-batch counts for {q[0].shape[0]} rows of times")
    cache = {} if cache is None else cache

    def divide(r: int) -> tuple[int, ...]:
        key = (method, r)
        if key not in cache:
            arrays = [x[r] for x in q]
            if method == SearchMethod.IMD:
                cache[key] = imd(*arrays, n_stages, eta=eta).cuts
            elif method == SearchMethod.EXACT_RHO:
                cache[key] = exact_rho(*arrays, n_stages).cuts
            else:
                cache[key] = exact_time(*arrays, n_stages, ps[r])
        return cache[key]

    def time_at(cuts, r: int) -> float:
        return float(odpa(*(x[r:r + 1] for x in q), cuts, [ps[r]])[0])

    row = ps.index(start) if start is not None else 0
    cuts = divide(row)
    t = time_at(cuts, row)
    iterations = 0
    while True:
        iterations += 1
        z = odpa(*q, cuts, ps)
        new_row = int(np.argmin(z))
        if z[new_row] >= t:  # line 5: no better p for this division
            break
        row, t = new_row, float(z[new_row])
        new_cuts = divide(row)
        new_t = time_at(new_cuts, row)
        if new_t >= t:  # line 8 (deviation 4): the new division is no better for T
            break
        cuts, t = new_cuts, new_t
    return CrossSearchResult(cuts=tuple(cuts), n_micro=ps[row], time_s=t, iterations=iterations)


# Work AUTO's exact searches may share (`_WORK_PER_LAYER`): about 2.6 s on the development
# machine, so that AUTO stays within 5 s up to K = 1,000 and N = 64 (benchmarks/planner_speed_csimd.py).
AUTO_MAX_WORK = 2_000_000_000


def _bound_every_p(q, ps: list[int], n_stages: int, max_work: float) -> CrossSearchResult:
    """Branch and bound on eq. (8) over every division and every candidate p (AUTO, EXACT_TIME).

    1. A lower bound per p: T >= sum of compute + (p - 1)(least rho1 + least rho2), as cut
       communication is >= 0 and rho_i >= max(largest layer, sum / N).
    2. The incumbent: the single stage and exact_rho's division for each p (most promising p
       first), every one priced at every p by ODPA; a p whose bound reaches the incumbent is done,
       and exact_rho's minimum of rho1 + rho2 raises that p's bound to sum + (p - 1) min rho.
    3. For the p still open, most promising first, the exact search for a division beating the
       incumbent (`_time_branch_and_bound`); each gets an equal share of the work left, and a
       second pass gives the work the others left unused to those that ran out. A p whose search
       never finished keeps its bound, which the result reports as `lower_bound_s`.
    """
    k = q[0].shape[1]
    n_max = _stage_limit(n_stages, k)
    weights = np.asarray(ps, float) - 1
    base = q[0].sum(axis=1) + q[2].sum(axis=1)
    least = np.maximum(q[0].max(axis=1), q[0].sum(axis=1) / n_max) + np.maximum(q[2].max(axis=1),
                                                                                q[2].sum(axis=1) / n_max)
    bound = base + weights * least
    best_cuts: tuple[int, ...] = ()
    z = odpa(*q, best_cuts, ps)
    best_row = int(np.argmin(z))
    best_t = float(z[best_row])

    def offer(cuts) -> None:
        nonlocal best_cuts, best_row, best_t
        z = odpa(*q, cuts, ps)
        r = int(np.argmin(z))
        if z[r] < best_t:
            best_cuts, best_row, best_t = tuple(cuts), r, float(z[r])

    order = [int(r) for r in np.argsort(bound, kind="stable")]
    for r in order:
        if bound[r] >= best_t:
            continue
        rho = exact_rho(*(x[r] for x in q), n_max)
        offer(rho.cuts)
        # exact_rho is exact to its bisection's 1e-10; a little below keeps the bound valid
        bound[r] = max(bound[r], base[r] + weights[r] * rho.objective * (1 - 1e-9))
    searched, work = 0, 0.0
    unresolved = [r for r in order if bound[r] < best_t]
    tried: dict[int, float] = {}  # the work each row was given last time
    for _ in range(2):
        rows, unresolved = [r for r in unresolved if bound[r] < best_t], []
        for i, r in enumerate(rows):
            share = (max_work - work) / (len(rows) - i)
            if bound[r] >= best_t:
                continue
            if share <= tried.get(r, 0.0):  # no more work than last time: it would stop again
                unresolved.append(r)
                continue
            found = _time_branch_and_bound(*(x[r] for x in q), n_max, ps[r], best_t, share)
            searched += 1
            work += found.work
            tried[r] = share
            if found.cuts is not None:
                offer(found.cuts)
            if not found.finished:
                unresolved.append(r)
        if not unresolved:
            break
    unresolved = [r for r in unresolved if bound[r] < best_t]
    lower = min([best_t, *(float(bound[r]) for r in unresolved)])
    return CrossSearchResult(cuts=best_cuts, n_micro=ps[best_row], time_s=best_t, iterations=searched,
                             exact=not unresolved, lower_bound_s=lower)


def search(h_p, h_m, j_p, j_m, n_micro_values, n_stages: int, method: str = SearchMethod.AUTO, eta: int = 1000,
           starts=None, max_work: float | None = None) -> CrossSearchResult:
    """The division and micro-batch count minimising eq. (8). Arrays are (candidates x K), one
    row per p in n_micro_values.

    SearchMethod.AUTO (the planner's default) — what it guarantees:
      * the answer is never worse than the single stage at any candidate p, nor than exact_rho's
        division for p (the exact minimum of rho1 + rho2) at that p, for every candidate p;
      * it is the exact optimum of eq. (8) over every division into at most n_stages stages and
        every candidate p whenever the result says `exact=True`: each p is then either proven
        unable to beat the answer by a bound or searched to the end by branch and bound;
      * the exact searches share `max_work` (AUTO_MAX_WORK, about 2.6 s of work); a p whose
        search runs out keeps the exact_rho-based answer, and `exact` is False with
        `lower_bound_s` the proven lower bound, so (time_s - lower_bound_s) / time_s is the most
        the answer can be from the optimum.
      In benchmarks/planner_speed_csimd.py (K <= 1,000, N <= 64, every divisor of 512 as p, 2
      cores) it takes at most 1.2 s and is exact on all 25 analytic-looking instances; with a
      10 ms per-layer overhead and 3x communication (best p = 16, cuts costly) it took 2.5 s at
      K = 1,000, N = 64 and fell back there (0.23 % above the optimum, proven within 4.7 %). The
      bound over p is what makes it fast: every p whose sum of compute plus (p - 1) min rho
      already exceeds the best T found is settled without a search, and the p left have large
      (p - 1), where cut communication matters little and the search stays small.
    SearchMethod.EXACT_TIME: the same search with no work limit: always exact, time unbounded.
    SearchMethod.IMD / EXACT_RHO: Algorithm 1's cross-search from each p in `starts` (every
      candidate by default; Algorithm 1 line 1 allows any), with IMD's division (the paper, eta
      weights) or the exact minimum of rho1 + rho2 per p; the best run wins. Neither is exact for
      eq. (8): they ignore the cut communication and stop at a local optimum.
    `starts` applies to the cross-search methods only; `eta` to IMD. Plain strings work as well
    as SearchMethod members; an unknown method raises ValueError.
    """
    method = SearchMethod.parse(method)
    q = _time_arrays(h_p, h_m, j_p, j_m, ndim=2)
    ps = list(n_micro_values)
    if len(ps) != q[0].shape[0]:
        raise ValueError(f"{len(ps)} micro-batch counts for {q[0].shape[0]} rows of times")
    if min(ps) < 1:
        raise ValueError(f"micro-batch counts must be at least 1, got {min(ps)}")
    _stage_limit(n_stages, q[0].shape[1])
    if method == SearchMethod.AUTO:
        return _bound_every_p(q, ps, n_stages, AUTO_MAX_WORK if max_work is None else max_work)
    if method == SearchMethod.EXACT_TIME:
        return _bound_every_p(q, ps, n_stages, np.inf if max_work is None else max_work)
    starts = ps if starts is None else list(starts)
    cache: dict = {}
    results = [cross_search(*q, ps, n_stages, start=s, method=method, eta=eta, cache=cache) for s in starts]
    return min(results, key=lambda r: r.time_s)
