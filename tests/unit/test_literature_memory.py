"""The activation and state memory of costs/transformer_memory.py against the literature's own
figures, written from the papers (issue 29, item 6), not from paraplan's outputs.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models": §4's
closed forms (their Table 2) applied to two of their Table 3 configurations, per GPU on the first
pipeline stage, embeddings excluded as in the paper. ZeRO (Rajbhandari et al. 2020), Fig. 1:
Ψ = 7.5B parameters over N_d = 64 data-parallel ranks, decimal gigabytes.
"""

import pytest

from paraplan.costs.transformer_memory import (
    TransformerShape,
    activation_tensors,
    interleaved_factor,
    korthikanti_table2,
    layer_activation_bytes,
    logits_bytes,
    state_bytes_per_param,
)

GIB = 2**30
WITHIN = 0.03  # the tolerance for the literature's figures

# Korthikanti et al. Table 3: 22B: h 6144, a 64, 48 layers, TP 8, PP 1, micro-batch 4, seq 2048;
# 175B (GPT-3): h 12288, a 96, 96 layers, TP 8, PP 8, interleaved x3, micro-batch 1, seq 2048
GPT_22B = dict(hidden=6144, heads=64, layers=48, tp=8, pp=1, micro=4)
GPT_175B = dict(hidden=12288, heads=96, layers=96, tp=8, pp=8, virtual=3, micro=1)
SEQ = 2048


def _first_stage_activations(cfg, sequence_parallel: bool, recompute: str) -> float:
    """L layers' worth on the first stage of 1F1B (L/p layers x p micro-batches in flight, §4.2.3),
    times the interleaved schedule's factor."""
    shape = TransformerShape(hidden=cfg["hidden"], heads=cfg["heads"], seq_len=SEQ)
    per_layer = layer_activation_bytes(shape, cfg["micro"], element_bytes=2, tp=cfg["tp"],
                                       sequence_parallel=sequence_parallel, recompute=recompute,
                                       include_statistics=False)
    return per_layer * cfg["layers"] * interleaved_factor(cfg["pp"], cfg.get("virtual", 1))


@pytest.mark.parametrize("cfg, sp, recompute, expected_gib", [
    (GPT_22B, False, "none", 59.25),  # TP only
    (GPT_22B, True, "selective", 9.56),  # sequence parallel + selective recomputation
    (GPT_175B, False, "none", 66.84),
    (GPT_175B, True, "selective", 12.35),
])
def test_korthikanti_table3_activations_on_the_first_stage(cfg, sp, recompute, expected_gib):
    got = _first_stage_activations(cfg, sp, recompute) / GIB
    assert got == pytest.approx(expected_gib, rel=WITHIN)


@pytest.mark.parametrize("bytes_per_param, expected_gib", [(18, 45.56), (16, 40.50)])
def test_korthikanti_22b_states_per_gpu(bytes_per_param, expected_gib):
    """22B over TP 8: the layers' parameters (12h² + 13h each: QKV, projection, two MLP linears with
    biases, two layer norms), 1/8 per GPU, at Megatron's 18 bytes (fp32 gradients) or ZeRO's 16."""
    h, layers = GPT_22B["hidden"], GPT_22B["layers"]
    per_gpu = (12 * h * h + 13 * h) * layers / GPT_22B["tp"]
    states = state_bytes_per_param(mixed=True, fp32_gradients=bytes_per_param == 18)
    assert states.total == bytes_per_param
    assert per_gpu * states.total / GIB == pytest.approx(expected_gib, rel=WITHIN)


def test_the_layer_parameters_are_those_of_a_real_gpt_block():
    """12h² + 13h is what a transformers GPT-2 block holds (built on meta, no weights)."""
    import torch
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    h = 96
    with torch.device("meta"):
        block = GPT2Block(GPT2Config(n_embd=h, n_head=4, n_inner=None))
    assert sum(p.numel() for p in block.parameters()) == 12 * h * h + 13 * h


