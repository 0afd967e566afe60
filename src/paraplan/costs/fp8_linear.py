"""FP8 linear layers: their GEMMs on FP8 tensor cores and the casts each recipe adds (issue 51 item 1).

An FP8 plan (precision.py: `fp8`) runs the three GEMMs of every linear layer of its transformer
blocks in FP8: forward (input @ weight), input gradient (grad_output @ weight) and weight gradient
(input^T @ grad_output). Everything else stays bf16, as the engines run it: attention, norms,
activations, the embedding and the output head (Megatron-LM keeps the head in bf16; torchtitan's
Float8 converter is run with the head filtered out, and skips any linear whose dimensions are not
multiples of 16, a hardware requirement of FP8 GEMMs). `fp8_passes` turns a block's measured passes
into its FP8 passes:

  GEMMs: each 2-D GEMM (a linear's; the attention core's batched GEMMs stay bf16) becomes a 1-byte
      GEMM, which costs/op_roofline.py prices at the device's FP8 peak (DeviceSpec.fp8_gemm_flops)
      with FP8 operands and a bf16 output.
  casts: before a GEMM reads a tensor in FP8, the recipe computes its scale and casts it. The
      kernels each recipe launches per tensor, and the bytes each reads and writes, are torchao's
      own inventory of its compiled Float8Linear (torchao/testing/training/roofline_utils.py,
      get_tensor_memory_traffic_ovhd_s), not fitted to anything:
        tensorwise  input and grad_output: an amax pass (reads 2 bytes per element), its second
                    reduction stage (no traffic, one launch), and one cast writing both layouts
                    (reads 2, writes 1 + 1); the weight: amax (2), stage 2, and a cast per pass
                    (2 + 1 each, forward and backward)
        rowwise     input and grad_output: a cast along rows that also writes the transposed bf16
                    copy (2 + 1 + 2), then the cast of that copy (2 + 1); the weight: a cast (2 + 1),
                    a transpose (2 + 2) and its cast (2 + 1). Beyond torchao's roofline: its backward
                    GEMMs run without fast accumulation, and for them torchao calls the tensorwise
                    cuBLAS kernel with unit scales and multiplies the output by the two scales after
                    (torchao/float8/float8_ops.py `addmm_float8_unwrapped`: "the rowwise CUTLASS-based
                    kernel is so slow without fast-accum"), one more kernel per backward GEMM reading
                    and writing its bf16 output (2 + 2): the weight gradient's, and the input
                    gradient's, which a compiled block folds into the kernel that reads it next
        delayed     Transformer Engine's fused cast-transpose, which also takes the amax for the next
                    step's scale: one kernel a tensor writing both layouts (2 + 1 + 1); the input's
                    and grad_output's read fused into the norm and activation kernels before them
                    (TE's LayerNormLinear and fused activations). TE casts a weight once a step and
                    keeps it for the other micro-batches; priced here once a micro-batch (an over-
                    count of one cast of the weights a micro-batch)
        mxfp8       every tensor: two block casts (2 + 1 each), one per layout; GEMM operands carry
                    one e8m0 scale per 32 elements
        blockwise   as mxfp8 (two casts a tensor: DeepSeek-V3's 1 x 128 and 128 x 128 tiles, one
                    per layout; the scales, one per 128 elements at most, are left out)
      `fused_casts` (an engine whose norms and activation-gradient kernels also take the amax or
      the cast: Megatron-LM's Transformer Engine layers; torch.compile): the first read of the
      input's and grad_output's casts is the previous kernel's (torchao's `fuse_with_prev`), and a
      pointwise kernel marked NEXT is no kernel of its own (its consumer does the multiply).
      Each cast kernel runs in the pass that needs its output: the input's and weight's first
      layout in the forward, what only the weight gradient or input gradient reads in the backward.
"""

from __future__ import annotations

from dataclasses import replace

from paraplan.models.spec import Affine, Gemm, MemoryOp, PassOps

FORWARD, BACKWARD = "forward", "backward"

