"""What the runtime does with each kind of plan (plans/kinds.py: Plan.kind), one class per kind.

Each class knows three things about its kind: what its runtime does not run (`refuse`: the plan
features and precisions it leaves to the simulator, raised when the run's TrainConfig is made,
runtime/config.py), what is checked before any rank starts (`check`: the plan against the world
and the model's layers, launcher/launch.py's check_before_launch), and what one rank runs (`train`:
the kind's rank set-up under the stage loop, pipeline/stage_loop.py, or its own loop). The two
places that used to tell the kinds apart by the plan's shape ask `RUNNERS[plan.kind]` instead:

  PIPELINE     pipeline x data-parallel replicas (pipeline/pipeline_rank.py)
  LAYERS       per-layer strategies (layers/: meshes, the apply steps, hybrid_rank.py)
  BIPARTITION  separate forward and backward ranges (bipartition/bipartition_rank.py)
  OPERATORS    operator placements (dag/dag_runtime.py), with a loop of their own

A kind's module imports runtime/rank/ (what every kind shares) and shared helpers, never this
module nor another kind; this module imports each kind's module where it hands a rank to it.
"""

from __future__ import annotations

from paraplan.errors import FieldError, ParaplanError
from paraplan.plans.features import refuse_features
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import Plan, PlanError, check_fits
from paraplan.plans.schedules import MULTI_CHUNK, Schedule
from paraplan.plans.stage_widths import unequal
from paraplan.precision import is_mixed

# the version-2 plan features (plans/features.py: FEATURES) the runtime runs so far: the precision
# (fp32, tf32, bf16: rank/mixed_precision.py), ZeRO-1/2 (layers/zero.py), selective recomputation
# (layers/selective.py), sequence parallelism (layers/sequence_parallel.py) and the multi-chunk
# schedules, expert parallelism with plain data parallelism (layers/expert_parallel.py; the rest of
# it refused by layers/hybrid.py); context parallelism is refused with its reason (layers/parallelize.py:
# apply_cp)
RUNS: frozenset[str] = frozenset({"precision", "zero", "selective", "schedule", "sequence_parallel",
                                 "expert_parallel"})
# Megatron-LM's all-to-all overlap is Megatron-LM's combined 1F1B passes (plans/expert_overlap.py)
EXPERT_OVERLAP_REFUSED = ("Megatron-LM's all-to-all overlap is for Megatron-LM to run (paraplan export --to megatron); "
                          "paraplan's runtime runs the all-to-alls in line: plan without it to train here")
# DeepEP's kernels run on NVIDIA GPUs over NVLink and RDMA (plans/expert_dispatch.py)
EXPERT_DISPATCHER_REFUSED = ("DeepEP's dispatcher is for the engines to run on GPUs (paraplan export); paraplan's "
                             "runtime dispatches with all_to_all_single: plan with expert_dispatcher alltoall to train here")
# the schedules stage plans run under (plans/schedules.py)
STAGE_SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, *MULTI_CHUNK)


class KindRuntime:
    """What every kind's runtime does alike; each kind below says what is its own."""

    kind: PlanKind
    mixed_precision: str | None = None  # why mixed precision is not run for this kind; None: it is

    def refuse(self, config) -> None:
        """FieldError naming what of the run this kind's runtime does not run (the plan first)."""
        plan = config.plan
        from paraplan.runtime.layers.parallelize import CONTEXT_PARALLEL_REFUSED
        from paraplan.runtime.rank.mixed_precision import refusal

        try:
            refuse_features(plan, RUNS, "the runtime", {"context_parallel": CONTEXT_PARALLEL_REFUSED,
                                                         "expert_overlap": EXPERT_OVERLAP_REFUSED,
                                                         "expert_dispatcher": EXPERT_DISPATCHER_REFUSED})
        except PlanError as exc:
            raise FieldError("plan", str(exc)) from None
        reason = refusal(plan.precision)
        if reason:
            raise FieldError("plan", reason)
        if self.mixed_precision and is_mixed(plan.precision):
            raise FieldError("plan", f"precision {plan.precision}: {self.mixed_precision}")

    def check(self, config, world: int, n_layers: int, layers=None, built=None) -> None:
        """Refuse, in one line, a plan that cannot run on `world` ranks and this model (its layer
        list `layers`, and the model `built` on meta, when the caller has them)."""
        raise NotImplementedError

    def train(self, config) -> dict:
        """This rank's part of the plan (the process group is up): its losses and step times."""
        raise NotImplementedError


