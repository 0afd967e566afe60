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
