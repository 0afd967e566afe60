"""Plans from CSIMD and its partition baselines: contiguous stages, one device each, GPipe.

Every planner here solves the same problem on the same numbers: the per-layer time functions of
a CostModel (analytic or measured) evaluated at the micro-batch size B / p for every candidate
micro-batch count p (the divisors of B, so micro-batches are whole), with the link between the
first two devices pricing activations and gradients. Each returns a division and a p, judged by
CSIMD eq. (8); the Plan's prediction comes from the simulator.

With a heterogeneous cluster the time functions of device 0 stand for every stage (CSIMD's IMD
works on one set of per-layer arrays); the simulator then prices each stage on its own device.

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
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from paraplan.costs.memory import out_of_memory_reason, plan_memory
from paraplan.costs.model import CostModel
from paraplan.plan.plan import LayerRange, Plan, SearchInfo, Stage
from paraplan.planners import csimd, csimd_search, partition
from paraplan.planners.fit import SplitMemory, misfit
from paraplan.planners.request import (
    FieldError,
    Judge,
    OptionSpec,
    PlanRequest,
    at_least,
    choices_near,
    divisors,
    one_of,
    whole_number,
)
from paraplan.planners.table import register

BRUTE_FORCE_MAX_LAYERS = 30


@dataclass(frozen=True)
class SplitProblem:
    """Rows: candidate micro-batch counts; columns: layers (planners/csimd.py conventions)."""

    batch: int
    n_stages: int
    n_micro_values: tuple[int, ...]
    h_p: np.ndarray
    h_m: np.ndarray
    j_p: np.ndarray
    j_m: np.ndarray
    param_bytes: np.ndarray

    @property
    def n_layers(self) -> int:
        return self.h_p.shape[1]

    def row(self, n_micro: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        r = self.n_micro_values.index(n_micro)
        return self.h_p[r], self.h_m[r], self.j_p[r], self.j_m[r]

    def time_s(self, cuts, n_micro: int) -> float:
        """T(lambda, p), CSIMD eq. (8)."""
        return csimd.total_time(*self.row(n_micro), cuts, n_micro)


def build_problem(cm: CostModel, batch: int, n_stages: int, max_micro: int | None = None) -> SplitProblem:
    if batch < 1:
        raise FieldError("batch", f"must be positive, got {batch}")
    k = cm.model.n_layers
    if not 1 <= n_stages <= min(k, cm.cluster.n_devices):
        raise FieldError("stages", f"need 1..{min(k, cm.cluster.n_devices)} (layers {k}, devices "
                                   f"{cm.cluster.n_devices}), got {n_stages}")
    ps = tuple(p for p in divisors(batch) if max_micro is None or p <= max_micro)
    costs = cm.compute(0)
    link = cm.cluster.link(0, 1) if cm.cluster.n_devices > 1 else cm.cluster.nodes[0].intra_link
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
    return SplitProblem(batch=batch, n_stages=n_stages, n_micro_values=ps,
                        param_bytes=np.array([float(layer.param_bytes) for layer in cm.model.layers]),
                        **{key: np.array(v) for key, v in rows.items()})


def split_memory(cm: CostModel, problem: SplitProblem, schedule: str) -> SplitMemory:
    """The O(1) memory check of the problem's candidates: stage s on device s (planners/fit.py)."""
    capacities = [cm.cluster.device(s).memory_bytes for s in range(problem.n_stages)]
    return SplitMemory.for_micro_counts(cm, problem.batch, problem.n_micro_values, schedule, capacities)


def _choose(problem: SplitProblem, candidates, memory: SplitMemory | None) -> tuple[tuple[int, ...], int]:
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


def _micro(problem: SplitProblem, n_micro: int | None) -> tuple[int, ...]:
    return (n_micro,) if n_micro else problem.n_micro_values


def _best_over_p(problem: SplitProblem, divide, n_micro: int | None, memory=None) -> tuple[tuple[int, ...], int]:
    """A division for each candidate p (or the fixed one), keeping the best T that fits."""
    return _choose(problem, [(divide(p), p) for p in _micro(problem, n_micro)], memory)


Divider = Callable[..., "tuple[tuple[int, ...], int, dict]"]
# planner name -> (problem, fixed p or None, options, memory check or None, exactly) -> (cuts, p, notes)
DIVIDERS: dict[str, Divider] = {}


