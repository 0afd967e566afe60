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

import gc
import multiprocessing
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import replace

from paraplan.errors import NothingFits, ParaplanError
from paraplan.planners import progress
from paraplan.planners.bound import LowerBound, lower_bound, with_operator_term
from paraplan.planners.comparison_rows import Comparison, Row, judged_row, no_plan_reason, row_of, stopped_row
from paraplan.planners.plan_shape import describe
from paraplan.planners.registry import make_plan, planner, planner_names
from paraplan.planners.request import PlanRequest, with_operator_graph
from paraplan.planners.skips import cannot_beat, skip_reason

# the comparison's rows live in planners/comparison_rows.py; these names are read from here too
__all__ = ["Comparison", "Row", "compare", "describe", "judged_row", "no_plan_reason", "skip_reason"]


# what a planner still needs once stopped (simulate its best plan so far, send the row): its own
# deadline comes this much before the parent's kill
GRACE_S = 10.0
STOP_MARGIN_S = 3.0  # a planner's alarm comes this much before the comparison's deadline


FINALIZER_RETRY_S = 0.01


def _on_alarm(signum, frame):
    """Stop the search: raise where it runs. An alarm that lands in an object's finalizer (a
    __del__ run by the garbage collector) fires again 10 ms later instead: an exception there is
    printed as "Exception ignored" and swallowed, the search ran on past its limit, and the traceback
    reached the user's terminal (seen under load on the failures guide)."""
    if frame is not None and frame.f_code.co_name == "__del__":
        signal.setitimer(signal.ITIMER_REAL, FINALIZER_RETRY_S)
        return
    raise progress.PlannerTimeout


