"""Autocast's casts on the meta device, for measuring a mixed-precision layer (models/measure.py).

Autocast does not act on meta tensors, so `Autocast16` does its work one level up, where autograd
sees it: the floating inputs of the ops autocast runs in 16 bits (its lower-precision list, common
to the CPU and CUDA: linear, matmul and the mm family, convolutions, scaled-dot-product attention,
einsum) are cast first. CUDA's autocast also runs softmax, log-softmax and the norms in fp32
whatever their input; that list is not emulated.
"""

from __future__ import annotations

import torch


class Autocast16(torch.overrides.TorchFunctionMode):
    """Autocast's casts, made where autograd records them (it works on meta, autocast does not)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype
        f = torch.nn.functional
        self.lower = {f.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
                      torch.mm, torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm,
                      torch.baddbmm, torch.Tensor.baddbmm, torch.addbmm, torch.Tensor.addbmm, f.conv1d, f.conv2d,
                      f.conv3d, f.conv_transpose1d, f.conv_transpose2d, f.conv_transpose3d,
                      f.scaled_dot_product_attention, torch.einsum, f.prelu}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.lower:
            args, kwargs = self._cast(args), {k: self._cast(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)

    def _cast(self, value):
        if isinstance(value, torch.Tensor):
            return value.to(self.dtype) if value.dtype == torch.float32 else value
        if isinstance(value, (tuple, list)):
            return type(value)(self._cast(v) for v in value)
        return value
