"""The runtime's mixed-precision recipe (a plan's `precision`, precision.py), one definition for
every plan kind and for the single-process reference it is checked against.

  fp32  as the papers ran.
  tf32  fp32 storage, tf32 matmuls: torch.backends' allow_tf32 on a GPU; on the CPU the same as fp32.
  bf16  fp32 master weights, gradients and optimizer states, the forward in bf16:
          - layers that are not sharded (pipeline stages, DP, ZeRO-1/2, TP): `torch.autocast` around
            the whole step (the schedule's forwards and backwards): one autocast region, so its
            weight cache keeps one bf16 copy of each weight for every micro-batch in flight
            (costs/strategy.py: LayerMemory.copy_bytes). The backward runs inside that region on
            purpose: autocast does not change the backward (its ops take the dtypes the forward
            saved; checked here: gradients bit-identical inside and outside the region);
          - SDP layers (FSDP2): `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`, the
            field's recipe (torchtitan's default): weights gathered in bf16, floating inputs cast
            to bf16, gradients reduce-scattered and accumulated in fp32. Autocast is on around
            them too; it changes nothing for weights that are already bf16.
        The reference runs the same recipe per layer (`reference_layer`): autocast for the whole
        step, and an SDP layer computes with bf16 copies of its weights and inputs, as FSDP2 does.
  fp16  planned, not run: fp16 needs a loss scaler whose overflow check all ranks share (a
        GradScaler reduced over every group); the runtime refuses it in one line (`refusal`).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from paraplan.precision import Precision

RUNS = (Precision.FP32, Precision.TF32, Precision.BF16)


def refusal(precision: str) -> str | None:
    """Why the runtime cannot train in `precision` (one line), or None."""
    if precision in RUNS:
        return None
    return (f"precision {precision}: the runtime trains {', '.join(p.value for p in RUNS)}; fp16 needs a loss "
            f"scaler shared by every rank, which it does not have (plan in fp16, train in bf16)")


def compute_dtype(precision: str) -> torch.dtype | None:
    """The low-precision dtype the forward computes in, or None (fp32 / tf32)."""
    return torch.bfloat16 if precision == Precision.BF16 else None


@contextlib.contextmanager
def step_context(precision: str, device: torch.device):
    """Around one step's forwards and backwards (and the loss): autocast in bf16; tf32 matmuls on a
    GPU for tf32."""
    dtype = compute_dtype(precision)
    if dtype is not None:
        with torch.autocast(device.type, dtype=dtype):
            yield
        return
    if precision == Precision.TF32 and device.type == "cuda":
        before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        return
    yield


def fsdp_policy(precision: str):
    """FSDP2's mixed-precision policy for an SDP layer: bf16 weights and inputs, fp32 reductions."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = compute_dtype(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


class _LowPrecisionLayer(nn.Module):
    """One process's stand-in for an FSDP2 layer under `fsdp_policy`: the forward computes with a
    `dtype` copy of every parameter (the copy's backward turns the gradient back into fp32) and its
    floating inputs cast to `dtype`, as FSDP2's param_dtype and cast_forward_inputs do."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.layer, self.dtype = layer, dtype

    def forward(self, *args):
        from torch.func import functional_call

        cast = {name: p.to(self.dtype) for name, p in self.layer.named_parameters(remove_duplicate=False)}
        return functional_call(self.layer, cast, _cast_floats(args, self.dtype), tie_weights=False)


def _cast_floats(value, dtype: torch.dtype):
    """Every floating tensor in `value` (tensors, tuples, lists) in `dtype`, as FSDP2 casts inputs."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_floats(v, dtype) for v in value)
    return value


def reference_layer(layer: nn.Module, precision: str, sharded: bool) -> nn.Module:
    """`layer` as the single-process reference runs it under the plan's recipe for that layer."""
    dtype = compute_dtype(precision)
    return _LowPrecisionLayer(layer, dtype) if sharded and dtype is not None else layer
