"""A mixture-of-experts plan's expert layout and its all-to-alls, for people (issue 50 item 4): the
expert view each MoE layer's devices take (costs/expert_costs.py) and how much of the step the
token dispatch and combine take on the busiest pipeline rank (every micro-batch's, and again in a
fully recomputed layer's backward), beside the iteration. The same terms as the simulator's layer
times (costs/strategy.py: layer_time adds them), summed here so that `simulate`, `plan --json` and
the report can say them; not a second model."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from paraplan.costs.expert_costs import dispatch_s, expert_degrees, has_expert_view
from paraplan.costs.model import CostModel
from paraplan.costs.strategy import strategy_links
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import Plan


@dataclass(frozen=True)
class ExpertSummary:
    moe_layers: int  # the model's layers with routed experts
    layouts: tuple[tuple[str, int], ...]  # ("EP8 x ETP1 x EDP2", how many MoE layers take it), most first
    all_to_all_s: float  # the busiest pipeline rank's dispatch and combine per step
    iteration_s: float
    # Megatron-LM's all-to-all overlap (plans/expert_overlap.py): the steady state's all-to-alls run
    # under another micro-batch's compute, so all_to_all_s is what they take, not what they add
    overlapped: bool = False
    dispatcher: str = "alltoall"  # the plan's expert_dispatcher (plans/expert_dispatch.py)

    @property
    def share(self) -> float:
        return self.all_to_all_s / self.iteration_s if self.iteration_s > 0 else 0.0

    def describe(self) -> str:
        layouts = "; ".join(f"{text} on {n} of {self.moe_layers}" for text, n in self.layouts)
        return (f"experts: {layouts} MoE layers; all-to-all {self.all_to_all_s:.4g} s of the "
                f"{self.iteration_s:.4g} s step ({self.share:.1%}) on the busiest pipeline rank"
                + ("; Megatron-LM's all-to-all overlap runs the steady state's under another micro-batch's compute"
                   if self.overlapped else "")
                + ("; DeepEP's dispatcher: a token crosses to each other node of its experts once" if
                   self.dispatcher == "deepep" else ""))

    def as_json(self) -> dict:
        return {"moe_layers": self.moe_layers, "layouts": [{"layout": t, "layers": n} for t, n in self.layouts],
                "all_to_all_s": self.all_to_all_s, "all_to_all_share": self.share, "all_to_all_overlap": self.overlapped,
                "dispatcher": self.dispatcher}


def _layout(strategy) -> str:
    if not has_expert_view(strategy):
        return "experts as the dense layout (EP1)"
    d = expert_degrees(strategy)
    return f"EP{d.ep} x ETP{d.etp} x EDP{d.edp}"


def expert_summary(plan: Plan, cm: CostModel, iteration_s: float) -> ExpertSummary | None:
    """None for a model without routed experts or a plan without per-layer strategies' groups."""
    layers = cm.model.layers
    moe = [i for i, layer in enumerate(layers) if layer.experts is not None]
    if not moe or plan.kind is PlanKind.OPERATORS:
        return None
    micro = plan.global_batch / plan.n_micro
    layouts: Counter = Counter()
    per_rank: Counter = Counter()
    for s, stage in enumerate(plan.stages):
        links = {}
        for i in stage.layers:
            if layers[i].experts is None:
                continue
            st = stage.strategy(i)
            layouts[_layout(st)] += 1
            if st not in links:
                links[st] = strategy_links(cm.cluster, st, stage.devices, plan.expert_dispatcher)
            forward, backward = dispatch_s(layers[i], micro / st.data_degree, st, links[st], cm.model.compute_dtype_bytes)
            again = forward if st.checkpoint else 0.0  # the recomputed forward dispatches again
            per_rank[plan.rank_of_stage[s]] += plan.n_micro * (forward + backward + again)
    return ExpertSummary(moe_layers=len(moe), layouts=tuple(layouts.most_common()),
                         all_to_all_s=max(per_rank.values(), default=0.0), iteration_s=iteration_s,
                         overlapped=plan.expert_overlap, dispatcher=plan.expert_dispatcher)
