"""The parallel axes: every way paraplan splits a layer's work over devices, one entry each.

This table is the one place an axis is named. Everything that needs to know what an axis does
(the layout of a group's devices, each axis's group and link, which slice of the batch or of the
sequence a device holds, which group sums the gradients, the runtime's device mesh, the plan
file's keys) reads it from the entries' fields instead of testing a name; a test
(tests/unit/test_axes.py) refuses the axis names as string literals anywhere else in src/paraplan;
the plan file's keys are the axes' names.

A layer strategy (`plans/layer_strategy.py: LayerStrategy`) has a degree on each of `LAYER_AXES`; its
`order` lays out the `in_layout` axes inner-most first (the inner-most axis's groups are
consecutive devices, on the fastest links: Galvatron-BMW Takeaway #1); an axis outside the order
sits right outside the axis it names in `outside` (Megatron-LM's tp-cp-dp order), inner-most when
that one is absent. Pipeline stages are the plan's `stages`, not a layer degree; they are the
outer-most dimension of the runtime's mesh. ZeRO-1/2 and sequence parallelism are refinements:
options of their host axis, with no group of their own.

Adding an axis (docs/architecture.md, "Adding a parallel dimension"): an entry here, a degree
field on LayerStrategy, and the places that cost, run and export what it does. The experts of a
mixture-of-experts model are a second view of the same devices (`view="expert"`: expert-parallel,
expert-tensor-parallel and expert-data-parallel axes with their own groups and FSDP mesh); the
field is here so that the dense view's code can already ask for its own axes only.
"""

from __future__ import annotations

from dataclasses import dataclass


# eq=False: an axis is one object of this table (identity is equality, and a C-level hash keeps
# the planners' dict lookups fast); pickled by name (__reduce__) so that it stays one object
@dataclass(frozen=True, eq=False, repr=False)
class Axis:
    name: str  # the plan file's key of its degree, its name in LayerStrategy.order and in the device mesh
    label: str  # for people: 'SDP4 x TP2'
    title: str
    shards: str  # what each rank of the axis's group holds a part of
    collectives: str  # what its group runs in a training step
    splits_batch: bool = False  # its ranks process different samples of the micro-batch (costs/strategy.py: data_rank)
    splits_sequence: bool = False  # its ranks hold different positions of each sequence (context_rank)
    syncs_gradients: bool = False  # its ranks hold the same parameters: their gradients are summed over its group
    shards_states: bool = False  # parameters, gradients and optimizer states sharded over its group (FSDP)
    in_layout: bool = True  # its place in LayerStrategy.order is the plan's to choose
    outside: str | None = None  # not in_layout: sits right outside the axis of this name (inner-most without it)
    view: str = "dense"  # the view of the devices it belongs to ("expert": mixture-of-experts' own axes)

    def __str__(self) -> str:
        return self.label

    def __repr__(self) -> str:
        return f"Axis({self.name!r})"

    def __lt__(self, other: Axis) -> bool:  # layouts sort by their axes' names, as they did as strings
        return self.name < other.name

    def __reduce__(self):
        """Pickled by name: a strategy's cached axes come back from another process as the table's
        own objects, so `axis is TENSOR` holds there too."""
        return axis_named, (self.name,)


TENSOR = Axis("tp", "TP", "tensor parallelism (Megatron-LM)", shards="each Linear's weight, by column or by row",
              collectives="an all-reduce of the activations per block in the forward and in the backward "
                          "(with sequence parallelism: a reduce-scatter and an all-gather)")
CONTEXT = Axis("cp", "CP", "context parallelism (ring attention)", shards="the sequence",
               collectives="K and V passed round a ring in each attention; the gradients all-reduced with dp's",
               splits_sequence=True, syncs_gradients=True, in_layout=False, outside="tp")