# How a kernel fuses when the engine fuses (`fused_casts`): PREV, its first bf16 read is the previous
# kernel's; NEXT, the kernel folds into the one that reads its output; None, it runs as it is
PREV, NEXT = "prev", "next"
# (bytes read and written per element, pass, fusion) per tensor role, as torchao's roofline inventory
# lists the kernels (module docstring); a gradient's kernels are listed under the tensor it has the
# shape of (the input gradient's under "input", the weight gradient's under "weight")
_TENSORWISE = {
    "input": ((2.0, FORWARD, PREV), (0.0, FORWARD, None), (4.0, FORWARD, None)),
    "weight": ((2.0, FORWARD, None), (0.0, FORWARD, None), (3.0, FORWARD, None), (3.0, BACKWARD, None)),
    "grad_output": ((2.0, BACKWARD, PREV), (0.0, BACKWARD, None), (4.0, BACKWARD, None)),
}
_ROWWISE = {  # the last kernel of input and weight: the backward GEMMs' output scaling
    "input": ((5.0, FORWARD, PREV), (3.0, BACKWARD, None), (4.0, BACKWARD, NEXT)),
    "weight": ((3.0, FORWARD, None), (4.0, BACKWARD, None), (3.0, BACKWARD, None), (4.0, BACKWARD, None)),
    "grad_output": ((5.0, BACKWARD, PREV), (3.0, BACKWARD, None)),
}
_DELAYED = {
    "input": ((4.0, FORWARD, PREV),),
    "weight": ((4.0, FORWARD, None),),
    "grad_output": ((4.0, BACKWARD, PREV),),
}
_BLOCKS = {
    "input": ((3.0, FORWARD, PREV), (3.0, BACKWARD, None)),
    "weight": ((3.0, FORWARD, None), (3.0, BACKWARD, None)),
    "grad_output": ((3.0, BACKWARD, PREV), (3.0, BACKWARD, None)),
}
CAST_KERNELS = {"tensorwise": _TENSORWISE, "delayed": _DELAYED, "rowwise": _ROWWISE, "mxfp8": _BLOCKS,
                "blockwise": _BLOCKS}
# an MX operand's e8m0 scales: one byte per 32 elements (OCP Microscaling spec), read beside it
MX_SCALE_BYTES_PER_ELEMENT = 1.0 / 32.0
# FP8 GEMMs need every dimension a multiple of 16 (torchtitan skips such linears; so does TE)
FP8_ALIGNMENT = 16


# Bytes per parameter of the FP8 weight copies an engine keeps beside its weights (memory_config.py):
# Transformer Engine caches each linear's FP8 weight and its transpose (rowwise and columnwise data)
# for the step's micro-batches (its `_fp8_workspaces`, refreshed on a step's first micro-batch);
# torchao's Float8Linear casts the weight where a GEMM needs it and keeps no copy.
_FP8_WEIGHT_COPY_BYTES = {"megatron": 2.0}


def fp8_weight_copy_bytes(engine: str, fp8_param_gather: bool = False) -> float:
    """`fp8_param_gather` (Megatron-LM's --fp8-param-gather, TE's fp8_param): the parameter is the FP8
    weight (1 byte where bf16 took 2) and TE keeps its transpose (1): together the bf16 parameter's
    2 bytes, so no bytes beyond the parameters' count."""
    if fp8_param_gather:
        return 0.0
    return _FP8_WEIGHT_COPY_BYTES.get(engine, 0.0)


def saved_input_bytes(engine: str, recipe: str) -> float:
    """Bytes per element an engine keeps of a linear's input for the weight gradient: Transformer
    Engine (megatron) its FP8 copy under every recipe; torchao its FP8 copy under tensorwise (the
    forward's cast writes both layouts), the bf16 input under the others (cast again in the
    backward: roofline_utils' kernel lists)."""
    if engine == "megatron" or recipe == "tensorwise":
        return 1.0
    return 2.0


def cast_bytes(recipe: str, role: str, numel: float, fused_casts: bool) -> dict[str, list[float]]:
    """The cast kernels of one tensor (`role`: input, weight or grad_output) of `numel` elements, and
    the recipe's kernels on the gradient of its shape: per pass, the bytes each kernel reads and
    writes (0: a launch that moves nothing)."""
    out: dict[str, list[float]] = {FORWARD: [], BACKWARD: []}
    for per_element, which, fusion in CAST_KERNELS[recipe][role]:
        if fused_casts and fusion == NEXT:
            continue
        first_read = 2.0 if fused_casts and fusion == PREV else 0.0  # the bf16 read the previous kernel did
        out[which].append((per_element - first_read) * numel)
    return out


def is_linear(g: Gemm) -> bool:
    """A linear layer's GEMM (2-D, one product): the attention core's GEMMs are batched."""
    return g.batch.fixed == 1.0 and g.batch.per_sample == 0.0


