"""How bytes are counted per parameter and per activation (costs/memory.py, costs/strategy.py),
and what a real PyTorch run holds beyond model states and activations.

Every term is one rule for every model; where a figure comes from torch's documented behaviour the
comment names the source. `MemoryConfig()` describes a CUDA device under PyTorch;
`MemoryConfig.for_device_kind("cpu-core")` drops the CUDA-only terms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class MemoryConfig:
    state_bytes_per_param: float = 16.0  # fp32 Adam; mixed precision with fp32 master weights: 16 too
    param_bytes_per_param: float = 4.0  # the weights alone (what a weight stash copies)
    grad_bytes_per_param: float = 4.0  # one gradient (what a DDP bucket or an FSDP unsharded gradient holds)
    activation_dtype_scale: float = 1.0  # activations are measured in fp32; 0.5 for fp16/bf16
    # The caching allocator's share of the memory allocated and freed every iteration (activations):
    # blocks are rounded up (to 512 bytes; segments of 2 MiB below 1 MiB, 20 MiB up to 10 MiB, rounded
    # to 2 MiB above: c10/cuda/CUDACachingAllocator.cpp, "CUDA memory management" in torch's notes) and
    # a freed block split for a smaller request leaves a remainder that a later, larger request cannot
    # use, so reserved memory exceeds allocated memory by a fraction of the dynamic part. One figure for
    # every model, calibrated once on Galvatron-BMW Table II (docs/simulator.md); 0 on a CPU.
    allocator_fraction: float = 0.15
    # Per device, once (not per stage): the CUDA context with torch's kernels loaded (pytorch#34323:
    # ~0.78 GB in nvidia-smi for a bare torch.cuda init before CUDA 11.7's lazy loading), cuBLAS's
    # workspace and NCCL's channel buffers. 0 on a CPU.
    reserve_bytes: int = GIB // 2
    # DDP (grad_sync "bucketed"): with gradient_as_bucket_view=False (torch's default) the Reducer
    # copies every gradient into flat bucket buffers (bucket_cap_mb=25 each) that cover all the
    # parameters and live as long as the module: pytorch#41954 ("peak memory dropped ~1GB" for a ~1 GB
    # model when the gradients are made views of the buckets). `ddp_bucket_fraction` of the gradient
    # bytes: 1.0 for the default, 0.0 with gradient_as_bucket_view=True.
    ddp_bucket_fraction: float = 1.0
    # Adam's step temporaries per parameter. The per-tensor loop (torch < 2.0's default, Table II's era)
    # makes one parameter-sized temporary at a time (sqrt of exp_avg_sq): 0 here. The foreach kernels
    # (torch >= 2.0's default on CUDA; torch.optim.Adam docs: "foreach ... uses more peak memory") make
    # _foreach_sqrt(exp_avg_sqs) for the whole model at once: 4 bytes per fp32 parameter.
    optimizer_step_bytes_per_param: float = 0.0
    # FSDP / ZeRO-3 (sdp > 1): unsharded layers alive at once: the one computing plus the one prefetched
    # (FSDP's default backward_prefetch=BACKWARD_PRE; ZeRO-3 prefetches ahead as well), each with its
    # gathered weights, plus one unsharded gradient waiting for its reduce-scatter.
    sdp_gathered_layers: int = 2
    # Megatron tensor parallelism (tp > 1): the activations that are not split tp ways. Without sequence
    # parallelism the inputs of the two layer norms and of the two column-parallel linears are held
    # whole on every tp rank (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    # Transformer Models", eq. (2): sbh(10 + 24/t + 5as/(ht)), the 10 sbh not divided by t): four
    # tensors the size of the block's output (in fp32), capped at the layer's saved bytes.
    tp_replicated_outputs: float = 4.0
    # Of those, what sequence parallelism as torch's DTensor runs it (SequenceParallel with
    # ColwiseParallel(input_layouts=Shard(1)): paraplan's runtime, torchtitan) still keeps whole: the
    # column-parallel linears' all-gathered inputs, 4 sbh of Korthikanti et al.'s 10 sbh (§4.2.2; the
    # norms' inputs and the dropout masks, 6 sbh, are split). Megatron-LM keeps those inputs sharded
    # and gathers them again in the backward: 0 there (costs/transformer_memory.py, the literature's form).
    sp_whole_share: float = 0.4
    # Mixed precision (bf16 / fp16) as paraplan's runtime runs it: fp32 modules under autocast, so
    # the states stay fp32 (4 + 4 + 8 = 16 bytes per parameter with Adam) and autocast keeps a 16-bit
    # copy of every weight a forward casts (its cache lives as long as the saved tensors that use
    # it): 2 bytes per parameter of the layers a device runs forward, filed under parameters.
    compute_copy_bytes_per_param: float = 0.0
    # What an FSDP / ZeRO-3 all-gather materialises per parameter when the engine gathers in the
    # compute dtype (FSDP2's MixedPrecisionPolicy(param_dtype) casts the shard before gathering;
    # DeepSpeed's 16-bit parameters); 0: as compute_copy_bytes_per_param, else the parameters'.
    gathered_bytes_per_param: float = 0.0
    # An fp8 plan's FP8 weight copies per parameter of its transformer blocks (costs/fp8_linear.py:
    # fp8_weight_copy_bytes): Transformer Engine keeps each linear's FP8 weight and its transpose
    # across a step's micro-batches; torchao casts per use and keeps none. Counted with the weight
    # copies (memory.py's "16-bit weight copies" category: the copies beside the weights)
    fp8_weight_bytes_per_param: float = 0.0
    # FSDP under pipelining keeps each stage's units gathered and their gradients unsharded until the
    # stage's last backward (EngineProfile.pipeline_keeps_fsdp_units: torchtitan)
    pipeline_keeps_sdp_units: bool = False

    @property
    def activation_scale(self) -> float:
        """What costs/strategy.py multiplies measured saved bytes by: dtype and allocator."""
        return self.activation_dtype_scale * (1.0 + self.allocator_fraction)

    def for_precision(self, precision: str) -> MemoryConfig:
        """The terms a plan in `precision` adds (precision.py): the 16-bit weight copies of mixed
        precision; FSDP's gathered weights in the compute dtype (MixedPrecisionPolicy(param_dtype))."""
        from paraplan.precision import element_bytes, is_mixed

        if not is_mixed(precision):
            return replace(self, compute_copy_bytes_per_param=0.0)
        return replace(self, compute_copy_bytes_per_param=float(element_bytes(precision)), fp8_weight_bytes_per_param=0.0)

    def for_engine(self, engine: str, precision: str, fp8_param_gather: bool = False) -> MemoryConfig:
        """The model states per parameter as `engine` keeps them in a mixed `precision`, unsharded
        (costs/engine_states.py; strategy.py: state_parts_per_param shards them by ZeRO stage and sdp):
        megatron 2-byte parameters, 4-byte main gradients, 12 bytes of fp32 master weights and Adam
        (18; ZeRO-1 = the distributed optimizer's 6 + 12/d); deepspeed 2 + 2 + 16 (ZeRO-2: 2 + 18/N);
        torchtitan FSDP2's fp32 parameters, gradients and Adam, 16 (16/N sharded). The engines keep
        their parameters in the compute dtype or gather them in it: no autocast weight copies."""
        from paraplan.costs.engine_profile import engine_profile
        from paraplan.costs.engine_states import deepspeed_states, fsdp2_states, megatron_states
        from paraplan.costs.fp8_linear import fp8_weight_copy_bytes
        from paraplan.precision import compute_precision, element_bytes, is_mixed

        if engine == "paraplan":
            return self
        config = replace(self, pipeline_keeps_sdp_units=engine_profile(engine).pipeline_keeps_fsdp_units)
        if not is_mixed(precision):
            return config
        states = {"megatron": lambda: megatron_states(str(compute_precision(precision)), 1, distributed_optimizer=False),
                  "deepspeed": lambda: deepspeed_states(1, 1), "torchtitan": lambda: fsdp2_states(1)}[engine]()
        return replace(config, state_bytes_per_param=states.total, param_bytes_per_param=states.parameters,
                       grad_bytes_per_param=states.gradients, compute_copy_bytes_per_param=0.0,
                       gathered_bytes_per_param=float(element_bytes(precision)),
                       fp8_weight_bytes_per_param=fp8_weight_copy_bytes(engine, fp8_param_gather)
                       if precision == "fp8" else 0.0)

    def for_device_kind(self, kind: str | None) -> MemoryConfig:
        """The terms that apply on a device of this kind (DeviceSpec.name): a CPU has no CUDA context
        and no caching allocator; anything else (or unknown) is treated as a CUDA device."""
        if is_cpu(kind):
            return replace(self, allocator_fraction=0.0, reserve_bytes=0)
        return self


def is_cpu(kind: str | None) -> bool:
    return bool(kind) and str(kind).lower().startswith("cpu")
