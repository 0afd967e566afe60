"""The training loop of every plan that runs pipeline stages (the plain pipeline, per-layer
strategies, Bi-Partition): the rank's stage set up by its plan kind (a `RankSetup`), then the steps,
checkpoints, reported losses and what the run writes.

Pipelining uses torch.distributed.pipelining (PipelineStage + ScheduleGPipe / Schedule1F1B) with
stages cut by us. Following shared/notes/runtime-on-cpu.md: scale_grads=False with the loss divided
by the number of micro-batches; no DDP (its reducer breaks with several stages per rank), our own
gradient all-reduce instead (runtime/pipeline/pipeline_rank.py); a barrier before destroying the process group.

A tied weight held by two stages (GPT-2's embedding and head) has its gradient summed between the
ranks that hold it, as DeepSpeed's TiedLayerSpec does. Gradient clipping uses the norm over the
whole model: squares summed over one pipeline replica (a tied weight counted once).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from paraplan.plans.stage_widths import unequal
from paraplan.runtime.measure.memory_meter import MemoryMeter, local_value, state_bytes
from paraplan.runtime.rank.data import batch_source
from paraplan.runtime.rank.materialize import build_layers
from paraplan.runtime.rank.mixed_precision import LossScaler, step_context
from paraplan.runtime.rank.rank_base import RankSetup, RunConfig, make_optimizer, rank_device

REPORT_EVERY_S = 0.5  # rank 0 prints the step losses, and losses.json is rewritten, at most this often

# (config, rank, device, built, layers, names, recorder) -> what this rank runs
SetupFn = Callable[..., RankSetup]


def train_stages(config: RunConfig, setup_fn: SetupFn) -> dict:
    """One rank of a stage plan: `setup_fn` (the plan kind's) builds its stage, then the steps run."""
    from paraplan.runtime.measure.timeline import Recorder

    plan = config.plan
    rank = dist.get_rank()
    device = rank_device()
    built, layers, names = build_layers(config.model, config.seed, config.seq_len, config.image_size,
                                        dropout=config.dropout)
    # who holds and who owns each parameter, read before the stage's layers are materialised and
    # sharded (FSDP2 and DTensor replace the parameter objects the names are keyed by)
    # (by backward range: the worker that runs a layer's backward updates it; the forward range for
    # every plan but Bi-Partition's)
    stage_names = [_stage_param_names(layers, names, st.backward) for st in plan.stages]
    owned = set().union(*(_owned_names(layers, names, st.backward) for st in plan.stages if rank in st.devices))
    recorder = Recorder()
    batches = batch_source(built, plan.global_batch, config.seed, config.data, config.data_dtype)
    setup = setup_fn(config, rank, device, built, layers, names, recorder)
    stage_index, module = setup.stage_index, setup.module
    module.train()
    tied_groups = _tied_groups(plan, setup, stage_names, rank)
    owner_names = sorted(owned & set(setup.named))
    params = list(setup.named.values())
    scaler = LossScaler(plan.precision)  # fp16's loss scaling (off otherwise: scale 1)
    setup.loss_scale = lambda: scaler.scale
    schedule = _schedule(plan, setup, device, recorder, scaler) if setup.run_step is None else None
    optim = make_optimizer(config, setup.optimizer_params(params) if setup.optimizer_params else params)
    from paraplan.runtime.state.checkpoints import save_checkpoint

    first_step, losses = _resume(config, setup, optim, scaler)
    report = _LossReport(config, setup, device, losses, first_step, rank)
    step_times, memory = [], None
    for step in range(first_step, config.steps):
        recorder.step = step
        # dropout's masks: a function of (seed, stage, step) only, the same on every replica of a
        # stage, so that a run resumed at any step (under any plan) draws what its own uninterrupted
        # run would
        torch.manual_seed(step_seed(config.seed, stage_index, step))
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
        meter = MemoryMeter(params) if step == config.steps - 1 else None
        with meter.watching() if meter is not None else contextlib.nullcontext(), \
                step_context(plan.precision, device):  # bf16: one autocast region for the step
            _run_schedule(setup, schedule, plan.n_stages, x, y, micro_losses)
        setup.sync.finish()
        for name, g in tied_groups:
            dist.all_reduce(local_value(setup.named[name].grad), group=g)
        scale = scaler.scale  # the reported losses are the schedule's, scaled
        finite = scaler.unscale_and_check([local_value(p.grad) for group in optim.param_groups
                                           for p in group["params"] if p.grad is not None], device)
        if finite and config.clip_norm is not None:
            _clip_gradients(config, setup, owner_names, params, device)
        if finite:  # fp16: an overflow on any rank skips every rank's step
            optim.step()
        if meter is not None:  # the states at the optimizer step, before ZeRO's gather frees the gradients
            memory = {"rank": rank, "stage": stage_index, "activations": meter.peak_activation_bytes,
                      "weight_copies": meter.peak_copy_bytes,
                      **state_bytes(params + list(setup.copies), optim)}
            memory["grads"] += setup.extra_grad_bytes()
            if device.type == "cuda":
                memory["allocator_peak"] = torch.cuda.max_memory_allocated(device)
        if setup.after_step is not None:
            setup.after_step()
        step_times.append(time.perf_counter() - t0)
        report.local.append(sum(float(v.detach()) for v in micro_losses) * setup.loss_weight / scale
                            if micro_losses else 0.0)
        done = step + 1
        checkpoint_due = config.checkpoint_dir is not None and (done == config.steps or (
            config.checkpoint_every and done % config.checkpoint_every == 0))
        report.after_step(step, step_times[-1], checkpoint_due)
        if checkpoint_due:  # collective: the manifest is written once DCP's save completed on every rank
            save_checkpoint(config, done, setup.named, optim, losses, scaler.scale, module,
                            getattr(setup.sync, "zero", ()))
    report.stop()
    result = {"rank": rank, "stage": stage_index, "replica": setup.position, "losses": losses, "step_s": step_times}
    if config.out_dir is not None:
        _write_outputs(config, rank, setup, recorder, step_times, memory)
    dist.barrier()
    return result


def _tied_groups(plan, setup: RankSetup, stage_names: list[set[str]], rank: int) -> list[tuple[str, object]]:
    """(name, group) for each parameter of this rank held by several stages: its gradient is summed
    over the group. Every rank makes every group, in the same order (new_group is collective): a
    rank that holds no tied weight too (it did not, and a middle stage's rank then disagreed with the
    others on every group made after, in the next run of the same processes)."""
    tied_groups = []
    for name in sorted(set().union(*stage_names)):
        holders = [s for s in range(plan.n_stages) if name in stage_names[s]]
        if len(holders) > 1 and unequal(plan):  # every holder's share, summed over all of them (wide_rank.py)
            ranks = sorted({d for s in holders for d in plan.stages[s].devices})
            g = dist.new_group(ranks)
            if rank in ranks:
                tied_groups.append((name, g))
        elif len(holders) > 1:
            for r in range(len(plan.stages[0].devices)):
                ranks = list(dict.fromkeys(plan.stages[s].devices[r] for s in holders))
                if len(ranks) == 1:  # every holder on one rank (a V's two ends): one parameter, one gradient
                    continue
                g = dist.new_group(ranks)
                if rank in ranks:
                    tied_groups.append((name, g))
    return tied_groups


def _schedule(plan, setup: RankSetup, device, recorder, scaler):
    """The rank's PipelineStage (or, with several chunks per rank, its stages) under the torch
    schedule class of the plan's kind, whose order of actions is plans/schedules.py's (tested),
    recorded on the timeline."""
    import torch.distributed.pipelining as pipelining

    classes = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
               "looped-bfs": "ScheduleLoopedBFS", "interleaved-zb": "ScheduleInterleavedZeroBubble",
               "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}
    if plan.schedule not in classes and plan.schedule != "zb-2p":
        raise RuntimeError(f"the runtime runs the schedules {', '.join(classes)}, zb-2p, not {plan.schedule!r}")
    chunks = setup.chunks or ((setup.stage_index, setup.module),)
    stages = [pipelining.PipelineStage(m, s, plan.n_stages, device, group=setup.pp_group) for s, m in chunks]
    for stage in stages:
        recorder.wrap_stage(stage)
    recorder.patch_p2p()

    def loss(out, target):
        return setup.loss(out, _real_target(target)) * scaler.scale  # scale 1 unless fp16

    if plan.schedule == "zb-2p":
        return _ordered_schedule(plan, stages, loss)
    schedule_cls = getattr(pipelining, classes[plan.schedule])
    # the multi-stage classes take a list of stages even for one chunk per rank (ZB-H1)
    single = plan.schedule in ("gpipe", "1f1b")
    return schedule_cls(stages[0] if single else stages, plan.n_micro, loss_fn=loss, scale_grads=False)


def _ordered_schedule(plan, stages, loss):
    """A kind torch has no class for (zb-2p: plans/zero_bubble_auto.py): every rank's order of
    compute actions handed to torch's _PipelineScheduleRuntime, which adds the sends, receives and
    the gradient reduction as for its own classes (its `_prepare_schedule_with_comms`)."""
    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

    from paraplan.plans.schedules import rank_orders

    schedule = _PipelineScheduleRuntime(stages, plan.n_micro, loss_fn=loss, scale_grads=False)
    orders = {r: [_Action.from_str(str(a)) for a in order]
              for r, order in enumerate(rank_orders(plan.schedule, plan.n_ranks, plan.virtual_stages, plan.n_micro))}
    schedule.pipeline_order = orders
    schedule._prepare_schedule_with_comms(orders)
    return schedule


def step_seed(seed: int, stage: int, step: int) -> int:
    """The seed of `stage`'s random draws (dropout) at `step`."""
    return (seed * 1_000_003 + stage * 7_919 + step) % 2**63


def _resume(config: RunConfig, setup: RankSetup, optim, scaler) -> tuple[int, list]:
    """(the first step to run, the losses so far): (0, []) for a new run; when resuming
    (collective), the checkpoint's, this plan's parameters and optimizer state read from it
    whatever plan wrote it (runtime/state/layout_state.py), and fp16's loss scale."""
    if not config.resume:
        return 0, []
    from paraplan.runtime.state.checkpoints import load_checkpoint

    # check_resume has checked the files (sha256) and what they belong to
    step, losses, loss_scale = load_checkpoint(config.checkpoint_dir, setup.named, optim, setup.module,
                                               getattr(setup.sync, "zero", ()))
    if scaler.enabled and loss_scale != 1.0:
        scaler.scale = loss_scale
    return step, losses


def _run_schedule(setup: RankSetup, schedule, n_stages: int, x, y, micro_losses: list) -> None:
    """One step's forwards and backwards: the plan kind's own step, or the pipeline schedule fed as
    this rank's stage needs (the first takes the inputs, the last the targets and the losses)."""
    held = [s for s, _ in setup.chunks] or [setup.stage_index]
    first, last = 0 in held, n_stages - 1 in held
    if y is None and last and schedule is not None:
        y = _no_targets(x)
    # return_outputs=False: the step's outputs are not used (the losses are), so the last stage need
    # not keep every micro-batch's output until the step ends
    if schedule is None:
        setup.run_step(x, y, micro_losses)
    elif first and last:
        schedule.step(x, target=y, losses=micro_losses, return_outputs=False)
    elif first:
        schedule.step(x, return_outputs=False)
    elif last:
        schedule.step(target=y, losses=micro_losses, return_outputs=False)
    else:
        schedule.step(return_outputs=False)


def _no_targets(x) -> torch.Tensor:
    """A model without targets (a user's module returning only sample inputs) is trained on the mean
    of its outputs (models/built.py: sample_loss, docs/models.md), but torch's pipeline schedules
    require a target at the last stage: they get a placeholder of zero columns, one row per sample,
    which they split into micro-batches like any target and `_real_target` turns back into None."""
    first = x if isinstance(x, torch.Tensor) else next(t for t in x if isinstance(t, torch.Tensor))
    return torch.empty((first.shape[0], 0), device=first.device)


def _real_target(target):
    """The target the model's loss takes: None for `_no_targets`' placeholder."""
    if isinstance(target, torch.Tensor) and target.dim() == 2 and target.shape[1] == 0:
        return None
    return target


def _clip_gradients(config: RunConfig, setup: RankSetup, owner_names: list[str], params, device) -> None:
    """Scale the gradients so that the whole model's norm is at most config.clip_norm (squares
    summed over this rank's pipeline, each parameter by its owner)."""
    from paraplan.runtime.rank.rank_base import squared_norm

    sq = squared_norm(setup.named[n] for n in owner_names).to(device) * setup.norm_share
    dist.all_reduce(sq, group=setup.pp_group)
    coef = min(1.0, config.clip_norm / (float(sq.sqrt()) + 1e-6))
    for p in params:
        if p.grad is not None:
            p.grad.mul_(coef)


class _LossReport:
    """The step losses, summed over the ranks (only last stages contribute) in one all-reduce
    every `every` steps, not every step: a per-step all-reduce, even asynchronous, cost ~10% of
    a 50 ms step here (benchmarks/runtime_overhead.py). `every` is fixed after the second step,
    the same on every rank (from the slowest rank's step), so that the flushes stay
    collective: about REPORT_EVERY_S apart (the first two steps are reported at once). Rank 0
    prints them (config.log), and losses.json is rewritten, at each flush."""

    def __init__(self, config: RunConfig, setup: RankSetup, device, losses: list, first_step: int, rank: int):
        self.config, self.setup, self.device = config, setup, device
        self.losses = losses  # every step's summed loss so far (the checkpoint's first when resuming)
        self.first_step = first_step
        self.local: list[float] = []  # this rank's weighted contributions of the steps not yet summed
        self.every = 1
        self.progress = None
        if rank == 0 and config.log:
            from rich.progress import Progress

            # no refresh thread: it would compete with this rank's training for the interpreter
            self.progress = Progress(transient=True, auto_refresh=False)
            self.progress.start()
            self.bar = self.progress.add_task("training", total=config.steps, completed=first_step)

    def after_step(self, step: int, took: float, checkpoint_due) -> None:
        """Flush when due (collective), and fix `every` after the second step."""
        done, first_step = step + 1, self.first_step
        if done == self.config.steps or checkpoint_due or (done - first_step - 2) % self.every == 0 or \
                step == first_step:
            self.flush(done, took)
        if step == first_step + 1:  # the flush interval, from the slowest rank's second step (the first warms up)
            slowest = torch.tensor([took], dtype=torch.float64, device=self.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            self.every = max(1, min(64, int(REPORT_EVERY_S / max(float(slowest), 1e-6))))

    def flush(self, done: int, took: float) -> None:
        config, losses = self.config, self.losses
        summed = torch.tensor(self.local, dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        losses.extend(float(v) for v in summed)
        self.local.clear()
        if self.progress is not None:
            self.progress.console.print(f"step {done}/{config.steps}: loss {losses[-1]:.6f}, {took * 1e3:.1f} ms, "
                                        f"{config.plan.global_batch / took:.1f} samples/s")
            self.progress.update(self.bar, completed=done)
            self.progress.refresh()
        if config.out_dir is not None and self.setup.writes and self.setup.stage_index == 0:
            # during the run, so that a killed or failed run keeps the losses of the steps it completed
            from paraplan.system.fileio import atomic_write_text

            # flushed to the disk only at the end: rewritten up to twice a second during the run
            atomic_write_text(Path(config.out_dir) / "losses.json", json.dumps(losses), durable=done == config.steps)

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _write_outputs(config: RunConfig, rank: int, setup: RankSetup, recorder, step_times: list[float],
                   memory: dict | None) -> None:
    """The rank's timeline, step times and memory, and the stage's final parameters (its writer's)."""
    from paraplan.system.fileio import atomic_torch_save, atomic_write_text

    # atomic writes (paraplan.system.fileio): a full disk is one line, no partial file
    recorder.save(Path(config.out_dir) / f"timeline_rank{rank}.json", rank)
    atomic_write_text(Path(config.out_dir) / f"steps_rank{rank}.json", json.dumps(step_times))
    if memory is not None:
        atomic_write_text(Path(config.out_dir) / f"memory_rank{rank}.json", json.dumps(memory))
    full = setup.full_state()  # collective for hybrid stages: every rank of the stage takes part
    if setup.writes:
        # one file per stage, with several chunks per rank too (a V's tied ends: in both files)
        for s, part in _stage_parts(setup, full):
            atomic_torch_save(part, Path(config.out_dir) / f"stage{s}.pt")


def _stage_parts(setup: RankSetup, full: dict) -> list[tuple[int, dict]]:
    if not setup.chunks:
        return [(setup.stage_index, full)]
    by_id = {id(p): n for n, p in setup.named.items()}
    return [(s, {by_id[id(p)]: full[by_id[id(p)]] for p in m.parameters()}) for s, m in setup.chunks]


def _stage_param_names(layers, names, layer_range) -> set[str]:
    return {names.get(id(p)) for _, _, m in layers[layer_range.start:layer_range.stop] for p in m.parameters()}


def _owned_names(layers, names, layer_range) -> set[str]:
    """Parameters whose first user (owner) is a layer of this stage."""
    first: dict[str, int] = {}
    for i, (_, _, m) in enumerate(layers):
        for p in m.parameters():
            first.setdefault(names.get(id(p)), i)
    return {n for n, i in first.items() if layer_range.start <= i < layer_range.stop}
