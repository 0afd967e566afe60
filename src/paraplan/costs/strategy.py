"""One layer's time and memory under a `LayerStrategy` (dp / sdp / tp degrees, checkpointing).

The one place that prices a layer's strategy: the simulator's stages (simulator/plan_work.py), the
memory model (costs/memory.py) and the planners' memory checks (Bi-Partition) all call it, so they
cannot disagree; Galvatron-BMW's dynamic program will read the same numbers as `[layer, strategy]`
arrays (`strategy_arrays`).

Time (Galvatron-BMW §V, on one device of the group, at the stage's micro-batch size b); each
axis's collectives are one function of costs/axis_costs.py, added here in one order:
  compute      forward(b / (dp x sdp)) / tp and backward(...) / tp (Megatron splits a layer's
               matrix products tp ways);
  tp           two all-reduces of the layer's activations per pass (Megatron: one after the
               attention, one after the MLP), ring over the tp group; with sequence parallelism
               each becomes a reduce-scatter and an all-gather of the same tensor, the same time on
               a ring (Korthikanti et al. 2022 §4.2.2), so it is priced the same;
  sdp          ZeRO-3 / FSDP: an all-gather of the layer's parameter shard before each pass and a
               reduce-scatter of its gradients after the backward, over the data group;
  checkpoint   the forward runs again inside the backward;
  dp           the gradient all-reduce is the stage's sync, issued by the schedule, not in the
               layer's time (`grad_allreduce_bytes`); ZeRO-1/2's reduce-scatter and all-gather move
               the same volume on a ring (ZeRO §7.2.1), the same time here.
Memory per device:
  states       params x state_bytes_per_param / (tp x sdp)  (fp32 Adam: 16 bytes per parameter; FSDP's
               cp ranks shard too: `LayerStrategy.fsdp_degree`); ZeRO-1 / ZeRO-2 keep 1/(dp x cp) of
               the optimizer states / and of the gradients (`state_parts_per_param`);
  weights      params x param_bytes_per_param / (tp x sdp)  (a weight copy: stash, or Bi-Partition's
               forward-only owner, which keeps only the latest weights);
  saved        what one micro-batch in flight keeps for the backward: the layer's saved tensors at the
               local batch, / tp; a checkpointed layer keeps only its input;
  recompute    a checkpointed layer's full saved set, alive while it recomputes (one at a time).
Layout (`LayerStrategy.order`, inner-most dimension first): the inner-most dimension's groups are
consecutive devices of the stage, the next dimension strides over them, and so on
(`strategy_groups`); each collective is priced on the slowest link of its own group, so a group
that fits in a node runs on the intra-node link and one that spans nodes on the network
(`strategy_links`). Overlap (§V): with `overlap_slowdown` given, a layer's SDP collectives overlap
its backward compute and slow both down (`overlapped_s`); without it they run one after the other.
Slice-Gather (§VI): between neighbouring layers with different data splits, each device fetches
the part of the activation (forward) or of its gradient (backward) it lacks (costs/slice_gather.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.costs.alike import first_alike
from paraplan.costs.axis_costs import (
    attention_flops,
    context_overlapped,
    context_ring_s,
    gradient_sync_bytes,
    overlapped_s,
    sharded_data_s,
    tensor_s,
    zero2_reduce_scatter_s,
)
from paraplan.costs.collectives import allreduce_s, ring_allgather_s, ring_reducescatter_s
from paraplan.costs.deepep import node_limited_link
from paraplan.costs.expert_costs import (
    all_to_all_link,
    dense_param_bytes,
    dispatch_s,
    expert_degrees,
    expert_fsdp_s,
    expert_groups,
    expert_sync,
    held_params,
    imbalance_s,
    routed_bytes,
    routed_params,
    routed_state_bytes,
    sharded_params,
)
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.timefn import LayerCosts
from paraplan.hardware.cluster import Cluster, LinkSpec, RuntimeOverheads
from paraplan.models.spec import ModelSpec
from paraplan.plans.axes import (
    CONTEXT,
    DATA,
    EXPERT,
    EXPERT_AXES,
    EXPERT_DATA,
    LAYER_AXES,
    SHARDED_DATA,
    TENSOR,
    Axis,
    gradient_sync_axes,
)
from paraplan.plans.plan import LayerStrategy

_SYNC_AXES = gradient_sync_axes()
_NO_LINK = LinkSpec(bandwidth_bytes_per_s=float("inf"), latency_s=0.0)


@dataclass(frozen=True)
class LayerTime:
    forward_s: float
    backward_s: float  # with recomputation, tp all-reduces and sdp collectives
    grad_allreduce_bytes: float  # the dp all-reduce this layer adds to its stage's sync (0 without dp)
    # an MoE layer's dispatch and combine all-to-alls inside forward_s and backward_s (costs/expert_costs.py),
    # which Megatron-LM's all-to-all overlap hides (plans/expert_overlap.py, simulator/plan_work.py)
    dispatch_forward_s: float = 0.0
    dispatch_backward_s: float = 0.0


@dataclass(frozen=True)
class LayerMemory:
    states_bytes: float  # param_bytes + grad_bytes + optimizer_bytes
    weights_bytes: float
    saved_bytes: float  # per micro-batch in flight
    recompute_bytes: float
    param_bytes: float = 0.0  # the parameters as held (fp32: the master weights in mixed precision)
    grad_bytes: float = 0.0
    optimizer_bytes: float = 0.0
    # mixed precision: autocast's 16-bit copy of the weights, on a device that runs the layer forward
    # (0 under sdp: FSDP's gathered weights are already 16-bit, costs/memory.py: sdp_buffer_bytes)
    copy_bytes: float = 0.0


def param_count(model: ModelSpec, index: int, tied_copy: bool) -> float:
    """Parameters a holder of layer `index` keeps; a tied weight owned by a layer elsewhere is a
    second copy on this holder (GPT-2's head) when `tied_copy`."""
    layer = model.layers[index]
    extra = layer.shared_param_bytes if tied_copy else 0
    return (layer.param_bytes + extra) / model.dtype_bytes


def state_parts_per_param(strategy: LayerStrategy, config: MemoryConfig) -> tuple[float, float, float]:
    """Model-state bytes per parameter on one device of the group, before the tp x sdp split, as
    (parameters, gradients, optimizer states): ZeRO §3.1 over the layer's gradient-sync group
    (Rajbhandari et al. 2020): ZeRO-1 keeps 1/n of the optimizer states, ZeRO-2 1/n of the gradients
    too (the parameters stay whole: ZeRO-3 is sdp). n is dp x cp, whose ranks hold the same weights:
    Megatron-LM's distributed optimizer shards over that group (`get_data_parallel_group(
    with_context_parallel=True)`). Optimizer states = state - param - grad bytes per parameter (8
    for Adam's moments; fp32 master weights are the parameters here, costs/memory_config.py)."""
    param, grad = config.param_bytes_per_param, config.grad_bytes_per_param
    optimizer = config.state_bytes_per_param - param - grad
    n = strategy.sync_degree
    return param, grad / n if strategy.zero >= 2 else grad, optimizer / n if strategy.zero >= 1 else optimizer


def layer_memory(model: ModelSpec, index: int, strategy: LayerStrategy, micro_batch: float,
                 config: MemoryConfig, tied_copy: bool = False) -> LayerMemory:
    """Memory of layer `index` on one device of its group; `micro_batch` is the batch entering the group."""
    layer = model.layers[index]
    params = param_count(model, index, tied_copy)
    shards = strategy.tp * strategy.fsdp_degree
    local = micro_batch / strategy.data_degree
    param_b, grad_b, optimizer_b = state_parts_per_param(strategy, config)
    # a mixture-of-experts layer's routed experts on their own view (costs/expert_costs.py): their
    # states apart, the dense part as before
    routed = routed_params(layer, strategy)
    routed_states = routed_state_bytes(layer, strategy, config.param_bytes_per_param, config.grad_bytes_per_param,
                                       config.state_bytes_per_param - config.param_bytes_per_param
                                       - config.grad_bytes_per_param)
    dense = params - routed
    states = dense * (param_b + grad_b + optimizer_b) / shards + sum(routed_states)
    split = strategy.tp * strategy.cp  # context parallelism keeps 1/cp of the sequence's tensors
    saved = layer.saved_bytes.at(local) * config.activation_scale / split
    recompute = 0.0
    if strategy.checkpoint:
        previous = model.layers[index - 1].output_bytes if index > 0 else model.input_bytes
        saved, recompute = previous.at(local) * config.activation_scale / split, saved
    elif strategy.recompute == "selective":
        # Korthikanti et al. 2022 §5: the attention core's tensors are not kept; they exist again,
        # for one layer at a time, while its backward recomputes them
        core = layer.attention_core_bytes.at(local) * config.activation_scale / split
        saved, recompute = saved - core, core
    return LayerMemory(states_bytes=states, param_bytes=dense * param_b / shards + routed_states[0],
                       grad_bytes=dense * grad_b / shards + routed_states[1],
                       optimizer_bytes=dense * optimizer_b / shards + routed_states[2],
                       weights_bytes=sharded_params(layer, params, strategy) * config.param_bytes_per_param,
                       saved_bytes=saved, recompute_bytes=recompute,
                       copy_bytes=(held_params(layer, params, strategy) * config.compute_copy_bytes_per_param
                                   if strategy.sdp == 1 else 0.0)
                       + (held_params(layer, params, strategy) * config.fp8_weight_bytes_per_param
                          if layer.kind == "block" else 0.0))


def _split_compute(fn, local: float, tp: int, cp: int, strategy: LayerStrategy) -> float:
    """A pass's compute on one rank: split over tp x cp, except the kernels every tensor-parallel rank
    runs whole without sequence parallelism (norms, residual adds: an engine profile names them,
    costs/op_roofline.py OperatorTime.replicated_s), which split over cp only."""
    whole = float(fn(local))
    replicated = fn.replicated_s(local) if tp > 1 and not strategy.sequence_parallel and hasattr(fn, "replicated_s") \
        else 0.0
    return (whole - replicated) / (tp * cp) + replicated / cp


def layer_time(costs: LayerCosts, model: ModelSpec, index: int, strategy: LayerStrategy, micro_batch: float,
               tp_link: LinkSpec, data_link: LinkSpec, overlap_slowdown: float | None = None,
               runtime: RuntimeOverheads | None = None, compute_scale: float = 1.0,
               dp_link: LinkSpec | None = None, cp_link: LinkSpec | None = None,
               expert_links: dict[Axis, LinkSpec] | None = None) -> LayerTime:
    """Time of layer `index` on one device of its group (Galvatron-BMW §V). `data_link` prices the
    SDP collectives (the link of the sdp group); with `overlap_slowdown` the backward's SDP
    collectives overlap its compute (`overlapped_s`), else they add up. `runtime`: the measured
    per-layer costs of the TP / SDP machinery (not in the paper: `paraplan calibrate`);
    `compute_scale` multiplies compute (RuntimeOverheads.scale_for). `dp_link`: the dp group's
    link, for ZeRO-2's reduce-scatter after every micro-batch's backward. `expert_links`: the expert
    view's links (axes.EXPERT_AXES: the all-to-all's effective link, etp's, edp's), for an MoE layer."""
    layer = model.layers[index]
    local = micro_batch / strategy.data_degree
    tp, sdp, cp = strategy.tp, strategy.sdp, strategy.cp
    # context parallelism: each cp rank computes 1/cp of the sequence's tokens (Megatron's load-
    # balanced split of a causal attention's work; attention's s^2 part splits the same way)
    forward = forward_compute = compute_scale * _split_compute(costs.forward[index], local, tp, cp, strategy)
    backward = backward_compute = compute_scale * _split_compute(costs.backward[index], local, tp, cp, strategy)
    if runtime is not None and tp > 1:  # measured by paraplan calibrate (RuntimeOverheads.tp_kernel_s)
        forward += runtime.tp_kernel_s * max(1, layer.forward_ops)
        backward += runtime.tp_kernel_s * max(1, layer.backward_ops)
    tp_forward, tp_backward = tensor_s(layer, local, strategy, tp_link, model.compute_dtype_bytes)  # each term is 0 without its axis
    forward += tp_forward
    backward += tp_backward
    dispatch_forward = dispatch_backward = 0.0
    if layer.experts is not None:  # the expert view (costs/expert_costs.py): dispatch, combine, imbalance
        dispatch_forward, dispatch_backward = dispatch_s(layer, local, strategy, expert_links or {},
                                                         model.compute_dtype_bytes)
        forward += dispatch_forward + imbalance_s(layer, local, strategy, forward_compute)
        backward += dispatch_backward + imbalance_s(layer, local, strategy, backward_compute)
    ring, hop = context_ring_s(layer, local, strategy, cp_link)
    if ring:
        forward, backward = context_overlapped((forward_compute, backward_compute), forward, backward, ring, hop,
                                             attention_flops(layer, local) / max(layer.forward_flops.at(local), 1.0),
                                             cp, overlap_slowdown)
    recompute = forward  # with tp, the recomputation repeats the forward's all-reduces (§III-A)
    if strategy.recompute == "selective":
        # only the attention core runs again (no communication: it is local to each tp rank), at
        # the layer's measured compute rate: its share of the layer's forward FLOPs
        core = getattr(costs.forward[index], "selective_s", lambda _: None)(local)
        if core is not None:  # what the engine's selective recomputation runs again, kernel by kernel
            recompute = compute_scale * core / (tp * cp)
        else:
            flops = layer.forward_flops.at(local)
            recompute = (forward_compute * layer.attention_core_flops.at(local) / flops) if flops > 0 else 0.0
    if sdp > 1:  # ZeRO-3: gather the weights for each pass, scatter the gradients after the backward
        gather, comm = sharded_data_s(model, layer, strategy, data_link)
        expert_gather, expert_comm = expert_fsdp_s(model, layer, strategy, (expert_links or {}).get(EXPERT_DATA))
        gather, comm = gather + expert_gather, comm + expert_comm
        if costs.fsdp_prefetch:  # FSDP2 gathers the next layer's weights while this one computes
            forward = overlapped_s(forward, gather, overlap_slowdown or 1.0)
            backward = overlapped_s(backward, comm, overlap_slowdown or 1.0)
            comm = 0.0
        else:
            forward += gather
        backward = backward + comm if overlap_slowdown is None else overlapped_s(backward, comm, overlap_slowdown)
    dp_sync_bytes = gradient_sync_bytes(layer, strategy)  # over sync_degree's group (strategy_groups' DATA)
    if strategy.zero >= 2 and strategy.sync_degree > 1:
        # ZeRO-2: reduce-scattered in every backward, over dp x cp (`state_parts_per_param`); the
        # end-of-step all-gather is simulator/plan_work.zero_gather_s
        comm = zero2_reduce_scatter_s(dp_sync_bytes, strategy, dp_link or data_link)
        backward = backward + comm if overlap_slowdown is None else overlapped_s(backward, comm, overlap_slowdown)
        dp_sync_bytes = 0.0
    expert_bytes, expert_replicas = expert_sync(layer, strategy)
    if strategy.zero >= 2 and expert_replicas > 1:  # the routed experts' part, over their own replicas
        comm = ring_reducescatter_s(expert_bytes, expert_replicas, (expert_links or {})[EXPERT_DATA])
        backward = backward + comm if overlap_slowdown is None else overlapped_s(backward, comm, overlap_slowdown)
    if strategy.recompute != "none":
        backward += recompute
    if runtime is not None and sdp > 1:  # FSDP2's machinery per unit and pass, on the CPU: not overlapped
        forward += runtime.sdp_layer_s
        backward += runtime.sdp_layer_s
    return LayerTime(forward_s=forward, backward_s=backward, grad_allreduce_bytes=dp_sync_bytes,
                     dispatch_forward_s=dispatch_forward, dispatch_backward_s=dispatch_backward)


def dp_sync_s(strategy: LayerStrategy, sync_bytes: float, dp_link: LinkSpec) -> float:
    """The dp gradient sync of a layer after its last backward (it may overlap that backward): the
    all-reduce of its gradients, a reduce-scatter with ZeRO-1; nothing with ZeRO-2, whose
    reduce-scatters are in every backward (`layer_time`)."""
    if strategy.sync_degree <= 1 or not sync_bytes:
        return 0.0
    return (ring_reducescatter_s if strategy.zero else allreduce_s)(sync_bytes, strategy.sync_degree,
                                                                           dp_link)


def expert_sync_s(model: ModelSpec, index: int, strategy: LayerStrategy, link: LinkSpec | None) -> float:
    """The routed experts' gradient sync over their edp replicas (costs/expert_costs.py: expert_sync),
    as `dp_sync_s` prices the dense part's: an all-reduce, a reduce-scatter with ZeRO-1; 0 without."""
    nbytes, replicas = expert_sync(model.layers[index], strategy)
    if replicas <= 1 or strategy.zero >= 2:  # ZeRO-2's reduce-scatters are in the backward (not modelled apart)
        return 0.0
    return (ring_reducescatter_s if strategy.zero else allreduce_s)(nbytes, replicas, link)


def zero_gather_layer_s(model: ModelSpec, index: int, strategy: LayerStrategy, dp_link: LinkSpec,
                        expert_link: LinkSpec | None = None) -> float:
    """ZeRO-1/2: the all-gather of the layer's updated parameters after the optimizer step, which
    nothing overlaps (simulator/plan_work.py: zero_gather_s); 0 otherwise."""
    if strategy.sync_degree <= 1 or not strategy.zero:
        return 0.0
    layer = model.layers[index]
    # over the group ZeRO shards over: dp x cp (`state_parts_per_param`)
    dense = ring_allgather_s(dense_param_bytes(layer, strategy) / (strategy.tp * strategy.fsdp_degree), strategy.sync_degree,
                             dp_link)
    nbytes = routed_bytes(layer, strategy)
    if not nbytes:
        return dense
    d = expert_degrees(strategy)  # the routed experts' own replicas, on their group's link
    return dense + ring_allgather_s(nbytes / (d.ep * d.etp), d.edp, (expert_link or dp_link))


def strategy_groups(strategy: LayerStrategy, devices: tuple[int, ...]) -> dict[Axis, tuple[int, ...]]:
    """The group of each layer axis (plans/axes.py: LAYER_AXES) that holds the stage's first device,
    laid out by `strategy.dims` (inner-most first: its groups are consecutive devices). DATA's entry
    is the group the gradients are summed over, dp x cp (as Megatron-LM all-reduces over both); with
    sdp the cp ranks join FSDP's group instead (LayerStrategy.fsdp_degree): SHARDED_DATA sdp x cp."""
    out = {a: (devices[0],) for a in LAYER_AXES}
    stride, strides = 1, {}
    for axis, k in strategy.dims:
        out[axis] = tuple(devices[j * stride] for j in range(k))
        strides[axis] = (stride, k)
        stride *= k

    def union(axes) -> tuple[int, ...]:  # later axes outer
        positions = [0]
        for s_axis, k_axis in (strides[a] for a in axes if a in strides):
            positions = [p + j * s_axis for j in range(k_axis) for p in positions]
        return tuple(devices[p] for p in positions)

    if strategy.sdp > 1 and CONTEXT in strides:
        out[SHARDED_DATA] = union((CONTEXT, SHARDED_DATA))
    else:
        syncing = [a for a in _SYNC_AXES if a in strides]
        if len(syncing) > 1 or (syncing and DATA not in strides):
            out[DATA] = union(syncing)  # each later axis of LAYER_AXES outer: dp-major, cp-minor
    out.update(expert_groups(strategy, devices))  # an MoE layer's expert view, where it has one
    return out


def strategy_links(cluster: Cluster, strategy: LayerStrategy, devices: tuple[int, ...],
                   dispatcher: str = "alltoall") -> dict[Axis, LinkSpec]:
    """The bottleneck link of each axis's group (`strategy_groups`): the intra-node link when the
    group fits in a node, the network when it spans nodes. `dispatcher` (a plan's expert_dispatcher):
    with "deepep" the EP group's link carries its node structure (costs/deepep.py)."""
    # the all-to-all's link: its peers inside the node and across nodes at once (costs/expert_costs.py)
    groups = strategy_groups(strategy, devices)
    links = {axis: (all_to_all_link if axis is EXPERT else Cluster.slowest_link)(cluster, group)
             if len(group) > 1 else _NO_LINK for axis, group in groups.items()}
    if dispatcher == "deepep" and len(groups.get(EXPERT, ())) > 1:
        links[EXPERT] = node_limited_link(cluster, groups[EXPERT], links[EXPERT])
    return links


def layer_time_on(costs: LayerCosts, model: ModelSpec, index: int, strategy: LayerStrategy, micro_batch: float,
                  links: dict[Axis, LinkSpec], overlap_slowdown: float | None = None,
                  runtime: RuntimeOverheads | None = None, compute_scale: float = 1.0) -> LayerTime:
    """`layer_time` with each axis's collectives on its group's link (`strategy_links`)."""
    return layer_time(costs, model, index, strategy, micro_batch, links[TENSOR], links[SHARDED_DATA], overlap_slowdown,
                      runtime, compute_scale, dp_link=links[DATA], cp_link=links[CONTEXT],
                      expert_links={a: links[a] for a in EXPERT_AXES if a in links})


def strategy_arrays(costs: LayerCosts, model: ModelSpec, strategies: tuple[LayerStrategy, ...], micro_batch: float,
                    cluster: Cluster, devices: tuple[int, ...], config: MemoryConfig,
                    overlap_slowdown: float | None = None, layers: range | None = None,
                    runtime: RuntimeOverheads | None = None, compute_scale: float = 1.0) -> dict[str, np.ndarray]:
    """Every layer (of `layers`, default all) under every strategy on the group `devices`: arrays of
    shape [layer, strategy] for a dynamic program (Galvatron-BMW's): forward_s, backward_s,
    grad_allreduce_s (the dp all-reduce of the layer's gradients on its dp group's link; ZeRO:
    `dp_sync_s`), after_step_s (ZeRO-1/2's parameter all-gather after the step), states_bytes, saved_bytes, recompute_bytes, copy_bytes."""
    layers = range(model.n_layers) if layers is None else layers
    n, s = len(layers), len(strategies)
    out = {key: np.zeros((n, s)) for key in ("forward_s", "backward_s", "grad_allreduce_s", "after_step_s",
                                              "states_bytes", "saved_bytes", "recompute_bytes", "copy_bytes")}
    first = first_alike(costs, model, layers)
    for j, st in enumerate(strategies):
        links = strategy_links(cluster, st, devices)
        for row, i in enumerate(layers):
            if first[row] != row:  # a layer like an earlier one (an LLM's blocks): its row copied below
                continue
            t = layer_time_on(costs, model, i, st, micro_batch, links, overlap_slowdown, runtime, compute_scale)
            m = layer_memory(model, i, st, micro_batch, config)
            out["forward_s"][row, j], out["backward_s"][row, j] = t.forward_s, t.backward_s
            out["grad_allreduce_s"][row, j] = dp_sync_s(st, t.grad_allreduce_bytes, links[DATA]) \
                + expert_sync_s(model, i, st, links.get(EXPERT_DATA))
            out["after_step_s"][row, j] = zero_gather_layer_s(model, i, st, links[DATA], links.get(EXPERT_DATA))
            out["states_bytes"][row, j], out["saved_bytes"][row, j] = m.states_bytes, m.saved_bytes
            out["recompute_bytes"][row, j] = m.recompute_bytes
            out["copy_bytes"][row, j] = m.copy_bytes
    rows = np.asarray(first)
    return {key: values[rows] for key, values in out.items()}


def weight_grad_fraction(model: ModelSpec, index: int, micro_batch: float) -> float:
    """The share of layer `index`'s backward that computes its weights' gradients (zero-bubble's W;
    the rest, I, computes the gradient of its input). A matmul's backward is two matmuls of its
    forward's size, one per gradient, so W ~ the forward FLOPs of the layer's weighted matmuls, and
    a transformer layer's W is about half its backward (Qi et al. 2024 §2: T_W ~ T_F, T_B ~ 2 T_F).
    The attention core has no weights: its FLOPs (counted apart where it is materialised) go to I;
    a fused attention kernel's are not counted apart and go to W here, an overestimate of W by
    attention's share (s / 6h of a GPT layer's FLOPs: 1.4% at h 4096 and s 2048)."""
    layer = model.layers[index]
    backward = layer.backward_flops.at(micro_batch)
    if backward <= 0:
        return 0.0
    weighted = layer.forward_flops.at(micro_batch) - layer.attention_core_flops.at(micro_batch)
    return min(0.5, max(0.0, weighted / backward))
