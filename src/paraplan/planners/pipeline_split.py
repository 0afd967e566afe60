"""The frame of the split planners (CSIMD's, planners/csimd/planner.py, and the partition
baselines', planners/baselines/split.py): contiguous stages, one device each, GPipe or 1F1B.

Each split planner is a `Divider` registered with `register_split`, which also puts it in the
planner table (planners/table.py); this module writes its answer as a Plan. `DIVIDERS` holds the
split planners registered so far (planners/registry.py loads them all). Every split planner solves
the same problem on the same numbers: the per-layer time functions of a CostModel (analytic or
measured) evaluated at the micro-batch size B / p for every candidate micro-batch count p (the
divisors of B, so micro-batches are whole), with the link between the first two devices pricing
activations and gradients. Each returns a division and a p, judged by
CSIMD eq. (8); the Plan's prediction comes from the simulator.

With devices of several kinds among the stages' devices, the problem also holds each stage's own
arrays (`by_stage`: row s for device s, its compute and its link to device s + 1; CSIMD's cost
model takes each stage's terms from its device, planners/stage_division.py): eq. (8) (`time_s`)
and csimd's searches use them. The partition baselines divide with device 0's arrays (`row`) as
their papers assume devices alike (they say so in the comparison) and are judged on each stage's
own; the simulator prices each stage on its own device.

Memory: stage s runs on device s, and where a planner searches (csimd's divisions and p, the
baselines' p, brute-force's divisions) only candidates that fit count, by the simulator's own
memory count in O(1) a stage (planners/fit.py); when none fits, the candidate closest to fitting
comes back and its prediction says it does not. csimd-paper (Algorithm 1 as printed) and random
(GPipe-R) stay memory-blind, as their papers are.

Stage counts: a planner may use fewer stages than the request's n_stages (another cut can cost
more than it saves); the plan then says so and why in SearchInfo.note, from the best plan with
exactly that many stages planned and judged the same way. exact_stages holds it to the count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from paraplan.costs.memory import out_of_memory_reason, plan_memory
from paraplan.costs.model import CostModel
from paraplan.errors import UnknownNameError
from paraplan.planners.fit import SplitMemory, misfit
from paraplan.planners.request import (
    BEST_SCHEDULE,
    FieldError,
    Judge,
    OptionSpec,
    PlanRequest,
    choices_near,
    divisors,
    validated_options,
)
from paraplan.planners.stage_division import bounds_of, total_time
from paraplan.planners.table import PLANNERS as TABLE
from paraplan.planners.table import register
from paraplan.plans.plan import LayerRange, Plan, SearchInfo, Stage
from paraplan.plans.schedules import MULTI_CHUNK


@dataclass(frozen=True)
class SplitProblem:
    """Rows: candidate micro-batch counts; columns: layers (planners/stage_division.py conventions)."""

    batch: int
    n_stages: int
    n_micro_values: tuple[int, ...]
    h_p: np.ndarray
    h_m: np.ndarray
    j_p: np.ndarray
    j_m: np.ndarray
    param_bytes: np.ndarray
    # devices of several kinds: (h_p, h_m, j_p, j_m), each (rows x stages x layers); None when alike
    by_stage: tuple[np.ndarray, ...] | None = None

    @property
    def n_layers(self) -> int:
        return self.h_p.shape[1]

    def row(self, n_micro: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Device 0's time functions at p = n_micro (the baselines' arrays)."""
        r = self.n_micro_values.index(n_micro)
        return self.h_p[r], self.h_m[r], self.j_p[r], self.j_m[r]

    def stage_arrays(self) -> tuple[np.ndarray, ...]:
        """Every stage's own time functions where devices differ ((R, S, K)), else device 0's (R, K)."""
        return self.by_stage or (self.h_p, self.h_m, self.j_p, self.j_m)

    def stage_row(self, n_micro: int) -> tuple[np.ndarray, ...]:
        """Every stage's own time functions at p = n_micro: (S, K) where devices differ, else (K,)."""
        r = self.n_micro_values.index(n_micro)
        return tuple(x[r] for x in self.stage_arrays())

    def time_s(self, cuts, n_micro: int) -> float:
        """T(lambda, p), CSIMD eq. (8), each stage on its own device."""
        return total_time(*self.stage_row(n_micro), cuts, n_micro)


