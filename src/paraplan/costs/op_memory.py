"""Per-device memory of an operator placement (FD-DPS Definitions 5 and 6), from a timed schedule.

Definition 5 counts the parameter tensors on a device against its capacity; a real iteration also
holds activations. We count, per device:
  resident: the model states of the parameters its operators use — a forward operator that reads
            parameters holds them and the optimizer's two Adam moments (3 x param bytes), a
            backward operator that writes their gradients holds the gradients (1 x) — the
            16 bytes per fp32 parameter of costs/memory.py, split between the two;
  alive:    each operator's output from its start until the last of its consumers has finished
            (a consumer on another device reads it through a transfer that ends before that
            consumer starts, so this bounds the transfer too); outputs without consumers (the
            loss, weight gradients) until the end of the iteration;
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
    """Peak bytes per device of a timed placement (all arrays per node, edges as index arrays)."""
    n = len(device)
    makespan = float(finish.max()) if n else 0.0
    last_use = np.full(n, makespan)
    if len(edge_src):
        free_at = np.full(n, -np.inf)
        np.maximum.at(free_at, edge_src, finish[edge_dst])
        last_use = np.where(np.isfinite(free_at), free_at, makespan)
    peaks = np.zeros(n_devices)
    for d in range(n_devices):
        on = device == d
        if not on.any():
            continue
        times = np.concatenate([start[on], last_use[on]])
        # frees sort before allocations at the same instant
        deltas = np.concatenate([output[on], -output[on]])
        order = np.lexsort((deltas, times))
        alive = np.cumsum(deltas[order])
        peaks[d] = resident[on].sum() + max(0.0, float(alive.max())) + reserve_bytes
    return peaks
