"""What a plan asks of an engine, in the terms the engines' configurations share (issue 32): one
pipeline of equal device groups, one parallel strategy for every transformer block, degrees, the
schedule and its micro-batches, recomputation and precision (with an FP8 plan's scaling recipe).

`engine_layout` reads a plan (and its model's layer kinds) into an `EngineLayout`, or raises
`ExportRefused` naming the first feature no engine's configuration can express: an operator
placement (FD-DPS), separate backward ranges (Bi-Partition), stages on different numbers of
devices, different strategies in different blocks, a layout that does not put tensor parallelism
on the innermost devices. What one engine can and cannot run beyond that is in its own module.

Pure: plans and layer kinds in, a frozen dataclass out.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.errors import ParaplanError
from paraplan.plans.axes import LAYER_AXES, TENSOR
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import GradSync, LayerStrategy, Plan, Recompute
from paraplan.plans.schedules import Schedule
from paraplan.precision import Precision

ENGINES = ("torchtitan", "megatron", "deepspeed")
ENGINE_NAMES = {"torchtitan": "torchtitan", "megatron": "Megatron-LM", "deepspeed": "DeepSpeed"}


class ExportRefused(ParaplanError):
    """The plan uses a feature the engine cannot express; the message names it in one line."""

    def __init__(self, engine: str, feature: str):
        self.engine = engine
        self.feature = feature
        name = ENGINE_NAMES.get(engine, "no engine")
        super().__init__(f"{name} cannot run this plan: {feature}")


@dataclass(frozen=True)
class EngineLayout:
    world: int  # devices the plan runs on
    pp: int  # pipeline ranks
    virtual: int  # model chunks per pipeline rank (interleaved / V schedules)
    tp: int
    sequence_parallel: bool
    cp: int
    dp_replicate: int  # plain data-parallel replicas (the plan's dp degree)
    dp_shard: int  # ZeRO-3 / FSDP sharding degree (the plan's sdp degree)
    zero: int  # ZeRO stage over the replicas (0, 1, 2)
    recompute: Recompute  # of the transformer blocks (embedding and head are not recomputed by engines)
    precision: Precision
    schedule: Schedule
    n_micro: int  # micro-batches per data-parallel rank per iteration
    micro_batch: int  # samples per micro-batch per data-parallel rank
    global_batch: int
    blocks_per_stage: tuple[int, ...]  # transformer blocks in each stage, in stage order
    layers_per_stage: tuple[tuple[int, ...], ...]  # the plan's layer indices of each stage
    stage_ranks: tuple[int, ...]  # the pipeline rank of each stage
    actions: tuple[tuple[str, ...], ...]  # the plan's per-rank order of actions ("F<micro>.<stage>"), or ()
    grad_sync: GradSync
    notes: tuple[str, ...] = ()  # what runs differently in an engine than in paraplan's simulator
    # a mixture of experts' expert view (costs/expert_costs.py), the same on every block with experts;
    # (1, 1): the experts follow the dense layout (Megatron's default expert-tensor-parallel size = tp)
    ep: int = 1
    etp: int = 1
    expert_overlap: bool = False  # Megatron-LM's all-to-all overlap (plans/expert_overlap.py)
    expert_dispatcher: str = "alltoall"  # the token dispatcher (plans/expert_dispatch.py)
    fp8_recipe: str = ""  # an fp8 plan's scaling recipe (precision.py FP8_RECIPES), "" for any other precision
    fp8_param_gather: bool = False  # its parameters all-gathered in FP8 (Plan.fp8_param_gather)

    @property
    def dp(self) -> int:
        """Data-parallel ranks: the batch is split this many ways."""
        return self.dp_replicate * self.dp_shard

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: the plan's etp with an expert view, else tp (the
        experts follow the dense layout: Megatron's default)."""
        return self.etp if self.ep * self.etp > 1 else self.tp

    @property
    def experts_world(self) -> int:
        """The devices of one pipeline rank, which the expert view folds over."""
        return self.world // self.pp

    @property
    def even_blocks(self) -> bool:
        return len(set(self.blocks_per_stage)) == 1