def build_problem(cm: CostModel, batch: int, n_stages: int, max_micro: int | None = None) -> SplitProblem:
    if batch < 1:
        raise FieldError("batch", f"must be positive, got {batch}")
    k = cm.model.n_layers
    if not 1 <= n_stages <= min(k, cm.cluster.n_devices):
        raise FieldError("stages", f"need 1..{min(k, cm.cluster.n_devices)} (layers {k}, devices "
                                   f"{cm.cluster.n_devices}), got {n_stages}")
    ps = tuple(p for p in divisors(batch) if max_micro is None or p <= max_micro)
    rows = _time_rows(cm, batch, ps, 0)
    by_stage = None
    if len({cm.cluster.device(s).name for s in range(n_stages)}) > 1:  # stage s on device s
        made: dict = {}  # stages on devices of one kind with one link to the next share their rows
        per_device = [_shared_rows(made, cm, batch, ps, s) for s in range(n_stages)]
        by_stage = tuple(np.stack([d[key] for d in per_device], axis=1) for key in ("h_p", "h_m", "j_p", "j_m"))
    return SplitProblem(batch=batch, n_stages=n_stages, n_micro_values=ps, by_stage=by_stage,
                        param_bytes=np.array([float(layer.param_bytes) for layer in cm.model.layers]), **rows)


def _shared_rows(made: dict, cm: CostModel, batch: int, ps, device: int) -> dict[str, np.ndarray]:
    key = (cm.cluster.device(device).name, _link_out(cm, device))
    if key not in made:
        made[key] = _time_rows(cm, batch, ps, device)
    return made[key]


def _link_out(cm: CostModel, device: int):
    """`device`'s link to the next (the one before for the last device, whose stage sends nothing)."""
    n = cm.cluster.n_devices
    return cm.cluster.link(min(device, n - 2), min(device, n - 2) + 1) if n > 1 else cm.cluster.nodes[0].intra_link


def _time_rows(cm: CostModel, batch: int, ps, device: int) -> dict[str, np.ndarray]:
    """The time functions of `device` and its link to the next (`_link_out`), one row per
    micro-batch count."""
    costs = cm.compute(device)
    link = _link_out(cm, device)
    rows = {"h_p": [], "h_m": [], "j_p": [], "j_m": []}
    for p in ps:
        micro = batch / p
        fwd, bwd, _, _ = costs.arrays(micro)
        out = np.array([link.transfer_s(layer.output_bytes.at(micro)) for layer in cm.model.layers])
        grad_in = np.array([0.0] + [link.transfer_s(layer.output_grad_bytes.at(micro))
                                    for layer in cm.model.layers[:-1]])
        rows["h_p"].append(fwd)
        rows["h_m"].append(out)
        rows["j_p"].append(bwd)
        rows["j_m"].append(grad_in)
    return {key: np.array(v) for key, v in rows.items()}


def split_memory(cm: CostModel, problem: SplitProblem, schedule: str) -> SplitMemory:
    """The O(1) memory check of the problem's candidates: stage s on device s (planners/fit.py)."""
    capacities = [cm.cluster.device(s).memory_bytes for s in range(problem.n_stages)]
    return SplitMemory.for_micro_counts(cm, problem.batch, problem.n_micro_values, schedule, capacities)


def choose(problem: SplitProblem, candidates, memory: SplitMemory | None) -> tuple[tuple[int, ...], int]:
    """The best (cuts, p) by eq. (8) among those that fit; when none does, the one closest to
    fitting (the smallest largest peak / capacity). Without a memory check, the best by eq. (8)."""
    def key(candidate):
        cuts, p = candidate
        t = problem.time_s(cuts, p)
        if memory is None:
            return (0.0, t)
        return (misfit(memory.overflow(problem.n_micro_values.index(p), cuts)), t)

    cuts, p = min(candidates, key=key)
    return tuple(int(c) for c in cuts), p


def micro_counts(problem: SplitProblem, n_micro: int | None) -> tuple[int, ...]:
    """The candidate micro-batch counts: the fixed one, or every one of the problem."""
    return (n_micro,) if n_micro else problem.n_micro_values


def best_over_p(problem: SplitProblem, divide, n_micro: int | None, memory=None) -> tuple[tuple[int, ...], int]:
    """A division for each candidate p (or the fixed one), keeping the best T that fits."""
    return choose(problem, [(divide(p), p) for p in micro_counts(problem, n_micro)], memory)


Divider = Callable[..., "tuple[tuple[int, ...], int, dict]"]
# planner name -> (problem, fixed p or None, options, memory check or None, exactly) -> (cuts, p, notes)
DIVIDERS: dict[str, Divider] = {}
OPTIONS: dict[str, Mapping[str, OptionSpec]] = {}  # planner name -> its options


