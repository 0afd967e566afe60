"""Galvatron-BMW (../shared/papers/galvatron-bmw.md) and the paper's comparison points, as planners.

Search space: planners/galvatron/space.py (decision trees, Takeaway #3). Dynamic program and
pipeline cost: planners/galvatron/dp.py (eq. (4), Algorithm 3, eq. (8)). The search of one request:
planners/galvatron/searcher.py; over batches: planners/galvatron/batch.py; the final choice among its
candidates, by the simulator: planners/galvatron/judging.py. Per-layer costs:
costs/strategy.py `strategy_arrays` (§V: compute split by the data and tensor degrees, TP
all-reduces, SDP gathers, DP all-reduce, CKPT recomputation, overlap slowdown; memory eqs.
(1)-(3) as costs/memory.py counts it) and `slice_gather_fraction` (the transformation cost R).

Algorithm 1 (Galvatron-Base): for the batch (or, with `batch_search = "max"`, for batches found
by doubling and bisection on multiples of `batch_step`), for every power-of-two PP degree P, the
even partition, every micro-batch count tried, one dynamic program per stage; the plan with the
least eq. (8) cost wins. Algorithm 2 (Galvatron-BMW): the same, but each (P, m, schedule) starts
from the even and the memory-balanced partitions (under the strategies found on the even one) and
moves the slowest stage's boundary layer to a neighbour while the paper's three limits hold (no
stage slower than the slowest before, none over its memory, none over the largest stage memory of
the time-balanced partition), through a queue; every partition popped is searched again.

Memory verdicts: each stage's whole memory is checked in exact bytes by the dynamic program, and
the plan once more by costs/memory.py `plan_memory` (the simulator's count); a stage that the
latter finds over its capacity (a term the arrays do not carry) is searched again with the
excess taken off its budget. A plan that cannot fit comes back with the judge's infeasible
prediction and a reason naming the layer or stage that failed.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from paraplan.planners import progress
from paraplan.planners.cut_search import search_cut
from paraplan.planners.galvatron.batch import best_batch, max_batch, search_batch
from paraplan.planners.galvatron.grid import grid_plan, stage_counts
from paraplan.planners.galvatron.grid import interleaves as grid_interleaves
from paraplan.planners.galvatron.judging import judge_candidates, rank_key
from paraplan.planners.galvatron.searcher import BMW_PARTITION, bmw_parts
from paraplan.planners.galvatron.space import (
    TREE_AXES,
    VARIANTS,
    Variant,
    held_stage_count,
    pipeline_degrees,
    pp_degrees,
    usable_devices,
)
from paraplan.planners.request import (
    BEST_SCHEDULE,
    FieldError,
    Judge,
    OptionSpec,
    PlanRequest,
    at_least,
    one_of,
)
from paraplan.planners.table import register
from paraplan.plans.axes import DATA, PIPELINE, SHARDED_DATA, TENSOR
from paraplan.plans.plan import Plan, SearchInfo

MEMORY_BINS = 512  # memory granularity: the device's capacity / 512 (32 MiB at 16 GiB), see docs/galvatron.md
BATCH_STEP = 8  # Table II's batch step


def _pp_choices(request: PlanRequest, variant: Variant) -> tuple[tuple[int, ...], str]:
    """The pipeline degrees to search and a note when the request's stage count cannot be kept."""
    n, layers = usable_devices(request), request.n_layers
    if variant.fixed_3d:
        allowed = (min(2, n, layers),)
    elif variant.pp == "one":
        allowed = (1,)
    elif variant.pp == "all":
        allowed = (pp_degrees(n, layers)[-1],)
    else:  # on a cluster that is not a power of two, also the degrees that use more of it
        allowed = pipeline_degrees(request)
    if variant.pp == "all" and request.n_stages in pp_degrees(n, layers) and not request.exact_stages:
        return (request.n_stages,), ""
    return held_stage_count(request, allowed, variant.name)


