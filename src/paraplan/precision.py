"""The numeric precision a plan trains in, and what each costs in bytes and in peak FLOP/s.

fp32   fp32 storage and fp32 matmuls (the papers' testbeds, and PyTorch's default for matmuls
       since 1.12: torch.backends.cuda.matmul.allow_tf32 = False).
tf32   fp32 storage, matmuls on TF32 tensor cores (torch.set_float32_matmul_precision("high")):
       the bytes of fp32, the peak of TF32.
bf16   mixed precision: bf16 parameters and activations for compute, fp32 master weights and fp32
       optimizer states (Micikevicius et al. 2018; ZeRO §3.1's (2 + 2 + 12) bytes per parameter).
fp16   the same with fp16, and loss scaling (torch.amp.GradScaler) against gradient underflow.

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


PRECISIONS = tuple(p.value for p in Precision)


def parse_precision(value: str) -> Precision:
    """The precision named `value`; an unknown name raises ValueError naming the choices."""
    try:
        return Precision(value)
    except ValueError:
        raise ValueError(f"unknown precision {value!r}; expected one of {', '.join(PRECISIONS)}") from None


def is_mixed(precision: str) -> bool:
    """Low-precision compute copies beside fp32 master weights."""
    return precision in (Precision.BF16, Precision.FP16)


def element_bytes(precision: str) -> int:
    """Bytes of one activation or compute-weight element: 2 in mixed precision, else 4."""
    return 2 if is_mixed(precision) else 4
