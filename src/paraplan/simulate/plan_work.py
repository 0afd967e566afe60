"""From a Plan and a cost model to the per-stage numbers the pipeline builder simulates.

Stages without per-layer strategies are plain data parallel over their devices: replica r of the
pipeline is devices[r] of every stage, and each replica gets global_batch / (n_micro x replicas)
samples per micro-batch. Stages with strategies (Galvatron-BMW) run as one group on the plan's
micro-batch; each layer's time follows Galvatron §V: compute at the local batch divided by tp,
plus tensor-parallel all-reduces of its activations (two per pass, Megatron) and sharded-data-
parallel all-gather / reduce-scatter of its parameters, plus a forward recomputation when
checkpointed. The group is drawn on its first device. Layout assumption: tp is the innermost
dimension of a stage's device list, so a tp group is consecutive devices.
Not modelled yet: Galvatron's Slice-Gather transformation between layers with different strategies.
"""

from __future__ import annotations

from paraplan.costs.collectives import ring_allgather_s, ring_allreduce_s, ring_reducescatter_s
from paraplan.costs.model import CostModel
from paraplan.plan.plan import Plan, PlanError, Stage, check_fits
from paraplan.simulate.pipeline import PipelineWork, StageSync, StageWork, SyncBucket

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb


def _grad_bytes(cm: CostModel, stage: Stage) -> list[float]:
    """Gradient bytes per layer of the stage's backward range (tied copies included)."""
    owned = set(stage.layers)
    out = []
    for i in stage.backward:
        layer = cm.model.layers[i]
        extra = layer.shared_param_bytes if any(o not in owned for o in layer.shared_owners) else 0
        out.append(float(layer.param_bytes + extra))
    return out


def _buckets(grad_sync: str, grads: list[float], backward_s: list[float], allreduce) -> tuple[SyncBucket, ...]:
    total = sum(grads)
    if grad_sync != "bucketed":
        return (SyncBucket(1.0, allreduce(total)),)
    # DDP fills buckets in reverse layer order, as gradients become ready during the backward.
    buckets, size, time_done, total_time = [], 0.0, 0.0, sum(backward_s) or 1.0
    for g, t in zip(reversed(grads), reversed(backward_s), strict=True):
        size += g
        time_done += t
        if size >= DDP_BUCKET_BYTES:
            buckets.append(SyncBucket(time_done / total_time, allreduce(size)))
            size = 0.0
    if size > 0 or not buckets:
        buckets.append(SyncBucket(1.0, allreduce(size)))
    else:
        buckets[-1] = SyncBucket(1.0, buckets[-1].allreduce_s)
    return tuple(buckets)


def plan_work(plan: Plan, cm: CostModel) -> PipelineWork:
    if plan.schedule == "dag":
        raise PlanError("schedule 'dag': operator-placement plans need the model's operator graph, which comes "
                        "with the FD-DPS planner; simulate.dag runs them from such a graph")
    check_fits(plan, cm.model.n_layers, cm.cluster.n_devices, cm.cluster.name)
    if any(s.strategies for s in plan.stages):
        return _hybrid_work(plan, cm)
    return _data_parallel_work(plan, cm)


