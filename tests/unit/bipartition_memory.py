"""What the Bi-Partition tests' brute force shares (test_bipartition_dp.py, test_bipartition_mixed.py):
every division of a space, and memory models, fits(worker index, forward range, backward range), for
the dynamic programs' memory checks."""

import itertools
import math


def memory_model(weights, saved, capacity, stash_by_index):
    """Monotone in the layers a worker runs: the weights of every layer it touches (the union of its
    two ranges) plus the saved activations of its forward range times a per-worker stash count."""
    def fits(index, forward, backward):
        touched = set(range(*forward)) | set(range(*backward))
        used = sum(weights[i] for i in touched) + stash_by_index(index) * sum(saved[i] for i in range(*forward))
        return used <= capacity[min(index, len(capacity) - 1)]
    return fits


def owner_memory(weights, states, saved, capacity, n_workers, n_micro=4):
    """The paper's (and planners/bipartition/planner.py's) memory: a layer's activations live at its
    backward owner, for more micro-batches when its forward ran on an earlier worker; a layer whose
    forward only runs here costs a weight copy. Not monotone in the forward range: a worker that
    stops running the forward of a layer it runs the backward of needs more."""
    def in_flight(forward_owner, worker):
        return max(1, min(n_micro, math.ceil(n_workers - (forward_owner + worker) / 2)))

    def fits(index, forward, backward):
        used = 0.0
        for i in set(range(*forward)) | set(range(*backward)):
            if backward[0] <= i < backward[1]:
                owner = index if forward[0] <= i < forward[1] else (0 if i < forward[0] else index + 1)
                used += states[i] + in_flight(owner, index) * saved[i]
            else:
                used += weights[i]
        return used <= capacity
    return fits


def divisions(n_layers: int, n_workers: int, allow_empty: bool, layerwise: bool):
    """Every ordered division, as ((forward_start, forward_stop), (backward_start, backward_stop))
    per worker."""
    if allow_empty and not layerwise:
        cuts = list(itertools.combinations_with_replacement(range(n_layers + 1), n_workers - 1))
    else:
        cuts = list(itertools.combinations(range(1, n_layers), n_workers - 1))
    bounds = [(0, *c, n_layers) for c in cuts]
    for forward in bounds:
        for backward in ([forward] if layerwise else bounds):
            workers = [((forward[k], forward[k + 1]), (backward[k], backward[k + 1])) for k in range(n_workers)]
            if all(fr[0] < fr[1] or br[0] < br[1] for fr, br in workers):
                yield workers
