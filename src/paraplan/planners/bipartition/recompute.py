"""Bi-Partition's dynamic program with the cost of what the runtime really does (`mode=runtime`).

The paper's worker time is T(U) = F(forward range) + B(backward range) (eqs. (2)-(3)); its forward
owner sends a split layer's saved activations to the backward owner. PyTorch cannot move an
autograd graph between processes, so paraplan's runtime has the backward owner recompute the
forward of every layer in its backward range whose forward ran elsewhere (plans/worker_roles.py):

    T(U) = F[f0, f1) + B[b0, b1) + F([b0, b1) \\ [f0, f1))

The extra term depends on how the two ranges overlap, so T is no longer a sum of a forward and a
backward prefix difference, and the vectorised search of planners/bipartition/dp.py (which relies
on that) does not apply. This module solves the same recurrence,

    V[1](p) = T(0, p),   V[m](p) = min over q < p of max(V[m-1](q), cut(q), T(q, p)),

the m-th worker's T at its own speed and cut the link before it where times are given per worker
and cuts per boundary (planners/bipartition/worker_rows.py; beyond the paper, as in dp.py), by
brute force over every predecessor, vectorised over (p2, q1, q2) for each p1: O(L^4) numpy work
per worker count (L = 16 layers: milliseconds; L = 60: ~1 s per count). It is exact for its cost
model. The planner spends at most `EXACT_BUDGET` element-operations on it over all its micro-batch
counts (the smallest counts first: their worker limit is the least); for a count past the budget
it uses the paper-cost division instead and lets the judge (the simulator, which charges the
recomputation) price it — said in the plan.

Memory (`worker_memory_recompute`): the count of costs/memory.py for plans with
split_layers="recompute", vectorised: states of the backward range, a weight copy of forward-only
layers, the saved activations of the layers run with a graph (F ∩ B) for the micro-batches in
flight, one micro-batch of a recomputed segment's activations while its backward runs, and the
worker's own forward output when its recomputation starts from it. The in-flight count is the
largest a worker at that position can have among `max_workers` (never below the simulator's).
Tied weights' extra copies are not counted here; the judge's simulator count decides feasibility.
"""

from __future__ import annotations

import numpy as np

from paraplan.costs.memory import loss_gradient_bytes
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.strategy import layer_memory
from paraplan.planners.bipartition.division import BiPartition, Worker
from paraplan.planners.bipartition.worker_rows import WorkerRows, check_rows, check_times, cut_matrices
from paraplan.plans.plan import LayerStrategy

# (L+1)^4 x workers element-operations, over all micro-batch counts of one search: about 5 s on this
# machine (2 cores, 2026-11-29: 82 layers x 64 workers, 3.4e9 a count, took 15 s each). It was 4e9 a
# count, so that Llama 3 70B on 64 GPUs spent minutes here, past the comparison's time limit (issue 51)
EXACT_BUDGET = 5e8


def exact_cost(n_layers: int, n_workers: int) -> float:
    return float(n_layers + 1) ** 4 * n_workers


def worker_time(forward, backward, fr: tuple[int, int], br: tuple[int, int]) -> float:
    """T(U) of one worker, written out (the tests' independent check of the vectorised form)."""
    f = set(range(*fr))
    return (sum(forward[i] for i in f) + sum(backward[i] for i in range(*br))
            + sum(forward[i] for i in range(*br) if i not in f))


def worker_memory_recompute(cm, micro: float, n_micro: int, max_workers: int, config: MemoryConfig):
    """count(w, f0, f1, b0, b1) -> bytes, numpy-broadcast over the range bounds (see the docstring)."""
    model = cm.model
    per_layer = [layer_memory(model, i, LayerStrategy(), micro, config) for i in range(model.n_layers)]

    def prefix(values):
        return np.concatenate(([0.0], np.cumsum(values)))

    states = prefix([m.states_bytes for m in per_layer])
    saved = prefix([m.saved_bytes for m in per_layer])
    weights = prefix([m.weights_bytes for m in per_layer])
    out = np.array([0.0] + [layer.output_bytes.at(micro) * config.activation_scale for layer in model.layers])
    loss_gradients = loss_gradient_bytes(model, LayerStrategy(), micro)

    def span(prefix_sums, a, b):
        return np.where(b > a, prefix_sums[np.maximum(b, a)] - prefix_sums[a], 0.0)

    def count(w, f0, f1, b0, b1):
        in_flight = max(1, min(n_micro, max_workers - w))  # forward and backward both on w (1F1B)
        c0, c1 = np.maximum(f0, b0), np.minimum(f1, b1)
        graph = c1 > c0
        total = config.reserve_bytes + span(states, b0, b1) + span(weights, f0, f1) - span(weights, c0, c1)
        total = total + np.where(np.asarray(b1) == model.n_layers, loss_gradients, 0.0)  # the loss's backward
        total = total + in_flight * span(saved, c0, c1)
        before = np.where(graph, span(saved, b0, c0), span(saved, b0, b1))
        after = np.where(graph, span(saved, c1, b1), 0.0)
        total = total + np.maximum(before, after)
        own = (~graph) & (b1 > b0) & (b0 == f1) & (b0 > 0)
        return total + np.where(own, in_flight * out[np.where(own, b0, 0)], 0.0)

    return count


