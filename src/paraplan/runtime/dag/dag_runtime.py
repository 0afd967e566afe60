"""Run an FD-DPS operator placement ('dag' plan) on N gloo processes, one per device of the plan.

Mechanism (runtime/dag/program.py and analysis.py build the static part; rank_step.py runs a step):
  - Forward: every rank walks its own operators in the plan's order and runs their aten calls on
    real tensors under autograd (the calls op_trace recorded on meta, so the names are the plan's).
    A read of a storage version written on another rank is a blocking `recv` of the whole storage
    from the writer, which `isend`s it right after writing it (handles kept until the step ends).
    Each rank follows the plan's device order, and every receive is an edge of the operator graph
    whose replay the plan passed, so the forward cannot deadlock.
  - Backward: one `torch.autograd.backward` per rank. A transfer of a tensor that requires grad is a
    pair of autograd Functions: `_Send` (forward: isend; backward: a blocking recv of the gradient
    from the receiver) and `_Recv` (forward: recv; backward: isend of the gradient, zeros when the
    tensor got none). Both give a zero scalar that joins the rank's root, so every one of them runs
    in the backward, and the loss's rank adds the loss. The CPU autograd engine runs ready Nodes by
    decreasing sequence number, i.e. each rank runs its backward in exactly the reverse of the order
    its forward created Nodes; the reverse of a deadlock-free forward exchange is deadlock-free.
    How this differs from the plan: the plan lists each backward node with a position in its
    device's order; here autograd runs every Node on the rank of the forward op that created it
    (which the `runnable` constraint makes the plan's device, and `dag_refusal` checks) in reverse
    creation order, not in the plan's backward order. Views' backward Nodes (zero kernels) run on
    the rank that replayed the view. The backward half of a split is what autograd makes of the
    forward parts: part k's backward on part k's device; the gradient of the gathered output is
    split by cat's backward on the gather's device and sent to the parts; the input gradients of
    the parts come back to the input's producer, where autograd accumulates them (the graph's
    backward gather), and the weight-gradient partials are summed by the all-reduce below.
  - Parameters: every rank materialises the whole model with the reference's seeded init (cheap
    for the models this runs) and uses the parameters its operators read. A parameter read on
    several ranks (split parts, ops of one module on two devices, GPT-2's tied embedding) has its
    gradient summed over exactly those ranks (one flattened all_reduce per group of ranks) and
    every one of them steps its copy with the same optimizer on the same gradient, so the copies
    stay equal without a broadcast; its owner (the lowest such rank) writes it. The simulator and
    the FD-DPS cost model price this sum as the backward gather's additions on one device and no
    all-reduce: the all-reduce is a real cost they do not see.
  - Dropout off (RunConfig.dropout=False): the plan's graph was traced with dropout (its names
    include the mask ops), so the mask's bernoulli_(q) runs as fill_(q); the next div_(q) makes
    the mask exactly 1 (q / q), the multiply exactly the identity.
Outputs as the stage loop's (runtime/pipeline/stage_loop.py): losses.json (rank 0), steps_rank{r}.json,
memory_dag_rank{r}.json (the last step: what autograd saved during this rank's forward, and its
parameters, gradients and optimizer state, every rank counting the whole model's copies it uses)
and stage{r}.pt (the parameters it owns). Not written: the timeline (runtime/measure/timeline.py's Recorder wraps pipeline stages).
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from paraplan.errors import ParaplanError
from paraplan.runtime.dag.analysis import Analysis, analyse
from paraplan.runtime.dag.program import DagRefusal, build_program, flatten
from paraplan.runtime.dag.rank_step import RankStep
from paraplan.runtime.measure.memory_meter import MemoryMeter, state_bytes
from paraplan.runtime.rank.data import batch_source
from paraplan.runtime.rank.materialize import build_layers, materialize
from paraplan.runtime.rank.rank_base import RunConfig, make_optimizer


@functools.lru_cache(maxsize=8)
def _program(model: str, batch: int, seq_len, image_size):
    return build_program(model, batch, seq_len, image_size)


def dag_analysis(config: RunConfig, built=None) -> Analysis:
    """The plan's placement against the model's traced program; `built`: the model on meta, if
    the caller built it already (the launcher), else the program is built here (once per process)."""
    plan = config.plan
    if built is not None:
        return analyse(plan, build_program(config.model, plan.global_batch, built=built))
    return analyse(plan, _program(config.model, plan.global_batch, config.seq_len, config.image_size))


def dag_refusal(config: RunConfig, built=None) -> str | None:
    """One line saying why this 'dag' plan cannot run, or None (`built`: as dag_analysis takes it)."""
    if config.checkpoint_dir or config.resume:
        return "checkpoints of operator placements are not written yet"
    try:
        dag_analysis(config, built)
    except (DagRefusal, ParaplanError) as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a model the analysis does not handle: one line, not a traceback
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"the operator runtime cannot analyse {config.model}: {type(exc).__name__}: {first}"
    return None


def _externals(built, named: dict[str, torch.nn.Parameter], inputs, targets) -> dict:
    ext = {("param", n): p for n, p in named.items()}
    for n, b in built.module.named_buffers(remove_duplicate=False):
        ext.setdefault(("buffer", n), b)
    for kind, value in (("input", inputs), ("target", targets)):
        for pos, t in enumerate(flatten(value)):
            if isinstance(t, torch.Tensor):
                ext[(kind, pos)] = t
    return ext


def train_dag_rank(config: RunConfig) -> dict:
    plan = config.plan
    rank, world = dist.get_rank(), dist.get_world_size()
    an = dag_analysis(config)
    if an.world != world:
        raise RuntimeError(f"the plan places operators on {an.world} devices, the world has {world} ranks")
    built, layers, names = build_layers(config.model, config.seed, config.seq_len, config.image_size,
                                        dropout=config.dropout)
    modules = [m for _, _, m in layers]
    materialize(modules, names, config.seed, torch.device("cpu"))  # one call: tied weights stay tied
    named: dict[str, torch.nn.Parameter] = {}
    for m in modules:
        for p in m.parameters():
            named.setdefault(names.get(id(p)), p)
    missing = sorted(set(an.param_users) - set(named))
    if missing:
        raise RuntimeError(f"parameter {missing[0]} of the trace is not in the built model")
    owner = {n: (an.param_users.get(n) or [0])[0] for n in named}
    mine = [n for n in sorted(named) if rank in an.param_users.get(n, []) or owner[n] == rank]
    # one group per set of ranks sharing parameters; new_group is collective: every rank, same order
    shared: dict[tuple[int, ...], list[str]] = {}
    for n in sorted(named):
        users = tuple(an.param_users.get(n, []))
        if len(users) > 1:
            shared.setdefault(users, []).append(n)
    groups = {users: dist.new_group(list(users)) for users in sorted(shared)}
    params = [named[n] for n in mine]
    optim = make_optimizer(config, params)
    torch.manual_seed(config.seed + 1000 * rank)
    losses, step_times, memory = [], [], None
    batches = batch_source(built, plan.global_batch, config.seed, config.data, config.data_dtype)
    for step in range(config.steps):
        if config.step_hook is not None:
            config.step_hook(rank, step)
        inputs, targets = batches(step)
        optim.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        # memory on the last step, as the stage loop: what autograd saves (MemoryMeter's pack hook)
        meter = MemoryMeter() if step == config.steps - 1 else None
        run = RankStep(an, rank, _externals(built, named, inputs, targets), config.dropout)
        with meter.watching() if meter is not None else contextlib.nullcontext():
            loss = run.forward()
        run.backward(loss)
        for users, ns in shared.items():
            if rank in users:
                grads = [named[n].grad if named[n].grad is not None else torch.zeros_like(named[n]) for n in ns]
                flat = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(flat, group=groups[users])
                offset = 0
                for n, g in zip(ns, grads, strict=True):
                    named[n].grad = flat[offset:offset + g.numel()].view_as(g).clone()
                    offset += g.numel()
        if config.clip_norm is not None:
            sq = torch.zeros((), dtype=torch.float64)
            for n in mine:
                if owner[n] == rank and named[n].grad is not None:
                    sq += named[n].grad.detach().double().pow(2).sum()
            dist.all_reduce(sq)
            coef = min(1.0, config.clip_norm / (float(sq.sqrt()) + 1e-6))
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(coef)
        optim.step()
        step_times.append(time.perf_counter() - t0)
        if meter is not None:
            memory = {"rank": rank, "stage": rank, "activations": meter.peak_activation_bytes,
                      **state_bytes(params, optim)}
        losses.append(float(loss.detach()) if loss is not None else 0.0)
        if config.log and rank == an.loss_rank:
            print(f"step {step + 1}/{config.steps}: loss {losses[-1]:.6f}, {step_times[-1] * 1e3:.1f} ms", flush=True)
    summed = torch.tensor(losses, dtype=torch.float64)
    dist.broadcast(summed, src=an.loss_rank)
    losses = [float(v) for v in summed]
    if config.out_dir is not None:
        # atomic: a full disk is one line, and no partial file is left
        from paraplan.system.fileio import atomic_torch_save, atomic_write_text

        out = Path(config.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if rank == 0:
            atomic_write_text(out / "losses.json", json.dumps(losses))
        atomic_write_text(out / f"steps_rank{rank}.json", json.dumps(step_times))
        if memory is not None:  # not memory_rank{r}.json: `paraplan train` compares those with per-stage
            atomic_write_text(out / f"memory_dag_rank{rank}.json", json.dumps(memory))  # predictions, which dag plans lack
        atomic_torch_save({n: named[n].detach().clone() for n in mine if owner[n] == rank}, out / f"stage{rank}.pt")
    dist.barrier()
    return {"rank": rank, "stage": rank, "replica": 0, "losses": losses, "step_s": step_times, "memory": memory}

