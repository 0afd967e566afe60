"""Named builders of real models: the five papers' models plus tiny variants for CPU runs.

Every builder returns a real `nn.Module` (transformers' classes for the transformer families and
ResNet, `paraplan.models.cnn` for the CNNs transformers lacks) and the InputSpec of one sample.
`build(name, device="meta")` makes it without allocating weights, in seconds even for GPT-3 175B.

Sizes come from the papers; where a paper's table disagrees with the published model, the
published model wins and the entry's `note` says so.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from paraplan.errors import FieldError, ParaplanError, UnknownNameError
from paraplan.models import cnn, nasnet
from paraplan.models.built import BuiltModel
from paraplan.models.spec import InputSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str  # the decomposition adapter: gpt2 | llama | bert | vit | swin | resnet | t5 | sequential
    source: str  # which paper uses it, with what sizes
    build: Callable[[InputSpec], nn.Module]
    inputs: InputSpec
    tiny: bool = False
    note: str = ""
    # a transformers model this entry names (an hf: reference): built through models/hf.py, cut by its
    # generic recipe (models/hf_cut.py), as `hf:` references are; the mixtures of experts (issue 50)
    hf: str = ""


# --------------------------------------------------------------------------- transformers builders
def quiet():
    """transformers warns on meta-device construction of big configs; keep the CLI output clean."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    return contextlib.redirect_stderr(io.StringIO())


def _gpt2(layers: int, hidden: int, heads: int, vocab: int = 50257, positions: int = 1024):
    def build(inputs: InputSpec) -> nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab,
                         n_positions=max(positions, inputs.seq_len), attn_implementation="sdpa",
                         bos_token_id=0, eos_token_id=0)
        return GPT2LMHeadModel(cfg)
    return build


def _llama(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, tied: bool,
           rope_theta: float = 10000.0):
    def build(inputs: InputSpec) -> nn.Module:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, intermediate_size=ffn, vocab_size=vocab,
                          tie_word_embeddings=tied, rope_theta=rope_theta,
                          rms_norm_eps=1e-5,  # Meta's Llama 2 / 3 configs (transformers' default is 1e-6)
                          max_position_embeddings=max(4096, inputs.seq_len), attn_implementation="sdpa",
                          bos_token_id=0, eos_token_id=0, pad_token_id=None)
        return LlamaForCausalLM(cfg)
    return build


def _bert(layers: int, hidden: int, heads: int, ffn: int, vocab: int = 30522):
    def build(inputs: InputSpec) -> nn.Module:
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         intermediate_size=ffn, vocab_size=vocab,
                         max_position_embeddings=max(512, inputs.seq_len), attn_implementation="sdpa")
        return BertForMaskedLM(cfg)
    return build


def _vit(layers: int, hidden: int, heads: int, ffn: int, patch: int):
    def build(inputs: InputSpec) -> nn.Module:
        from transformers import ViTConfig, ViTForImageClassification

        cfg = ViTConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=ffn, patch_size=patch, image_size=inputs.image_size,
                        num_labels=inputs.num_classes, attn_implementation="sdpa")
        return ViTForImageClassification(cfg)
    return build


def _swin(depths: tuple[int, ...], embed: int, heads: tuple[int, ...], window: int, patch: int = 4):
    def build(inputs: InputSpec) -> nn.Module:
        from transformers import SwinConfig, SwinForImageClassification

        cfg = SwinConfig(depths=list(depths), embed_dim=embed, num_heads=list(heads), window_size=window,
                         patch_size=patch, image_size=inputs.image_size, num_labels=inputs.num_classes)
        return SwinForImageClassification(cfg)
    return build


def _t5(layers_each: int, d_model: int, d_kv: int, ffn: int, heads: int, vocab: int = 32128):
    def build(inputs: InputSpec) -> nn.Module:
        from transformers import T5Config, T5ForConditionalGeneration

        cfg = T5Config(num_layers=layers_each, num_decoder_layers=layers_each, d_model=d_model, d_kv=d_kv,
                       d_ff=ffn, num_heads=heads, vocab_size=vocab, decoder_start_token_id=0,
                       attn_implementation="sdpa")
        return T5ForConditionalGeneration(cfg)
    return build


