"""The four kinds of plan, told apart in one place.

A Plan (plans/plan.py) has one shape per method family; code that must treat them differently asks
`plan.kind` instead of testing the shape (a test, tests/unit/test_plan_kinds.py, refuses the shape
tests elsewhere in src/paraplan). What each kind's runtime does (its refusal, its check before
launch and its rank's set-up) is one class per kind in runtime/kinds.py, looked up by this kind.

- PIPELINE: contiguous stages of whole layers, each stage's devices data-parallel replicas
  (CSIMD, GroPipe, the even / GPipe / 1F1B baselines);
- LAYERS: stages whose layers each have a strategy (Galvatron-BMW: dp / sdp / tp / cp degrees,
  recomputation);
- BIPARTITION: stages with a backward range of their own (Bi-Partition);
- OPERATORS: an operator placement, per device the operators it runs (FD-DPS, schedule "dag").
"""

from __future__ import annotations

from enum import StrEnum

from paraplan.plans.schedules import Schedule


class PlanKind(StrEnum):
    PIPELINE = "pipeline"
    LAYERS = "layer strategies"
    BIPARTITION = "bipartition"
    OPERATORS = "operators"


def kind_of(schedule: str, stages, operators) -> PlanKind:
    """The kind of a plan of this schedule, stages and operator placements (Plan.kind). A plan
    that mixes shapes is refused by plans/plan.py: validate, which names the field."""
    if schedule == Schedule.DAG or operators:
        return PlanKind.OPERATORS
    if any(s.strategies for s in stages):
        return PlanKind.LAYERS
    if any(s.backward_layers is not None for s in stages):
        return PlanKind.BIPARTITION
    return PlanKind.PIPELINE
