"""CSIMD's searches over divisions and micro-batch counts (../shared/papers/csimd.md eq. (8)):
the exact optimum of T(lambda, p) for one p by branch and bound (`exact_time`), Algorithm 1's
cross-search (`cross_search`), and the default `search` (branch and bound across every p, only
among divisions that fit memory when given one).

The building blocks they share are in planners/csimd/algorithms.py (MASP, IMD, exact_rho, ODPA)
and planners/stage_division.py (eq. (8) itself), the branch and bound for one p in
planners/csimd/bound.py; this module only composes them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from paraplan.planners.csimd.algorithms import exact_rho, imd, odpa
from paraplan.planners.csimd.bound import TimeSearchOutcome, time_branch_and_bound
from paraplan.planners.fit import misfit
from paraplan.planners.stage_division import fill_to, least_rows, stage_limit, time_arrays, total_time

__all__ = ["AUTO_MAX_WORK", "CrossSearchResult", "SearchMethod", "TimeSearchOutcome", "cross_search", "exact_time",
           "search"]


class SearchMethod(StrEnum):
    """How `search` divides the layers (members equal their plain strings)."""

    AUTO = "auto"  # branch and bound on eq. (8) over every p, exact within a work limit (see `search`)
    IMD = "imd"  # the paper: cross-search with IMD (Algorithms 1-4)
    EXACT_RHO = "exact"  # cross-search with the exact minimum of rho1 + rho2 per p
    EXACT_TIME = "exact-time"  # the exact optimum of eq. (8) over all divisions and p, no work limit

    @classmethod
    def parse(cls, value: str | SearchMethod) -> SearchMethod:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"unknown search method {value!r}; choose from {choices}") from None


def exact_time(h_p, h_m, j_p, j_m, n_stages: int, n_micro: int, upper: float | None = None) -> tuple[int, ...]:
    """The division minimising the whole of T(lambda, p) for one p (eq. (8)), exactly.

    IMD (and `exact_rho`) minimise rho1 + rho2, which eq. (8) weighs by p - 1; eq. (8) also adds the
    communication of every cut, which they ignore, so at small p a division with cheaper cuts can
    beat theirs. Branch and bound (`bound.time_branch_and_bound`) below the better of exact_rho's
    division and a single stage, or below `upper` when that is lower (the T of a division the
    caller knows: when nothing reaches it, that division is the optimum and the better of the two
    is returned). No work limit: at a thousand layers, 64 stages and small p it can take seconds
    to minutes; `search` with SearchMethod.AUTO bounds that work.
    """
    h_p, h_m, j_p, j_m = time_arrays(h_p, h_m, j_p, j_m)
    n_max = stage_limit(n_stages, h_p.shape[-1])
    known = [exact_rho(h_p, h_m, j_p, j_m, n_max).cuts, ()]
    incumbent = min(known, key=lambda c: total_time(h_p, h_m, j_p, j_m, c, n_micro))
    target = total_time(h_p, h_m, j_p, j_m, incumbent, n_micro)
    if upper is not None:
        target = min(target, upper)
    found = time_branch_and_bound(h_p, h_m, j_p, j_m, n_max, n_micro, target)
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
    fits: bool = True  # with a memory check: False when no division fitting was found (the closest)


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
    q = time_arrays(h_p, h_m, j_p, j_m, ndim=2)
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


def _least_rho(q, n) -> np.ndarray:
    """Per row: no division into n stages has a smaller rho1 + rho2 (every layer at its fastest
    device's time where devices differ, `least_rows`)."""
    h_p, j_p = least_rows(q[0]), least_rows(q[2])
    return (np.maximum(h_p.max(axis=1), h_p.sum(axis=1) / n)
            + np.maximum(j_p.max(axis=1), j_p.sum(axis=1) / n))


class _Incumbent:
    """The best division found so far over every candidate p, each offer priced at every p by ODPA."""

    def __init__(self, q, ps: list[int], n_max: int, exactly: bool, memory):
        self.q, self.ps, self.n_max, self.exactly, self.memory = q, ps, n_max, exactly, memory
        self.cuts: tuple[int, ...] | None = None
        self.row, self.time_s = 0, np.inf

    def offer(self, cuts) -> None:
        q, ps = self.q, self.ps
        z = odpa(*q, cuts, ps)
        if self.exactly and len(cuts) + 1 < self.n_max:  # filled up at the p this division suits best
            r = int(np.argmin(z))
            cuts = fill_to(*(x[r] for x in q), cuts, self.n_max, ps[r])
            z = odpa(*q, cuts, ps)
        if self.memory is not None:  # only where the division fits
            z = np.where([self.memory.division_fits(r, cuts) for r in range(len(ps))], z, np.inf)
        r = int(np.argmin(z))
        if z[r] < self.time_s:
            self.cuts, self.row, self.time_s = tuple(int(c) for c in cuts), r, float(z[r])


def _bound_every_p(q, ps: list[int], n_stages: int, max_work: float, memory=None,
                   exactly: bool = False) -> CrossSearchResult:
    """Branch and bound on eq. (8) over every division and every candidate p (AUTO, EXACT_TIME).

    1. A lower bound per p: T >= sum of compute + (p - 1)(least rho1 + least rho2), as cut
       communication is >= 0 and rho_i >= max(largest layer, sum / N).
    2. The incumbent: the single stage and exact_rho's division for each p (most promising p
       first), every one priced at every p by ODPA; a p whose bound reaches the incumbent is done,
       and exact_rho's minimum of rho1 + rho2 raises that p's bound to sum + (p - 1) min rho.
    3. For the p still open, most promising first, the exact search for a division beating the
       incumbent (`bound.time_branch_and_bound`); each gets an equal share of the work left, and a
       second pass gives the work the others left unused to those that ran out. A p whose search
       never finished keeps its bound, which the result reports as `lower_bound_s`.
    With `memory` (planners/fit.py SplitMemory) only divisions that fit count: an incumbent is
    priced only at the p where it fits, a division that fits whenever any does joins them
    (`fitting_cuts`), a p at which no division can fit is not searched (`can_fit`, a proof), and
    the exact searches never form a stage that does not fit (`_search_one`: GPipe's verdict
    depends on a stage's device only, 1F1B's on its distance from the last stage, searched on the
    mirrored model; 1F1B on unequal devices once per stage count). With `exactly`, divisions have
    exactly n_stages stages (incumbents are filled up, planners/stage_division.py `fill_to`). When
    nothing fits, the division closest to fitting (`least_overflow_cuts`) comes back with
    fits=False.
    """
    k = q[0].shape[-1]
    n_max = stage_limit(n_stages, k)
    if exactly and n_stages > k:
        raise ValueError(f"exactly {n_stages} stages of {k} layers: a stage needs a layer")
    weights = np.asarray(ps, float) - 1
    base = least_rows(q[0]).sum(axis=1) + least_rows(q[2]).sum(axis=1)  # compute at its least
    bound = base + weights * _least_rho(q, n_max)  # step 1
    best = _Incumbent(q, ps, n_max, exactly, memory)
    order = _offer_incumbents(best, q, n_max, memory, bound, base, weights)  # step 2
    task_bound = _task_bounds(q, order, n_max, exactly, memory, bound, base, weights)
    searched, unresolved = _search_open(q, ps, n_max, task_bound, best, max_work, memory)  # step 3
    if best.cuts is None:  # nothing fits (or none was found within the work): the closest to fitting
        return _closest_to_fitting(q, ps, n_max, exactly, memory, bound, searched)
    lower = min([best.time_s, *(task_bound[t] for t in unresolved)])
    return CrossSearchResult(cuts=best.cuts, n_micro=ps[best.row], time_s=best.time_s, iterations=searched,
                             exact=not unresolved, lower_bound_s=lower)


def _offer_incumbents(best: _Incumbent, q, n_max: int, memory, bound: np.ndarray, base, weights) -> list[int]:
    """Step 2 of `_bound_every_p`: the single stage, the divisions that fit whenever any does and
    exact_rho's division for each p still open offered to `best`; each p's bound raised by exact_rho
    in place. Returns the rows worth a search, most promising first."""
    layer_times = least_rows(q[0]) + least_rows(q[2])
    best.offer(())  # the single stage (filled up to n_max with `exactly`)
    # the p worth a search: all, or those where some division may fit (a proof when not)
    order = [int(r) for r in np.argsort(bound, kind="stable")
             if memory is None or memory.can_fit(int(r), n_max)]
    if memory is not None:
        for r in order:
            cuts = memory.fitting_cuts(r, n_max, layer_times[r])
            if cuts is not None:
                best.offer(cuts)
    for r in order:
        if bound[r] >= best.time_s:
            continue
        rho = exact_rho(*(x[r] for x in q), n_max)
        best.offer(rho.cuts)
        # exact_rho is exact to its bisection's 1e-10; a little below keeps the bound valid
        bound[r] = max(bound[r], base[r] + weights[r] * rho.objective * (1 - 1e-9))
    return order


def _task_bounds(q, order: list[int], n_max: int, exactly: bool, memory, bound, base, weights) -> dict:
    """{(row, stage count or None): lower bound} of the exact searches to run."""
    k = q[0].shape[-1]
    least_cut = (least_rows(q[1])[:, :-1] + least_rows(q[3])[:, 1:]).min(axis=1) if k > 1 else np.zeros(len(bound))
    # the exact searches: one per p over at most n_max stages (from the last layer where 1F1B
    # counts a stage by its distance from the last), or one per p and stage count where only the
    # count tells a stage's verdict (exactly; 1F1B on unequal devices); none for a p at which
    # nothing can fit
    task_bound = {}
    for r in order:
        if exactly:
            counts = [n_max]
        elif memory is not None and memory.from_end and (memory.uneven or q[0].ndim == 3):
            counts = [n for n in range(1, n_max + 1) if memory.can_fit(r, n)]
        else:
            counts = [None]
        for n in counts:
            extra = 0.0 if n is None else max(0.0, float(base[r] + (n - 1) * least_cut[r]
                                                         + weights[r] * _least_rho(q, n)[r]))
            task_bound[(r, n)] = max(float(bound[r]), extra)
    return task_bound


def _search_open(q, ps: list[int], n_max: int, task_bound: dict, best: _Incumbent, max_work: float,
                 memory) -> tuple[int, list]:
    """Step 3 of `_bound_every_p`: the exact searches of the tasks whose bound is below the
    incumbent, each given an equal share of the work left, then a second pass for those that ran
    out. Returns (searches run, the tasks left unresolved)."""
    searched, work = 0, 0.0
    unresolved = [t for t in task_bound if task_bound[t] < best.time_s]
    tried: dict = {}  # the work each search was given last time
    for _ in range(2):
        tasks, unresolved = [t for t in unresolved if task_bound[t] < best.time_s], []
        for i, (r, n) in enumerate(tasks):
            share = (max_work - work) / (len(tasks) - i)
            if task_bound[(r, n)] >= best.time_s:
                continue
            if share <= tried.get((r, n), 0.0):  # no more work than last time: it would stop again
                unresolved.append((r, n))
                continue
            found = _search_one(q, r, ps[r], n_max, n, best.time_s, share, memory)
            searched += 1
            work += found.work
            tried[(r, n)] = share
            if found.cuts is not None:
                best.offer(found.cuts)
            if not found.finished:
                unresolved.append((r, n))
        if not unresolved:
            break
    return searched, [t for t in unresolved if task_bound[t] < best.time_s]


def _closest_to_fitting(q, ps: list[int], n_max: int, exactly: bool, memory, bound, searched: int) -> CrossSearchResult:
    """Nothing fits: the division closest to fitting (`least_overflow_cuts`) at the p where it is."""
    closest = []
    for r in range(len(ps)):
        cuts = memory.least_overflow_cuts(r, n_max)
        cuts = fill_to(*(x[r] for x in q), cuts, n_max, ps[r]) if exactly else cuts
        t = float(odpa(*(x[r:r + 1] for x in q), cuts, [ps[r]])[0])
        closest.append((misfit(memory.overflow(r, cuts)), t, r, tuple(int(c) for c in cuts)))
    _, t, r, cuts = min(closest)
    return CrossSearchResult(cuts=cuts, n_micro=ps[r], time_s=t, iterations=searched, exact=False,
                             lower_bound_s=float(min(bound)), fits=memory.division_fits(r, cuts))


def _search_one(q, r: int, p: int, n_max: int, n: int | None, target_s: float, max_work: float,
                memory) -> TimeSearchOutcome:
    """The branch and bound for row r: exactly n stages, or at most n_max (n None). With 1F1B on
    equal devices it runs on the model turned round, where a stage's index is its distance from
    the last: eq. (8) is the same for a division and its mirror image (rho1 is the largest of
    every stage's forward compute and every cut's forward message, whichever stage sends it;
    rho2 likewise), so the mirrored search's answer, turned back, is this one's."""
    h_p, h_m, j_p, j_m = (x[r] for x in q)
    if memory is None:
        return time_branch_and_bound(h_p, h_m, j_p, j_m, n or n_max, p, target_s, max_work, exactly=n is not None)
    if n is not None or not memory.from_end:  # the stage's index from the first is what counts
        return time_branch_and_bound(h_p, h_m, j_p, j_m, n or n_max, p, target_s, max_work,
                                      fits=memory.stage_fits(r, n or n_max), exactly=n is not None,
                                      same_stages=memory.uneven)
    assert h_p.ndim == 1  # devices of several kinds search one stage count at a time (`_task_bounds`)
    k = len(h_p)
    # mirrored arrays: the cut after mirrored layer e is the cut after layer k - 2 - e here, so it
    # sends h_m[k - 2 - e] forward and j_m[k - 1 - e] back (stage_division.py `cut_costs`)
    mirror_h_m = np.append(h_m[k - 2::-1], 0.0) if k > 1 else np.zeros(1)
    mirror_j_m = np.append(0.0, j_m[:0:-1]) if k > 1 else np.zeros(1)
    fits = memory.stage_fits_from_end(r, n_max)
    found = time_branch_and_bound(h_p[::-1].copy(), mirror_h_m, j_p[::-1].copy(), mirror_j_m, n_max, p, target_s,
                                   max_work, fits=lambda after, first, stop: fits(after, k - stop, k - first))
    if found.cuts is None:
        return found
    return replace(found, cuts=tuple(sorted(k - 2 - c for c in found.cuts)))


def search(h_p, h_m, j_p, j_m, n_micro_values, n_stages: int, method: str = SearchMethod.AUTO, eta: int = 1000,
           starts=None, max_work: float | None = None, memory=None, exactly: bool = False) -> CrossSearchResult:
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
    `memory` (planners/fit.py SplitMemory): AUTO and EXACT_TIME then search only the divisions
    that fit (`_bound_every_p`); the cross-search methods reproduce the paper, which ignores
    memory, and ignore it too. `exactly`: exactly n_stages stages (the cross-searches' divisions
    are filled up, `stage_division.fill_to`, and p chosen again by ODPA).
    """
    method = SearchMethod.parse(method)
    q = time_arrays(h_p, h_m, j_p, j_m, ndim=2)
    ps = list(n_micro_values)
    if len(ps) != q[0].shape[0]:
        raise ValueError(f"{len(ps)} micro-batch counts for {q[0].shape[0]} rows of times")
    if min(ps) < 1:
        raise ValueError(f"micro-batch counts must be at least 1, got {min(ps)}")
    if q[0].ndim == 3 and 1 < q[0].shape[1] < stage_limit(n_stages, q[0].shape[-1]):
        raise ValueError(f"{n_stages} stages over the times of {q[0].shape[1]} devices")
    stage_limit(n_stages, q[0].shape[-1])
    if method == SearchMethod.AUTO:
        return _bound_every_p(q, ps, n_stages, AUTO_MAX_WORK if max_work is None else max_work, memory, exactly)
    if method == SearchMethod.EXACT_TIME:
        return _bound_every_p(q, ps, n_stages, np.inf if max_work is None else max_work, memory, exactly)
    starts = ps if starts is None else list(starts)
    cache: dict = {}
    results = [cross_search(*q, ps, n_stages, start=s, method=method, eta=eta, cache=cache) for s in starts]
    best = min(results, key=lambda r: r.time_s)
    if exactly and len(best.cuts) + 1 < n_stages:
        r = ps.index(best.n_micro)
        cuts = fill_to(*(x[r] for x in q), best.cuts, n_stages, best.n_micro)
        z = odpa(*q, cuts, ps)
        r = int(np.argmin(z))
        best = CrossSearchResult(cuts=cuts, n_micro=ps[r], time_s=float(z[r]), iterations=best.iterations)
    return best
