"""One rank of a plain pipeline whose stages differ in width or share their micro-batches unevenly
(plans/stage_widths.py, issue 52 items 2 and 3):
its slice of every micro-batch through its stage, the rows it shares with each device of the next
and the previous stage sent and received by itself, and the stage's gradients summed over its devices.

torch.distributed.pipelining's stages pass one micro-batch from one rank to one rank, so these plans
run their own step, as Bi-Partition's do (runtime/bipartition/bipartition_rank.py): each rank runs its
stage's order of actions (plans/schedules.py ORDERS, the order torch's GPipe and 1F1B classes run) with
blocking receives where the data is needed and non-blocking sends waited on at the end of the step
(gloo pairs them by tag: kind x TAG_STRIDE + micro-batch; two devices meet at one boundary at most).

Gradients: the last stage's devices take each their rows' mean loss times their share of the rows
over n_micro (1 / (n_micro x width) where the rows are equal), so that their losses add up to the
batch's mean; every device's gradients are then its rows' exact share,
summed (not averaged) over the stage's devices, and a weight tied across stages (GPT-2's embedding
and head) summed over every device of the stages that hold it. The gradient norm for clipping sums
every device's squares over the world, each 1/width of its stage (every device of a stage holds the
same gradients once summed).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from paraplan.plans.schedules import ORDERS
from paraplan.plans.stage_widths import boundary_hops, stage_rows
from paraplan.runtime.pipeline.pipeline_rank import GradSync
from paraplan.runtime.rank.boundaries import boundary_shapes
from paraplan.runtime.rank.materialize import StageModule, materialize
from paraplan.runtime.rank.rank_base import RankSetup, RunConfig, stage_and_position

FORWARD_TAG, GRAD_TAG = 1, 2
TAG_STRIDE = 1 << 16


def boundary_refusal(plan, built, layers) -> str | None:
    """Why the model's tensors at this plan's stage boundaries cannot be split by rows (one line), or None."""
    rows = plan.global_batch // plan.n_micro
    try:
        shapes = boundary_shapes(built, layers, rows)
    except ValueError:
        return "stages of unequal width run models whose layers pass one tensor to the next"
    for stage in plan.stages[1:]:
        shape, _ = shapes[stage.layers.start]
        if not shape or shape[0] != rows:
            return (f"the tensor entering layer {stage.layers.start} ({tuple(shape)}) is not batch-first, so it "
                    "cannot be split over the devices of a stage")
    return None


class WideStep:
    """One step of this rank's stage: its forwards and backwards in its stage's order."""

    def __init__(self, plan, stage_index: int, position: int, module, shapes, device, recorder, loss):
        self.plan, self.s, self.k, self.module = plan, stage_index, position, module
        self.shapes, self.device, self.recorder, self.loss = shapes, device, recorder, loss
        self.n = plan.n_stages
        self.order = ORDERS[plan.schedule](self.n, plan.n_micro, stage_index)
        self.rows = plan.global_batch // plan.n_micro
        self.mine = stage_rows(plan, stage_index)[position]
        self.inbound = [h for h in boundary_hops(plan, stage_index - 1)
                        if h.receiver == position] if stage_index > 0 else []
        self.outbound = [h for h in boundary_hops(plan, stage_index)
                         if h.sender == position] if stage_index + 1 < self.n else []

    def _recv(self, kind: int, m: int, src: int, rows: int, boundary: int) -> torch.Tensor:
        shape, dtype = self.shapes[boundary]
        buf = torch.empty((rows, *shape[1:]), dtype=dtype, device=self.device)
        t0 = time.time()
        dist.recv(buf, src=src, tag=kind * TAG_STRIDE + m)
        self.recorder.add("comm", "recv forward" if kind == FORWARD_TAG else "recv backward", m, t0, time.time())
        return buf

    def _send(self, t: torch.Tensor, kind: int, m: int, dst: int) -> None:
        t = t.detach().contiguous()
        self.sent.append(t)  # alive until its send is waited on
        self.works.append(dist.isend(t, dst=dst, tag=kind * TAG_STRIDE + m))

    def __call__(self, x, y, micro_losses: list) -> None:
        """x, y: the whole batch (every rank reads it: the first stage its rows, the last its targets)."""
        self.works, self.sent = [], []
        kept: dict[int, tuple] = {}
        for action in self.order:
            m, t0 = action.micro, time.time()
            if action.computation == "F":
                kept[m] = self._forward(m, x)
                self.recorder.add("compute", "forward", m, t0, time.time())
            else:
                self._backward(m, *kept.pop(m), y, micro_losses)
                self.recorder.add("compute", "backward", m, t0, time.time())
        for w in self.works:
            w.wait()

    def _forward(self, m: int, x) -> tuple:
        r0, r1 = self.mine
        base = m * self.rows
        if self.s == 0:
            inp = x[base + r0:base + r1].to(self.device)
        else:
            prev = self.plan.stages[self.s - 1].devices
            boundary = self.plan.stages[self.s].layers.start
            parts = [self._recv(FORWARD_TAG, m, prev[h.sender], h.rows, boundary) for h in self.inbound]
            inp = torch.cat(parts) if len(parts) > 1 else parts[0]
            if inp.is_floating_point():
                inp.requires_grad_()
        out = self.module(inp)
        nxt = self.plan.stages[self.s + 1].devices if self.outbound else ()
        for h in self.outbound:
            self._send(out[h.start - r0:h.stop - r0], FORWARD_TAG, m, nxt[h.receiver])
        return inp, out

    def _backward(self, m: int, inp, out, y, micro_losses: list) -> None:
        r0, r1 = self.mine
        if self.s == self.n - 1:
            base = m * self.rows
            target = None if y is None else y[base + r0:base + r1].to(self.device)
            loss = self.loss(out, target)
            loss.backward()
            micro_losses.append(loss.detach())
        else:
            nxt = self.plan.stages[self.s + 1].devices
            boundary = self.plan.stages[self.s].layers.stop
            parts = [self._recv(GRAD_TAG, m, nxt[h.receiver], h.rows, boundary) for h in self.outbound]
            torch.autograd.backward(out, torch.cat(parts) if len(parts) > 1 else parts[0])
        if self.s > 0 and inp.requires_grad:
            prev = self.plan.stages[self.s - 1].devices
            for h in self.inbound:
                self._send(inp.grad[h.start - r0:h.stop - r0], GRAD_TAG, m, prev[h.sender])


def wide_setup(config: RunConfig, rank: int, device, built, layers, names, recorder) -> RankSetup:
    plan = config.plan
    s, k = stage_and_position(plan, rank)
    stage = plan.stages[s]
    # every rank makes every stage's group, in stage order (new_group is collective)
    groups = [dist.new_group(list(st.devices)) for st in plan.stages]
    shapes = boundary_shapes(built, layers, plan.global_batch // plan.n_micro)  # on meta, before materialising
    own = [m for _, _, m in layers[stage.layers.start:stage.layers.stop]]
    materialize(own, names, config.seed, device)
    module = StageModule(own)
    params = list(dict.fromkeys(module.parameters()))
    named = {names.get(id(p)): p for p in params}
    elsewhere = {names.get(id(p)) for j, st in enumerate(plan.stages) if j != s
                 for _, _, m in layers[st.layers.start:st.layers.stop] for p in m.parameters()}
    # tied weights are summed over every holder by the stage loop (`_tied_groups`), the rest here
    untied = [p for p in params if names.get(id(p)) not in elsewhere]
    sync = GradSync(untied, groups[s], len(stage.devices), plan.grad_sync, plan.n_micro, recorder, average=False)
    # the last stage's devices weight their rows' mean loss by their share of the batch's rows
    last_rows = stage_rows(plan, plan.n_stages - 1)[k] if s == plan.n_stages - 1 else (0, 1)
    share = (last_rows[1] - last_rows[0]) / (plan.global_batch // plan.n_micro)
    setup = RankSetup(module=module, stage_index=s, position=k, pp_group=dist.group.WORLD, named=named, sync=sync,
                      loss=lambda out, target: built.loss(out, target) * share / plan.n_micro,
                      local_batch=lambda inputs, targets: (inputs, targets), loss_weight=1.0,
                      full_state=lambda: {n: p.detach().clone() for n, p in named.items()}, writes=k == 0,
                      norm_share=1.0 / len(stage.devices))
    step = WideStep(plan, s, k, module, shapes, device, recorder,
                    lambda out, target: setup.loss(out, target) * setup.loss_scale())
    setup.run_step = step
    return setup
