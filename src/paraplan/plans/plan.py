"""The Plan: one frozen description that can express every method's answer.

- CSIMD / GPipe / 1F1B baselines: contiguous `stages`, one device each, `n_micro` micro-batches.
- GroPipe: N groups x k stages: each stage lists its N devices (one per group; data parallel
  across groups, `grad_sync="gropipe-delayed"`); replica r of the pipeline is devices[r] of
  every stage.
- Galvatron-BMW: stages with per-layer `strategies` (dp / sdp / tp degrees, checkpointing) whose
  product equals the stage's device count.
- Bi-Partition: each stage also has `backward_layers`, its own backward range; either range of a
  stage may be empty (start == stop), not both.
- FD-DPS: `schedule="dag"` and `operators`: per device, the operators it runs, in order.

`validate` checks a plan on its own (every error names the field); `check_fits` checks it against
a model's layer count and a cluster's device count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from paraplan.errors import ParaplanError
from paraplan.plans.axes import LAYOUT_AXES
from paraplan.plans.kinds import PlanKind, kind_of

# LayerStrategy and its enums live in their own module; imported here too, where every plan reader looks
from paraplan.plans.layer_strategy import DEFAULT_ORDER, RECOMPUTES, ZERO_STAGES, LayerStrategy, Recompute  # noqa: F401
from paraplan.plans.prediction import DeviceMemory, Prediction, SearchInfo  # noqa: F401  (read from here too)
from paraplan.plans.schedules import Schedule, schedule_problem
from paraplan.plans.schedules import stage_ranks as default_stage_ranks
from paraplan.precision import PRECISIONS, Precision, fp8_param_gather_problem, fp8_recipe_problem

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # a version-1 file loads unchanged, as fp32 (docs/plan-format.md)


class GradSync(StrEnum):
    """When data-parallel replicas average their gradients (simulator/pipeline.py, runtime/pipeline/pipeline_rank.py)."""

    NONE = "none"
    AFTER_BACKWARD = "after-backward"  # one all-reduce once the whole pipeline has flushed
    BUCKETED = "bucketed"  # DDP: buckets all-reduced as the backward produces them
    GROPIPE_DELAYED = "gropipe-delayed"  # GroPipe: a stage's all-reduce starts at its own last backward


class SplitLayers(StrEnum):
    """Bi-Partition: how a layer whose forward and backward run on different workers gets the
    activations its backward needs (plans/worker_roles.py)."""

    RECOMPUTE = "recompute"  # the backward owner recomputes the forward from the layer's input (what runs)
    SEND_ACTIVATIONS = "send-activations"  # the paper's scheme: the forward owner sends the saved activations


SCHEDULES = tuple(s.value for s in Schedule)
GRAD_SYNCS = tuple(g.value for g in GradSync)
SPLIT_LAYERS = tuple(x.value for x in SplitLayers)


class PlanError(ParaplanError):
    """A malformed or inconsistent plan; the message names the field."""


@dataclass(frozen=True)
class LayerRange:
    """Layers start..stop-1 (half-open, like range())."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __contains__(self, item) -> bool:  # range's bound check, not a walk (the memory model asks it a lot)
        return item in range(self.start, self.stop)

    def __str__(self) -> str:
        return f"{self.start}..{self.stop - 1}"


@dataclass(frozen=True)
class Stage:
    layers: LayerRange  # the forward range
    devices: tuple[int, ...]  # the device group running this stage
    backward_layers: LayerRange | None = None  # Bi-Partition: a backward range of its own
    strategies: tuple[LayerStrategy, ...] = ()  # one per layer in `layers`; () = pure data parallel
    # each device's share of every micro-batch (plain stages; plans/stage_widths.py): () = equal
    # rows; (3, 1): the first device takes 3/4 of the rows (Poplar's and Cephalo's faster replica)
    shares: tuple[int, ...] = ()

    @property
    def backward(self) -> LayerRange:
        return self.backward_layers if self.backward_layers is not None else self.layers

    def strategy(self, layer: int) -> LayerStrategy:
        if self.strategies:
            return self.strategies[layer - self.layers.start]
        return LayerStrategy(dp=len(self.devices))


