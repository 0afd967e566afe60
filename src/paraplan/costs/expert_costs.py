"""The expert view of a layer's devices (issue 50 item 2): what expert parallelism costs on one
device of a mixture-of-experts layer's group, in time and memory.

Megatron-core's "parallel folding" (Liu et al. 2025, arXiv:2504.14960; megatron-core 0.16.1's
`--expert-tensor-parallel-size`): the devices of a layer's group are laid out twice. The dense view
(attention, norms, the shared experts and the router) is the strategy's tp x cp x sdp x dp; the
expert view of the same devices is etp x ep x edp, inner-most first: etp ranks split every expert's
matrices (Megatron's expert tensor parallelism), ep ranks hold E / ep of the routed experts each,
and the edp = devices / (ep x etp) replicas of that sharding sum the experts' gradients (with sdp,
FSDP shards the experts' states over them, as torchtitan's `efsdp` does). A layer with ep = etp = 1
has no expert view: its experts follow the dense view, split tp ways like its other weights
(Megatron's default, expert-tensor-parallel size = tp) and replicated over the data axes.

Time, per micro-batch on one device (T: the tokens a device holds after attention, b x s / (tp x
cp), as Megatron's MoE layer requires sequence parallelism with tp; k: top-k; h: the token's width):
  dispatch     the routed copies of its T tokens sent to the ep ranks holding their experts and the
               results combined back: two all-to-alls per pass (dispatch and combine in the forward,
               their gradients in the backward), each moving T k h bytes of which (ep - 1) / ep leave
               the device (issue 50: `T k h bytes (1 - 1/EP)` per rank per direction), on the links
               they really cross (`all_to_all_link`: the node's own link for peers inside it, the
               network for the others, both at once);
  etp          the tokens each expert gets, all-gathered over the etp ranks before the experts and
               reduce-scattered after them (Megatron's alltoall dispatcher with ETP), each pass;
  imbalance    the busiest ep rank runs `imbalance` x the average expert work (LayerExperts.imbalance:
               1 for forced balance, as published benchmark tables force it); the other ranks wait.
               Balanced, the expert FLOPs per device are the dense pricing's: ep x etp devices share
               the same tokens' top-k experts.
Memory per device: routed experts' states / (ep x etp), and / edp where sdp, ZeRO-1 (optimizer
states) or ZeRO-2 (gradients too) shard them (NVIDIA/Megatron-LM PR #4687's corrected estimator:
3 h f E / (EP x ETP) routed parameters per GPU at 6 + 12 / EDP bytes each under the distributed
optimizer); the dense part as the dense view prices it. The routed tokens' activations are the
layer's measured saved tensors (measured with every token routed through top-k experts:
models/moe_static.py).

A capacity factor (the model reference's `capacity_factor`, models/moe_capacity.py) caps the busiest
rank's expert work at factor x the average (`imbalance_s`); without one, dropless: every routed copy
runs. The all-to-alls still carry every copy (Megatron's dispatcher drops before sending; priced as
an upper bound).

Megatron-LM's all-to-all overlap (a plan choice, plans/expert_overlap.py): in 1F1B's steady state a
layer's forward of one micro-batch and its backward of another run as one combined pass, each
one's all-to-alls under the other's compute (costs/axis_costs.py `overlap_saving`; simulator/plan_work.py
applies it to the steady state's share of the passes). Without it the all-to-alls add to the layer's time.

With DeepEP's dispatcher (a plan's `expert_dispatcher`, plans/expert_dispatch.py) a token crosses
to each other node holding its experts once, the group-limited routing capping how many, and moves
inside the node over NVLink (costs/deepep.py); the EP group's link then carries its node structure.

Not modelled (said where the prediction is used): the
grouped GEMM kernel's own efficiency beyond tile and wave quantisation (balanced, an expert gets
T k ep / E tokens a micro-batch, 8,192 at Qwen3-30B-A3B's published layout, where the quantisation of
costs/op_roofline.py changes the experts' GEMM time by under 3%), and the SMs a combined pass leaves
to communication beyond the overlap slowdown every overlap here pays.

DualPipeV's overlapped forward-backward pairs are priced one after the other, all-to-alls in line:
that is how the engine paraplan exports them to runs them. torch 2.13's ScheduleDualPipeV emits
OVERLAP_F_B actions whose sub-actions `_PipelineScheduleRuntime` performs in sequence unless a
custom function is registered for them (schedules.py: register_custom_function), and torchtitan
0.3.0's trainer registers none (only its graph_trainer experiment does).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from paraplan.costs.collectives import ring_allgather_s, ring_reducescatter_s
from paraplan.costs.deepep import NodeLimitedLink, node_limited_all_to_all_s
from paraplan.hardware.cluster import Cluster, LinkSpec
from paraplan.models.spec import LayerSpec, ModelSpec
from paraplan.plans.axes import EXPERT, EXPERT_DATA, EXPERT_TENSOR, Axis
from paraplan.plans.layer_strategy import LayerStrategy


def has_expert_view(strategy: LayerStrategy) -> bool:
    """Whether the strategy lays the experts out on their own axes (ep or etp above 1)."""
    return strategy.ep * strategy.etp > 1


@dataclass(frozen=True)
class ExpertDegrees:
    ep: int
    etp: int
    edp: int  # the group's devices / (ep x etp): replicas of one expert sharding
    state_shards: int  # how many ways those replicas shard the experts' parameters (edp under sdp, else 1)


def expert_degrees(strategy: LayerStrategy) -> ExpertDegrees:
    edp = strategy.degree // (strategy.ep * strategy.etp)
    return ExpertDegrees(strategy.ep, strategy.etp, edp, edp if strategy.sdp > 1 else 1)


def routed_params(layer: LayerSpec, strategy: LayerStrategy) -> float:
    """The layer's routed-expert parameters that the expert view lays out (0 without experts or
    without an expert view: the dense view then holds them)."""
    return float(layer.experts.routed_params) if layer.experts is not None and has_expert_view(strategy) else 0.0


def routed_bytes(layer: LayerSpec, strategy: LayerStrategy) -> float:
    """`routed_params` in the layer's stored bytes (its parameters' dtype)."""
    params = routed_params(layer, strategy)
    return params * layer.param_bytes / layer.param_count if params else 0.0


def dense_param_bytes(layer: LayerSpec, strategy: LayerStrategy) -> float:
    """The layer's parameter bytes the dense view lays out: all of them, less the routed experts
    when the expert view holds those."""
    return layer.param_bytes - routed_bytes(layer, strategy)


def held_params(layer: LayerSpec, params: float, strategy: LayerStrategy) -> float:
    """Of a layer's `params` (its own and any tied copy), what one device holds before any data axis
    shards them: the dense part / tp, the routed experts / (ep x etp)."""
    routed = routed_params(layer, strategy)
    return (params - routed) / strategy.tp + routed / (strategy.ep * strategy.etp)


def sharded_params(layer: LayerSpec, params: float, strategy: LayerStrategy) -> float:
    """What one device keeps of `params` after sdp (FSDP) shards them: the dense part over tp x sdp
    (x cp: LayerStrategy.fsdp_degree),
    the routed experts over ep x etp and their own state shards."""
    routed = routed_params(layer, strategy)
    if not routed:
        return params / (strategy.tp * strategy.fsdp_degree)
    d = expert_degrees(strategy)
    return (params - routed) / (strategy.tp * strategy.fsdp_degree) + routed / (d.ep * d.etp * d.state_shards)


def stepped_params(layer: LayerSpec, params: float, strategy: LayerStrategy) -> float:
    """Of `params`, what one device's optimizer steps: the dense part over tp x sdp and, with ZeRO,
    the dp x cp ranks; the routed experts over ep x etp and, with sdp or ZeRO, their edp replicas."""
    routed = routed_params(layer, strategy)
    dense = (params - routed) / (strategy.tp * strategy.fsdp_degree * (strategy.sync_degree if strategy.zero else 1))
    if not routed:
        return dense
    d = expert_degrees(strategy)
    return dense + routed / (d.ep * d.etp * (d.edp if strategy.sdp > 1 or strategy.zero else 1))


def routed_state_bytes(layer: LayerSpec, strategy: LayerStrategy, param_b: float, grad_b: float,
                       optimizer_b: float) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer) bytes of the routed experts on one device, from the bytes per
    parameter before any ZeRO split: / (ep x etp); over the edp replicas, all three with sdp, the
    optimizer states with ZeRO-1, the gradients too with ZeRO-2 (Megatron's distributed optimizer
    over EDP: 6 + 12 / EDP bytes in bf16, PR #4687)."""
    routed = routed_params(layer, strategy)
    if not routed:
        return 0.0, 0.0, 0.0
    d = expert_degrees(strategy)
    sdp, zero = strategy.sdp > 1, strategy.zero
    per = routed / (d.ep * d.etp)
    return (per * param_b / (d.edp if sdp else 1), per * grad_b / (d.edp if sdp or zero >= 2 else 1),
            per * optimizer_b / (d.edp if sdp or zero >= 1 else 1))


