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


def test_each_moe_block_carries_its_routed_experts_and_a_dense_model_none():
    ref = f"hf:mixtral?{SHAPE}&num_local_experts={E}&num_experts_per_tok=2&vocab_size=256&seq_len={SEQ}"
    spec = measure.measure(source.build(ref, device="meta"))
    experts = [layer.experts for layer in spec.layers]
    assert [e is not None for e in experts] == [layer.kind == "block" for layer in spec.layers]
    block = next(e for e in experts if e is not None)
    # E experts of gate, up and down (3 H F each); a token's two experts; the router's input width
    assert (block.experts, block.top_k, block.hidden, block.tokens_per_sample) == (E, 2, H, SEQ)
    assert block.routed_params == E * 3 * H * F
    assert block.routed_flops_per_token == 2 * 2 * 3 * H * F
    assert block.imbalance == 1.15
    balanced = measure.measure(source.build(ref + "&expert_imbalance=1", device="meta"))
    assert {layer.experts.imbalance for layer in balanced.layers if layer.experts} == {1.0}
    assert {layer.experts.routing for layer in balanced.layers if layer.experts} == {"uniform"}
    rr = measure.measure(source.build(ref + "&expert_routing=round-robin", device="meta"))
    assert {layer.experts.routing for layer in rr.layers if layer.experts} == {"round-robin"}
    dense = measure.measure(source.build(f"hf:llama?{SHAPE}&vocab_size=256&seq_len={SEQ}", device="meta"))
    assert all(layer.experts is None for layer in dense.layers)


def test_an_imbalance_or_routing_on_a_dense_model_or_out_of_range_is_refused_in_one_line():
    import pytest

    from paraplan.errors import FieldError

    with pytest.raises(FieldError, match="no routed experts"):
        measure.measure(source.build(f"hf:llama?{SHAPE}&vocab_size=256&expert_imbalance=1.1", device="meta"))
    with pytest.raises(FieldError, match="no routed experts to route"):
        measure.measure(source.build(f"hf:llama?{SHAPE}&vocab_size=256&expert_routing=round-robin", device="meta"))
    with pytest.raises(FieldError, match="one of uniform, round-robin"):
        source.build(f"hf:mixtral?{SHAPE}&num_local_experts={E}&expert_routing=zigzag", device="meta")
    with pytest.raises(FieldError, match="at least 1"):
        source.build(f"hf:mixtral?{SHAPE}&num_local_experts={E}&num_experts_per_tok=2&expert_imbalance=0.5",
                     device="meta")


def test_mfu_counts_the_parameters_a_token_runs_through():
    """A mixture of experts' 6*N counts its top-k routed experts, not all E (Megatron-LM's FLOP count)."""
    from paraplan.costs.model_flops import active_params

    ref = f"hf:mixtral?{SHAPE}&num_local_experts={E}&num_experts_per_tok=2&vocab_size=256&seq_len={SEQ}"
    spec = measure.measure(source.build(ref, device="meta"))
    routed = 2 * E * 3 * H * F  # two MoE blocks
    assert active_params(spec) == spec.param_count - routed * (1 - 2 / E)
    dense = measure.measure(source.build(f"hf:llama?{SHAPE}&vocab_size=256&seq_len={SEQ}", device="meta"))
    assert active_params(dense) == dense.param_count
