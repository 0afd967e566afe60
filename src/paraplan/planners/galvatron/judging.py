"""Galvatron-Base's and -BMW's final choice among a search's candidates, by the simulator (not the
paper's: it takes the least eq. (8) cost; planners/galvatron/planner.py says why): every pipeline
degree's and micro-batch count's best (`SearchResult.finalists`) judged in the order of what they
can reach (`_throughput_bound`), and the interleaved 1F1B rewrites of the fastest (`_interleaved`).
"""

from __future__ import annotations

from paraplan.planners.galvatron.grid_bounds import pipeline_bound_s
from paraplan.planners.request import Judge, PlanRequest, cost_model_cache
from paraplan.plans.plan import Plan

# chunks per pipeline rank always tried for interleaved 1F1B (Narayanan et al. 2021 use 2-4; more
# cost more transfers and a larger first-rank memory for a smaller bubble), and how many more are
# tried where the layers cut into chunks more evenly (`chunk_counts`)
INTERLEAVED_CHUNKS = (2, 3, 4)
BALANCED_CHUNKS = 3
# the multi-chunk kinds the runtime runs with per-layer strategies (runtime/launcher/launch.py): auto must not
# pick what `train` refuses
INTERLEAVED_KINDS = ("interleaved-1f1b",)


def chunk_counts(plan: Plan, costs) -> tuple[int, ...]:
    """The chunk counts per rank judged for `plan`'s pipeline: INTERLEAVED_CHUNKS and the
    BALANCED_CHUNKS counts whose chunks are most even (planners/schedule_variants.py:
    chunk_counts_by_balance), e.g. v = 5 for 82 layers on 8 ranks."""
    from paraplan.planners.schedule_variants import chunk_counts_by_balance

    return tuple(sorted(set(INTERLEAVED_CHUNKS) | set(chunk_counts_by_balance(plan, costs, BALANCED_CHUNKS))))


def _interleaved(plan: Plan, prediction, request: PlanRequest, judge: Judge):
    """The searched plan (one chunk per rank, 1F1B or GPipe) and its interleaved 1F1B rewrites with
    v chunks per rank (the layers cut again into p x v stages balanced by compute, each layer keeping
    its strategy: planners/schedule_variants.py), at the same micro-batch count, judged by the
    simulator; the fastest that fits, and the next best's line. The DP's eq. (8) prices GPipe / 1F1B
    only, so the schedule is the simulator's choice (as in planners/schedule_search.py)."""
    scored = [(plan, prediction, str(plan.schedule))]
    # the memory's verdict before any timeline where the judge has one (registry.py SimulatorJudge):
    # a rewrite that does not fit cannot be chosen, and more chunks hold more micro-batches on the
    # first rank, so at 1,024 GPUs most do not fit (a third of Galvatron-Base's judging there)
    memory_first = getattr(judge, "memory", None)
    fastest = prediction.iteration_s if prediction.feasible else float("inf")
    for label, candidate, bound in _rewritten(plan, request):
        if not candidate.expert_overlap and bound >= fastest:
            continue  # cannot beat a plan judged already (its fill, work and drain: grid_bounds.py)
        verdict = memory_first(candidate) if memory_first is not None else None
        scored.append((candidate, verdict if verdict is not None else judge(candidate), label))
        if scored[-1][1].feasible:
            fastest = min(fastest, scored[-1][1].iteration_s)
    fits = sorted((x for x in scored if x[1].feasible), key=lambda x: x[1].iteration_s)
    if not fits:
        return plan, prediction, "", len(scored)
    best = fits[0]
    other = next((x for x in fits[1:] if x[2] != best[2]), None)
    line = f"{other[2]}: {other[1].iteration_s:.4g} s ({other[1].iteration_s / best[1].iteration_s - 1:+.1%})" \
        if other else ""
    return best[0], best[1], line, len(scored)


def rank_key(prediction) -> tuple[bool, float]:
    """Feasible first, then the highest throughput (the batch may differ under batch_search best)."""
    return (not prediction.feasible, -prediction.throughput_samples_per_s if prediction.feasible else 0.0)


JUDGED_INTERLEAVED = 5  # the candidates whose interleaved rewrites are judged too (`judge_candidates`)


