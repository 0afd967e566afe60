"""A mixture-of-experts model's experts, described (issue 50 item 1): per block, how many routed
experts, how many each token runs through, the parameters of one routed expert, of the shared
experts and of the router, and group-limited routing; and the model's attention kind.

Read from the built module's structure, not from its class, so every family transformers 5.x has
is described alike (models/moe_check.py finds the MoE parts the same way): a block's MoE part
holds an `experts` module whose parameters carry the expert count as their leading dimension
(transformers 5's fused `gate_up_proj` / `down_proj` of shape [E, ...]) or a list of expert
modules (older code), a `gate` or `router`, and, in DeepSeek and Qwen2-MoE, `shared_experts` /
`shared_expert` (with Qwen2-MoE's `shared_expert_gate`). The config gives top-k and the groups.

Why the counts and not measured FLOPs: a layer measured on the meta device runs every expert (or
none: the routing is data-dependent), where a token runs through top-k of E. The forward FLOPs of
a token through an MoE part are 2 x the weights it multiplies (Megatron-LM's
`num_floating_point_operations`, which counts routed top-k plus shared experts the same way):
top-k routed experts, every shared expert and the router. Biases are memory, not FLOPs here.

`layer_experts` hands each measured layer its routed experts (models/spec.py: LayerExperts), which
the expert costs read (costs/expert_costs.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from paraplan.models.moe_check import EXPERT_COUNTS, TOP_K, config_int, is_moe_part
from paraplan.models.spec import DEFAULT_EXPERT_IMBALANCE, LayerExperts

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_ROUTER_NAMES = ("gate", "router")
_SHARED_NAMES = ("shared_experts", "shared_expert", "shared_expert_gate")


@dataclass(frozen=True)
class ExpertBlock:
    """One transformer block's MoE part. `*_weights`: parameters of 2-D and larger tensors (what a
    token multiplies), `*_params`: every parameter (biases too: what memory holds)."""

    block: int  # the block's index among the decoder's blocks
    experts: int  # E: routed experts
    top_k: int  # routed experts each token runs through
    expert_params: int  # one routed expert's parameters
    expert_weights: int
    shared_params: int  # every shared expert (and its gate), run by every token
    shared_weights: int
    router_params: int
    router_weights: int
    groups: int = 1  # group-limited routing (DeepSeek-V3): experts in `groups` groups ...
    topk_groups: int = 0  # ... of which a token reaches at most this many (0: not limited)

    @property
    def routed_params(self) -> int:
        return self.experts * self.expert_params

    @property
    def params(self) -> int:
        """Every parameter of the MoE part: routed, shared and router."""
        return self.routed_params + self.shared_params + self.router_params

    @property
    def forward_flops_per_token(self) -> int:
        """2 x the weights a token multiplies: top-k routed experts, the shared ones, the router."""
        return 2 * (self.top_k * self.expert_weights + self.shared_weights + self.router_weights)

    @property
    def all_experts_forward_flops_per_token(self) -> int:
        """The same if every token ran through every expert: what a dense pricing of the layer counts."""
        return 2 * (self.experts * self.expert_weights + self.shared_weights + self.router_weights)


@dataclass(frozen=True)
class MoeSpec:
    blocks: tuple[ExpertBlock, ...]  # the MoE blocks only, in order (dense blocks among them are absent)
    n_blocks: int  # every decoder block, dense ones included
    attention: str  # "mla" (compressed KV, DeepSeek), "gqa" (fewer KV heads than heads) or "mha"

    @property
    def dense_blocks(self) -> tuple[int, ...]:
        moe = {b.block for b in self.blocks}
        return tuple(i for i in range(self.n_blocks) if i not in moe)


def _count(module: nn.Module | None) -> tuple[int, int]:
    """(every parameter, the parameters of tensors of 2 or more dimensions)."""
    if module is None:
        return 0, 0
    params = list(module.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.dim() >= 2)


def _experts(experts: nn.Module) -> tuple[int, int, int]:
    """(E, one expert's parameters, one expert's weights) of an `experts` module."""
    if isinstance(experts, nn.ModuleList):
        total, weights = _count(experts)
        return len(experts), total // len(experts), weights // len(experts)
    stacked = [p for p in experts.parameters(recurse=False)]
    if not stacked:
        raise ValueError(f"{type(experts).__name__}: no expert parameters to count")
    count = stacked[0].shape[0]
    if any(p.shape[0] != count for p in stacked):
        raise ValueError(f"{type(experts).__name__}: expert parameters of different leading sizes")
    total, weights = _count(experts)
    # a fused [E, in, out] weight is 2-D per expert; an [E, out] bias is 1-D per expert
    per_weights = sum(p.numel() for p in stacked if p.dim() >= 3) // count
    return count, total // count, per_weights if per_weights else weights // count


def _child(module: nn.Module, names: tuple[str, ...]) -> list[nn.Module]:
    return [getattr(module, n) for n in names if isinstance(getattr(module, n, None), nn.Module)]


def moe_parts(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of each block's MoE part: the outermost module holding an `experts` module."""
    outer: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():  # pre-order: a part comes before what it holds
        if is_moe_part(module) and isinstance(getattr(module, "experts", None), nn.Module) \
                and not any(name.startswith(kept + ".") for kept, _ in outer[-1:]):
            outer.append((name, module))
    return outer


