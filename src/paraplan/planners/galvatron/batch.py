"""Galvatron's batch search (Algorithm 1's outer loop, ../shared/papers/galvatron-bmw.md): every
pipeline degree, micro-batch count and schedule for one batch (`search_batch`), the largest batch
that fits (`max_batch`) and the batch of the highest throughput (`best_batch`), on
planners/galvatron/searcher.py's `Searcher`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from paraplan.planners import progress
from paraplan.planners.galvatron.searcher import Searcher, SearchResult
from paraplan.planners.galvatron.space import (
    Variant,
    even_partition,
    micro_counts,
    more_micro_counts,
    usable_devices,
)
from paraplan.planners.request import FieldError, PlanRequest


def search_batch(request: PlanRequest, variant: Variant, bins: int, schedules, pps, widen: bool = False) -> SearchResult:
    """The best plan at the request's batch over pipeline degrees, micro-batch counts and schedules.
    `widen` (a given batch, variants with CKPT): micro-batch counts beyond the paper's too
    (space.py: more_micro_counts). Not in the batch searches: with enough micro-batches any batch
    fits, so "the largest batch that fits" (Table II's) is the paper's notion, with its counts."""
    searcher = Searcher(request, variant, bins)
    best: SearchResult | None = None
    finalists: list[SearchResult] = []  # every (degree, count)'s best: search_count appends them

    def search_count(n_stages: int, n_micro: int) -> SearchResult | None:
        """The best over schedules (and BMW's partitions) at one micro-batch count."""
        here = None
        for schedule in schedules:
            if schedule == "gpipe" and "1f1b" in schedules and (n_stages > 1 or n_micro > 1):
                # 1F1B keeps min(P - s, m) micro-batches in flight on stage s where GPipe keeps m, and
                # eq. (8) prices both alike (one stage: gradient accumulation, one micro-batch in flight
                # against GPipe's m): every GPipe assignment fits under 1F1B at the same cost, so
                # on the even partition GPipe's search cannot win and is skipped (exact for Base; BMW's
                # adjusted partitions follow the schedule: checked on benchmarks/galvatron_grid.py).
                # Half of a pipeline search's dynamic programs (issue 31, item 5)
                continue
            even = searcher.evaluate(even_partition(request.n_layers, n_stages), n_micro, schedule)
            results = [even]
            if variant.bmw and n_stages > 1:
                results = searcher.bmw(n_stages, n_micro, schedule, even)
            for r in results:
                if here is None or (r.estimate_s, r.overflow) < (here.estimate_s, here.overflow):
                    here = r
        if here is not None and np.isfinite(here.estimate_s):
            finalists.append(here)  # for the simulator to rank (judging.py: judge_candidates)
        return here

    for done, n_stages in enumerate(pps, start=1):
        counts = micro_counts(request, request.batch, n_stages)
        stage_best = None
        for n_micro in counts:
            r = search_count(n_stages, n_micro)
            if r is not None and (stage_best is None or (r.estimate_s, r.overflow) < (stage_best.estimate_s,
                                                                                      stage_best.overflow)):
                stage_best = r
        # beyond the paper's counts while they keep improving (space.py: more_micro_counts); only
        # with CKPT, where memory trades recomputation against smaller micro-batches
        if widen and variant.checkpoint and stage_best is not None:
            for n_micro in more_micro_counts(request, request.batch, n_stages, counts):
                r = search_count(n_stages, n_micro)
                if r is None or (r.estimate_s, r.overflow) >= (stage_best.estimate_s, stage_best.overflow):
                    break
                stage_best = r
        if stage_best is not None and (best is None or (stage_best.estimate_s, stage_best.overflow)
                                       < (best.estimate_s, best.overflow)):
            best = stage_best
            if widen and np.isfinite(best.estimate_s):  # a search stopped by its time limit keeps it
                progress.offer(best.plan)
        if widen:
            progress.at(f"{variant.name}: {done} of {len(pps)} pipeline degrees searched ({pps[0]} to {n_stages} "
                        "stages)")
    if best is None:
        raise FieldError("micro_batches", f"no micro-batch count tried divides the batch {request.batch}")
    return replace(best, finalists=tuple(finalists))


def _batch_unit(request: PlanRequest, variant: Variant, bins: int, schedules, pps, step: int) -> int:
    """The batch step the search walks in: `step`, or where no multiple-of-nothing batch of one step
    can be planned (pure SDP on 16 devices cannot split 8 samples 16 ways), the smallest
    step x 2^j (up to lcm(step, devices)) that can, so that every batch tried divides evenly."""
    unit, limit = step, math.lcm(step, usable_devices(request))
    while unit < limit:
        req = replace(request, batch=unit, n_micro=None)
        searcher = Searcher(req, variant, bins)
        if any(searcher.fits(p, m, sch) for p in pps for m in micro_counts(req, req.batch, p) for sch in schedules):
            return unit
        unit *= 2
    return limit


def max_batch(request: PlanRequest, variant: Variant, bins: int, schedules, pps, step: int) -> SearchResult:
    """The plan of the largest multiple of `step` that fits. Algorithm 1 walks the batch up one step at
    a time until nothing fits; we find the same batch (where fitting is monotone in the batch) by
    doubling and bisection with a quick memory probe (`Searcher.fits`), then search that batch in
    full, stepping down while the full search finds nothing (the probe is a little optimistic)."""
    step = _batch_unit(request, variant, bins, schedules, pps, step)

    def probe(k: int) -> bool:
        req = replace(request, batch=k * step, n_micro=None)
        searcher = Searcher(req, variant, bins)
        return any(searcher.fits(p, m, sch) for p in pps for m in micro_counts(req, req.batch, p) for sch in schedules)

    low, high = 0, 1
    while probe(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if probe(mid) else (low, mid)
    def search(k: int) -> SearchResult:
        return search_batch(replace(request, batch=k * step, n_micro=None), variant, bins, schedules, pps)

    for k in range(max(low, 1), max(low - 3, 0), -1):
        result = search(k)
        if np.isfinite(result.estimate_s) or k == 1:
            return result
    # the probe and the search disagree by more than a few steps: bisect with the full search
    fits, high = None, k
    low = 0
    while high - low > 1:
        mid = (low + high) // 2
        r = search(mid)
        if np.isfinite(r.estimate_s):
            low, fits = mid, r
        else:
            high = mid
    return fits or search(1)


def best_batch(request: PlanRequest, variant: Variant, bins: int, schedules, pps, step: int) -> SearchResult:
    """The plan of the highest throughput over batches that fit (what Table II reports). Algorithm 1
    walks every multiple of the step up to the largest that fits and keeps the best throughput; we
    search the largest (`max_batch`), the powers of two of the step below it, then refine around
    the best by halving the distance to its neighbours three times (deviation: about 15 searches
    instead of up to a hundred; throughput over the batch rises and then falls once CKPT or more
    stages are needed, and the refinement finds the peak of such a curve to within a step or two)."""
    step = _batch_unit(request, variant, bins, schedules, pps, step)
    largest = max_batch(request, variant, bins, schedules, pps, step)
    if not np.isfinite(largest.estimate_s):
        return largest
    top = largest.plan.global_batch // step
    results: dict[int, SearchResult] = {top: largest}

    def search(k: int) -> SearchResult:
        if k not in results:
            results[k] = search_batch(replace(request, batch=k * step, n_micro=None), variant, bins, schedules, pps)
        return results[k]

    def throughput(k: int) -> float:
        r = search(k)
        return k * step / r.estimate_s if np.isfinite(r.estimate_s) else 0.0

    k = 1
    while k < top:
        throughput(k)
        k *= 2
    for _ in range(3):
        best = max(results, key=throughput)
        below = max((k for k in results if k < best), default=best)
        above = min((k for k in results if k > best), default=best)
        for k in {(best + below) // 2, (best + above + 1) // 2} - set(results):
            throughput(k)
    return results[max(results, key=throughput)]
