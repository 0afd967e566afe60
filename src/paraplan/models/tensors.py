"""Walking the tensors inside a layer's input or output (a tensor, or nested tuples of them)."""

from __future__ import annotations

import torch


def tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []


def nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in tensors(value))


def float_nbytes(value) -> int:
    """Bytes of the floating-point tensors only (what carries a gradient)."""
    return sum(t.numel() * t.element_size() for t in tensors(value) if t.is_floating_point())
