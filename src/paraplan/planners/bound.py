"""A lower bound on any plan's iteration time, to say how far the best plan found is from the best
possible (`paraplan plan --planner auto`).

Work bound: every layer must process the whole global batch B, forward and backward, once. A plan
splits it into equal pieces (micro-batches, data-parallel slices) of some size b dividing B, so
layer i costs at least min over b | B of t_i(b) * B / b device-seconds on the fastest device, t_i the
cost model's forward + backward time. Tensor parallelism divides a piece's work among devices but
never below that total (ideal scaling, communication free). Spread perfectly over the n devices:

    T >= sum_i min_b t_i(b) B / b  /  n

Transfers, bubbles, synchronisation and optimizer steps only add to it, and recomputation
(checkpointing, Bi-Partition's runtime mode) adds work; so no plan on this cost model beats it.
It is a bound on the *cost model*: a plan judged by the simulator with the same costs is never
faster. (Operator placements are costed per operator, whose sum can differ from the layers'.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.costs.model import CostModel
from paraplan.planners.divisors import divisors


@dataclass(frozen=True)
class LowerBound:
    iteration_s: float  # no plan is faster than this
    work_s: float  # the least device-seconds of forward + backward for one iteration
    one_device_s: float  # the whole batch's forward + backward on the fastest device, in one piece
    n_devices: int


def lower_bound(cm: CostModel, batch: int) -> LowerBound:
    n = cm.cluster.n_devices
    kinds = list({id(c): c for c in (cm.compute(d) for d in range(n))}.values())  # one per device kind

    def t(costs, i: int, b: int) -> float:
        return float(costs.forward[i](b)) + float(costs.backward[i](b))

    one_device = min(sum(t(c, i, batch) for i in range(cm.model.n_layers)) for c in kinds)
    # per layer, the cheapest device kind and piece size (a heterogeneous cluster may favour
    # different kinds for different layers)
    # every piece size at once (time functions take arrays): a batch can have 10**5 divisors
    sizes = np.array(divisors(batch), dtype=float)
    work = sum(min(float(np.min((np.asarray(c.forward[i](sizes)) + np.asarray(c.backward[i](sizes))) * batch / sizes))
                   for c in kinds) for i in range(cm.model.n_layers))
    return LowerBound(iteration_s=work / n, work_s=work, one_device_s=one_device, n_devices=n)
