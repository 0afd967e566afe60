"""Galvatron-BMW's search space (§III-B): decision trees per pipeline degree, Takeaway #3 pruning.

Construction (the one that gives the paper's 68 and 44 candidates for 8 devices):
  - PP degree P in {1, 2, 4, ..., N} first (Takeaway #1); each stage gets a group of N / P devices
    (Takeaway #2: equal groups, the same strategy on every group of a layer);
  - on a group of g devices, a decision tree is an ordered sequence of distinct dimensions from
    {DP, SDP, TP} with power-of-two degrees >= 2 whose product is g; the order is the layout, the
    last level (the leaves) inner-most, on the fastest links. On one device the tree is empty;
  - every tree with or without activation checkpointing (CKPT).
  For 8 devices: g = 8: 3 one-level trees + 6 ordered pairs x 2 degree splits + 3! three-level
  trees = 21; g = 4: 3 + 6 = 9; g = 2: 3; g = 1: 1. (21 + 9 + 3 + 1) x 2 = 68.
  Takeaway #3 removes every tree that holds both DP and SDP: g = 8 keeps 3 + 4 x 2 = 11, g = 4
  keeps 3 + 4 = 7: (11 + 7 + 3 + 1) x 2 = 44.

Beyond the paper (`variant_strategies(today=True)`): planning in mixed precision, the variants
with CKPT (Galvatron-Base, Galvatron-BMW) also search what today's large-model training combines:
ZeRO-1 / ZeRO-2 over the dp replicas of every tree with DP (the paper's DP is ZeRO-0, its SDP
ZeRO-3), selective recomputation of the attention core between none and full CKPT, and Megatron
sequence parallelism with TP on the layers the runtime runs it on. In fp32,
the papers' setting and their reproductions, the space is the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import permutations

from paraplan.errors import FieldError
from paraplan.plans.axes import DATA, LAYOUT_AXES, PIPELINE, SHARDED_DATA, TENSOR, Axis
from paraplan.plans.plan import LayerStrategy

# Galvatron's decision trees (§III-B) split a group over the layout axes (dp, sdp, tp); the paper
# lists them dp, sdp, tp, the order its trees are enumerated in
TREE_AXES = (DATA, SHARDED_DATA, TENSOR)
assert set(TREE_AXES) == set(LAYOUT_AXES)


@dataclass(frozen=True)
class Candidate:
    """One leaf of the decision trees: a pipeline degree and the strategy of a layer's group."""

    pp: int
    strategy: LayerStrategy

    def __str__(self) -> str:
        return (f"PP{self.pp} x " if self.pp > 1 else "") + str(self.strategy)


def is_power_of_two(n: int) -> bool:
    return isinstance(n, int) and n >= 1 and n & (n - 1) == 0


def _compositions(log2: int, parts: int):
    """Ordered ways to write 2**log2 as a product of `parts` powers of two, each >= 2."""
    if parts == 0:
        if log2 == 0:
            yield ()
        return
    for first in range(1, log2 - parts + 2):
        for rest in _compositions(log2 - first, parts - 1):
            yield (2**first, *rest)


def group_strategies(group_size: int, prune: bool = True, checkpoint: bool = True) -> tuple[LayerStrategy, ...]:
    """The decision trees of one device group (without PP), each without and with CKPT (when
    `checkpoint`); `prune` applies Takeaway #3 (no tree with both DP and SDP)."""
    if not is_power_of_two(group_size):
        raise FieldError("devices", f"a device group must be a power of two, got {group_size}")
    log2 = group_size.bit_length() - 1
    trees: list[LayerStrategy] = []
    for depth in range(0, min(3, log2) + 1):
        for axes in permutations(TREE_AXES, depth):  # outer-most first
            if prune and {DATA, SHARDED_DATA} <= set(axes):  # Takeaway #3: never both DP and SDP
                continue
            for degrees in _compositions(log2, depth):
                degree = {a.name: k for a, k in zip(axes, degrees, strict=True)}
                order = ",".join(a.name for a in [*reversed(axes), *[a for a in LAYOUT_AXES if a not in axes]])
                trees.append(LayerStrategy(**degree, order=order))
    flags = (False, True) if checkpoint else (False,)
    return tuple(LayerStrategy(dp=t.dp, sdp=t.sdp, tp=t.tp, recompute="full" if c else "none", order=t.order) for c in flags for t in trees)


