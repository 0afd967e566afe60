"""Every zoo model builds on meta, decomposes, and has the parameter count its paper states."""

import functools

import pytest

from paraplan.errors import ParaplanError, UnknownNameError
from paraplan.models import measure, source, zoo

# (model, published parameter count, relative tolerance)
PAPER_PARAMS = [
    ("gpt2-xl", 1.56e9, 0.01),  # CSIMD Table V
    ("gpt2-large", 774e6, 0.01),  # CSIMD Table V
    ("llama2-7b", 6.74e9, 0.01),  # Llama 2 paper
    ("llama2-70b", 68.98e9, 0.01),
    ("llama3.2-3b", 3.21e9, 0.01),
    ("gpt3-175b", 175e9, 0.01),
    ("bert-huge-32", 672e6, 0.03),  # Galvatron Table I
    ("bert-huge-48", 987e6, 0.03),
    ("vit-huge-32", 632e6, 0.03),
    ("vit-huge-48", 947e6, 0.03),
    ("t5-large-32", 502e6, 0.03),
    ("t5-large-48", 737e6, 0.03),
    ("swin-huge-32", 701e6, 0.03),
    ("swin-huge-48", 1016e6, 0.03),
    ("resnet-50", 25.56e6, 0.01),  # torchvision / He et al.
    ("resnet-101", 44.55e6, 0.01),
    ("resnet-152", 60.19e6, 0.01),
    ("vgg-16", 138.36e6, 0.01),
    ("vgg-19", 143.67e6, 0.01),
    ("alexnet", 61.10e6, 0.01),
    ("lenet-5", 61706, 0.001),
    # Llama 3.1 (Dubey et al. 2024, Table 3; the published checkpoints: 8.03B, 70.6B, 405.9B)
    ("llama3.1-8b", 8.03e9, 0.01),
    ("llama3.1-70b", 70.55e9, 0.01),
    ("llama3.1-405b", 405.85e9, 0.01),
    # mixtures of experts (issue 50), every expert counted: DeepSeek-V3's report (671B without its MTP
    # module), Qwen3's (30.5B), Mistral's (141B), OpenAI's gpt-oss model card (116.8B)
    ("deepseek-v3", 671e9, 0.01),
    ("qwen3-30b-a3b", 30.5e9, 0.01),
    ("mixtral-8x22b", 141e9, 0.01),
    ("gpt-oss-120b", 116.8e9, 0.01),
]


@functools.cache
def _built(name: str):
    """Each model built on meta once for this file's tests (the largest take seconds); through
    models/source.py, which builds the zoo's hf entries too (zoo.build refuses those)."""
    return source.build(name, device="meta")


@pytest.mark.parametrize("name,expected,tol", PAPER_PARAMS)
def test_parameter_counts_match_the_papers(name, expected, tol):
    built = _built(name)
    params = sum(p.numel() for p in built.module.parameters())
    assert abs(params - expected) / expected < tol, f"{name}: {params} vs {expected}"


@pytest.mark.parametrize("name", zoo.names())
def test_every_model_builds_on_meta_and_decomposes(name):
    built = _built(name)
    assert all(p.device.type == "meta" for p in built.module.parameters())
    spec = measure.measure(built)
    assert spec.n_layers >= 3
    assert spec.param_count == sum(p.numel() for p in built.module.parameters())
    for layer in spec.layers:
        assert layer.output_bytes.per_sample > 0, layer.name
    # all but lookups do arithmetic, and every layer that computes also has a backward
    assert sum(layer.forward_flops.per_sample > 0 for layer in spec.layers) >= spec.n_layers - 2
    assert all(layer.backward_flops.per_sample > 0 for layer in spec.layers if layer.forward_flops.per_sample > 0
               and layer.param_count > 0)


def test_gpt3_has_96_blocks_plus_embedding_and_head():
    spec = measure.measure(zoo.build("gpt3-175b"))
    kinds = [layer.kind for layer in spec.layers]
    assert kinds == ["embedding"] + ["block"] * 96 + ["head"]


def test_csimd_cnn_follows_table_iii():
    for k in range(8, 20):
        spec = measure.measure(zoo.build(f"csimd-cnn-{k}"))
        assert [layer.kind for layer in spec.layers] == ["conv"] * (k - 1) + ["fc"]
    module = zoo.build("csimd-cnn-12").module
    channels = [block[0].out_channels for block in list(module.children())[:-1]]
    assert all(20 <= c <= 50 for c in channels)


def test_unknown_model_suggests_close_names():
    with pytest.raises(UnknownNameError, match="did you mean gpt2-xl"):
        zoo.entry("gpt2-xxl")


def test_bad_sizes_are_input_errors():
    with pytest.raises(ParaplanError):
        zoo.build("gpt2-tiny", seq_len=0)
    with pytest.raises(ParaplanError):
        zoo.build("gpt2-tiny", image_size=32)


def test_aliases_resolve():
    assert zoo.entry("t5-512/4-32").name == "t5-512-4-32"
