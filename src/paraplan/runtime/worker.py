"""One rank of `paraplan train`: build its stage, join its groups, run the plan's schedule.

Pipelining uses torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B) with
stages cut by us. Following shared/notes/runtime-on-cpu.md: scale_grads=False with the loss divided
by the number of micro-batches; no DDP (its reducer breaks with several stages per rank), our own
gradient all-reduce instead; a barrier before destroying the process group.

Data parallelism across pipeline replicas (stage s, replica r runs on plan.stages[s].devices[r]):
  - "after-backward": the gradients, flattened, are all-reduced (averaged) once the step is over;
  - "gropipe-delayed": GroPipe's group-based delayed asynchronous all-reduce: a hook counts the
    micro-batch gradients each parameter receives; when every parameter of the stage has its last
    one, i.e. when this stage's last backward ends, one asynchronous all-reduce of the stage's
    flattened gradients starts while other stages are still computing; the optimizer waits only
    for its own stage's handle (one collective per partition, as GroPipe Fig. 8; one per tensor
    would pay the link latency dozens of times);
  - "bucketed": the same hooks, but parameters are grouped into 25 MiB buckets in reverse order
    (as DDP) and a bucket is all-reduced, flattened, once all of its parameters are ready;
  - "none".
A tied weight held by two stages (GPT-2's embedding and head) has its gradient summed between the
ranks that hold it, as DeepSpeed's TiedLayerSpec does. Gradient clipping uses the norm over the
whole model: squares summed over one pipeline replica (a tied weight counted once).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
import torch.distributed as dist

from paraplan.errors import FieldError
from paraplan.plan.plan import Plan
from paraplan.runtime.data import TOKEN_DTYPES, batch_source
from paraplan.runtime.materialize import StageModule, build_layers, materialize
from paraplan.runtime.memory_meter import MemoryMeter, local_value, state_bytes

BUCKET_BYTES = 25 * 2**20
REPORT_EVERY_S = 0.5  # rank 0 prints the step losses, and losses.json is rewritten, at most this often


class Optimizer(StrEnum):
    ADAM = "adam"
    SGD = "sgd"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything one training run needs, validated once here (errors name the field)."""

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
    # real data (runtime/data.py): a token file (flat ids of `data_dtype`) or an .npz of inputs and
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


def make_optimizer(config: TrainConfig, params) -> torch.optim.Optimizer:
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


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _roles(plan: Plan, rank: int) -> tuple[int, int]:
    for s, stage in enumerate(plan.stages):
        if rank in stage.devices:
            return s, stage.devices.index(rank)
    raise RuntimeError(f"rank {rank} has no stage in the plan")


class GradSync:
    """Gradient averaging across the replicas of one stage."""

    def __init__(self, params: list[torch.nn.Parameter], group, group_size: int, mode: str, n_micro: int,
                 recorder=None):
        self.params, self.group, self.size, self.mode, self.n_micro = params, group, group_size, mode, n_micro
        self.recorder = recorder
        self.first_launch: float | None = None
        self.handles: list = []
        self.counts = {id(p): 0 for p in params}
        self.buckets: list[list[torch.nn.Parameter]] = []
        if mode == "gropipe-delayed":  # one all-reduce for the whole partition (GroPipe Fig. 8)
            self.buckets = [list(reversed(params))]
        elif mode == "bucketed":
            current, size = [], 0
            for p in reversed(params):
                current.append(p)
                size += p.numel() * p.element_size()
                if size >= BUCKET_BYTES:
                    self.buckets.append(current)
                    current, size = [], 0
            if current:
                self.buckets.append(current)
        self.bucket_of = {id(p): b for b, ps in enumerate(self.buckets) for p in ps}
        self.bucket_ready = [0] * len(self.buckets)
        self.flat: list[tuple[torch.Tensor, list[torch.nn.Parameter]]] = []
        if size_ok := (mode in ("gropipe-delayed", "bucketed") and group_size > 1):
            for p in params:
                p.register_post_accumulate_grad_hook(self._on_grad)
        self.hooked = size_ok

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        self.counts[id(p)] += 1
        if self.counts[id(p)] < self.n_micro:
            return
        if self.first_launch is None:
            self.first_launch = time.time()
        b = self.bucket_of[id(p)]
        self.bucket_ready[b] += 1
        if self.bucket_ready[b] == len(self.buckets[b]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[b]])
            self.flat.append((flat, self.buckets[b]))
            self.handles.append(dist.all_reduce(flat, group=self.group, async_op=True))

    def finish(self) -> None:
        start = self.first_launch if self.first_launch is not None else time.time()
        if self.size > 1 and self.mode == "after-backward":  # one flattened all-reduce after the step
            ready = [p for p in self.params if p.grad is not None]
            flat = torch.cat([p.grad.reshape(-1) for p in ready])
            dist.all_reduce(flat, group=self.group)
            self.flat.append((flat, ready))
        for h in self.handles:
            h.wait()
        if self.recorder is not None and self.size > 1 and self.mode != "none":
            self.recorder.add("allreduce", "allreduce", -1, start, time.time())
        self.first_launch = None
        for flat, ps in self.flat:
            offset = 0
            for q in ps:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q.grad))
                offset += q.numel()
        if self.size > 1 and self.mode != "none":
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(self.size)
        self.handles, self.flat = [], []
        self.counts = {k: 0 for k in self.counts}
        self.bucket_ready = [0] * len(self.buckets)