def _resnet(depths: tuple[int, ...], hidden: tuple[int, ...], embedding: int = 64):
    def build(inputs: InputSpec) -> nn.Module:
        from transformers import ResNetConfig, ResNetForImageClassification

        cfg = ResNetConfig(depths=list(depths), hidden_sizes=list(hidden), embedding_size=embedding,
                           layer_type="bottleneck", num_labels=inputs.num_classes)
        return ResNetForImageClassification(cfg)
    return build


def _tokens(seq: int, vocab: int) -> InputSpec:
    return InputSpec(kind="tokens", seq_len=seq, vocab_size=vocab)


def _image(size: int, classes: int = 1000, channels: int = 3) -> InputSpec:
    return InputSpec(kind="image", image_size=size, channels=channels, num_classes=classes)


def _seq2seq(enc: int, dec: int, vocab: int = 32128) -> InputSpec:
    return InputSpec(kind="seq2seq", seq_len=enc, decoder_seq_len=dec, vocab_size=vocab)


def _via_hf(inputs: InputSpec) -> nn.Module:
    raise AssertionError("an hf entry is built by models/source.py")  # never called: `build` refuses it


def _moe(name: str, source: str, hf: str, seq: int, vocab: int, tiny: bool = False) -> ZooEntry:
    """A mixture of experts by its transformers config (`hf`, the sequence length added)."""
    return ZooEntry(name, "hf", source, _via_hf, _tokens(seq, vocab), tiny=tiny, hf=f"{hf}&seq_len={seq}")


