"""Megatron sequence parallelism (SP; Korthikanti et al., 2022, "Reducing Activation Recomputation
in Large Transformer Models", Sec. 4.2.2) on top of the tensor parallelism of
runtime/layers/tensor_parallel.py, with DTensor's styles.

Plain TP runs a block's layer norms, dropouts and residual adds whole on every tp rank, so each
rank keeps the same activations of those parts (the 10sbh of the paper's 34sbh + 5as^2b per layer
that TP does not divide). SP splits them along the sequence (dim 1: inputs are batch-first) over the
tp ranks, and replaces TP's two conjugate operators: entering the column-parallel linears an
all-gather along the sequence replaces f (identity forward, all-reduce backward; SP's backward is a
reduce-scatter), and leaving the row-parallel linear a reduce-scatter along the sequence replaces g
(all-reduce forward). The bytes on the wire are those of TP (an all-reduce is a reduce-scatter
followed by an all-gather); the activations outside the TP regions are divided by tp.

What runs where (`sequence_styles` rewrites the TP plan of one layer):
  - a pre-norm block, GPT-2's (ln_1, attn, ln_2, mlp) or Llama's (input_layernorm, self_attn,
    post_attention_layernorm, mlp): the norms `SequenceParallel()` (input and output Shard(1), their
    weights Replicate DTensors whose gradients come out Partial, each rank's sum over its tokens:
    summed over the tp ranks once per step in one flattened all-reduce, as Megatron does
    (`partial_grad_params`, `sum_partial_grads`, called by runtime/layers/grad_sync.py's DataParallelSync),
    or, in layers FSDP2 or ZeRO also shard, in their backward by tensor_parallel's gradient hook,
    one all-reduce per parameter and micro-batch); the attention and the MLP gather their input along the
    sequence once on entry (`_GatherSequence`: one all-gather for q, k and v, or gate and up; the
    input stays a Replicate DTensor, so the backward is one reduce-scatter of the partial input
    gradients, Megatron's g-bar); the row-parallel linears `RowwiseParallel(output_layouts=Shard(1))`
    (a reduce-scatter). The residual adds and the dropouts run on Shard(1) DTensors. The attention
    itself runs on the whole sequence after the all-gather: the wrapper (models/adapters.py's
    CausalBlock) builds the causal mask and Llama's rotary cos/sin from the hidden state's global
    shape (a DTensor's `shape` is the whole tensor's), so positions are those of the whole
    sequence;
  - a vocabulary-parallel nn.Embedding (Llama's layer 0): its partial lookups reduce-scattered to
    Shard(1) instead of all-reduced (`RowwiseParallel(output_layouts=Shard(1))`, torchtitan's
    tok_embeddings);
  - a norm + projection head (models/adapters.py's Head without a token selection): the norm
    `SequenceParallel()`, the projection `ColwiseParallel(input_layouts=Shard(1))` with its logits
    gathered whole for the loss;
  - anything else (GPT-2's embedding adds a whole-sequence position embedding; BERT's post-norm
    blocks, ViT, T5, Swin) is refused in one line (tensor_parallel.tp_refusal).

Between layers: the sequence-sharded layout is KEPT between consecutive SP layers of one stage
with the same layout (the tensor passed is a Shard(1) DTensor), and converted only at the ends of
such a region (runtime/layers/regroup.py: `StrategyLayer`): entering it, the whole replicated tensor is
cut locally (`to_shards`: no communication forward, an all-gather of the gradient backward);
leaving it (before a layer without SP, another layout, or the stage's end: pipeline sends, the
loss) it is all-gathered (`to_whole`: the backward keeps the local part of the whole gradient, no
communication). So everything outside an SP region sees the plain, identical tensors of TP, and a
run of k consecutive SP blocks pays one all-gather at its end instead of one per block (the per-layer
variant, each SP layer taking and returning the whole tensor, would add k - 1 all-gathers forward
and k - 1 backward, and hold each block's output whole between blocks). A checkpointed SP layer
keeps its input as it arrives, sequence-sharded: 1/tp of it.

Memory: what SP splits is the norms' inputs and statistics, the dropout masks and the residual
stream; the input of the column-parallel linears (the norm's output, all-gathered) is saved whole
by DTensor's ColwiseParallel, as in torchtitan, where Megatron saves its shard and all-gathers it
again in the backward. So of the paper's 10sbh per block that TP keeps whole (fp16), SP here
divides 6sbh by tp and keeps the 4sbh of the QKV and MLP inputs whole (measured on GPT-2,
docs/runtime.md: exactly the norms' inputs and statistics and the dropout masks halved).

Dropout in an SP region (GPT-2's resid_dropout and MLP dropout) acts on a Shard(1) DTensor, which on
a CPU mesh (no DTensor RNG tracker) draws from each rank's default generator. Left alone, the tp
ranks, seeded alike, would repeat one mask pattern over their different tokens, and with a sequence
that does not split evenly they would draw different amounts, so their generators, and then the
masks of the replicated regions that TP needs identical on every rank, would drift apart.
`_RankDropout` forks the CPU generator instead, as Megatron's RNG tracker does for SP regions: each such
dropout draws one seed from the default generator (the same draw on every rank, so the ranks stay
in step) and makes its mask from that seed plus the rank's tp index; a checkpoint's recomputation
restores the default generator first and so draws the same masks again. The comparisons with one
process run without dropout.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
)

from paraplan.models.adapters import CausalBlock, Head, PlainBlock

SEQUENCE = Shard(1)  # batch-first hidden states: (batch, sequence, hidden)
# set (True) on a parameter whose Partial gradients its stage sums once per step (`sum_partial_grads`)
SUMMED_AFTER_STEP = "sp_grad_summed_after_step"
# (first norm, attention, second norm, MLP) of the pre-norm blocks SP runs on
_BLOCKS = (("ln_1", "attn", "ln_2", "mlp"), ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp"))
_WHAT = ("SP runs on pre-norm blocks (ln_1, attn, ln_2, mlp or input_layernorm, self_attn, post_attention_layernorm, "
         "mlp), a vocabulary-parallel nn.Embedding and a norm + projection head")


class SequenceRefused(Exception):
    """A layer SP cannot run; the message says why, in one line."""


class _GatherSequence(ParallelStyle):
    """On entry to a module (the attention, the MLP), every Shard(1) DTensor argument, positional or
    keyword, becomes Replicate: one all-gather along the sequence, however many column-parallel
    linears read it. It stays a DTensor, so the backward sums the linears' partial input gradients
    and reduce-scatters them along the sequence once."""

    def _apply(self, module, mesh):
        module.register_forward_pre_hook(_gathered, with_kwargs=True)
        return module


def _gathered(module, args, kwargs):
    def whole(t):
        if isinstance(t, DTensor) and tuple(t.placements) == (SEQUENCE,):
            return t.redistribute(t.device_mesh, [Replicate()])
        return t

    return tuple(whole(a) for a in args), {k: whole(v) for k, v in kwargs.items()}


class _RankDropout(ParallelStyle):
    """A dropout whose input is sequence-sharded draws its mask from a generator forked per tp rank
    (module docstring); any other input (inside a TP region) uses the default generator as before."""

    def _apply(self, module, mesh):
        module.register_forward_pre_hook(_fork_generator)
        module.register_forward_hook(_join_generator)
        return module


def _fork_generator(module, args) -> None:
    x = args[0] if args else None
    # on a GPU mesh DTensor's own RNG tracker draws a sharded tensor's mask as one whole mask
    if isinstance(x, DTensor) and tuple(x.placements) == (SEQUENCE,) and module.training and module.p > 0 \
            and x.device_mesh.device_type == "cpu":
        cpu = torch.default_generator  # (torch.manual_seed would also queue seeds for CUDA, XPU, MTIA)
        seed = int(torch.randint(2**62, (1,), generator=cpu))  # one draw, the same on every rank
        module._sp_default_rng = cpu.get_state()
        cpu.manual_seed(seed + x.device_mesh.get_local_rank())


def _join_generator(module, args, out) -> None:
    state = module.__dict__.pop("_sp_default_rng", None)
    if state is not None:
        torch.default_generator.set_state(state)


def _is_norm(m: nn.Module | None) -> bool:
    # nn.LayerNorm, transformers' LlamaRMSNorm and its kin: element-wise over the hidden dim
    return m is not None and (isinstance(m, (nn.LayerNorm, nn.RMSNorm)) or type(m).__name__.endswith("RMSNorm")) \
        and all(p.dim() == 1 for p in m.parameters())


def _block(layer: nn.Module) -> tuple[str, tuple[str, str, str, str]] | None:
    """(path of the pre-norm block in the layer, its child names) or None. The layer is the block
    itself or the zoo's wrapper of it, which reads only the hidden state's shape, dtype and device."""
    for path, mod in ([("", layer)] if not isinstance(layer, (CausalBlock, PlainBlock)) else
                      [("block", layer.block)]):
        kids = dict(mod.named_children())
        for names in _BLOCKS:
            if all(n in kids for n in names) and _is_norm(kids[names[0]]) and _is_norm(kids[names[2]]):
                return path, names
    return None


def sequence_io(layer: nn.Module) -> tuple[bool, bool]:
    """(takes its input sequence-sharded, gives its output sequence-sharded) of a layer SP runs on;
    SequenceRefused otherwise (pure inspection)."""
    if isinstance(layer, nn.Embedding):
        return False, True
    if isinstance(layer, Head) and layer._select is None and _is_norm(layer.norm):
        return True, False
    if _block(layer) is not None:
        return True, True
    inner = layer.block if isinstance(layer, (CausalBlock, PlainBlock)) else layer  # name the model's own block
    raise SequenceRefused(f"{type(inner).__name__}: {_WHAT}; set sequence_parallel false for this layer")


def sequence_styles(layer: nn.Module, styles: dict[str, ParallelStyle]) -> None:
    """Rewrite `styles`, the TP plan of `layer` (path -> style, as tensor_parallel.layer_plan makes it), in
    place into its SP plan (module docstring); SequenceRefused with one line if SP cannot run it."""
    sequence_io(layer)
    if isinstance(layer, nn.Embedding):
        if not isinstance(styles.get(""), RowwiseParallel):
            raise SequenceRefused(f"{type(layer).__name__}: not vocabulary-parallel, {_WHAT}")
        styles[""] = RowwiseParallel(input_layouts=Replicate(), output_layouts=SEQUENCE, use_local_output=False)
        return
    if isinstance(layer, Head):
        if not isinstance(styles.get("proj"), ColwiseParallel):
            raise SequenceRefused(f"Head: its projection {type(layer.proj).__name__} is not column-parallel")
        styles["norm"] = SequenceParallel()
        styles["proj"] = ColwiseParallel(input_layouts=SEQUENCE, output_layouts=Replicate())
        return
    path, (norm1, attn, norm2, mlp) = _block(layer)
    prefix = f"{path}." if path else ""
    for part in (attn, mlp):
        inside = [k for k in styles if k.startswith(f"{prefix}{part}.")]
        rows = [k for k in inside if isinstance(styles[k], RowwiseParallel)]
        if len(rows) != 1 or len(inside) < 2:
            raise SequenceRefused(f"{type(layer).__name__} '{prefix}{part}': not one column-parallel -> "
                                  f"row-parallel region ({len(rows)} row-parallel linears)")
        style = styles[rows[0]]  # RowwiseParallel or the Conv1D one: the same, ending in a reduce-scatter
        styles[rows[0]] = type(style)(output_layouts=SEQUENCE, use_local_output=False)
        styles[f"{prefix}{part}"] = _GatherSequence()
    for norm in (norm1, norm2):
        styles[f"{prefix}{norm}"] = SequenceParallel()
    block = layer.get_submodule(path) if path else layer
    for name, mod in block.named_modules():
        if isinstance(mod, nn.Dropout):
            styles.setdefault(f"{prefix}{name}", _RankDropout())
    # on a CPU mesh DTensor runs random ops with the local generator, as _RankDropout intends
    warnings.filterwarnings("ignore", message="DTensor random operators may not have complete support")


def to_shards(x, mesh):
    """The whole tensor `x` (identical on every rank of `mesh`) as a Shard(1) DTensor: each rank keeps
    its part of the sequence (a local cut); the backward all-gathers the gradient's parts."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).redistribute(mesh, [SEQUENCE])