def interleaves(request: PlanRequest, variant: Variant) -> bool:
    """Whether the pipeline dimension also searches interleaved 1F1B ("Today's training II", item 2):
    for the variants with CKPT (Galvatron-Base, -BMW) in today's space (mixed precision), or asked
    for with `schedule best`; never in the paper's fp32 setting unless asked, nor when the request
    fixes a schedule (the grid's rule: grid.py `interleaves`)."""
    return variant.checkpoint and not variant.fixed_3d and grid_interleaves(request)


# The variants whose search spaces lie inside Galvatron-Base's and -BMW's (same per-layer trees or
# fewer, partitions and schedules they search too): their plans join the full variant's final
# candidates, ranked by the simulator (issue 31, item 1). galvatron-1f1b-biobj's partition follows its
# own strategies, so only BMW (which adjusts partitions) holds it; Base is inside BMW.
_INSIDE_BASE = (DATA.name, SHARDED_DATA.name, TENSOR.name, PIPELINE.name, "dp+tp", "dp+pp", "deepspeed-3d", "galvatron")
PORTFOLIO = {
    "galvatron-base": _INSIDE_BASE,
    "galvatron-bmw": (*_INSIDE_BASE, "galvatron-base", "galvatron-1f1b-biobj"),
}


def _search(request: PlanRequest, variant: Variant, options: dict):
    """The variant's own search (Algorithm 1 or 2 under the batch search asked for): its result and
    a note."""
    schedules = (request.schedule,) if request.schedule and request.schedule != BEST_SCHEDULE else variant.schedules
    schedules = tuple(str(x) for x in schedules)
    pps, note = _pp_choices(request, variant)
    bins, step = options.get("memory_bins", MEMORY_BINS), options.get("batch_step", BATCH_STEP)
    if options.get("batch_search", "given") == "max":
        return max_batch(request, variant, bins, schedules, pps, step), note
    if options.get("batch_search", "given") == "best":
        return best_batch(request, variant, bins, schedules, pps, step), note
    if options.get("pp_order", "ascending") == "descending":  # the same degrees, the deepest pipelines first
        pps = tuple(sorted(pps, reverse=True))
    return search_batch(request, variant, bins, schedules, pps, widen=True), note


GRID = "megatron-grid"  # planners/galvatron/grid.py: uniform layouts, in BMW's and Base's final choice


def _portfolio(request: PlanRequest, variant: Variant, options: dict, judge: Judge, own: tuple):
    """The variant's plan against the plans of the variants inside its space (PORTFOLIO), each found
    by that variant's own search on the same request (every pipeline degree's best, with the
    interleaved rewrites this variant judges: `judge_candidates`), all judged by the simulator: the
    best that fits.
    Eq. (8) and the simulator disagree where the simulator is finer (DDP's bucketed overlap, sends:
    GPT-2 XL at 16 GiB on 8 TITANs, DP+TP 718.5 ms against BMW's 728.0), and a search under a memory
    model the DP cannot count exactly (DDP buckets at the gradient sync) can miss a plan of a
    restricted set (ViT-Huge-32 at 12 GiB: 725.6 against 732.3 ms by eq. (8)); so the final choice
    among these candidates is the simulator's. `own` is the variant's `judge_candidates` result;
    returns it with the winning variant's name after the plan and prediction."""
    from paraplan.planners.galvatron.space import VARIANTS

    by_name = {v.name: v for v in VARIANTS}
    plan, prediction, *rest = own
    best = (plan, prediction, variant.name, *rest)
    for name in PORTFOLIO.get(variant.name, ()):
        try:
            result, _ = _search(request, by_name[name], options)
        except FieldError:  # e.g. a stage count this variant cannot hold
            continue
        if not np.isfinite(result.estimate_s):
            continue
        if request.n_stages is not None and result.plan.n_stages != plan.n_stages:
            continue  # the request's stage count, which this variant held, is kept
        theirs = judge_candidates(request, interleaves(request, variant), result, judge)
        if rank_key(theirs[1]) < rank_key(best[1]):
            best = (theirs[0], theirs[1], name, *theirs[2:])
            if theirs[1].feasible:  # a search stopped by its time limit keeps it (planners/progress.py)
                progress.offer(theirs[0], f"{variant.name}'s portfolio: {name}'s plan")
    if interleaves(request, variant):  # today's space: the uniform layouts too (planners/galvatron/grid.py)
        try:
            plan, p, count, line = grid_plan(request, judge)
        except FieldError:  # no uniform layout for this batch: the variant's own plan stands
            return best
        if request.n_stages is None or plan.n_stages == best[0].n_stages:
            if rank_key(p) < rank_key(best[1]):
                best = (plan, p, GRID, float("nan"), "even", line, count)
                progress.offer(plan, f"{variant.name}'s portfolio: {GRID}'s plan")
    return best


