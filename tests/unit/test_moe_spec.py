"""Issue 50 item 1: a mixture-of-experts model described from its built structure (models/moe_spec.py):
routed experts, top-k, one expert's parameters, shared experts, the router, dense blocks among MoE
blocks, group-limited routing and the attention kind, against hand counts from each family's config
(tiny configs of transformers 5's Mixtral, Qwen3-MoE, DeepSeek-V3 and gpt-oss, built on meta)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from paraplan.models.moe_spec import moe_spec

H = 64  # hidden size of every tiny config


def _built(config):
    with torch.device("meta"):
        return tf.AutoModelForCausalLM.from_config(config)


def test_mixtral_routed_experts_top_two_no_shared():
    spec = moe_spec(_built(tf.MixtralConfig(hidden_size=H, intermediate_size=96, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                            num_experts_per_tok=2, vocab_size=100)))
    assert spec.n_blocks == 2 and spec.dense_blocks == () and spec.attention == "gqa"
    for b in spec.blocks:
        assert (b.experts, b.top_k) == (4, 2)
        assert b.expert_params == b.expert_weights == 3 * H * 96  # SwiGLU: gate, up, down
        assert (b.shared_params, b.router_params) == (0, 4 * H)
        assert b.forward_flops_per_token == 2 * (2 * 3 * H * 96 + 4 * H)
        assert b.all_experts_forward_flops_per_token == 2 * (4 * 3 * H * 96 + 4 * H)


def test_qwen3_moe_experts_of_their_own_ffn_size():
    spec = moe_spec(_built(tf.Qwen3MoeConfig(hidden_size=H, intermediate_size=128, moe_intermediate_size=32,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             num_experts=8, num_experts_per_tok=2, vocab_size=100)))
    b = spec.blocks[0]
    assert (b.experts, b.top_k, b.expert_params, b.router_params, b.shared_params) == (8, 2, 3 * H * 32, 8 * H, 0)
    assert b.routed_params == 8 * 3 * H * 32


def test_deepseek_v3_dense_first_blocks_a_shared_expert_groups_and_mla():
    spec = moe_spec(_built(tf.DeepseekV3Config(
        hidden_size=H, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, vocab_size=100)))
    assert spec.dense_blocks == (0,) and [b.block for b in spec.blocks] == [1, 2]
    assert spec.attention == "mla"
    b = spec.blocks[0]
    assert (b.experts, b.top_k, b.groups, b.topk_groups) == (8, 2, 2, 1)
    assert b.expert_params == 3 * H * 32 and b.shared_params == 1 * 3 * H * 32 and b.router_params == 8 * H
    # a token: 2 routed experts, the shared one and the router (Megatron's MoE FLOPs, top-k + shared)
    assert b.forward_flops_per_token == 2 * (2 * 3 * H * 32 + 3 * H * 32 + 8 * H)


def test_gpt_oss_biases_are_memory_not_flops():
    spec = moe_spec(_built(tf.GptOssConfig(hidden_size=H, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                           num_experts_per_tok=2, vocab_size=100, head_dim=16)))
    b = spec.blocks[0]
    weights = H * 2 * 96 + 96 * H  # fused gate-up [h, 2f] and down [f, h]
    assert b.expert_weights == weights and b.expert_params == weights + 2 * 96 + H  # and their biases
    assert (b.router_params, b.router_weights) == (4 * H + 4, 4 * H)
    assert b.forward_flops_per_token == 2 * (2 * weights + 4 * H)


def test_a_dense_model_has_no_experts():
    assert moe_spec(_built(tf.LlamaConfig(hidden_size=H, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, vocab_size=100))) is None


def test_a_config_and_a_structure_that_disagree_are_refused():
    model = _built(tf.MixtralConfig(hidden_size=H, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                                    num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=100))
    model.config.num_local_experts = 6
    with pytest.raises(ValueError, match="4 experts built where the config says 6"):
        moe_spec(model)
