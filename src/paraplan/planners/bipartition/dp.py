"""Bi-Partition (../shared/papers/bi-partition.md), the pure dynamic program: separate forward and
backward layer ranges per worker. The planner that turns it into Plans is planners/bipartition/planner.py.

The model
---------
Each of m workers runs the forward of a contiguous range of layers and the backward of another
contiguous range; each direction's ranges are in order across the workers (§3.1), but a worker's two
ranges need not coincide, so the heavy backward of a layer can sit on another worker than its
forward. A worker's time is its forward plus its backward time (T(U), 1F1B's steady state), and the
pipeline's time per micro-batch is the bottleneck: the slowest worker or boundary (eqs. (2)-(3)).

Empty ranges. The paper lets one of a worker's ranges be empty (Algorithm 1: "i1 > j1 and i2 > j2
cannot be satisfied at the same time"; §5: a device "only performs the backward computation"), and
that matters: F = [1.592, 1.396, 1.442], B = [4.277, 1.909, 3.154] on 3 workers takes 5.869 with
both ranges non-empty but 4.897 when worker 0 runs only the backward of layer 0. So a worker may
have an empty forward or an empty backward range (allow_empty=True), never both: a worker with
nothing is just a smaller worker count. An empty range is (s, s), s being where the previous
worker's range in that direction stopped, so ranges stay half-open, contiguous and ordered.
allow_empty=False asks for both non-empty; layerwise=True for identical non-empty ranges (the
traditional PipeDream partition, the paper's special case i1 = i2, j1 = j2).

Links. Eq. (3) charges the split between two sub-pipelines (a_s1 + a_s2) / B, s1 and s2 the last
forward and backward layers of the first one. Here the boundary after worker k is charged
cut_s(s1, s2), s1 and s2 the last forward and backward layers run by workers 0..k: the activation
that leaves them and the gradient that comes back into them. An empty range does not stop that
traffic: if worker k + 1 runs no forward, the activation after s1 still has to reach the next worker
that does, so the boundary after k + 1 is charged cut_s(s1, s2') with the same s1 (it is relayed, or
sent past worker k + 1 over the same kind of link; the bottleneck is a max, so the same transfer
counted at two boundaries does not change it). Nothing crosses in a direction that workers 0..k have
not started: s1 is None when they run no forward (the input batch goes straight to the first worker
that runs one) and s2 is None when they run no backward. s1 = L - 1 (they ran the whole forward) is
a real transfer: the model's output goes to the worker that runs the backward of the last layer.
With allow_empty=False or layerwise=True, s1 and s2 stay in 0..L-2 and are never None.

Memory. fits(worker_index, forward_range, backward_range) is asked per worker, ranges possibly
empty. The search is exact when (a) for a given forward range, a shorter backward range never
turns a worker that fits into one that does not (an empty backward range being the same wherever
it sits); (b) a worker that runs only forwards fits for any part of a forward range that fits; and
(c) a worker that fits still fits when the last layers of its forward range go to the next worker.
Dropping the first layers of a forward range may cost more, as the paper's memory has it:
activations live at a layer's backward owner, for longer when its forward ran on an earlier
worker; nothing is assumed there.
Violations that show are refused with a ValueError (an empty backward range answered differently
at 0 and at L, or a returned worker that does not fit), never passed off as DoesNotFit.
worker_index is the worker's position from the first one (bipartition_all can count from the end).

The algorithm (exact)
---------------------
Workers are ordered, so an optimal division into m workers is a division of a prefix into m - 1
workers plus one last worker: eq. (2)'s split m' collapses to m' = 1 and only prefix sub-problems
are needed. With p = (p1, p2) the numbers of forward and backward layers done by the first workers,
F and B the prefix sums of the forward and backward times and G(p) = F(p1) + B(p2):

    V[1](p) = G(p),   V[m](p) = min over q < p of max(V[m-1](q), cut(q), G(p) - G(q))

(q < p: q <= p in both coordinates and q != p; both strictly with allow_empty=False). The optimum
for m workers is V[m](L, L), and one pass over m = 1..M gives every worker count (bipartition_all).
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

Algorithm 2 of the paper (binary_search=True) binary-searches s2 for the crossing of the prefix's
time (assumed non-decreasing in s2) and the last worker's (non-increasing). The first is not
monotone, links free or not: F = [4, 4, 8, 9, 7], B = [6, 10, 14, 2, 7], 4 workers, free links,
non-empty ranges: the search returns 23, the optimum is 20. It is kept as the paper's heuristic
(a slow, plain-Python transcription), never the default.
"""


from __future__ import annotations

import numpy as np

from paraplan.planners.bipartition.algorithm2 import algorithm2
from paraplan.planners.bipartition.division import (
    BiPartition,
    CutFn,
    DoesNotFit,
    FitsFn,
    Predecessors,
    Worker,
    bottleneck,
    max_workers,
    prefix_sums,
    read_division,
)
from paraplan.planners.bipartition.dp_memory import (
    apply_fits,
    apply_fits_first,
    apply_fits_layerwise,
    forward_reach,
)

