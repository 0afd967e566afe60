"""Issue 51 item 3: the comparison's progress on stderr while it runs (cli/comparison_progress.py,
planners/auto.py forwarding each search's planners/progress.py): a stand-in slow planner, forked as
the comparison forks every planner, is shown running with its own words about how far it has come,
the planners done and the best plan so far; nothing with --quiet or where stderr is no terminal."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from paraplan.cli.comparison_progress import ComparisonStatus, showing
from paraplan.cli.plan_auto import _compare
from paraplan.planners import progress, table
from paraplan.planners.auto import Row
from paraplan.planners.registry import make_plan, planner_names
from paraplan.workload import workload

STEPS = 4


def _slow(request, options, judge):
    """A stand-in for a long search: it says how far it has come each 0.6 s, then plans as dp does."""
    for step in range(STEPS):
        progress.at(f"stand-in step {step + 1} of {STEPS}")
        time.sleep(0.6)
    return make_plan(request, "dp", judge)


@pytest.fixture
def slow_planner(monkeypatch):
    planner_names()  # the registry loaded, then the stand-in beside its planners
    monkeypatch.setitem(table.PLANNERS, "stand-in-slow", table.PlannerSpec("stand-in-slow", _slow, "a stand-in"))
    return workload("gpt2-tiny", "local", batch=8).request


def _terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=300, color_system=None), out


def test_the_line_says_done_running_skipped_and_the_best_so_far():
    status = ComparisonStatus(total=5)
    status.on_row(Row(planner="csimd", status="skipped", reason="not for this model"))
    status.on_progress("galvatron-bmw", "")
    status.on_progress("gropipe", "")
    status.on_progress("galvatron-bmw", "4 stages, TP2")
    status.on_row(Row(planner="dp", status="ok", iteration_s=2.5))
    status.on_row(Row(planner="gropipe", status="ok", iteration_s=1.25))
    line = status.line()
    assert line.startswith("comparing planners: 3 of 5 done (1 skipped)")
    assert "running galvatron-bmw (4 stages, TP2)" in line and "gropipe (" not in line
    assert "best so far gropipe, 1.25 s an iteration" in line


def test_a_slow_planner_shows_its_progress_on_a_terminal_and_nothing_when_quiet(slow_planner, monkeypatch):
    import paraplan.planners.registry as registry

    # the comparison of the stand-in and dp alone (compare's `planners`), through the CLI's own display
    monkeypatch.setattr(registry, "planner_names", lambda: ("dp", "stand-in-slow"))
    import paraplan.planners.auto as auto

    real = auto.compare
    monkeypatch.setattr(auto, "compare", lambda request, **kw: real(request, planners=["dp", "stand-in-slow"], **kw))
    err, out = _terminal()
    result = _compare(slow_planner, err, 30.0, quiet=False)
    assert result.row("stand-in-slow").status == "ok"
    shown = out.getvalue()
    assert "comparing planners" in shown and "running stand-in-slow (stand-in step" in shown
    assert "best so far dp" in shown  # dp answers in milliseconds, the stand-in seconds later
    quiet_err, quiet_out = _terminal()
    _compare(slow_planner, quiet_err, 30.0, quiet=True)
    assert quiet_out.getvalue() == ""


def test_nothing_where_stderr_is_no_terminal():
    out = io.StringIO()
    with showing(Console(file=out, force_terminal=False), 3, quiet=False) as status:
        status.on_progress("dp", "")
        time.sleep(0.6)
    assert out.getvalue() == ""


def test_a_rider_runs_in_its_hosts_process_first_and_both_rows_arrive(monkeypatch):
    """PlannerSpec.rides_with: where its host runs too, a planner runs in the host's process just
    before it (Galvatron-Base before BMW: their searches' work is shared), under the one time limit;
    its progress is its own, and both rows come back. Out of time, the host says it never started."""
    from paraplan.planners.auto import compare

    planner_names()
    sleep = {"s": 0.0}  # read in the forked child

    def host(request, options, judge):
        return make_plan(request, "dp", judge)

    def rider(request, options, judge):
        progress.at("riding")
        time.sleep(sleep["s"])
        return make_plan(request, "dp", judge)

    monkeypatch.setitem(table.PLANNERS, "test-host", table.PlannerSpec("test-host", host, "a host"))
    monkeypatch.setitem(table.PLANNERS, "test-rider", table.PlannerSpec("test-rider", rider, "a rider",
                                                                        rides_with="test-host"))
    request = workload("gpt2-tiny", "local", batch=8).request
    seen = []
    result = compare(request, planners=["test-host", "test-rider", "dp"], time_limit_s=60.0,
                     on_progress=lambda name, where: seen.append((name, where)))
    assert {r.planner: r.status for r in result.rows} == {"test-host": "ok", "test-rider": "ok", "dp": "ok"}
    assert result.row("test-rider").iteration_s == result.row("dp").iteration_s
    assert ("test-rider", "") in seen and ("test-host", "") in seen
    assert seen.index(("test-rider", "")) < seen.index(("test-host", ""))

    # the rider takes the whole time limit: it is stopped with its best so far (none), and the host
    # is a row saying it never started, not a missing one
    sleep["s"] = 30.0
    result = compare(request, planners=["test-host", "test-rider"], time_limit_s=4.0)
    assert result.row("test-rider").status == "timeout"
    host_row = result.row("test-host")
    assert host_row.status == "timeout" and host_row.reason.startswith("not started")
