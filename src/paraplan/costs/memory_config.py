"""How bytes are counted per parameter and per activation (costs/memory.py, costs/strategy.py)."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True)
class MemoryConfig:
    state_bytes_per_param: float = 16.0  # fp32 Adam; mixed precision with fp32 master weights: 16 too
    param_bytes_per_param: float = 4.0  # the weights alone (what a weight stash copies)
    activation_scale: float = 1.0  # measured in fp32; 0.5 for fp16/bf16 activations
    reserve_bytes: int = GIB // 2