def _data_parallel_work(plan: Plan, cm: CostModel) -> PipelineWork:
    counts = {len(s.devices) for s in plan.stages}
    if len(counts) != 1:
        raise PlanError(f"stages: plain data-parallel stages need the same number of devices each "
                        f"(one per pipeline replica), got {sorted(counts)}")
    n_replicas = counts.pop()
    micro = plan.global_batch / (plan.n_micro * n_replicas)
    layers = cm.model.layers
    replicas = []
    for r in range(n_replicas):
        row = []
        for s, stage in enumerate(plan.stages):
            d = stage.devices[r]
            costs = cm.compute(d)
            fwd = sum(float(costs.forward[i](micro)) for i in stage.layers)
            bwd = sum(float(costs.backward[i](micro)) for i in stage.backward)
            send_f = send_b = 0.0
            if s + 1 < plan.n_stages:
                nxt = plan.stages[s + 1].devices[r]
                send_f = cm.cluster.link(d, nxt).transfer_s(layers[stage.layers.stop - 1].output_bytes.at(micro))
            if s > 0:
                prev = plan.stages[s - 1].devices[r]
                cut = stage.backward.start - 1
                send_b = cm.cluster.link(d, prev).transfer_s(layers[cut].output_grad_bytes.at(micro))
            fwd += cm.action_overhead_s
            bwd += cm.action_overhead_s
            row.append(StageWork(device=d, forward_s=fwd, backward_s=bwd, send_forward_s=send_f,
                                 send_backward_s=send_b, layers=(stage.layers.start, stage.layers.stop),
                                 backward_layers=(stage.backward.start, stage.backward.stop)))
        replicas.append(tuple(row))
    sync = ()
    if plan.grad_sync != "none" and n_replicas > 1:
        out = []
        for stage in plan.stages:
            group = stage.devices
            link = cm.cluster.slowest_link(group)
            costs = cm.compute(group[0])
            bwd_times = [float(costs.backward[i](micro)) for i in stage.backward]
            n_group = len(group)
            out.append(StageSync(devices=group, buckets=_buckets(
                plan.grad_sync, _grad_bytes(cm, stage), bwd_times,
                lambda nbytes, n=n_group, lk=link: ring_allreduce_s(nbytes, n, lk))))
        sync = tuple(out)
    return PipelineWork(schedule=plan.schedule, n_micro=plan.n_micro, replicas=tuple(replicas),
                        grad_sync=plan.grad_sync, sync=sync, n_devices=cm.cluster.n_devices, rendezvous=cm.rendezvous)


def _hybrid_work(plan: Plan, cm: CostModel) -> PipelineWork:
    micro = plan.global_batch / plan.n_micro
    layers = cm.model.layers
    row, sync = [], []
    for s, stage in enumerate(plan.stages):
        lead = stage.devices[0]
        costs = cm.compute(lead)
        fwd = bwd = 0.0
        grads_per_dp: list[tuple[float, int, tuple[int, ...]]] = []
        for i in stage.layers:
            st = stage.strategy(i)
            local = micro / st.data_degree
            tp_link = cm.cluster.slowest_link(stage.devices[:st.tp])
            data_group = stage.devices[::st.tp]
            data_link = cm.cluster.slowest_link(data_group)
            layer = layers[i]
            shard = layer.param_bytes / st.tp
            f = float(costs.forward[i](local)) / st.tp
            b = float(costs.backward[i](local)) / st.tp
            if st.tp > 1:  # Megatron: two all-reduces of the activations per pass
                f += 2 * ring_allreduce_s(layer.output_bytes.at(local), st.tp, tp_link)
                b += 2 * ring_allreduce_s(layer.output_grad_bytes.at(local), st.tp, tp_link)
            if st.sdp > 1:  # ZeRO-3: gather weights for each pass, scatter gradients after the backward
                gather = ring_allgather_s(shard, st.sdp, data_link)
                f += gather
                b += gather + ring_reducescatter_s(shard, st.sdp, data_link)
            if st.checkpoint:
                b += f
            fwd += f
            bwd += b
            if st.dp > 1:
                grads_per_dp.append((shard, st.dp, data_group))
        send_f = send_b = 0.0
        if s + 1 < plan.n_stages:
            nxt = plan.stages[s + 1].devices[0]
            last = stage.strategy(stage.layers.stop - 1)
            send_f = cm.cluster.link(lead, nxt).transfer_s(
                layers[stage.layers.stop - 1].output_bytes.at(micro / last.data_degree))
        if s > 0:
            prev = plan.stages[s - 1].devices[0]
            first = stage.strategy(stage.layers.start)
            send_b = cm.cluster.link(lead, prev).transfer_s(
                layers[stage.layers.start - 1].output_grad_bytes.at(micro / first.data_degree))
        row.append(StageWork(device=lead, forward_s=fwd, backward_s=bwd, send_forward_s=send_f, send_backward_s=send_b,
                             layers=(stage.layers.start, stage.layers.stop),
                             backward_layers=(stage.backward.start, stage.backward.stop)))
        total = sum(ring_allreduce_s(shard, n, cm.cluster.slowest_link(group)) for shard, n, group in grads_per_dp)
        sync.append(StageSync(devices=stage.devices, buckets=(SyncBucket(1.0, total),)))
    grad_sync = plan.grad_sync if plan.grad_sync != "bucketed" else "gropipe-delayed"
    return PipelineWork(schedule=plan.schedule, n_micro=plan.n_micro, replicas=(tuple(row),), grad_sync=grad_sync,
                        sync=tuple(sync) if grad_sync != "none" else (), n_devices=cm.cluster.n_devices)