def _csimd(problem: SplitProblem, n_micro: int | None, options: dict, memory=None, exactly: bool = False,
           paper: bool = False):
    # csimd-paper: Algorithm 1 as printed, IMD from p = 1: the paper's memory-blind baseline (its
    # plan's prediction says whether it fits). csimd: every p as a start and the exact minimum of T
    # per p where that is cheap (planners/csimd_search.py `search`), among the divisions that fit.
    ps = problem.n_micro_values
    q = (problem.h_p, problem.h_m, problem.j_p, problem.j_m)
    rows = list(range(len(ps)))
    if n_micro:  # a fixed p: only that row
        r = ps.index(n_micro)
        q, ps, rows = tuple(x[r:r + 1] for x in q), [n_micro], [r]
    if memory is not None and len(rows) < len(problem.n_micro_values):
        memory = memory.subset(rows)
    method, starts = ("imd", [ps[0]]) if paper else (options["method"], None)
    best = csimd_search.search(*q, ps, problem.n_stages, method=method, eta=options["eta"], starts=starts,
                               memory=None if paper else memory, exactly=exactly)
    notes = {"iterations": best.iterations}
    if not paper:  # what the search proved: the optimum of eq. (8), or a lower bound on it
        notes.update(exact=best.exact, lower_bound_s=best.lower_bound_s)
    return best.cuts, best.n_micro, notes


def _with_odpa(problem: SplitProblem, cuts, n_micro: int | None, memory=None):
    """A division fixed by its baseline; p fixed by the user or chosen by ODPA (CSIMD Algorithm 4,
    eq. (8) at every p) among the p where the division fits."""
    return _choose(problem, [(cuts, p) for p in _micro(problem, n_micro)], memory) + ({},)


def _random(problem: SplitProblem, n_micro: int | None, options: dict, memory=None, exactly: bool = False):
    # GPipe-R draws its cuts and p: no search, so no memory check (its prediction says whether it fits)
    rng = np.random.default_rng(options["seed"])
    cuts = partition.random_cuts(problem.n_layers, problem.n_stages, rng)
    return cuts, n_micro or int(rng.choice(problem.n_micro_values)), {"seed": options["seed"]}


def _brute_force(problem: SplitProblem, n_micro: int | None, options: dict, memory=None, exactly: bool = False):
    if problem.n_layers > BRUTE_FORCE_MAX_LAYERS:
        raise FieldError("planner", f"brute-force enumerates every division: use it for at most "
                                    f"{BRUTE_FORCE_MAX_LAYERS} layers (this model has {problem.n_layers})")
    # the true optimum of eq. (8) among the divisions that fit: every division, every p
    candidates = []
    for p in _micro(problem, n_micro):
        r = problem.n_micro_values.index(p)
        fits = None if memory is None else (lambda cuts, r=r: memory.division_fits(r, cuts))
        cuts = partition.brute_force_time(*problem.row(p), problem.n_stages, p, exactly=exactly, fits=fits)
        if cuts is not None:
            candidates.append((cuts, p))
    if not candidates:  # nothing fits: the division closest to fitting at each p
        for p in _micro(problem, n_micro):
            r = problem.n_micro_values.index(p)
            cuts = memory.least_overflow_cuts(r, problem.n_stages)
            candidates.append((_filled(problem, cuts, p) if exactly else cuts, p))
    return _choose(problem, candidates, memory) + ({},)


def _filled(problem: SplitProblem, cuts, p: int) -> tuple[int, ...]:
    return partition.fill_to(*problem.row(p), cuts, problem.n_stages, p)


def _time_1d(problem: SplitProblem, n_micro, options, memory=None, exactly=False):
    return _best_over_p(problem, lambda q: partition.balanced_1d(problem.row(q)[0] + problem.row(q)[2],
                                                                 problem.n_stages, exactly), n_micro, memory) + ({},)


def _pipedream(problem: SplitProblem, n_micro, options, memory=None, exactly=False):
    return _best_over_p(problem, lambda q: partition.min_max_dp(*problem.row(q), problem.n_stages, exactly),
                        n_micro, memory) + ({},)