SHARDED_DATA = Axis("sdp", "SDP", "sharded data parallelism (FSDP / ZeRO-3)",
                    shards="the batch, and the parameters, gradients and optimizer states",
                    collectives="an all-gather of each layer's parameters in the forward and in the backward, "
                                "a reduce-scatter of its gradients", splits_batch=True, shards_states=True)
DATA = Axis("dp", "DP", "data parallelism (DDP; ZeRO-1/2 with `zero`)", shards="the batch",
            collectives="an all-reduce of the gradients (ZeRO-1/2: a reduce-scatter, then an all-gather of the "
                        "updated parameters)", splits_batch=True, syncs_gradients=True)
PIPELINE = Axis("pp", "PP", "pipeline parallelism", shards="the layers (a plan's stages)",
                collectives="activations and their gradients sent point to point between stages",
                in_layout=False)

# The expert view of the same devices (a mixture-of-experts layer's routed experts; Megatron-core's
# parallel folding; costs/expert_costs.py), inner-most first: etp, ep, then edp, which is derived (the
# group's devices / (ep x etp)), not a strategy field. Nothing that iterates LAYER_AXES sees them.
EXPERT_TENSOR = Axis("etp", "ETP", "expert tensor parallelism (Megatron-core)",
                     shards="each routed expert's matrices", collectives="the routed tokens all-gathered before "
                     "the experts and reduce-scattered after them, each pass", in_layout=False, view="expert")
EXPERT = Axis("ep", "EP", "expert parallelism", shards="the routed experts (E / ep on each rank)",
              collectives="each token's routed copies sent to their experts' ranks and the results sent back: "
                          "two all-to-alls per pass", in_layout=False, view="expert")
EXPERT_DATA = Axis("edp", "EDP", "expert data parallelism (derived: devices / (ep x etp))",
                   shards="nothing (with sdp, ZeRO-1 or ZeRO-2: the experts' states as the dense view shards its own)",
                   collectives="the routed experts' gradients summed over the replicas", syncs_gradients=True,
                   in_layout=False, view="expert")
EXPERT_AXES = (EXPERT_TENSOR, EXPERT, EXPERT_DATA)
EXPERT_FIELDS = (EXPERT_TENSOR, EXPERT)  # LayerStrategy's degree fields of the expert view

# A layer strategy's degrees on the dense view of the devices, in the default layout, inner-most first
# (the layout plans assumed before `order` existed: tp innermost, then sdp, then dp); CONTEXT is
# placed by its `outside`.
DENSE = "dense"
LAYER_AXES = (TENSOR, CONTEXT, SHARDED_DATA, DATA)
assert all(a.view == DENSE for a in LAYER_AXES)
LAYOUT_AXES = tuple(a for a in LAYER_AXES if a.in_layout)
AXES = (*LAYER_AXES, PIPELINE)
BY_NAME = {a.name: a for a in AXES}
assert all(a.view != DENSE for a in EXPERT_AXES)


@dataclass(frozen=True)
class Refinement:
    """An option of one axis, with no group of its own."""

    field: str  # LayerStrategy's field
    host: Axis
    title: str


ZERO = Refinement("zero", DATA, "ZeRO-1 (1: the optimizer states) or ZeRO-2 (2: the gradients too) sharded over "
                                "the dp replicas")
SEQUENCE = Refinement("sequence_parallel", TENSOR, "sequence parallelism: the norms, dropouts and residuals split "
                                                   "over the tp ranks")
REFINEMENTS = (ZERO, SEQUENCE)


def axis_named(name: str) -> Axis:
    """The axis of a plan file's key or of a name in an order ('tp'); KeyError for another."""
    return BY_NAME[name]


def default_order() -> str:
    """LayerStrategy.order's default: the layout axes, inner-most first."""
    return ",".join(a.name for a in LAYOUT_AXES)


def gradient_sync_axes() -> tuple[Axis, ...]:
    """The axes whose ranks hold the same parameters: the gradients are summed over their product
    (dp x cp, as Megatron-LM all-reduces over both)."""
    return tuple(a for a in LAYER_AXES if a.syncs_gradients)
