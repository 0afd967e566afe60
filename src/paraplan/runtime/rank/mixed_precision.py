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
  fp16  as bf16 in float16, with dynamic loss scaling (`LossScaler`: torch.amp.GradScaler's rule)
        whose overflow check every rank shares; the reference scales the same way.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from paraplan.precision import Precision

RUNS = (Precision.FP32, Precision.TF32, Precision.BF16, Precision.FP16)


def refusal(precision: str) -> str | None:
    """Why the runtime cannot train in `precision` (one line), or None."""
    if precision in RUNS:
        return None
    if precision == Precision.FP8:
        return ("precision fp8: FP8 GEMMs need Hopper-, Ada- or Blackwell-class GPUs and the engines' FP8 linears "
                "(torchao's Float8Linear, Transformer Engine), which paraplan's runtime does not run: export the plan "
                "(paraplan export --to torchtitan or --to megatron) to train it, or plan in bf16 to train here")
    return f"precision {precision}: the runtime trains {', '.join(p.value for p in RUNS)}"


def compute_dtype(precision: str) -> torch.dtype | None:
    """The low-precision dtype the forward computes in, or None (fp32 / tf32)."""
    return {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(precision)


class LossScaler:
    """fp16's dynamic loss scaling with torch.amp.GradScaler's defaults: the loss multiplied by the
    scale (2**16 at first) before the backward; after it the gradients divided back, and if any is
    inf or nan the step is skipped and the scale halved; after 2,000 good steps in a row it doubles.
    Ours, not GradScaler, because the overflow decision must be the same on every rank: a pipeline
    stage's or a replica's overflow skips everyone's step (one all-reduce of a flag over the world,
    as ShardedGradScaler does for FSDP alone). Off (scale 1, nothing checked) outside fp16."""

    def __init__(self, precision: str, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000):
        self.enabled = precision == Precision.FP16
        self.scale = init_scale if self.enabled else 1.0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good_steps = 0

    def unscale_and_check(self, grads, device=None) -> bool:
        """Divide `grads` by the scale in place; whether every rank's are finite (then: step)."""
        if not self.enabled:
            return True
        finite = True
        for g in grads:
            g.mul_(1.0 / self.scale)
            finite = finite and bool(torch.isfinite(g).all())
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([0.0 if finite else 1.0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            finite = float(flag) == 0.0
        if finite:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale, self.good_steps = self.scale * self.growth_factor, 0
        else:
            self.scale, self.good_steps = self.scale * self.backoff_factor, 0
        return finite


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
