"""Stages of unequal width (plans/stage_widths.py, issue 52 item 2) as the pipeline builder's work:
each device of a stage computes its slice of every micro-batch, at its own kind's speed, and each
boundary's hops carry the rows two devices share, at their link's speed.

Where a stage of a devices meets one of b, device l of the second waits for every sender whose rows
it takes (forward) and gets from it in the backward the gradient of those rows: the simulator's
transfers are the hops, each holding its sender's send channel and its receiver's receive channel
(simulator/engine.py), so 2 devices feeding 1 are received one after the other and 1 feeding 2 is
sent one after the other. The gradient all-reduce is the stage's own group's, as for equal widths.
"""

from __future__ import annotations

from paraplan.costs.model import CostModel
from paraplan.costs.strategy import weight_grad_fraction
from paraplan.plans.plan import Plan
from paraplan.plans.stage_widths import boundary_hops, stage_rows
from paraplan.simulator.grad_buckets import stage_sync
from paraplan.simulator.pipeline import PipelineWork, StageHop, StageWork


def wide_work(plan: Plan, cm: CostModel) -> PipelineWork:
    layers = cm.model.layers
    scale = cm.overheads.scale_for(len(set(plan.devices)))  # measured: every core computing at once
    lanes = []
    for s, stage in enumerate(plan.stages):
        row = []
        for d, (r0, r1) in zip(stage.devices, stage_rows(plan, s), strict=True):
            local = r1 - r0
            costs = cm.compute(d)
            fwd = scale * sum(float(costs.forward[i](local)) for i in stage.layers)
            bwd = scale * sum(float(costs.backward[i](local)) for i in stage.backward)
            weight_grad = scale * sum(float(costs.backward[i](local)) * weight_grad_fraction(cm.model, i, local)
                                      for i in stage.backward)
            row.append(StageWork(device=d, forward_s=fwd + cm.overheads.action_s,
                                 backward_s=bwd + cm.overheads.action_s, send_forward_s=0.0, send_backward_s=0.0,
                                 layers=(stage.layers.start, stage.layers.stop),
                                 backward_layers=(stage.backward.start, stage.backward.stop), weight_grad_s=weight_grad))
        lanes.append(tuple(row))
    boundaries = []
    for s in range(plan.n_stages - 1):
        here, there = plan.stages[s], plan.stages[s + 1]
        out = layers[here.layers.stop - 1]  # the activation leaving stage s; its gradient comes back
        boundary = []
        for h in boundary_hops(plan, s):
            link = cm.cluster.link(here.devices[h.sender], there.devices[h.receiver])
            boundary.append(StageHop(h.sender, h.receiver, link.transfer_s(out.output_bytes.at(h.rows)),
                                     link.transfer_s(out.output_grad_bytes.at(h.rows))))
        boundaries.append(tuple(boundary))
    sync = ()
    if plan.grad_sync != "none" and any(len(st.devices) > 1 for st in plan.stages):
        # DDP's buckets are cut by the backward of the stage's largest slice (its last to finish)
        sync = tuple(stage_sync(plan, cm, stage, max(b - a for a, b in stage_rows(plan, s)), scale)
                     for s, stage in enumerate(plan.stages))
    return PipelineWork(schedule=plan.schedule, n_micro=plan.n_micro, replicas=(), grad_sync=plan.grad_sync,
                        sync=sync, n_devices=cm.cluster.n_devices, rendezvous=cm.overheads.rendezvous,
                        exchange_s=cm.overheads.exchange_s, lanes=tuple(lanes), boundary_hops=tuple(boundaries))