DIVIDERS.update({
    "csimd": _csimd,
    "csimd-paper": lambda pr, p, o, m=None, x=False: _csimd(pr, p, o, m, x, paper=True),
    "even": lambda pr, p, o, m=None, x=False: _with_odpa(pr, partition.even(pr.n_layers, pr.n_stages), p, m),
    "random": _random,
    "params": lambda pr, p, o, m=None, x=False: _with_odpa(
        pr, partition.balanced_1d(pr.param_bytes, pr.n_stages, x), p, m),
    "time-1d": _time_1d,
    "pipedream-dp": _pipedream,
    "brute-force": _brute_force,
})
SUMMARIES = {
    "csimd": "CSIMD: stages + micro-batch count; eq. (8)'s exact optimum among plans that fit, by branch and bound",
    "csimd-paper": "CSIMD's Algorithm 1 as printed (IMD from p = 1; memory-blind, as the paper)",
    "even": "GPipe-E: equal layer counts",
    "random": "GPipe-R: random cuts and micro-batch count",
    "params": "DeepSpeed: balance parameters",
    "time-1d": "torchgpipe: balance forward + backward time",
    "pipedream-dp": "PipeDream's min-max dynamic program",
    "brute-force": f"every division and micro-batch count (at most {BRUTE_FORCE_MAX_LAYERS} layers): eq. (8)'s optimum",
}
OPTIONS = {
    "csimd": {"eta": OptionSpec(1000, "IMD weight groups (CSIMD's eta, at least 2)", at_least("eta", 2)),
              "method": OptionSpec("auto", "division search: auto, imd, exact (rho1 + rho2), exact-time (eq. (8))",
                                   one_of("method", ("auto", "imd", "exact", "exact-time")))},
    "csimd-paper": {"eta": OptionSpec(1000, "IMD weight groups (CSIMD's eta, at least 2)", at_least("eta", 2))},
    "random": {"seed": OptionSpec(0, "random seed", whole_number("seed"))},
}


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


def _divide(request: PlanRequest, options: dict, planner: str, n_stages: int, exactly: bool) -> tuple[Plan, dict]:
    """One planner's answer as a Plan (without prediction), and its search notes."""
    cm = request.costs
    schedule = request.schedule or "gpipe"
    problem = build_problem(cm, request.batch, n_stages)
    memory = split_memory(cm, problem, schedule)
    cuts, p, notes = solve(problem, planner, request.n_micro, options, memory, exactly)
    bounds = partition.bounds_of(cuts, request.n_layers)
    stages = tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)))
    plan = Plan(model=request.model_name, cluster=request.cluster_name, n_layers=request.n_layers,
                global_batch=request.batch, n_micro=p, schedule=schedule, grad_sync="none", stages=stages)
    return plan, {"eq8_time_s": problem.time_s(cuts, p), **notes}


def _verdict(request: PlanRequest, plan: Plan, eq8_s: float, judge: Judge | None) -> tuple[Plan, float, str]:
    """(plan with the judge's prediction when there is a judge, its time, '' or why it does not fit).
    Without a judge: eq. (8) and the memory model (costs/memory.py), the judge's own count."""
    if judge is not None:
        plan = replace(plan, prediction=judge(plan))
        return plan, plan.prediction.iteration_s, plan.prediction.reason if not plan.prediction.feasible else ""
    cm = request.costs
    capacities = {d: cm.cluster.device(d).memory_bytes for d in plan.devices}
    return plan, eq8_s, out_of_memory_reason(plan_memory(plan, cm.model, capacities, cm.memory)[0])


def _fewer_stages_note(request: PlanRequest, options: dict, planner: str, chosen: Plan, chosen_s: float,
                       judge: Judge | None) -> str:
    """One line: why the plan has fewer stages than the request's, from the best plan with exactly
    that many, planned and judged the same way."""
    n = request.n_stages
    forced, info = _divide(request, options, planner, n, exactly=True)
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
    plan, notes = _divide(request, options, planner, n_stages, exactly)
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


for _name in DIVIDERS:  # each split planner in the table (planners/registry.py)
    register(_name, SUMMARIES[_name], schedules=("gpipe", "1f1b"), options=OPTIONS.get(_name))(
        lambda request, options, judge, _name=_name: _plan(request, options, _name, judge))
PLANNERS = tuple(DIVIDERS)


def plan_split(cm: CostModel, model_name: str, cluster_name: str, batch: int, planner: str,
               n_stages: int | None = None, n_micro: int | None = None, exact_stages: bool = False,
               **options) -> Plan:
    """One split planner on a cost model, without prediction (tests and benchmarks)."""
    from paraplan.errors import UnknownNameError
    from paraplan.planners.request import validated_options
    from paraplan.planners.table import PLANNERS as TABLE

    if planner not in DIVIDERS:
        raise UnknownNameError("planner", planner, list(DIVIDERS))
    request = PlanRequest(costs=cm, model_name=model_name, cluster_name=cluster_name, batch=batch,
                          n_stages=n_stages, n_micro=n_micro, exact_stages=exact_stages)
    spec = TABLE[planner]
    return spec.fn(request, validated_options(planner, options, spec.options), None)
