"""Cut real transformers models into an ordered list of layers that compose back to the model.

Each adapter returns `[(name, kind, module), ...]` such that applying the modules in order to the
model's input gives the model's logits (tests/unit/test_decompose.py checks this against the
library's own forward on every tiny model). The wrappers pass each block exactly what the
library's model would (a causal mask, rotary embeddings, T5's relative position bias), so a stage
built from a slice of this list computes what the same slice of the real model computes.

Module paths move between transformers versions (ViT's blocks moved from `encoder.layer` to
`layers`); `_first_attr` looks them up by the known paths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from paraplan.models.fx_cut import sequential_layers

Layers = list[tuple[str, str, nn.Module]]


def _first_attr(obj: object, *paths: str):
    for path in paths:
        cur = obj
        try:
            for part in path.split("."):
                cur = getattr(cur, part)
        except AttributeError:
            continue
        if cur is not None:
            return cur
    raise AttributeError(f"{type(obj).__name__} has none of {paths}")


def only_tensor(out):
    """Library blocks return a tensor or a tuple whose first element is the hidden states."""
    return out[0] if isinstance(out, (tuple, list)) else out


def causal_mask(seq_len: int, like: torch.Tensor) -> torch.Tensor:
    """Additive (1, 1, S, S) mask: 0 on and below the diagonal, dtype-min above (as transformers)."""
    full = torch.full((seq_len, seq_len), torch.finfo(like.dtype).min, dtype=like.dtype, device=like.device)
    return full.triu(1)[None, None]


class Unregistered:
    """Holds a module without registering it as a submodule, so a tied or shared module owned by
    another layer is neither counted twice nor moved twice (its owner layer carries it)."""

    def __init__(self, module: nn.Module):
        self.module = module


# --------------------------------------------------------------------------- decoder-only LMs
class GPT2Embedding(nn.Module):
    def __init__(self, wte: nn.Module, wpe: nn.Module, drop: nn.Module):
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
        return self.drop(self.wte(input_ids) + self.wpe(positions))


class CausalBlock(nn.Module):
    """A decoder block that builds its own causal mask (and rotary embeddings for Llama)."""

    def __init__(self, block: nn.Module, rotary: nn.Module | None = None):
        super().__init__()
        self.block = block
        self._rotary = Unregistered(rotary) if rotary is not None else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        seq_len = hidden.shape[1]
        mask = causal_mask(seq_len, hidden)
        kwargs = {}
        if self._rotary is not None:
            positions = torch.arange(seq_len, device=hidden.device)[None]
            kwargs["position_ids"] = positions
            kwargs["position_embeddings"] = self._rotary.module(hidden, positions)
        return only_tensor(self.block(hidden, attention_mask=mask, **kwargs))


class Head(nn.Module):
    """Final norm then the output projection (an LM head tied to the embedding, or a classifier)."""

    def __init__(self, norm: nn.Module, proj: nn.Module, select: Callable | None = None):
        super().__init__()
        self.norm, self.proj = norm, proj
        self._select = select

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(hidden)
        if self._select is not None:
            hidden = self._select(hidden)
        return self.proj(hidden)


class PlainBlock(nn.Module):
    """An encoder block that needs no mask (BERT, ViT, ...); unwraps tuple outputs."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return only_tensor(self.block(hidden))


def gpt2_layers(model: nn.Module) -> Layers:
    tr = model.transformer
    layers: Layers = [("embedding", "embedding", GPT2Embedding(tr.wte, tr.wpe, tr.drop))]
    layers += [(f"block{i}", "block", CausalBlock(b)) for i, b in enumerate(tr.h)]
    layers.append(("head", "head", Head(tr.ln_f, model.lm_head)))
    return layers


def llama_layers(model: nn.Module) -> Layers:
    inner = model.model
    layers: Layers = [("embedding", "embedding", inner.embed_tokens)]
    layers += [(f"block{i}", "block", CausalBlock(b, inner.rotary_emb)) for i, b in enumerate(inner.layers)]
    layers.append(("head", "head", Head(inner.norm, model.lm_head)))
    return layers


