"""Scaled-dot-product attention as the measurement sees it (models/measure.py): the attention core
aten shows (`AttentionCore`: the s x s softmax and the matmuls around it, which a checkpoint of the
core would recompute), and SDPA as the run's kernel keeps it (`SdpaKernel`): "fused" (a GPU's flash /
memory-efficient kernels, which keep q, k, v, the output and one fp32 log-sum-exp per row, never the
s x s probabilities: `FusedAttention` stands in for them on meta), "cpu" (PyTorch's CPU flash kernel
without dropout, else its math path), "math" (what meta measures; an eager attention's tensors).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ATTENTION = ("math", "fused", "cpu")

class AttentionCore(TorchDispatchMode):
    """Finds a layer's attention core as aten sees it: the sizes s of every softmax over a
    [..., s, s] tensor (the attention probabilities), and the matmuls that make such a tensor
    (QK^T) or take one (attention over V), with their FLOPs. A fused attention kernel (SDPA's
    flash or memory-efficient paths) shows no softmax: it keeps no s x s tensor to recompute."""

    _SOFTMAX = {"_softmax", "softmax", "_safe_softmax"}
    _MATMUL = {"bmm", "mm", "baddbmm", "addmm"}

    def __init__(self):
        super().__init__()
        self.sizes: set[int] = set()
        self.matmuls: list[tuple[tuple[int, ...], tuple[int, ...], float]] = []  # (first input, output, flops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if _FUSED[0]:
            return out
        if name in self._SOFTMAX and args[0].dim() >= 3 and args[0].shape[-1] == args[0].shape[-2]:
            self.sizes.add(int(args[0].shape[-1]))
        elif name in self._MATMUL and isinstance(out, torch.Tensor):
            a = args[1] if name in ("baddbmm", "addmm") else args[0]
            k = a.shape[-1]
            self.matmuls.append((tuple(a.shape), tuple(out.shape), 2.0 * out.numel() * k))
        return out

    def flops(self) -> float:
        def square(shape):
            return len(shape) >= 2 and shape[-1] == shape[-2] and shape[-1] in self.sizes

        return sum(f for a, out, f in self.matmuls if square(out) or square(a))

    def kept(self, shape: tuple[int, ...]) -> bool:
        return len(shape) >= 3 and shape[-1] == shape[-2] and shape[-1] in self.sizes


_FUSED = [0]  # > 0 while a fused attention runs its math inside (`FusedAttention`): not a core to find
# what listens for fused attention kernels (models/op_inventory.py: OpInventory while it records a pass)
ATTENTION_LISTENERS: list = []


def fused_running() -> bool:
    """True while a fused attention runs its math inside: those aten ops are the kernel's own."""
    return _FUSED[0] > 0


def _flash_flops(q: torch.Tensor, k: torch.Tensor, is_causal: bool) -> float:
    """The forward FLOPs a flash kernel does (Dao 2023, FlashAttention-2 §4.1's count): two matmuls of
    4 x batch x heads x s_q x s_kv x head dim, halved when causal (the kernel skips the masked blocks)."""
    *lead, s_q, d = q.shape
    flops = 4.0 * float(torch.Size(lead).numel()) * s_q * k.shape[-2] * d
    return flops / 2 if is_causal and s_q == k.shape[-2] else flops


def _notify(flops: float, nbytes: float) -> None:
    if ATTENTION_LISTENERS:
        ATTENTION_LISTENERS[-1].record_attention(flops, nbytes)


class FusedAttention(torch.autograd.Function):
    """PyTorch's scaled-dot-product attention as a GPU runs it (the flash and memory-efficient
    kernels): it keeps q, k, v, its output and one fp32 log-sum-exp per row, never the s x s
    probabilities, and its backward recomputes them. On meta SDPA takes its math path, which keeps
    them; this stands in for it when the plan's devices are GPUs."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa):
        _FUSED[0] += 1
        try:
            with torch.no_grad():
                out = torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)
        finally:
            _FUSED[0] -= 1
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        io = [t for t in (q, k, v, out, lse) if t is not None]
        _notify(_flash_flops(q, k, is_causal), sum(t.numel() * t.element_size() for t in io))
        ctx.save_for_backward(q, k, v, out, lse, *(() if mask is None else (mask,)))
        ctx.args = (dropout_p, is_causal, scale, enable_gqa)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out_, lse, *mask = ctx.saved_tensors
        dropout_p, is_causal, scale, enable_gqa = ctx.args
        # FlashAttention-2's backward: 5 matmuls to the forward's 2 (2.5 x its FLOPs); it reads q, k, v,
        # the output, its gradient and the log-sum-exp and writes dq, dk, dv
        io = (q, k, v, out_, lse, grad, q, k, v)
        _notify(2.5 * _flash_flops(q, k, is_causal), sum(t.numel() * t.element_size() for t in io))
        _FUSED[0] += 1
        try:
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
                out = torch.nn.functional.scaled_dot_product_attention(
                    *leaves, attn_mask=mask[0] if mask else None, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, enable_gqa=enable_gqa)
                grads = torch.autograd.grad(out, leaves, grad)
        finally:
            _FUSED[0] -= 1
        return (*grads, None, None, None, None, None)


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return FusedAttention.apply(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


class SdpaKernel(torch.overrides.TorchFunctionMode):
    """torch.nn.functional.scaled_dot_product_attention as the run's kernel keeps it: "fused"
    (a GPU's flash / memory-efficient kernels), "cpu" (PyTorch's CPU flash kernel when there is no
    dropout, else its math path, as observed here), "math" (what meta measures; an eager attention's
    tensors)."""

    def __init__(self, attention: str):
        super().__init__()
        self.attention = attention
        # while SDPA's math path runs: the ids of its inputs (q, k, v, mask); every other tensor it
        # saves is its attention core's (what a checkpoint around it would stop keeping)
        self.inputs: set[int] | None = None
        self.input_bytes = 0
        self._modules: list = []  # the modules running now, innermost last
        self._hooks: list = []

    def __enter__(self):
        # which module calls SDPA: a decoder's attention (`is_causal`) runs causal on a GPU, where
        # transformers drops the mask when nothing is padded and passes is_causal=True instead; on
        # meta it cannot tell that no token is padded and passes the mask
        from torch.nn.modules import module as nn_module

        def leave(module, args, output):
            self._modules.pop()  # a hook that returns something replaces the output

        self._hooks = [nn_module.register_module_forward_pre_hook(lambda m, a: self._modules.append(m)),
                       nn_module.register_module_forward_hook(leave, always_call=True)]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self._hooks:
            hook.remove()
        self._modules.clear()
        return super().__exit__(*exc)

    def _causal(self) -> bool:
        return bool(self._modules) and getattr(self._modules[-1], "is_causal", False) is True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
            if self.attention == "fused" or (self.attention == "cpu" and not dropout):
                if self._causal() and not kwargs.get("is_causal", len(args) > 5 and args[5]):
                    kwargs = {**kwargs, "is_causal": True, "attn_mask": None}
                    args = args[:3]
                return _fused_sdpa(*args, **kwargs)
            tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
            self.inputs = {id(t) for t in tensors}
            # a checkpoint around the attention keeps its inputs instead
            self.input_bytes += sum(t.numel() * t.element_size() for t in tensors)
            try:
                return func(*args, **kwargs)
            finally:
                self.inputs = None
        return func(*args, **kwargs)

    def in_core(self, base: torch.Tensor) -> bool:
        return self.inputs is not None and id(base) not in self.inputs