def judge_candidates(request: PlanRequest, interleave: bool, result, judge: Judge):
    """A search's candidates judged by the simulator: its plan and the best plan of every other
    pipeline degree and micro-batch count it searched (`SearchResult.finalists`), and, when
    `interleave`, the interleaved rewrites (`_interleaved`) of the JUDGED_INTERLEAVED fastest and of
    each pipeline degree's best by eq. (8) and by the simulator; the fastest that fits, as (plan,
    prediction, eq. (8) estimate, partition origin, runner-up line, schedules judged). Not the
    paper's choice (the least eq. (8) cost): eq. (8) sums every stage's gradient sync where the
    stages sync at once on their own devices, so it overprices deep pipelines with data parallelism
    and misranks a degree's micro-batch counts. Llama-2-70B-like,
    batch 1,024: on 1,024 A100-80GB, 16 stages of DP16 (ZeRO-1) x TP4 by eq. (8) 8.26 s, simulated
    3.28 s, where the one-stage plan eq. (8) preferred takes 4.10 s; on 512, 8 stages at 128
    micro-batches (eq. (8)'s choice, 8.39 s) simulate 6.30 s and 5.82 s interleaved, 4 stages at 16
    micro-batches (10.08 s by eq. (8)) 6.21 s and 4.71 s interleaved with 4 chunks."""
    candidates = [r for r in (result, *(x for x in result.finalists if x.plan is not result.plan))
                  if r is result or request.n_stages is None or r.plan.n_stages == request.n_stages]
    judged = []
    # Not in the paper, exact for the choice: the candidates in the order of what their compute alone
    # allows (`_throughput_bound`: neither the plan nor its rewrites is faster), and those that
    # cannot beat the fastest plan that fits so far are not simulated (their interleaved rewrites
    # could not beat it either). The winner is every candidate the full judging would rewrite that
    # could win, so it is never slower; 1,024 GPUs judged a finalist for each of dozens of shapes.
    best_throughput = 0.0
    for bound, r in sorted(((_throughput_bound(request, r.plan, interleave), r) for r in candidates), key=lambda x: -x[0]):
        if bound <= best_throughput:
            break
        prediction = judge(r.plan)
        judged.append((r, prediction))
        if prediction.feasible:
            best_throughput = max(best_throughput, prediction.throughput_samples_per_s)
    place = {id(r): i for i, r in enumerate(candidates)}  # ties in rank go to the search's order, as before
    judged.sort(key=lambda x: (rank_key(x[1]), place[id(x[0])]))
    rewritten = {id(r) for r, _ in judged[:JUDGED_INTERLEAVED]}
    for degree in {r.plan.n_stages for r, _ in judged}:  # and each degree's best by eq. (8) and by the simulator
        mine = [x for x in judged if x[0].plan.n_stages == degree]
        rewritten |= {id(mine[0][0]), id(min(mine, key=lambda x: x[0].estimate_s)[0])}
    best = None
    for r, p in judged:
        plan, line, count = r.plan, "", None
        if interleave and id(r) in rewritten and r.plan.n_stages > 1 and p.feasible:
            plan, p, line, count = _interleaved(r.plan, p, request, judge)
        if best is None or rank_key(p) < rank_key(best[1]):
            best = (plan, p, r.estimate_s, r.origin, line, count)
    return best


def _throughput_bound(request: PlanRequest, plan: Plan, interleave: bool) -> float:
    """Samples/s neither this plan nor any rewrite `_interleaved` may make of it exceeds (inf where
    the bound does not hold: Megatron's all-to-all overlap hides compute the bound counts): its own
    pipeline's fill and drain (grid_bounds.pipeline_bound_s), and where it is rewritten into v chunks
    per rank (interleaving judged), each rewrite's: its busiest rank's compute and the interleaved
    fill and drain. Both are what the simulator charges, so no plan of them is faster. At 1,024 H100s
    the 32- and 64-stage pipelines of Llama 3 70B (80 layers) are bound at 56-65 s where their ranks'
    average compute is 35 s: no longer simulated (4.6 s) against a 37.4 s plan."""
    if plan.expert_overlap:
        return float("inf")
    seconds = pipeline_bound_s(request, plan)
    if interleave:  # the least over its rewrites (inf where none can be made: one rank, too few layers)
        seconds = min([seconds, *(bound for _, _, bound in _rewritten(plan, request))])
    return plan.global_batch / seconds if seconds > 0 else float("inf")


# per plan, its rewrites with their bounds, for the last cost model (planners/request.py
# cost_model_cache): the bound and `_interleaved` read the same ones, and BMW's finalists are
# mostly Base's, judged in one process
_REWRITTEN: dict = {}


def _rewritten(plan: Plan, request: PlanRequest) -> tuple:
    """("kind v=V", the rewrite, its grid_bounds.pipeline_bound_s) of every interleaved rewrite
    `_interleaved` judges."""
    from paraplan.planners.schedule_variants import rewrite

    known = cost_model_cache(_REWRITTEN, request.costs)
    if plan not in known:
        out = []
        for kind in INTERLEAVED_KINDS:
            for v in chunk_counts(plan, request.costs):
                try:
                    candidate = rewrite(plan, request.costs, kind, v)
                except ValueError:
                    continue
                out.append((f"{kind} v={v}", candidate, pipeline_bound_s(request, candidate)))
        known[plan] = tuple(out)
    return known[plan]
