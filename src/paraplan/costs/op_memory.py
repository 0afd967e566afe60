"""Per-device memory of an operator placement (FD-DPS Definitions 5 and 6), from a timed schedule.

Definition 5 counts the parameter tensors on a device against its capacity; a real iteration also
holds activations. We count, per device:
  resident: the model states of the parameters its operators use — a forward operator that reads
            parameters holds them and the optimizer's two Adam moments (3 x param bytes), a
            backward operator that writes their gradients holds the gradients (1 x) — the
            16 bytes per fp32 parameter of costs/memory.py, split between the two;
  alive:    each operator's output from its finish until the last of its consumers starts (a
            consumer on another device receives it by a transfer that has ended by then; the
            consumer's own output is counted from its finish, so an operator's input and output
            are never both counted at one instant: the count is a lower bound by one operator's
            working set, which the reserve covers); an output nobody reads (the loss, a weight
            gradient, counted as resident) ends where it is made;
plus the MemoryConfig's fixed reserve. The peak is the largest sum over time.
"""

from __future__ import annotations

import numpy as np

RESIDENT_FORWARD = 3  # weights + Adam's two moments, per parameter byte
RESIDENT_BACKWARD = 1  # the gradient


def resident_bytes(param_bytes: np.ndarray, is_backward: np.ndarray) -> np.ndarray:
    return param_bytes * np.where(is_backward, RESIDENT_BACKWARD, RESIDENT_FORWARD)


def peak_per_device(device: np.ndarray, start: np.ndarray, finish: np.ndarray, resident: np.ndarray,
                    output: np.ndarray, edge_src: np.ndarray, edge_dst: np.ndarray, n_devices: int,
                    reserve_bytes: float = 0.0) -> np.ndarray:
    """Peak bytes per device of a timed placement (all arrays per node, edges as index arrays).
    The one rule: planners/fddps/problem.py checks schedules with it and the simulator reports it."""
    device = np.asarray(device, dtype=np.int64)
    release = np.asarray(finish, dtype=np.float64).copy()
    if len(edge_src):
        np.maximum.at(release, edge_src, np.asarray(start, dtype=np.float64)[edge_dst])  # last consumer's start
    peaks = np.bincount(device, weights=resident, minlength=n_devices).astype(np.float64) + reserve_bytes
    for d in range(n_devices):
        mine = np.flatnonzero((device == d) & (output > 0))
        if mine.size == 0:
            continue
        times = np.concatenate([finish[mine], release[mine]])
        births_first = np.concatenate([np.zeros(mine.size), np.ones(mine.size)])  # at one instant: made, then freed
        deltas = np.concatenate([output[mine], -output[mine]])
        order = np.lexsort((births_first, times))
        peaks[d] += max(0.0, float(np.cumsum(deltas[order]).max()))
    return peaks


def least_held_bytes(graph, batch: float) -> float:
    """A lower bound on the sum over devices of any placement's peak bytes (reserve aside) for the
    graph at `batch`: every operator's resident states (held somewhere all iteration, wherever it
    is placed) plus the outputs of the forward operators that precede every backward one and feed a
    backward one. When the first backward operator starts, those have all finished and none of their
    backward readers has started, so they are all alive at that instant, each on some device (the
    peak of a device is at least what it holds then). No micro-batches: an operator placement runs
    the whole batch through the forward before the backward (FD-DPS Definition 7)."""
    n = graph.n_nodes
    is_backward = np.array([node.phase == "backward" for node in graph.nodes])
    params = np.array([node.param_bytes for node in graph.nodes], dtype=float)
    resident = float(resident_bytes(params, is_backward).sum())
    preds: list[list[int]] = [[] for _ in range(n)]
    feeds_backward = np.zeros(n, dtype=bool)
    for e in graph.edges:
        preds[e.dst].append(e.src)
        if is_backward[e.dst]:
            feeds_backward[e.src] = True
    roots = [i for i in range(n) if is_backward[i] and not any(is_backward[p] for p in preds[i])]
    before_all = np.zeros(n, dtype=np.int64)  # per node: how many backward roots it precedes
    for root in roots:
        seen = np.zeros(n, dtype=bool)
        stack = [root]
        while stack:
            for p in preds[stack.pop()]:
                if not seen[p]:
                    seen[p] = True
                    stack.append(p)
        before_all += seen
    held = (~is_backward) & feeds_backward & (before_all == len(roots)) if roots else np.zeros(n, dtype=bool)
    outputs = np.array([node.output_bytes.at(batch) for node in graph.nodes], dtype=float)
    return resident + float(outputs[held].sum())