def moe_spec(model: nn.Module) -> MoeSpec | None:
    """The model's experts (module docstring), or None for a dense model."""
    config = getattr(model, "config", None)
    top_k = config_int(config, TOP_K)
    outer = moe_parts(model)
    if not outer:
        return None
    blocks = []
    for name, part in outer:
        where = _LAYER_INDEX.search(name)
        if where is None:
            raise ValueError(f"{name}: an MoE part outside the decoder's blocks")
        experts, expert_params, expert_weights = _experts(part.experts)
        said = config_int(config, EXPERT_COUNTS)
        if said is not None and said != experts:  # the structure and the config must agree
            raise ValueError(f"{name}: {experts} experts built where the config says {said}")
        if not top_k:
            raise ValueError(f"its config gives no top-k (num_experts_per_tok) for its {experts} experts: set it")
        if top_k > experts:
            raise ValueError(f"top-{top_k} of {experts} experts")
        shared = [_count(m) for m in _child(part, _SHARED_NAMES)]
        router = [_count(m) for m in _child(part, _ROUTER_NAMES)]
        groups = config_int(config, ("n_group",)) or 1
        blocks.append(ExpertBlock(
            block=int(where.group(1)), experts=experts, top_k=top_k, expert_params=expert_params,
            expert_weights=expert_weights, shared_params=sum(s[0] for s in shared),
            shared_weights=sum(s[1] for s in shared), router_params=sum(r[0] for r in router),
            router_weights=sum(r[1] for r in router), groups=groups,
            topk_groups=(config_int(config, ("topk_group",)) or 0) if groups > 1 else 0))
    n_blocks = config_int(config, ("num_hidden_layers",)) or (max(b.block for b in blocks) + 1)
    return MoeSpec(blocks=tuple(blocks), n_blocks=n_blocks, attention=_attention(config))


def _attention(config) -> str:
    if config_int(config, ("kv_lora_rank",)):
        return "mla"
    heads, kv = config_int(config, ("num_attention_heads",)), config_int(config, ("num_key_value_heads",))
    return "gqa" if heads and kv and kv < heads else "mha"


def layer_experts(model: nn.Module, layers: list[nn.Module], tokens_per_sample: int,
                  imbalance: float = DEFAULT_EXPERT_IMBALANCE,
                  capacity_factor: float | None = None, routing: str = "uniform") -> list[LayerExperts | None]:
    """Each of `layers` (the model's cut, in order) with the routed experts its MoE parts hold, or
    None for a layer without any. A token's width is the router's input (its weight is [E, h])."""
    spec = moe_spec(model)
    if spec is None:
        return [None] * len(layers)
    by_part = {id(part): block for (_, part), block in zip(moe_parts(model), spec.blocks, strict=True)}
    out: list[LayerExperts | None] = []
    for layer in layers:
        blocks = [by_part[id(m)] for m in layer.modules() if id(m) in by_part]
        if not blocks:
            out.append(None)
            continue
        first = blocks[0]
        hidden = first.router_weights // first.experts if first.router_weights else \
            config_int(getattr(model, "config", None), ("hidden_size",)) or 0
        out.append(LayerExperts(
            experts=first.experts, top_k=first.top_k, routed_params=sum(b.routed_params for b in blocks),
            routed_flops_per_token=float(sum(2 * b.top_k * b.expert_weights for b in blocks)),
            shared_flops_per_token=float(sum(2 * b.shared_weights for b in blocks)), hidden=hidden,
            tokens_per_sample=tokens_per_sample, groups=first.groups, topk_groups=first.topk_groups,
            imbalance=imbalance, capacity_factor=capacity_factor, routing=routing))
    return out
