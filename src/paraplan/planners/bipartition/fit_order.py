"""When a micro-batch count's failure to fit settles a smaller count's (Bi-Partition's search over
micro-batch counts, planners/bipartition/planner.py).

The dynamic programs' memory counts of a worker (planner.py `worker_memory`, recompute.py
`worker_memory_recompute`) are sums of terms of three kinds: what does not depend on the micro-batch
(model states, weight copies, the reserve); a layer's saved activations or output at the micro-batch
size, once; and the same times an in-flight count max(1, min(p, c)), c a whole number from 1 to the
worker limit; plus the loss's gradients at the micro-batch size. With p micro-batches of B / p
samples, a smaller p has larger micro-batches but fewer of them in flight, so neither count
dominates the other in general. `dominated` checks, term by term and layer by layer, that every
term at the smaller count is at least its value at the larger one. Where it holds, every worker of
every division needs at least as much memory at the smaller count, and its worker limit is no
larger, so a search that found nothing that fits at the larger count would find nothing at the
smaller one: the search skips it, with the same answer.
"""

from __future__ import annotations

import numpy as np

from paraplan.costs.memory import loss_gradient_bytes
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.strategy import layer_memory
from paraplan.planners import progress
from paraplan.plans.plan import LayerStrategy


def _per_layer(model, micro: float, config: MemoryConfig) -> np.ndarray:
    """[saved bytes; output bytes] of every layer at `micro` samples, as the memory counts take them."""
    saved = [layer_memory(model, i, LayerStrategy(), micro, config).saved_bytes for i in range(model.n_layers)]
    out = [layer.output_bytes.at(micro) * config.activation_scale for layer in model.layers]
    return np.array([saved, out], dtype=float)


def dominated(model, batch: int, smaller: int, larger: int, max_workers: int, config: MemoryConfig) -> bool:
    """Whether every memory term at `smaller` micro-batches is at least its value at `larger` (module
    docstring), for every worker of up to `max_workers`."""
    if smaller >= larger:
        raise ValueError(f"expected a smaller count than {larger}, got {smaller}")
    micro_s, micro_l = batch / smaller, batch / larger
    if loss_gradient_bytes(model, LayerStrategy(), micro_s) < loss_gradient_bytes(model, LayerStrategy(), micro_l):
        return False
    at_s, at_l = _per_layer(model, micro_s, config), _per_layer(model, micro_l, config)
    c = np.arange(1, max_workers + 1, dtype=float)[:, None, None]  # every in-flight bound
    in_flight_s, in_flight_l = np.maximum(1.0, np.minimum(smaller, c)), np.maximum(1.0, np.minimum(larger, c))
    return bool(np.all(at_s >= at_l) and np.all(in_flight_s * at_s[None] >= in_flight_l * at_l[None]))


def largest_first(micro_counts, search_at, is_dominated) -> dict[int, list]:
    """search_at(p, skip, failed) at every count, the largest first: `failed` maps a search kind to the
    count at which it last found nothing that fits (search_at records it), and a kind is skipped at a
    count that `is_dominated(count, that one)` (module docstring)."""
    failed: dict[str, int] = {}
    found = {}
    for step, p in enumerate(sorted(micro_counts, reverse=True)):
        settled = {at: is_dominated(p, at) for at in set(failed.values())}  # the kinds often failed at one count
        skip = frozenset(kind for kind, at in failed.items() if settled[at])
        found[p] = search_at(p, skip, failed)
        progress.at(f"{step + 1} of {len(micro_counts)} micro-batch counts searched")
    return found
