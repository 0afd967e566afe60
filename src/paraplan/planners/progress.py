"""The best plan a search has found so far, for a search stopped by its time limit (issue 31, item 5:
at 1,024 GPUs a time-out was reported as "nothing fits" and the search's work was lost).

A planner offers each plan that improves on the ones it offered before (`offer`); whoever runs it
under a time limit (planners/auto.py, in the planner's own process) stops it with `PlannerTimeout`
and takes `best()`. Whoever shows a person how far the search has come (issue 51 item 3: the
comparison's progress on stderr) listens (`listen`): each offer and `at` tells it in a few words.
Pure: module state, no clock, no signal; one search per process at a time.
"""

from __future__ import annotations

from collections.abc import Callable

from paraplan.plans.plan import Plan

_best: Plan | None = None
_where = ""
_listener: Callable[[str], None] | None = None


class PlannerTimeout(BaseException):
    """Raised into a planner's search when its time is up. A BaseException, so that a planner's own
    `except Exception` (a candidate that fails) does not swallow it."""


def reset() -> None:
    global _best, _where, _listener
    _best, _where, _listener = None, "", None


def listen(listener: Callable[[str], None] | None) -> None:
    """`listener(where)` on every offer and `at` of this process's search (None: nobody listens)."""
    global _listener
    _listener = listener


def offer(plan: Plan, where: str = "") -> None:
    """The search's best plan so far (the planner's own ranking: each offer replaces the last);
    `where`: how far the search had come, in a few words."""
    global _best, _where
    _best = plan
    if where:
        _where = where
    if _listener is not None:
        _listener(_where)


def at(where: str) -> None:
    """How far the search has come, in a few words (the plan offered last stays the best)."""
    global _where
    _where = where
    if _listener is not None:
        _listener(where)


def best() -> tuple[Plan | None, str]:
    """The last plan offered and how far the search had come when it stopped (None: nothing offered)."""
    return _best, _where
