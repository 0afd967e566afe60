"""A layer's strategy: its degree on each parallel axis (plans/axes.py), its layout and its
recomputation (Galvatron-BMW §III, with today's training's refinements)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property

from paraplan.plans.axes import (
    BY_NAME,
    EXPERT_FIELDS,
    LAYER_AXES,
    LAYOUT_AXES,
    REFINEMENTS,
    SEQUENCE,
    ZERO,
    Axis,
    axis_named,
    default_order,
)

DEFAULT_ORDER = default_order()


class Recompute(StrEnum):
    """What a layer keeps for its backward and what it runs again (Korthikanti et al. 2022)."""

    NONE = "none"  # every saved tensor is kept
    SELECTIVE = "selective"  # the attention core (QK^T, softmax, its dropout, attention over V) runs again
    FULL = "full"  # only the layer's input is kept; its forward runs again in the backward (v1: checkpoint)


RECOMPUTES = tuple(r.value for r in Recompute)
ZERO_STAGES = (0, 1, 2)  # over a layer's dp replicas; ZeRO-3 is the sdp degree


@dataclass(frozen=True)
class LayerStrategy:
    """Galvatron-BMW's per-layer choice (§III): data parallel, sharded data parallel (ZeRO-3 /
    FSDP), tensor parallel degrees, and activation checkpointing; with today's training's
    refinements (format version 2): recomputation none / selective / full, the ZeRO stage of the
    dp replicas, sequence parallelism with TP, and a context-parallel degree.

    State sharding per layer: DP (zero 0: every dp replica holds all the states), ZeRO-1 (zero 1:
    the optimizer states sharded over the dp replicas), ZeRO-2 (zero 2: the gradients too), ZeRO-3
    / FSDP (the `sdp` degree: parameters, gradients and optimizer states sharded sdp ways, as in
    version 1). dp and sdp together are hybrid sharding: sharded sdp ways, replicated dp ways.

    The degree fields are named as the axes of `plans/axes.py: LAYER_AXES` (the plan file's keys);
    code reads them through `degree_of(axis)`."""

    dp: int = 1
    sdp: int = 1
    tp: int = 1
    # How the group's devices are laid out, inner-most axis first (axes.LAYOUT_AXES): the inner-most
    # axis's groups are consecutive devices (on the fastest links, Galvatron Takeaway #1). The default
    # is the layout plans assumed before the field existed (tp innermost, then sdp, then dp). Kept
    # canonical: axes of degree 1 go last in the default order, so equal layouts compare equal.
    order: str = DEFAULT_ORDER
    recompute: str = Recompute.NONE  # Recompute: none | selective | full
    zero: int = 0  # axes.ZERO: the ZeRO stage over the dp replicas: 0, 1 or 2 (ZERO_STAGES)
    sequence_parallel: bool = False  # axes.SEQUENCE: with tp > 1, the norms, dropouts and residuals split over tp
    # context parallelism (Megatron-LM's CP, torch's context_parallel): the sequence split cp ways,
    # attention as a ring exchanging K and V; its groups sit right outside tp (axes.CONTEXT.outside),
    # the gradients are all-reduced over dp x cp. Planned and simulated; not run (train says why)
    cp: int = 1
    # a mixture-of-experts layer's expert view of the same devices (axes.EXPERT_AXES; costs/expert_costs.py):
    # its routed experts split ep ways, each expert's matrices etp ways, the rest of the group
    # replicating that; both 1: the experts follow the dense view (split tp ways like its other weights)
    ep: int = 1
    etp: int = 1

    def __post_init__(self):
        if not isinstance(self.recompute, Recompute) and self.recompute in RECOMPUTES:
            object.__setattr__(self, "recompute", Recompute(self.recompute))  # an unknown one: validate() names it
        names = self.order.split(",")
        if sorted(names) == sorted(a.name for a in LAYOUT_AXES):  # a malformed order is left for validate() to name
            axes = [axis_named(n) for n in names]
            canonical = [a for a in axes if self.degree_of(a) > 1] + [a for a in LAYOUT_AXES if self.degree_of(a) <= 1]
            object.__setattr__(self, "order", ",".join(a.name for a in canonical))

    def degree_of(self, axis: Axis) -> int:
        return getattr(self, axis.name)

    def refinement_value(self, refinement) -> object:
        """The value of one of axes.REFINEMENTS (the ZeRO stage, sequence parallelism)."""
        return getattr(self, refinement.field)

    @property
    def checkpoint(self) -> bool:
        """Full recomputation (version 1's `checkpoint`, Galvatron's CKPT)."""
        return self.recompute == Recompute.FULL

    @cached_property  # read in the planners' inner loops: computed once per strategy
    def layout(self) -> tuple[Axis, ...]:
        """The layout axes in `order`, inner-most first; a name that is no layout axis is left out
        (plan.validate names it), so that a strategy still prints before it is validated."""
        return tuple(a for a in (BY_NAME.get(n) for n in self.order.split(",")) if a is not None and a.in_layout)

    @cached_property  # read in the planners' inner loops: computed once per strategy
    def dims(self) -> tuple[tuple[Axis, int], ...]:
        """(axis, degree) of every axis used, inner-most first: the layout axes in `order`, and each
        axis outside the order right outside the axis it names (inner-most without it)."""
        out = [(a, self.degree_of(a)) for a in self.layout if self.degree_of(a) > 1]
        for axis in LAYER_AXES:
            if not axis.in_layout and self.degree_of(axis) > 1:
                at = next((k + 1 for k, (a, _) in enumerate(out) if a.name == axis.outside), 0)
                out.insert(at, (axis, self.degree_of(axis)))
        return tuple(out)

    def __str__(self) -> str:
        """'SDP4 x TP2 + CKPT': outer-most axis first (the last named is on the fastest links);
        ZeRO-1/2 on the dp axis as 'DP4 (ZeRO-2)', sequence parallelism as 'TP2+SP', context
        parallelism as 'CP2', selective recomputation as '+ SEL', an expert view as ', experts EP8 x ETP2'."""
        def name(axis: Axis, k: int) -> str:
            extra = (f" (ZeRO-{self.zero})" if axis is ZERO.host and self.zero
                     else "+SP" if axis is SEQUENCE.host and self.sequence_parallel else "")
            return f"{axis.label}{k}{extra}"

        text = " x ".join(name(a, k) for a, k in reversed(self.dims)) or "1 device"
        experts = " x ".join(f"{a.label}{self.degree_of(a)}" for a in reversed(EXPERT_FIELDS) if self.degree_of(a) > 1)
        return text + (f", experts {experts}" if experts else "") + \
            {"full": " + CKPT", "selective": " + SEL"}.get(self.recompute, "")

    def _product(self, counts) -> int:
        out = 1
        for axis in LAYER_AXES:
            if counts(axis):
                out *= self.degree_of(axis)
        return out

    @cached_property  # read in the planners' inner loops: computed once per strategy
    def degree(self) -> int:
        """The devices of the layer's group: the product of its degrees."""
        return self._product(lambda axis: True)

    @cached_property  # read in the planners' inner loops: computed once per strategy
    def data_degree(self) -> int:
        """How many ways the micro-batch is split (the axes that split the batch: dp, sdp)."""
        return self._product(lambda axis: axis.splits_batch)

    @cached_property  # read in the planners' inner loops: computed once per strategy
    def sync_degree(self) -> int:
        """The size of the group the gradients are summed over after the backward (dp x cp); with sdp,
        FSDP's reduce-scatter sums the cp ranks' (`fsdp_degree`), which leaves dp."""
        if self.sdp > 1:
            return self.dp
        return self._product(lambda axis: axis.syncs_gradients)

    @cached_property  # read in the planners' inner loops: computed once per strategy
    def fsdp_degree(self) -> int:
        """The ranks FSDP (sdp) shards the states over: sdp, and with context parallelism its cp ranks
        too, which hold the same weights (torchtitan 0.3.0's FSDP mesh is dp_shard x cp; Megatron-LM's
        FSDP shards over its data-parallel group with CP); 1 without sdp."""
        return self.sdp * self.cp if self.sdp > 1 else 1


assert {r.field for r in REFINEMENTS} <= set(LayerStrategy.__dataclass_fields__)
assert {a.name for a in (*LAYER_AXES, *EXPERT_FIELDS)} <= set(LayerStrategy.__dataclass_fields__)