def engine_layout(plan: Plan, kinds: tuple[str, ...]) -> EngineLayout:
    """The plan in the engines' shared terms; `kinds` is the model's layer kinds in order
    ("embedding", "block", "head", ...). Raises ExportRefused (engine "any")."""
    if plan.kind is PlanKind.OPERATORS:
        raise ExportRefused("any", "an operator placement (FD-DPS and its baselines) is not a stage pipeline")
    if plan.kind is PlanKind.BIPARTITION and any(s.backward != s.layers for s in plan.stages):
        raise ExportRefused("any", "separate forward and backward ranges (Bi-Partition)")
    if len(kinds) != plan.n_layers:
        raise ParaplanError(f"the plan has {plan.n_layers} layers but its model {plan.model} has {len(kinds)}")
    if any(s.shares for s in plan.stages):
        raise ExportRefused("any", "devices taking unequal shares of each micro-batch (every engine splits a "
                                   "micro-batch evenly over its data-parallel ranks)")
    sizes = {len(s.devices) for s in plan.stages}
    if len(sizes) > 1:
        raise ExportRefused("any", f"stages on different numbers of devices ({', '.join(str(len(s.devices)) for s in plan.stages)}): "
                                   "uneven data-parallel groups (torchtitan, Megatron-LM and DeepSpeed take one "
                                   "data-parallel degree for every pipeline stage)")
    if "block" not in kinds:  # a CNN or a user's module: every layer is a unit of the cut
        kinds = ("block",) * len(kinds)
    blocks = [(i, s.strategy(i)) for s in plan.stages for i in s.layers if kinds[i] == "block"]
    others = [(i, s.strategy(i)) for s in plan.stages for i in s.layers if kinds[i] != "block"]
    first_layer, first = blocks[0]
    for i, st in blocks[1:]:
        if _degrees(st) != _degrees(first) or st.recompute != first.recompute or st.sequence_parallel != first.sequence_parallel:
            raise ExportRefused("any", f"per-layer different strategies (layer {first_layer}: {first}; layer {i}: {st})")
    for i, st in others:  # the embedding and head follow the blocks' degrees in every engine
        if _degrees(st) != _degrees(first):
            raise ExportRefused("any", f"per-layer different strategies (layer {i} ({kinds[i]}): {st}; blocks: {first})")
    experts = {(st.ep, st.etp) for _, st in blocks if st.ep * st.etp > 1}
    if len(experts) > 1:
        raise ExportRefused("any", f"blocks with different expert layouts ({', '.join(f'EP{a} x ETP{b}' for a, b in sorted(experts))})")
    ep, etp = experts.pop() if experts else (1, 1)
    if first.tp > 1 and first.layout[0] is not TENSOR:
        raise ExportRefused("any", f"tensor parallelism not on the innermost devices (layout {first.order}): the engines "
                                   "put it there")
    n_ranks = plan.n_ranks
    world = len(plan.devices)
    per_stage = len(plan.stages[0].devices)
    if per_stage != first.degree:
        raise ExportRefused("any", f"a stage of {per_stage} devices runs blocks over {first.degree}")
    data = first.data_degree
    if plan.global_batch % (plan.n_micro * data):
        raise ExportRefused("any", f"{plan.global_batch} samples in {plan.n_micro} micro-batches over {data} "
                                   "data-parallel ranks is not a whole number per rank")
    notes = []
    if plan.grad_sync == GradSync.GROPIPE_DELAYED:
        notes.append("gradients are synchronised by the engine's own data parallelism (GroPipe's delayed "
                     "per-stage all-reduce is not a setting)")
    return EngineLayout(
        world=world, pp=n_ranks, virtual=plan.virtual_stages, tp=first.tp, sequence_parallel=first.sequence_parallel,
        cp=first.cp, dp_replicate=first.dp, dp_shard=first.sdp, zero=first.zero, recompute=Recompute(first.recompute),
        precision=Precision(plan.precision), schedule=Schedule(plan.schedule), n_micro=plan.n_micro,
        micro_batch=plan.global_batch // (plan.n_micro * data), global_batch=plan.global_batch,
        blocks_per_stage=tuple(sum(kinds[i] == "block" for i in s.layers) for s in plan.stages),
        layers_per_stage=tuple(tuple(s.layers) for s in plan.stages), stage_ranks=plan.rank_of_stage,
        actions=tuple(plan.actions), grad_sync=plan.grad_sync, notes=tuple(notes), ep=ep, etp=etp,
        expert_overlap=plan.expert_overlap, expert_dispatcher=plan.expert_dispatcher, fp8_recipe=plan.fp8_recipe,
        fp8_param_gather=plan.fp8_param_gather)


def _degrees(st: LayerStrategy) -> tuple:
    return (*(st.degree_of(a) for a in LAYER_AXES), st.zero, st.order)
