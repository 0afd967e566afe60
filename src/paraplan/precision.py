"""The numeric precision a plan trains in, and what each costs in bytes and in peak FLOP/s.

fp32   fp32 storage and fp32 matmuls (the papers' testbeds, and PyTorch's default for matmuls
       since 1.12: torch.backends.cuda.matmul.allow_tf32 = False).
tf32   fp32 storage, matmuls on TF32 tensor cores (torch.set_float32_matmul_precision("high")):
       the bytes of fp32, the peak of TF32.
bf16   mixed precision: bf16 parameters and activations for compute, fp32 master weights and fp32
       optimizer states (Micikevicius et al. 2018; ZeRO §3.1's (2 + 2 + 12) bytes per parameter).
fp16   the same with fp16, and loss scaling (torch.amp.GradScaler) against gradient underflow.
fp8    bf16 mixed precision whose linear layers run their three GEMMs (forward, input gradient,
       weight gradient) on FP8 tensor cores (e4m3 forward, e4m3 / e5m2 backward), each input cast
       with a scale by the plan's recipe (`FP8_RECIPES`); attention, norms, activations, the router
       and everything else stay bf16, as torchao's Float8Linear (torchtitan) and Transformer Engine
       (Megatron-LM) run them. Parameters, master weights and optimizer states as bf16's
       (costs/fp8_linear.py prices the GEMMs and casts, costs/memory_config.py the FP8 copies).

A device's peak is given per dtype (hardware/cluster.py: DeviceSpec.peak_for); a device without a
dtype (no bf16 before Ampere) refuses a plan in it.
"""

from __future__ import annotations

from enum import StrEnum


class Precision(StrEnum):
    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"


PRECISIONS = tuple(p.value for p in Precision)

# How an FP8 plan scales what it casts (the plan's `fp8_recipe`); each names what the engines call it:
#   tensorwise  one scale per tensor from its current amax (torchao "tensorwise", Megatron-LM
#               `--fp8-recipe tensorwise`): an amax pass before every cast
#   delayed     one scale per tensor from the amax of earlier steps (Transformer Engine's
#               DelayedScaling, Megatron-LM's default `--fp8-recipe delayed`; NeMo's and MLPerf's H100
#               runs): the cast takes the amax as it goes, no pass of its own
#   rowwise     one scale per row (torchao / torchtitan 0.3.0 "rowwise"): the weight and the backward's
#               operands cast again along the other dimension
#   blockwise   1 x 128 activation and 128 x 128 weight tiles (DeepSeek-V3's recipe; Megatron-LM
#               `--fp8-recipe blockwise` on Hopper)
#   mxfp8       32-element blocks with e8m0 scales (OCP MX), on Blackwell only (torchtitan's MXFP8
#               converter, Megatron-LM `--fp8-recipe mxfp8`)
FP8_RECIPES = ("tensorwise", "delayed", "rowwise", "blockwise", "mxfp8")
DEFAULT_FP8_RECIPE = "tensorwise"
# a device with an `fp8` peak (Hopper, Ada) runs every recipe but mxfp8, which needs its own
# `mxfp8` peak (Blackwell): hardware/cluster.py DeviceSpec.fp8_gemm_peak
# peak_flops keys a device may give: the precisions' dtypes, and MX FP8 (Blackwell's block-scaled GEMM)
PEAK_DTYPES = (*PRECISIONS, "mxfp8")


def parse_precision(value: str) -> Precision:
    """The precision named `value`; an unknown name raises ValueError naming the choices."""
    try:
        return Precision(value)
    except ValueError:
        raise ValueError(f"unknown precision {value!r}; expected one of {', '.join(PRECISIONS)}") from None


def is_mixed(precision: str) -> bool:
    """Low-precision compute copies beside fp32 master weights."""
    return precision in (Precision.BF16, Precision.FP16, Precision.FP8)


def compute_precision(precision: str) -> Precision:
    """The precision everything but an FP8 plan's linear GEMMs runs in: bf16 for fp8, else itself
    (what a layer is measured in, the dtype of its activations, parameters and collectives)."""
    return Precision.BF16 if precision == Precision.FP8 else Precision(precision)


def fp8_recipe_problem(precision: str, recipe: str) -> str | None:
    """Why `recipe` cannot go with `precision`, or None: an FP8 plan names one of FP8_RECIPES,
    any other plan none."""
    if precision != Precision.FP8:
        return f"an fp8 recipe ({recipe!r}) needs precision fp8, not {precision}" if recipe else None
    if recipe not in FP8_RECIPES:
        return f"unknown fp8 recipe {recipe!r}; expected one of {', '.join(FP8_RECIPES)}"
    return None


def fp8_param_gather_problem(precision: str, fp8_param_gather: bool) -> str | None:
    """Why parameters cannot be gathered in FP8 under `precision` (only an fp8 plan's can), or None."""
    if fp8_param_gather and precision != Precision.FP8:
        return f"parameters gathered in FP8 need precision fp8, not {precision}"
    return None


def element_bytes(precision: str) -> int:
    """Bytes of one activation or compute-weight element: 2 in mixed precision, else 4."""
    return 2 if is_mixed(precision) else 4
