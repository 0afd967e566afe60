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

Workers of different speeds (beyond the paper: its workers are alike, and it leaves devices of
heterogeneous compute and bandwidth to future work, §6). Workers are ordered, worker k on device k,
so eq. (2)'s sub-problems keep their workers: worker k's T(U) is F and B summed with worker k's own
per-layer times, and eq. (3)'s (a_s1 + a_s2) / B is charged with the bandwidth of the boundary
after worker k, cut_s[k](s1, s2). Times given per layer (one row) and one cut_s are the paper's
case, searched exactly as before; times given per worker (a (workers, layers) array) or cuts per
boundary (planners/bipartition/worker_rows.py) enter the same recurrence, each worker count's last
worker at its own speed (prefix_dp.py). Algorithm 2 stays the paper's, workers alike.

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

The algorithm: the exact prefix dynamic program of planners/bipartition/prefix_dp.py (its module
docstring has how it runs in O(L^3 log L) per worker count, and how memory prunes it).

Algorithm 2 of the paper (binary_search=True) binary-searches s2 for the crossing of the prefix's
time (assumed non-decreasing in s2) and the last worker's (non-increasing). The first is not
monotone, links free or not: F = [4, 4, 8, 9, 7], B = [6, 10, 14, 2, 7], 4 workers, free links,
non-empty ranges: the search returns 23, the optimum is 20. It is kept as the paper's heuristic
(a slow, plain-Python transcription), never the default.
"""


from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paraplan.planners.bipartition.algorithm2 import algorithm2
from paraplan.planners.bipartition.division import (
    BiPartition,
    CutFn,
    DoesNotFit,
    FitsFn,
    Worker,
    bottleneck,
    max_workers,
    read_division,
)
from paraplan.planners.bipartition.prefix_dp import prefix_dp
from paraplan.planners.bipartition.worker_rows import WorkerRows, check_rows, check_times, cut_matrices


def bipartition(forward_s, backward_s, cut_s: CutFn | Sequence[CutFn], n_workers: int, fits: FitsFn | None = None,
                layerwise: bool = False, binary_search: bool = False, allow_empty: bool = True) -> BiPartition:
    """The optimal forward/backward ranges for exactly n_workers (Bi-Partition eqs. (2)-(3)).

    forward_s, backward_s: per layer (every worker alike), or (workers, layers) with row w worker
    w's times ("Workers of different speeds" in the module docstring). cut_s(s1, s2): time to send
    the activation after forward layer s1 and the gradient at the backward cut after layer s2
    (0-based, the last layers of the earlier workers; None when nothing crosses in that direction,
    see the module docstring), or a sequence of them, entry b the boundary after worker b.
    fits(worker_index, forward_range, backward_range): the memory check, with the properties (a)-(c)
    of the module docstring (None: no limit). binary_search=True runs the paper's Algorithm 2, a
    heuristic that can miss the optimum (layerwise=True has no s2 to search and stays exact), for
    workers alike only. Raises ValueError when no division into n_workers exists (more workers than
    parts of layers) and DoesNotFit when none fits memory.
    """
    forward, backward, per_worker = check_times(forward_s, backward_s)
    n_layers = forward.shape[1]
    _check_count(n_workers, n_layers, layerwise, allow_empty)
    if binary_search and not layerwise and (per_worker or not callable(cut_s)):
        raise ValueError("binary_search=True (the paper's Algorithm 2) searches workers alike: give one time per "
                         "layer each way and one cut_s, not per-worker times or per-boundary cuts")
    rows = _rows(forward, backward, cut_s, n_workers, layerwise, allow_empty)
    if binary_search and not layerwise:
        return algorithm2(rows, n_workers, fits, allow_empty)
    values, predecessors = prefix_dp(rows, n_workers, fits, layerwise, allow_empty, every_count=False)
    if not np.isfinite(values[n_workers - 1]):
        if fits is None:
            raise RuntimeError("bipartition: no division found without a memory limit (a bug)")
        raise DoesNotFit(f"no division of {n_layers} layers over {n_workers} workers fits their memory")
    division = read_division(predecessors, n_workers, rows)
    _check_fits(division, fits, from_end=False)
    return division


def bipartition_all(forward_s, backward_s, cut_s: CutFn | Sequence[CutFn], n_workers: int,
                    fits: FitsFn | None = None, layerwise: bool = False, allow_empty: bool = True, *,
                    fits_index_from_end: bool = False) -> dict[int, BiPartition]:
    """The optimal division for every worker count m = 1..n_workers that has one, from one pass.

    Times and cuts as `bipartition`'s: per layer or per worker (rows for at least the counted
    workers), one cut_s or one per boundary; worker w of every count is the same worker (device w),
    so a count of m uses rows 0..m-1 and boundaries 0..m-2.
    Counts above max_workers(L) have no division and are left out, so are counts where nothing fits.
    The same fits serves every count, so it must not depend on the count through worker_index:
    by default worker_index counts from the first worker (a device's own memory); with
    fits_index_from_end=True it is the number of workers after this one (1F1B keeps
    min(that + 1, n_micro) micro-batches in flight on a worker, whatever the count).
    Raises DoesNotFit when no count fits.
    """
    forward, backward, _ = check_times(forward_s, backward_s)
    n_layers = forward.shape[1]
    _check_positive(n_workers)
    top = min(int(n_workers), max_workers(n_layers, layerwise, allow_empty))
    rows = _rows(forward, backward, cut_s, top, layerwise, allow_empty)
    if fits_index_from_end and rows.alike:
        # the mirror image (layers and workers reversed) is the same problem, and its worker index
        # is this one's distance from the end; solve that and turn the answers back round
        mirror = rows.mirrored()
        values, predecessors = prefix_dp(mirror, top, None if fits is None else _mirror_fits(fits, n_layers),
                                         layerwise, allow_empty, every_count=True, mirrored=True)
        divisions = {m: _unmirror(read_division(predecessors, m, mirror), n_layers, rows)
                     for m in range(1, top + 1) if np.isfinite(values[m - 1])}
    elif fits_index_from_end and fits is not None:
        divisions = _counted_from_end(rows, top, fits, layerwise, allow_empty)
    else:
        values, predecessors = prefix_dp(rows, top, fits, layerwise, allow_empty, every_count=True)
        divisions = {m: read_division(predecessors, m, rows) for m in range(1, top + 1) if np.isfinite(values[m - 1])}
    for division in divisions.values():
        _check_fits(division, fits, from_end=fits_index_from_end)
    if not divisions:
        if fits is None:
            raise RuntimeError("bipartition_all: no division found without a memory limit (a bug)")
        raise DoesNotFit(f"no division of {n_layers} layers over 1..{top} workers fits their memory")
    return divisions


def _counted_from_end(rows: WorkerRows, top: int, fits: FitsFn, layerwise: bool,
                      allow_empty: bool) -> dict[int, BiPartition]:
    """fits_index_from_end with workers of different speeds: the mirror image's first worker is the
    real last one, whose times change with the count, so one mirrored pass cannot serve every count
    (it relies on workers alike). Each count is solved forwards on its own, its index turned round:
    exact under (a)-(c) as the default search is, at the price of one pass per count."""
    divisions = {}
    for m in range(1, top + 1):
        def from_end(index: int, forward: tuple[int, int], backward: tuple[int, int], m: int = m) -> bool:
            return fits(m - 1 - index, forward, backward)

        values, predecessors = prefix_dp(rows, m, from_end, layerwise, allow_empty, every_count=False)
        if np.isfinite(values[m - 1]):
            divisions[m] = read_division(predecessors, m, rows)
    return divisions


# ---------------------------------------------------------------------------------------------
# inputs


def _rows(forward: np.ndarray, backward: np.ndarray, cut_s, n_workers: int, layerwise: bool,
          allow_empty: bool) -> WorkerRows:
    check_rows(forward, n_workers)
    n_layers = forward.shape[1]
    cuts = cut_matrices(cut_s, lambda cut: _cut_matrix(cut, n_layers, layerwise, allow_empty), n_workers - 1)
    return WorkerRows(forward, backward, cuts)


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


def _unmirror(division: BiPartition, n_layers: int, rows: WorkerRows) -> BiPartition:
    workers = tuple(Worker(forward=(n_layers - w.forward[1], n_layers - w.forward[0]),
                           backward=(n_layers - w.backward[1], n_layers - w.backward[0]))
                    for w in reversed(division.workers))
    return BiPartition(workers=workers, bottleneck_s=bottleneck(workers, rows))
