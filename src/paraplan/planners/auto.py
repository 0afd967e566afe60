"""`paraplan plan --planner auto` (the default): every applicable planner on one request, each plan
judged by the one simulator, the best feasible plan chosen, and a lower bound to say how good it is.

Planners run in parallel processes (forked, so each inherits the request's cost model without
pickling it; `jobs` at a time, the machine's cores by default), each under a time limit: a planner
that raises, crashes or runs out of time is a row with the reason, never the end of the run. The
choice is by the simulator's prediction (feasible first, then the shortest iteration), the same
yardstick every planner's own candidates are judged by. Not pure (processes): it sits beside the
CLI, above the planners.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace

from paraplan.errors import ParaplanError
from paraplan.planners.bound import LowerBound, lower_bound
from paraplan.planners.registry import make_plan, planner, planner_names
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import Plan
from paraplan.plans.worker_roles import worker_roles

SLOW_FIRST = ("bipartition", "fddps-ports", "fddps", "galvatron-bmw", "galvatron-1f1b-biobj", "fddps-nosplit",
              "gropipe", "mpdps", "galvatron-base", "fastt", "heft", "galvatron")

# planners that exist to check others or to show the paper's printed pseudo-code, not to be chosen
NOT_COMPARED = {"random": "a random division (a baseline for tests)", "brute-force": "the exact check of CSIMD "
                "on small models", "csimd-paper": "CSIMD's printed pseudo-code (csimd is the same, fixed)"}


@dataclass(frozen=True)
class Row:
    planner: str
    status: str  # ok | infeasible | failed | timeout | skipped
    plan: Plan | None = None
    iteration_s: float | None = None
    throughput: float | None = None
    peak_bytes: tuple[int, ...] = ()  # per device the plan uses
    capacity_bytes: tuple[int, ...] = ()
    bubble: float | None = None
    search_s: float | None = None
    shape: str = ""
    reason: str = ""  # why not ok


@dataclass(frozen=True)
class Comparison:
    rows: tuple[Row, ...]
    best: str | None  # the chosen planner's name (None: nothing feasible)
    bound: LowerBound
    wall_s: float

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
    timed_out = [r.planner for r in result.rows if r.status == "timeout"]
    failed = [r for r in result.rows if r.status == "infeasible"]
    closest = min(failed, key=lambda r: r.iteration_s) if failed else None
    fastest = f"the fastest, {closest.planner}: {closest.reason}" if closest else ""
    if timed_out:
        limit = f" of {time_limit_s:g} s" if time_limit_s else ""
        others = (", the others found nothing that fits" + (f" ({fastest})" if fastest else "")) if failed else ""
        return (f"no plan within the time limit{limit}: {len(timed_out)} planner{'s' if len(timed_out) != 1 else ''} "
                f"timed out ({', '.join(timed_out)}){others}; raise --time-limit")
    return "no planner found a plan that fits" + (f"; {fastest}" if fastest else "")


def describe(plan: Plan) -> str:
    """The plan's shape in a few words."""
    if plan.operators:
        used = [p for p in plan.operators if p.ops]
        splits = sum("/part" in op for p in plan.operators for op in p.ops)
        return f"operators on {len(used)} devices" + (f", {splits} split parts" if splits else "")
    stages = f"{plan.n_stages} stage{'s' if plan.n_stages != 1 else ''}"
    if plan.schedule not in ("gpipe", "1f1b", "async-1f1b"):  # the schedules of "Today's training II"
        chunks = f" x {plan.virtual_stages} chunks" if plan.virtual_stages > 1 else ""
        stages = f"{plan.n_ranks} stage{'s' if plan.n_ranks != 1 else ''}{chunks}, {plan.schedule}"
    if any(s.backward_layers is not None for s in plan.stages):
        split = sum(len(r.recomputed) for r in worker_roles(plan))
        return f"{plan.n_stages} worker{'s' if plan.n_stages != 1 else ''}" + (
            f", {split} layer{'s' if split != 1 else ''} split fwd/bwd" if split else ", layer-wise")
    if any(s.strategies for s in plan.stages) and any(st.degree > 1 for s in plan.stages for st in s.strategies):
        kinds = []
        for stage in plan.stages:
            for layer in stage.layers:
                text = str(stage.strategy(layer))
                if text not in kinds:
                    kinds.append(text)
        more = f" +{len(kinds) - 3} more" if len(kinds) > 3 else ""
        return f"{stages} x {len(plan.stages[0].devices)}: " + ", ".join(kinds[:3]) + more
    groups = len(plan.stages[0].devices)
    return stages + (f" x {groups} groups" if groups > 1 else "")


def skip_reason(name: str, request: PlanRequest) -> str | None:
    """Why a planner does not take part (None: it does)."""
    if name in NOT_COMPARED:
        return NOT_COMPARED[name]
    spec = planner(name)
    if spec.needs_operators and request.costs.operators is None:
        return "needs the model's operator graph, which could not be traced"
    if request.schedule not in (None, "best") and request.schedule not in spec.schedules:
        return f"does not plan {request.schedule}"
    return None