@dataclass
class RankSetup:
    """What one rank runs, however the plan splits the work: the pipeline x data-parallel path
    (`replica_setup`) or per-layer strategies (runtime/hybrid_rank.py)."""

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
    # after_step() once the optimizer has stepped (runtime/bipartition_rank.py)
    run_step: Callable | None = None
    after_step: Callable | None = None
    copies: tuple = ()  # parameters held but not updated here (Bi-Partition's forward-only weight copies)


def make_groups(plan: Plan) -> tuple[list, list]:
    """(one pipeline group per position: position r of every stage, one group per stage), made by
    every rank in the same order (new_group is collective)."""
    width = len(plan.stages[0].devices)
    pipelines = [dist.new_group([s.devices[r] for s in plan.stages]) for r in range(width)]
    return pipelines, [dist.new_group(list(s.devices)) for s in plan.stages]


def replica_setup(config: TrainConfig, rank: int, device, built, layers, names, recorder) -> RankSetup:
    plan = config.plan
    stage_index, replica = _roles(plan, rank)
    n_replicas = len(plan.stages[0].devices)
    pp_groups, dp_groups = make_groups(plan)
    own = [m for _, _, m in layers[plan.stages[stage_index].layers.start:plan.stages[stage_index].layers.stop]]
    materialize(own, names, config.seed, device)
    module = StageModule(own)
    params = list(module.parameters())
    sync = GradSync(params, dp_groups[stage_index], n_replicas, plan.grad_sync, plan.n_micro, recorder)
    shard = plan.global_batch // n_replicas

    def local_batch(inputs, targets):
        x = inputs[replica * shard:(replica + 1) * shard]
        return x, None if targets is None else targets[replica * shard:(replica + 1) * shard]

    def loss(out, target):
        return built.loss(out, target) / plan.n_micro

    named = {names.get(id(p)): p for p in params}
    return RankSetup(module=module, stage_index=stage_index, position=replica, pp_group=pp_groups[replica],
                     named=named, sync=sync, loss=loss, local_batch=local_batch, loss_weight=1.0 / n_replicas,
                     full_state=lambda: {n: p.detach().clone() for n, p in named.items()}, writes=replica == 0)


