"""CSIMD's exact search for one p (../shared/papers/csimd.md eq. (8)): the branch and bound over
divisions behind planners/csimd/search.py's `exact_time` and `search` (AUTO, EXACT_TIME), with an optional
per-stage memory mask (planners/fit.py) and an exact stage count.

Kept apart from planners/csimd/search.py, which composes it with exact_rho, ODPA and the bound
across p, so that neither module grows past a screenful of concerns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from paraplan.planners.stage_division import cut_costs, prefix_sums, stage_limit, stage_rows


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


def _dominates(r1_a, r2_a, c_a, s_a, r1_b_floor, r2_b_floor, c_b, s_b, weight: float,
               same_stages: bool = False) -> np.ndarray:
    """(a x b) matrix: label a dominates label b (see `_undominated`); in place to spare memory.
    same_stages: only labels with as many stages compare (the rest's stage indices must match)."""
    extra = np.subtract.outer(r1_a, r1_b_floor)
    np.maximum(extra, 0.0, out=extra)
    second = np.subtract.outer(r2_a, r2_b_floor)
    np.maximum(second, 0.0, out=second)
    extra += second
    extra *= weight
    extra += c_a[:, None]
    return (extra <= c_b) & ((s_a[:, None] == s_b) if same_stages else (s_a[:, None] <= s_b))


def _undominated(r1, r2, comm, stages, least1, least2, weight: float, same_stages: bool = False):
    """Indices of the labels that no earlier label dominates, and the comparisons spent.

    Label A (ending at the same layer as B) dominates B when A used no more stages and finishing A
    the way B is finished never costs more: c_A + w (pos(r1_A - max(r1_B, L1_B)) +
    pos(r2_A - max(r2_B, L2_B))) <= c_B, with L_B a lower bound on the rest's stage maxima with B's
    remaining stages (max(a, X) - max(b, X) = pos(a - max(b, X)) and X >= L_B). A dominator's lower
    bound is never above its victim's, and the labels come sorted by it, so comparing each label
    with the earlier ones only loses nothing; dropping a label that an earlier, itself dropped one
    dominates is safe too, as dominance chains down to a kept label. With same_stages (exactly N
    stages, or a memory verdict that depends on a stage's index) only equal stage counts compare:
    finishing A as B is finished then gives the same stages on the same devices."""
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
                                    comm[here], stages[here], weight, same_stages).any(axis=0)
            spent += len(keep) * size
        inside = _dominates(r1[here], r2[here], comm[here], stages[here], floor1[here], floor2[here],
                            comm[here], stages[here], weight, same_stages)
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


class _Rest(NamedTuple):
    """The rest of the model after a stage ending at layer e (layers e + 1 .. K - 1), indexed by e."""

    n_layers: np.ndarray
    max1: np.ndarray  # its largest forward compute
    max2: np.ndarray  # its largest backward compute
    sum1: np.ndarray  # its forward compute
    sum2: np.ndarray  # its backward compute
    cut: np.ndarray  # its cheapest cut (cut positions e + 1 .. K - 2; 0 where it has none)


def _rest_of_model(h_p, j_p, p1, p2, cut_comm) -> _Rest:
    k = len(h_p)
    rest_len = k - 1 - np.arange(k)
    rest_max1 = np.append(np.maximum.accumulate(h_p[::-1])[::-1][1:], 0.0)
    rest_max2 = np.append(np.maximum.accumulate(j_p[::-1])[::-1][1:], 0.0)
    rest_sum1, rest_sum2 = p1[-1] - p1[1:], p2[-1] - p2[1:]
    # cheapest cut inside the rest (cut positions e + 1 .. K - 2)
    inner = np.append(cut_comm[:-1], np.inf)
    rest_cut = np.append(np.minimum.accumulate(inner[::-1])[::-1][1:], np.inf)
    rest_cut = np.where(np.isfinite(rest_cut), rest_cut, 0.0)
    return _Rest(rest_len, rest_max1, rest_max2, rest_sum1, rest_sum2, rest_cut)


