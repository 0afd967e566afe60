"""The schedule chosen with the cut and the micro-batch count ("Today's training II", item 2):
for each micro-batch count and each schedule kind and chunk count (planners/schedule_variants.py),
the pipeline planner's own cut for that count, rewritten for the schedule (with v chunks per rank,
cut again into p x v stages balanced by compute), judged by the simulator; the fastest that fits
wins. Then the cut of the winner is refined under the same judge: each boundary moved by one layer
while that makes the plan faster (or, while nothing fits, nearer to fitting).

Why the simulator and not the planners' own equations: CSIMD's eq. (8) and GroPipe's eqs. (2)-(7)
are GPipe's makespan (1F1B has the same bubble and less memory, so the papers' models cannot tell
the other schedules apart); nothing in those papers prices interleaving or a split backward. The
split planners' cut for each count is still the paper's (eq. (8), exact); the schedule and the
chunks' cut are judged by the simulator, which reproduces the schedules' papers exactly
(tests/unit/test_schedules.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from paraplan.planners.schedule_variants import DEFAULT_VARIANTS, Variant, rewrite
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import LayerRange, Plan, Prediction, Stage

Judge = Callable[[Plan], Prediction]
REFINE_ROUNDS = 4  # passes over the boundaries; each pass tries every boundary one layer either way
# the candidates whose cuts are refined: every one within REFINE_WITHIN of the best (a cut the paper's
# model finds, or the balanced one, can lose to another candidate's once refined: seen on llama-tiny,
# 2.7%), at most REFINED of them
REFINE_WITHIN = 0.05
REFINED = 12
REFINE_BUDGET = 600  # simulations the refinement may spend in all (GPT-2 XL on 8 TITANs: ~3 s of them)


@dataclass(frozen=True)
class Scored:
    plan: Plan
    label: str

    @property
    def key(self) -> tuple[bool, float]:
        """Feasible first, then faster; among the infeasible, nearer to fitting."""
        p = self.plan.prediction
        if p.feasible:
            return (False, p.iteration_s)
        return (True, max(m.peak_bytes / m.capacity_bytes for m in p.memory) if p.memory else float("inf"))


def search(base_for: Callable[[int], Plan], micro_counts: tuple[int, ...], cm, judge: Judge,
           kinds=DEFAULT_VARIANTS, refine: bool = True) -> tuple[Plan, list[Scored]]:
    """The best plan over (micro-batch count, schedule, chunks) and every candidate judged, best first.
    `base_for(p)`: the planner's one-chunk plan for p micro-batches."""
    scored: list[Scored] = []
    why = ""
    for n_micro in micro_counts:
        base = base_for(n_micro)
        for kind, virtual in kinds:
            try:
                plan = rewrite(base, cm, kind, virtual)
            except ValueError as exc:
                why = str(exc)  # this kind cannot take this pipeline
                continue
            scored.append(Scored(replace(plan, prediction=judge(plan)), Variant(kind, virtual, plan).label))
    scored.sort(key=lambda s: s.key)
    if not scored:
        raise ValueError(why or "no schedule can take this pipeline")
    if refine:
        # the candidates that are, or would be if another cut made them fit, within REFINE_WITHIN of
        # the best that fits (a balanced cut that overflows one rank may fit once a layer moves)
        bar = scored[0].plan.prediction.iteration_s * (1 + REFINE_WITHIN) if not scored[0].key[0] else float("inf")
        # fitting ones first, then the nearest to fitting (fast candidates that overflow memory by
        # half would otherwise take the places of one a layer's move makes fit)
        close = sorted((s for s in scored if s.plan.prediction.iteration_s <= bar), key=lambda s: s.key)[:REFINED]
        rest = [s for s in scored if all(s is not c for c in close)]
        # each candidate gets an equal share of the budget (what one leaves, the next may spend): in
        # order of time, the fast candidates that overflow memory would otherwise spend it all
        budget, refined = [REFINE_BUDGET], []
        for k, s in enumerate(close):
            share = [budget[0] // (len(close) - k)]
            refined.append(_refine(s, judge, share))
            budget[0] -= budget[0] // (len(close) - k) - share[0]
        refined = _share_cuts(refined, judge, [max(budget[0], 2 * len(refined) ** 2)])
        scored = sorted(refined + rest, key=lambda s: s.key)
    return scored[0].plan, scored


def _bounds(plan: Plan) -> tuple[int, ...]:
    return tuple(s.layers.start for s in plan.stages)


def _share_cuts(refined: list[Scored], judge: Judge, budget: list[int]) -> list[Scored]:
    """Each refined candidate tried with the refined cuts of the others of as many stages, then
    refined again from the better one: a cut one schedule's refinement reaches is often the one
    another schedule needs, and one-layer moves from its own start may not reach it (llama-tiny on
    4 A100s at 2.4 GiB: interleaved 1F1B's best cut is the one interleaved zero-bubble's
    refinement finds, 3.3% faster than the cut it reached alone)."""
    cuts: dict[int, set[tuple[int, ...]]] = {}
    for s in refined:
        cuts.setdefault(s.plan.n_stages, set()).add(_bounds(s.plan))
    out = []
    for s in refined:
        best = s
        for bounds in sorted(cuts[s.plan.n_stages] - {_bounds(s.plan)}):
            if s.plan.kind in (PlanKind.LAYERS, PlanKind.BIPARTITION) or budget[0] <= 0:
                break
            budget[0] -= 1
            moved = _with_bounds(s.plan, bounds)
            candidate = Scored(replace(moved, prediction=judge(moved)), s.label)
            if candidate.key < best.key:
                best = candidate
        out.append(_refine(best, judge, budget) if best is not s else s)
    return out


def _with_bounds(plan: Plan, bounds: tuple[int, ...]) -> Plan:
    ends = (*bounds[1:], plan.n_layers)
    stages = tuple(Stage(LayerRange(a, b), s.devices) for a, b, s in zip(bounds, ends, plan.stages, strict=True))
    return replace(plan, stages=stages, prediction=None)


def _refine(start: Scored, judge: Judge, budget: list[int]) -> Scored:
    """Move stage boundaries by one layer while the judge says that is better: each boundary alone,
    and (up to BLOCK_SHIFT_STAGES stages) every run of consecutive boundaries together, which moves
    one layer from one stage to a distant one (what a memory-tight interleaved cut needs: one move
    alone overflows the rank in between)."""
    best = start
    for _ in range(REFINE_ROUNDS):
        # best improvement over the round's moves, all from the round's start: taking the first
        # improvement can step into a cut that fits but is slow, from which the fast one is out of
        # one move's reach (llama-tiny at 2.4 GiB, interleaved 1F1B)
        origin, round_best = best, best
        n = origin.plan.n_stages
        runs = [(i, j) for i in range(1, n) for j in range(i, n if n <= BLOCK_SHIFT_STAGES else i + 1)]
        for first, last in runs:
            for step in (-1, 1):
                moved = _moved(origin.plan, first, last, step)
                if moved is None or budget[0] <= 0:
                    continue
                budget[0] -= 1
                candidate = Scored(replace(moved, prediction=judge(moved)), origin.label)
                if candidate.key < round_best.key:
                    round_best = candidate
        if round_best is origin:
            break
        best = round_best
    return best


BLOCK_SHIFT_STAGES = 16


def _moved(plan: Plan, first: int, last: int, step: int) -> Plan | None:
    """`plan` with the boundaries before stages first..last moved by `step` layers; None when a stage
    would be left without layers (or the stages carry per-layer strategies)."""
    if plan.kind in (PlanKind.LAYERS, PlanKind.BIPARTITION):
        return None
    bounds = [s.layers.start for s in plan.stages] + [plan.n_layers]
    for b in range(first, last + 1):
        bounds[b] += step
    if any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        return None
    stages = tuple(Stage(LayerRange(bounds[i], bounds[i + 1]), s.devices) for i, s in enumerate(plan.stages))
    return replace(plan, stages=stages, prediction=None)


def runner_up(scored: list[Scored]) -> str:
    """One line: the best candidate of another schedule than the winner's, and what it would cost."""
    if not scored:
        return ""
    win = scored[0]
    for s in scored[1:]:
        if s.label != win.label:
            p, w = s.plan.prediction, win.plan.prediction
            if not p.feasible:
                return f"{s.label} (does not fit: {p.reason})"
            return f"{s.label} with {s.plan.n_micro} micro-batches: {p.iteration_s:.4g} s " \
                   f"({p.iteration_s / w.iteration_s - 1:+.1%})"
    return ""
