"""The plan features beyond version 1's that a part of paraplan may not model or run yet, found in
a plan with where each is used (a field path and its value), and refused in one line naming it."""

from __future__ import annotations

from paraplan.plans.layer_strategy import Recompute
from paraplan.plans.plan import Plan, PlanError
from paraplan.plans.schedules import MULTI_CHUNK
from paraplan.precision import Precision

# version 2's strategies beyond version 1's, each with the field that uses it first (the simulator
# and the runtime refuse, in one line, what they do not model or run yet: `refuse_features`)
FEATURES = ("precision", "zero", "sequence_parallel", "selective", "schedule", "context_parallel", "expert_parallel",
            "expert_overlap", "expert_dispatcher")
# the issue that brings each
_FEATURE_ISSUE = {"schedule": "issue 30, Today's training II", "expert_parallel": "issue 50, Mixture-of-experts",
                  "expert_overlap": "issue 50, Mixture-of-experts", "expert_dispatcher": "issue 50, Mixture-of-experts"}


def features_used(plan: Plan) -> dict[str, str]:
    """Which of FEATURES the plan uses, each with where (a field path and its value)."""
    found: dict[str, str] = {}
    if plan.precision != Precision.FP32:
        found["precision"] = f"precision: {plan.precision}"
    for i, stage in enumerate(plan.stages):
        for j, x in enumerate(stage.strategies):
            where = f"stages[{i}].strategies[{j}]"
            if x.zero:
                found.setdefault("zero", f"{where}.zero: {x.zero}")
            if x.sequence_parallel:
                found.setdefault("sequence_parallel", f"{where}.sequence_parallel: true")
            if x.recompute == Recompute.SELECTIVE:
                found.setdefault("selective", f"{where}.recompute: selective")
            if x.cp > 1:
                found.setdefault("context_parallel", f"{where}.cp: {x.cp}")
            if x.ep * x.etp > 1:
                found.setdefault("expert_parallel", f"{where}.ep: {x.ep}, etp: {x.etp}")
    if plan.schedule in MULTI_CHUNK:  # the schedules of "Today's training II" (plans/schedules.py)
        found["schedule"] = f"schedule.kind: {plan.schedule}"
    if plan.expert_overlap:  # Megatron-LM's all-to-all overlap (plans/expert_overlap.py)
        found["expert_overlap"] = "schedule.expert_overlap: true"
    if plan.expert_dispatcher != "alltoall":  # DeepEP's dispatcher (plans/expert_dispatch.py)
        found["expert_dispatcher"] = f"expert_dispatcher: {plan.expert_dispatcher}"
    return found


def refuse_features(plan: Plan, supported: frozenset[str] | set[str], what: str,
                    reasons: dict[str, str] | None = None) -> None:
    """PlanError naming the first feature the plan uses that `what` (e.g. "the simulator") does not
    support yet; `reasons` (by feature): why `what` does not, said instead of the issue that brings it."""
    for feature, where in features_used(plan).items():
        if feature not in supported and reasons and feature in reasons:
            raise PlanError(f"{where}: {reasons[feature]}")
        if feature not in supported:
            issue = _FEATURE_ISSUE.get(feature, "issue 29, Today's training I")
            raise PlanError(f"{where}: {what} does not support this yet ({issue})")