def _least_finish(r1, r2, rest: _Rest, e: int, rest_stages, buckets, weight: float, exactly: bool) -> np.ndarray:
    """The least the rest of the model can add to eq. (8) after partial divisions ending at layer e
    (their rho1, rho2 so far), over its stage counts: m - 1 of its cheapest cuts and stage maxima
    at least max(largest layer, sum / m), a range of counts at a time (`_completion_buckets`)."""
    finish = np.full(len(r1), np.inf)
    for few, many in buckets:
        if few > rest.n_layers[e]:
            break
        many_here = np.minimum(many, rest_stages)
        with np.errstate(divide="ignore", invalid="ignore"):
            value = (few - 1) * rest.cut[e] + weight * (
                np.maximum(r1, np.maximum(rest.max1[e], rest.sum1[e] / many_here))
                + np.maximum(r2, np.maximum(rest.max2[e], rest.sum2[e] / many_here)))
        usable = (rest_stages >= few) & ((rest_stages <= many) if exactly else True)
        finish = np.where(usable, np.minimum(finish, value), finish)
    return finish


def _first_start(p1, p2, e: int, budget: float, weight: float, least_rho1: float, least_rho2: float,
                 widen: float) -> int:
    """j_lo: stages j + 1 .. e whose own compute already breaks the budget are never tried (-1: none
    is ruled out)."""
    if weight <= 0:
        return -1
    cap1 = budget / weight - least_rho2 + widen
    cap2 = budget / weight - least_rho1 + widen
    return max(-1, int(np.searchsorted(p1, p1[e + 1] - cap1, side="left")) - 1,
               int(np.searchsorted(p2, p2[e + 1] - cap2, side="left")) - 1)


def _least_terms(h_p, j_p, cut_comm, n_max: int):
    """(p1, p2, rest, least rho1, least rho2) for the bounds, with every layer at its fastest
    device's time (the plain arrays on devices alike); a label's `comm` then also carries what its
    stages' devices take beyond that. No division has a smaller rho1 (rho2) than the least."""
    fastest1, fastest2 = h_p.min(axis=0), j_p.min(axis=0)
    p1, p2 = prefix_sums(fastest1), prefix_sums(fastest2)  # (K + 1,)
    rest = _rest_of_model(fastest1, fastest2, p1, p2, cut_comm.min(axis=0))
    return p1, p2, rest, max(fastest1.max(), p1[-1] / n_max), max(fastest2.max(), p2[-1] / n_max)


