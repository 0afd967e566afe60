"""Issue 50 item 1: an MoE block measured on the meta device (models/moe_static.py). With static
routing the block runs on meta tensors (transformers' own experts kernels cannot: a data-dependent
loop, or a bf16-only grouped GEMM), and torch's flop counter counts what a token really multiplies:
models/moe_spec.py's routed FLOPs per token (top-k experts, shared experts, the router), not E experts."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from torch.utils.flop_counter import FlopCounterMode

from paraplan.models.moe_spec import moe_parts, moe_spec
from paraplan.models.moe_static import static_routing

H, TOKENS = 64, 2 * 16
CONFIGS = {
    "mixtral": lambda: tf.MixtralConfig(hidden_size=H, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                        vocab_size=100),
    "qwen3_moe": lambda: tf.Qwen3MoeConfig(hidden_size=H, intermediate_size=128, moe_intermediate_size=32,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           num_experts=8, num_experts_per_tok=2, vocab_size=100),
    "qwen2_moe": lambda: tf.Qwen2MoeConfig(hidden_size=H, intermediate_size=128, moe_intermediate_size=32,
                                           shared_expert_intermediate_size=48, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                           num_experts_per_tok=2, vocab_size=100),
    "deepseek_v3": lambda: tf.DeepseekV3Config(
        hidden_size=H, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, vocab_size=100),
    "gpt_oss": lambda: tf.GptOssConfig(hidden_size=H, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                       vocab_size=100, head_dim=16),
}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_a_statically_routed_block_counts_the_routed_flops_on_meta(family):
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(CONFIGS[family]())
    spec = moe_spec(model)
    _, part = moe_parts(model)[-1]
    x = torch.empty(2, 16, H, device="meta")
    with static_routing(model) as swapped, FlopCounterMode(display=False) as counter:
        out = part(x)
    out = out[0] if isinstance(out, tuple) else out  # gpt-oss returns the router's scores beside
    assert swapped == len(spec.blocks) and tuple(out.shape) == (2, 16, H)
    assert counter.get_total_flops() == TOKENS * spec.blocks[-1].forward_flops_per_token
    assert "forward" not in part.experts.__dict__  # the experts' own forward is back


def test_without_it_the_experts_cannot_run_on_meta():
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(CONFIGS["mixtral"]())
    _, part = moe_parts(model)[-1]
    with pytest.raises(Exception):  # noqa: B017 - whichever kernel transformers picked fails on meta
        part(torch.empty(2, 16, H, device="meta"))
