"""Analytic per-layer costs from a measured ModelSpec and a device model.

On a GPU described down to its SMs a layer's passes are priced kernel by kernel (costs/
op_roofline.py, from the kernels the measurement inventoried); elsewhere by the layer roofline below.

The FLOPs, bytes and kernel counts come from the meta-device measurement; the device model turns
them into seconds (costs/timefn.py). Memory traffic is a rough count of what each pass must move
through device memory at least once:
    forward:  parameters (none for a lookup) + input + output + saved tensors
    backward: parameters read and gradients written + saved tensors + input + two output gradients
"""

from __future__ import annotations

from dataclasses import replace

from paraplan.costs.engine_profile import (
    BlockShape,
    EngineProfile,
    expert_block_kernels,
    megatron_block_kernels,
)
from paraplan.costs.fp8_linear import fp8_passes, fp8_recomputed
from paraplan.costs.op_roofline import OperatorTime
from paraplan.costs.timefn import ComputeTime, LayerCosts, TransferTime
from paraplan.hardware.cluster import DeviceSpec, LinkSpec
from paraplan.models.spec import Affine, ModelSpec


def _plus(*terms: Affine) -> Affine:
    return Affine(fixed=sum(t.fixed for t in terms), per_sample=sum(t.per_sample for t in terms))


def analytic_costs(model: ModelSpec, device: DeviceSpec, link: LinkSpec, engine: EngineProfile | None = None,
                   block: BlockShape | None = None, fp8_recipe: str = "") -> LayerCosts:
    """`engine` with fused blocks (Megatron) and the model's `block` shape: a transformer block's
    memory-bound kernels are the engine's fused ones (costs/engine_profile.py), its GEMMs and
    attention kernel as measured. `fp8_recipe` (an fp8 plan's): the blocks' linears in FP8 with the
    recipe's casts (costs/fp8_linear.py), on the device view `for_precision("fp8", recipe)`."""
    fused = megatron_block_kernels(block) if engine is not None and engine.fused_blocks and block else None
    forward, backward, send_f, send_b = [], [], [], []
    previous_output = model.input_bytes
    # one time function per distinct pass: the blocks of an LLM share theirs, and with it the memo of
    # what it was asked (OperatorTime), so a pass is priced at a micro-batch size once, not once a
    # block (an 80-block model's arrays at one size had been 2 x 82 kernel-by-kernel pricings)
    made: dict = {}
    for layer in model.layers:
        # a mixture-of-experts block: the engine's MoE kernels (permutation, router, its expert FFN)
        layer_fused = expert_block_kernels(block, layer.experts) if fused is not None and layer.experts else fused
        params = Affine(fixed=layer.param_bytes + layer.shared_param_bytes, per_sample=0.0)
        # An embedding lookup (no FLOPs) reads only the rows it gathers, not its whole table.
        fwd_params = params if layer.forward_flops.per_sample > 0 else Affine(0.0, 0.0)
        fwd_traffic = _plus(fwd_params, previous_output, layer.output_bytes, layer.saved_bytes)
        bwd_traffic = _plus(params, params, layer.saved_bytes, previous_output, layer.output_grad_bytes,
                            layer.output_grad_bytes)
        if device.operator_priced and layer.forward_inventory is not None and layer.backward_inventory is not None:
            # a GPU described down to its SMs: kernel by kernel (costs/op_roofline.py)
            fwd, bwd = _engine_passes(layer, engine, layer_fused, device)
            if fp8_recipe and layer.kind == "block":
                # Transformer Engine's norms and activation kernels take the amax: fused casts
                f8, b8 = fp8_passes(fwd.ops, bwd.ops, fp8_recipe, fused_casts=engine is not None and engine.fused_blocks)
                # torchtitan's per-operator recomputation runs FP8 matmuls and casts again; Megatron's
                # selective recomputation, the attention core, stays bf16
                selective = fp8_recomputed(fwd.selective, fwd.ops, f8) if layer_fused is None and fwd.selective is not None \
                    else fwd.selective
                fwd, bwd = replace(fwd, ops=f8, selective=selective, _memo={}), replace(bwd, ops=b8, _memo={})
            forward.append(made.setdefault(fwd, fwd))
            backward.append(made.setdefault(bwd, bwd))
        else:
            forward.append(ComputeTime(layer.forward_flops, fwd_traffic, max(1, layer.forward_ops), device))
            backward.append(ComputeTime(layer.backward_flops, bwd_traffic, max(1, layer.backward_ops), device))
        send_f.append(TransferTime(layer.output_bytes, link))
        send_b.append(TransferTime(layer.output_grad_bytes, link))
        previous_output = layer.output_bytes
    return LayerCosts(forward=tuple(forward), backward=tuple(backward), send_forward=tuple(send_f),
                      send_backward=tuple(send_b), source=f"analytic:{device.name}",
                      fsdp_prefetch=engine is not None and engine.fsdp_prefetch)


def _engine_passes(layer, engine: EngineProfile | None, fused, device: DeviceSpec) -> tuple[OperatorTime, OperatorTime]:
    """A layer's two passes priced kernel by kernel as `engine` runs them (costs/engine_profile.py)."""
    measured, measured_backward = layer.forward_inventory, layer.backward_inventory
    if fused is not None and layer.kind == "block":
        # Megatron: its fused memory-bound kernels; selective recomputation runs the attention core
        # again: the batched GEMMs (QK^T, attention over V) or the flash kernel, the softmax and dropout
        core = replace(measured, gemms=tuple(g for g in measured.gemms if g.batch.at(1.0) > 1),
                       memory_ops=fused.core_forward.memory_ops, other_kernels=0)
        return (OperatorTime(replace(measured, memory_ops=fused.forward.memory_ops), device,
                             replicated=fused.replicated_forward, selective=core),
                OperatorTime(replace(measured_backward, memory_ops=fused.backward.memory_ops), device,
                             replicated=fused.replicated_backward))
    selective = None
    if engine is not None and engine.per_op_selective and layer.kind == "block":
        # torchtitan's per-operator selective checkpointing saves SDPA's output and every second
        # matmul's: it runs the other half of the matmuls and every memory-bound kernel again
        selective = replace(measured, gemms=tuple(replace(g, count=g.count / 2) for g in measured.gemms),
                            attention_kernels=0, attention_flops=Affine(0.0, 0.0), attention_bytes=Affine(0.0, 0.0))
    return OperatorTime(measured, device, selective=selective), OperatorTime(measured_backward, device)