class StageRuntime(KindRuntime):
    """Plans of layer stages, run by the stage loop with the kind's rank set-up."""

    def setup(self, plan: Plan):
        """The kind's set-up function (config, rank, device, built, layers, names, recorder) -> RankSetup."""
        raise NotImplementedError

    def replicas(self, plan: Plan) -> int:
        """Independent copies of the pipeline the global batch is split over."""
        return len(plan.stages[0].devices)

    def check_schedule(self, config) -> None:
        plan = config.plan
        if plan.schedule not in STAGE_SCHEDULES:
            raise ParaplanError(f"schedule '{plan.schedule}': the runtime runs gpipe, 1f1b and the multi-chunk "
                                f"schedules ({', '.join(MULTI_CHUNK)})")

    def checkpoints_refused(self, plan: Plan) -> str | None:
        """Why this kind's runs write no checkpoints yet; None: they do."""
        return None

    def layer_refusal(self, plan: Plan, layers) -> str | None:
        """Why this kind's runtime cannot run the plan on the model's layers; None: it can."""
        return None

    def check_layers(self, config, layers) -> None:
        """What this kind checks of the plan against the model's layers (after the devices)."""
        if config.checkpoint_dir and (why := self.checkpoints_refused(config.plan)):
            raise FieldError("checkpoint_dir", why)
        reason = self.layer_refusal(config.plan, layers) if layers is not None else None
        if reason:
            raise ParaplanError(f"this plan cannot run: {reason}")

    def check(self, config, world: int, n_layers: int, layers=None, built=None) -> None:
        plan = config.plan
        self.check_schedule(config)
        used = sorted(plan.devices)
        if used != list(range(world)):
            if len(used) != world:
                raise FieldError("nproc", f"the plan uses {len(used)} devices ({used[:8]}...) but the world has "
                                          f"{world} ranks (0..{world - 1}): start {len(used)}")
            raise ParaplanError(f"the plan's devices {used} are not the ranks 0..{world - 1}")
        check_fits(plan, n_layers, world, "the world")
        if self.check_widths(config, layers, built):
            return
        counts = {len(s.devices) for s in plan.stages}
        self.check_layers(config, layers)
        for r in range(counts.pop()):
            ranks = [s.devices[r] for s in plan.stages[:plan.n_ranks]]  # the pipeline ranks, one per rank's first stage
            if ranks != sorted(ranks):
                raise ParaplanError(f"replica {r} runs its stages on devices {ranks}: they must increase along the "
                                    "pipeline")
        n_replicas = self.replicas(plan)
        if plan.global_batch % (n_replicas * plan.n_micro):
            raise ParaplanError(f"global batch {plan.global_batch} does not split into {n_replicas} replicas x "
                                f"{plan.n_micro} micro-batches")
        if plan.schedule in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B) and plan.n_micro < plan.n_ranks:
            raise ParaplanError(f"1F1B needs at least as many micro-batches ({plan.n_micro}) as stages "
                                f"({plan.n_stages})")

    def check_widths(self, config, layers, built) -> bool:
        """Whether the plan's stages differ in width and were checked as such (one line if they
        cannot run); False: every stage has the same width, checked by `check`."""
        if len({len(s.devices) for s in config.plan.stages}) > 1:
            raise ParaplanError("the runtime runs plain pipeline stages of unequal width; stages with per-layer "
                                "strategies or backward ranges need the same number of devices each")
        return False

    def train(self, config) -> dict:
        from paraplan.runtime.pipeline.stage_loop import train_stages

        return train_stages(config, self.setup(config.plan))