_INF = float("inf")


def bipartition(forward_s, backward_s, cut_s: CutFn, n_workers: int, fits: FitsFn | None = None,
                layerwise: bool = False, binary_search: bool = False, allow_empty: bool = True) -> BiPartition:
    """The optimal forward/backward ranges for exactly n_workers (Bi-Partition eqs. (2)-(3)).

    cut_s(s1, s2): time to send the activation after forward layer s1 and the gradient at the
    backward cut after layer s2 (0-based, the last layers of the earlier workers; None when nothing
    crosses in that direction, see the module docstring). fits(worker_index, forward_range,
    backward_range): the memory check, with the properties (a)-(c) of the module docstring (None:
    no limit). binary_search=True runs the paper's Algorithm 2, a heuristic that can miss the
    optimum (layerwise=True has no s2 to search and stays exact). Raises ValueError when no
    division into n_workers exists (more workers than parts of layers) and DoesNotFit when none
    fits memory.
    """
    n_layers, forward, backward = _check_times(forward_s, backward_s)
    _check_count(n_workers, n_layers, layerwise, allow_empty)
    cuts = _cut_matrix(cut_s, n_layers, layerwise, allow_empty)
    if binary_search and not layerwise:
        return algorithm2(forward, backward, cuts, n_workers, fits, allow_empty)
    values, predecessors = _prefix_dp(forward, backward, cuts, n_workers, fits, layerwise, allow_empty,
                                      every_count=False)
    if not np.isfinite(values[n_workers - 1]):
        if fits is None:
            raise RuntimeError("bipartition: no division found without a memory limit (a bug)")
        raise DoesNotFit(f"no division of {n_layers} layers over {n_workers} workers fits their memory")
    division = read_division(predecessors, n_workers, forward, backward, cuts)
    _check_fits(division, fits, from_end=False)
    return division


def bipartition_all(forward_s, backward_s, cut_s: CutFn, n_workers: int, fits: FitsFn | None = None,
                    layerwise: bool = False, allow_empty: bool = True, *,
                    fits_index_from_end: bool = False) -> dict[int, BiPartition]:
    """The optimal division for every worker count m = 1..n_workers that has one, from one pass.

    Counts above max_workers(L) have no division and are left out, so are counts where nothing fits.
    The same fits serves every count, so it must not depend on the count through worker_index:
    by default worker_index counts from the first worker (a device's own memory); with
    fits_index_from_end=True it is the number of workers after this one (1F1B keeps
    min(that + 1, n_micro) micro-batches in flight on a worker, whatever the count).
    Raises DoesNotFit when no count fits.
    """
    n_layers, forward, backward = _check_times(forward_s, backward_s)
    _check_positive(n_workers)
    top = min(int(n_workers), max_workers(n_layers, layerwise, allow_empty))
    cuts = _cut_matrix(cut_s, n_layers, layerwise, allow_empty)
    if fits_index_from_end:
        # the mirror image (layers and workers reversed) is the same problem, and its worker index
        # is this one's distance from the end; solve that and turn the answers back round
        values, predecessors = _prefix_dp(forward[::-1].copy(), backward[::-1].copy(), cuts[::-1, ::-1].copy(),
                                          top, None if fits is None else _mirror_fits(fits, n_layers),
                                          layerwise, allow_empty, every_count=True, mirrored=True)
    else:
        values, predecessors = _prefix_dp(forward, backward, cuts, top, fits, layerwise, allow_empty,
                                          every_count=True)
    divisions = {}
    for m in range(1, top + 1):
        if not np.isfinite(values[m - 1]):
            continue
        if fits_index_from_end:
            divisions[m] = _unmirror(read_division(predecessors, m, forward[::-1], backward[::-1], cuts[::-1, ::-1]),
                                     n_layers, forward, backward, cuts)
        else:
            divisions[m] = read_division(predecessors, m, forward, backward, cuts)
        _check_fits(divisions[m], fits, from_end=fits_index_from_end)
    if not divisions:
        if fits is None:
            raise RuntimeError("bipartition_all: no division found without a memory limit (a bug)")
        raise DoesNotFit(f"no division of {n_layers} layers over 1..{top} workers fits their memory")
    return divisions


# ---------------------------------------------------------------------------------------------
# inputs


def _check_times(forward_s, backward_s) -> tuple[int, np.ndarray, np.ndarray]:
    forward = np.asarray(forward_s, dtype=float).ravel()
    backward = np.asarray(backward_s, dtype=float).ravel()
    if forward.size == 0 or forward.size != backward.size:
        raise ValueError(f"forward_s and backward_s need one time per layer, got {forward.size} and "
                         f"{backward.size}")
    for name, times in (("forward_s", forward), ("backward_s", backward)):
        if not np.all(np.isfinite(times)) or np.any(times < 0):
            raise ValueError(f"{name} must be finite and non-negative, got {times.tolist()}")
    return forward.size, forward, backward


