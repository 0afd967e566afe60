"""Plans from CSIMD and its partition baselines: contiguous stages, one device each, GPipe.

Every planner here solves the same problem on the same numbers: the per-layer time functions of
a CostModel (analytic or measured) evaluated at the micro-batch size B / p for every candidate
micro-batch count p (the divisors of B, so micro-batches are whole), with the link between the
first two devices pricing activations and gradients. Each returns a division and a p, judged by
CSIMD eq. (8); the Plan's prediction comes from the simulator.

With a heterogeneous cluster the time functions of device 0 stand for every stage (CSIMD's IMD
works on one set of per-layer arrays); the simulator then prices each stage on its own device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from paraplan.costs.model import CostModel
from paraplan.plan.plan import LayerRange, Plan, SearchInfo, Stage
from paraplan.planners import csimd, csimd_search, partition
from paraplan.planners.request import (
    FieldError,
    OptionSpec,
    PlanRequest,
    at_least,
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


def _best_over_p(problem: SplitProblem, divide, n_micro: int | None) -> tuple[tuple[int, ...], int]:
    """A division for each candidate p (or the fixed one), keeping the best T."""
    best = None
    for p in ([n_micro] if n_micro else problem.n_micro_values):
        cuts = divide(p)
        t = problem.time_s(cuts, p)
        if best is None or t < best[0]:
            best = (t, tuple(cuts), p)
    return best[1], best[2]


def _odpa_p(problem: SplitProblem, cuts) -> int:
    z = csimd.odpa(problem.h_p, problem.h_m, problem.j_p, problem.j_m, cuts, problem.n_micro_values)
    return problem.n_micro_values[int(np.argmin(z))]


Divider = Callable[[SplitProblem, "int | None", dict], "tuple[tuple[int, ...], int, dict]"]
DIVIDERS: dict[str, Divider] = {}  # planner name -> (problem, fixed p or None, options) -> (cuts, p, notes)


def _csimd(problem: SplitProblem, n_micro: int | None, options: dict, paper: bool = False):
    # csimd-paper: Algorithm 1 as printed, IMD from p = 1. csimd: every p as a start and the
    # exact minimum of T per p where that is cheap (planners/csimd_search.py `search`).
    ps = problem.n_micro_values
    q = (problem.h_p, problem.h_m, problem.j_p, problem.j_m)
    if n_micro:  # a fixed p: only that row
        r = ps.index(n_micro)
        q, ps = tuple(x[r:r + 1] for x in q), [n_micro]
    method, starts = ("imd", [ps[0]]) if paper else (options["method"], None)
    best = csimd_search.search(*q, ps, problem.n_stages, method=method, eta=options["eta"], starts=starts)
    notes = {"iterations": best.iterations}
    if not paper:  # what the search proved: the optimum of eq. (8), or a lower bound on it
        notes.update(exact=best.exact, lower_bound_s=best.lower_bound_s)
    return best.cuts, best.n_micro, notes


def _with_odpa(problem: SplitProblem, cuts, n_micro: int | None):
    """A division fixed by its baseline; p fixed by the user or chosen by ODPA (CSIMD Algorithm 4)."""
    return cuts, n_micro or _odpa_p(problem, cuts), {}


def _random(problem: SplitProblem, n_micro: int | None, options: dict):
    rng = np.random.default_rng(options["seed"])
    cuts = partition.random_cuts(problem.n_layers, problem.n_stages, rng)
    return cuts, n_micro or int(rng.choice(problem.n_micro_values)), {"seed": options["seed"]}


def _brute_force(problem: SplitProblem, n_micro: int | None, options: dict):
    if problem.n_layers > BRUTE_FORCE_MAX_LAYERS:
        raise FieldError("planner", f"brute-force enumerates every division: use it for at most "
                                    f"{BRUTE_FORCE_MAX_LAYERS} layers (this model has {problem.n_layers})")
    # the true optimum of eq. (8): every division, every p
    return _best_over_p(problem, lambda p: partition.brute_force_time(*problem.row(p), problem.n_stages, p),
                        n_micro) + ({},)


DIVIDERS.update({
    "csimd": _csimd,
    "csimd-paper": lambda pr, p, o: _csimd(pr, p, o, paper=True),
    "even": lambda pr, p, o: _with_odpa(pr, partition.even(pr.n_layers, pr.n_stages), p),
    "random": _random,
    "params": lambda pr, p, o: _with_odpa(pr, partition.balanced_1d(pr.param_bytes, pr.n_stages), p),
    "time-1d": lambda pr, p, o: _best_over_p(pr, lambda q: partition.balanced_1d(
        pr.row(q)[0] + pr.row(q)[2], pr.n_stages), p) + ({},),
    "pipedream-dp": lambda pr, p, o: _best_over_p(pr, lambda q: partition.min_max_dp(*pr.row(q), pr.n_stages),
                                                  p) + ({},),
    "brute-force": _brute_force,
})
SUMMARIES = {
    "csimd": "CSIMD: stages + micro-batch count; eq. (8)'s exact optimum by branch and bound (or a proven bound)",
    "csimd-paper": "CSIMD's Algorithm 1 as printed (IMD from p = 1)",
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


def solve(problem: SplitProblem, planner: str, n_micro: int | None = None,
          options: dict | None = None) -> tuple[tuple[int, ...], int, dict]:
    """(cuts, p, notes) for one planner. A fixed n_micro applies to the baselines (GPipe-E-p)."""
    if n_micro is not None and n_micro not in problem.n_micro_values:
        raise FieldError("micro_batches", f"{n_micro} does not divide the batch {problem.batch} "
                                          f"(choose from {', '.join(map(str, problem.n_micro_values))})")
    defaults = {name: spec.default for name, spec in OPTIONS.get(planner, {}).items()}
    return DIVIDERS[planner](problem, n_micro, {**defaults, **(options or {})})


def _plan(request: PlanRequest, options: dict, planner: str) -> Plan:
    """Search, then write the answer as a Plan (without prediction: the registry adds the judge's)."""
    cm = request.costs
    n_stages = request.n_stages or min(request.n_layers, request.n_devices)
    t0 = time.perf_counter()
    problem = build_problem(cm, request.batch, n_stages)
    cuts, p, notes = solve(problem, planner, request.n_micro, options)
    elapsed = time.perf_counter() - t0
    bounds = [0, *[c + 1 for c in cuts], request.n_layers]
    stages = tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)))
    info = {"stages": n_stages, "eq8_time_s": problem.time_s(cuts, p), "costs": cm.source, **notes,
            **{k: str(v) for k, v in options.items()}}
    return Plan(model=request.model_name, cluster=request.cluster_name, n_layers=request.n_layers,
                global_batch=request.batch, n_micro=p, schedule=request.schedule or "gpipe", grad_sync="none",
                stages=stages, search=SearchInfo(planner=planner, search_s=elapsed, options=tuple(sorted(info.items()))))


for _name in DIVIDERS:  # each split planner in the table (planners/registry.py)
    register(_name, SUMMARIES[_name], schedules=("gpipe", "1f1b"), options=OPTIONS.get(_name))(
        lambda request, options, judge, _name=_name: _plan(request, options, _name))
PLANNERS = tuple(DIVIDERS)


def plan_split(cm: CostModel, model_name: str, cluster_name: str, batch: int, planner: str,
               n_stages: int | None = None, n_micro: int | None = None, **options) -> Plan:
    """One split planner on a cost model, without prediction (tests and benchmarks)."""
    from paraplan.errors import UnknownNameError
    from paraplan.planners.request import validated_options
    from paraplan.planners.table import PLANNERS as TABLE

    if planner not in DIVIDERS:
        raise UnknownNameError("planner", planner, list(DIVIDERS))
    request = PlanRequest(costs=cm, model_name=model_name, cluster_name=cluster_name, batch=batch,
                          n_stages=n_stages, n_micro=n_micro)
    spec = TABLE[planner]
    return spec.fn(request, validated_options(planner, options, spec.options), None)
