"""Workers of different speeds for Bi-Partition's searches (issue 52 item 1; beyond the paper, whose
workers are alike and which names devices of heterogeneous compute and bandwidth as future work, §6).

Worker w runs on device w of a cluster numbered fastest node first (hardware/cluster.py
canonical_node_order), so the searches of planners/bipartition/dp.py and recompute.py can take
forward and backward times per worker and a link charge per boundary:

- times: one (L,) array each way, every worker alike (the paper's case), or a (W, L) array whose
  row w holds worker w's times (W at least the workers asked about; later rows are not read);
- cuts: one cut_s(s1, s2) for every boundary, or a sequence whose entry b is the boundary after
  worker b (between devices b and b + 1).

`WorkerRows` hands each worker its own prefix sums and each boundary its own cut matrix. With one
row and one cut function it holds exactly the arrays the searches used before per-worker times,
built once, so a cluster of one kind is searched as before (and as fast).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from paraplan.planners.bipartition.division import CutFn, prefix_sums


def check_times(forward_s, backward_s) -> tuple[np.ndarray, np.ndarray, bool]:
    """(forward, backward, per_worker): (R, L) arrays, R = 1 for times given per layer alone."""
    forward, backward = np.asarray(forward_s, dtype=float), np.asarray(backward_s, dtype=float)
    per_worker = forward.ndim == 2 or backward.ndim == 2
    if per_worker and (forward.ndim != 2 or backward.ndim != 2):
        raise ValueError(f"forward_s and backward_s: both (workers, layers) or both per layer, got shapes "
                         f"{forward.shape} and {backward.shape}")
    if forward.ndim > 2 or backward.ndim > 2:
        raise ValueError(f"forward_s and backward_s: per layer or (workers, layers), got shapes {forward.shape} "
                         f"and {backward.shape}")
    if not per_worker:
        forward, backward = forward.ravel()[None, :], backward.ravel()[None, :]
    if forward.shape[1] == 0 or forward.shape != backward.shape:
        raise ValueError(f"forward_s and backward_s need one time per layer (and per worker alike), got "
                         f"shapes {forward.shape} and {backward.shape}")
    for name, times in (("forward_s", forward), ("backward_s", backward)):
        if not np.all(np.isfinite(times)) or np.any(times < 0):
            raise ValueError(f"{name} must be finite and non-negative, got {times.tolist()}")
    return forward, backward, per_worker


def cut_matrices(cut_s: CutFn | Sequence[CutFn], build: Callable[[CutFn], np.ndarray],
                 n_boundaries: int) -> list[np.ndarray]:
    """One cut matrix for a single cut_s, else one per boundary (at least `n_boundaries` of them),
    each function's built once: boundaries over the same kind of link share theirs."""
    if callable(cut_s):
        return [build(cut_s)]
    cuts = list(cut_s)
    if len(cuts) < n_boundaries:
        raise ValueError(f"cut_s: one per boundary, {n_boundaries} for {n_boundaries + 1} workers, got {len(cuts)}")
    if not all(callable(c) for c in cuts):
        raise TypeError("cut_s: a function cut_s(s1, s2), or a sequence of them (one per boundary)")
    built: dict[int, np.ndarray] = {}
    for c in cuts:
        if id(c) not in built:
            built[id(c)] = build(c)
    return [built[id(c)] for c in cuts]


def check_rows(forward: np.ndarray, n_workers: int) -> None:
    if forward.shape[0] > 1 and forward.shape[0] < n_workers:
        raise ValueError(f"per-worker times: one row per worker, {n_workers} workers but {forward.shape[0]} rows")


class WorkerRows:
    """Worker w's times, prefix sums and G(p) = F(p1) + B(p2); the charge at the boundary after
    worker b. One row (or one cut matrix) serves every worker (every boundary)."""

    def __init__(self, forward: np.ndarray, backward: np.ndarray, cuts: list[np.ndarray]) -> None:
        # rows all equal (or cuts) are the paper's case: kept as one, so that they are searched by
        # exactly the same steps as one row given alone (the same answer, ties included)
        if forward.shape[0] > 1 and (forward == forward[0]).all() and (backward == backward[0]).all():
            forward, backward = forward[:1], backward[:1]
        if len(cuts) > 1 and all(c is cuts[0] or np.array_equal(c, cuts[0]) for c in cuts[1:]):
            cuts = cuts[:1]
        self.forward, self.backward, self.cuts = forward, backward, cuts
        self.n_layers = forward.shape[1]
        self._prefix: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def alike(self) -> bool:
        """Every worker the same times and every boundary the same charge."""
        return self.forward.shape[0] == 1 and len(self.cuts) <= 1

    def row(self, worker: int) -> int:
        return min(worker, self.forward.shape[0] - 1)

    def times(self, worker: int) -> tuple[np.ndarray, np.ndarray]:
        r = self.row(worker)
        return self.forward[r], self.backward[r]

    def prefix(self, worker: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(F, B, G): the prefix sums of worker's forward and backward times, and G[p1, p2] =
        F[p1] + B[p2], the time of the layers a prefix has run at this worker's speed."""
        r = self.row(worker)
        if r not in self._prefix:
            prefix_f, prefix_b = prefix_sums(self.forward[r]), prefix_sums(self.backward[r])
            self._prefix[r] = (prefix_f, prefix_b, prefix_f[:, None] + prefix_b[None, :])
        return self._prefix[r]

    def done(self, worker: int) -> np.ndarray:
        return self.prefix(worker)[2]

    def cut(self, boundary: int) -> np.ndarray:
        """The charge at the boundary after worker `boundary` (between it and the next one)."""
        return self.cuts[min(boundary, len(self.cuts) - 1)]

    def mirrored(self) -> WorkerRows:
        """The mirror image, layers reversed: only for workers alike (whose order then does not matter)."""
        if not self.alike:
            raise ValueError("the mirror image of per-worker rows depends on the worker count (a bug to ask)")
        return WorkerRows(self.forward[:, ::-1].copy(), self.backward[:, ::-1].copy(),
                          [c[::-1, ::-1].copy() for c in self.cuts])