def register_split(name: str, summary: str, divider: Divider, options: Mapping[str, OptionSpec] | None = None, *,
                   not_compared: str = "", alike_devices: bool = True) -> None:
    """Add a split planner: its divider here, and the planner (GPipe or 1F1B) to the planner table
    (`not_compared`: planners/table.py PlannerSpec; `alike_devices`: it divides with device 0's
    arrays, `SplitProblem.row`, rather than each stage's, `stage_arrays`)."""
    DIVIDERS[name] = divider
    OPTIONS[name] = dict(options or {})
    register(name, summary, schedules=("gpipe", "1f1b", *MULTI_CHUNK, "best"), options=options,
             not_compared=not_compared, alike_devices=alike_devices)(
        lambda request, values, judge: _plan(request, values, name, judge))


def with_odpa(problem: SplitProblem, cuts, n_micro: int | None, memory=None):
    """A division fixed by its baseline; p fixed by the user or chosen by ODPA (CSIMD Algorithm 4,
    eq. (8) at every p) among the p where the division fits."""
    return choose(problem, [(cuts, p) for p in micro_counts(problem, n_micro)], memory) + ({},)


def solve(problem: SplitProblem, planner: str, n_micro: int | None = None, options: dict | None = None,
          memory: SplitMemory | None = None, exactly: bool = False) -> tuple[tuple[int, ...], int, dict]:
    """(cuts, p, notes) for one planner. A fixed n_micro applies to the baselines (GPipe-E-p).
    memory: only (cuts, p) that fit are chosen where the planner searches (None: memory-blind);
    exactly: exactly problem.n_stages stages."""
    if n_micro is not None and n_micro not in problem.n_micro_values:
        raise FieldError("micro_batches", f"{n_micro} does not divide the batch {problem.batch} "
                                          f"({choices_near(problem.batch, n_micro)})")
    defaults = {name: spec.default for name, spec in OPTIONS.get(planner, {}).items()}
    return DIVIDERS[planner](problem, n_micro, {**defaults, **(options or {})}, memory, exactly)


def _duration(t: float) -> str:
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _divide(request: PlanRequest, options: dict, planner: str, n_stages: int, exactly: bool,
            judge: Judge | None = None) -> tuple[Plan, dict]:
    """One planner's answer as a Plan (without prediction, unless the schedule was searched), and
    its search notes."""
    cm = request.costs
    if request.schedule in MULTI_CHUNK:  # one kind asked: its chunk counts searched as `best` does
        if judge is None:
            raise FieldError("schedule", f"{request.schedule} plans are chosen by the simulator; plan through the "
                                         "planner table (make_plan), which gives the planner its judge")
        kinds = tuple((request.schedule, v) for v in CHUNK_COUNTS[request.schedule])
        # the kind needs a pipeline: the stage count is held (a planner may otherwise choose one stage)
        return _search_schedule(request, options, planner, n_stages, exactly or n_stages > 1, judge, kinds)
    if request.schedule == BEST_SCHEDULE and judge is not None:
        return _search_schedule(request, options, planner, n_stages, exactly, judge)
    schedule = "1f1b" if request.schedule == BEST_SCHEDULE else request.schedule or "gpipe"
    problem = build_problem(cm, request.batch, n_stages)
    memory = split_memory(cm, problem, schedule)
    cuts, p, notes = solve(problem, planner, request.n_micro, options, memory, exactly)
    return _as_plan(request, cuts, p, schedule), {"eq8_time_s": problem.time_s(cuts, p), **notes}


def _as_plan(request: PlanRequest, cuts, n_micro: int, schedule: str) -> Plan:
    bounds = bounds_of(cuts, request.n_layers)
    stages = tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)))
    return Plan(model=request.model_name, cluster=request.cluster_name, n_layers=request.n_layers,
                global_batch=request.batch, n_micro=n_micro, schedule=schedule, grad_sync="none", stages=stages)


# the chunk counts per device tried when one multi-chunk kind is asked (`--schedule interleaved-1f1b`)
CHUNK_COUNTS = {"interleaved-1f1b": (2, 3, 4), "looped-bfs": (2, 3, 4), "interleaved-zb": (1, 2, 3, 4),
                "zb-2p": (1,), "zbv": (2,), "dualpipev": (2,)}


