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
from dataclasses import dataclass

import numpy as np

from paraplan.costs.model import CostModel
from paraplan.errors import ParaplanError, UnknownNameError
from paraplan.planners import csimd, partition
from paraplan.plan.plan import LayerRange, Plan, SearchInfo, Stage

PLANNERS = ("csimd", "csimd-paper", "even", "random", "pipedream-dp", "params", "time-1d", "brute-force")
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

    def row(self, n_micro: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        r = self.n_micro_values.index(n_micro)
        return self.h_p[r], self.h_m[r], self.j_p[r], self.j_m[r]

    def time_s(self, cuts, n_micro: int) -> float:
        """T(lambda, p), CSIMD eq. (8)."""
        return csimd.total_time(*self.row(n_micro), cuts, n_micro)


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def build_problem(cm: CostModel, batch: int, n_stages: int, max_micro: int | None = None) -> SplitProblem:
    if batch < 1:
        raise ParaplanError(f"--batch must be positive, got {batch}")
    k = cm.model.n_layers
    if not 1 <= n_stages <= min(k, cm.cluster.n_devices):
        raise ParaplanError(f"--stages: need 1..{min(k, cm.cluster.n_devices)} (layers {k}, devices "
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


def solve(problem: SplitProblem, planner: str, n_micro: int | None = None, eta: int = 1000,
          seed: int = 0) -> tuple[tuple[int, ...], int, dict]:
    """(cuts, p, notes) for one planner. A fixed n_micro applies to the baselines (GPipe-E-p)."""
    if planner not in PLANNERS:
        raise UnknownNameError("planner", planner, list(PLANNERS))
    if n_micro is not None and n_micro not in problem.n_micro_values:
        raise ParaplanError(f"--micro-batches: {n_micro} does not divide the batch {problem.batch} "
                            f"(choose from {', '.join(map(str, problem.n_micro_values))})")
    n, k = problem.n_stages, problem.h_p.shape[1]
    if planner in ("csimd", "csimd-paper"):
        # csimd-paper: Algorithm 1 as printed, IMD from p = 1. csimd: every p as a start and the
        # exact minimum of T per p (planners/csimd.py `search`), so never worse than a baseline.
        ps = problem.n_micro_values
        if planner == "csimd-paper":
            method, starts = "imd", [n_micro or ps[0]]
        else:
            method, starts = "auto", [n_micro] if n_micro else None
        q = (problem.h_p, problem.h_m, problem.j_p, problem.j_m)
        if n_micro:  # a fixed p: only that row
            r = ps.index(n_micro)
            q, ps = tuple(x[r:r + 1] for x in q), [n_micro]
        best = csimd.search(*q, ps, n, method=method, eta=eta, starts=starts)
        return best.cuts, best.n_micro, {"iterations": best.iterations}
    if planner == "even":
        cuts = partition.even(k, n)
        return cuts, n_micro or _odpa_p(problem, cuts), {}
    if planner == "random":
        rng = np.random.default_rng(seed)
        cuts = partition.random_cuts(k, n, rng)
        return cuts, n_micro or int(rng.choice(problem.n_micro_values)), {"seed": seed}
    if planner == "params":
        cuts = partition.balanced_1d(problem.param_bytes, n)
        return cuts, n_micro or _odpa_p(problem, cuts), {}
    if planner == "time-1d":
        cuts, p = _best_over_p(problem, lambda p: partition.balanced_1d(
            problem.row(p)[0] + problem.row(p)[2], n), n_micro)
        return cuts, p, {}
    if planner == "pipedream-dp":
        cuts, p = _best_over_p(problem, lambda p: partition.min_max_dp(*problem.row(p), n), n_micro)
        return cuts, p, {}
    if k > BRUTE_FORCE_MAX_LAYERS:
        raise ParaplanError(f"brute-force enumerates every division: use it for at most "
                            f"{BRUTE_FORCE_MAX_LAYERS} layers (this model has {k})")
    cuts, p = _best_over_p(problem, lambda p: partition.brute_force(*problem.row(p), n).cuts, n_micro)
    return cuts, p, {}


def plan_split(cm: CostModel, model_name: str, cluster_name: str, batch: int, planner: str,
               n_stages: int | None = None, n_micro: int | None = None, eta: int = 1000, seed: int = 0) -> Plan:
    """Search, then write the answer as a Plan (without prediction; see simulate_plan)."""
    n_stages = n_stages or min(cm.model.n_layers, cm.cluster.n_devices)
    t0 = time.perf_counter()
    problem = build_problem(cm, batch, n_stages)
    cuts, p, notes = solve(problem, planner, n_micro, eta, seed)
    elapsed = time.perf_counter() - t0
    bounds = [0, *[c + 1 for c in cuts], cm.model.n_layers]
    stages = tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)))
    options = {"stages": n_stages, "eq8_time_s": problem.time_s(cuts, p), "costs": cm.source, **notes}
    if planner == "csimd":
        options["eta"] = eta
    return Plan(model=model_name, cluster=cluster_name, n_layers=cm.model.n_layers, global_batch=batch, n_micro=p,
                schedule="gpipe", grad_sync="none", stages=stages,
                search=SearchInfo(planner=planner, search_s=elapsed, options=tuple(sorted(options.items()))))
