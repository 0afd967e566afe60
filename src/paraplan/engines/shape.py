"""The model's shape as the engines name it (layers, hidden size, heads, query groups, FFN size,
sequence length, vocabulary, architecture), read from the transformers config of the model the
plan names, built on the meta device (no weights, no device).

An engine can only build the models it has code for: a decoder-only transformer (GPT-2 or
Llama-like, and the Llama-like mixtures of experts Mixtral and Qwen3-MoE) here. For any other model
the parallel settings are still exported and the model's own configuration is left to the user
(`ModelShape.family` says which case it is).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.models.moe_check import EXPERT_COUNTS, TOP_K, config_int
from paraplan.models.moe_spec import moe_parts

# the mixtures of experts whose blocks are Llama's attention and a routed SwiGLU MLP, which
# Megatron-LM's GPT model builds with --num-experts and torchtitan's qwen3 family with its MoE flavours
MOE_FAMILIES = ("mixtral", "qwen3_moe")


@dataclass(frozen=True)
class ModelShape:
    name: str  # the plan's model reference
    family: str  # "llama", "gpt2" (decoder-only transformers the engines build) or the model's own family
    kinds: tuple[str, ...]  # paraplan's layer kinds in order ("embedding", "block", "head", ...)
    layers: int = 0  # transformer blocks
    hidden: int = 0
    heads: int = 0
    query_groups: int = 0  # key/value heads (grouped-query attention); = heads without it
    ffn: int = 0
    seq_len: int = 0
    vocab: int = 0
    tied_embeddings: bool = False
    params: tuple[int, ...] = ()  # each layer's parameters (a tied weight counted in every layer using it)
    # what the model's config sets and an engine has its own default for (Megatron-LM: dropout 0.1,
    # norm epsilon 1e-5, rotary base 10000): the prediction was made on the model's values
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    norm_eps: float = 1e-5
    rope_theta: float = 0.0  # 0: no rotary embedding (learned positions)
    # a mixture of experts (issue 50): routed experts, top-k, one expert's FFN, the blocks with
    # experts (the others dense), and Qwen3's per-head query / key norms and head width
    experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    moe_blocks: tuple[int, ...] = ()
    qk_norm: bool = False
    head_dim: int = 0  # 0: hidden / heads

    @property
    def llama_like(self) -> bool:
        """RMSNorm, SwiGLU, rotary positions, no biases: Llama and its mixtures of experts."""
        return self.family in ("llama", *MOE_FAMILIES)

    @property
    def decoder(self) -> bool:
        """A decoder-only transformer whose shape the engines' model code takes."""
        return self.family in ("llama", "gpt2", *MOE_FAMILIES) and self.layers > 0


def model_shape(reference: str) -> ModelShape:
    """Build `reference` on meta and read its shape."""
    from paraplan.models import source

    return shape_of(source.build(reference, device="meta"), reference)


def shape_of(built, reference: str) -> ModelShape:
    """The shape of a model built on meta (models/built.py's BuiltModel)."""
    layers = built.layers()
    kinds = tuple(kind for _, kind, _ in layers)
    params = tuple(sum(p.numel() for p in module.parameters()) for _, _, module in layers)
    config = getattr(built.module, "config", None)
    model_type = getattr(config, "model_type", built.family)
    seq = built.inputs.seq_len
    if model_type == "llama":
        # transformers 5 keeps the rotary base in rope_parameters, 4.x in rope_theta
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(config, "rope_theta", 1e4)
        return ModelShape(reference, "llama", kinds, layers=config.num_hidden_layers, hidden=config.hidden_size,
                          heads=config.num_attention_heads,
                          query_groups=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                          ffn=config.intermediate_size, seq_len=seq, vocab=config.vocab_size,
                          tied_embeddings=bool(config.tie_word_embeddings), params=params,
                          attention_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
                          hidden_dropout=0.0, norm_eps=float(config.rms_norm_eps), rope_theta=float(rope))
    if model_type in MOE_FAMILIES:
        rope = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(config, "rope_theta", 1e4)
        moe = tuple(i for i, (_, kind, module) in enumerate(x for x in layers if x[1] == "block")
                    if moe_parts(module))
        return ModelShape(reference, str(model_type), kinds, layers=config.num_hidden_layers, hidden=config.hidden_size,
                          heads=config.num_attention_heads,
                          query_groups=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                          ffn=config.intermediate_size, seq_len=seq, vocab=config.vocab_size,
                          tied_embeddings=bool(config.tie_word_embeddings), params=params,
                          attention_dropout=float(getattr(config, "attention_dropout", 0.0) or 0.0),
                          norm_eps=float(config.rms_norm_eps), rope_theta=float(rope),
                          experts=int(config_int(config, EXPERT_COUNTS)), top_k=int(config_int(config, TOP_K)),
                          moe_ffn=int(getattr(config, "moe_intermediate_size", None) or config.intermediate_size),
                          moe_blocks=moe, qk_norm=model_type == "qwen3_moe",
                          head_dim=int(getattr(config, "head_dim", None) or 0))
    if model_type == "gpt2":
        return ModelShape(reference, "gpt2", kinds, layers=config.n_layer, hidden=config.n_embd, heads=config.n_head,
                          query_groups=config.n_head, ffn=config.n_inner or 4 * config.n_embd, seq_len=seq,
                          vocab=config.vocab_size, tied_embeddings=True, params=params,
                          attention_dropout=float(config.attn_pdrop), hidden_dropout=float(config.resid_pdrop),
                          norm_eps=float(config.layer_norm_epsilon))
    return ModelShape(reference, str(model_type or built.family), kinds, seq_len=seq, params=params)
