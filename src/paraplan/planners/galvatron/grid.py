"""Uniform layouts judged by the simulator: the grid a practitioner searches by hand (Narayanan et
al. 2021 §3.3 and their Table 1 sweeps; NeMo's AutoConfigurator; DeepSpeed's autotuner), as the
planner `megatron-grid` and as candidates in Galvatron-Base's and -BMW's final choice.

Every layer has the same strategy, laid out as Megatron-LM lays it out:
  - a pipeline of P stages, P = 1, 2, 4, ... (at most one stage per layer), each on a group of
    n / P consecutive devices (n: the largest power of two the cluster has, as Galvatron's trees),
    and on a cluster that is not a power of two the degrees that use more of it (space.py
    `wider_pp_degrees`: stages of the largest power of two that n / P holds);
  - on each group TP t = 1, 2, 4, ... up to one node's devices (TP on the fastest links, inner-most,
    Narayanan et al. 2021 §3.3 takeaway #1), in mixed precision only where the runtime runs TP on
    every layer, the other d = n / (P t) devices data parallel;
  - in mixed precision (today's space: planners/galvatron/space.py) ZeRO-0 or ZeRO-1 over the d
    replicas and sequence parallelism with TP on the layers the runtime runs it on (Korthikanti et
    al. 2022 §4.2.2); in fp32, the paper's plain DP;
  - micro-batch counts m in {P, 2P, 4P, B / d (one sample per replica and micro-batch)} that give
    every replica whole samples;
  - the least recomputation (none, selective where the model has an attention core, full) under
    which the plan fits;
  - 1F1B (one stage: gradient accumulation, one micro-batch in flight), then, in today's space, interleaved 1F1B with every
    chunk count up to MAX_CHUNKS for the GRID_INTERLEAVED fastest pipelines and twice as many first
    by Narayanan et al.'s interleaved bubble (their closed form misranks the counts themselves: at
    16 micro-batches on 8 stages it puts 10 chunks fourth, the simulator first).
Each candidate is judged by the simulator (a hybrid plan's simulation is ~30 ms at 1,024 GPUs);
the fastest that fits wins.

Why (issue 31): Galvatron's dynamic program ranks strategies by eq. (8), which misprices what the
simulator counts (the stages' syncs summed, bucketed overlap), and keeps one plan per (P, m). On
a Llama-2-70B-like model on 1,024 A100-80GB at batch 1,024 its best was 8 stages of DP32 (ZeRO-1)
x TP4 at 32 micro-batches, 2.508 s interleaved with 5 chunks; the grid's 8 stages of DP64 (ZeRO-1)
x TP2 at 16 micro-batches, 10 chunks, take 2.392 s (TP2's all-reduces cost 6.5% of a layer's
compute against TP4's 21%, and 10 chunks shrink the bubble that 16 micro-batches leave). The
grid's layouts use only the strategies of Galvatron's trees in today's space (the same DP / TP,
ZeRO and SP choices, an even partition), so its plans join Base's and BMW's final choice; its
micro-batch counts (one sample per replica) and chunk counts (up to 16) go beyond what their own
searches try.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from paraplan.costs.expert_costs import common_expert_count, expert_groups
from paraplan.errors import FieldError
from paraplan.planners import progress
from paraplan.planners.cut_search import search_cut
from paraplan.planners.galvatron.grid_bounds import bounds, compute_s, pipeline_bound_s
from paraplan.planners.galvatron.space import even_partition, held_stage_count, pipeline_degrees, stage_group
from paraplan.planners.request import BEST_SCHEDULE, Judge, PlanRequest
from paraplan.plans.axes import DATA, EXPERT, SHARDED_DATA, TENSOR
from paraplan.plans.expert_dispatch import expert_dispatch_problem
from paraplan.plans.expert_overlap import expert_overlap_problem
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Prediction, Recompute, Stage
from paraplan.precision import is_mixed

GRID_INTERLEAVED = 4  # pipelines rewritten for interleaved 1F1B: the fastest, and twice as many by `_interleaved_guess`
MAX_CHUNKS = 16  # chunks per rank tried for those (every count up to this and one layer per chunk)


def tp_degrees(request: PlanRequest, group: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the devices of one node and the group."""
    per_node = min(len(node.devices) for node in request.costs.cluster.nodes)
    out, t = [], 1
    while t <= min(group, per_node):
        out.append(t)
        t *= 2
    return tuple(out)


