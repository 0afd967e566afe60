"""From a Plan and a cost model to the per-stage numbers the pipeline builder simulates.

Stages without per-layer strategies are plain data parallel over their devices: replica r of the
pipeline is devices[r] of every stage, and each replica gets global_batch / (n_micro x replicas)
samples per micro-batch. Stages with strategies (Galvatron-BMW) run as one group on the plan's
micro-batch; each layer's time follows Galvatron §V: compute at the local batch divided by tp,
plus tensor-parallel all-reduces of its activations (two per pass, Megatron) and sharded-data-
parallel all-gather / reduce-scatter of its parameters, plus a forward recomputation when
checkpointed (all in costs/strategy.py). The group is drawn on its first device. Layout: each layer's
`LayerStrategy.order` says which dimension is inner-most (its groups are consecutive devices; the
default, as before the field existed, is tp, then sdp, then dp), and every collective is priced on
its own group's slowest link (costs/strategy.py `strategy_links`); SDP collectives overlap the
backward with the cost model's overlap slowdown (Galvatron §V).
Slice-Gather (Galvatron §VI): where neighbouring layers of a stage split the micro-batch
differently, the forward fetches the missing part of the activation and the backward the missing
part of its gradient, over the stage group's slowest link (costs/strategy.py `slice_gather_s`).
"""

from __future__ import annotations

from paraplan.costs.axis_costs import overlap_saving
from paraplan.costs.collectives import allreduce_s, ring_allgather_s, ring_reducescatter_s
from paraplan.costs.expert_costs import (
    dense_param_bytes,
    expert_problem,
    expert_share,
    expert_sync,
    routed_bytes,
)
from paraplan.costs.model import CostModel
from paraplan.costs.slice_gather import slice_gather_s
from paraplan.costs.strategy import (
    layer_time_on,
    strategy_groups,
    strategy_links,
    weight_grad_fraction,
)
from paraplan.plans.axes import DATA, EXPERT_DATA
from paraplan.plans.expert_overlap import steady_share
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import Plan, PlanError, check_fits
from paraplan.plans.stage_widths import unequal
from paraplan.plans.worker_roles import worker_roles
from paraplan.simulator.grad_buckets import buckets, stage_sync
from paraplan.simulator.pipeline import PipelineWork, StageSync, StageWork
from paraplan.simulator.wide_work import wide_work


def plan_work(plan: Plan, cm: CostModel) -> PipelineWork:
    if plan.kind is PlanKind.OPERATORS:
        raise PlanError("schedule 'dag': operator-placement plans need the model's operator graph, which comes "
                        "with the FD-DPS planner; simulate.dag runs them from such a graph")
    check_fits(plan, cm.model.n_layers, cm.cluster.n_devices, cm.cluster.name)
    if plan.kind is PlanKind.LAYERS:
        return _hybrid_work(plan, cm)
    if plan.kind is PlanKind.PIPELINE and unequal(plan):
        return wide_work(plan, cm)
    return _data_parallel_work(plan, cm)


def _send_split(cm: CostModel, strategy) -> int:
    """Over how many TP ranks a pipeline send between hybrid stages is split, each rank sending its
    part over its own link at once: the tp ranks under sequence parallelism (the activation is
    already split along the sequence), and always with Megatron-LM (Narayanan et al. 2021 §4.1:
    the scatter/gather optimisation); else every rank sends the whole tensor, 1."""
    from paraplan.costs.engine_profile import engine_profile

    return strategy.tp if strategy.sequence_parallel or engine_profile(cm.engine).scatter_gather_sends else 1


def _output_bytes(cm: CostModel, index: int, micro: float) -> float:
    """Bytes of layer `index`'s output per micro-batch (-1: the model's input)."""
    spec = cm.model.layers[index].output_bytes if index >= 0 else cm.model.input_bytes
    return spec.at(micro)


