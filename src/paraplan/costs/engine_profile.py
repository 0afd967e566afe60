"""How an engine runs the same model: an implementation profile per engine (issue 48, item 2).

The measurement (models/measure.py) records a layer as paraplan's own runtime runs it: a
transformers module under autocast, eager, its residual stream in fp32. The engines a plan is
exported to run the same math otherwise, and the price follows the engine:

  paraplan    the measurement as it is (the default: `paraplan train` runs this).
  megatron    Megatron-LM / megatron-core: parameters and the residual stream in the 16-bit dtype,
              so TP collectives and pipeline sends move 2 bytes per element; a transformer block's
              memory-bound work is its fused kernels (fused layer norm / RMSNorm, scale-mask-softmax,
              bias-dropout-add, bias-GeLU / SwiGLU, fused rotary; `megatron_block_kernels`), the
              weight gradients accumulated into fp32 main_grad inside the GEMM (gradient
              accumulation fusion): no kernel of their own.
  torchtitan  FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): parameters and
              activations in bf16 (2-byte residual stream, collectives and sends), eager kernels as
              measured (no fusion), FSDP's all-gathers prefetched (costs/strategy.py: layer_time);
              under pipelining each stage's units kept gathered with fp32 gradients until its last
              backward (costs/memory.py).
  deepspeed   the model's own modules (eager, as measured) with bf16 parameters (DeepSpeed's bf16
              mode casts the module): 2-byte residual stream and sends.

What is not modelled yet, stated: torch.compile's fusion (torchtitan `--compile`), AsyncTP and
--tp-comm-overlap, DeepSpeed's overlap_comm (priced as the engines' defaults: not overlapped).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.errors import ParaplanError
from paraplan.models.spec import Affine, MemoryOp, PassOps


@dataclass(frozen=True)
class EngineProfile:
    name: str
    residual_bytes: int | None  # bytes per element of the residual stream, collectives and sends; None: as measured
    fused_blocks: bool  # a transformer block's memory-bound kernels are the engine's fused ones
    fsdp_prefetch: bool  # FSDP's forward all-gathers overlap the previous layer's compute
    description: str
    # `selective` recomputation per operator (torchtitan's SAC: every second matmul's output and SDPA's
    # kept, the rest run again) rather than the attention core (Korthikanti et al. 2022 §5)
    per_op_selective: bool = False
    # pipeline sends between tensor-parallel stages split over the TP ranks even without sequence
    # parallelism (Megatron-LM's scatter/gather, Narayanan et al. 2021 §4.1: simulator/plan_work.py)
    scatter_gather_sends: bool = False
    # FSDP under pipelining keeps a stage's units gathered and its gradients unsharded (in the reduce
    # dtype, fp32) across the step's micro-batches, syncing and resharding once after the stage's
    # last backward: torchtitan 0.3.0's `fsdp_reshard_after_forward="default"` is `not pp_enabled`
    # (torchtitan/distributed/fsdp.py), and torch.distributed.pipelining turns gradient sync and
    # reshard-after-backward off until the stage's REDUCE_GRAD (pipelining/stage.py,
    # schedules.py: _add_reduce_grad); FSDP2 upcasts the unsynced gradient to reduce_dtype
    # (_fsdp_param.py: to_accumulated_grad_if_needed). costs/memory.py prices it.
    pipeline_keeps_fsdp_units: bool = False


PROFILES = {p.name: p for p in (
    EngineProfile("paraplan", None, False, False,
                  "paraplan's runtime: transformers modules under autocast, fp32 residual stream, eager"),
    EngineProfile("megatron", 2, True, False,
                  "Megatron-LM 0.16 / megatron-core: 16-bit residual stream and communication, fused kernels",
                  scatter_gather_sends=True),
    EngineProfile("torchtitan", 2, False, True,
                  "torchtitan 0.3 eager: FSDP2 bf16 parameters and activations, all-gathers prefetched",
                  per_op_selective=True, pipeline_keeps_fsdp_units=True),
    EngineProfile("deepspeed", 2, False, False, "DeepSpeed 0.19 bf16: the module's own kernels in bf16"),
)}
ENGINES = tuple(PROFILES)


def engine_profile(name: str) -> EngineProfile:
    if name not in PROFILES:
        raise ParaplanError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}")
    return PROFILES[name]


@dataclass(frozen=True)
class LatentAttention:
    """Multi-head latent attention's widths (DeepSeek-V2/V3: the transformers config's names)."""

    qk_nope_head_dim: int  # a query-key head's part without position (128 in DeepSeek-V3)
    qk_rope_head_dim: int  # its rotary part, one key part shared by every head (64)
    v_head_dim: int  # a value head (128)
    q_lora_rank: int  # the compressed query's width (1536; 0: no query compression)
    kv_lora_rank: int  # the compressed key-value's width (512)


@dataclass(frozen=True)
class BlockShape:
    """A decoder block as its fused kernels see it (engines/shape.py's ModelShape carries these)."""

    hidden: int  # h
    heads: int  # a
    kv_heads: int  # g (grouped-query attention)
    ffn: int  # f
    seq_len: int  # s: tokens per sample
    gated: bool  # SwiGLU (Llama) rather than GeLU (GPT)
    dropout: bool  # GPT-style dropout after the softmax, the attention output and the MLP
    eager_attention: bool  # the s x s softmax in memory (no flash kernel)
    latent: LatentAttention | None = None  # MLA (its query and key assembled per head: `mla_kernels`)


@dataclass(frozen=True)
class FusedBlock:
    """A block's memory-bound kernels as an engine fuses them (`megatron_block_kernels`)."""

    forward: PassOps
    backward: PassOps
    replicated_forward: PassOps  # the part every TP rank runs whole without sequence parallelism
    replicated_backward: PassOps
    core_forward: PassOps  # the attention core's (what selective recomputation runs again)


def megatron_block_kernels(shape: BlockShape, element_bytes: int = 2) -> FusedBlock:
    """The memory-bound kernels of one Megatron block per sample, bytes read and written. The
    replicated kernels (norms, residual adds, bias-dropout-adds) run whole on every tensor-parallel
    rank unless sequence parallelism splits them (Korthikanti et al. 2022 §4.2.2); the rest splits
    over tp; the attention core's (the eager softmax and its dropout) are what selective
    recomputation runs again with the core's two batched GEMMs.

    With e bytes per element, T = s tokens, 1-byte dropout masks (Korthikanti §4.1's convention):
      norm (fused LN / RMSNorm)        fwd: read + write x: 2eTh;  bwd: x, dy -> dx: 3eTh
      bias-dropout-add / residual add  fwd: (3e + 1)Th with dropout (out, residual -> sum, mask), 3eTh
                                       without; bwd: the residual fork's sum 3eTh, plus (2e + 1)Th
                                       through the dropout mask
      rotary (fused, Llama)            fwd and bwd: q and k read and written: 2eT(h + g h/a)
      softmax (fused scale-mask, eager) fwd: 2e aTs; bwd: 3e aTs; its dropout: (2e + 1) aTs both ways
      MLP activation                   GeLU (bias fused): fwd 2eTf, bwd 3eTf; SwiGLU: fwd 3eTf,
                                       bwd 5eTf
    GEMMs (their biases in the GEMM's epilogue) and a flash kernel are priced from the measurement."""
    e, t, h, f = element_bytes, shape.seq_len, shape.hidden, shape.ffn
    kv_width = shape.kv_heads * h // shape.heads
    scores = shape.heads * t * shape.seq_len  # a T s per sample
    residual_f = (3 * e + 1) * t * h if shape.dropout else 3 * e * t * h
    residual_b = 3 * e * t * h + ((2 * e + 1) * t * h if shape.dropout else 0)
    replicated_f = [2 * e * t * h] * 2 + [residual_f] * 2
    replicated_b = [3 * e * t * h] * 2 + [residual_b] * 2
    split_f = [3 * e * t * f if shape.gated else 2 * e * t * f]
    split_b = [5 * e * t * f if shape.gated else 3 * e * t * f]
    if shape.latent is not None:  # MLA: its own rotary, norms and assembly of q and k (`mla_kernels`)
        mla_f, mla_b, mla_replicated_f, mla_replicated_b = mla_kernels(shape, e)
        split_f += mla_f
        split_b += mla_b
        replicated_f += mla_replicated_f
        replicated_b += mla_replicated_b
    elif shape.gated:  # Llama's rotary position embedding, fused
        split_f.append(2 * e * t * (h + kv_width))
        split_b.append(2 * e * t * (h + kv_width))
    core_f = []
    if shape.eager_attention:
        core_f.append(2 * e * scores)
        split_b.append(3 * e * scores)
        if shape.dropout:
            core_f.append((2 * e + 1) * scores)
            split_b.append((2 * e + 1) * scores)

    def ops(sizes: list[int]) -> PassOps:
        counts: dict[int, int] = {}
        for size in sizes:
            counts[size] = counts.get(size, 0) + 1
        return PassOps(memory_ops=tuple(MemoryOp(Affine(0.0, float(size)), n) for size, n in counts.items()))

    return FusedBlock(ops(replicated_f + split_f + core_f), ops(replicated_b + split_b), ops(replicated_f),
                      ops(replicated_b), ops(core_f))


def mla_kernels(shape: BlockShape, element_bytes: int = 2) -> tuple[list[int], list[int], list[int], list[int]]:
    """Multi-head latent attention's memory-bound kernels per sample beyond its GEMMs and its flash
    kernel (forward and backward over the heads, then forward and backward of the replicated ones),
    as both engines' MLA modules run them (Automodel's `deepseek_v3/layers.py: MLA.forward`,
    megatron-core's `multi_latent_attention.py`): with a heads, n / r / v the nope / rope / value head
    widths and T = s tokens,
      rotary on the query's rope part and the one shared key part   fwd and bwd: 2eT r (a + 1)
      q = cat(q_nope, q_pe)              fwd: 2eT a(n + r); bwd: the split's backward assembles the
                                         query's gradient again, 2eT a(n + r)
      k = cat(k_nope, k_pe broadcast)    fwd: 2eT a(n + r); bwd: the split of kv_b's output assembles
                                         its gradient, 2eT a(n + v), and the broadcast sums over the
                                         heads, eT a r
      RMSNorm of the compressed q and kv fwd: 2eT (q_lora + kv_lora); bwd: 3eT (q_lora + kv_lora)
    They replace the fused rotary a block of h-wide heads is priced with."""
    mla, e, t, a = shape.latent, element_bytes, shape.seq_len, shape.heads
    n, r, v = mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    rotary = 2 * e * t * r * (a + 1)
    assemble = 2 * e * t * a * (n + r)
    norms = mla.q_lora_rank + mla.kv_lora_rank
    return ([rotary, assemble, assemble], [rotary, assemble, 2 * e * t * a * (n + v), e * t * a * r],
            [2 * e * t * norms], [3 * e * t * norms])


def expert_block(block: BlockShape, experts) -> BlockShape:
    """A mixture-of-experts block as the dense block its memory-bound kernels match: the routed
    copies' and the shared experts' activations are elementwise over T x (k f_e + f_s), a dense MLP
    of FFN k f_e + f_s (`experts`: models/spec.py LayerExperts; f from the FLOPs per token, 2 x 3 h f
    per expert with SwiGLU, 2 x 2 h f with GeLU)."""
    matrices = 3 if block.gated else 2
    ffn = (experts.routed_flops_per_token + experts.shared_flops_per_token) / (2 * matrices * block.hidden)
    return replace(block, ffn=max(1, round(ffn)))


def expert_block_kernels(block: BlockShape, experts, element_bytes: int = 2) -> FusedBlock:
    """Megatron's MoE block's memory-bound kernels per sample: the dense block's at its expert FFN
    (`expert_block`), the router's softmax and top-k over T x E in fp32 (read and written, both
    passes), and the token permutation around the experts (megatron-core's `permute` / `unpermute`:
    the T x k copies of h elements read and written before the experts and after them, both passes;
    the all-to-alls themselves are costs/expert_costs.py's)."""
    base = megatron_block_kernels(expert_block(block, experts), element_bytes)
    t = block.seq_len
    permute = 2 * element_bytes * t * experts.top_k * block.hidden
    router = 2 * 4 * t * experts.experts
    extra = (MemoryOp(Affine(0.0, float(permute)), 2), MemoryOp(Affine(0.0, float(router)), 1))
    return replace(base, forward=replace(base.forward, memory_ops=base.forward.memory_ops + extra),
                   backward=replace(base.backward, memory_ops=base.backward.memory_ops + extra))
