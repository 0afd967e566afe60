"""The same pipeline under every schedule: a plain pipeline plan (one stage per pipeline rank, no
per-layer strategies) rewritten for each schedule kind and chunk count (plans/schedules.py), each to
be judged by the simulator. What `paraplan simulate --schedules` compares, and where a planner's
schedule search starts.

A kind with one chunk per rank (gpipe, 1f1b, ZB-H1 = interleaved-zb with v = 1) keeps the plan's
own cut. With v chunks per rank the model is cut again into p x v contiguous stages, balanced by
compute: the cut that minimises the slowest stage's forward + backward time at the plan's
micro-batch size (exact, by dynamic programming over the layers), stage i on the rank the kind puts
it (i mod p, or the V of zbv / dualpipev), with that rank's devices. Balanced chunks are what
Narayanan et al. 2021 assume (§2.2.2: each device holds v equal stages); a cut searched jointly
with the schedule is the planners' job ("Today's training II", item 2).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paraplan.costs.model import CostModel
from paraplan.planners.request import cost_model_cache
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import LayerRange, Plan, Stage
from paraplan.plans.schedules import MULTI_CHUNK, Schedule, schedule_problem, stage_ranks

# the kinds and chunk counts compared by default (more chunks cost more transfers for a smaller bubble)
DEFAULT_VARIANTS: tuple[tuple[str, int], ...] = (
    (Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED_ZB, 1),
    (Schedule.INTERLEAVED_1F1B, 2), (Schedule.INTERLEAVED_1F1B, 4), (Schedule.LOOPED_BFS, 2),
    (Schedule.INTERLEAVED_ZB, 2), (Schedule.ZB_2P, 1), (Schedule.ZBV, 2), (Schedule.DUALPIPE_V, 2))


def parse_variants(text: str) -> tuple[tuple[str, int], ...]:
    """"1f1b,zb-h1,interleaved-1f1b:2,zbv" -> ((kind, chunks per rank), ...); ValueError in one line."""
    out = []
    for word in filter(None, (w.strip() for w in text.split(","))):
        kind, _, chunks = word.partition(":")
        if kind == "zb-h1":
            kind, chunks = Schedule.INTERLEAVED_ZB, chunks or "1"
        if kind not in tuple(Schedule) or kind in (Schedule.DAG, Schedule.ASYNC_1F1B):
            names = ", ".join(s for s in Schedule if s not in (Schedule.DAG, Schedule.ASYNC_1F1B))
            raise ValueError(f"unknown schedule {kind!r}; expected one of {names}, zb-h1 (KIND or KIND:CHUNKS)")
        if chunks and not chunks.isdigit():
            raise ValueError(f"{word!r}: the chunks per rank after ':' must be a whole number")
        default = 2 if kind in (Schedule.ZBV, Schedule.DUALPIPE_V, Schedule.INTERLEAVED_1F1B, Schedule.LOOPED_BFS) else 1
        out.append((kind, int(chunks) if chunks else default))
    if not out:
        raise ValueError("no schedule named")
    return tuple(out)


@dataclass(frozen=True)
class Variant:
    kind: str
    virtual_stages: int
    plan: Plan | None  # None when the kind cannot take this pipeline
    reason: str = ""  # why not, in one line

    @property
    def label(self) -> str:
        if self.kind == Schedule.INTERLEAVED_ZB and self.virtual_stages == 1:
            return "zb-h1"
        return self.kind if self.virtual_stages == 1 or self.kind in (Schedule.ZBV, Schedule.DUALPIPE_V) \
            else f"{self.kind} v={self.virtual_stages}"


def variants(plan: Plan, cm: CostModel, kinds=DEFAULT_VARIANTS) -> list[Variant]:
    """The plan under each (kind, chunks per rank) of `kinds`, or why it cannot be."""
    out = []
    for kind, virtual in kinds:
        try:
            out.append(Variant(kind, virtual, rewrite(plan, cm, kind, virtual)))
        except ValueError as exc:
            out.append(Variant(kind, virtual, None, str(exc)))
    return out


def rewrite(plan: Plan, cm: CostModel, kind: str, virtual: int) -> Plan:
    """`plan`'s pipeline under `kind` with `virtual` chunks per rank; ValueError (one line) when the
    pipeline cannot take it."""
    if plan.schedule not in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, *MULTI_CHUNK) or plan.multi_chunk:
        raise ValueError(f"a pipeline with one stage per rank is rewritten, not a {plan.schedule} plan")
    if plan.kind is PlanKind.BIPARTITION and virtual > 1:
        raise ValueError("stages with separate backward ranges keep one chunk per rank")
    if plan.kind is PlanKind.LAYERS and len({len(s.devices) for s in plan.stages}) > 1:
        raise ValueError("stages with per-layer strategies on groups of different sizes keep their cut")
    n_ranks = plan.n_stages
    if n_ranks == 1 and kind in MULTI_CHUNK:
        raise ValueError(f"{kind} needs a pipeline of at least 2 ranks; this plan has one stage")
    problem = schedule_problem(kind, n_ranks, virtual, plan.n_micro)
    if problem:
        raise ValueError(problem)
    if virtual == 1:
        return replace(plan, schedule=kind, virtual_stages=1, stage_ranks=(), prediction=None)
    n = n_ranks * virtual
    if n > plan.n_layers:
        raise ValueError(f"{n_ranks} ranks x {virtual} chunks need {n} layers, the model has {plan.n_layers}")
    ranks = stage_ranks(kind, n_ranks, virtual)
    per_rank = [_layer_seconds(plan, cm, plan.stages[r].devices) for r in range(n_ranks)]
    if all(np.array_equal(per_rank[0], x) for x in per_rank[1:]):
        bounds = balanced_bounds(per_rank[0], n)
    else:  # ranks of different speeds (a mixed cluster): each chunk at its own rank's pace
        bounds = balanced_bounds(np.array([per_rank[ranks[i]] for i in range(n)]), n)
    # per-layer strategies (Galvatron's plans) go with their layers: a strategy is a layout over a
    # group's positions, and every rank's group has the same size
    by_layer = {i: s.strategy(i) for s in plan.stages for i in s.layers} if plan.kind is PlanKind.LAYERS else None
    stages = tuple(Stage(LayerRange(bounds[i], bounds[i + 1]), plan.stages[ranks[i]].devices,
                         strategies=tuple(by_layer[j] for j in range(bounds[i], bounds[i + 1])) if by_layer else ())
                   for i in range(n))
    return replace(plan, schedule=kind, virtual_stages=virtual, stage_ranks=(), stages=stages, prediction=None)


def _layer_seconds(plan: Plan, cm: CostModel, devices: tuple[int, ...] | None = None) -> np.ndarray:
    """Each layer's forward + backward at the micro-batch one replica's stage computes, on `devices`
    (default the first stage's): at the pace of their slowest kind, which a group waits for."""
    micro = plan.global_batch / (plan.n_micro * len(plan.stages[0].devices))
    leads = tuple({cm.cluster.device(d).name: d for d in (devices or plan.stages[0].devices)}.values())
    known = cost_model_cache(_SECONDS, cm)  # a search asks for the same few (thousands of times at 1,024 GPUs)
    if (micro, leads) not in known:
        known[micro, leads] = np.max([np.sum(cm.compute(d).arrays(micro)[:2], axis=0) for d in leads], axis=0)
    return known[micro, leads]


_SECONDS: dict = {}  # `_layer_seconds` of the last cost model asked, per micro-batch and lead devices


def chunk_counts_by_balance(plan: Plan, cm: CostModel, keep: int, most: int = 16) -> tuple[int, ...]:
    """The `keep` chunk counts per rank v (2..`most`, at most one layer per chunk) under which
    interleaved 1F1B of `plan`'s pipeline looks fastest by Narayanan et al. 2021 §2.2.2: each rank
    runs v x m chunk passes, paced by the slowest chunk c(v) of the balanced cut, and the fill costs
    p - 1 more, so (v m + p - 1) c(v). Layer counts that divide unevenly leave some chunks a layer
    longer, which paces every rank: Llama-2-70B-like (82 layers) on 8 ranks is cut into chunks of 2
    and 3 layers at v = 4 but of 2 at v = 5 (the simulator: 2.574 against 2.508 s on 1,024 A100s).
    A cheap first pass; the simulator judges what it keeps."""
    n_ranks = plan.n_stages
    seconds = _layer_seconds(plan, cm)
    scored = []
    for v in range(2, min(most, plan.n_layers // n_ranks) + 1):
        bounds = balanced_bounds(seconds, n_ranks * v)
        slowest = max(float(seconds[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        scored.append(((v * plan.n_micro + n_ranks - 1) * slowest, v))
    return tuple(v for _, v in sorted(scored)[:keep])


def balanced_bounds(seconds: np.ndarray, n_parts: int) -> list[int]:
    """Cut points 0 = b_0 < ... < b_n = len(seconds) minimising the largest part's sum (the linear
    partition problem, exact: O(n_parts x layers^2) dynamic programming; ties to the earliest cut).
    `seconds` [layers], or [n_parts, layers] where part k's layers take row k's times (parts on
    devices of different speeds)."""
    seconds = np.asarray(seconds, dtype=float)
    n_layers = seconds.shape[-1]
    rows = np.broadcast_to(seconds, (n_parts, n_layers)) if seconds.ndim == 1 else seconds
    prefixes = np.concatenate([np.zeros((n_parts, 1)), np.cumsum(rows, axis=1)], axis=1)
    best = np.full((n_parts + 1, n_layers + 1), np.inf)
    cut = np.zeros((n_parts + 1, n_layers + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, n_parts + 1):
        prefix = prefixes[k - 1]
        # every end j of the k-th part at once (layers i..j-1, i from k - 1): the same maxima as one j at
        # a time, the starts past j out (inf, after the valid ones: argmin keeps the earliest cut)
        stops = np.arange(k, n_layers - (n_parts - k) + 1)
        starts = np.arange(k - 1, stops[-1])
        with np.errstate(invalid="ignore"):  # inf - inf where layers cannot run: nan, as one j at a time had it
            worst = np.maximum(best[k - 1, starts][None, :], prefix[stops][:, None] - prefix[starts][None, :])
        worst[starts[None, :] >= stops[:, None]] = np.inf
        i = np.argmin(worst, axis=1)
        best[k, stops], cut[k, stops] = worst[np.arange(len(stops)), i], starts[i]
    bounds = [n_layers]
    for k in range(n_parts, 0, -1):
        bounds.append(int(cut[k, bounds[-1]]))
    return bounds[::-1]
