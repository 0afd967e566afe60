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
    # `--planner auto` (planners/auto.py): when it starts this planner. 0: with the quick planners
    # (milliseconds to seconds, at 1,024 GPUs too), first; n >= 1: a slow search, started after
    # them, the lower n the sooner (1: the flagship, whose plans win most requests)
    slow: int = 0
    # why `--planner auto` leaves it out ("": compared), e.g. a planner that checks others
    not_compared: str = ""
    # the options it takes when `--planner auto` runs it beside the planners named in the frozenset
    # (options, compared) -> options; None: the request's own
    in_comparison: Callable[[dict, frozenset], dict] | None = None
    # lays a mixture of experts' routed experts out over devices (expert parallelism, issue 50); the
    # others plan such a model with every expert on every device of a stage, and the comparison says so
    expert_parallel: bool = False
    # (request, the comparison's time limit) -> why the method does not reach the request, one line
    # (the comparison skips it before it starts, issue 51 item 2), or None; None: it reaches any
    reach: Callable[[object, float], str | None] | None = None
    # its search prices every device as the cluster's first (the method's papers assume devices alike);
    # on a cluster of several kinds its plans say so (planners/registry.py: alike_note, issue 52)
    alike_devices: bool = False
    # `--planner auto`: where the named planner runs too, this one runs in its process, just before it,
    # under the same time limit: the two share their searches' work (Galvatron-Base's search is
    # BMW's on the even partitions: planners/galvatron/searcher.py `_shared`) and its judgements
    rides_with: str = ""
    # request -> the most devices any of its plans uses (None: every device); below the cluster's, the
    # comparison skips it where that many devices' least work alone outlasts a plan already found
    # (planners/skips.py: cannot_beat)
    most_devices: Callable[[object], int] | None = None


PLANNERS: dict[str, PlannerSpec] = {}


def register(name: str, summary: str, schedules=(Schedule.GPIPE,), options: Mapping[str, OptionSpec] | None = None,
             needs_operators: bool = False, *, slow: int = 0, not_compared: str = "",
             in_comparison: Callable[[dict, frozenset], dict] | None = None, expert_parallel: bool = False,
             reach: Callable[[object, float], str | None] | None = None, alike_devices: bool = False,
             rides_with: str = "", most_devices: Callable[[object], int] | None = None):
    """Decorator: add a planner function to the table under `name` (`slow`, `not_compared`,
    `in_comparison`, `rides_with`, `most_devices`: how `--planner auto` runs it; `expert_parallel`: PlannerSpec)."""

    def add(fn: PlannerFn) -> PlannerFn:
        if name in PLANNERS:
            raise RuntimeError(f"planner {name!r} registered twice")
        # "best": the planner also chooses the schedule (planners/request.py: BEST_SCHEDULE)
        PLANNERS[name] = PlannerSpec(name, fn, summary, tuple(s if s == "best" else Schedule(s) for s in schedules),
                                     dict(options or {}), needs_operators, slow, not_compared, in_comparison,
                                     expert_parallel, reach, alike_devices, rides_with, most_devices)
        return fn

    return add