def recompute_all(forward_s, backward_s, cut_s, n_workers: int, fits=None) -> dict[int, BiPartition]:
    """The optimal division under T(U) above for every worker count 1..n_workers that has one.
    forward_s, backward_s: per layer, or (workers, layers), row w worker w's (worker_rows.py);
    cut_s(s1, s2) as in bipartition/dp.py (None: nothing crossed in that direction yet), or one per
    boundary (entry b: the boundary after worker b); fits(w, f0, f1, b0, b1) -> bool array
    (broadcast), or None for no memory limit."""
    forward, backward, _ = check_times(forward_s, backward_s)
    check_rows(forward, n_workers)
    n = forward.shape[1]
    idx = np.arange(n + 1)
    rows = WorkerRows(forward, backward, cut_matrices(
        cut_s, lambda cut: np.array([[cut(a - 1 if a else None, c - 1 if c else None) if (a or c) else 0.0
                                      for c in idx] for a in idx]), n_workers - 1))
    # arrays over (p2, q1, q2) for one p1
    p2 = idx[:, None, None]
    q1 = idx[None, :, None]
    q2 = idx[None, None, :]

    def time(worker, p1, q1, q2, p2):  # T(U) at worker's own speed
        pf, pb, _ = rows.prefix(worker)
        overlap = pf[np.minimum(p1, p2)] - pf[np.maximum(q1, q2)]
        return (pf[p1] - pf[q1]) + (pb[p2] - pb[q2]) + (pf[p2] - pf[q2]) - np.where(
            np.minimum(p1, p2) > np.maximum(q1, q2), overlap, 0.0)

    # one worker: q = (0, 0)
    p1s, p2s = np.meshgrid(idx, idx, indexing="ij")
    value = time(0, p1s, 0, 0, p2s)
    ok = (p1s + p2s) > 0
    if fits is not None:
        ok &= np.asarray(fits(0, 0, p1s, 0, p2s), dtype=bool)
    value = np.where(ok, value, np.inf)
    back: list[np.ndarray] = []  # per worker count >= 2: the best predecessor of every state
    found: dict[int, BiPartition] = {}
    if np.isfinite(value[n, n]):
        found[1] = BiPartition((Worker((0, n), (0, n)),), float(value[n, n]))
    for m in range(2, n_workers + 1):
        # the m-th worker (m - 1) at its own speed, after the link between it and worker m - 2
        before = np.maximum(value, rows.cut(m - 2))  # max(V[m-1](q), cut(q))
        new = np.full_like(value, np.inf)
        arg = np.zeros(value.shape + (2,), dtype=np.int64)
        for a in range(n + 1):
            valid = (q1 <= a) & (q2 <= p2) & ~((q1 == a) & (q2 == p2))
            cand = np.maximum(before[None, :, :], time(m - 1, a, q1, q2, p2))
            if fits is not None:
                valid = valid & np.asarray(fits(m - 1, q1, a, q2, p2), dtype=bool)
            cand = np.where(valid, cand, np.inf).reshape(n + 1, -1)
            best = cand.argmin(axis=1)
            new[a] = cand[np.arange(n + 1), best]
            arg[a, :, 0], arg[a, :, 1] = np.divmod(best, n + 1)
        back.append(arg)
        value = new
        if np.isfinite(value[n, n]):
            found[m] = BiPartition(_read_back(back, m, n), float(value[n, n]))
    return found


def _read_back(back: list[np.ndarray], m: int, n: int) -> tuple[Worker, ...]:
    workers = []
    p = (n, n)
    for k in range(m, 1, -1):
        q = tuple(int(v) for v in back[k - 2][p])
        workers.append(Worker((q[0], p[0]), (q[1], p[1])))
        p = q
    workers.append(Worker((0, p[0]), (0, p[1])))
    return tuple(reversed(workers))