def _aligned(g: Gemm) -> bool:
    return all(d.per_sample == 0.0 and d.fixed % FP8_ALIGNMENT == 0 for d in (g.k, g.n))


def _affine_product(a: Affine, b: Affine) -> Affine:
    """a x b where at most one of them depends on the batch (a linear's M x K, K x N, M x N)."""
    return Affine(a.fixed * b.fixed, a.per_sample * b.fixed + a.fixed * b.per_sample)


def fp8_passes(forward: PassOps, backward: PassOps, recipe: str, fused_casts: bool) -> tuple[PassOps, PassOps]:
    """A block's two passes with its linears in FP8 (module docstring): their GEMMs as 1-byte GEMMs,
    the recipe's cast kernels added to the pass that runs each."""
    casts: dict[str, list[Affine]] = {FORWARD: [], BACKWARD: []}
    fp8_shapes = set()
    for g in forward.gemms:
        if not (is_linear(g) and _aligned(g)):
            continue
        fp8_shapes.add((g.m, g.n, g.k))
        tensors = {"input": _affine_product(g.m, g.k), "weight": _affine_product(g.k, g.n),
                   "grad_output": _affine_product(g.m, g.n)}
        for role, numel in tensors.items():
            for kernel_pass, kernels in _cast_affines(recipe, role, numel, fused_casts).items():
                casts[kernel_pass] += kernels * int(g.count)
    if not fp8_shapes:
        return forward, backward
    # the backward's GEMMs of those linears: the input gradient (M x N @ N x K) and the weight
    # gradient (K x M @ M x N), each one of the forward's dimensions permuted
    backward_shapes = {frozenset(shape) for shape in fp8_shapes}
    return (_with_fp8(forward, lambda g: (g.m, g.n, g.k) in fp8_shapes, casts[FORWARD], recipe),
            _with_fp8(backward, lambda g: is_linear(g) and frozenset((g.m, g.n, g.k)) in backward_shapes,
                      casts[BACKWARD], recipe))


def fp8_recomputed(selective: PassOps, forward: PassOps, fp8_forward: PassOps) -> PassOps:
    """What torchtitan's per-operator selective recomputation runs again in an FP8 block (`selective`:
    its bf16 list, costs/analytic.py: every memory-bound kernel and every second matmul; `forward` and
    `fp8_forward`: the block's forward before and after `fp8_passes`). torchao's Float8 linear calls
    `torch.mm` on its FP8 tensor subclass, which the policy sees as the `aten.mm` it counts, so it
    still saves every second matmul and runs the others again, now as FP8 GEMMs. The FP8 operands'
    casts are pointwise kernels the policy does not save (it saves the amax: `aten.max`, torchtitan
    0.3.0 distributed/activation_checkpoint.py and its December 2024 `_save_list`), so every linear's
    casts run again; their amax passes are priced as run again too (one bf16 read a tensor over)."""
    fp8_shapes = {(g.m, g.n, g.k): g for g in fp8_forward.gemms if g.element_bytes == 1}
    gemms = tuple(replace(g, element_bytes=1, scale_bytes=fp8_shapes[(g.m, g.n, g.k)].scale_bytes)
                  if (g.m, g.n, g.k) in fp8_shapes else g for g in selective.gemms)
    casts = fp8_forward.memory_ops[len(forward.memory_ops):]
    return replace(selective, gemms=gemms, memory_ops=selective.memory_ops + casts)


def _cast_affines(recipe: str, role: str, numel: Affine, fused_casts: bool) -> dict[str, list[Affine]]:
    fixed = cast_bytes(recipe, role, numel.fixed, fused_casts)
    per_sample = cast_bytes(recipe, role, numel.per_sample, fused_casts)
    return {which: [Affine(f, p) for f, p in zip(fixed[which], per_sample[which], strict=True)] for which in fixed}


def _with_fp8(ops: PassOps, runs_fp8, casts: list[Affine], recipe: str) -> PassOps:
    gemms = tuple(replace(g, element_bytes=1, scale_bytes=MX_SCALE_BYTES_PER_ELEMENT if recipe == "mxfp8" else 0.0)
                  if runs_fp8(g) else g for g in ops.gemms)
    merged: dict[Affine, int] = {}
    for nbytes in casts:
        merged[nbytes] = merged.get(nbytes, 0) + 1
    kernels = tuple(MemoryOp(nbytes, count) for nbytes, count in merged.items())
    return replace(ops, gemms=gemms, memory_ops=ops.memory_ops + kernels)
