"""The planner table itself: `PLANNERS` and the `register` decorator each planner module uses.

Kept apart from planners/registry.py (which loads the planner modules and hands them the
simulator as their judge) so that a planner module imports only this: the arrows point one way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from paraplan.planners.request import Judge, OptionSpec, PlanRequest
from paraplan.plans.plan import Plan, Schedule

PlannerFn = Callable[[PlanRequest, Mapping[str, object], Judge], Plan]  # (request, options, judge) -> Plan


@dataclass(frozen=True)
class PlannerSpec:
    name: str
    fn: PlannerFn
    summary: str  # one line for `paraplan plan --help`
    schedules: tuple[Schedule, ...] = (Schedule.GPIPE,)  # what it can plan for; the first is its default
    options: Mapping[str, OptionSpec] = field(default_factory=dict)
    # plans operators, not layers: the caller builds the model's operator graph (CostModel.operators)
    needs_operators: bool = False


PLANNERS: dict[str, PlannerSpec] = {}


def register(name: str, summary: str, schedules=(Schedule.GPIPE,), options: Mapping[str, OptionSpec] | None = None,
             needs_operators: bool = False):
    """Decorator: add a planner function to the table under `name`."""

    def add(fn: PlannerFn) -> PlannerFn:
        if name in PLANNERS:
            raise RuntimeError(f"planner {name!r} registered twice")
        # "best": the planner also chooses the schedule (planners/request.py: BEST_SCHEDULE)
        PLANNERS[name] = PlannerSpec(name, fn, summary, tuple(s if s == "best" else Schedule(s) for s in schedules),
                                     dict(options or {}), needs_operators)
        return fn

    return add
