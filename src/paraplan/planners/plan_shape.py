"""A plan's shape in a few words, as the comparison's table and the report show it ("4 stages x 2
groups", "1 stage x 16: SDP16", "operators on 8 devices, 12 split parts")."""

from __future__ import annotations

from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import Plan
from paraplan.plans.worker_roles import worker_roles


def describe(plan: Plan) -> str:
    """The plan's shape in a few words."""
    kind = plan.kind
    if len({p.device for p in plan.operators if p.ops} if kind is PlanKind.OPERATORS else set(plan.devices)) == 1:
        # whichever planner found it: its name in the table must not read as a split
        chunks = f", {plan.virtual_stages} chunks, {plan.schedule}" if plan.virtual_stages > 1 else ""
        return "one process on 1 device" + chunks
    if kind is PlanKind.OPERATORS:
        used = [p for p in plan.operators if p.ops]
        splits = sum("/part" in op for p in plan.operators for op in p.ops)
        return f"operators on {len(used)} devices" + (f", {splits} split parts" if splits else "")
    stages = f"{plan.n_stages} stage{'s' if plan.n_stages != 1 else ''}"
    if plan.schedule not in ("gpipe", "1f1b", "async-1f1b"):  # the schedules of "Today's training II"
        chunks = f" x {plan.virtual_stages} chunks" if plan.virtual_stages > 1 else ""
        stages = f"{plan.n_ranks} stage{'s' if plan.n_ranks != 1 else ''}{chunks}, {plan.schedule}"
    if kind is PlanKind.BIPARTITION:
        split = sum(len(r.recomputed) for r in worker_roles(plan))
        return f"{plan.n_stages} worker{'s' if plan.n_stages != 1 else ''}" + (
            f", {split} layer{'s' if split != 1 else ''} split fwd/bwd" if split else ", layer-wise")
    if kind is PlanKind.LAYERS and any(st.degree > 1 for s in plan.stages for st in s.strategies):
        kinds = []
        for stage in plan.stages:
            for layer in stage.layers:
                text = str(stage.strategy(layer))
                if text not in kinds:
                    kinds.append(text)
        more = f" +{len(kinds) - 3} more" if len(kinds) > 3 else ""
        return f"{stages} x {len(plan.stages[0].devices)}: " + ", ".join(kinds[:3]) + more
    widths = [len(s.devices) for s in plan.stages]
    shares = "".join(f", stage {i} shares {':'.join(map(str, s.shares))}" for i, s in enumerate(plan.stages) if s.shares)
    if len(set(widths)) > 1:  # stages of unequal width (plans/stage_widths.py)
        return f"{stages} of {' + '.join(map(str, widths))} devices{shares}"
    return stages + (f" x {widths[0]} groups" if widths[0] > 1 else "") + shares
