"""The comparison's rows (planners/auto.py): a planner's `Row` (its plan simulated once, data-parallel
replicas alike as one, or the memory's verdict alone for a plan that does not fit and whose
timeline would be too long; the row of a search stopped at its time limit; a plan made outside the
planners), the whole `Comparison`, and why it has no plan."""

from __future__ import annotations

import signal
from dataclasses import dataclass, replace

from paraplan.planners import progress
from paraplan.planners.bound import LowerBound
from paraplan.planners.plan_shape import describe
from paraplan.planners.registry import PLANNERS, alike_note, idle_kinds
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import Plan, SearchInfo
from paraplan.simulator.time_split import TimeSplit


@dataclass(frozen=True)
class Row:
    planner: str
    status: str  # ok | infeasible | failed | timeout | skipped | refused (by --engine)
    plan: Plan | None = None
    iteration_s: float | None = None
    throughput: float | None = None
    peak_bytes: tuple[int, ...] = ()  # per device the plan uses
    capacity_bytes: tuple[int, ...] = ()
    bubble: float | None = None
    search_s: float | None = None
    shape: str = ""
    reason: str = ""  # why not ok
    # stopped by its time limit: `plan` (if any) is the best its search had found by then, and
    # `reason` says so; status is that plan's verdict (ok / infeasible), or timeout without one
    timed_out: bool = False
    split: TimeSplit | None = None  # where the plan's iteration goes (simulator/time_split.py)


@dataclass(frozen=True)
class Comparison:
    rows: tuple[Row, ...]
    best: str | None  # the chosen planner's name (None: nothing feasible)
    bound: LowerBound
    wall_s: float
    # `paraplan plan --engine E` (export/restrict.py): rows of plans E cannot run are "refused", and
    # the best row of the comparison before that restriction is kept here
    engine: str = ""
    unrestricted: Row | None = None
    operators: object = None  # the operator graph `compare` traced itself (its `operators`), else None

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.planner == name)

    @property
    def ranked(self) -> list[Row]:
        """Feasible rows, fastest first."""
        return sorted((r for r in self.rows if r.status == "ok"), key=lambda r: (r.iteration_s, r.planner))

    def distinct(self, k: int) -> list[Row]:
        """The `k` fastest feasible rows whose plans differ (a plan two planners share counts once):
        what `--try-top K` runs."""
        rows, seen = [], []
        for row in self.ranked:
            plan = replace(row.plan, prediction=None, search=None)
            if plan not in seen:
                seen.append(plan)
                rows.append(row)
        return rows[:k]


def no_plan_reason(result: Comparison, time_limit_s: float | None = None) -> str:
    """Why a comparison has no plan, in one line: a planner that ran out of time is not a planner
    that found nothing fits (issue 31: at 1,024 GPUs a time-out was reported as infeasibility)."""
    timed_out = [r.planner for r in result.rows if r.timed_out or r.status == "timeout"]
    failed = [r for r in result.rows if r.status == "infeasible" and r.iteration_s is not None]
    closest = min(failed, key=lambda r: r.iteration_s) if failed else None
    fastest = f"the fastest, {closest.planner}: {closest.reason}" if closest else ""
    if timed_out:
        limit = f" of {time_limit_s:g} s" if time_limit_s else ""
        others = (", the others found nothing that fits" + (f" ({fastest})" if fastest else "")) if failed else ""
        return (f"no plan within the time limit{limit}: {len(timed_out)} planner{'s' if len(timed_out) != 1 else ''} "
                f"timed out ({', '.join(timed_out)}){others}; raise --time-limit")
    return "no planner found a plan that fits" + (f"; {fastest}" if fastest else "")



# a plan that does not fit and whose timeline would take more simulator tasks than this is a row
# with its memory's verdict alone (CSIMD at 1,024 GPUs: 81 stages x 4,096 micro-batches of one
# sample, 1.3 million tasks, 16 s here, for a plan 21,000 GiB over its memory)
ROW_TIMELINE_TASKS = 200_000


def row_of(name: str, plan: Plan, costs, search_s: float, timed_out: bool = False, note: str = "") -> Row:
    from paraplan.simulator.predict import simulate_plan, verdict_if_large

    shape = describe(plan) + "".join(f" ({x})" for x in (
        alike_note(PLANNERS[name], costs.cluster) if name in PLANNERS else "", idle_kinds(plan, costs.cluster)) if x)
    search_s = plan.search.search_s if plan.search and not timed_out else search_s
    unsimulated = verdict_if_large(plan, costs, ROW_TIMELINE_TASKS)
    if unsimulated is not None:
        reason = unsimulated.reason + "; its timeline not simulated (it does not fit)"
        return Row(planner=name, status="infeasible", plan=plan, peak_bytes=tuple(m.peak_bytes for m in unsimulated.memory),
                   capacity_bytes=tuple(m.capacity_bytes for m in unsimulated.memory), search_s=search_s, shape=shape,
                   reason=note + f"; {reason}" if timed_out else reason, timed_out=timed_out)
    # data-parallel replicas alike simulated as one (the same prediction and time split, each
    # replica's devices drawn on replica 0's)
    sim = simulate_plan(plan, costs, one_replica=True)
    p = sim.prediction
    reason = "" if p.feasible else p.reason
    if timed_out:
        reason = note + (f"; {reason}" if reason else "")
    return Row(planner=name, status="ok" if p.feasible else "infeasible", plan=sim.plan, iteration_s=p.iteration_s,
               throughput=p.throughput_samples_per_s, peak_bytes=tuple(m.peak_bytes for m in p.memory),
               capacity_bytes=tuple(m.capacity_bytes for m in p.memory), bubble=sim.bubble_fraction,
               search_s=search_s, shape=shape, reason=reason, timed_out=timed_out, split=sim.split)


def judged_row(name: str, plan: Plan, costs) -> Row:
    """A plan made outside the planners (export/restrict.py's projections) as a row of the comparison."""
    return replace(row_of(name, replace(plan, search=None), costs, 0.0), search_s=None)


def stopped_row(name: str, request: PlanRequest, time_limit_s: float, elapsed_s: float) -> Row:
    """The row of a search stopped at its time limit: its best plan so far, said to be so, or a
    time-out row when it had offered none."""
    signal.setitimer(signal.ITIMER_REAL, 0)
    best, where = progress.best()
    limit = f"time limit ({time_limit_s:.3g} s)"
    if best is None:
        return Row(planner=name, status="timeout", reason=f"no plan within the {limit}", timed_out=True)
    note = f"stopped at the {limit}: the best plan found so far" + (f" ({where})" if where else "")
    best = replace(best, **request.costs.plan_precision,
                   search=SearchInfo(planner=name, search_s=elapsed_s, options=(("timed_out", True),), note=note))
    return row_of(name, best, request.costs, elapsed_s, timed_out=True, note=note)