# --------------------------------------------------------------------------- encoders
def bert_layers(model: nn.Module) -> Layers:
    bert = model.bert
    blocks = _first_attr(bert, "encoder.layer", "layers", "encoder.layers")
    layers: Layers = [("embedding", "embedding", bert.embeddings)]
    layers += [(f"block{i}", "block", PlainBlock(b)) for i, b in enumerate(blocks)]
    layers.append(("head", "head", model.cls))
    return layers


def vit_layers(model: nn.Module) -> Layers:
    vit = model.vit
    blocks = _first_attr(vit, "layers", "encoder.layer", "encoder.layers")
    layers: Layers = [("embedding", "embedding", vit.embeddings)]
    layers += [(f"block{i}", "block", PlainBlock(b)) for i, b in enumerate(blocks)]
    layers.append(("head", "head", Head(vit.layernorm, model.classifier, select=_cls_token)))
    return layers


def _cls_token(hidden: torch.Tensor) -> torch.Tensor:
    return hidden[:, 0, :]


# --------------------------------------------------------------------------- Swin
class SwinEmbedding(nn.Module):
    def __init__(self, embeddings: nn.Module):
        super().__init__()
        self.embeddings = embeddings

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return only_tensor(self.embeddings(pixels))


class SwinSpatial(nn.Module):
    """A Swin block or patch-merging step at a fixed input resolution (known from the config)."""

    def __init__(self, module: nn.Module, resolution: tuple[int, int]):
        super().__init__()
        self.module = module
        self.resolution = resolution

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return only_tensor(self.module(hidden, self.resolution))


def _pool_tokens(hidden: torch.Tensor) -> torch.Tensor:
    return torch.flatten(nn.functional.adaptive_avg_pool1d(hidden.transpose(1, 2), 1), 1)