def pp_degrees(n_devices: int, n_layers: int | None = None) -> tuple[int, ...]:
    """1, 2, 4, ... up to the device count (and the layer count)."""
    if not is_power_of_two(n_devices):
        raise FieldError("devices", f"Galvatron's decision trees need a power-of-two device count, got {n_devices}")
    out, p = [], 1
    while p <= n_devices and (n_layers is None or p <= n_layers):
        out.append(p)
        p *= 2
    return tuple(out)


def strategy_space(n_devices: int, prune: bool = True, checkpoint: bool = True) -> tuple[Candidate, ...]:
    """Every candidate of Galvatron's decision trees for `n_devices` (a power of two): 68 for 8
    devices, 44 with Takeaway #3 (`prune`)."""
    return tuple(Candidate(p, s) for p in pp_degrees(n_devices)
                 for s in group_strategies(n_devices // p, prune, checkpoint))


@dataclass(frozen=True)
class Variant:
    name: str
    summary: str
    schedules: tuple[str, ...]  # the first is the default; all of them are searched unless the request fixes one
    dims: frozenset[Axis] = frozenset(TREE_AXES)  # the axes its trees may use
    checkpoint: bool = True
    pp: str = "any"  # "any": every power of two; "one": no pipeline; "all": one device per stage
    bmw: bool = False  # Algorithm 2 (bi-objective partition) instead of the even partition
    fixed_3d: bool = False  # DeepSpeed 3D: PP 2 x (DP x TP 2) on every layer


_ALL = frozenset(TREE_AXES)
# The baselines of one axis are named after it (`--planner dp`: pure data parallelism)
VARIANTS = (
    Variant(DATA.name, "pure data parallelism (PyTorch DDP) over every device", ("gpipe",), frozenset({DATA}), False,
            "one"),
    Variant(SHARDED_DATA.name, "pure sharded data parallelism (FSDP / ZeRO-3) over every device", ("gpipe",),
            frozenset({SHARDED_DATA}), False, "one"),
    Variant(TENSOR.name, "pure tensor parallelism (Megatron) over every device", ("gpipe",), frozenset({TENSOR}), False,
            "one"),
    Variant(PIPELINE.name, "pure pipeline parallelism (GPipe), one device per stage, even partition", ("gpipe",),
            frozenset(), False, "all"),
    Variant("dp+tp", "Galvatron restricted to DP and TP per layer, no pipeline, no checkpointing", ("gpipe",),
            frozenset({DATA, TENSOR}), False, "one"),
    Variant("dp+pp", "Galvatron restricted to DP and PP (even partition), no checkpointing", ("gpipe",),
            frozenset({DATA}), False),
    Variant("deepspeed-3d", "DeepSpeed 3D: 2-way PP x 2-way TP x DP on every layer, 1F1B", ("1f1b", "gpipe"),
            _ALL, False, fixed_3d=True),
    Variant("galvatron", "Galvatron: per-layer DP / SDP / TP with PP (even partition), no checkpointing, GPipe",
            ("gpipe",), _ALL, False),
    Variant("galvatron-base", "Galvatron-Base (Algorithm 1): per-layer DP / SDP / TP / CKPT, PP with an even partition",
            ("gpipe", "1f1b"), _ALL, True),
    Variant("galvatron-1f1b-biobj", "Galvatron with 1F1B and the bi-objective partition (BMW without checkpointing)",
            ("1f1b",), _ALL, False, bmw=True),
    Variant("galvatron-bmw", "Galvatron-BMW (Algorithm 2): per-layer DP / SDP / TP / CKPT, bi-objective PP partition",
            ("1f1b", "gpipe"), _ALL, True, bmw=True),
)


def variant_strategies(variant: Variant, group: int, today: bool = False, selective: bool = False,
                       sequence_parallel: bool = False, context_parallel: int = 1,
                       experts: int = 0) -> tuple[LayerStrategy, ...]:
    """The variant's strategies on a group of `group` devices. `today` (a variant with CKPT planning
    in mixed precision, `todays_space`): the paper's trees and, beyond the paper, ZeRO-1 and ZeRO-2
    over the dp replicas of every tree with DP and no SDP, and selective recomputation (Korthikanti
    et al. 2022) of every tree when the model has an attention core to recompute (`selective`), and
    Megatron sequence parallelism (Korthikanti et al. 2022 §4.2.2) on every tree with TP that keeps
    more than its layer's input (`sequence_parallel`: the searcher allows it only on the layers the
    runtime runs it on). With full recomputation SP would change nothing the cost model counts (a
    checkpointed layer keeps only its input, already split), so those are left out. With
    `context_parallel` > 1 (the planner option of that name, off by default: paraplan's runtime does
    not run CP, so only a plan for another engine wants it), every tree of g / k devices with plain
    data parallelism also over k = 2, 4, ... <= context_parallel context-parallel ranks. With
    `experts` (a mixture of experts' routed experts per layer, 0: none), a variant searching every
    axis also lays them out (`with_expert_views`)."""
    if experts and variant.dims == _ALL and not variant.fixed_3d:
        return with_expert_views(variant_strategies(variant, group, today, selective, sequence_parallel,
                                                    context_parallel), group, experts)
    if variant.fixed_3d:
        tp = min(2, group)
        return (LayerStrategy(dp=group // tp, tp=tp),)
    paper = tuple(s for s in group_strategies(group, prune=True, checkpoint=variant.checkpoint)
                  if {d for d, _ in s.dims} <= variant.dims)
    if not (today and variant.checkpoint):
        return paper
    out = list(paper)
    out += [replace(s, zero=z) for s in paper if s.dp > 1 and s.sdp == 1 for z in (1, 2)]
    if selective:
        out += [replace(s, recompute="selective") for s in list(out) if s.recompute == "none"]
    if sequence_parallel:
        out += [replace(s, sequence_parallel=True) for s in list(out) if s.tp > 1 and s.recompute != "full"]
    k = 2
    while k <= min(context_parallel, group):
        inner = variant_strategies(variant, group // k, today, selective, sequence_parallel)
        out += [replace(s, cp=k) for s in inner if s.sdp == 1 and not s.zero]
        k *= 2
    return tuple(out)


def with_expert_views(strategies: tuple[LayerStrategy, ...], group: int, experts: int) -> tuple[LayerStrategy, ...]:
    """Beyond the paper (issue 50 item 3): each strategy also with its routed experts over ep = 2, 4,
    ... ranks (ep dividing the group and the experts), etp 1 (Megatron-core's MoE recipes) and, with
    tp, etp = tp (its default folding); where the expert view is modelled (plans/plan.py: sequence
    parallelism with tp, one kind of data axis, no cp). The searcher allows them on the layers that
    have experts only (planners/galvatron/arrays.py)."""
    out = list(strategies)
    for s in strategies:
        if (s.tp > 1 and not s.sequence_parallel) or (s.sdp > 1 and s.dp > 1) or s.cp > 1:
            continue
        ep = 2
        while ep <= group and group % ep == 0 and experts % ep == 0:
            out.append(replace(s, ep=ep))
            if s.tp > 1 and group % (ep * s.tp) == 0:
                out.append(replace(s, ep=ep, etp=s.tp))
            ep *= 2
    return tuple(out)


def even_partition(n_layers: int, n_stages: int) -> tuple[int, ...]:
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(n_stages))


def more_micro_counts(request, batch: int, n_stages: int, tried: tuple[int, ...]):
    """Beyond the paper's P, 2P, 4P (issue 31: at large batches memory forced recomputation that more,
    smaller micro-batches avoid): the next doublings of the largest count tried, that divide the
    batch; without a pipeline, gradient accumulation over 2, 4, ... micro-batches. The search takes
    them one at a time while they improve its estimate (batch.py: search_batch)."""
    if request.n_micro:
        return
    m = max(tried) if tried else 1
    while batch % (2 * m) == 0:
        m *= 2
        yield m


def micro_counts(request, batch: int, n_stages: int) -> tuple[int, ...]:
    """Micro-batch counts tried (Init_Microbatch_Num): the request's, else 1 without a pipeline and
    P, 2P, 4P with one (those that divide the batch; for a degree that is not a power of two, the next
    counts that do)."""
    if request.n_micro:
        return (request.n_micro,) if batch % request.n_micro == 0 else ()
    if n_stages == 1:
        return (1,)
    if not is_power_of_two(n_stages):  # a wider degree or a count exact_stages holds: the next divisors
        # P, 2P, 4P rarely divide a batch of powers of two (3 stages, batch 56: none), so each
        # stands for the smallest count at least as large that does (4, 7, 14)
        return tuple(sorted({next(d for d in range(m, batch + 1) if batch % d == 0)
                             for m in (n_stages, 2 * n_stages, 4 * n_stages) if m <= batch})) or (1,)
    return tuple(m for m in (n_stages, 2 * n_stages, 4 * n_stages) if batch % m == 0) or (1,)


def held_stage_count(request, allowed: tuple[int, ...], name: str) -> tuple[tuple[int, ...], str]:
    """The pipeline degrees a planner of the family searches for `request`, from the `allowed` ones,
    and a note where the request's stage count cannot be kept (held to it with exact_stages: groups
    of the largest power of two that fits, the other devices idle)."""
    layers = request.costs.model.n_layers
    if request.n_stages is None:
        return allowed, ""
    if request.exact_stages:
        if request.n_stages > layers:
            raise FieldError("stages", f"{request.n_stages} stages for a model of {layers} layers")
        return (request.n_stages,), ""
    if request.n_stages in allowed:
        return (request.n_stages,), ""
    return allowed, (f"{name}: {' or '.join(map(str, allowed))} pipeline stage(s) on {request.n_devices} "
                     f"devices (Galvatron's degrees, at most one stage per layer), not {request.n_stages}; "
                     f"exact_stages forces {request.n_stages}")


def usable_devices(request) -> int:
    """Galvatron's trees need a power-of-two device count: the largest that the cluster has."""
    return 2 ** (request.n_devices.bit_length() - 1)


def stage_group(n_devices: int, n_stages: int) -> int:
    """Each stage's devices: the largest power of two that n / P holds (Galvatron's trees)."""
    return 2 ** ((n_devices // n_stages).bit_length() - 1)


def pipeline_degrees(request) -> tuple[int, ...]:
    """Every pipeline degree the family searches for `request`: the paper's powers of two over the
    largest power of two of its devices, and the wider degrees beyond them, ascending."""
    layers = request.costs.model.n_layers
    return tuple(sorted(pp_degrees(usable_devices(request), layers) + wider_pp_degrees(request.n_devices, layers)))


def wider_pp_degrees(n_devices: int, n_layers: int) -> tuple[int, ...]:
    """Beyond the paper (§III-B: a power-of-two device count, power-of-two pipeline degrees): on a
    cluster whose device count is not a power of two, the degrees P whose stages of power-of-two
    groups (`stage_group`) use more of its devices than any smaller degree does, P x g > the
    largest power of two. On Bi-Partition's 7 VMs: 3 stages of 2 VMs (6) and 7 of 1, where the
    paper's degrees use 4; AlexNet there: Galvatron 3.16 s in 3 stages of DP2 / TP2 layers against
    4.45 s on 4 VMs (CSIMD's 7 stages: 3.36 s; benchmarks/bound_gap.py's request). At most log2(n)
    more degrees; none on a power-of-two cluster, where the search is the paper's."""
    most = 2 ** (n_devices.bit_length() - 1)
    out = []
    for p in range(3, min(n_devices, n_layers) + 1):
        used = p * stage_group(n_devices, p)
        if used > most and not is_power_of_two(p):
            out.append(p)
            most = used
    return tuple(out)
