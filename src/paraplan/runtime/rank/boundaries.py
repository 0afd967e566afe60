"""The tensors that cross between layers, for the kinds that send them with their own messages
(Bi-Partition's workers, plain stages of unequal width): a receiver allocates its buffer from them."""

from __future__ import annotations

import torch


def boundary_shapes(built, layers, micro: int) -> list[tuple[torch.Size, torch.dtype]]:
    """(shape, dtype) of x_0 .. x_L for one micro-batch, by running the layers on meta."""
    inputs, _ = built.batch(micro, device="meta")
    x = inputs
    out = [(x.shape, x.dtype)]
    with torch.no_grad():
        for _, _, m in layers:
            x = m(x)
            if not isinstance(x, torch.Tensor):
                raise ValueError("the model's layers must pass one tensor to the next")
            out.append((x.shape, x.dtype))
    return out
