"""Why a planner does not take part in `paraplan plan --planner auto`: before the comparison starts
(`skip_reason`: left out of comparisons, missing what it needs, or out of its method's reach), and
as it is about to start one (`cannot_beat`, issue 51 item 2, "prune by memory and compute bounds"): a
method whose plans use at most n of the cluster's N devices (planners/table.py
PlannerSpec.most_devices) against the best plan the comparison has found so far.

Any plan on n devices does the layers' least forward + backward work W (planners/bound.py: every
layer over the whole batch at its cheapest piece size, on the fastest device kind) on those n
devices, so it takes at least W / n; where that is longer than a plan already judged by the same
simulator, the method cannot win and is not run. Exact for the choice: the skipped planner's best
plan would lose to the one found. Bi-Partition and PipeDream's layer-wise partition run one worker
a device with no data parallelism, at most 2L and L workers: at 1,024 H100s and Llama 3 70B, 164
of them, whose least work alone is 6x the cluster's; their search there took 23 s to find nothing
that fits (the DP over every micro-batch count).
"""

from __future__ import annotations

from collections.abc import Iterable

from paraplan.planners.bound import LowerBound
from paraplan.planners.registry import planner
from paraplan.planners.request import PlanRequest


def skip_reason(name: str, request: PlanRequest, time_limit_s: float = 60.0) -> str | None:
    """Why a planner does not take part (None: it does): left out of comparisons, missing what it
    needs, or out of its method's reach (PlannerSpec.reach) within the comparison's time limit."""
    spec = planner(name)
    if spec.not_compared:
        return spec.not_compared
    if spec.needs_operators and request.costs.operators is None:
        return "needs the model's operator graph, which could not be traced"
    if request.schedule not in (None, "best") and request.schedule not in spec.schedules:
        return f"does not plan {request.schedule}"
    return spec.reach(request, time_limit_s) if spec.reach is not None else None


def cannot_beat(name: str, request: PlanRequest, bound: LowerBound, rows: Iterable) -> str | None:
    """Why planner `name` cannot beat the fastest feasible row of `rows` (the comparison's rows so
    far), one line; None where it might (or nothing feasible is known yet, or it may use every device)."""
    most = planner(name).most_devices
    if most is None:
        return None
    n = most(request)
    if n >= request.n_devices or n <= 0:
        return None
    feasible = [r for r in rows if r.status == "ok" and r.iteration_s is not None]
    if not feasible:
        return None
    best = min(feasible, key=lambda r: (r.iteration_s, r.planner))
    least_s = bound.work_s / n
    if least_s <= best.iteration_s:
        return None
    return (f"cannot beat {best.planner}'s plan ({best.iteration_s:.4g} s): its plans use at most {n:,} of the "
            f"{request.n_devices:,} devices, whose least forward + backward work alone takes {least_s:.4g} s")
