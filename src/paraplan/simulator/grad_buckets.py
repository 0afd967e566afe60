"""A plain stage's gradient all-reduce as the simulator prices it: the bytes per layer (a tied copy
included) and DDP's buckets (filled in reverse layer order as the backward makes them ready), for
simulator/plan_work.py and simulator/wide_work.py."""

from __future__ import annotations

from paraplan.costs.collectives import allreduce_s
from paraplan.costs.model import CostModel
from paraplan.plans.plan import Plan, Stage
from paraplan.simulator.pipeline import StageSync, SyncBucket

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


def grad_bytes(cm: CostModel, stage: Stage) -> list[float]:
    """Gradient bytes per layer of the stage's backward range (tied copies included)."""
    owned = set(stage.layers)
    out = []
    for i in stage.backward:
        layer = cm.model.layers[i]
        extra = layer.shared_param_bytes if any(o not in owned for o in layer.shared_owners) else 0
        out.append(float(layer.param_bytes + extra))
    return out


def buckets(grad_sync: str, grads: list[float], backward_s: list[float], allreduce) -> tuple[SyncBucket, ...]:
    """The stage's gradient all-reduces. `grads` and `backward_s` are per layer in layer order;
    `allreduce(first, last)` prices all-reducing the gradients of layers first..last-1 together."""
    n = len(grads)
    if grad_sync != "bucketed":
        return (SyncBucket(1.0, allreduce(0, n)),)
    # DDP fills buckets in reverse layer order, as gradients become ready during the backward.
    out, size, top, time_done, total_time = [], 0.0, n, 0.0, sum(backward_s) or 1.0
    for i in reversed(range(n)):
        size += grads[i]
        time_done += backward_s[i]
        if size >= DDP_BUCKET_BYTES:
            out.append(SyncBucket(time_done / total_time, allreduce(i, top)))
            size, top = 0.0, i
    if size > 0 or not out:
        out.append(SyncBucket(1.0, allreduce(0, top)))
    else:
        out[-1] = SyncBucket(1.0, out[-1].allreduce_s)
    return tuple(out)


def stage_sync(plan: Plan, cm: CostModel, stage: Stage, micro: float, scale: float) -> StageSync:
    """A plain stage's gradient all-reduce over its devices (DDP's buckets with grad_sync bucketed),
    its backward timed at `micro` samples a device."""
    group = stage.devices
    link = cm.cluster.slowest_link(group)
    costs = cm.compute(group[0])
    bwd_times = [scale * float(costs.backward[i](micro)) for i in stage.backward]
    grads = grad_bytes(cm, stage)
    return StageSync(devices=group, buckets=buckets(plan.grad_sync, grads, bwd_times,
                                                     lambda a, b: allreduce_s(sum(grads[a:b]), len(group), link)))
