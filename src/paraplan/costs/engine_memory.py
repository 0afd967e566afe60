"""What a transformer block keeps for its backward as each engine runs it (issue 48, item 4).

The measurement keeps what paraplan's runtime keeps (autocast: an fp32 residual stream, fp32 norm
inputs, 16-bit matmul inputs). The engines keep other tensors, in their own dtype; each is written
out tensor by tensor in costs/transformer_memory.py (Korthikanti et al. 2022 §4.1, generalised):

  megatron    every tensor in the 16-bit dtype; `selective` recomputation drops the attention core
              (Korthikanti §5: the s x s softmax, its dropout; under a flash kernel, nothing).
  torchtitan  bf16 activations (FSDP2's param_dtype); its `selective` is per-operator activation
              checkpointing (torchtitan's `_save_list`: every second matmul's output and SDPA's
              output are kept, everything else runs again): `torchtitan_op_sac_bytes`.
  deepspeed   the module's own tensors in bf16 (as megatron's inventory, without a selective mode
              of its own: `selective` as Korthikanti's).

`LayerSpec.saved_bytes` becomes the engine's whole inventory and `attention_core_bytes` the part
its `selective` recomputation does not keep, so costs/strategy.py's layer_memory needs no engine.
"""

from __future__ import annotations

from dataclasses import replace

from paraplan.costs.engine_profile import BlockShape, EngineProfile, expert_block
from paraplan.costs.transformer_memory import TransformerShape, layer_activation_bytes
from paraplan.models.spec import Affine, ModelSpec


def transformer_shape(block: BlockShape) -> TransformerShape:
    return TransformerShape(hidden=block.hidden, heads=block.heads, seq_len=block.seq_len, ffn=block.ffn,
                            kv_heads=block.kv_heads, mlp="swiglu" if block.gated else "gelu",
                            norm="rmsnorm" if block.gated else "layernorm", dropout=block.dropout,
                            attention="eager" if block.eager_attention else "sdpa")


def torchtitan_op_sac_bytes(block: BlockShape, element_bytes: int = 2) -> float:
    """One sample's tensors kept by torchtitan's per-operator selective checkpointing of a Llama
    block (torchtitan/models/llama3/infra/parallelize.py `_apply_ac_to_transformer_block`, mode
    "selective", option "op"): of the block's seven matmuls (q, k, v, o, w1, w3, w2 in call order)
    the odd-numbered outputs are saved (q, v, w1's gate, w2's output), SDPA's output and fp32
    log-sum-exp, and the checkpoint's input; everything else is recomputed."""
    s, h, f = block.seq_len, block.hidden, block.ffn
    kv = h * block.kv_heads // block.heads
    elements = s * (h + kv + f + h) + s * h + s * h  # q, v, gate, down; SDPA output; block input
    return element_bytes * elements + 4.0 * block.heads * s


def engine_activations(model: ModelSpec, block: BlockShape, engine: EngineProfile,
                       element_bytes: int = 2, linear_input_bytes: float | None = None) -> ModelSpec:
    """The model with every transformer block's saved bytes as `engine` keeps them (per sample, as
    the measurement's are), and the bytes its `selective` recomputation drops. `linear_input_bytes`:
    an FP8 plan's linear inputs as the engine keeps them (costs/fp8_linear.py: saved_input_bytes)."""
    layers = tuple(_engine_block(layer, block, engine, element_bytes, linear_input_bytes) if layer.kind == "block"
                   else layer for layer in model.layers)
    return replace(model, layers=layers)


def _engine_block(layer, block: BlockShape, engine: EngineProfile, element_bytes: int,
                  linear_input_bytes: float | None = None):
    """One block's saved bytes as `engine` keeps them; a mixture-of-experts block as the dense block
    of its expert FFN (costs/engine_profile.py: `expert_block`), with the permuted copies of its
    tokens its experts keep beyond the one input a dense MLP keeps ((k - 1) T h)."""
    shape_block = block if layer.experts is None else expert_block(block, layer.experts)
    shape = transformer_shape(shape_block)
    whole = layer_activation_bytes(shape, 1, element_bytes, linear_input_bytes=linear_input_bytes)
    if layer.experts is not None:
        whole += (layer.experts.top_k - 1) * block.seq_len * block.hidden * element_bytes
    if engine.per_op_selective:
        kept_selective = torchtitan_op_sac_bytes(shape_block, element_bytes)
    else:
        kept_selective = layer_activation_bytes(shape, 1, element_bytes, recompute="selective",
                                                linear_input_bytes=linear_input_bytes)
    return replace(layer, saved_bytes=Affine(0.0, whole), attention_core_bytes=Affine(0.0, whole - kept_selective),
                   kv_fraction=block.kv_heads / block.heads)
