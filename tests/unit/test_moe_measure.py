"""Issue 50 item 1: an MoE model's layers as paraplan measures them (models/moe_static.py on meta):
a Mixtral block counts its routed FLOPs, top-2 of 4 experts and the router, where a dense pricing
of the same block counted all four; its parameters are every expert's."""

from __future__ import annotations

from paraplan.models import measure, source

H, F, E, SEQ = 64, 128, 4, 16
SHAPE = f"num_hidden_layers=2&hidden_size={H}&intermediate_size={F}&num_attention_heads=4&num_key_value_heads=2"


def _block(reference: str):
    spec = measure.measure(source.build(reference, device="meta"))
    return next(layer for layer in spec.layers if layer.kind == "block")


def test_a_mixtral_block_is_measured_with_its_routed_flops_and_all_its_experts_parameters():
    moe = _block(f"hf:mixtral?{SHAPE}&num_local_experts={E}&num_experts_per_tok=2&vocab_size=256&seq_len={SEQ}")
    dense = _block(f"hf:llama?{SHAPE}&vocab_size=256&seq_len={SEQ}")  # the same attention, one MLP of FFN F
    per_sample = moe.forward_flops.at(1) - moe.forward_flops.at(0)
    dense_per_sample = dense.forward_flops.at(1) - dense.forward_flops.at(0)
    # two experts of FFN F and the router [E, H], where the dense block has one MLP of FFN F
    assert per_sample - dense_per_sample == SEQ * 2 * (3 * H * F + E * H)
    assert moe.param_count - dense.param_count == (E - 1) * 3 * H * F + E * H
