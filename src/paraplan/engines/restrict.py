"""`paraplan plan --engine E`: the comparison restricted to the plans engine E can run (issue 32).

Every row whose plan the engine cannot express becomes "refused", naming the feature, so the best
row left is the best plan *that engine* can execute; the best before the restriction is kept
beside it (`Comparison.unrestricted`) so the user sees what the engine's limits cost.

Beyond refusing: a refused plan is often one small step from a plan the engine runs (Galvatron's
per-layer mix of two strategies, GPipe where the engine runs 1F1B, ZeRO-2 in DeepSpeed's pipeline
engine). `projections` makes those steps — one strategy for every layer (each of the plan's own,
the most used first), GPipe as 1F1B (the same bubble, less memory), ZeRO-2 as ZeRO-1 — and every
projection the engine accepts is judged by the simulator like any plan; the fastest that fits
joins the comparison as a row of its own ("<planner> for <engine>").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from paraplan.engines import engine_problem
from paraplan.engines.layout import ENGINE_NAMES
from paraplan.engines.shape import ModelShape
from paraplan.planners.auto import Comparison, Row
from paraplan.plans.plan import Plan, PlanError, Recompute, Stage
from paraplan.plans.schedules import Schedule

MAX_STRATEGIES = 4  # the plan's most used strategies tried as everyone's


def restrict(result: Comparison, engine: str, shape: ModelShape,
             judge: Callable[[str, Plan], Row] | None = None, sequence_parallel: frozenset = frozenset()) -> Comparison:
    """`judge(name, plan)`: the plan's row (simulated); without it no projections are made.
    `sequence_parallel`: the (layer, tp) pairs where SP runs (PlanRequest.sequence_parallel)."""
    unrestricted = result.row(result.best) if result.best else None
    rows, added = [], []
    for row in result.rows:
        if row.plan is not None and row.status == "ok":  # a plan that does not fit says so already
            problem = engine_problem(row.plan, engine, shape)
            if problem:
                row = replace(row, status="refused", reason=f"{ENGINE_NAMES[engine]} cannot run it: {problem}")
                if judge is not None:
                    added += _best_projection(row, engine, shape, judge, sequence_parallel)
        rows.append(row)
    rows += added
    feasible = sorted((r for r in rows if r.status == "ok"), key=lambda r: (r.iteration_s, r.planner))
    return replace(result, rows=tuple(rows), best=feasible[0].planner if feasible else None, engine=engine,
                   unrestricted=unrestricted)


def restrict_workload(result: Comparison, engine: str, w) -> Comparison:
    """`restrict` for a comparison of workload `w` (paraplan/workload.py: its built model's shape,
    its request's costs and sequence-parallel layers), as `paraplan plan --engine` and
    `paraplan.compare(..., engine=...)` both ask: projections judged on the request's costs, and the
    engine's own recipes as one more row (engines/recipes.py)."""
    from paraplan.engines.recipes import recipe_row
    from paraplan.engines.shape import shape_of
    from paraplan.planners.auto import judged_row

    shape = shape_of(w.built, w.built.ref)
    out = restrict(result, engine, shape, judge=lambda name, plan: judged_row(name, plan, w.request.costs),
                   sequence_parallel=w.request.sequence_parallel)
    return with_row(out, recipe_row(w.request, engine, shape))


def with_row(result: Comparison, row: Row) -> Comparison:
    """The comparison with one more row, its best chosen again."""
    rows = (*result.rows, row)
    feasible = sorted((r for r in rows if r.status == "ok"), key=lambda r: (r.iteration_s, r.planner))
    return replace(result, rows=rows, best=feasible[0].planner if feasible else None)


def _best_projection(row: Row, engine: str, shape: ModelShape, judge, sequence_parallel) -> list[Row]:
    name = f"{row.planner} for {engine}"
    judged = [r for r in (_judged(judge, name, p) for p in projections(row.plan, shape, sequence_parallel)
                          if engine_problem(p, engine, shape) is None) if r is not None]
    fits = sorted((r for r in judged if r.status == "ok"), key=lambda r: r.iteration_s)
    if not fits:
        return []
    return [replace(fits[0], reason=f"{row.planner}'s plan made runnable in {ENGINE_NAMES[engine]} "
                                    f"({len(judged)} projection{'s' if len(judged) != 1 else ''} judged)")]


def projections(plan: Plan, shape: ModelShape, sequence_parallel: frozenset = frozenset()) -> list[Plan]:
    """Plans one step from `plan` that engines run more often (module docstring), distinct. None of
    a plan whose workers run the forward and the backward of different layers (Bi-Partition's): no
    engine runs one, and per-layer strategies cover a stage's forward range only (the memory count
    of its backward range read past them: a traceback under `plan --engine`)."""
    if any(s.backward != s.layers for s in plan.stages):
        return []
    out = []
    for strategies in _uniform(plan, shape, sequence_parallel):
        for schedule in _schedules(plan):
            for zero_cap in (None, 1):
                candidate = replace(plan, stages=tuple(replace(s, strategies=st) for s, st in zip(plan.stages, strategies,
                                                                                                   strict=True)),
                                    schedule=schedule, prediction=None)
                if zero_cap is not None:
                    candidate = _cap_zero(candidate, zero_cap)
                if candidate not in out and candidate != replace(plan, prediction=None):
                    out.append(candidate)
    return out


def _uniform(plan: Plan, shape: ModelShape, sp: frozenset) -> list[tuple[tuple, ...]]:
    """Per stage, its layers' strategies: the plan's own, then each of its most used block
    strategies on every layer (SP only where it runs; a stage of other degree keeps its own)."""
    own = [tuple(s.strategy(i) for i in s.layers) for s in plan.stages]
    used = Counter(s.strategy(i) for s in plan.stages for i in s.layers if shape.kinds[i] == "block")
    out = [tuple(own)]
    for strategy, _ in used.most_common(MAX_STRATEGIES):
        per_stage = []
        for stage in plan.stages:
            if strategy.degree != len(stage.devices):
                per_stage.append(tuple(stage.strategy(i) for i in stage.layers))
                continue
            per_stage.append(tuple(_fit_layer(strategy, i, shape, sp) for i in stage.layers))
        out.append(tuple(per_stage))
    return out


def _fit_layer(strategy, layer: int, shape: ModelShape, sp: frozenset):
    if strategy.ep * strategy.etp > 1 and not _has_experts(layer, shape):
        strategy = replace(strategy, ep=1, etp=1)  # the embedding, the head and dense blocks have no experts
    if strategy.sequence_parallel and (layer, strategy.tp) not in sp:
        strategy = replace(strategy, sequence_parallel=False)
    if shape.kinds[layer] != "block" and strategy.recompute == Recompute.SELECTIVE:
        strategy = replace(strategy, recompute=Recompute.NONE)  # no attention core to recompute
    return strategy


def _judged(judge, name: str, plan: Plan):
    """The projection judged, or None where the simulator refuses it (a plan that is no plan of this
    model: it is not a candidate, not a traceback)."""
    try:
        return judge(name, plan)
    except PlanError:
        return None


def _has_experts(layer: int, shape: ModelShape) -> bool:
    """Whether the model's layer `layer` is a block with routed experts (engines/shape.py: moe_blocks,
    counted among the blocks)."""
    if shape.kinds[layer] != "block":
        return False
    return sum(kind == "block" for kind in shape.kinds[:layer]) in shape.moe_blocks


def _schedules(plan: Plan) -> list[Schedule]:
    if plan.schedule == Schedule.GPIPE and plan.n_stages > 1 and plan.n_micro >= plan.n_ranks:
        return [Schedule.GPIPE, Schedule.ONE_F_ONE_B]  # 1F1B: GPipe's bubble, less memory in flight
    return [plan.schedule]


def _cap_zero(plan: Plan, cap: int) -> Plan:
    stages = []
    for stage in plan.stages:
        strategies = tuple(replace(st, zero=min(st.zero, cap)) for st in (stage.strategies or ()))
        stages.append(Stage(stage.layers, stage.devices, stage.backward_layers, strategies))
    return replace(plan, stages=tuple(stages))