def micro_counts(request: PlanRequest, n_stages: int, replicas: int, accumulation: bool = False) -> tuple[int, ...]:
    """P, 2P, 4P and one sample per replica (B / d), those giving each replica whole samples; the
    request's count where it fixes one. `accumulation`: without a pipeline, every power of two up to
    B / d too (gradient accumulation, the FSDP / ZeRO-3 recipe's way to fit a large batch)."""
    batch = request.batch
    wanted = (request.n_micro,) if request.n_micro else (n_stages, 2 * n_stages, 4 * n_stages, batch // replicas)
    if accumulation and n_stages == 1 and not request.n_micro:
        wanted += tuple(2**k for k in range(max(1, batch // replicas).bit_length()))
    return tuple(sorted({m for m in wanted if m >= 1 and batch % m == 0 and (batch // m) % replicas == 0
                         and (m >= n_stages or n_stages == 1)}))


# Megatron's layout: TP inner-most, then DP (no SDP in these layouts)
_TP_DP_ORDER = ",".join(a.name for a in (TENSOR, DATA, SHARDED_DATA))


def uniform_plan(request: PlanRequest, n_stages: int, tp: int, zero: int, recompute: str, n_micro: int,
                 sharded: bool = False, experts: tuple[int, int] = (1, 1)) -> Plan:
    """Every layer one strategy: P stages of n / P consecutive devices, TP inner-most, the rest DP
    (`sharded`: SDP, i.e. FSDP / ZeRO-3, instead); the layers cut evenly (Galvatron's even
    partition), SP with TP where the runtime runs it; a mixture of experts' layers with their routed
    experts over `experts` = (ep, etp) ranks (costs/expert_costs.py)."""
    n_layers = request.costs.model.n_layers
    model_layers = request.costs.model.layers
    group = group_size(request, n_stages)
    dp = group // tp
    base = (LayerStrategy(sdp=dp, tp=tp, recompute=recompute, order=_TP_DP_ORDER) if sharded and dp > 1 else
            LayerStrategy(dp=dp, tp=tp, zero=zero if dp > 1 else 0, recompute=recompute, order=_TP_DP_ORDER))
    cuts = np.concatenate([[0], np.cumsum(even_partition(n_layers, n_stages))]).astype(int)
    stages = []
    for s in range(n_stages):
        layers = range(int(cuts[s]), int(cuts[s + 1]))
        strategies = tuple(replace(base, sequence_parallel=True)
                           if tp > 1 and recompute != Recompute.FULL and (i, tp) in request.sequence_parallel
                           else base for i in layers)
        if experts != (1, 1):
            strategies = tuple(replace(st, ep=experts[0], etp=experts[1]) if model_layers[i].experts is not None
                               else st for i, st in zip(layers, strategies, strict=True))
        stages.append(Stage(LayerRange(layers.start, layers.stop), tuple(range(s * group, (s + 1) * group)),
                            strategies=strategies))
    return Plan(model=request.model_name, cluster=request.cluster_name, n_layers=n_layers,
                global_batch=request.batch, n_micro=n_micro,
                # one stage with several micro-batches is gradient accumulation: each micro-batch's
                # backward right after its forward (1F1B; GPipe would hold all m in flight)
                schedule="1f1b" if n_stages > 1 or n_micro > 1 else "gpipe",
                stages=tuple(stages), grad_sync="bucketed" if dp > 1 and base.dp > 1 else "none")


def _runs_tensor_parallel(request: PlanRequest, tp: int) -> bool:
    """Whether every layer runs TP over `tp` ranks in paraplan's runtime (PlanRequest.tensor_parallel;
    None: not known, as in fp32): a uniform layout has no layer without it."""
    allowed = request.tensor_parallel
    return tp == 1 or allowed is None or all((i, tp) in allowed for i in range(request.costs.model.n_layers))


def _recomputations(request: PlanRequest) -> tuple[str, ...]:
    model = request.costs.model
    selective = is_mixed(request.costs.precision) and any(x.attention_core_bytes.per_sample > 0 for x in model.layers)
    return (Recompute.NONE, *((Recompute.SELECTIVE,) if selective else ()), Recompute.FULL)


def stage_counts(request: PlanRequest) -> tuple[tuple[int, ...], str]:
    """The pipeline degrees searched, and a note where the request's stage count is not kept (as
    Galvatron's variants: space.py `held_stage_count`)."""
    return held_stage_count(request, pipeline_degrees(request), "megatron-grid")


def group_size(request: PlanRequest, n_stages: int) -> int:
    """Each stage's devices: the largest power of two that n / P holds."""
    return stage_group(request.n_devices, n_stages)


def interleaves(request: PlanRequest) -> bool:
    """Interleaved rewrites in today's space (mixed precision) or when asked, never when the
    request fixes a schedule (as Galvatron-Base and -BMW: planner.py `interleaves`)."""
    return request.schedule == BEST_SCHEDULE or (request.schedule is None and is_mixed(request.costs.precision))


def expert_layouts(request: PlanRequest, group: int, tp: int) -> tuple[tuple[int, int], ...]:
    """(ep, etp) of a mixture of experts' layers on a group of `group` devices with TP `tp`: (1, 1)
    (the experts follow the dense layout), and ep = 2, 4, ... dividing the group and every MoE
    layer's experts, with etp 1 and, with TP, etp = tp (Megatron-core's default folding); with TP only
    where every MoE layer runs sequence parallelism (plans/plan.py: Megatron-core's rule)."""
    model = request.costs.model
    moe = [i for i, layer in enumerate(model.layers) if layer.experts is not None]
    held = int(request.options.get("expert_parallel", 0))  # the planner option: one ep degree
    if not moe or (tp > 1 and not all((i, tp) in request.sequence_parallel for i in moe)):
        return ((1, 1),) if held <= 1 else ()
    experts = common_expert_count(model)
    out, ep = [(1, 1)], 2
    while ep <= group and group % ep == 0 and experts % ep == 0:
        out += [(ep, etp) for etp in dict.fromkeys((1, tp)) if group % (ep * etp) == 0]
        ep *= 2
    return tuple(x for x in out if not held or x[0] == held)


def _check_held_experts(request: PlanRequest) -> None:
    """The `expert_parallel` option names a degree the model's experts can take, or one line."""
    held = int(request.options.get("expert_parallel", 0))
    counts = {x.experts.experts for x in request.costs.model.layers if x.experts is not None}
    if held > 1 and not counts:
        raise FieldError("options", f"expert_parallel={held}: the model has no routed experts")
    if held > 1 and any(c % held for c in counts):
        raise FieldError("options", f"expert_parallel={held} does not divide the model's {min(counts)} experts")


# the data-parallel kinds a layout's replicas take, as (sharded, ZeRO stage): Megatron's (plain DP,
# and ZeRO-1 as its distributed optimizer, in mixed precision), the grid's own
MEGATRON_FAMILIES = ((False, 0), (False, 1))


def grid_candidates(request: PlanRequest, judge: Judge, families=None, accept=None,
                    accumulation: bool = False) -> list[tuple[Plan, Prediction]]:
    """The uniform layouts of the grid judged (module docstring), each at the least recomputation
    that fits (where none fits, with full recomputation), best first. Layouts are judged in order of
    their compute (`compute_s`), and one whose compute is no less than the best plan so far is not
    judged: it cannot win. `families`: the replicas' kinds, (sharded, ZeRO stage) pairs (default:
    MEGATRON_FAMILIES in mixed precision, plain DP in fp32); `accept(plan)`: whether a layout may be
    judged at all (an engine's own refusals: engines/recipes.py); `accumulation`: micro_counts'."""
    today = is_mixed(request.costs.precision)
    families = families or (MEGATRON_FAMILIES if today else ((False, 0),))
    _check_held_experts(request)
    judge, memory = memory_first(judge)
    layouts = []
    for n_stages in stage_counts(request)[0]:
        group = group_size(request, n_stages)
        for tp in tp_degrees(request, group):
            if not _runs_tensor_parallel(request, tp):
                continue
            kinds = families if group // tp > 1 else ((False, 0),)
            for (sharded, zero), experts in itertools.product(dict.fromkeys(kinds), expert_layouts(request, group, tp)):
                for n_micro in micro_counts(request, n_stages, group // tp, accumulation):
                    plans = [uniform_plan(request, n_stages, tp, zero, r, n_micro, sharded, experts)
                             for r in _recomputations(request)
                             if experts == (1, 1) or tp == 1 or r != Recompute.FULL]  # EP with TP needs SP
                    plans = [p for p in plans if accept is None or accept(p)]
                    if plans:  # ordered by the first's bounds; the others' priced only when reached
                        layouts.append((bounds(request, plans[0]), plans))
    layouts.sort(key=lambda x: x[0][0])  # the likeliest winners first: the best so far prunes the rest
    judged: list[tuple[Plan, Prediction]] = []
    deferred: list[tuple[float, Plan]] = []  # fit, cannot win as one chunk, may interleaved (`_interleaved`)
    best = np.inf
    rewrites = interleaves(request)
    for first, tries in layouts:
        for k, plan in enumerate(tries):
            bound, compute = first if k == 0 else bounds(request, plan)
            if compute >= best:
                break  # more recomputation only adds compute: no schedule of this layout can win
            if bound >= best:  # no faster as 1F1B than the best so far; its interleaved rewrite may be
                if rewrites and memory(plan) is None:
                    deferred.append((bound, plan))
                    break
                continue
            prediction = judge(plan)
            if prediction.feasible and prediction.iteration_s < best:  # for a search stopped by its limit
                best = prediction.iteration_s
                progress.offer(plan, f"megatron-grid: {plan.n_stages} stage(s), TP{plan.stages[0].strategies[0].tp}")
            if prediction.feasible or k == len(tries) - 1:
                judged.append((plan, prediction))
                break
    if not judged:  # no layout at all (pruning cannot empty it: the first layout is always judged)
        held = "".join(part for part in (
            f", {request.n_stages} stages held" if request.n_stages is not None and request.exact_stages else "",
            f", {request.n_micro} micro-batches fixed" if request.n_micro is not None else "") if part)
        raise FieldError("batch", f"megatron-grid has no uniform layout of {request.n_devices} devices for a global "
                                  f"batch of {request.batch}{held} (every data-parallel rank and micro-batch needs a "
                                  "sample of its own, and 1F1B a micro-batch per stage); give a larger batch"
                                  + (", fewer devices or other fixed counts" if held else " or fewer devices"))
    judged.sort(key=_key)
    if rewrites:
        judged = sorted(judged + _interleaved(request, judged, judge, best, accept, deferred), key=_key)
    if request.costs.engine == "megatron":  # an engine's own choices (of the three engines, Megatron-LM's alone)
        judged = sorted(judged + _deduplicated(request, judged, judge, accept), key=_key)
        judged = sorted(judged + _overlapped(request, judged, judge, accept), key=_key)
    return judged


def memory_first(judge: Judge) -> tuple[Judge, Callable[[Plan], Prediction | None]]:
    """(the judge asked only about plans that fit, the memory's verdict alone): a plan that does not
    fit gets its memory's verdict (simulator/predict.py: memory_verdict, iteration_s inf) without
    its timeline. The grid ranks such plans by memory alone (`_key`), so its choices are the same;
    `grid_plan` times the one it returns when nothing fits. A judge without `memory` (the registry's
    SimulatorJudge has it) is asked about every plan."""
    verdict = getattr(judge, "memory", None)

    def memory(plan: Plan) -> Prediction | None:
        return verdict(plan) if verdict is not None else None

    def first(plan: Plan) -> Prediction:
        return memory(plan) or judge(plan)

    return first, memory


def _deduplicated(request: PlanRequest, judged, judge: Judge, accept=None) -> list[tuple[Plan, Prediction]]:
    """DeepEP's dispatcher (plans/expert_dispatch.py) on the GRID_INTERLEAVED fastest expert-parallel
    plans that fit, allow it and spread an EP group over nodes (inside one node it moves the same
    bytes as the alltoall dispatcher: costs/deepep.py). Judged by the simulator beside the plain
    dispatcher, as Megatron-MoE-ModelZoo runs DeepEP for some models and alltoall for others."""
    cluster = request.costs.cluster
    out = []
    for plan in _fitting(request, judged):
        if len(out) == GRID_INTERLEAVED:
            break
        candidate = replace(plan, expert_dispatcher="deepep")
        spans = any(len({cluster.devices[d].node for d in expert_groups(x, stage.devices).get(EXPERT, ())}) > 1
                    for stage in plan.stages for x in stage.strategies if x.ep > 1)
        if spans and expert_dispatch_problem(candidate) is None and (accept is None or accept(candidate)):
            out.append((candidate, judge(candidate)))
    return out


def _fitting(request: PlanRequest, judged) -> list[Plan]:
    """The judged plans that fit, fastest first, in the request's precision (the grid's candidates
    take it from make_plan), which the engines' rules for their own choices read."""
    return [replace(plan, **request.costs.plan_precision) for plan, p in judged if p.feasible]


def _overlapped(request: PlanRequest, judged, judge: Judge, accept=None) -> list[tuple[Plan, Prediction]]:
    """Megatron-LM's all-to-all overlap (plans/expert_overlap.py) on the GRID_INTERLEAVED fastest
    expert-parallel plans that fit and where Megatron-LM allows it: Megatron-MoE-ModelZoo turns it
    on for some runs and not others, so the simulator judges both."""
    out = []
    for plan in [p for p in _fitting(request, judged) if expert_overlap_problem(p) is None][:GRID_INTERLEAVED]:
        candidate = replace(plan, expert_overlap=True)
        if accept is None or accept(candidate):
            out.append((candidate, judge(candidate)))
    return out


def _interleaved(request: PlanRequest, judged, judge: Judge, best: float, accept=None,
                 deferred=()) -> list[tuple[Plan, Prediction]]:
    """Interleaved 1F1B rewrites (planners/schedule_variants.py), 2..MAX_CHUNKS chunks per rank, of
    the GRID_INTERLEAVED fastest pipelines that fit and twice as many first by `_interleaved_guess`
    (a 1F1B bubble that chunks shrink hides those: 16 micro-batches on 8 stages); not of a pipeline
    whose compute is no less than the best plan so far. `deferred`: (1F1B bound, plan) of pipelines
    that fit but whose 1F1B was not timed (it could not win), after the timed ones."""
    from paraplan.planners.schedule_variants import rewrite

    pipelines = [(compute_s(request, plan), plan) for plan, p in judged if p.feasible and plan.n_stages > 1]
    pipelines += [(compute_s(request, plan), plan) for _, plan in sorted(deferred, key=lambda x: x[0])
                  if plan.n_stages > 1]
    chosen = {id(plan): (c, plan) for c, plan in pipelines[:GRID_INTERLEAVED]}
    chosen.update({id(plan): (c, plan) for c, plan in sorted(pipelines, key=_interleaved_guess)[:2 * GRID_INTERLEAVED]})
    out = []
    for compute, plan in sorted(chosen.values(), key=lambda x: x[0]):
        for v in range(2, min(MAX_CHUNKS, plan.n_layers // plan.n_stages) + 1):
            if compute >= best:
                break
            try:
                candidate = rewrite(plan, request.costs, "interleaved-1f1b", v)
            except ValueError:
                continue
            if accept is not None and not accept(candidate):
                continue
            # no faster than the best so far by more than the re-cut's margin (`grid_plan`): its fill,
            # work and drain (grid_bounds.py) say so before any timeline (Llama 3 70B at 1,024 H100s:
            # 42 rewrites simulated at 0.12 s each)
            if not candidate.expert_overlap and pipeline_bound_s(request, candidate) >= best * (1 + RECUT_WITHIN):
                continue
            prediction = judge(candidate)
            out.append((candidate, prediction))
            if prediction.feasible and prediction.iteration_s < best:
                best = prediction.iteration_s
                progress.offer(candidate, f"megatron-grid: interleaved, {v} chunks per rank")
    return out


def _interleaved_guess(x: tuple[float, Plan]) -> float:
    """Narayanan et al. 2021 §2.2.2's interleaved 1F1B time with the most chunks, (1 + (P - 1) /
    (v m)) x compute: an order to rewrite pipelines in, not a bound (sends and syncs add to it)."""
    compute, plan = x
    most = min(MAX_CHUNKS, plan.n_layers // plan.n_stages)
    return compute * (1 + (plan.n_stages - 1) / (most * plan.n_micro))


def _key(x: tuple[Plan, Prediction]) -> tuple[bool, float]:
    p = x[1]
    if p.feasible:
        return (False, p.iteration_s)
    return (True, max(m.peak_bytes / m.capacity_bytes for m in p.memory) if p.memory else float("inf"))


def _label(plan: Plan) -> str:
    return f"{plan.schedule} v={plan.virtual_stages}" if plan.virtual_stages > 1 else str(plan.schedule)


RECUT_WITHIN, RECUT_PLANS = 0.01, 3  # the near-ties re-cut (grid_plan), and at most how many


def grid_plan(request: PlanRequest, judge: Judge) -> tuple[Plan, Prediction, int, str]:
    """The grid's fastest plan that fits (else the one nearest to fitting), its prediction, how many
    candidates were judged, and the next best of another schedule or chunk count in one line ("" if
    none), as Galvatron's `_interleaved` says it."""
    judged = grid_candidates(request, judge)
    plan, prediction = judged[0]
    if math.isinf(prediction.iteration_s):  # nothing fits: the nearest, timed (memory_first)
        prediction = judge(plan)
    # the chunks' cut among those balanced alike, by the simulator (planners/cut_search.py), of the
    # fastest plan and of the interleaved ones within RECUT_WITHIN of it: Llama 2 70B at 1,024 A100s,
    # 4 ranks of 10 chunks 2.586 s as cut by balance, 11 chunks 2.591 s, re-cut 2.572 s
    recut = 0
    for other, p in ([x for x in judged if x[1].feasible and x[0].virtual_stages > 1
                      and x[1].iteration_s <= prediction.iteration_s * (1 + RECUT_WITHIN)][:RECUT_PLANS]
                     if prediction.feasible else ()):
        other, p, count = search_cut(other, p, judge)
        recut += count
        if p.iteration_s < prediction.iteration_s:
            plan, prediction = other, p
    other = next((x for x in judged[1:] if x[1].feasible and _label(x[0]) != _label(plan)), None)
    line = (f"{_label(other[0])}: {other[1].iteration_s:.4g} s ({other[1].iteration_s / prediction.iteration_s - 1:+.1%})"
            if other and prediction.feasible else "")
    if prediction.feasible:
        progress.offer(plan, f"megatron-grid: {len(judged)} layouts judged")
    return plan, prediction, len(judged) + recut, line