def _owner_transfers(plan: Plan, cm: CostModel, s: int, r: int, micro: float):
    """Bi-Partition: (activation sends, weight sends) of stage s, replica r, grouped by peer stage.

    A layer whose backward runs here and forward on stage a sends its updated weights to a once
    per iteration. Activations, with every micro-batch: `send-activations` (the paper's scheme): a
    layer whose forward runs here and backward on stage b sends its saved activations to b;
    `recompute` (what the runtime does, plans/worker_roles.py): this stage sends the one tensor a
    later backward owner recomputes from (x_s, the output of layer s - 1) to that worker."""
    stage = plan.stages[s]
    if plan.kind is not PlanKind.BIPARTITION:
        return (), ()
    forward_owner = {i: k for k, st in enumerate(plan.stages) for i in st.layers}
    backward_owner = {i: k for k, st in enumerate(plan.stages) for i in st.backward}
    acts: dict[int, float] = {}
    weights: dict[int, float] = {}
    if plan.split_layers == "recompute":
        for boundary, k in worker_roles(plan)[s].side_outputs:
            acts[k] = acts.get(k, 0.0) + _output_bytes(cm, boundary - 1, micro)
    else:
        for i in stage.layers:
            if backward_owner[i] != s:
                acts[backward_owner[i]] = acts.get(backward_owner[i], 0.0) + cm.model.layers[i].saved_bytes.at(micro)
    for i in stage.backward:
        if forward_owner[i] != s:
            weights[forward_owner[i]] = weights.get(forward_owner[i], 0.0) + cm.model.layers[i].param_bytes
    d = stage.devices[r]

    def priced(by_stage: dict[int, float]) -> tuple[tuple[int, float], ...]:
        return tuple((k, cm.cluster.link(d, plan.stages[k].devices[r]).transfer_s(nbytes))
                     for k, nbytes in sorted(by_stage.items()))

    return priced(acts), priced(weights)


def _data_parallel_work(plan: Plan, cm: CostModel) -> PipelineWork:
    counts = {len(s.devices) for s in plan.stages}
    if len(counts) != 1:
        raise PlanError(f"stages: plain data-parallel stages need the same number of devices each "
                        f"(one per pipeline replica), got {sorted(counts)}")
    n_replicas = counts.pop()
    micro = plan.global_batch / (plan.n_micro * n_replicas)
    layers = cm.model.layers
    scale = cm.overheads.scale_for(len(set(plan.devices)))  # measured: every core computing at once
    replicas = []
    # a stage's compute per kind of device, summed once: 1,024 replicas of one kind are one sum, not
    # 1,024 (the same floats either way)
    computed: dict[tuple[int, int], tuple[float, float, float]] = {}
    for r in range(n_replicas):
        row = []
        for s, stage in enumerate(plan.stages):
            d = stage.devices[r]
            costs = cm.compute(d)
            if (id(costs), s) not in computed:
                fwd = scale * sum(float(costs.forward[i](micro)) for i in stage.layers)
                bwd = scale * sum(float(costs.backward[i](micro)) for i in stage.backward)
                weight_grad = scale * sum(float(costs.backward[i](micro)) * weight_grad_fraction(cm.model, i, micro)
                                          for i in stage.backward)
                if plan.kind is PlanKind.BIPARTITION and plan.split_layers == "recompute":
                    # the forward of every layer whose backward runs here but forward elsewhere, again
                    bwd += scale * sum(float(costs.forward[i](micro)) for i in worker_roles(plan)[s].recomputed)
                computed[(id(costs), s)] = (fwd, bwd, weight_grad)
            fwd, bwd, weight_grad = computed[(id(costs), s)]
            send_f = send_b = 0.0
            # (none between two stages on one rank: the V's turn)
            if s + 1 < plan.n_stages and plan.stages[s + 1].devices[r] != d:
                # the activation entering the next stage (relayed by an empty range)
                nxt = plan.stages[s + 1].devices[r]
                send_f = cm.cluster.link(d, nxt).transfer_s(_output_bytes(cm, stage.layers.stop - 1, micro))
            if s > 0 and stage.backward.start > 0 and plan.stages[s - 1].devices[r] != d:
                # the gradient of this stage's backward input
                prev = plan.stages[s - 1].devices[r]
                send_b = cm.cluster.link(d, prev).transfer_s(layers[stage.backward.start - 1].output_grad_bytes.at(micro))
            fwd += cm.overheads.action_s
            bwd += cm.overheads.action_s
            acts, weights = _owner_transfers(plan, cm, s, r, micro)
            row.append(StageWork(device=d, forward_s=fwd, backward_s=bwd, send_forward_s=send_f,
                                 send_backward_s=send_b, layers=(stage.layers.start, stage.layers.stop),
                                 backward_layers=(stage.backward.start, stage.backward.stop),
                                 activation_sends=acts, weight_sends=weights, weight_grad_s=weight_grad))
        replicas.append(tuple(row))
    sync = ()
    if plan.grad_sync != "none" and n_replicas > 1:
        sync = tuple(stage_sync(plan, cm, stage, micro, scale) for stage in plan.stages)
    return PipelineWork(schedule=plan.schedule, n_micro=plan.n_micro, replicas=tuple(replicas),
                        grad_sync=plan.grad_sync, sync=sync, n_devices=cm.cluster.n_devices,
                        rendezvous=cm.overheads.rendezvous, virtual_stages=plan.virtual_stages,
                        exchange_s=cm.overheads.exchange_s)