def _run_one(name: str, request: PlanRequest, conn) -> None:
    """In the child: plan, simulate, send back a Row (or the failure as one line)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # born with SIGINT blocked (_run_all): now ignored
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    from paraplan.simulator.predict import simulate_plan

    # the child holds nothing to clean up: SIGTERM (from the parent's exit) ends it, instead of the
    # parent's handler turning it into an exception that would end as a traceback on stderr
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        t0 = time.perf_counter()
        plan = make_plan(request, name, predict=False)  # simulated once, below (twice took as long again)
        search_s = time.perf_counter() - t0
        sim = simulate_plan(plan, request.costs)
        p = sim.prediction
        row = Row(planner=name, status="ok" if p.feasible else "infeasible", plan=sim.plan,
                  iteration_s=p.iteration_s, throughput=p.throughput_samples_per_s,
                  peak_bytes=tuple(m.peak_bytes for m in p.memory),
                  capacity_bytes=tuple(m.capacity_bytes for m in p.memory), bubble=sim.bubble_fraction,
                  search_s=plan.search.search_s if plan.search else search_s, shape=describe(plan),
                  reason="" if p.feasible else p.reason)
    except ParaplanError as exc:
        row = Row(planner=name, status="failed", reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except Exception as exc:  # a planner's bug is a row, with where it happened
        where = traceback.extract_tb(exc.__traceback__)[-1]
        row = Row(planner=name, status="failed",
                  reason=f"{type(exc).__name__}: {exc} ({os.path.basename(where.filename)}:{where.lineno})")
    conn.send(row)
    conn.close()


def compare(request: PlanRequest, planners: list[str] | None = None, time_limit_s: float = 60.0,
            jobs: int | None = None, on_row: Callable[[Row], None] | None = None) -> Comparison:
    """Run every applicable planner (or `planners`) on `request`; `on_row` is called as each ends."""
    t0 = time.perf_counter()
    names = planners or planner_names()
    rows: dict[str, Row] = {}
    todo = []
    for name in names:
        reason = skip_reason(name, request)
        if reason is not None and planners is None:
            rows[name] = Row(planner=name, status="skipped", reason=reason)
            if on_row:
                on_row(rows[name])
        else:
            todo.append(name)
    # the slowest searches first (longest-processing-time first keeps the cores busy to the end):
    # measured on gpt2-xl, 8 devices, these take seconds where the others take milliseconds
    todo.sort(key=lambda n: (SLOW_FIRST.index(n) if n in SLOW_FIRST else len(SLOW_FIRST)))
    jobs = jobs or os.cpu_count() or 1
    ctx = multiprocessing.get_context("fork")
    running: dict[str, tuple] = {}
    try:
        _run_all(todo, running, rows, request, jobs, ctx, time_limit_s, on_row)
    finally:  # interrupted (or failed): no planner process outlives the comparison
        for proc, conn, _ in running.values():
            proc.kill()
            proc.join()
            conn.close()
    ordered = tuple(rows[n] for n in names)
    feasible = sorted((r for r in ordered if r.status == "ok"), key=lambda r: (r.iteration_s, r.planner))
    return Comparison(rows=ordered, best=feasible[0].planner if feasible else None,
                      bound=lower_bound(request.costs, request.batch), wall_s=time.perf_counter() - t0)


def _run_all(todo: list, running: dict, rows: dict, request: PlanRequest, jobs: int, ctx, time_limit_s: float,
             on_row) -> None:
    """Start planners while fewer than `jobs` run, collect each one's row (or its time-out)."""
    while todo or running:
        while todo and len(running) < jobs:
            name = todo.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_run_one, args=(name, request, child), daemon=True)
            # Ctrl-C reaches the whole foreground group: the parent says "interrupted" once and
            # ends the children (compare's finally); a child that took it would print a
            # KeyboardInterrupt traceback. SIGINT is blocked across the fork (the child inherits
            # the mask and ignores it before unblocking: `_run_one`); the parent's pending one,
            # if any, arrives as the mask is restored.
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                proc.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
            child.close()
            running[name] = (proc, parent, time.perf_counter())
        for name, (proc, conn, started) in list(running.items()):
            row = None
            if conn.poll():
                try:
                    row = conn.recv()
                except EOFError:
                    row = None
                proc.join(5)
                if row is None:
                    row = Row(planner=name, status="failed", reason=f"the planner's process ended ({proc.exitcode})")
            elif not proc.is_alive():
                row = Row(planner=name, status="failed", reason=f"the planner's process died (exit {proc.exitcode})")
            elif time.perf_counter() - started > time_limit_s:
                proc.kill()
                proc.join()
                row = Row(planner=name, status="timeout", reason=f"no plan within the time limit ({time_limit_s:g} s)")
            if row is not None:
                conn.close()
                del running[name]
                rows[name] = row
                if on_row:
                    on_row(row)
        time.sleep(0.01)