def to_whole(y):
    """A Shard(1) DTensor as the whole plain tensor on every rank (an all-gather); the backward
    keeps this rank's part of the (identical) whole gradient. Anything else passes unchanged."""
    if not isinstance(y, DTensor):
        return y
    return y.redistribute(y.device_mesh, [Replicate()]).to_local()


def partial_grad_params(layer: nn.Module) -> list[nn.Parameter]:
    """The parameters of an SP layer replicated over its tp ranks whose gradients come out Partial
    (the norms' weights and biases: each rank sums over its own tokens). Marked so that the TP
    gradient hook leaves them Partial for `sum_partial_grads` (one all-reduce per step, as Megatron's
    sequence-parallel gradient all-reduce, instead of one per parameter per micro-batch)."""
    out = []
    for m in layer.modules():
        if isinstance(m, nn.Embedding):  # a vocabulary-parallel embedding's weight is sharded anyway
            continue
        for p in m.parameters(recurse=False):
            if isinstance(p, DTensor) and all(isinstance(x, Replicate) for x in p.placements) and \
                    _is_norm(m) and p.requires_grad:
                setattr(p, SUMMED_AFTER_STEP, True)
                out.append(p)
    return out


def sum_partial_grads(params: list[nn.Parameter]) -> None:
    """After the step's backwards: the Partial gradients of `params` summed over their tp mesh, one
    flattened all-reduce per mesh, and left Replicate like the parameters. Every rank of a mesh
    calls it with its parameters in the same order."""
    import torch.distributed as dist

    by_mesh: dict[int, list[nn.Parameter]] = {}
    for p in params:
        if p.grad is not None:
            by_mesh.setdefault(id(p.device_mesh), []).append(p)
    for group in by_mesh.values():
        mesh = group[0].device_mesh
        partial = [p for p in group if isinstance(p.grad, DTensor) and all(
            x.is_partial("sum") for x in p.grad.placements)]
        for p in group:  # anything else (not expected): made Replicate on its own
            if isinstance(p.grad, DTensor) and not all(x.is_partial("sum") or x.is_replicate()
                                                       for x in p.grad.placements):
                p.grad = p.grad.redistribute(mesh, [Replicate()])
        if not partial:
            continue
        local = [p.grad.to_local() for p in partial]
        flat = torch.cat([g.reshape(-1) for g in local])
        dist.all_reduce(flat, group=mesh.get_group())
        offset = 0
        for p, g in zip(partial, local, strict=True):
            whole = flat[offset:offset + g.numel()].view_as(g).clone()
            p.grad = DTensor.from_local(whole, mesh, [Replicate()], run_check=False)
            offset += g.numel()
