"""The partition baselines as split planners (planners/pipeline_split.py): GPipe-E (`even`), GPipe-R
(`random`), DeepSpeed (`params`), torchgpipe (`time-1d`), PipeDream's dynamic program
(`pipedream-dp`) and the exhaustive oracle (`brute-force`), each a division from
planners/baselines/partition.py with the micro-batch count fixed, drawn or chosen by eq. (8)."""

from __future__ import annotations

import numpy as np

from paraplan.planners.baselines import partition
from paraplan.planners.pipeline_split import (
    SplitProblem,
    best_over_p,
    choose,
    micro_counts,
    register_split,
    with_odpa,
)
from paraplan.planners.request import FieldError, OptionSpec, whole_number
from paraplan.planners.stage_division import fill_to

BRUTE_FORCE_MAX_LAYERS = 30


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
    for p in micro_counts(problem, n_micro):
        r = problem.n_micro_values.index(p)
        fits = None if memory is None else (lambda cuts, r=r: memory.division_fits(r, cuts))
        cuts = partition.brute_force_time(*problem.stage_row(p), problem.n_stages, p, exactly=exactly, fits=fits)
        if cuts is not None:
            candidates.append((cuts, p))
    if not candidates:  # nothing fits: the division closest to fitting at each p
        for p in micro_counts(problem, n_micro):
            r = problem.n_micro_values.index(p)
            cuts = memory.least_overflow_cuts(r, problem.n_stages)
            candidates.append((fill_to(*problem.stage_row(p), cuts, problem.n_stages, p) if exactly else cuts, p))
    return choose(problem, candidates, memory) + ({},)


def _time_1d(problem: SplitProblem, n_micro, options, memory=None, exactly=False):
    return best_over_p(problem, lambda q: partition.balanced_1d(problem.row(q)[0] + problem.row(q)[2],
                                                                problem.n_stages, exactly), n_micro, memory) + ({},)


def _pipedream(problem: SplitProblem, n_micro, options, memory=None, exactly=False):
    return best_over_p(problem, lambda q: partition.min_max_dp(*problem.row(q), problem.n_stages, exactly),
                       n_micro, memory) + ({},)


register_split("even", "GPipe-E: equal layer counts",
               lambda pr, p, o, m=None, x=False: with_odpa(pr, partition.even(pr.n_layers, pr.n_stages), p, m))
register_split("random", "GPipe-R: random cuts and micro-batch count", _random,
               {"seed": OptionSpec(0, "random seed", whole_number("seed"))},
               not_compared="a random division (a baseline for tests)")
register_split("params", "DeepSpeed: balance parameters", lambda pr, p, o, m=None, x=False: with_odpa(
    pr, partition.balanced_1d(pr.param_bytes, pr.n_stages, x), p, m))
register_split("time-1d", "torchgpipe: balance forward + backward time", _time_1d)
register_split("pipedream-dp", "PipeDream's min-max dynamic program", _pipedream)
register_split("brute-force", f"every division and micro-batch count (at most {BRUTE_FORCE_MAX_LAYERS} layers): "
                              "eq. (8)'s optimum, each stage on its own device", _brute_force,
               not_compared="the exact check of CSIMD on small models", alike_devices=False)