def routed_copies(layer: LayerSpec, local: float, strategy: LayerStrategy) -> float:
    """T x k: the routed copies of the tokens one device holds (T = local samples x sequence / (tp x
    cp): sequence parallelism splits them over tp)."""
    ex = layer.experts
    return local * ex.tokens_per_sample / (strategy.tp * strategy.cp) * ex.top_k


def all_to_all_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """One all-to-all of `nbytes` per device over `n` devices: (n - 1) / n of them leave, sent to
    every peer at once (one latency) at `link`'s effective bandwidth (`all_to_all_link`)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / link.bandwidth_bytes_per_s + link.latency_s


def dispatch_s(layer: LayerSpec, local: float, strategy: LayerStrategy, links: dict[Axis, LinkSpec],
               element_bytes: int) -> tuple[float, float]:
    """(forward s, backward s) of the layer's token dispatch and combine (module docstring): two
    all-to-alls over ep and, with etp, an all-gather and a reduce-scatter over etp, per pass;
    (0, 0) without experts or an expert view."""
    if layer.experts is None or not has_expert_view(strategy):
        return 0.0, 0.0
    copies = routed_copies(layer, local, strategy)
    volume = copies * layer.experts.hidden * element_bytes
    d = expert_degrees(strategy)
    link = links[EXPERT]
    if isinstance(link, NodeLimitedLink) and link.nodes > 1:  # DeepEP's dispatcher (costs/deepep.py)
        per_pass = 2 * node_limited_all_to_all_s(copies / layer.experts.top_k, layer.experts, element_bytes, link)
    else:
        per_pass = 2 * all_to_all_s(volume, d.ep, link)
    if d.etp > 1:
        per_pass += (ring_allgather_s(volume * d.etp, d.etp, links[EXPERT_TENSOR])
                     + ring_reducescatter_s(volume * d.etp, d.etp, links[EXPERT_TENSOR]))
    return per_pass, per_pass


def expert_share(layer: LayerSpec, local: float) -> float:
    """The routed experts' share of the layer's forward FLOPs (what imbalance slows)."""
    flops = layer.forward_flops.at(local)
    if layer.experts is None or flops <= 0:
        return 0.0
    return min(1.0, layer.experts.routed_flops_per_token * layer.experts.tokens_per_sample * local / flops)


def imbalance_s(layer: LayerSpec, local: float, strategy: LayerStrategy, compute_s: float) -> float:
    """What the busiest ep rank adds to a pass of `compute_s`: its expert work is `imbalance` x the
    average (with one ep rank, 1: every device runs all the experts on its own tokens). A capacity
    factor caps it (no expert takes more than factor x its even share; models/moe_capacity.py), and
    under 1 it drops work everywhere, so the term is negative."""
    ex = layer.experts
    if ex is None:
        return 0.0
    busiest = ex.imbalance if strategy.ep > 1 else 1.0
    if ex.capacity_factor is not None:
        busiest = min(busiest, ex.capacity_factor)
    return (busiest - 1.0) * expert_share(layer, local) * compute_s


def expert_sync(layer: LayerSpec, strategy: LayerStrategy) -> tuple[float, int]:
    """(bytes, group size) of the routed experts' gradients summed over their edp replicas after the
    backward; (0, 1) where nothing is (no expert view, one replica, or sdp: FSDP reduce-scatters them
    in the backward, `expert_fsdp_s`)."""
    nbytes = routed_bytes(layer, strategy)
    d = expert_degrees(strategy) if nbytes else None
    if d is None or d.edp <= 1 or strategy.sdp > 1:
        return 0.0, 1
    return nbytes / (d.ep * d.etp), d.edp


def expert_fsdp_s(model: ModelSpec, layer: LayerSpec, strategy: LayerStrategy, link: LinkSpec) -> tuple[float, float]:
    """With sdp, FSDP over the experts' edp replicas: the all-gather of the routed experts' shard
    before each pass (in the compute dtype) and the reduce-scatter of their gradients after the
    backward (fp32), over the edp group. (forward s, backward s); 0 otherwise."""
    nbytes = routed_bytes(layer, strategy)
    d = expert_degrees(strategy) if nbytes else None
    if d is None or strategy.sdp <= 1 or d.edp <= 1:
        return 0.0, 0.0
    shard = nbytes / (d.ep * d.etp)
    gather = ring_allgather_s(shard * model.compute_dtype_bytes / model.dtype_bytes, d.edp, link)
    return gather, gather + ring_reducescatter_s(shard, d.edp, link)


def expert_groups(strategy: LayerStrategy, devices: tuple[int, ...]) -> dict[Axis, tuple[int, ...]]:
    """The expert view's groups holding the stage's first device: etp consecutive devices, ep
    strided by etp, edp strided by ep x etp (Megatron's expert rank order: etp, ep, edp, then pp).
    Empty without an expert view."""
    if not has_expert_view(strategy):
        return {}
    d = expert_degrees(strategy)
    return {EXPERT_TENSOR: tuple(devices[:d.etp]), EXPERT: tuple(devices[j * d.etp] for j in range(d.ep)),
            EXPERT_DATA: tuple(devices[j * d.ep * d.etp] for j in range(d.edp))}


def all_to_all_link(cluster: Cluster, group: tuple[int, ...]) -> LinkSpec:
    """The effective link of an all-to-all over `group`: each device sends 1/n of its bytes to each
    peer; those on its node go over the node's link, the others over the network, where the node's
    k members share min(k, rails) ports; both at once, the slower side bounds it. Returned as the
    bandwidth that moves the (n - 1) / n leaving bytes in that time (`all_to_all_s`)."""
    n = len(group)
    if n < 2:
        return LinkSpec(bandwidth_bytes_per_s=float("inf"), latency_s=0.0)
    per_node = Counter(cluster.devices[d].node for d in group)
    slowest = 0.0  # seconds per byte of the device's whole volume
    for node, k in per_node.items():
        spec = cluster.nodes[node]
        intra = (k - 1) / n / spec.intra_link.bandwidth_bytes_per_s if k > 1 else 0.0
        inter = (n - k) / n / (spec.network.bandwidth_bytes_per_s * min(k, spec.rails) / k) if n > k else 0.0
        slowest = max(slowest, intra, inter)
    latency = max(cluster.slowest_link(group).latency_s, 0.0)
    return LinkSpec(bandwidth_bytes_per_s=(n - 1) / n / slowest, latency_s=latency)


def common_expert_count(model: ModelSpec) -> int:
    """The greatest count every MoE layer's routed experts divide into (what an ep degree must divide
    on every such layer); 0 for a dense model."""
    return math.gcd(*(x.experts.experts for x in model.layers if x.experts is not None))


def expert_problem(layer: LayerSpec, strategy: LayerStrategy) -> str | None:
    """Why the strategy's expert view does not fit this layer (one line), or None."""
    if not has_expert_view(strategy):
        return None
    if layer.experts is None:
        return f"ep {strategy.ep} x etp {strategy.etp} on layer {layer.index} ({layer.name}), which has no experts"
    if layer.experts.experts % strategy.ep:
        return f"ep {strategy.ep} does not divide layer {layer.index}'s {layer.experts.experts} experts"
    return None