@dataclass(frozen=True)
class OperatorPlacement:
    """FD-DPS: the operators (or operator parts, "conv3/part1") one device runs, in order."""

    device: int
    ops: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    n_layers: int
    global_batch: int  # samples per iteration over all replicas
    n_micro: int  # micro-batches per replica per iteration (p in CSIMD, m in GroPipe)
    schedule: Schedule  # a plain string is accepted and becomes the Schedule
    stages: tuple[Stage, ...] = ()
    grad_sync: GradSync = GradSync.AFTER_BACKWARD
    operators: tuple[OperatorPlacement, ...] = ()
    split_layers: SplitLayers = SplitLayers.RECOMPUTE  # only read when stages have backward ranges
    prediction: Prediction | None = None
    search: SearchInfo | None = None
    format_version: int = field(default=FORMAT_VERSION)
    # format version 2 (docs/plan-format.md)
    precision: Precision = Precision.FP32  # what the plan trains in (precision.py); version 1 files: fp32
    # The schedule record beside `schedule` (its kind): model chunks per pipeline rank (interleaved
    # 1F1B: virtual_stages > 1, stage i on rank stage_ranks[i]), and optionally every rank's order of
    # actions. Today's gpipe / 1f1b / async-1f1b: 1 chunk, stage i on rank i, the kind's own order.
    virtual_stages: int = 1
    stage_ranks: tuple[int, ...] = ()  # () = stage i on pipeline rank i
    actions: tuple[tuple[str, ...], ...] = ()  # per pipeline rank: "F<micro>.<stage>" / "B<micro>.<stage>"
    # Megatron-LM's expert-parallel all-to-all overlap (plans/expert_overlap.py); schedule.expert_overlap
    expert_overlap: bool = False
    # the token dispatcher of expert-parallel layers: "alltoall" or "deepep" (plans/expert_dispatch.py)
    expert_dispatcher: str = "alltoall"
    # an fp8 plan's scaling recipe (precision.py FP8_RECIPES: tensorwise, rowwise, blockwise, mxfp8);
    # "" for every other precision
    fp8_recipe: str = ""
    # an fp8 plan's parameters gathered in FP8 by FSDP / the distributed optimizer (Megatron-LM's
    # --fp8-param-gather; torchao's tensorwise FSDP FP8 all-gather): the blocks' linears at 1 byte
    fp8_param_gather: bool = False

    def __post_init__(self):
        # plain strings become the typed choices; an unknown one is left for validate() to name
        for name, kind in (("schedule", Schedule), ("grad_sync", GradSync), ("split_layers", SplitLayers),
                           ("precision", Precision)):
            value = getattr(self, name)
            if not isinstance(value, kind) and value in tuple(kind):
                object.__setattr__(self, name, kind(value))

    @property
    def kind(self) -> PlanKind:
        """Pipeline stages, per-layer strategies, Bi-Partition ranges or an operator placement
        (plans/kinds.py)."""
        return kind_of(self.schedule, self.stages, self.operators)

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def devices(self) -> tuple[int, ...]:
        """Every device the plan uses, once each (stages of one pipeline rank share its devices)."""
        if self.stages:
            return tuple(dict.fromkeys(d for s in self.stages for d in s.devices))
        return tuple(p.device for p in self.operators)

    @property
    def n_ranks(self) -> int:
        """Pipeline ranks: the stages over the model chunks each rank holds."""
        return max(1, self.n_stages // max(1, self.virtual_stages))

    @property
    def rank_of_stage(self) -> tuple[int, ...]:
        """The pipeline rank of each stage (the schedule record's stage_ranks, or its kind's mapping)."""
        if self.stage_ranks:
            return tuple(self.stage_ranks)
        if self.virtual_stages == 1:
            return tuple(range(self.n_stages))
        return default_stage_ranks(self.schedule, self.n_ranks, self.virtual_stages)

    @property
    def multi_chunk(self) -> bool:
        """Several stages on one pipeline rank (interleaved and V-shaped schedules)."""
        return self.virtual_stages > 1

    @property
    def micro_batch_size(self) -> float:
        """Samples in one micro-batch entering a stage (before any per-layer data split)."""
        return self.global_batch / self.n_micro


def _check_ranges(ranges: list[LayerRange], n_layers: int, name: str, allow_empty: bool = False) -> None:
    expected_start = 0
    for i, r in enumerate(ranges):
        where = f"stages[{i}].{name}"
        if r.stop < r.start or (r.stop == r.start and not allow_empty):
            raise PlanError(f"{where}: stage has no layers ({r.start}..{r.stop - 1})")
        if r.start < 0 or r.stop > n_layers:
            raise PlanError(f"{where}: layers {r} outside the model's 0..{n_layers - 1}")
        if r.start != expected_start:
            if r.start > expected_start:
                raise PlanError(f"{where}: layers {expected_start}..{r.start - 1} not covered by any stage")
            raise PlanError(f"{where}: starts at layer {r.start}, overlapping the previous stage")
        expected_start = r.stop
    if expected_start != n_layers:
        raise PlanError(f"stages[{len(ranges) - 1}].{name}: layers {expected_start}..{n_layers - 1} "
                        "not covered by any stage")


def validate(plan: Plan) -> Plan:
    """Check the plan on its own terms; return it unchanged or raise PlanError naming the field."""
    if plan.format_version not in READABLE_VERSIONS:
        raise PlanError(f"format_version: expected {' or '.join(map(str, READABLE_VERSIONS))}, got {plan.format_version}")
    if plan.precision not in PRECISIONS:
        raise PlanError(f"precision: unknown {plan.precision!r}; expected one of {', '.join(PRECISIONS)}")
    problem = fp8_recipe_problem(plan.precision, plan.fp8_recipe)
    if problem:
        raise PlanError(f"fp8_recipe: {problem}")
    problem = fp8_param_gather_problem(plan.precision, plan.fp8_param_gather)
    if problem:
        raise PlanError(f"fp8_param_gather: {problem}")
    for name in ("n_layers", "global_batch", "n_micro"):
        if getattr(plan, name) < 1:
            raise PlanError(f"{name}: must be at least 1, got {getattr(plan, name)}")
    if plan.schedule not in SCHEDULES:
        raise PlanError(f"schedule: unknown {plan.schedule!r}; expected one of {', '.join(SCHEDULES)}")
    if plan.grad_sync not in GRAD_SYNCS:
        raise PlanError(f"grad_sync: unknown {plan.grad_sync!r}; expected one of {', '.join(GRAD_SYNCS)}")
    if plan.split_layers not in SPLIT_LAYERS:
        raise PlanError(f"split_layers: unknown {plan.split_layers!r}; expected one of {', '.join(SPLIT_LAYERS)}")
    if plan.global_batch % plan.n_micro:
        raise PlanError(f"n_micro: {plan.n_micro} micro-batches do not divide the global batch {plan.global_batch}")
    if plan.schedule == "dag":
        _validate_operators(plan)
    elif plan.operators:  # one kind of plan at a time (plans/kinds.py)
        raise PlanError(f"operators: an operator placement runs with schedule 'dag', not {plan.schedule}")
    elif not plan.stages:
        raise PlanError(f"stages: schedule '{plan.schedule}' needs at least one stage")
    _validate_schedule_record(plan)  # first: the stages' check reads its stage -> rank mapping
    if plan.stages:
        _validate_stages(plan)
    if plan.stages:
        from paraplan.plans.stage_widths import width_problem

        if problem := width_problem(plan):
            raise PlanError(problem if problem.startswith("stages[") else f"stages: {problem}")
    if plan.expert_overlap:
        from paraplan.plans.expert_overlap import expert_overlap_problem

        problem = expert_overlap_problem(plan)
        if problem:
            raise PlanError(f"schedule.expert_overlap: {problem}")
    if plan.expert_dispatcher != "alltoall":
        from paraplan.plans.expert_dispatch import expert_dispatch_problem

        problem = expert_dispatch_problem(plan)
        if problem:
            raise PlanError(f"expert_dispatcher: {problem}")
    if plan.prediction is not None:
        used = set(plan.devices)
        for i, m in enumerate(plan.prediction.memory):
            if m.device not in used:
                raise PlanError(f"prediction.memory[{i}].device: device {m.device} is not used by the plan")
    return plan


def _validate_stages(plan: Plan) -> None:
    # Bi-Partition lets a worker's forward or backward range be empty (not both)
    with_backward = [s.backward_layers is not None for s in plan.stages]
    bi_partition = any(with_backward)
    _check_ranges([s.layers for s in plan.stages], plan.n_layers, "layers", allow_empty=bi_partition)
    if bi_partition:
        if not all(with_backward):
            i = with_backward.index(False)
            raise PlanError(f"stages[{i}].backward_layers: missing while other stages have one")
        _check_ranges([s.backward for s in plan.stages], plan.n_layers, "backward_layers", allow_empty=True)
        for i, stage in enumerate(plan.stages):
            if stage.layers.stop <= stage.layers.start and stage.backward.stop <= stage.backward.start:
                raise PlanError(f"stages[{i}]: both the forward and the backward range are empty")
        if plan.schedule not in (Schedule.ONE_F_ONE_B, Schedule.GPIPE):
            raise PlanError(f"schedule: separate backward ranges run with gpipe or 1f1b, not {plan.schedule}")
    owner: dict[int, int] = {}
    micro = plan.global_batch // plan.n_micro
    # stages of one pipeline rank (interleaved schedules: several chunks per rank) share its devices
    ranks = plan.rank_of_stage
    rank_devices: dict[int, tuple[int, ...]] = {}
    for i, stage in enumerate(plan.stages):
        if not stage.devices:
            raise PlanError(f"stages[{i}].devices: a stage needs at least one device")
        if ranks[i] in rank_devices and tuple(stage.devices) != rank_devices[ranks[i]]:
            raise PlanError(f"stages[{i}].devices: the stage runs on pipeline rank {ranks[i]}, whose devices "
                            f"are {list(rank_devices[ranks[i]])}, got {list(stage.devices)}")
        first_on_rank = ranks[i] not in rank_devices
        rank_devices[ranks[i]] = tuple(stage.devices)
        for d in stage.devices if first_on_rank else ():
            if d < 0:
                raise PlanError(f"stages[{i}].devices: device ids start at 0, got {d}")
            if d in owner:
                where = "this stage" if owner[d] == i else f"stages[{owner[d]}]"
                raise PlanError(f"stages[{i}].devices: device {d} used twice (also in {where})")
            owner[d] = i
        if stage.strategies and stage.backward_layers is not None:
            raise PlanError(f"stages[{i}].strategies: per-layer strategies with a separate backward range")
        # stop - start, not len(): a hand-edited range of 10**20 layers overflows len()
        n_layers_here = stage.layers.stop - stage.layers.start
        if stage.strategies and len(stage.strategies) != n_layers_here:
            raise PlanError(f"stages[{i}].strategies: {len(stage.strategies)} strategies for "
                            f"{n_layers_here} layers")
        # each strategy once; without strategies the stage's one implied strategy once (not once a
        # layer: a hand-edited n_layers of 10**12 made this loop run for hours)
        checked = (zip(stage.layers, stage.strategies, strict=True) if stage.strategies else
                   [(stage.layers.start, stage.strategy(stage.layers.start))] if n_layers_here > 0 else [])
        for layer, s in checked:
            where = f"stages[{i}].strategies[{layer - stage.layers.start}]"
            if sorted(s.order.split(",")) != sorted(a.name for a in LAYOUT_AXES):
                raise PlanError(f"{where}.order: expected the dimensions tp, sdp, dp in some order "
                                f"(inner-most first, comma-separated), got {s.order!r}")
            if min(s.dp, s.sdp, s.tp, s.cp) < 1:
                raise PlanError(f"{where}: degrees must be at least 1, got dp={s.dp} sdp={s.sdp} tp={s.tp} cp={s.cp}")
            if s.recompute not in RECOMPUTES:
                raise PlanError(f"{where}.recompute: unknown {s.recompute!r}; expected one of {', '.join(RECOMPUTES)}")
            if s.zero not in ZERO_STAGES:
                raise PlanError(f"{where}.zero: expected one of 0, 1, 2 (ZeRO-3 is the sdp degree), got {s.zero!r}")
            if s.zero and s.dp * s.cp < 2:  # the gradient-sync group, dp x cp (costs/strategy.py)
                raise PlanError(f"{where}.zero: ZeRO-{s.zero} shards over the dp replicas, and dp is {s.dp}")
            if s.sequence_parallel and s.tp < 2:
                raise PlanError(f"{where}.sequence_parallel: splits over the tp ranks, and tp is {s.tp}")
            _validate_expert_view(s, where)
            if s.degree != len(stage.devices):
                raise PlanError(f"{where}: dp*sdp*tp*cp = {s.degree} but the stage has {len(stage.devices)} devices")
            if micro % s.data_degree and not stage.shares:  # shares: plans/stage_widths.py checks their rows
                raise PlanError(f"{where}: a micro-batch of {micro} samples does not split {s.data_degree} ways")


def _validate_expert_view(s: LayerStrategy, where: str) -> None:
    """A strategy's expert view (costs/expert_costs.py): ep x etp ranks within its group, tokens split
    over tp by sequence parallelism (Megatron-core's rule for MoE with TP), one kind of data axis."""
    if min(s.ep, s.etp) < 1:
        raise PlanError(f"{where}: degrees must be at least 1, got ep={s.ep} etp={s.etp}")
    if s.ep * s.etp == 1:
        return
    if s.degree % (s.ep * s.etp):
        raise PlanError(f"{where}: ep*etp = {s.ep * s.etp} does not divide the layer's {s.degree} devices")
    if s.tp > 1 and not s.sequence_parallel:
        raise PlanError(f"{where}.ep: expert parallelism with tp {s.tp} needs sequence_parallel (Megatron-core's rule "
                        "for mixture-of-experts with tensor parallelism: each tp rank dispatches its own tokens)")
    if s.sdp > 1 and s.dp > 1:
        raise PlanError(f"{where}.ep: expert parallelism with both dp and sdp is not modelled; give one of them")


def _validate_schedule_record(plan: Plan) -> None:
    """The schedule record (format version 2): chunks per rank, stage -> rank, per-rank actions."""
    if plan.schedule == Schedule.DAG:
        return
    if plan.virtual_stages < 1 or plan.n_stages % plan.virtual_stages:
        raise PlanError(f"schedule.virtual_stages: {plan.n_stages} stages do not split into {plan.virtual_stages} "
                        "chunks per pipeline rank")
    problem = schedule_problem(plan.schedule, plan.n_ranks, plan.virtual_stages, plan.n_micro)
    if problem:
        raise PlanError(f"schedule: {problem}")
    expected = default_stage_ranks(plan.schedule, plan.n_ranks, plan.virtual_stages)
    if plan.stage_ranks and tuple(plan.stage_ranks) != expected:
        raise PlanError(f"schedule.stage_ranks: {plan.schedule} places stage i on rank {list(expected)}[i] "
                        f"(torch's schedule classes fix it), got {list(plan.stage_ranks)}")
    if plan.actions:
        raise PlanError("schedule.actions: a per-rank order of actions is not run yet; leave it out and the "
                        f"schedule's own order ({plan.schedule}) is used")


def _validate_operators(plan: Plan) -> None:
    if not plan.operators:
        raise PlanError("operators: schedule 'dag' needs an operator placement")
    seen_devices: set[int] = set()
    seen_ops: dict[str, int] = {}
    for i, placement in enumerate(plan.operators):
        if placement.device < 0:
            raise PlanError(f"operators[{i}].device: device ids start at 0, got {placement.device}")
        if placement.device in seen_devices:
            raise PlanError(f"operators[{i}].device: device {placement.device} listed twice")
        seen_devices.add(placement.device)
        for op in placement.ops:
            if op in seen_ops:
                raise PlanError(f"operators[{i}].ops: operator {op!r} also placed by operators[{seen_ops[op]}]")
            seen_ops[op] = i


def check_fits(plan: Plan, n_layers: int, n_devices: int, cluster_name: str = "the cluster") -> None:
    """A valid plan may still not fit the world it is run in."""
    if plan.n_layers != n_layers:
        raise PlanError(f"n_layers: the plan cuts {plan.n_layers} layers but the model has {n_layers}")
    for d in plan.devices:
        if d >= n_devices:
            raise PlanError(f"devices: the plan uses device {d} but {cluster_name} has {n_devices} "
                            f"(0..{n_devices - 1})")