def time_branch_and_bound(h_p, h_m, j_p, j_m, n_stages: int, n_micro: int, target_s: float,
                          max_work: float = np.inf, fits=None, exactly: bool = False,
                          same_stages: bool = False) -> TimeSearchOutcome:
    """The division into at most n_stages stages (exactly n_stages with `exactly`) minimising
    T(lambda, p) (eq. (8)) among those with T <= target_s (a known division's T; inf for none),
    or None when none reaches the target.

    fits(stage indices, first layers, stop) -> mask: whether a stage of layers first..stop-1 at
    that index fits its device (planners/fit.py); stages that do not are never formed, so the
    answer is the optimum among divisions that fit. When the verdict depends on the stage's index
    or on the stage count (1F1B, unequal devices), pass exactly=True for one count at a time, or
    same_stages=True.

    A forward dynamic program over the layer where a stage ends keeps labels (rho1, rho2, cut
    communication, stages used) of partial divisions. A label is dropped when even the best way to
    finish it cannot reach the target: the rest of the model, split into m more stages, adds at
    least m - 1 of its cheapest cuts and has stage maxima at least max(largest layer, sum / m)
    (eq. (8) term by term). Labels another label dominates are dropped too (`_undominated`).
    Arrays must be checked (`stage_division.time_arrays`) by the caller."""
    h_p, h_m, j_p, j_m = (stage_rows(x) for x in (h_p, h_m, j_p, j_m))
    n_rows, k = h_p.shape
    n_max = stage_limit(n_stages, k)
    if n_micro < 1:
        raise ValueError(f"need at least one micro-batch, got {n_micro}")
    if exactly and n_stages > k:
        raise ValueError(f"exactly {n_stages} stages of {k} layers: a stage needs a layer")
    # devices of several kinds (row s: stage s's device): a label's stage count says which devices
    # the rest runs on, so only labels with as many stages compare
    kinds = n_rows > 1
    same_stages = same_stages or exactly or kinds  # a label with fewer stages cannot finish like one with more
    weight = float(n_micro - 1)  # p - 1 in eq. (8)
    rows1, rows2 = prefix_sums(h_p), prefix_sums(j_p)
    rows_f, rows_b = cut_costs(h_m, j_m)
    p1, p2, rest, least_rho1, least_rho2 = _least_terms(h_p, j_p, rows_f + rows_b, n_max)
    base = float(p1[-1] + p2[-1])  # sum of all compute (at its least), the same for every division
    slack = 1e-12 * (abs(target_s) + base)  # rounding of sums taken in another order
    budget = target_s - base + slack  # for cut communication + (p - 1)(rho1 + rho2)
    if budget < 0:
        return TimeSearchOutcome(None, True, 0)
    buckets = _completion_buckets(n_max)
    widen = 1e-12 * (p1[-1] + p2[-1])
    labels = _Labels()
    first = [0, 1]  # first[j + 1]: the first label of a stage ending at layer j (label 0 ends at -1)
    work = 0
    best_parent = -1  # the label before the final stage of the best complete division
    for e in range(k):
        last = e == k - 1
        j_lo = _first_start(p1, p2, e, budget, weight, least_rho1, least_rho2, widen)
        lo, hi = first[min(j_lo, e) + 1], first[e + 1]
        if lo >= hi:
            first.append(labels.size)
            work += _WORK_PER_LAYER
            continue
        ends = labels.end[lo:hi]
        row = labels.stages[lo:hi] if kinds else 0  # the new stage's device
        f = rows1[row, e + 1] - rows1[row, ends + 1]
        b = rows2[row, e + 1] - rows2[row, ends + 1]
        r1 = np.maximum(labels.rho1[lo:hi], f)
        r2 = np.maximum(labels.rho2[lo:hi], b)
        comm = labels.comm[lo:hi]
        if kinds:  # the stage's compute beyond its layers' least (0 on devices alike)
            comm = comm + (f - (p1[e + 1] - p1[ends + 1])) + (b - (p2[e + 1] - p2[ends + 1]))
        stages = labels.stages[lo:hi] + 1
        work += _WORK_PER_LAYER + _WORK_PER_LABEL * (hi - lo)
        room = np.ones(hi - lo, dtype=bool) if fits is None else fits(stages - 1, ends + 1, e + 1)
        if last:  # complete divisions: eq. (8) less the compute sum
            value = comm + weight * (r1 + r2)
            value = np.where(((stages == n_max) if exactly else (stages <= n_max)) & room, value, np.inf)
            i = int(np.argmin(value))
            if np.isfinite(value[i]) and value[i] <= budget:  # budget is inf when no target is known
                best_parent = lo + i
            break
        r1 = np.maximum(r1, rows_f[row, e])
        r2 = np.maximum(r2, rows_b[row, e])
        comm = comm + rows_f[row, e] + rows_b[row, e]
        rest_stages = np.minimum(n_max - stages, rest.n_layers[e])  # stages the rest may still use
        alive = (rest_stages >= 1) & room
        if exactly:  # the rest must take exactly n_max - stages stages, one layer at least each
            alive &= n_max - stages <= rest.n_layers[e]
        with np.errstate(divide="ignore", invalid="ignore"):
            least1 = np.maximum(rest.max1[e], rest.sum1[e] / rest_stages)
            least2 = np.maximum(rest.max2[e], rest.sum2[e] / rest_stages)
        bound = comm + _least_finish(r1, r2, rest, e, rest_stages, buckets, weight, exactly)
        keep = np.nonzero(alive & (bound <= budget) & np.isfinite(bound))[0]
        if len(keep):
            order = keep[np.lexsort((stages[keep], bound[keep]))]
            chosen, spent = _undominated(r1[order], r2[order], comm[order], stages[order],
                                         least1[order], least2[order], weight, same_stages)
            work += spent
            pick = order[chosen]
            labels.add(r1[pick], r2[pick], comm[pick], stages[pick], lo + pick, e)
        first.append(labels.size)
        if work > max_work:
            return TimeSearchOutcome(None, False, work)
    if best_parent < 0:
        return TimeSearchOutcome(None, True, work)
    return TimeSearchOutcome(labels.cuts(best_parent), True, work)
