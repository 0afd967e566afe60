"""A transformer layer's activation memory tensor by tensor, and the model states per precision and
ZeRO stage: the literature's closed forms, written out so that each term can be checked.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models", §4.1). One layer, one micro-batch of b sequences of s tokens, hidden size h, a heads, with
16-bit activations and 1-byte dropout masks, stores sbh(34 + 5as/h) bytes:
    attention  11sbh + 5as²b: the QKV input 2sbh, Q and K 4sbh, the softmax output 2as²b, its
               dropout mask as²b, the dropout output 2as²b and V 2sbh, the output projection's
               input 2sbh, the dropout mask after it sbh;
    MLP        19sbh: the first linear's input 2sbh, the GeLU's input 8sbh, the second linear's
               input 8sbh, the dropout mask sbh;
    norms      4sbh: the inputs of the two layer norms.
Tensor parallelism over t ranks (§4.2.1, eq. 2) splits the 24sbh + 5as²b inside the parallel
regions, leaving 10sbh whole on every rank (the norms' inputs, the two linears' inputs, the two
dropout masks): sbh(10 + 24/t + 5as/(ht)); sequence parallelism (§4.2.2, eq. 4) splits those too:
sbh(34/t + 5as/(ht)). Selective recomputation (§5) recomputes the attention core (QK^T, softmax,
its dropout, attention over V) and drops the 5as²b; full recomputation keeps the layer's input,
2sbh (2sbh/t with sequence parallelism). Their Table 2 lists the five forms (`korthikanti_table2`).

The same inventory, generalised to the layers people train now (`activation_tensors`):
grouped-query attention (K and V of kv_heads < heads), SwiGLU MLPs (gate, up, their product: four
tensors of the intermediate size where GeLU has two), RMSNorm, no dropout, and the attention
implementation in use: eager attention keeps the s x s softmax (and its dropout mask and output);
PyTorch's SDPA / flash kernels keep only their output and the fp32 log-sum-exp per row. Each norm
also keeps its fp32 statistics per token (mean and rstd; rstd for RMSNorm), which the paper leaves
out (under 0.01% at its sizes). Rotary embeddings keep only their cos/sin tables (s x head_dim,
shared by the layers: left out).

States (Rajbhandari et al. 2020, ZeRO, §3.1 and Fig. 1): mixed-precision Adam keeps 2Ψ of 16-bit
parameters, 2Ψ of 16-bit gradients and KΨ = 12Ψ of fp32 master weights, momentum and variance;
ZeRO-1 shards the K Ψ over the N_d data-parallel ranks, ZeRO-2 the gradients too, ZeRO-3 the
parameters too: (2 + 2 + K)Ψ, (2 + 2)Ψ + KΨ/N_d, 2Ψ + (2 + K)Ψ/N_d, (2 + 2 + K)Ψ/N_d.
Megatron-LM accumulates and reduces gradients in fp32 (its `main_grad`), 4 bytes where ZeRO counts
2: 18 bytes per parameter unsharded (Korthikanti et al. Table 3's memory figures use 18).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.plans.plan import RECOMPUTES

ATTENTION = ("eager", "sdpa")
MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class TransformerShape:
    """One transformer layer as its activations see it."""

    hidden: int  # h
    heads: int  # a
    seq_len: int  # s
    ffn: int | None = None  # the MLP's intermediate size (default 4h)
    kv_heads: int | None = None  # grouped-query attention (default: heads)
    mlp: str = "gelu"
    norm: str = "layernorm"
    dropout: bool = True  # dropout after the softmax, the attention output and the MLP
    attention: str = "eager"

    def __post_init__(self):
        for name, value, allowed in (("mlp", self.mlp, MLP_KINDS), ("norm", self.norm, NORM_KINDS),
                                     ("attention", self.attention, ATTENTION)):
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
        if self.hidden % self.heads or self.heads % (self.kv_heads or self.heads):
            raise ValueError(f"hidden {self.hidden}, heads {self.heads}, kv_heads {self.kv_heads} do not divide")

    @property
    def intermediate(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def kv_fraction(self) -> float:
        """K (or V) over Q in size: kv_heads / heads."""
        return (self.kv_heads or self.heads) / self.heads


@dataclass(frozen=True)
class SavedTensor:
    name: str
    bytes: float  # one micro-batch, on one rank
    split: bool  # split over the tensor-parallel ranks (inside a parallel region, or by sequence parallelism)


def activation_tensors(shape: TransformerShape, micro_batch: int, element_bytes: int = 2, tp: int = 1,
                       sequence_parallel: bool = False, recompute: str = "none",
                       linear_input_bytes: float | None = None) -> tuple[SavedTensor, ...]:
    """What one layer keeps for its backward, per micro-batch, on one of `tp` ranks (the module
    docstring lists the tensors and their sources). `linear_input_bytes`: bytes per element of the
    four linear inputs an FP8 plan's engine keeps in FP8 (costs/fp8_linear.py: saved_input_bytes);
    None: `element_bytes`."""
    if recompute not in RECOMPUTES:
        raise ValueError(f"recompute: expected one of {', '.join(RECOMPUTES)}, got {recompute!r}")
    s, b, a = shape.seq_len, micro_batch, shape.heads
    e, sbh, ffn = element_bytes, s * b * shape.hidden, shape.intermediate
    li = e if linear_input_bytes is None else linear_input_bytes  # what a linear keeps of its input
    mask = 1.0 if shape.dropout else 0.0

    def whole(name, nbytes):  # in the replicated region: split only by sequence parallelism
        return SavedTensor(name, nbytes / tp if sequence_parallel else nbytes, sequence_parallel and tp > 1)

    def parallel(name, nbytes):  # inside a tensor-parallel region
        return SavedTensor(name, nbytes / tp, tp > 1)

    if recompute == "full":  # only the layer's input; the forward runs again in the backward
        return (whole("layer input", e * sbh),)
    stats = 8.0 if shape.norm == "layernorm" else 4.0  # fp32 mean and rstd per token (rstd alone for RMSNorm)
    out = [whole("norm 1 input", e * sbh), whole("norm 1 statistics", stats * s * b),
           whole("QKV input", li * sbh),
           parallel("Q and K", e * sbh * (1 + shape.kv_fraction)), parallel("V", e * sbh * shape.kv_fraction)]
    if recompute == "none":  # the attention core; selective recomputation runs it again instead
        if shape.attention == "eager":
            out.append(parallel("softmax output", e * a * s * s * b))
            if shape.dropout:
                out += [parallel("softmax dropout mask", mask * a * s * s * b),
                        parallel("softmax dropout output", e * a * s * s * b)]
        else:  # SDPA / flash: the kernel's output and its fp32 log-sum-exp per row
            out += [parallel("attention kernel output", e * sbh), parallel("log-sum-exp", 4.0 * a * s * b)]
    out.append(parallel("output projection input", li * sbh))
    if shape.dropout:
        out.append(whole("attention dropout mask", mask * sbh))
    out += [whole("norm 2 input", e * sbh), whole("norm 2 statistics", stats * s * b), whole("MLP input", li * sbh)]
    if shape.mlp == "gelu":
        out += [parallel("GeLU input", e * s * b * ffn), parallel("second linear input", li * s * b * ffn)]
    else:  # SwiGLU: SiLU(gate) * up, then the down projection
        out += [parallel("gate (SiLU input)", e * s * b * ffn), parallel("SiLU output", e * s * b * ffn),
                parallel("up projection output", e * s * b * ffn), parallel("down projection input", li * s * b * ffn)]
    if shape.dropout:
        out.append(whole("MLP dropout mask", mask * sbh))
    return tuple(out)


def layer_activation_bytes(shape: TransformerShape, micro_batch: int, element_bytes: int = 2, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           include_statistics: bool = True, linear_input_bytes: float | None = None) -> float:
    """The sum of `activation_tensors`; `include_statistics=False` leaves out the norms' fp32
    statistics, as the paper does."""
    return sum(t.bytes for t in activation_tensors(shape, micro_batch, element_bytes, tp, sequence_parallel,
                                                   recompute, linear_input_bytes)
               if include_statistics or "statistics" not in t.name)


def korthikanti_table2(s: int, b: int, h: int, a: int, t: int = 1, form: str = "tensor") -> float:
    """Korthikanti et al. 2022, Table 2: activation bytes per layer, as printed (the oracle that
    `activation_tensors` is checked against). `form`, the table's rows: "none" (no parallelism),
    "tensor" (tensor parallel, the baseline), "tensor+sequence", "tensor+selective",
    "tensor+sequence+selective", "full" (full activation recomputation)."""
    sbh = s * b * h
    forms = {"none": 34 + 5 * a * s / h, "tensor": 10 + 24 / t + 5 * a * s / (h * t),
             "tensor+sequence": 34 / t + 5 * a * s / (h * t), "tensor+selective": 10 + 24 / t,
             "tensor+sequence+selective": 34 / t, "full": 2}
    return sbh * forms[form]


def interleaved_factor(pipeline_stages: int, virtual_stages: int) -> float:
    """Korthikanti et al. §4.2.3: the first stage of an interleaved 1F1B schedule keeps
    (1 + (p - 1) / (p m)) times the activations of the non-interleaved one (L layers' worth)."""
    p, m = pipeline_stages, virtual_stages
    return 1.0 + (p - 1) / (p * m)


# ------------------------------------------------------------------------------------------- states
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of the model states on one data-parallel rank."""

    parameters: float  # the compute copy (16-bit in mixed precision; the fp32 weights otherwise)
    gradients: float
    optimizer: float  # Adam: fp32 master weights (mixed precision only), momentum and variance

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer


def state_bytes_per_param(mixed: bool, zero_stage: int = 0, data_parallel: int = 1,
                          fp32_gradients: bool = False) -> StateBytes:
    """ZeRO §3.1: per parameter, per data-parallel rank, Adam. `mixed`: 16-bit parameters and
    gradients with K = 12 bytes of fp32 optimizer states (master weights, momentum, variance);
    otherwise fp32 parameters and gradients with K = 8 (momentum, variance). `fp32_gradients`:
    the gradients accumulated in fp32 (Megatron-LM's main_grad: 18 bytes per parameter unsharded).
    ZeRO-1 shards the optimizer states over `data_parallel` ranks, ZeRO-2 the gradients too, ZeRO-3
    the parameters too."""
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage: expected one of {ZERO_STAGES}, got {zero_stage}")
    n = max(1, data_parallel)
    param = 2.0 if mixed else 4.0
    grad = 4.0 if (fp32_gradients or not mixed) else 2.0
    optimizer = 12.0 if mixed else 8.0
    return StateBytes(parameters=param / n if zero_stage >= 3 else param,
                      gradients=grad / n if zero_stage >= 2 else grad,
                      optimizer=optimizer / n if zero_stage >= 1 else optimizer)


def logits_bytes(tokens: int, vocab: int, element_bytes: int = 2, fp32_loss: bool = True) -> float:
    """The head's output and the loss's saved tensor for `tokens` tokens: the logits in the compute
    dtype, and the fp32 log-softmax the cross-entropy keeps when it upcasts (transformers' loss
    calls .float() on the logits): 4 x tokens x vocab bytes, ~2.5 GB for a 152k vocabulary at
    4,096 tokens."""
    return tokens * vocab * (element_bytes + (4 if fp32_loss else 0))
