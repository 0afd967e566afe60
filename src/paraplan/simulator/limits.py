"""How large a task graph the simulator may build, from the memory this machine has free.

A pipeline plan's task graph grows with its micro-batch count (a forward, a backward and two
transfers per micro-batch and stage), so a plan with 10**9 micro-batches would grow by a gigabyte
every half minute for hours before the kernel killed it. The simulator counts the tasks first (in
closed form) and refuses a graph that would not fit in the memory available, naming the limit.

Pure: the edge that knows the machine (the command line, the Python API) hands in the function
that reads the available memory (`paraplan.system.host`); without one there is no limit.
"""

from __future__ import annotations

from collections.abc import Callable

from paraplan.plans.plan import PlanError

# Measured: ~600 bytes a task at the peak of simulate_plan (the graph's lists, the engine's state
# and the Timeline's arrays; 1.2M tasks of a GPipe plan on gpt2-tiny). Rounded up for the per-stage
# action lists and the caller's copies (Gantt charts, traces), so the limit keeps a margin.
BYTES_PER_TASK = 1024

_memory_source: Callable[[], int | None] | None = None


def set_memory_source(available_bytes: Callable[[], int | None] | None) -> None:
    """The function telling how many bytes this process can still allocate (None: no limit), asked
    each time a graph is about to be built: what is free then is what the graph may take.
    Process-wide: forked planner processes (paraplan/planners/auto.py) inherit it."""
    global _memory_source
    _memory_source = available_bytes


def max_tasks() -> int | None:
    """The most tasks the memory available now holds; None without a limit."""
    available = _memory_source() if _memory_source is not None else None
    return None if available is None else max(0, available) // BYTES_PER_TASK


def check_task_count(n_tasks: int, what: str) -> None:
    """PlanError naming n_micro when `n_tasks` (made by `what`) would not fit in the memory available."""
    available = _memory_source() if _memory_source is not None else None
    if available is None or n_tasks * BYTES_PER_TASK <= available:
        return
    limit = max(0, available) // BYTES_PER_TASK
    raise PlanError(f"n_micro: {what} make {n_tasks:,} simulator tasks (~{_gib(n_tasks * BYTES_PER_TASK)}); "
                    f"the {_gib(available)} of memory available hold at most {limit:,} "
                    f"({BYTES_PER_TASK} bytes each)")


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:,.3g} GiB" if n_bytes < 1000 * 2**30 else f"{n_bytes / 2**30:,.0f} GiB"
