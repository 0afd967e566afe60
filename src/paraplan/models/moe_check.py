"""Mixture-of-experts models recognised by structure, not by class, so every family transformers
has (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, gpt-oss, Llama 4, ...) is caught without a list:
a module whose class name ends in Experts, Router or Moe/MoeBlock, or that holds an `experts`
submodule. A model whose configuration has experts but whose built layers have none (DeepSeek-V3
cut to its first dense blocks) is dense.

Until issue 50's model description an MoE model was refused here: transformers 5.x picks the
experts' kernel by the config's `experts_implementation` (`eager`, `batched_mm`, `grouped_mm`),
the grouped GEMM crashes on the meta device in fp32 ("Expected inputs of BF16 type") and the eager
one loops over data-dependent experts. models/moe_spec.py now describes such a model and
models/moe_static.py measures it on meta with its routed FLOPs; what is left here is recognising
one and saying in a few words what it has (`moe_summary`).
"""

from __future__ import annotations

import re

from torch import nn

_MOE_CLASS = re.compile(r"(Experts|Router|Moe|MoE|MoeBlock|MoEBlock|MoeLayer|MoELayer)$")
# the config fields that count routed experts and the experts each token runs through, by family
EXPERT_COUNTS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
TOP_K = ("num_experts_per_tok", "moe_top_k", "top_k")


def is_moe_part(module: nn.Module) -> bool:
    experts = getattr(module, "experts", None)
    return bool(_MOE_CLASS.search(type(module).__name__)) or isinstance(experts, nn.Module)


def config_int(config, names: tuple[str, ...]) -> int | None:
    for name in names:
        try:
            value = getattr(config, name, None)
        except Exception:  # configs with per-layer attributes raise on global access (heterogeneous configs)
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def moe_summary(model: nn.Module) -> str | None:
    """A few words on the model's experts ("MixtralSparseMoeBlock in 2 blocks: 8 routed experts,
    top-2"), or None for a dense model."""
    outer: list[tuple[str, nn.Module]] = []  # the outermost MoE parts (a block's router and experts are inside it)
    for name, module in model.named_modules():  # pre-order: a part comes before what it holds
        if is_moe_part(module) and not any(name.startswith(kept + ".") for kept, _ in outer[-1:]):
            outer.append((name, module))
    if not outer:
        return None
    names = sorted({type(m).__name__ for _, m in outer})
    config = getattr(model, "config", None)
    experts, top_k = config_int(config, EXPERT_COUNTS), config_int(config, TOP_K)
    detail = ", ".join(part for part in (f"{experts} routed experts" if experts else "",
                                         f"top-{top_k}" if top_k else "") if part)
    return f"{'/'.join(names)} in {len(outer)} blocks" + (f": {detail}" if detail else "")
