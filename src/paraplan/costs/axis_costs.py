"""Each parallel axis's cost term on one layer: what its collectives take on its group's link, per
pass, on one device of the layer's group (plans/axes.py names the axes; costs/strategy.py:
layer_time adds the terms to the layer's compute in one order). A new axis adds its term here.

`local` is the samples a device of the group processes (the micro-batch over the axes that split
the batch); byte counts are of that slice, before the tensor and context splits."""

from __future__ import annotations

from paraplan.costs.collectives import allreduce_s, ring_allgather_s, ring_allreduce_s, ring_reducescatter_s
from paraplan.costs.expert_costs import dense_param_bytes
from paraplan.hardware.cluster import LinkSpec
from paraplan.models.spec import LayerSpec, ModelSpec
from paraplan.plans.plan import LayerStrategy


def tensor_s(layer: LayerSpec, local: float, strategy: LayerStrategy, link: LinkSpec,
             compute_bytes: int = 0) -> tuple[float, float]:
    """TENSOR (Megatron): two all-reduces of the activations per pass (one after the attention, one
    after the MLP), of this cp rank's tokens, ring over the tp group; with sequence parallelism each
    becomes a reduce-scatter and an all-gather of the same tensor, the same time on a ring
    (Korthikanti et al. 2022 §4.2.2). What is all-reduced is the row-parallel linear's output, in
    the compute dtype (`compute_bytes` per element): under autocast the block's output (the residual
    stream) is fp32, the output projection's bf16 (checked on the CPU with a bf16 run: o_proj and
    down_proj return bf16, the block fp32). Without sequence parallelism the all-reduce runs on the
    fastest algorithm the group has (NVLS on a Hopper node); with it, the reduce-scatter and the
    all-gather stay rings (costs/collectives.py). (forward s, backward s); 0 without tp."""
    tp, cp = strategy.tp, strategy.cp
    if tp <= 1:
        return 0.0, 0.0
    scale = compute_bytes / layer.output_element_bytes if compute_bytes and layer.output_element_bytes else 1.0
    scale = min(scale, 1.0)
    reduce = ring_allreduce_s if strategy.sequence_parallel else allreduce_s
    return (2 * reduce(layer.output_bytes.at(local) * scale / cp, tp, link),
            2 * reduce(layer.output_grad_bytes.at(local) * scale / cp, tp, link))


def attention_flops(layer: LayerSpec, local: float) -> float:
    """The FLOPs of the layer's attention core in one forward: a fused kernel's (what it does, causal
    halved: models/op_inventory.py), else the eager core's matmuls (models/attention_kernel.py)."""
    inventory = layer.forward_inventory
    if inventory is not None and inventory.attention_kernels:
        return inventory.attention_flops.at(local)
    return layer.attention_core_flops.at(local)


def context_ring_s(layer: LayerSpec, local: float, strategy: LayerStrategy, link: LinkSpec) -> tuple[float, float]:
    """CONTEXT, ring attention (Liu et al. 2023; Megatron-LM's CP): each rank's K and V (two tensors
    of the layer's output size times its kv_fraction, grouped-query attention's kv_heads / heads
    where the engine's block shape gives it, else 1: an upper bound; over tp) pass around the cp ring
    in cp - 1 steps. (the forward's ring in seconds, one step's hop); the backward sends K, V and
    their gradients, twice the ring, and its last hop (the gradients of K and V coming home after
    the last block) follows all compute. layer_time overlaps the rest with the attention core only:
    the projections before it make K and V, and the one after it needs its output. (0, 0) without
    cp or attention."""
    tp, cp = strategy.tp, strategy.cp
    if cp <= 1 or attention_flops(layer, local) <= 0:
        return 0.0, 0.0
    kv = 2 * layer.output_bytes.at(local) * layer.kv_fraction / (tp * cp)
    hop = link.latency_s + kv / link.bandwidth_bytes_per_s
    return (cp - 1) * hop, hop


def overlapped_s(compute_s: float, comm_s: float, slowdown: float) -> float:
    """Compute and communication overlapping on one device (Galvatron §V): while both run, both
    are `slowdown` times slower; the longer one finishes alone."""
    both = min(compute_s, comm_s)
    return both * slowdown + max(compute_s, comm_s) - both


def context_overlapped(compute: tuple[float, float], forward: float, backward: float, ring: float, hop: float,
                     attention_share: float, cp: int, slowdown: float | None) -> tuple[float, float]:
    """Ring attention's K/V exchange as Megatron-LM's CP runs it: step i's transfer overlaps the
    attention block computed at step i, so cp - 1 of the cp blocks hide the ring, and only the
    attention core (its FLOP share of the layer, `attention_share`), not the projections around it;
    the backward's ring carries K, V and their gradients (twice), and its last hop, the gradients
    of K and V coming home, follows the last block. (forward s, backward s)."""
    slowdown = slowdown if slowdown is not None else 1.0
    attention_f, attention_b = compute[0] * attention_share, compute[1] * attention_share
    hidden = (cp - 1) / cp
    forward = forward - attention_f * hidden + overlapped_s(attention_f * hidden, ring, slowdown)
    backward = backward - attention_b * hidden + overlapped_s(attention_b * hidden, 2 * ring, slowdown) + hop
    return forward, backward