def _hybrid_work(plan: Plan, cm: CostModel) -> PipelineWork:
    """Stages with per-layer strategies run as one group each on the plan's micro-batch; every
    layer is priced by costs/strategy.py. The group is drawn on its first device; on a group of
    devices of several kinds each layer takes its slowest kind's time (its collectives wait for the
    slowest device; issue 52: the prediction must not depend on which node the file lists first)."""
    widths = [len(s.devices) for s in plan.stages]
    if len(set(widths)) > 1:  # a layout's Slice-Gather is defined over one group size (costs/strategy.py)
        raise PlanError(f"stages: stages with per-layer strategies on different numbers of devices "
                        f"({', '.join(map(str, widths))}) are not simulated yet (plain pipeline stages may differ "
                        "in width); give every stage the same number of devices")
    micro = plan.global_batch / plan.n_micro
    layers = cm.model.layers
    scale = cm.overheads.scale_for(len(set(plan.devices)))
    row, sync = [], []
    for s, stage in enumerate(plan.stages):
        lead = stage.devices[0]
        # one device of each kind in the group (a homogeneous group: its first device alone)
        kinds = list({cm.cluster.device(d).name: d for d in reversed(stage.devices)}.values())
        fwd = bwd = weight_grad = 0.0
        # (grad bytes, backward s, its syncs: (bytes, group, ZeRO stage) per group, the dense part's and,
        # for an MoE layer's expert view, the routed experts' over their edp replicas)
        per_layer: list[tuple[float, float, tuple[tuple[float, tuple[int, ...], int], ...]]] = []
        group_link = cm.cluster.slowest_link(stage.devices)
        # Megatron-LM's all-to-all overlap: the share of this rank's passes that run combined
        # (plans/expert_overlap.py); each pass is priced at the average, the warm-up's alone
        combined = steady_share(plan.n_micro, plan.n_ranks, plan.virtual_stages, plan.rank_of_stage[s]) \
            if plan.expert_overlap else 0.0
        for i in stage.layers:
            st = stage.strategy(i)
            problem = expert_problem(layers[i], st)
            if problem:
                raise PlanError(f"stages[{s}]: {problem}")
            links = strategy_links(cm.cluster, st, stage.devices, plan.expert_dispatcher)
            t = max((layer_time_on(cm.compute(d), cm.model, i, st, micro, links, cm.overlap_slowdown, cm.overheads,
                                   scale) for d in kinds), key=lambda x: x.forward_s + x.backward_s)
            hidden = overlap_saving(t.forward_s, t.backward_s, t.dispatch_forward_s, t.dispatch_backward_s,
                                    cm.overlap_slowdown, expert_share(layers[i], micro / st.data_degree)) \
                if combined else (0.0, 0.0)
            fwd += t.forward_s - combined * hidden[0]
            bwd += t.backward_s - combined * hidden[1]
            # zero-bubble's W: the share of the layer's backward (its communication included) that
            # is the weights' gradients (an approximation: TP's all-reduce belongs to I)
            weight_grad += t.backward_s * weight_grad_fraction(cm.model, i, micro / st.data_degree)
            # Slice-Gather from the previous layer's layout: in the stage, or at its start from the
            # previous stage's last layer (runtime/layers/regroup.py regroups what it receives)
            before = stage.strategy(i - 1) if i > stage.layers.start else \
                plan.stages[s - 1].strategy(i - 1) if s > 0 and plan.stages[s - 1].layers.stop == i else st
            if before != st:
                f, b = slice_gather_s(cm.model, i, before, st, micro, group_link)
                fwd += f
                bwd += b
            # the gradients' group: dp, or dp x cp with context parallelism (strategy_groups)
            groups = strategy_groups(st, stage.devices)
            syncs = [(t.grad_allreduce_bytes, groups[DATA], st.zero)] if st.sync_degree > 1 else []
            expert_bytes, replicas = expert_sync(layers[i], st)
            if replicas > 1 and st.zero < 2:  # ZeRO-2's are in the backward (costs/strategy.py: layer_time)
                syncs.append((expert_bytes, groups[EXPERT_DATA], st.zero))
            per_layer.append((sum(b for b, _, _ in syncs), t.backward_s, tuple(syncs)))
        send_f = send_b = 0.0
        if s + 1 < plan.n_stages and plan.stages[s + 1].devices[0] != lead:
            nxt = plan.stages[s + 1].devices[0]
            last = stage.strategy(stage.layers.stop - 1)
            send_f = cm.cluster.link(lead, nxt).transfer_s(  # a cp rank sends its part of the sequence
                layers[stage.layers.stop - 1].output_bytes.at(micro / last.data_degree) / last.cp
                / _send_split(cm, last))
        if s > 0 and plan.stages[s - 1].devices[0] != lead:
            prev = plan.stages[s - 1].devices[0]
            first = stage.strategy(stage.layers.start)
            send_b = cm.cluster.link(lead, prev).transfer_s(
                layers[stage.layers.start - 1].output_grad_bytes.at(micro / first.data_degree) / first.cp
                / _send_split(cm, first))
        # the same runtime overheads as plain stages (one forward and one backward action per micro-batch)
        row.append(StageWork(device=lead, forward_s=fwd + cm.overheads.action_s,
                             backward_s=bwd + cm.overheads.action_s, send_forward_s=send_f, send_backward_s=send_b,
                             layers=(stage.layers.start, stage.layers.stop),
                             backward_layers=(stage.backward.start, stage.backward.stop),
                             weight_grad_s=weight_grad))

        def allreduce(a: int, b: int, per_layer=per_layer) -> float:
            """dp all-reduce of layers a..b-1: one ring per distinct dp group; ZeRO-1 layers
            reduce-scatter instead (their all-gather follows the optimizer step: `zero_gather_s`);
            ZeRO-2 layers have reduce-scattered in their backward (costs/strategy.py: layer_time)."""
            groups: dict[tuple[tuple[int, ...], bool], float] = {}
            for _, _, syncs in per_layer[a:b]:
                for nbytes, group, zero in syncs:
                    groups[group, zero > 0] = groups.get((group, zero > 0), 0.0) + nbytes
            return sum((ring_reducescatter_s if zero else allreduce_s)(nbytes, len(g), cm.cluster.slowest_link(g))
                       for (g, zero), nbytes in groups.items())

        sync.append(StageSync(devices=stage.devices, buckets=buckets(
            plan.grad_sync, [x[0] for x in per_layer], [x[1] for x in per_layer], allreduce)))
    return PipelineWork(schedule=plan.schedule, n_micro=plan.n_micro, replicas=(tuple(row),), grad_sync=plan.grad_sync,
                        sync=tuple(sync) if plan.grad_sync != "none" else (), n_devices=cm.cluster.n_devices,
                        rendezvous=cm.overheads.rendezvous, virtual_stages=plan.virtual_stages,
                        exchange_s=cm.overheads.exchange_s)