# --------------------------------------------------------------------------- the zoo
_ENTRIES: list[ZooEntry] = [
    # CSIMD Table V (batch-size DP dimension: seq 64 for GPT-2, 32 for Llama; token dimension: 1024)
    ZooEntry("gpt2-large", "gpt2", "CSIMD Table V: 36 layers, d 1280, 20 heads, S=64",
             _gpt2(36, 1280, 20), _tokens(64, 50257)),
    ZooEntry("gpt2-xl", "gpt2", "CSIMD Table V: 48 layers, d 1600, 25 heads, S=64",
             _gpt2(48, 1600, 25), _tokens(64, 50257)),
    ZooEntry("llama3.2-3b", "llama", "CSIMD Table V: 28 layers, d 3072, S=32",
             _llama(28, 3072, 24, 8, 8192, 128256, tied=True, rope_theta=500000.0), _tokens(32, 128256),
             note="Table V lists 32 heads; the published Llama 3.2 3B has 24 query heads (8 KV heads), used here"),
    ZooEntry("llama2-7b", "llama", "CSIMD Table V: 32 layers, d 4096, 32 heads, S=32",
             _llama(32, 4096, 32, 32, 11008, 32000, tied=False), _tokens(32, 32000)),
    # not in CSIMD's table: the size between (issue 31's bound grid), Touvron et al. 2023 Table 2's
    # 13B shape (40 layers, d 5120, 40 heads without grouped-query attention, FFN 13,824)
    ZooEntry("llama2-13b", "llama", "Llama 2 13B shape (Touvron et al. 2023): 40 layers, d 5120, 40 heads, S=1024",
             _llama(40, 5120, 40, 40, 13824, 32000, tied=False), _tokens(1024, 32000)),
    ZooEntry("llama2-70b", "llama", "CSIMD Table V: 80 layers, d 8192, 64 heads, S=1024",
             _llama(80, 8192, 64, 8, 28672, 32000, tied=False), _tokens(1024, 32000)),
    # Llama 3.1 at its pre-training context of 8,192 tokens (Dubey et al. 2024, "The Llama 3 Herd of
    # Models", Table 3: layers, model dimension, FFN dimension, heads, 8 key/value heads, vocabulary
    # 128,256, RoPE base 500,000; untied embeddings), the shapes of today's published runs
    # (torchtitan's Llama 3.1 benchmarks, Megatron-LM's model zoo)
    ZooEntry("llama3.1-8b", "llama", "Llama 3.1 8B (Dubey et al. 2024, Table 3): 32 layers, d 4096, 32 heads, S=8192",
             _llama(32, 4096, 32, 8, 14336, 128256, tied=False, rope_theta=500000.0), _tokens(8192, 128256)),
    ZooEntry("llama3.1-70b", "llama", "Llama 3.1 70B (Dubey et al. 2024, Table 3): 80 layers, d 8192, 64 heads, "
                                      "S=8192",
             _llama(80, 8192, 64, 8, 28672, 128256, tied=False, rope_theta=500000.0), _tokens(8192, 128256)),
    ZooEntry("llama3.1-405b", "llama", "Llama 3.1 405B (Dubey et al. 2024, Table 3): 126 layers, d 16384, 128 heads, "
                                       "S=8192",
             _llama(126, 16384, 128, 8, 53248, 128256, tied=False, rope_theta=500000.0), _tokens(8192, 128256)),
    ZooEntry("gpt3-175b", "gpt2", "CSIMD Table V: 96 layers, d 12288, 96 heads, S=1024 (GPT-style config)",
             _gpt2(96, 12288, 96, positions=2048), _tokens(1024, 50257)),
    # Galvatron-BMW Table I (seq 512; images 224)
    ZooEntry("bert-huge-32", "bert", "Galvatron Table I: 32 layers, hidden 1280, 672M, seq 512",
             _bert(32, 1280, 16, 5120), _tokens(512, 30522)),
    ZooEntry("bert-huge-48", "bert", "Galvatron Table I: 48 layers, hidden 1280, 987M, seq 512",
             _bert(48, 1280, 16, 5120), _tokens(512, 30522)),
    ZooEntry("vit-huge-32", "vit", "Galvatron Table I: 32 layers, hidden 1280, 632M, 224x224, patch 16",
             _vit(32, 1280, 16, 5120, 16), _image(224)),
    ZooEntry("vit-huge-48", "vit", "Galvatron Table I: 48 layers, hidden 1280, 947M, 224x224, patch 16",
             _vit(48, 1280, 16, 5120, 16), _image(224)),
    ZooEntry("t5-large-32", "t5", "Galvatron Table I: 16 enc + 16 dec, d 1024, 502M, seq 512/512",
             _t5(16, 1024, 64, 4096, 16), _seq2seq(512, 512)),
    ZooEntry("t5-large-48", "t5", "Galvatron Table I: 24 enc + 24 dec, d 1024, 737M, seq 512/512",
             _t5(24, 1024, 64, 4096, 16), _seq2seq(512, 512)),
    ZooEntry("t5-512-4-32", "t5", "Galvatron Table I: T5-512/4-32, 16 enc + 16 dec, encoder seq 512, decoder seq 4",
             _t5(16, 1024, 64, 4096, 16), _seq2seq(512, 4)),
    ZooEntry("t5-512-4-48", "t5", "Galvatron Table I: T5-512/4-48, 24 enc + 24 dec, encoder seq 512, decoder seq 4",
             _t5(24, 1024, 64, 4096, 16), _seq2seq(512, 4)),
    ZooEntry("swin-huge-32", "swin", "Galvatron Table I: depths 2/2/26/2, dims 320..2560, 701M, 224x224",
             _swin((2, 2, 26, 2), 320, (10, 20, 40, 80), 7), _image(224)),
    ZooEntry("swin-huge-48", "swin", "Galvatron Table I: depths 2/2/42/2, dims 320..2560, 1016M, 224x224",
             _swin((2, 2, 42, 2), 320, (10, 20, 40, 80), 7), _image(224)),
    # GroPipe Table VI/VII (ImageNet 224x224)
    ZooEntry("resnet-50", "resnet", "GroPipe: ResNet-50 on ImageNet", _resnet((3, 4, 6, 3), (256, 512, 1024, 2048)),
             _image(224)),
    ZooEntry("resnet-101", "resnet", "GroPipe: ResNet-101 on ImageNet",
             _resnet((3, 4, 23, 3), (256, 512, 1024, 2048)), _image(224)),
    ZooEntry("resnet-152", "resnet", "GroPipe: ResNet-152 on ImageNet",
             _resnet((3, 8, 36, 3), (256, 512, 1024, 2048)), _image(224)),
    ZooEntry("vgg-16", "sequential", "GroPipe, CSIMD (1 GbE / 10 GbE), Bi-Partition: VGG-16",
             lambda i: cnn.vgg(16, i.num_classes), _image(224)),
    ZooEntry("vgg-19", "sequential", "GroPipe: VGG-19 on ImageNet", lambda i: cnn.vgg(19, i.num_classes),
             _image(224)),
    # Bi-Partition Fig. 8
    ZooEntry("alexnet", "sequential", "Bi-Partition: AlexNet (61M)", lambda i: cnn.alexnet(i.num_classes),
             _image(224)),
    ZooEntry("lenet-5", "sequential", "Bi-Partition: LeNet-5 on MNIST (60K)", lambda i: cnn.lenet5(i.num_classes),
             _image(32, 10, channels=1)),
    # FD-DPS Table 3 (CIFAR-10, TF-Slim models): the Inception/NASNet family's representative
    ZooEntry("nasnet-large", "sequential", "NASNet-A-like, FD-DPS Table 3 NasNet_large on CIFAR-10 32x32",
             lambda i: nasnet.nasnet(6, 168, i.num_classes, i.image_size, i.channels), _image(32, 10),
             note="NASNet-A large cells (N=6, 168 filters, 6 @ 4032) with the CIFAR stem; image_size >= 100 "
                  "switches to the ImageNet stem (331: 88.7M parameters with 1000 classes vs the published 88.9M); "
                  "no auxiliary head, no drop-path"),
    # mixtures of experts (issue 50), the published shapes: transformers' configs with their sizes
    _moe("deepseek-v3", "DeepSeek-V3 671B (DeepSeek-AI 2024): 61 layers (the first 3 dense, FFN 18432), d 7168, "
         "128 heads with MLA (q 1536 / kv 512), 256 routed experts of FFN 2048 + 1 shared, top-8 in 8 groups top-4, "
         "S=4096", "hf:deepseek_v3?max_position_embeddings=4096", 4096, 129280),
    _moe("qwen3-30b-a3b", "Qwen3-30B-A3B (Qwen 2025): 48 layers, d 2048, 32 / 4 heads of 128, 128 experts of FFN 768, "
         "top-8, S=4096", "hf:qwen3_moe?num_hidden_layers=48&hidden_size=2048&num_attention_heads=32"
         "&num_key_value_heads=4&head_dim=128&num_local_experts=128&moe_intermediate_size=768&num_experts_per_tok=8"
         "&vocab_size=151936", 4096, 151936),
    _moe("mixtral-8x22b", "Mixtral 8x22B (Mistral AI 2024): 56 layers, d 6144, 48 / 8 heads, 8 experts of FFN "
         "16384, top-2, S=4096", "hf:mixtral?num_hidden_layers=56&hidden_size=6144&intermediate_size=16384"
         "&num_attention_heads=48&num_key_value_heads=8&num_local_experts=8&num_experts_per_tok=2&vocab_size=32768"
         "&max_position_embeddings=4096", 4096, 32768),
    _moe("gpt-oss-120b", "gpt-oss-120B (OpenAI 2025): 36 layers, d 2880, 64 / 8 heads of 64, 128 experts of FFN "
         "2880, top-4, alternating 128-token sliding windows, S=4096", "hf:gpt_oss?num_hidden_layers=36", 4096,
         201088),
    _moe("mixtral-tiny", "tiny Mixtral for CPU runs: 2 blocks of 4 experts, top-2",
         "hf:mixtral?num_hidden_layers=2&hidden_size=64&intermediate_size=128&num_attention_heads=4"
         "&num_key_value_heads=2&num_local_experts=4&num_experts_per_tok=2&vocab_size=256", 32, 256, tiny=True),
    _moe("deepseek-v3-tiny", "tiny DeepSeek-V3 for CPU runs: 3 blocks (the first dense), MLA, 8 routed experts + 1 "
         "shared, top-2 in 4 groups top-2", "hf:deepseek_v3?num_hidden_layers=3&hidden_size=64&intermediate_size=128"
         "&moe_intermediate_size=32&num_attention_heads=4&num_key_value_heads=4&q_lora_rank=32&kv_lora_rank=16"
         "&qk_rope_head_dim=8&qk_nope_head_dim=8&v_head_dim=16&head_dim=8&n_routed_experts=8&n_shared_experts=1"
         "&num_experts_per_tok=2&n_group=4&topk_group=2&first_k_dense_replace=1&vocab_size=256", 32, 256, tiny=True),
    # tiny variants: real runs on a CPU
    ZooEntry("gpt2-tiny", "gpt2", "tiny GPT-2 for CPU runs", _gpt2(4, 64, 4, vocab=512, positions=128),
             _tokens(32, 512), tiny=True),
    ZooEntry("llama-tiny", "llama", "tiny Llama for CPU runs", _llama(4, 64, 4, 2, 128, 512, tied=False),
             _tokens(32, 512), tiny=True),
    ZooEntry("bert-tiny", "bert", "tiny BERT for CPU runs", _bert(4, 64, 4, 256, vocab=512), _tokens(32, 512),
             tiny=True),
    ZooEntry("vit-tiny", "vit", "tiny ViT for CPU runs", _vit(4, 64, 4, 128, 8), _image(32, 10), tiny=True),
    ZooEntry("t5-tiny", "t5", "tiny T5 for CPU runs", _t5(2, 64, 16, 128, 4, vocab=512), _seq2seq(32, 8, 512),
             tiny=True),
    ZooEntry("swin-tiny", "swin", "tiny Swin for CPU runs (not Swin-T)", _swin((1, 1, 2, 1), 16, (1, 2, 4, 8), 4, patch=2),
             _image(64, 10), tiny=True),
    ZooEntry("resnet-tiny", "resnet", "tiny ResNet for CPU runs", _resnet((1, 1, 1, 1), (16, 32, 64, 128), 16),
             _image(64, 10), tiny=True),
    ZooEntry("vgg-tiny", "sequential", "VGG-16 with 1/16 of the channels, for CPU runs",
             lambda i: cnn.vgg(16, i.num_classes, width_divisor=16), _image(32, 10), tiny=True),
    ZooEntry("alexnet-tiny", "sequential", "AlexNet with 1/8 of the channels, for CPU runs",
             lambda i: cnn.alexnet(i.num_classes, width_divisor=8), _image(64, 10), tiny=True),
    ZooEntry("nasnet-tiny", "sequential", "NASNet-A-like with N=1 and 8 filters, for CPU runs",
             lambda i: nasnet.nasnet(1, 8, i.num_classes, i.image_size, i.channels), _image(32, 10), tiny=True),
]
# CSIMD Table III self-designed CNNs, K = 8..19 layers (the paper's range), 1x100x100 MNIST inputs.
for _k in range(8, 20):
    _ENTRIES.append(ZooEntry(f"csimd-cnn-{_k}", "sequential",
                             f"CSIMD Table III: {_k - 1} conv layers with U(20,50) channels + FC, 1x100x100",
                             (lambda k: lambda i: cnn.csimd_cnn(k, i.image_size, i.num_classes))(_k),
                             _image(100, 10, channels=1)))