class PipelineRuntime(StageRuntime):
    kind = PlanKind.PIPELINE

    def refuse(self, config) -> None:
        super().refuse(config)
        if unequal(config.plan) and is_mixed(config.plan.precision):
            raise FieldError("plan", f"precision {config.plan.precision}: stages of unequal width or shares train in fp32 "
                                     "only so far (their own sends need each boundary's dtype under autocast)")

    def check_widths(self, config, layers, built) -> bool:
        plan = config.plan
        if not unequal(plan):
            return False
        if config.checkpoint_dir:
            raise FieldError("checkpoint_dir", "checkpoints of stages of unequal width or shares are not written yet")
        if layers is not None and built is not None:
            from paraplan.runtime.pipeline.wide_rank import boundary_refusal

            if reason := boundary_refusal(plan, built, layers):
                raise ParaplanError(f"this plan cannot run: {reason}")
        return True

    def setup(self, plan: Plan):
        if unequal(plan):
            from paraplan.runtime.pipeline.wide_rank import wide_setup

            return wide_setup
        from paraplan.runtime.pipeline.pipeline_rank import replica_setup

        return replica_setup


class LayersRuntime(StageRuntime):
    kind = PlanKind.LAYERS
    # tried: under interleaved-zb, TP, FSDP2, ZeRO-1 and SP layers each fail in the weight pass
    # ("Can't detach views in-place"); plain DP layers agree with one process (7e-9)
    MULTI_CHUNK_RUN = (Schedule.INTERLEAVED_1F1B, Schedule.LOOPED_BFS)

    def refuse(self, config) -> None:
        super().refuse(config)
        if config.clip_norm is not None and _zero_layers(config.plan):
            raise FieldError("clip_norm", "gradient clipping with ZeRO-1/2 layers is not run yet (the norm needs "
                                          "every replica's gradient chunk)")

    def replicas(self, plan: Plan) -> int:
        return 1  # each stage's group shares every micro-batch

    def check_schedule(self, config) -> None:
        plan = config.plan
        if plan.schedule in MULTI_CHUNK and plan.schedule not in self.MULTI_CHUNK_RUN:
            raise ParaplanError(f"schedule '{plan.schedule}': stages with per-layer strategies run under gpipe, 1f1b, "
                                "interleaved-1f1b and looped-bfs; under the zero-bubble and V-shaped kinds they "
                                "are simulated, not run yet")
        super().check_schedule(config)

    def layer_refusal(self, plan: Plan, layers) -> str | None:
        from paraplan.runtime.layers.hybrid import hybrid_refusal

        return hybrid_refusal(plan, layers)

    def setup(self, plan: Plan):
        from paraplan.runtime.layers.hybrid_rank import hybrid_setup

        return hybrid_setup


class BipartitionRuntime(StageRuntime):
    kind = PlanKind.BIPARTITION
    mixed_precision = "Bi-Partition plans train in fp32 only so far"

    def checkpoints_refused(self, plan: Plan) -> str | None:
        return "checkpoints of Bi-Partition plans are not written yet"

    def layer_refusal(self, plan: Plan, layers) -> str | None:
        from paraplan.runtime.bipartition.bipartition_rank import bipartition_refusal

        return bipartition_refusal(plan, layers)

    def setup(self, plan: Plan):
        from paraplan.runtime.bipartition.bipartition_rank import bipartition_setup

        return bipartition_setup


class OperatorsRuntime(KindRuntime):
    kind = PlanKind.OPERATORS
    mixed_precision = "operator placements (FD-DPS) train in fp32 only so far"

    def check(self, config, world: int, n_layers: int, layers=None, built=None) -> None:
        from paraplan.runtime.dag.dag_runtime import dag_refusal

        used = sorted(config.plan.devices)
        if used != list(range(world)):
            raise FieldError("nproc", f"the plan places operators on devices {used} but the world has {world} "
                                      f"ranks (0..{world - 1}): start {len(used)}")
        reason = dag_refusal(config, built)
        if reason:
            raise ParaplanError(f"this plan cannot run: {reason}")

    def train(self, config) -> dict:
        from paraplan.runtime.dag.dag_runtime import train_dag_rank

        return train_dag_rank(config)


def _zero_layers(plan: Plan) -> bool:
    """Whether some layer runs ZeRO-1/2."""
    per_layer = [st for stage in plan.stages for st in stage.strategies]
    return any(st.zero for st in per_layer)


RUNNERS: dict[PlanKind, KindRuntime] = {r.kind: r for r in (PipelineRuntime(), LayersRuntime(), BipartitionRuntime(),
                                                            OperatorsRuntime())}


def train_rank(config) -> dict:
    """One rank of `paraplan train`: its plan's kind runs it (the process group is up; the process
    around it, launcher/launch.py's)."""
    return RUNNERS[config.plan.kind].train(config)
