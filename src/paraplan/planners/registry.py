"""The planner table: every planner by name, behind one call (`make_plan`).

A planner module registers each of its planners with `@register(...)` (planners/table.py); this
module imports the planner modules listed in `PLANNER_MODULES` so that they do. Adding a planner is
one module, one line in `PLANNER_MODULES` and its tests (docs/architecture.md, "Adding a planner").

The registry is the one place in `planners/` that imports the simulator: it hands each planner
the judge (Plan -> Prediction) it compares candidates with, so the planner modules themselves
depend only on costs, hardware and the Plan.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

from paraplan.errors import UnknownNameError
from paraplan.planners import table
from paraplan.planners.request import (
    BEST_SCHEDULE,
    FieldError,
    Judge,
    PlanRequest,
    cost_model_cache,
    validated_options,
)
from paraplan.planners.table import PlannerSpec
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import Plan, Prediction

PLANNERS = table.PLANNERS
PLANNER_MODULES = (
    "paraplan.planners.csimd.planner",  # csimd, csimd-paper
    "paraplan.planners.baselines.split",  # even, random, params, time-1d, pipedream-dp, brute-force
    "paraplan.planners.baselines.replicated",  # pipedream-replicated
    "paraplan.planners.gropipe.planner",
    "paraplan.planners.bipartition.planner",  # bipartition, pipedream-layerwise
    "paraplan.planners.fddps.planner",  # fddps, fddps-nosplit, fddps-ports, fastt, heft, mpdps
    "paraplan.planners.galvatron.planner",  # dp, sdp, tp, pp, dp+tp, dp+pp, deepspeed-3d, galvatron, -base, -1f1b-biobj, -bmw
)


def _load() -> None:
    for module in PLANNER_MODULES:
        importlib.import_module(module)


def planner_names() -> tuple[str, ...]:
    _load()
    return tuple(PLANNERS)


def planner(name: str) -> PlannerSpec:
    """The registered planner, or one line naming the known ones."""
    _load()
    if name not in PLANNERS:
        raise UnknownNameError("planner", name, list(PLANNERS))
    return PLANNERS[name]


class SimulatorJudge:
    """The simulator as a judge of candidate plans under the request's cost model; `memory(plan)`:
    the memory's verdict alone, before any timeline (None when the plan fits), for a search that
    ranks plans that do not fit by memory (the Megatron grid: grid.py memory_first)."""

    def __init__(self, request: PlanRequest):
        # a planner's candidates are in the request's precision (make_plan stamps the result)
        self.costs, self.precision = request.costs, request.costs.plan_precision

    def __call__(self, plan: Plan):
        from paraplan.simulator.predict import simulate_plan

        plan = replace(plan, **self.precision)
        judged = cost_model_cache(_JUDGED, self.costs)
        if plan not in judged:
            # (without the split of where the time goes: the judge reads the prediction alone)
            judged[plan] = simulate_plan(plan, self.costs, split=False, one_replica=True).prediction
        return judged[plan]

    def memory(self, plan: Plan):
        from paraplan.simulator.predict import memory_verdict

        plan = replace(plan, **self.precision)
        judged = cost_model_cache(_JUDGED, self.costs)
        if (plan, "memory") not in judged:  # BMW asks again of the rewrites Base asked of
            judged[plan, "memory"] = memory_verdict(plan, self.costs)
        return judged[plan, "memory"]


# The predictions of the last cost model judged, per plan: planners in one process (Galvatron-Base
# riding with BMW in a comparison, planners/auto.py) judge many of the same plans
_JUDGED: dict = {}


def simulator_judge(request: PlanRequest) -> Judge:
    """The simulator as a judge of candidate plans under the request's cost model."""
    return SimulatorJudge(request)


def make_plan(request: PlanRequest, name: str, judge: Judge | None = None, *, predict: bool = True) -> Plan:
    """The named planner's Plan for the request, with the judge's prediction filled in (predict=False:
    only where the planner judged it itself; a caller that simulates the plan anyway saves a run)."""
    spec = planner(name)
    if request.schedule == BEST_SCHEDULE and BEST_SCHEDULE not in spec.schedules:
        request = replace(request, schedule=None)  # "best" where the planner can search it; its own elsewhere
    if request.schedule is not None and request.schedule not in spec.schedules:
        raise FieldError("schedule", f"planner {name!r} plans {', '.join(spec.schedules)}, not {request.schedule}")
    options = validated_options(name, request.options, spec.options)
    judge = judge or simulator_judge(request)
    plan = replace(spec.fn(request, options, judge), **request.costs.plan_precision)
    notes = [f"{name}: {x}" for x in (alike_note(spec, request.costs.cluster), idle_kinds(plan, request.costs.cluster))
             if x]
    if notes and plan.search is not None:  # said, not silent (issue 52: a method that left the V100s out)
        plan = replace(plan, search=replace(plan.search, note="; ".join(x for x in (plan.search.note, *notes) if x)))
    if plan.prediction is None and predict:
        plan = replace(plan, prediction=judge(plan))
    return plan


def alike_note(spec: PlannerSpec, cluster) -> str:
    """On a cluster of several device kinds, "" or one line for a method whose search prices every
    device as the first one's kind (PlannerSpec.alike_devices; the simulator prices its plan on each
    device's own)."""
    if not spec.alike_devices or len(cluster.device_types()) < 2:
        return ""
    return f"searched with every device priced as {cluster.devices[0].spec.name} (its method assumes devices alike)"


def idle_kinds(plan: Plan, cluster) -> str:
    """On a cluster of several device kinds, what a plan leaves idle, in a few words ("" when it
    uses every device, or the cluster is of one kind): "on 8 of 16 devices, the 8 a100-40gb; the 8
    v100-32gb idle"."""
    kinds = cluster.device_types()
    if len(kinds) < 2:
        return ""
    used = set(plan.devices) if plan.kind is not PlanKind.OPERATORS else {p.device for p in plan.operators if p.ops}
    if len(used) >= cluster.n_devices:
        return ""
    count = {}
    for d in used:
        name = cluster.device(d).name
        count[name] = count.get(name, 0) + 1
    idle = {k: n - count.get(k, 0) for k, n in kinds.items() if n - count.get(k, 0) > 0}
    return (f"on {len(used)} of {cluster.n_devices} devices, " + ", ".join(f"{n} {k}" for k, n in count.items())
            + "; " + ", ".join(f"{n} {k}" for k, n in idle.items()) + " idle")


def predict(request: PlanRequest, plan: Plan) -> Prediction:
    return simulator_judge(request)(plan)