@pytest.mark.parametrize("zero_stage, expected_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure_1(zero_stage, expected_gb):
    psi, n_d = 7.5e9, 64
    states = state_bytes_per_param(mixed=True, zero_stage=zero_stage, data_parallel=n_d)
    assert psi * states.total / 1e9 == pytest.approx(expected_gb, rel=WITHIN)


@pytest.mark.parametrize("form, tp, sp, recompute", [
    ("none", 1, False, "none"), ("tensor", 8, False, "none"), ("tensor+sequence", 8, True, "none"),
    ("tensor+selective", 8, False, "selective"), ("tensor+sequence+selective", 4, True, "selective"),
    ("full", 1, False, "full"),
])
@pytest.mark.parametrize("s, b, h, a", [(2048, 4, 6144, 64), (512, 3, 1024, 16), (4096, 1, 12288, 96)])
def test_the_tensor_inventory_sums_to_table_2(form, tp, sp, recompute, s, b, h, a):
    """Every form of Table 2, on shapes of several sizes: the inventory tensor by tensor (without
    the norms' statistics, which the paper leaves out) equals the printed closed form."""
    shape = TransformerShape(hidden=h, heads=a, seq_len=s)
    got = layer_activation_bytes(shape, b, 2, tp, sp, recompute, include_statistics=False)
    assert got == pytest.approx(korthikanti_table2(s, b, h, a, tp, form), rel=1e-12)


def test_the_paper_leaves_out_under_a_hundredth_of_a_percent():
    shape = TransformerShape(hidden=6144, heads=64, seq_len=2048)
    with_stats = layer_activation_bytes(shape, 4, tp=8)
    without = layer_activation_bytes(shape, 4, tp=8, include_statistics=False)
    assert 0 < with_stats / without - 1 < 1e-4


def test_llama_layers_by_tensor():
    """Llama-2-7B's layer (h 4096, 32 heads, MHA, SwiGLU 11008, RMSNorm, no dropout) with SDPA:
    no s x s tensor at all; eager attention adds exactly the 2as²b softmax output (no dropout, so
    no mask and no second copy); grouped-query attention shrinks K and V by kv_heads / heads."""
    s, b, h, a, ffn = 4096, 1, 4096, 32, 11008
    sdpa = TransformerShape(hidden=h, heads=a, seq_len=s, ffn=ffn, mlp="swiglu", norm="rmsnorm", dropout=False,
                            attention="sdpa")
    eager = TransformerShape(hidden=h, heads=a, seq_len=s, ffn=ffn, mlp="swiglu", norm="rmsnorm", dropout=False)
    sbh = s * b * h
    # norms' inputs 4, QKV input 2, Q K V 6, kernel output 2, projection input 2, MLP input 2
    # (18sbh), 4 x 2sb·ffn of SwiGLU, fp32 rstd 2 x 4sb, log-sum-exp 4asb
    expected = 18 * sbh + 8 * s * b * ffn + 8 * s * b + 4 * a * s * b
    assert layer_activation_bytes(sdpa, b) == expected
    no_kernel = expected - 2 * sbh - 4 * a * s * b
    assert layer_activation_bytes(eager, b) == no_kernel + 2 * a * s * s * b
    gqa = TransformerShape(hidden=h, heads=a, kv_heads=8, seq_len=s, ffn=ffn, mlp="swiglu", norm="rmsnorm",
                           dropout=False, attention="sdpa")
    assert layer_activation_bytes(sdpa, b) - layer_activation_bytes(gqa, b) == 2 * 2 * sbh * (1 - 8 / 32)
    assert {t.name for t in activation_tensors(sdpa, b)}.isdisjoint({"softmax output", "softmax dropout mask"})


def test_logits_of_a_large_vocabulary():
    """Issue 29: fp32 logits of a 152k vocabulary at 4,096 tokens are ~2.5 GB per sequence."""
    assert logits_bytes(4096, 152064, element_bytes=2) - logits_bytes(4096, 152064, 2, fp32_loss=False) == \
        pytest.approx(2.5e9, rel=WITHIN)


def test_bad_shapes_and_choices_are_refused():
    with pytest.raises(ValueError, match="attention"):
        TransformerShape(hidden=64, heads=4, seq_len=8, attention="flashy")
    with pytest.raises(ValueError, match="do not divide"):
        TransformerShape(hidden=64, heads=5, seq_len=8)
    with pytest.raises(ValueError, match="recompute"):
        activation_tensors(TransformerShape(hidden=64, heads=4, seq_len=8), 1, recompute="some")
    with pytest.raises(ValueError, match="zero_stage"):
        state_bytes_per_param(True, zero_stage=4)