def _search_schedule(request: PlanRequest, options: dict, planner: str, n_stages: int, exactly: bool,
                     judge: Judge, kinds=None) -> tuple[Plan, dict]:
    """--schedule best: for each micro-batch count the planner's own cut (eq. (8) under 1F1B's
    memory, the papers' model), then every schedule kind and chunk count on it, judged by the
    simulator (planners/schedule_search.py)."""
    from paraplan.planners import schedule_search

    problem = build_problem(request.costs, request.batch, n_stages)
    memory = split_memory(request.costs, problem, "1f1b")
    eq8: dict[int, float] = {}

    def base_for(p: int) -> Plan:
        cuts, _, _ = solve(problem, planner, p, options, memory, exactly)
        eq8[p] = problem.time_s(cuts, p)
        return _as_plan(request, cuts, p, "1f1b")

    try:
        best, scored = schedule_search.search(base_for, micro_counts(problem, request.n_micro), request.costs, judge,
                                              **({"kinds": kinds} if kinds else {}))
    except ValueError as exc:
        raise FieldError("schedule", f"no {request.schedule} plan: {exc}") from None
    return best, {"eq8_time_s": eq8[best.n_micro], "schedules_judged": len(scored),
                  "schedule_runner_up": schedule_search.runner_up(scored)}


def _verdict(request: PlanRequest, plan: Plan, eq8_s: float, judge: Judge | None) -> tuple[Plan, float, str]:
    """(plan with the judge's prediction when there is a judge, its time, '' or why it does not fit).
    Without a judge: eq. (8) and the memory model (costs/memory.py), the judge's own count."""
    if judge is not None:
        plan = replace(plan, prediction=plan.prediction or judge(plan))
        return plan, plan.prediction.iteration_s, plan.prediction.reason if not plan.prediction.feasible else ""
    cm = request.costs
    capacities = {d: cm.cluster.device(d).memory_bytes for d in plan.devices}
    return plan, eq8_s, out_of_memory_reason(plan_memory(plan, cm.model, capacities, cm.memory)[0])


def _fewer_stages_note(request: PlanRequest, options: dict, planner: str, chosen: Plan, chosen_s: float,
                       judge: Judge | None) -> str:
    """One line: why the plan has fewer stages than the request's, from the best plan with exactly
    that many, planned and judged the same way."""
    n = request.n_stages
    forced, info = _divide(request, options, planner, n, exactly=True, judge=judge)
    forced, forced_s, reason = _verdict(request, forced, info["eq8_time_s"], judge)
    times = f"{n} stages: {_duration(forced_s)} vs {_duration(chosen_s)}"
    if reason:
        why = f"the best {n} stages do not fit ({reason})"
    elif forced_s > chosen_s:
        why = f"splitting {request.model_name} over {request.cluster_name} costs more than it saves ({times})"
    elif forced_s == chosen_s:
        why = f"splitting {request.model_name} over {request.cluster_name} saves nothing ({times})"
    else:  # a heuristic (or a search out of work) that stopped short of a faster division
        why = f"its division leaves devices idle although more stages would be faster ({times})"
    return (f"{planner}: {_count(chosen.n_stages, 'stage')} on {chosen.n_stages} of {request.n_devices} devices — "
            f"{why}; exact_stages forces {n}")


def _plan(request: PlanRequest, options: dict, planner: str, judge: Judge | None = None) -> Plan:
    """Search, then write the answer as a Plan; with a judge, its prediction filled in."""
    n_stages = request.n_stages or min(request.n_layers, request.n_devices)
    exactly = request.exact_stages
    if exactly and n_stages > request.n_layers:
        raise FieldError("stages", f"exactly {n_stages} stages need a layer each; {request.model_name} has "
                                   f"{request.n_layers}")
    t0 = time.perf_counter()
    plan, notes = _divide(request, options, planner, n_stages, exactly, judge)
    note = ""
    if request.n_stages and plan.n_stages < request.n_stages and not exactly:
        plan, chosen_s, _ = _verdict(request, plan, notes["eq8_time_s"], judge)
        note = _fewer_stages_note(request, options, planner, plan, chosen_s, judge)
    elapsed = time.perf_counter() - t0
    info = {"stages": n_stages, "costs": request.costs.source, **notes, **{k: str(v) for k, v in options.items()}}
    if exactly:
        info["exact_stages"] = True
    return replace(plan, search=SearchInfo(planner=planner, search_s=elapsed, options=tuple(sorted(info.items())),
                                           note=note))


def plan_split(cm: CostModel, model_name: str, cluster_name: str, batch: int, planner: str,
               n_stages: int | None = None, n_micro: int | None = None, exact_stages: bool = False,
               **options) -> Plan:
    """One split planner (registered: planners/registry.py loads them all) on a cost model, without
    prediction (tests and benchmarks)."""
    if planner not in DIVIDERS:
        raise UnknownNameError("planner", planner, list(DIVIDERS))
    request = PlanRequest(costs=cm, model_name=model_name, cluster_name=cluster_name, batch=batch,
                          n_stages=n_stages, n_micro=n_micro, exact_stages=exact_stages)
    spec = TABLE[planner]
    return spec.fn(request, validated_options(planner, options, spec.options), None)
