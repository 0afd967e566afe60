"""The model states one rank keeps, per parameter, as each engine keeps them (issue 48, item 2: an
implementation profile per engine; this module is its states part, priced from the engines' own
documents and estimators, not from the ZeRO paper's lower bound).

The ZeRO paper (§3.1) counts 16 bytes per parameter in mixed precision (2 + 2 + 12) and shards them
by stage: `costs/transformer_memory.py: state_bytes_per_param`. The engines keep more:
  - Megatron-LM's distributed optimizer (megatron-core's user guide, "Distributed Optimizer"):
    bytes per parameter, d the data-parallel size: fp16 parameters and gradients 20 / 4 + 16/d;
    bf16 parameters and fp32 gradients 18 / 6 + 12/d; fp32 16 / 8 + 8/d (not distributed /
    distributed). The fp32 main weights and Adam's moments are always kept.
  - DeepSpeed (0.19.8, `estimate_zero2_model_states_mem_needs` and
    `estimate_zero3_model_states_mem_needs`, no offload): ZeRO-2 keeps 2 bytes of 16-bit
    parameters whole and 18 / N (16-bit and fp32 gradients, fp32 master weights, momentum and
    variance: its own comment's 2 + 4 + 4 + 8); ZeRO-3 keeps 18 / N and 4 bytes per parameter of
    its largest layer (the gathered layer). ZeRO-1 is not in its estimators: the same components
    with the 16-bit gradients whole, 2 + 2 + 16 / N (an assumption from the stage's definition).
  - FSDP2 with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (torchtitan, and
    paraplan's own runtime on its sdp layers): the fp32 parameters, their fp32 gradients and Adam's
    moments all sharded, 16 / N; the bf16 copies it gathers for a layer's compute are transient
    buffers, not states.
Each function answers the bytes per parameter on one rank, split as `StateBytes` (parameters,
gradients, optimizer) so that a memory breakdown can show them; multiply by the parameters the rank
holds after tensor and pipeline parallelism.
"""

from __future__ import annotations

from paraplan.costs.transformer_memory import StateBytes


def _ranks(data_parallel: int) -> int:
    if data_parallel < 1:
        raise ValueError(f"data_parallel: at least 1, got {data_parallel}")
    return data_parallel


def megatron_states(param_dtype: str, data_parallel: int, distributed_optimizer: bool = True) -> StateBytes:
    """Megatron-LM: `param_dtype` fp16 (with fp16 gradients), bf16 (with fp32 main gradients, its
    default for bf16) or fp32; `distributed_optimizer` (--use-distributed-optimizer) shards what the
    guide's table shards over the data-parallel ranks."""
    d = _ranks(data_parallel) if distributed_optimizer else 1
    # (parameters, gradients kept whole, what the distributed optimizer shards)
    parts = {"fp16": (2.0, 2.0, 16.0),  # fp16 grads; sharded: fp32 main grads 4, main params 4, Adam 8
             "bf16": (2.0, 4.0, 12.0),  # fp32 main grads whole; sharded: fp32 main params 4, Adam 8
             "fp32": (4.0, 4.0, 8.0)}  # sharded: Adam 8
    if param_dtype not in parts:
        raise ValueError(f"param_dtype: expected one of {', '.join(parts)}, got {param_dtype!r}")
    param, grad, sharded = parts[param_dtype]
    return StateBytes(parameters=param, gradients=grad, optimizer=sharded / d)


def deepspeed_states(zero_stage: int, data_parallel: int) -> StateBytes:
    """DeepSpeed in bf16 / fp16 with Adam, no offload, as its estimators count (module docstring);
    ZeRO-3's gathered largest layer is `deepspeed_zero3_buffer_bytes`, apart."""
    n = _ranks(data_parallel)
    if zero_stage == 1:
        return StateBytes(parameters=2.0, gradients=2.0, optimizer=16.0 / n)
    if zero_stage == 2:  # 2 (16-bit parameters) + 18 / N: 16-bit and fp32 gradients 6, master 4, Adam 8
        return StateBytes(parameters=2.0, gradients=6.0 / n, optimizer=12.0 / n)
    if zero_stage == 3:  # 18 / N: 16-bit parameters 2, fp32 gradients 4, master 4, Adam 8
        return StateBytes(parameters=2.0 / n, gradients=4.0 / n, optimizer=12.0 / n)
    raise ValueError(f"zero_stage: DeepSpeed's stages here are 1, 2 and 3, got {zero_stage!r}")


def deepspeed_zero3_buffer_bytes(largest_layer_params: float) -> float:
    """ZeRO-3's gathered layer as its estimator counts it: 4 bytes per parameter of the largest layer."""
    return 4.0 * largest_layer_params


def fsdp2_states(shard: int) -> StateBytes:
    """FSDP2 in mixed precision (bf16 compute, fp32 reduce): fp32 parameters, gradients and Adam's
    moments, all sharded `shard` ways (HSDP: over the shard degree; the replicas keep the same)."""
    n = _ranks(shard)
    return StateBytes(parameters=4.0 / n, gradients=4.0 / n, optimizer=8.0 / n)
