"""What every rank shares, whatever kind of plan it runs: the run's settings (`RunConfig`, each field
checked once), the optimizer, the backend and device, the rank's stage and position, its groups,
and `RankSetup`, what a plan kind hands the stage loop (runtime/pipeline/stage_loop.py).

The plan kinds (runtime/kinds.py: RUNNERS, one lookup by Plan.kind): the plain pipeline x
data-parallel replicas (runtime/pipeline/pipeline_rank.py), per-layer strategies
(runtime/layers/hybrid_rank.py), Bi-Partition's separate forward and backward ranges
(runtime/bipartition/bipartition_rank.py) and operator placements (runtime/dag/dag_runtime.py).
Each imports this package, never runtime/kinds.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.distributed as dist

from paraplan.errors import FieldError
from paraplan.plans.plan import Plan
from paraplan.runtime.rank.data import TOKEN_DTYPES


class Optimizer(StrEnum):
    ADAM = "adam"
    SGD = "sgd"


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything one training run needs, each field checked here (errors name the field); what the
    plan's kind does not run is refused by its subclass, runtime/config.py's TrainConfig, which the
    callers make (the kinds' modules read a run's settings through this class, below the kinds)."""

    plan: Plan
    model: str
    steps: int = 3
    seed: int = 0
    lr: float = 1e-3
    optimizer: Optimizer = Optimizer.ADAM
    clip_norm: float | None = None
    out_dir: str | None = None  # losses and each stage's final parameters go here
    seq_len: int | None = None
    image_size: int | None = None
    # real data (runtime/rank/data.py): a token file (flat ids of `data_dtype`) or an .npz of inputs and
    # labels; None: synthetic batches
    data: str | None = None
    data_dtype: str = "uint16"
    dropout: bool = True  # False: every dropout off (for comparisons with a single-process run)
    checkpoint_dir: str | None = None  # each stage's parameters, optimizer and RNG state go here
    checkpoint_every: int = 0  # steps between checkpoints (0: only at the end, when a dir is given)
    resume: bool = False  # continue from the checkpoint in checkpoint_dir
    timeout_s: float = 60.0  # a collective that waits longer than this fails (a dead rank)
    log: bool = False  # rank 0 prints each step as it ends
    # called as step_hook(rank, step) before each step; a picklable top-level function (the tests
    # use it to kill a rank and check that the run ends cleanly)
    step_hook: Callable[[int, int], None] | None = None

    def __post_init__(self):
        for name in ("steps", "seed", "checkpoint_every"):  # whole numbers (an API caller's "3" is no step count)
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise FieldError(name, f"must be a whole number, got {value!r}")
        for name in ("lr", "timeout_s", "clip_norm"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise FieldError(name, f"must be a number, got {value!r}")
        for name in ("steps", "lr", "timeout_s"):
            if not getattr(self, name) > 0:
                raise FieldError(name, f"must be positive, got {getattr(self, name)}")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise FieldError("clip_norm", f"must be positive, got {self.clip_norm}")
        if self.checkpoint_every < 0:
            raise FieldError("checkpoint_every", f"must not be negative, got {self.checkpoint_every}")
        if self.data_dtype not in TOKEN_DTYPES:
            raise FieldError("data_dtype", f"unknown {self.data_dtype!r}; expected one of {', '.join(TOKEN_DTYPES)}")
        if self.resume and not self.checkpoint_dir:
            raise FieldError("resume", "needs a checkpoint directory")
        try:
            object.__setattr__(self, "optimizer", Optimizer(self.optimizer))
        except ValueError:
            raise FieldError("optimizer", f"unknown {self.optimizer!r}; expected one of "
                                          f"{', '.join(o.value for o in Optimizer)}") from None


def make_optimizer(config: RunConfig, params) -> torch.optim.Optimizer:
    """The same optimizer for every stage and for the single-process reference."""
    optimizers = {Optimizer.ADAM: torch.optim.Adam, Optimizer.SGD: torch.optim.SGD}
    params = list(params)
    if not params:  # a rank that updates nothing (a Bi-Partition worker with an empty backward range)
        params = [torch.zeros(0, requires_grad=True)]
    return optimizers[config.optimizer](params, lr=config.lr)


def backend() -> str:
    """gloo on the CPU, nccl when every rank has a GPU of its own (the nccl path is written for
    GPU machines and has not been run on this CPU-only one)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def rank_device() -> torch.device:
    """This rank's device: its own GPU under nccl (LOCAL_RANK, else the rank modulo the GPUs), else the CPU."""
    if dist.get_backend() == "nccl":
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def stage_and_position(plan: Plan, rank: int) -> tuple[int, int]:
    """(the stage `rank` runs, its first with several chunks per rank; its index among that stage's devices)."""
    for s, stage in enumerate(plan.stages):
        if rank in stage.devices:
            return s, stage.devices.index(rank)
    raise RuntimeError(f"rank {rank} has no stage in the plan")


@dataclass
class RankSetup:
    """What one rank runs, however the plan splits the work: the pipeline x data-parallel path
    (runtime/pipeline/pipeline_rank.py) or per-layer strategies (runtime/layers/hybrid_rank.py)."""

    module: torch.nn.Module  # the stage as the PipelineStage runs it
    stage_index: int
    position: int  # replica index (pipeline x dp) or position in the stage's group (hybrid)
    pp_group: object  # this rank's pipeline: position `position` of every stage
    named: dict[str, torch.nn.Parameter]  # this rank's parameters by their name in the whole model
    sync: object  # .finish(): gradient reduction after the schedule
    loss: Callable  # (stage output, micro-batch target) -> the loss to backpropagate
    local_batch: Callable  # (inputs, targets) -> what this rank feeds the schedule
    loss_weight: float  # how this rank's micro-batch losses count in the reported loss (summed over ranks)
    full_state: Callable  # () -> {name: whole tensor} (collective over the stage group for hybrid)
    writes: bool  # this rank writes the stage's parameters and checkpoint
    # a plan torch's pipelining cannot express (Bi-Partition's separate backward ranges) runs its own
    # step: run_step(inputs, targets, micro_losses) instead of a PipelineStage schedule, and
    # after_step() once the optimizer has stepped (runtime/bipartition/bipartition_rank.py)
    run_step: Callable | None = None
    after_step: Callable | None = None
    copies: tuple = ()  # parameters held but not updated here (Bi-Partition's forward-only weight copies)
    # what the optimizer steps, from the rank's parameters (ZeRO: its owned views); None: all of them
    optimizer_params: Callable | None = None
    extra_grad_bytes: Callable = lambda: 0  # gradient bytes held outside .grad (ZeRO-2's accumulators)
    # interleaved and V-shaped schedules: every stage this rank holds, ((stage index, module), ...) in
    # stage order (`module` and `stage_index` are then their container and the first of them)
    chunks: tuple = ()
    # the share of this rank's squared gradients in the norm for clipping, all-reduced over pp_group
    # (1/width where pp_group is the world and every device of a stage holds its summed gradients)
    norm_share: float = 1.0
    # the loop's loss scale (fp16's LossScaler; 1 otherwise), for a kind's own step to scale its losses
    loss_scale: Callable = lambda: 1.0


def make_groups(plan: Plan) -> tuple[list, list]:
    """(one pipeline group per position: position r of every stage, one group per stage), made by
    every rank in the same order (new_group is collective)."""
    width = len(plan.stages[0].devices)
    # (a rank holding several stages is in its pipeline once: the group ranks are the pipeline ranks)
    pipelines = [dist.new_group(list(dict.fromkeys(s.devices[r] for s in plan.stages))) for r in range(width)]
    return pipelines, [dist.new_group(list(s.devices)) for s in plan.stages]


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one whole tensor (collective over its mesh for a DTensor)."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def squared_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The sum of squares of the gradients' whole values (DTensors gathered: every device of the
    stage calls this in the same order)."""
    total = torch.zeros(())
    for p in params:
        if p.grad is not None:
            total = total + full_value(p.grad).double().pow(2).sum().to(total.device)
    return total
