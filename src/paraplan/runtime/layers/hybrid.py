"""What a plan with per-layer strategies must pass before it runs (launcher/launch.py's check, by
runtime/kinds.py: LayersRuntime): one line naming the layer and the reason, or None. Context
parallelism is refused earlier, as a plan feature (runtime/kinds.py: refuse; layers/parallelize.py:
apply_cp says why).
"""

from __future__ import annotations

from paraplan.plans.plan import LayerStrategy, Plan
from paraplan.runtime.layers.meshes import stage_strategies


def expert_refusal(module, st: LayerStrategy) -> str | None:
    """Why the layer's expert view does not run (layers/expert_parallel.py runs ep with plain data
    parallelism), or None."""
    from torch import nn

    from paraplan.models.moe_spec import moe_parts

    if st.etp > 1:
        return "expert tensor parallelism (etp) is planned and simulated, not run"
    if st.tp > 1 or st.sdp > 1 or st.cp > 1:
        return "expert parallelism runs with plain data parallelism only (tp, sdp and cp 1), not with this layout"
    parts = moe_parts(module)
    if not parts:
        return f"ep {st.ep} on a layer without routed experts"
    for name, part in parts:
        if isinstance(part.experts, nn.ModuleList) or not list(part.experts.parameters(recurse=False)):
            return f"{name}.experts: expert parallelism runs transformers 5's stacked experts, not a list of modules"
        count = next(part.experts.parameters(recurse=False)).shape[0]
        if count % st.ep:
            return f"ep {st.ep} does not divide {name}'s {count} experts"
    return None


def hybrid_refusal(plan: Plan, layers: list) -> str | None:
    """Why a plan with per-layer strategies cannot run (one line naming the layer), or None.
    `layers` is the model's (name, kind, module) list; only inspected, never run."""
    rows = plan.global_batch // plan.n_micro
    holders: dict[int, list[tuple[int, str, LayerStrategy]]] = {}
    for stage in plan.stages:
        for index, st in zip(stage.layers, stage_strategies(stage), strict=True):
            name, _, module = layers[index]
            where = f"layer {index} ({name}, {st})"
            if rows % st.data_degree:
                return (f"{where}: a micro-batch of {rows} samples does not split into {st.data_degree} "
                        f"data-parallel slices")
            if st.ep * st.etp > 1 and (reason := expert_refusal(module, st)):
                return f"{where}: {reason}"
            if st.zero and st.sdp > 1:
                return f"{where}: ZeRO-{st.zero} over the dp replicas of a sharded (sdp) layer is not run"
            if st.tp > 1:
                from paraplan.runtime.layers.tensor_parallel import strict_for, tp_refusal

                strict = strict_for(plan.model)  # outside the zoo every Linear must be sharded
                reason = tp_refusal(module, st.tp, strict=strict)
                if reason:
                    return f"{where}: no tensor parallelism: {reason}"
                if st.sequence_parallel and (reason := tp_refusal(module, st.tp, sequence_parallel=True,
                                                                  strict=strict)):
                    return f"{where}: no sequence parallelism: {reason}"
            for p in module.parameters():
                holders.setdefault(id(p), []).append((index, name, st))
    stage_of = {i: s for s, stage in enumerate(plan.stages) for i in stage.layers}
    for uses in holders.values():
        if any(st.zero for _, _, st in uses) and len({stage_of[i] for i, _, _ in uses}) > 1:
            i, name, st = uses[0]
            return (f"layer {i} ({name}, {st}): a weight tied across stages with ZeRO-{st.zero} is not run (its "
                    f"gradient is summed between stages after ZeRO's reduce-scatter)")
        layouts = {st.dims for _, _, st in uses}  # every axis's degree, in the layout's order
        if len(layouts) > 1:
            (i, a, sa), (j, b, sb) = uses[0], next(u for u in uses if u[2].dims != uses[0][2].dims)
            return (f"layers {i} ({a}, {sa}) and {j} ({b}, {sb}) share a parameter (tied weights) and must have "
                    f"the same strategy")
    return None