def _check_positive(n_workers) -> None:
    if isinstance(n_workers, bool) or not isinstance(n_workers, int | np.integer) or n_workers < 1:
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")


def _check_count(n_workers, n_layers: int, layerwise: bool, allow_empty: bool) -> None:
    _check_positive(n_workers)
    most = max_workers(n_layers, layerwise, allow_empty)
    if n_workers > most:
        why = ("one layer's forward or backward each" if allow_empty and not layerwise
               else "at least one layer each")
        raise ValueError(f"{n_workers} workers cannot share {n_layers} layers: at most {most} can ({why})")


def _cut_matrix(cut_s: CutFn, n_layers: int, layerwise: bool, allow_empty: bool) -> np.ndarray:
    """cuts[a, c]: the time charged at a boundary after a prefix that ran a forward and c backward
    layers, cut_s(a - 1, c - 1) with None for a direction it has not started. Only the entries a
    division can meet are asked for (the others stay 0 and are never read)."""
    size = n_layers + 1
    cuts = np.zeros((size, size))
    if layerwise:
        pairs = ((a, a) for a in range(1, n_layers))
    elif allow_empty:
        pairs = ((a, c) for a in range(size) for c in range(size) if (a, c) not in ((0, 0), (n_layers, n_layers)))
    else:
        pairs = ((a, c) for a in range(1, n_layers) for c in range(1, n_layers))
    for a, c in pairs:
        s1, s2 = (a - 1 if a else None), (c - 1 if c else None)
        try:
            raw = cut_s(s1, s2)
        except (TypeError, IndexError) as error:
            if s1 is None or s2 is None:
                raise TypeError(f"cut_s({s1}, {s2}) failed: with allow_empty=True cut_s must accept None for "
                                "a direction in which nothing crosses (see paraplan.planners.bipartition.dp)"
                                ) from error
            raise
        if np.ndim(raw) != 0:  # e.g. a numpy array indexed with None grows an axis instead of failing
            raise TypeError(f"cut_s({s1}, {s2}) returned {raw!r}, not a number (None means nothing crosses)")
        value = float(raw)
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"cut_s({s1}, {s2}) = {value}: expected a finite, non-negative time")
        cuts[a, c] = value
    return cuts


def _check_fits(division: BiPartition, fits: FitsFn | None, from_end: bool) -> None:
    """Every worker of an answer fits; the search trusted (a)-(c) of the module docstring for
    most of them, so a fits without them ends here, loudly, rather than in a plan that does not fit."""
    if fits is None:
        return
    n_workers = len(division.workers)
    for k, worker in enumerate(division.workers):
        if not fits(n_workers - 1 - k if from_end else k, worker.forward, worker.backward):
            raise ValueError(f"fits lacks a property the search relies on (bipartition/dp.py's docstring, "
                             f"(a)-(c)): worker {k} of {n_workers} ({worker.forward}, {worker.backward}) "
                             "does not fit although the search, trusting them, took it to")


def _mirror_fits(fits: FitsFn, n_layers: int) -> FitsFn:
    def mirrored(index: int, forward: tuple[int, int], backward: tuple[int, int]) -> bool:
        return fits(index, (n_layers - forward[1], n_layers - forward[0]),
                    (n_layers - backward[1], n_layers - backward[0]))
    return mirrored


def _unmirror(division: BiPartition, n_layers: int, forward, backward, cuts) -> BiPartition:
    workers = tuple(Worker(forward=(n_layers - w.forward[1], n_layers - w.forward[0]),
                           backward=(n_layers - w.backward[1], n_layers - w.backward[0]))
                    for w in reversed(division.workers))
    return BiPartition(workers=workers, bottleneck_s=bottleneck(workers, forward, backward, cuts))


# ---------------------------------------------------------------------------------------------
# the exact prefix DP


def _prefix_dp(forward, backward, cuts, n_workers: int, fits: FitsFn | None, layerwise: bool,
               allow_empty: bool, every_count: bool,
               mirrored: bool = False) -> tuple[list[float], list[Predecessors]]:
    """V[m](L, L) for m = 1..n_workers (inf where none) and, per m, every state's best predecessor.

    every_count=False only needs V[n_workers](L, L), so the last count is solved at (L, L) alone.
    mirrored: the problem is the mirror image of the caller's (what memory may assume flips)."""
    n_layers = forward.size
    size = n_layers + 1
    prefix_f, prefix_b = prefix_sums(forward), prefix_sums(backward)
    done = prefix_f[:, None] + prefix_b[None, :]  # G(p): time of the layers a prefix p has run
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
        # h(q) = max(V[m-1](q), cut(q)): the first m - 1 workers ending at q, and the link after them
        prefix_bottleneck = np.where(np.isfinite(value), np.maximum(value, cuts), _INF)
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
