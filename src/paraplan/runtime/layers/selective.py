"""Selective recomputation (Korthikanti et al. 2022, §5) of a layer's attention core: the attention
itself (QK^T, softmax, its dropout, attention over V) runs under a non-reentrant checkpoint, so
its s x s tensors are not kept for the backward but recomputed in it; the projections, MLP and
norms keep their tensors as usual. What the memory model takes off (LayerSpec.attention_core_bytes)
is what that checkpoint stops saving (models/measure.py finds it the same way: the tensors of the
ops between the projections).

How: transformers' attention modules call the function their config names
(`config._attn_implementation`: "sdpa", "eager", ...) through its `AttentionInterface`. Each
attention module of the layer gets its own copy of the config naming a registered wrapper that
runs the original function under `torch.utils.checkpoint` (the RNG state is preserved, so a
recomputed dropout mask is the forward's). Layers without such a module (embeddings, heads,
models not from transformers) have no attention core to recompute: selective changes nothing
there, as the memory model, which measured no core in them, predicts.
"""

from __future__ import annotations

import copy
import sys

from torch import nn

_PREFIX = "paraplan-selective:"


def _wrapped(implementation: str, eager):
    from torch.utils.checkpoint import checkpoint
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def selective(module, query, key, value, attention_mask, **kwargs):
        inner = eager if implementation == "eager" else ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)
        return checkpoint(inner, module, query, key, value, attention_mask, use_reentrant=False, **kwargs)

    return selective


def apply_selective(layer: nn.Module) -> int:
    """Recompute the attention core of every transformers attention module in `layer`; how many."""
    from transformers import AttentionInterface

    count = 0
    for module in layer.modules():
        config = getattr(module, "config", None)
        implementation = getattr(config, "_attn_implementation", None)
        if implementation is None or implementation.startswith(_PREFIX):
            continue
        # the model file's own eager attention (each transformers model defines one)
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            continue
        name = f"{_PREFIX}{type(module).__module__}:{implementation}"
        AttentionInterface.register(name, _wrapped(implementation, eager))
        own = copy.copy(config)
        own._attn_implementation = name
        module.config = own
        count += 1
    return count