def _run_one(name: str, request: PlanRequest, conn, allowed_s: float | None = None,
             time_limit_s: float | None = None, riders: tuple = ()) -> None:
    """In the child: plan, simulate, send back a Row (or the failure as one line). Given a time limit,
    the search is stopped at it (SIGALRM) and the row carries the best plan it had offered
    (planners/progress.py), said to be so; the parent kills a child that outlives it by GRACE_S.
    `riders` ((name, request) pairs: PlannerSpec.rides_with) run before it in this process under the
    same time limit, each sending its row; each reads the searches and judgements made before it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # born with SIGINT blocked (_run_all): now ignored
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    # the child holds nothing to clean up: SIGTERM (from the parent's exit) ends it, instead of the
    # parent's handler turning it into an exception that would end as a traceback on stderr
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time_limit_s = time_limit_s if time_limit_s is not None else allowed_s
    if allowed_s is not None:
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, max(allowed_s, 1e-3))
    # the alarm falls inside a search only (`_planned_row`), never in a message half sent
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    started = time.perf_counter()
    for k, (planner_name, planner_request) in enumerate((*riders, (name, request))):
        if k:
            conn.send(("start", "", planner_name))
            left = None if allowed_s is None else allowed_s - (time.perf_counter() - started)
            if left is not None and left <= 0:
                conn.send(Row(planner=planner_name, status="timeout", timed_out=True,
                              reason=f"not started: the comparison's time limit ({time_limit_s:.3g} s) was spent "
                                     "by the planners before it in its process"))
                continue
        conn.send(_planned_row(planner_name, planner_request, conn, time_limit_s))
    signal.setitimer(signal.ITIMER_REAL, 0)
    conn.close()


def _planned_row(name: str, request: PlanRequest, conn, time_limit_s: float | None) -> Row:
    """One planner's row, in a child whose time limit's alarm is set and held off (`_run_one`): let in
    while it plans and simulates, held off again before its row is sent."""
    progress.reset()
    progress.listen(_forwarder(conn, name))
    t0 = time.perf_counter()
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
        try:
            plan = make_plan(request, name, predict=False)  # simulated once, below (twice took as long again)
            row = row_of(name, plan, request.costs, time.perf_counter() - t0)
        finally:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    except progress.PlannerTimeout:  # in the search, or in the simulation of the finished search
        row = stopped_row(name, request, time_limit_s, time.perf_counter() - t0)
    except NothingFits as exc:  # the method ran and nothing of it fits: infeasible, not a failure
        row = Row(planner=name, status="infeasible", reason=exc.detail, search_s=time.perf_counter() - t0)
    except ParaplanError as exc:
        row = Row(planner=name, status="failed", reason=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except Exception as exc:  # a planner's bug is a row, with where it happened
        where = traceback.extract_tb(exc.__traceback__)[-1]
        row = Row(planner=name, status="failed",
                  reason=f"{type(exc).__name__}: {exc} ({os.path.basename(where.filename)}:{where.lineno})")
    return row


PROGRESS_EVERY_S = 1.0  # a running search tells the comparison how far it has come at most this often


def _forwarder(conn, name: str) -> Callable[[str], None]:
    """In a planner's process: its search's progress (planners/progress.py) sent to the comparison as
    ("progress", where, name), at most every PROGRESS_EVERY_S (a grid offers thousands of plans a second)."""
    last = [-PROGRESS_EVERY_S]

    def send(where: str) -> None:
        now = time.perf_counter()
        if where and now - last[0] >= PROGRESS_EVERY_S:
            last[0] = now
            # the time limit's alarm waits until the message is whole (a half-sent one would garble
            # the row that follows it on the pipe)
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            try:
                conn.send(("progress", where, name))
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    return send


def _start_order(name: str, jobs: int) -> tuple[bool, int]:
    """The quick planners first (milliseconds to seconds, at 1,024 GPUs too), then the slow searches
    in the order their registration gives (planners/table.py: PlannerSpec.slow; the flagship first).
    Measured on gpt2-xl at 8 devices and a Llama-2-70B-like model at 1,024 (issue 31, item 5). With
    two processes or more the flagship starts before them, in a process of its own: with
    Galvatron-Base riding in it, the longest chain (34 of 44 s at 1,024 H100s when measured), which
    the quick ones had held back by 2.7 s; they run beside it."""
    slow = planner(name).slow
    return (not (jobs > 1 and slow == 1), slow)


def compare(request: PlanRequest, planners: list[str] | None = None, time_limit_s: float = 60.0,
            jobs: int | None = None, on_row: Callable[[Row], None] | None = None,
            on_progress: Callable[[str, str], None] | None = None,
            operators: Callable[[], object] | None = None) -> Comparison:
    """Run every applicable planner (or `planners`) on `request`; `on_row` is called as each ends,
    `on_progress(name, where)` as each starts (where "") and as its search tells how far it has come.
    `time_limit_s` bounds the whole comparison (issue 31, item 5: a minute at 1,024 GPUs): every
    planner must answer by then, a search still running answers with its best plan so far
    (planners/progress.py), one not yet started says so. `operators` (a request without its operator
    graph): what traces it, called here once the first planner runs, its placement planners held
    back till then (the trace, seconds for a 70B model, runs beside the longest chain instead of
    before it: issue 51); the graph comes back in Comparison.operators."""
    t0 = time.perf_counter()
    names = planners or planner_names()
    rows: dict[str, Row] = {}
    todo = []
    held = [n for n in names if operators is not None and request.costs.operators is None and planner(n).needs_operators]
    jobs = jobs or os.cpu_count() or 1

    def take(these, now: PlanRequest) -> None:
        """Each planner of `these` skipped with its reason, or queued in its start order."""
        for name in these:
            reason = skip_reason(name, now, time_limit_s)
            if reason is not None and planners is None:
                rows[name] = Row(planner=name, status="skipped", reason=reason)
                if on_row:
                    on_row(rows[name])
            else:
                todo.append(name)
        todo.sort(key=lambda name: _start_order(name, jobs))

    take([n for n in names if n not in held], request)
    ctx = multiprocessing.get_context("fork")
    running: dict[str, tuple] = {}
    # what exists now set aside by the collector while the comparison runs, here and in every planner's
    # process forked from here (full collections scanned the whole heap); given back after
    gc.freeze()
    bound = lower_bound(request.costs, request.batch)  # also what a planner of a few devices must beat (skips.py)
    traced = {}

    def late(now: PlanRequest) -> PlanRequest:
        """The operator graph traced and the held planners skipped or queued: the request from now on."""
        traced["graph"] = operators()
        now = with_operator_graph(now, traced["graph"])
        traced["bound"] = with_operator_term(bound, now.costs, now.batch)  # the placements' own least work
        take(held, now)
        return now

    try:
        _run_all(todo, running, rows, request, jobs, ctx, time_limit_s, on_row, frozenset(todo + held), on_progress,
                 bound, late if held else None)
    finally:  # interrupted (or failed): no planner process outlives the comparison
        gc.unfreeze()
        for proc, conn, *_ in running.values():
            proc.kill()
            proc.join()
            conn.close()
    ordered = tuple(rows[n] for n in names)
    feasible = sorted((r for r in ordered if r.status == "ok"), key=lambda r: (r.iteration_s, r.planner))
    return Comparison(rows=ordered, best=feasible[0].planner if feasible else None,
                      bound=traced.get("bound", bound), wall_s=time.perf_counter() - t0, operators=traced.get("graph"))


def _request_for(name: str, request: PlanRequest, compared: frozenset) -> PlanRequest:
    """The request as planner `name` gets it beside the planners `compared`: its registration's
    options for a comparison where it has them (planners/table.py: PlannerSpec.in_comparison; e.g.
    Galvatron-Base and -BMW leave the variants inside their space to the rows of their own)."""
    spec = planner(name)
    if spec.in_comparison is None:
        return request
    options = spec.in_comparison(dict(request.options), compared)
    return replace(request, options=options) if options != dict(request.options) else request


def _run_all(todo: list, running: dict, rows: dict, request: PlanRequest, jobs: int, ctx, time_limit_s: float,
             on_row, names: frozenset, on_progress, bound: LowerBound, late=None) -> None:
    """Start planners while fewer than `jobs` run, collect each one's row (or its time-out); one that
    cannot beat a plan found already (planners/skips.py, under `bound`) is skipped. `late(request)`:
    run once the first planner has started (or none can), giving the request from then on."""
    deadline = time.perf_counter() + time_limit_s
    while todo or running or late:
        if late is not None and (running or not todo):
            request, late = late(request), None
        while todo and len(running) < jobs and not (late is not None and running):
            name = todo.pop(0)
            beaten = cannot_beat(name, request, bound, rows.values())
            if beaten is not None:
                rows[name] = Row(planner=name, status="skipped", reason=beaten)
                if on_row:
                    on_row(rows[name])
                continue
            # what the planner may take: up to the comparison's deadline, less the time to simulate
            # its best plan so far and send it back
            allowed = deadline - time.perf_counter() - min(STOP_MARGIN_S, 0.1 * time_limit_s)
            if allowed < min(1.0, 0.1 * time_limit_s):
                rows[name] = Row(planner=name, status="timeout", timed_out=True,
                                 reason=f"not started: the comparison's time limit ({time_limit_s:.3g} s) was spent "
                                        "by the planners before it")
                if on_row:
                    on_row(rows[name])
                continue
            # the planners that run in this one's process, before it (PlannerSpec.rides_with)
            riders = [r for r in todo if planner(r).rides_with == name]
            for r in riders:
                todo.remove(r)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_run_one, args=(name, _request_for(name, request, names), child, allowed,
                                                      time_limit_s, tuple((r, _request_for(r, request, names))
                                                                          for r in riders)), daemon=True)
            # Ctrl-C reaches the whole foreground group: the parent says "interrupted" once and ends the
            # children (compare's finally); a child that took it would print a KeyboardInterrupt traceback.
            # SIGINT is blocked across the fork (the child ignores it before unblocking: `_run_one`); the
            # mask is read first and restored in the finally whatever happens (pthread_sigmask runs pending
            # handlers once set: an exception there must not leave SIGINT blocked here and in later children)
            was_blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
            try:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
                proc.start()
            finally:
                if not was_blocked:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            child.close()
            running[name] = (proc, parent, time.perf_counter() + allowed, [name, *riders])
            if on_progress:
                on_progress(riders[0] if riders else name, "")
        for name, (proc, conn, stop_at, pending) in list(running.items()):
            ended = []
            if conn.poll():
                try:
                    row = conn.recv()
                except EOFError:
                    row = None
                if isinstance(row, tuple):  # ("progress" | "start", where, planner): it goes on (_forwarder)
                    if on_progress:
                        on_progress(row[2], row[1])
                    continue
                if row is not None:
                    ended.append(row)
                else:
                    proc.join(5)
                    ended += [Row(planner=n, status="failed", reason=f"the planner's process ended ({proc.exitcode})")
                              for n in pending]
            elif not proc.is_alive():
                ended += [Row(planner=n, status="failed", reason=f"the planner's process died (exit {proc.exitcode})")
                          for n in pending]
            elif time.perf_counter() > stop_at + GRACE_S:  # it did not stop at its alarm
                proc.kill()
                proc.join()
                ended += [Row(planner=n, status="timeout", reason=f"no plan within the time limit ({time_limit_s:.3g} s)",
                              timed_out=True) for n in pending]
            for row in ended:
                pending.remove(row.planner)
                rows[row.planner] = row
                if on_row:
                    on_row(row)
            if ended and not pending:
                proc.join(5)
                conn.close()
                del running[name]
        time.sleep(0.01)
