"""CSIMD as split planners (planners/pipeline_split.py): `csimd`, the exact optimum of eq. (8) among
the divisions and micro-batch counts that fit (planners/csimd/search.py `search`), and
`csimd-paper`, Algorithm 1 as printed (IMD from p = 1, memory-blind, as the paper). Both take
each stage's terms from its own device where devices differ (planners/stage_division.py)."""

from __future__ import annotations

from paraplan.planners.csimd import search as csimd_search
from paraplan.planners.pipeline_split import SplitProblem, register_split
from paraplan.planners.request import OptionSpec, at_least, one_of


def _csimd(problem: SplitProblem, n_micro: int | None, options: dict, memory=None, exactly: bool = False,
           paper: bool = False):
    # csimd-paper: Algorithm 1 as printed, IMD from p = 1: the paper's memory-blind baseline (its
    # plan's prediction says whether it fits). csimd: every p as a start and the exact minimum of T
    # per p where that is cheap (planners/csimd/search.py `search`), among the divisions that fit.
    ps = problem.n_micro_values
    q = problem.stage_arrays()  # each stage on its own device where devices differ
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


_ETA = OptionSpec(1000, "IMD weight groups (CSIMD's eta, at least 2)", at_least("eta", 2))

register_split("csimd", "CSIMD: stages + micro-batch count; eq. (8)'s exact optimum among plans that fit, by branch "
                        "and bound", _csimd,
               {"eta": _ETA,
                "method": OptionSpec("auto", "division search: auto, imd, exact (rho1 + rho2), exact-time (eq. (8))",
                                     one_of("method", ("auto", "imd", "exact", "exact-time")))}, alike_devices=False)
register_split("csimd-paper", "CSIMD's Algorithm 1 as printed (IMD from p = 1; memory-blind, as the paper)",
               lambda pr, p, o, m=None, x=False: _csimd(pr, p, o, m, x, paper=True), {"eta": _ETA},
               not_compared="CSIMD's printed pseudo-code (csimd is the same, fixed)", alike_devices=False)