def galvatron_plan(request: PlanRequest, variant: Variant, options: dict, judge: Judge) -> Plan:
    """Plan `request` with one of the variants (Algorithm 1 or 2), optionally searching the batch."""
    t0 = time.perf_counter()
    bins = options.get("memory_bins", MEMORY_BINS)
    result, note = _search(request, variant, options)
    own = judge_candidates(request, interleaves(request, variant), result, judge)
    found_by = variant.name
    if variant.name in PORTFOLIO and options.get("portfolio", True) and options.get("batch_search", "given") != "max":
        plan, prediction, found_by, estimate, origin, runner_up, judged = _portfolio(request, variant, options, judge,
                                                                                    own)
    else:
        plan, prediction, estimate, origin, runner_up, judged = own
    # not in the paper: an interleaved plan's chunks cut among those balanced alike (planners/cut_search.py)
    plan, prediction, recut = search_cut(plan, prediction, judge)
    judged = judged + recut if judged else judged
    if not np.isfinite(estimate) and not prediction.feasible:
        reason = result.reason or prediction.reason
        if result.reason and prediction.reason:
            reason += f" (its least-bad plan: {prediction.reason})"
        prediction = replace(prediction, feasible=False, reason=f"{variant.name} finds nothing that fits: {reason}")
    opts = (("costs", request.costs.source), ("memory_bins", bins), ("batch_search", options.get("batch_search", "given")),
            ("estimate_iteration_s", float(estimate) if np.isfinite(estimate) else -1.0)) \
        + ((("found_by", found_by),) if found_by != variant.name else ()) \
        + ((("partition", origin),) if origin != "even" else ()) \
        + ((("schedules_judged", judged), ("schedule_runner_up", runner_up)) if judged else ())
    used = len(set(plan.devices))
    if used < request.n_devices and (usable_devices(request) < request.n_devices or not request.exact_stages):
        note = "; ".join(x for x in (f"{variant.name}: uses {used} of {request.n_devices} devices (stages of "
                                     "power-of-two groups, at most one a layer, §III-B)", note) if x)
    return replace(plan, prediction=prediction, search=SearchInfo(planner=variant.name, search_s=time.perf_counter() - t0,
                                                                  options=opts, note=note))


_OPTIONS = {
    "batch_search": OptionSpec("given", "given: plan the request's batch; max: the largest batch (a multiple of "
                               "batch_step) that fits; best: the batch of the highest throughput",
                               one_of("batch_search", ("given", "max", "best"))),
    "batch_step": OptionSpec(BATCH_STEP, "the step of the batch search", at_least("batch_step", 1)),
    "context_parallel": OptionSpec(1, "the largest context-parallel degree searched (a power of two; 1: none). "
                                      "Planned and simulated only: paraplan's runtime does not run CP",
                                   at_least("context_parallel", 1)),
    "bmw_partition": OptionSpec(BMW_PARTITION, "the partitions Algorithm 2 searches (BMW variants), '+'-joined from "
                                "even, memory (p_m alone), time (p_t alone), biobj (p_m and the balance adjustment)",
                                bmw_parts),
    "pp_order": OptionSpec("ascending", "the order pipeline degrees are searched in (the same degrees either way; "
                            "descending: the deepest pipelines first, for a search the time limit may stop)",
                            one_of("pp_order", ("ascending", "descending"))),
    "portfolio": OptionSpec(True, "Galvatron-Base / -BMW: also search the variants inside their space and keep the "
                            "simulator's best (off in `plan --planner auto`, where those variants are rows of "
                            "their own)", one_of("portfolio", (True, False))),
    "memory_bins": OptionSpec(MEMORY_BINS, "memory granularity of the dynamic program: capacity / memory_bins",
                              at_least("memory_bins", 16)),
}


