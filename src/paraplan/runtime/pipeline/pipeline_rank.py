"""One rank of a plain pipeline plan: its stage of one pipeline replica, and the gradient averaging
between the replicas of that stage (the stage loop, runtime/pipeline/stage_loop.py, runs the schedule).

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
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from paraplan.runtime.rank.materialize import StageModule, materialize
from paraplan.runtime.rank.rank_base import RankSetup, RunConfig, make_groups, stage_and_position

BUCKET_BYTES = 25 * 2**20


class GradSync:
    """Gradient averaging across the replicas of one stage."""

    def __init__(self, params: list[torch.nn.Parameter], group, group_size: int, mode: str, n_micro: int,
                 recorder=None, average: bool = True):
        """`average`: divide the sum by the group's size (replicas that each took a mean over their
        rows); False where each device's gradients are already its rows' share (runtime/pipeline/wide_rank.py)."""
        self.params, self.group, self.size, self.mode, self.n_micro = params, group, group_size, mode, n_micro
        self.average = average
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
        if self.size > 1 and self.mode != "none" and self.average:
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(self.size)
        self.handles, self.flat = [], []
        self.counts = {k: 0 for k in self.counts}
        self.bucket_ready = [0] * len(self.buckets)


def replica_setup(config: RunConfig, rank: int, device, built, layers, names, recorder) -> RankSetup:
    plan = config.plan
    stage_index, replica = stage_and_position(plan, rank)
    n_replicas = len(plan.stages[0].devices)
    pp_groups, dp_groups = make_groups(plan)
    # every stage this rank runs: one, or several chunks under an interleaved / V-shaped schedule
    held = [s for s, st in enumerate(plan.stages) if rank in st.devices]
    chunks, made = [], {}  # `made`: a weight tied across two of them (a V's ends) stays one parameter
    for s in held:
        own = [m for _, _, m in layers[plan.stages[s].layers.start:plan.stages[s].layers.stop]]
        materialize(own, names, config.seed, device, made)
        chunks.append((s, StageModule(own)))
    module = chunks[0][1] if len(chunks) == 1 else torch.nn.ModuleList([m for _, m in chunks])
    params = list(dict.fromkeys(module.parameters()))  # a tied weight held twice (a V's ends) once
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
                     full_state=lambda: {n: p.detach().clone() for n, p in named.items()}, writes=replica == 0,
                     chunks=tuple(chunks) if len(chunks) > 1 else ())