_ENTRIES.append(ZooEntry("csimd-cnn-tiny", "sequential", "CSIMD Table III CNN with 5 layers on 1x28x28, for CPU runs",
                         lambda i: cnn.csimd_cnn(5, i.image_size, i.num_classes), _image(28, 10, channels=1),
                         tiny=True))

ZOO: dict[str, ZooEntry] = {e.name: e for e in _ENTRIES}
ALIASES = {"t5-512/4-32": "t5-512-4-32", "t5-512/4-48": "t5-512-4-48", "lenet5": "lenet-5",
           "gpt-3-175b": "gpt3-175b"}


def entry(name: str) -> ZooEntry:
    key = ALIASES.get(name, name)
    if key not in ZOO:
        raise UnknownNameError("model", name, list(ZOO))
    return ZOO[key]


def with_sizes(inputs: InputSpec, seq_len: int | None = None, image_size: int | None = None) -> InputSpec:
    """The entry's inputs with a user's sequence length or image size."""
    from dataclasses import replace

    if seq_len is not None:
        if seq_len <= 0:
            raise ParaplanError(f"sequence length must be positive, got {seq_len}")
        if inputs.kind == "image":
            raise FieldError("seq_len", "applies to language models, not image models")
        inputs = replace(inputs, seq_len=seq_len)
    if image_size is not None:
        if image_size <= 0:
            raise ParaplanError(f"image size must be positive, got {image_size}")
        if inputs.kind != "image":
            raise FieldError("image_size", "applies to image models")
        inputs = replace(inputs, image_size=image_size)
    return inputs


def build(name: str, device: str | torch.device = "meta", seq_len: int | None = None,
          image_size: int | None = None, seed: int = 0) -> BuiltModel:
    """Build a zoo model. On "meta" no weights are allocated; elsewhere they are seeded."""
    e = entry(name)
    if e.hf:  # models/source.py builds it as its hf: reference (this module may not import that one)
        raise ParaplanError(f"{name} is a transformers config ({e.hf}): build it with models/source.py")
    inputs = with_sizes(e.inputs, seq_len, image_size)
    torch.manual_seed(seed)
    with quiet(), torch.device(device):
        module = e.build(inputs)
    return BuiltModel(name=e.name, family=e.family, module=module, inputs=inputs, ref=e.name)


def names(include_tiny: bool = True) -> list[str]:
    return [e.name for e in _ENTRIES if include_tiny or not e.tiny]