def train_rank(config: TrainConfig) -> dict:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from paraplan.runtime.timeline import Recorder

    plan = config.plan
    if plan.schedule == "dag":  # an operator placement (FD-DPS): runtime/dag_runtime.py
        from paraplan.runtime.dag_runtime import train_dag_rank

        return train_dag_rank(config)
    rank = dist.get_rank()
    device = _device()
    built, layers, names = build_layers(config.model, config.seed, config.seq_len, config.image_size,
                                        dropout=config.dropout)
    # who holds and who owns each parameter, read before the stage's layers are materialised and
    # sharded (FSDP2 and DTensor replace the parameter objects the names are keyed by)
    # (by backward range: the worker that runs a layer's backward updates it; the forward range for
    # every plan but Bi-Partition's)
    stage_names = [_stage_param_names(layers, names, st.backward) for st in plan.stages]
    owned = _owned_names(layers, names, plan.stages[_roles(plan, rank)[0]].backward)
    recorder = Recorder()
    batches = batch_source(built, plan.global_batch, config.seed, config.data, config.data_dtype)
    if any(s.strategies for s in plan.stages):
        from paraplan.runtime.hybrid_rank import hybrid_setup

        setup = hybrid_setup(config, rank, device, built, layers, names, recorder)
    elif any(s.backward_layers is not None for s in plan.stages):
        from paraplan.runtime.bipartition_rank import bipartition_setup

        setup = bipartition_setup(config, rank, device, built, layers, names, recorder)
    else:
        setup = replica_setup(config, rank, device, built, layers, names, recorder)
    stage_index, position, module = setup.stage_index, setup.position, setup.module
    n_stages = plan.n_stages
    module.train()
    torch.manual_seed(config.seed + 1000 * stage_index)  # dropout: the same on every replica of a stage

    # tied weights: a parameter held by several stages has its gradient summed between them
    tied_groups = []
    for name in sorted(setup.named):
        holders = [s for s in range(plan.n_stages) if name in stage_names[s]]
        if len(holders) > 1:
            for r in range(len(plan.stages[0].devices)):
                ranks = [plan.stages[s].devices[r] for s in holders]
                g = dist.new_group(ranks)
                if rank in ranks:
                    tied_groups.append((name, g))
    owner_names = sorted(owned & set(setup.named))
    params = list(setup.named.values())

    schedule = None
    if setup.run_step is None:
        stage = PipelineStage(module, stage_index, n_stages, device, group=setup.pp_group)
        recorder.wrap_stage(stage)
        recorder.patch_p2p()
        schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}.get(plan.schedule)
        if schedule_cls is None:
            raise RuntimeError(f"the runtime runs gpipe and 1f1b schedules, not {plan.schedule!r}")
        schedule = schedule_cls(stage, plan.n_micro, loss_fn=setup.loss, scale_grads=False)
    optim = make_optimizer(config, params)
    losses, step_times = [], []
    first_step, memory = 0, None
    from paraplan.runtime.checkpoints import load_stage, save_checkpoint

    ckpt = config.checkpoint_dir
    if config.resume:  # check_resume has checked the files (sha256) and what they belong to
        state = load_stage(config.checkpoint_dir, stage_index)
        module.load_state_dict(state["module"])
        optim.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        first_step, losses = state["step"], list(state["losses"])
    progress = None
    if rank == 0 and config.log:
        from rich.progress import Progress

        # no refresh thread: it would compete with this rank's training for the interpreter
        progress = Progress(transient=True, auto_refresh=False)
        progress.start()
        bar = progress.add_task("training", total=config.steps, completed=first_step)
    # The step losses are summed over the ranks (only last stages contribute) in one all-reduce
    # every `every[0]` steps, not every step: a per-step all-reduce, even asynchronous, cost ~10% of
    # a 50 ms step here (benchmarks/runtime_overhead.py). `every` is fixed after the second step,
    # the same on every rank (from the slowest rank's step), so that the flushes stay
    # collective: about REPORT_EVERY_S apart (the first two steps are reported at once).
    local: list[float] = []  # this rank's weighted contributions of the steps not yet summed
    every = [1]

    def flush(done: int, took: float) -> None:
        summed = torch.tensor(local, dtype=torch.float64, device=device)
        dist.all_reduce(summed)
        losses.extend(float(v) for v in summed)
        local.clear()
        if progress is not None:
            progress.console.print(f"step {done}/{config.steps}: loss {losses[-1]:.6f}, {took * 1e3:.1f} ms, "
                                   f"{plan.global_batch / took:.1f} samples/s")
            progress.update(bar, completed=done)
            progress.refresh()
        if config.out_dir is not None and setup.writes and stage_index == 0:
            # during the run, so that a killed or failed run keeps the losses of the steps it completed
            from paraplan.fileio import atomic_write_text

            # flushed to the disk only at the end: rewritten up to twice a second during the run
            atomic_write_text(Path(config.out_dir) / "losses.json", json.dumps(losses), durable=done == config.steps)

    for step in range(first_step, config.steps):
        recorder.step = step
        if config.step_hook is not None:
            config.step_hook(rank, step)
        inputs, targets = batches(step)  # the whole global batch, the same on every rank
        x, y = setup.local_batch(inputs, targets)
        x, y = x.to(device), None if y is None else y.to(device)
        optim.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        micro_losses: list = []
        # memory is measured on the last step: on the first, torch's pipeline stage also holds the
        # graph of its shape-inference forward (PipelineStage._fwd_outputs_for_bwd_meta), about
        # one micro-batch's activations more than any later step (the pack hook's cost, a few us
        # per saved tensor, falls on one step of the median)
        meter = MemoryMeter() if step == config.steps - 1 else None
        with meter.watching() if meter is not None else contextlib.nullcontext():
            if schedule is None:
                setup.run_step(x, y, micro_losses)
            elif stage_index == 0 and stage_index == n_stages - 1:
                schedule.step(x, target=y, losses=micro_losses)
            elif stage_index == 0:
                schedule.step(x)
            elif stage_index == n_stages - 1:
                schedule.step(target=y, losses=micro_losses)
            else:
                schedule.step()
        setup.sync.finish()
        for name, g in tied_groups:
            dist.all_reduce(local_value(setup.named[name].grad), group=g)
        if config.clip_norm is not None:
            from paraplan.runtime.hybrid import squared_norm

            sq = squared_norm(setup.named[n] for n in owner_names).to(device)
            dist.all_reduce(sq, group=setup.pp_group)
            coef = min(1.0, config.clip_norm / (float(sq.sqrt()) + 1e-6))
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        optim.step()
        if setup.after_step is not None:
            setup.after_step()
        step_times.append(time.perf_counter() - t0)
        if meter is not None:
            memory = {"rank": rank, "stage": stage_index, "activations": meter.peak_activation_bytes,
                      **state_bytes(params + list(setup.copies), optim)}
            if device.type == "cuda":
                memory["allocator_peak"] = torch.cuda.max_memory_allocated(device)
        local.append(sum(float(v.detach()) for v in micro_losses) * setup.loss_weight if micro_losses else 0.0)
        done = step + 1
        checkpoint_due = ckpt is not None and (done == config.steps or (
            config.checkpoint_every and done % config.checkpoint_every == 0))
        if done == config.steps or checkpoint_due or (done - first_step - 2) % every[0] == 0 or step == first_step:
            flush(done, step_times[-1])
        if step == first_step + 1:  # the flush interval, from the slowest rank's second step (the first warms up)
            slowest = torch.tensor([step_times[-1]], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            every[0] = max(1, min(64, int(REPORT_EVERY_S / max(float(slowest), 1e-6))))
        if checkpoint_due:  # collective: the manifest is written once every stage's file is
            save_checkpoint(config, stage_index, done, lambda done=done: {
                "module": module.state_dict(), "optimizer": optim.state_dict(), "rng": torch.get_rng_state(),
                "step": done, "losses": losses}, setup.writes)
    if progress is not None:
        progress.stop()
    result = {"rank": rank, "stage": stage_index, "replica": position, "losses": losses, "step_s": step_times}
    if config.out_dir is not None:  # atomic writes (paraplan.fileio): a full disk is one line, no partial file
        from paraplan.fileio import atomic_torch_save, atomic_write_text

        recorder.save(Path(config.out_dir) / f"timeline_rank{rank}.json", rank)
        atomic_write_text(Path(config.out_dir) / f"steps_rank{rank}.json", json.dumps(step_times))
        if memory is not None:
            atomic_write_text(Path(config.out_dir) / f"memory_rank{rank}.json", json.dumps(memory))
        full = setup.full_state()  # collective for hybrid stages: every rank of the stage takes part
        if setup.writes:
            atomic_torch_save(full, Path(config.out_dir) / f"stage{stage_index}.pt")
    dist.barrier()
    return result


def _stage_param_names(layers, names, layer_range) -> set[str]:
    return {names.get(id(p)) for _, _, m in layers[layer_range.start:layer_range.stop] for p in m.parameters()}


def _owned_names(layers, names, layer_range) -> set[str]:
    """Parameters whose first user (owner) is a layer of this stage."""
    first: dict[str, int] = {}
    for i, (_, _, m) in enumerate(layers):
        for p in m.parameters():
            first.setdefault(names.get(id(p)), i)
    return {n for n, i in first.items() if layer_range.start <= i < layer_range.stop}


def die_with_parent() -> None:
    """Linux: this process gets SIGTERM when its parent (the launcher) dies, however it dies
    (a SIGKILL included), so a rank never trains on as an orphan. Elsewhere a no-op."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        return
    if os.getppid() == 1:  # the parent is already gone
        os._exit(1)


def worker_main(rank: int, world: int, port: int, config: TrainConfig, error_dir: str | None = None) -> None:
    """One spawned rank. A failure's type and message go to `error_dir` for the launcher (torch hands
    it only the traceback); the teardown releases DTensors, meshes and groups in order
    (runtime/teardown.py)."""
    import datetime

    from paraplan.runtime.teardown import end_rank, record_failure

    die_with_parent()

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    finished = False
    try:
        dist.init_process_group(backend(), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=config.timeout_s))
        train_rank(config)  # returns before the teardown: its objects are unreferenced by then
        finished = True
        end_rank(rank, finished=True)
    except BaseException as exc:
        record_failure(error_dir, rank, exc)
        if not finished:
            with contextlib.suppress(Exception):  # the training's error is the one to report
                end_rank(rank, finished=False)  # no closing barrier: the other ranks may be gone
        raise