def zero_gather_s(plan: Plan, cm: CostModel) -> float:
    """ZeRO-1/2 (ZeRO §5.1-5.2): after the optimizer step each rank of the dp x cp group has updated
    its share of the parameters, and an all-gather over the group gives every rank all of them; the
    slowest stage's gather, after the schedule (the reduce-scatter that replaced the all-reduce is
    in the schedule's sync). 0 without ZeRO-1/2."""
    worst = 0.0
    for stage in plan.stages:
        if not stage.strategies:
            continue
        groups: dict[tuple[int, ...], float] = {}
        for i in stage.layers:
            st = stage.strategy(i)
            if st.zero and st.sync_degree > 1:  # ZeRO's group: dp x cp (costs/strategy.py)
                layer, by_axis = cm.model.layers[i], strategy_groups(st, stage.devices)
                group = by_axis[DATA]
                # an FP8 parameter all-gather (LayerSpec.gathered_element_bytes) moves 1 byte of every 4
                fp8 = layer.gathered_element_bytes / cm.model.dtype_bytes if layer.gathered_element_bytes else 1.0
                groups[group] = groups.get(group, 0.0) + fp8 * dense_param_bytes(layer, st) / (st.tp * st.fsdp_degree)
                expert_bytes = routed_bytes(layer, st)  # an MoE layer's routed experts: over their replicas
                if expert_bytes and len(by_axis[EXPERT_DATA]) > 1:
                    groups[by_axis[EXPERT_DATA]] = groups.get(by_axis[EXPERT_DATA], 0.0) + expert_bytes / (st.ep * st.etp)
        worst = max(worst, sum(ring_allgather_s(nbytes, len(g), cm.cluster.slowest_link(g)) for g, nbytes in groups.items()))
    return worst
