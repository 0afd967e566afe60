"""What the planners know about a model: an ordered list of layers with measured sizes.

Pure data: built once by `paraplan.models.measure` from a real `nn.Module` on the meta device,
then handed to cost models and planners, which never touch torch.

Every per-layer quantity is affine in the micro-batch size b, fitted from two measurements:
    quantity(b) = fixed + per_sample * b
`fixed` holds what does not scale with the batch (a causal mask, position embeddings, a
position bias); `per_sample` is the slope.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Affine:
    """fixed + per_sample * b, for b the micro-batch size (samples)."""

    fixed: float
    per_sample: float

    def at(self, batch: float) -> float:
        return self.fixed + self.per_sample * batch

    def scaled(self, factor: float) -> Affine:
        return Affine(self.fixed * factor, self.per_sample * factor)


# One pass's kernels by class, as models/op_inventory.py records them on meta and costs/op_roofline.py
# prices them.
@dataclass(frozen=True)
class Gemm:
    """`count` GEMMs of one shape: `batch` independent (M x K) @ (K x N) products, operands of
    `element_bytes` bytes. Each dimension is affine in the micro-batch."""

    batch: Affine
    m: Affine
    n: Affine
    k: Affine
    element_bytes: int  # 1: an FP8 GEMM (costs/fp8_linear.py), bf16 output, at the device's FP8 peak
    count: int = 1
    scale_bytes: float = 0.0  # per operand element: block scales read beside FP8 operands (MX: 1/32)


@dataclass(frozen=True)
class MemoryOp:
    """`count` memory-bound kernels, each reading and writing `nbytes` in all."""

    nbytes: Affine
    count: int = 1


@dataclass(frozen=True)
class PassOps:
    """One pass (forward or backward) of one layer, by operator class."""

    gemms: tuple[Gemm, ...] = ()
    memory_ops: tuple[MemoryOp, ...] = ()
    attention_flops: Affine = Affine(0.0, 0.0)  # fused attention kernels: the FLOPs they do
    attention_bytes: Affine = Affine(0.0, 0.0)
    attention_kernels: int = 0
    other_flops: Affine = Affine(0.0, 0.0)  # convolutions and other compute with a FLOP formula
    other_bytes: Affine = Affine(0.0, 0.0)
    other_kernels: int = 0

    @property
    def n_kernels(self) -> int:
        return (sum(g.count for g in self.gemms) + sum(m.count for m in self.memory_ops) + self.attention_kernels
                + self.other_kernels)


# The busiest expert-parallel rank's expert work over the average under real routing (issue 50 item 2;
# `?expert_imbalance=` on the model reference sets it, 1 for the forced balance of benchmark tables).
# From measured step times (Megatron-MoE-ModelZoo best_practice: real routing loses 2-4% against forced
# balance on Mixtral 8x22B and 8-20% on Qwen3-235B): with the experts at ~half of a step's compute,
# a 1.15 factor on their work costs ~7%, between the two. An input, not fitted to any run.
DEFAULT_EXPERT_IMBALANCE = 1.15


@dataclass(frozen=True)
class LayerExperts:
    """A mixture-of-experts layer's routed experts, as the expert costs need them
    (costs/expert_costs.py; models/moe_spec.py reads them from the module)."""

    experts: int  # E: routed experts
    top_k: int  # routed experts each token runs through
    routed_params: int  # every routed expert's parameters: what expert parallelism shards
    routed_flops_per_token: float  # forward FLOPs of one token through its top-k routed experts
    shared_flops_per_token: float  # ... through the shared experts every token runs (0: none)
    hidden: int  # elements of one token as dispatched to its experts (the router's input width)
    tokens_per_sample: int  # tokens one sample routes (its sequence length)
    groups: int = 1  # group-limited routing (DeepSeek-V3): experts in `groups` groups ...
    topk_groups: int = 0  # ... of which a token reaches at most this many (0: not limited)
    imbalance: float = DEFAULT_EXPERT_IMBALANCE  # busiest ep rank's expert work / the average
    capacity_factor: float | None = None  # tokens over factor x an expert's even share dropped; None: dropless
    # which experts a token reaches: "uniform" (real routing's expectation, Megatron's forced balance) or
    # "round-robin" (NeMo Automodel's FakeBalancedGate: token t to experts t k ... t k + k - 1 mod E); only
    # what crosses the network with a de-duplicating dispatcher depends on it (costs/deepep.py)
    routing: str = "uniform"


@dataclass(frozen=True)
class LayerSpec:
    """One element of the ordered sequence a pipeline cuts (a transformer block, a conv block).

    Byte counts are for the dtype the model was measured in (fp32 unless stated in ModelSpec).
    """

    index: int
    name: str
    kind: str  # "embedding" | "block" | "head" | "conv" | "fc" | "downsample" | ...
    param_count: int  # parameters this layer owns (a tied weight is owned by its first layer)
    param_bytes: int
    shared_param_bytes: int  # tied weights this layer uses but an earlier layer owns (GPT-2's head)
    shared_owners: tuple[int, ...]  # the layers that own those tied weights
    forward_flops: Affine  # measured by torch.utils.flop_counter on the meta device
    backward_flops: Affine
    output_bytes: Affine  # the activation that crosses a pipeline cut after this layer
    output_grad_bytes: Affine  # its gradient coming back (float tensors only: token ids have none)
    saved_bytes: Affine  # what autograd keeps for this layer's backward (inputs it saves included)
    forward_ops: int  # aten kernels launched by one forward (for per-kernel overheads)
    backward_ops: int
    # the attention core (Korthikanti et al. 2022 §5: QK^T, softmax, its dropout, attention over V):
    # what of saved_bytes it keeps (the [.., s, s] tensors) and its forward FLOPs, which selective
    # recomputation trades for each other; 0 where the layer has no materialised attention (none, or
    # a fused kernel that keeps no s x s tensor)
    attention_core_bytes: Affine = Affine(0.0, 0.0)
    attention_core_flops: Affine = Affine(0.0, 0.0)
    # zero-bubble's split backward as torch runs it (pipelining/_backward.py): the gradients its
    # input-gradient pass (I) keeps for the weight-gradient pass (W), beyond saved_bytes (the graph,
    # its saved tensors included, is retained from I to W too)
    weight_grad_input_bytes: Affine = Affine(0.0, 0.0)
    # the kernels of one forward and one backward by operator class (models/op_inventory.py), for the
    # per-operator cost model (costs/op_roofline.py); None where not measured (built by hand, or a
    # layer whose kernels change with the batch size): the layer roofline prices it
    # bytes per element of the output (the residual stream between blocks: fp32 under autocast, where
    # the block's matmuls run in 16 bits); 0: not measured (taken as the compute dtype's)
    output_element_bytes: int = 0
    # the loss's backward (the last layer's): the gradients it makes of what it saved (the fp32
    # log-softmax's) live beside the gradient of the logits and every layer's activations: the
    # moment a stage holding the loss peaks at (costs/memory.py)
    loss_gradient_bytes: Affine = Affine(0.0, 0.0)
    forward_inventory: PassOps | None = field(default=None, compare=False)
    backward_inventory: PassOps | None = field(default=None, compare=False)
    experts: LayerExperts | None = None  # a mixture-of-experts layer's routed experts; None: dense
    # K (and V) of the layer's attention over its output, per token: grouped-query attention's
    # kv_heads / heads (what context parallelism's ring moves: costs/axis_costs.py); 1.0 where the
    # shape is not known (an upper bound), set from the engine's block shape (costs/engine_memory.py)
    kv_fraction: float = 1.0
    # bytes per element its weights are all-gathered in (FSDP, ZeRO's parameter gather) where not the
    # compute dtype: an fp8 plan's FP8 parameter all-gather (1); 0: the compute dtype
    gathered_element_bytes: int = 0

    @property
    def flops_per_sample(self) -> float:
        return self.forward_flops.per_sample


@dataclass(frozen=True)
class InputSpec:
    """What one sample looks like, so that synthetic batches and byte counts can be made."""

    kind: str  # "tokens" | "seq2seq" | "image" | "sample"
    seq_len: int = 0
    decoder_seq_len: int = 0
    vocab_size: int = 0
    image_size: int = 0
    channels: int = 0
    num_classes: int = 0
    description: str = ""  # kind "sample" (a user's module): the sample batch it was built with

    def describe(self) -> str:
        if self.kind == "sample":
            return self.description
        if self.kind == "tokens":
            return f"tokens: seq {self.seq_len}, vocab {self.vocab_size}"
        if self.kind == "seq2seq":
            return f"tokens: encoder seq {self.seq_len}, decoder seq {self.decoder_seq_len}, vocab {self.vocab_size}"
        return f"image: {self.channels}x{self.image_size}x{self.image_size}, {self.num_classes} classes"


@dataclass(frozen=True)
class ModelSpec:
    """An ordered list of layers plus what the input looks like."""

    name: str
    family: str
    layers: tuple[LayerSpec, ...]
    inputs: InputSpec
    input_bytes: Affine  # the batch itself (what the first stage receives)
    dtype_bytes: int = 4
    notes: tuple[str, ...] = field(default_factory=tuple)
    ref: str = ""  # the model reference it was built from (models/ref.py); identifies it for profiles
    # bytes of one activation element as a plan computes it: dtype_bytes as measured, 2 in mixed
    # precision (`in_compute_dtype`); parameters keep dtype_bytes (the fp32 master weights)
    compute_dtype_bytes: int = 4

    def in_compute_dtype(self, element_bytes: int) -> ModelSpec:
        """The model as a plan computing in `element_bytes`-byte activations sees it: every layer's
        saved tensors, output and output gradient scaled from the measured dtype (the parameters and
        the input batch are not: fp32 master weights, token ids). An approximation where a layer
        keeps some tensors in fp32 under autocast (norm statistics, the loss's log-softmax), which
        costs/transformer_memory.py counts tensor by tensor."""
        factor = element_bytes / self.compute_dtype_bytes
        if factor == 1:
            return self
        layers = tuple(replace(layer, saved_bytes=layer.saved_bytes.scaled(factor),
                               attention_core_bytes=layer.attention_core_bytes.scaled(factor),
                               output_bytes=layer.output_bytes.scaled(factor),
                               output_grad_bytes=layer.output_grad_bytes.scaled(factor),
                               output_element_bytes=round(layer.output_element_bytes * factor),
                               loss_gradient_bytes=layer.loss_gradient_bytes.scaled(factor),
                               # its kernels were inventoried in the other dtype: the layer roofline
                               forward_inventory=None, backward_inventory=None) for layer in self.layers)
        return replace(self, layers=layers, compute_dtype_bytes=element_bytes)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def param_count(self) -> int:
        return sum(layer.param_count for layer in self.layers)

    @property
    def param_bytes(self) -> int:
        return sum(layer.param_bytes for layer in self.layers)

    def activation_bytes_per_sample(self) -> float:
        """Sum over layers of what autograd keeps for backward, per sample (Galvatron Table I's
        "Acti. Size/sample" is compared with this in docs/models.md)."""
        return sum(layer.saved_bytes.per_sample for layer in self.layers)
