"""A multi-chunk pipeline's cut searched by the simulator around the balanced one.

planners/schedule_variants.py cuts the layers into p x v chunks by balanced compute (the cut whose
slowest chunk is fastest). Where the layers do not divide evenly many cuts share that slowest
chunk, and `balanced_bounds` takes the earliest; the simulator tells them apart (the fill and drain
of the interleaved order, the sends, which rank holds the lighter chunks). Llama 2 70B on 1,024
A100s, 4 ranks x 11 chunks of 82 layers (six chunks of one layer, the rest of two): the earliest
cut 2.591 s, the latest 2.612 s, one with the single layers in the middle 2.576 s
(results/bound_gap_before_after.json). Not in any of the papers: a first-improvement hill climb
that swaps the layer counts of neighbouring chunks (the same counts, so the same slowest chunk on
layers alike), each cut judged by the simulator, the memory's verdict included, at most
`MAX_JUDGED` cuts.
"""

from __future__ import annotations

from dataclasses import replace

from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import LayerRange, Plan
from paraplan.plans.prediction import Prediction

MAX_JUDGED = 32  # simulations a search may spend (0.06 s each at 1,024 GPUs, 4 x 11 chunks)


def recut(plan: Plan, sizes: list[int]) -> Plan:
    """`plan` with its stages holding `sizes` layers each, in order (stage i stays on its devices;
    per-layer strategies go with their layers)."""
    by_layer = {i: s.strategy(i) for s in plan.stages for i in s.layers} if plan.kind is PlanKind.LAYERS else None
    stages, start = [], 0
    for stage, size in zip(plan.stages, sizes, strict=True):
        stop = start + size
        stages.append(replace(stage, layers=LayerRange(start, stop),
                              strategies=tuple(by_layer[j] for j in range(start, stop)) if by_layer else ()))
        start = stop
    return replace(plan, stages=tuple(stages), prediction=None)


def search_cut(plan: Plan, prediction: Prediction, judge, most: int = MAX_JUDGED) -> tuple[Plan, Prediction, int]:
    """(the fastest cut found that fits, its prediction, cuts judged) from a multi-chunk `plan` that
    fits; a plan of one chunk per rank, or one that does not fit, is returned as it is."""
    if plan.virtual_stages < 2 or not prediction.feasible or plan.kind is PlanKind.BIPARTITION:
        return plan, prediction, 0
    sizes = [len(s.layers) for s in plan.stages]
    judged, improved = 0, True
    while improved and judged < most:
        improved = False
        for i in range(len(sizes) - 1):
            if sizes[i] == sizes[i + 1]:
                continue
            if judged >= most:
                break
            trial = sizes[:i] + [sizes[i + 1], sizes[i]] + sizes[i + 2:]
            candidate = recut(plan, trial)
            p = judge(candidate)
            judged += 1
            if p.feasible and p.iteration_s < prediction.iteration_s:
                plan, prediction, sizes, improved = candidate, p, trial, True
    return plan, prediction, judged