def sharded_data_s(model: ModelSpec, layer: LayerSpec, strategy: LayerStrategy, link: LinkSpec) -> tuple[float, float]:
    """SHARDED_DATA (ZeRO-3 / FSDP): the all-gather of the layer's weights before each pass and the
    reduce-scatter of its gradients after the backward, over the sdp group; in mixed precision the
    weights are gathered in the compute dtype and the gradients reduced in fp32 (FSDP2's
    MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)). (forward's gather s, backward's
    gather + reduce-scatter s); 0 without sdp."""
    sdp = strategy.fsdp_degree  # with context parallelism its cp ranks too (LayerStrategy.fsdp_degree)
    if sdp <= 1:
        return 0.0, 0.0
    shard = dense_param_bytes(layer, strategy) / strategy.tp  # an MoE layer's routed experts: expert_costs.py
    gathered = layer.gathered_element_bytes or model.compute_dtype_bytes  # an FP8 parameter all-gather: 1
    gather = ring_allgather_s(shard * gathered / model.dtype_bytes, sdp, link)
    return gather, gather + ring_reducescatter_s(shard, sdp, link)


def gradient_sync_bytes(layer: LayerSpec, strategy: LayerStrategy) -> float:
    """DATA (and CONTEXT, whose ranks hold the same weights): the bytes of this device's gradients
    summed over the gradient-sync group (dp x cp) after the backward; 0 without such a group."""
    return dense_param_bytes(layer, strategy) / strategy.tp / strategy.fsdp_degree if strategy.sync_degree > 1 else 0.0


def zero2_reduce_scatter_s(sync_bytes: float, strategy: LayerStrategy, link: LinkSpec) -> float:
    """DATA with ZeRO-2 (as DeepSpeed's stage 2 and runtime's zero.py): each micro-batch's gradients
    reduce-scattered over the dp replicas as its backward ends (overlapping it); nothing is left for
    the end-of-step sync; over dp x cp, the group ZeRO shards over (costs/strategy.py:
    state_parts_per_param). 0 unless ZeRO-2 over more than one rank."""
    if strategy.zero < 2 or strategy.sync_degree <= 1:
        return 0.0
    return ring_reducescatter_s(sync_bytes, strategy.sync_degree, link)


def overlap_saving(forward_s: float, backward_s: float, dispatch_forward_s: float, dispatch_backward_s: float,
                   slowdown: float | None, expert_share: float) -> tuple[float, float]:
    """What a combined pass (plans/expert_overlap.py) saves on one layer: the layer's forward of one
    micro-batch beside its backward of another, as megatron-core 0.16.1 pairs their sub-modules
    (models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):
        comm stream:     combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
        compute stream:  attn_fwd    | mlp_bwd (+ dw) -> mlp_fwd    | attn_bwd
    so each all-to-all hides only under the compute it is paired with, both `slowdown` times slower
    while they overlap (overlapped_s, Galvatron §V). A pass's all-to-alls (`dispatch_*`, inside
    `forward_s` and `backward_s`) are a dispatch and a combine of equal size; its compute splits
    into the routed experts' part ("mlp", `expert_share` of it: costs/expert_costs.py expert_share)
    and the rest ("attn": attention, router, shared experts, norms). The saving is split between the
    passes as their all-to-alls are: (forward s, backward s)."""
    a2a = dispatch_forward_s + dispatch_backward_s
    if a2a <= 0:
        return 0.0, 0.0
    slow = slowdown if slowdown is not None else 1.0
    compute_f, compute_b = forward_s - dispatch_forward_s, backward_s - dispatch_backward_s
    mlp_f, mlp_b = compute_f * expert_share, compute_b * expert_share
    combined = (overlapped_s(compute_f - mlp_f, dispatch_backward_s / 2, slow)  # attn_fwd | combine_bwd
                + overlapped_s(mlp_b, dispatch_forward_s / 2, slow)  # mlp_bwd | dispatch_fwd
                + overlapped_s(mlp_f, dispatch_backward_s / 2, slow)  # mlp_fwd | dispatch_bwd
                + overlapped_s(compute_b - mlp_b, dispatch_forward_s / 2, slow))  # attn_bwd | combine_fwd
    saved = max(0.0, forward_s + backward_s - combined)
    return saved * dispatch_forward_s / a2a, saved * dispatch_backward_s / a2a