FLAGSHIP = "galvatron-bmw"
# `--planner auto` starts these after the quick planners, in this order (planners/table.py: slow):
# the flagship first (it holds the best plans of the most requests and, stopped, keeps its best so
# far; Galvatron-Base runs in its process just before it: `rides_with`), the grid beside it (14-22 s
# at 64-1,024 GPUs); the other variants are quick, started after GroPipe (slow 4: the longest first,
# so that the comparison's last seconds are not one search alone on one core: at 1,024 H100s it
# ended 2.7 s after everything else)
SLOW = {FLAGSHIP: 1, GRID: 2, "galvatron-base": 3, "galvatron-1f1b-biobj": 5, "galvatron": 6}


def _in_comparison(name: str):
    """The options of Galvatron-Base or -BMW in `--planner auto`: their portfolio (the plans of the
    variants inside their space) left to the comparison when every one of those variants is a row of
    it already: the same plans, searched once instead of twice. Base's space lies inside BMW's: where
    both run, Base runs in BMW's process just before it (`rides_with`), and BMW's search reads Base's
    dynamic programs and judgements (issue 51: 35 s of Base's own at 1,024 GPUs)."""

    def options_in(options: dict, compared: frozenset) -> dict:
        options = dict(options)
        if set(PORTFOLIO[name]) | {GRID} <= compared and "portfolio" not in options:
            options["portfolio"] = False
        return options

    return options_in


def _register(variant: Variant) -> None:
    schedules = variant.schedules + ((BEST_SCHEDULE,) if variant.checkpoint and not variant.fixed_3d else ())

    @register(variant.name, variant.summary, schedules=schedules, options=_OPTIONS, slow=SLOW.get(variant.name, 0),
              in_comparison=_in_comparison(variant.name) if variant.name in PORTFOLIO else None,
              rides_with=FLAGSHIP if variant.name == "galvatron-base" else "",
              # space.py `variant_strategies`: the variants searching every axis lay experts out too
              expert_parallel=variant.dims == frozenset(TREE_AXES) and not variant.fixed_3d)
    def _planner(request: PlanRequest, options: dict, judge: Judge) -> Plan:
        return galvatron_plan(request, variant, options, judge)


for _variant in VARIANTS:
    _register(_variant)


@register(GRID, "uniform Megatron-style layouts (PP x TP x DP, ZeRO-1 and SP in mixed precision, the least "
          "recomputation that fits, interleaved 1F1B; a mixture of experts' EP x ETP) judged by the simulator",
          schedules=("1f1b", "gpipe", BEST_SCHEDULE), slow=SLOW[GRID], expert_parallel=True,
          options={"expert_parallel": OptionSpec(0, "a mixture of experts' expert-parallel degree, held (as torchtitan's "
                                                    "and NeMo's expert_parallel_degree is set by hand); 0: searched",
                                                 at_least("expert_parallel", 0))})
def _grid_planner(request: PlanRequest, options: dict, judge: Judge) -> Plan:
    t0 = time.perf_counter()
    note = stage_counts(request)[1]
    plan, prediction, count, line = grid_plan(request, judge)
    if not prediction.feasible:
        prediction = replace(prediction, reason=f"{GRID} finds nothing that fits: {prediction.reason}")
    return replace(plan, prediction=prediction, search=SearchInfo(
        planner=GRID, search_s=time.perf_counter() - t0,
        options=(("costs", request.costs.source), ("schedules_judged", count), ("schedule_runner_up", line)),
        note=note))