def swin_layers(model: nn.Module) -> Layers:
    swin = model.swin
    resolution = tuple(swin.embeddings.patch_grid)
    layers: Layers = [("embedding", "embedding", SwinEmbedding(swin.embeddings))]
    for s, stage in enumerate(swin.encoder.layers):
        for b, block in enumerate(stage.blocks):
            layers.append((f"stage{s}.block{b}", "block", SwinSpatial(block, resolution)))
        if stage.downsample is not None:
            layers.append((f"stage{s}.merge", "downsample", SwinSpatial(stage.downsample, resolution)))
            resolution = ((resolution[0] + 1) // 2, (resolution[1] + 1) // 2)
    layers.append(("head", "head", Head(swin.layernorm, model.classifier, select=_pool_tokens)))
    return layers


# --------------------------------------------------------------------------- ResNet
def resnet_layers(model: nn.Module) -> Layers:
    net = model.resnet
    layers: Layers = [("stem", "conv", net.embedder)]
    for s, stage in enumerate(net.encoder.stages):
        for b, block in enumerate(stage.layers):
            layers.append((f"stage{s}.block{b}", "block", block))
    layers.append(("head", "head", nn.Sequential(net.pooler, model.classifier)))
    return layers


# --------------------------------------------------------------------------- T5
class T5EncoderEmbedding(nn.Module):
    """(encoder ids, decoder ids) -> (encoder hidden, decoder ids): the decoder ids ride along to
    the decoder embedding, so every layer has one input and one output."""

    def __init__(self, embed: nn.Module, dropout: nn.Module):
        super().__init__()
        self.embed, self.dropout = embed, dropout

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        encoder_ids, decoder_ids = inputs
        return self.dropout(self.embed(encoder_ids)), decoder_ids


class T5Layer(nn.Module):
    """One T5 block. Block 0 of each stack owns the relative-attention-bias table; later blocks
    recompute the bias from it (cheap) instead of carrying an (heads x S x S) tensor across cuts."""

    def __init__(self, block: nn.Module, bias_owner: nn.Module | None, decoder: bool):
        super().__init__()
        self.block = block
        self._bias_owner = Unregistered(bias_owner) if bias_owner is not None else None
        self.decoder = decoder

    def _self_attention_bias(self, hidden: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        seq_len = hidden.shape[1]
        mask = causal_mask(seq_len, hidden) if self.decoder else None
        if self._bias_owner is None:  # block 0 computes the bias itself and adds the mask
            return mask, None
        bias = self._bias_owner.module.compute_bias(seq_len, seq_len, device=hidden.device).to(hidden.dtype)
        return mask, bias if mask is None else bias + mask

    def forward(self, inputs):
        if self.decoder:
            encoder_hidden, hidden = inputs
        else:
            hidden, decoder_ids = inputs
        mask, bias = self._self_attention_bias(hidden)
        kwargs = {"encoder_hidden_states": encoder_hidden} if self.decoder else {}
        out = only_tensor(self.block(hidden, attention_mask=mask, position_bias=bias, **kwargs))
        return (encoder_hidden, out) if self.decoder else (out, decoder_ids)


class T5DecoderEmbedding(nn.Module):
    """Encoder final norm, then the decoder embedding: (enc hidden, dec ids) -> (enc out, dec hidden)."""

    def __init__(self, encoder_norm: nn.Module, encoder_dropout: nn.Module, embed: nn.Module, dropout: nn.Module):
        super().__init__()
        self.encoder_norm, self.encoder_dropout = encoder_norm, encoder_dropout
        self._embed = Unregistered(embed)  # the shared embedding, owned by the first layer
        self.dropout = dropout

    def forward(self, inputs):
        encoder_hidden, decoder_ids = inputs
        encoder_out = self.encoder_dropout(self.encoder_norm(encoder_hidden))
        return encoder_out, self.dropout(self._embed.module(decoder_ids))


class T5Head(nn.Module):
    def __init__(self, norm: nn.Module, dropout: nn.Module, lm_head: nn.Module, scale: float | None):
        super().__init__()
        self.norm, self.dropout, self.lm_head = norm, dropout, lm_head
        self.scale = scale

    def forward(self, inputs):
        _, hidden = inputs
        hidden = self.dropout(self.norm(hidden))
        if self.scale is not None:
            hidden = hidden * self.scale
        return self.lm_head(hidden)


def t5_layers(model: nn.Module) -> Layers:
    enc, dec = model.encoder, model.decoder
    layers: Layers = [("encoder.embedding", "embedding", T5EncoderEmbedding(model.shared, enc.dropout))]
    enc_owner = enc.block[0].layer[0].SelfAttention
    for i, block in enumerate(enc.block):
        layers.append((f"encoder.block{i}", "block", T5Layer(block, None if i == 0 else enc_owner, decoder=False)))
    layers.append(("decoder.embedding", "embedding",
                   T5DecoderEmbedding(enc.final_layer_norm, enc.dropout, model.shared, dec.dropout)))
    dec_owner = dec.block[0].layer[0].SelfAttention
    for i, block in enumerate(dec.block):
        layers.append((f"decoder.block{i}", "block", T5Layer(block, None if i == 0 else dec_owner, decoder=True)))
    scale = model.model_dim ** -0.5 if getattr(model.config, "scale_decoder_outputs",
                                               model.config.tie_word_embeddings) else None
    layers.append(("head", "head", T5Head(dec.final_layer_norm, dec.dropout, model.lm_head, scale)))
    return layers


ADAPTERS: dict[str, Callable[[nn.Module], Layers]] = {
    "gpt2": gpt2_layers,
    "llama": llama_layers,
    "bert": bert_layers,
    "vit": vit_layers,
    "swin": swin_layers,
    "resnet": resnet_layers,
    "t5": t5_layers,
    "sequential": sequential_layers,
}


def decompose(model: nn.Module, family: str | None = None) -> Layers:
    """The ordered layer list by a hand-written adapter: the zoo's family, an nn.Sequential, or a
    transformers model whose config's model_type has an adapter. Any other model is cut through
    models/source.py (BuiltModel.layers: the generic transformers cut or a torch.fx trace)."""
    if family is None:
        if isinstance(model, nn.Sequential):
            family = "sequential"
        else:
            family = getattr(getattr(model, "config", None), "model_type", None)
    if family not in ADAPTERS:
        raise ValueError(f"no hand-written adapter for {type(model).__name__}; build it with "
                         "paraplan.models.source.build to cut it generically")
    return ADAPTERS[family](model)
