"""Measure every layer of a model on the meta device: parameters, FLOPs, activation bytes.

Nothing is typed in by hand and no weights are allocated: the model is built on "meta", a
synthetic batch of the right shapes flows through the layers one at a time, and
  - torch.utils.flop_counter.FlopCounterMode counts forward and backward FLOPs,
  - autograd's saved-tensor hooks see what each layer keeps for its backward,
  - the output's shapes give the bytes that cross a pipeline cut,
  - a dispatch mode counts the aten kernels each pass launches.
Each quantity is measured at two batch sizes and fitted as fixed + per_sample * b (see spec.py).

Definition of "saved bytes" (compared with Galvatron Table I in docs/models.md): the tensors
autograd keeps for this layer's backward, the layer's own input included when an op saves it,
parameters excluded, each underlying storage counted once.

Mixed precision (`precision` bf16 / fp16): the layers are measured as the runtime runs them,
under autocast (runtime/rank/mixed_precision.py). Autocast does not act on meta tensors, so
`Autocast16` (models/autocast_meta.py) does its work one level up, where autograd sees it: the
floating inputs of the ops autocast runs in 16 bits (its lower-precision list, common to the CPU and CUDA: linear, matmul
and the mm family, convolutions, scaled-dot-product attention, einsum) are cast first. What a
layer keeps is then what autocast keeps: 16-bit matmul inputs and outputs, an fp32 residual
stream, fp32 norms of fp32 inputs. Autocast's 16-bit weight copies are saved too; they are not
activations (the memory model counts them once per weight: LayerMemory.copy_bytes). CUDA's
autocast also runs softmax, log-softmax and the norms in fp32 whatever their input; that list is not
emulated (an eager attention's softmax is counted in 16 bits, as the CPU keeps it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import replace

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from paraplan.models.adapters import decompose  # noqa: F401  (tests reach it through here)
from paraplan.models.attention_kernel import ATTENTION, AttentionCore, SdpaKernel
from paraplan.models.autocast_meta import Autocast16
from paraplan.models.built import BuiltModel
from paraplan.models.failures import MEASURE_ADVICE, model_step
from paraplan.models.inputs import make_batch
from paraplan.models.op_inventory import OpInventory, fit_pass
from paraplan.models.spec import Affine, InputSpec, LayerSpec, ModelSpec
from paraplan.models.tensors import float_nbytes, nbytes, tensors
from paraplan.models.weight_grads import gradients_kept_for_weights

# Two batch sizes for the affine fit; 1 is avoided because some kernels special-case it.
_FIT_BATCHES = (2, 4)

# Ops that launch no kernel (views, metadata) are not counted as kernels.
_NO_KERNEL = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze",
              "reshape", "detach", "alias", "slice", "select", "split", "split_with_sizes", "unbind",
              "as_strided", "_reshape_alias", "empty", "empty_like", "new_empty", "lift_fresh", "view_as",
              "chunk", "narrow", "flatten", "unflatten", "_to_copy", "to", "empty_strided", "zeros_like",
              "ones_like"}


class _KernelCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] not in _NO_KERNEL:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _detach_inputs(value):
    """A fresh leaf per layer: float tensors require grad so the backward reaches the input."""
    if isinstance(value, torch.Tensor):
        leaf = value.detach()
        if leaf.is_floating_point():
            leaf.requires_grad_(True)
        return leaf
    if isinstance(value, (tuple, list)):
        return type(value)(_detach_inputs(v) for v in value)
    return value


def _is_weight_copy(t: torch.Tensor) -> bool:
    """A 16-bit copy of a parameter (a cast whose input is a leaf autograd accumulates into)."""
    fn = t.grad_fn
    return fn is not None and type(fn).__name__ == "ToCopyBackward0" and bool(fn.next_functions) and \
        type(fn.next_functions[0][0]).__name__ == "AccumulateGrad"


def _measure_once(layer: nn.Module, x, params: set[int], compute_dtype: torch.dtype | None = None,
                  attention: str = "math") -> tuple[object, dict[str, int]]:
    x = _detach_inputs(x)
    saved: dict[int, int] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    keep_alive: list[torch.Tensor] = []  # ids are only unique while the objects live

    in_sdpa: set[int] = set()  # saved inside SDPA's math path, not its inputs: its attention core

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        if id(base) not in params and id(t) not in params and not _is_weight_copy(base):
            keep_alive.append(base)
            saved[id(base)] = base.numel() * base.element_size()
            shapes[id(base)] = tuple(base.shape)
            if sdpa.in_core(base) and sdpa.in_core(t):
                in_sdpa.add(id(base))
        return t

    kernels = _KernelCounter()
    core = AttentionCore()
    cast = Autocast16(compute_dtype) if compute_dtype is not None else contextlib.nullcontext()
    sdpa = fused = SdpaKernel(attention)
    fwd_inventory, bwd_inventory = OpInventory(), OpInventory()
    with FlopCounterMode(display=False) as fwd_flops, kernels, fwd_inventory, core, fused, cast, \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = layer(x)
    fwd_kernels = kernels.count
    outputs = [t for t in tensors(y) if t.requires_grad]
    bwd_kernels = _KernelCounter()
    kept_for_weights = gradients_kept_for_weights(outputs, x, [p for p in layer.parameters() if p.requires_grad])
    with FlopCounterMode(display=False) as bwd_flops, bwd_kernels, bwd_inventory:
        if outputs:
            torch.autograd.backward(outputs, [torch.ones_like(t) for t in outputs])
    # each measurement on its own: gradients left on the parameters would make the next batch size's
    # backward accumulate into them, running ops this one did not (fit_pass then averages the two
    # inventories and loses the batch-independent bytes: a bf16 weight's fp32 gradient cast)
    for p in layer.parameters():
        p.grad = None
    stats = {
        "fwd_flops": fwd_flops.get_total_flops(),
        "bwd_flops": bwd_flops.get_total_flops(),
        "out_bytes": nbytes(y),
        "out_grad_bytes": float_nbytes(y),
        "out_element_bytes": max((t.element_size() for t in tensors(y) if t.is_floating_point()), default=0),
        "saved_bytes": sum(saved.values()),
        # SDPA's math path: what it saves (its own fp32 copies of q, k, v included) less the inputs a
        # checkpoint around it keeps instead; an eager attention: its s x s tensors (Korthikanti's 5as^2b)
        "core_bytes": max(0, sum(b for key, b in saved.items() if key in in_sdpa) - (sdpa.input_bytes if in_sdpa else 0))
        + sum(b for key, b in saved.items() if key not in in_sdpa and core.kept(shapes[key])),
        "core_flops": core.flops(),
        "weight_grad_input_bytes": sum(kept_for_weights),
        "fwd_ops": fwd_kernels,
        "bwd_ops": bwd_kernels.count,
        "fwd_inventory": fwd_inventory.entries,
        "bwd_inventory": bwd_inventory.entries,
    }
    return _detach_outputs(y), stats



def _detach_outputs(value):
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (tuple, list)):
        return type(value)(_detach_outputs(v) for v in value)
    return value


# attributes that only number a block (transformers' attention `layer_idx`): not part of its build
_NUMBERING = frozenset({"layer_idx", "layer_id", "block_idx"})


def _plain(value) -> bool:
    if isinstance(value, (bool, int, float, str, type(None))):
        return True
    return isinstance(value, tuple) and all(_plain(v) for v in value)


def _signature(module: nn.Module, x) -> tuple:
    """How a layer is built, as far as measuring it can tell: every submodule's class, its plain
    attributes (sizes, flags, shift sizes...; not its number), parameter and buffer shapes, and the
    input's shapes."""
    inputs = tuple((tuple(t.shape), t.dtype, t.requires_grad) for t in tensors(x))
    parts = []
    for path, m in module.named_modules():
        attrs = tuple(sorted((k, _drop_rate(m, k, v)) for k, v in vars(m).items()
                             if not k.startswith("_") and k not in _NUMBERING and _plain(v)))
        params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters(recurse=False))
        buffers = tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers(recurse=False))
        parts.append((path, type(m).__module__, type(m).__qualname__, attrs, params, buffers))
    return inputs, tuple(parts)


def _drop_rate(module: nn.Module, name: str, value):
    """A dropout probability as whether it drops at all: on meta the rate changes only values, while
    zero skips the op. Stochastic depth gives each block its own rate (Swin-H's 32 blocks, 0 to
    0.1), which made every block look built differently and measured anew."""
    if isinstance(value, float) and ("drop" in name or (name == "p" and isinstance(module, nn.modules.dropout._DropoutNd))):
        return value > 0
    return value


def _fit(small: float, large: float) -> Affine:
    b0, b1 = _FIT_BATCHES
    per_sample = (large - small) / (b1 - b0)
    fixed = max(0.0, small - per_sample * b0)
    return Affine(fixed=fixed, per_sample=max(0.0, per_sample))


def _loss_saved_bytes(loss, out, targets, compute_dtype: torch.dtype | None) -> int:
    """What `loss(out, targets)` keeps for its backward (under the same casts as the layers)."""
    out = _detach_inputs(out)
    saved: dict[int, int] = {}
    keep_alive: list[torch.Tensor] = []

    def pack(t: torch.Tensor):
        base = t._base if t._base is not None else t
        keep_alive.append(base)
        saved[id(base)] = base.numel() * base.element_size()
        return t

    cast = Autocast16(compute_dtype) if compute_dtype is not None else contextlib.nullcontext()
    try:
        with cast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss(out, targets)
    except (RuntimeError, ValueError, TypeError):
        # an output the loss cannot take is the run's pre-flight check to report (runtime/launcher/preflight.py),
        # in one line before launch; measuring goes on without the loss's tensors
        return 0
    return sum(saved.values())


def measure_layers(layers: Iterable[tuple[str, str, nn.Module]], inputs: InputSpec, name: str = "model",
                   family: str = "sequential", progress=None, batch=None, compute_dtype: torch.dtype | None = None,
                   loss=None, attention: str = "math") -> ModelSpec:
    """`batch(b, device)` makes (inputs, targets) for b samples (default: from the InputSpec)."""
    """Measure an ordered list of (name, kind, module), on the device its parameters live on."""
    layers = list(layers)
    owned: list[tuple[int, int, int, tuple[int, ...]]] = []  # (count, bytes, shared bytes, owners) per layer
    owner_of: dict[int, int] = {}
    for index, (_, _, module) in enumerate(layers):
        count = owned_bytes = shared = 0
        owners: set[int] = set()
        for p in module.parameters():
            if id(p) in owner_of:
                shared += p.numel() * p.element_size()
                owners.add(owner_of[id(p)])
            else:
                owner_of[id(p)] = index
                count += p.numel()
                owned_bytes += p.numel() * p.element_size()
        owned.append((count, owned_bytes, shared, tuple(sorted(owners))))
    params = {id(p) for _, _, m in layers for p in m.parameters()}
    # Meta for zoo models; a user's small module built on the CPU is measured where it lives.
    first = next((p for _, _, m in layers for p in m.parameters()), None)
    device = first.device if first is not None else torch.device("meta")

    batch_fn = batch
    per_batch: list[list[dict[str, int]]] = []
    input_bytes = []
    for batch in _FIT_BATCHES:
        x, targets = batch_fn(batch, device) if batch_fn is not None else make_batch(inputs, batch, device=device)
        input_bytes.append(nbytes(x))
        stats = []
        measured: dict[tuple, tuple[object, dict[str, int]]] = {}
        for _, _, module in layers:
            # On meta, values do not exist: a layer built exactly like one already measured, fed an
            # input of the same shape, measures the same (GPT-2 XL's 48 blocks: one measurement)
            key = _signature(module, x) if device.type == "meta" else None
            if key is not None and key in measured:
                x, s = measured[key]
            else:
                x, s = _measure_once(module, x, params, compute_dtype, attention)
                if key is not None:
                    measured[key] = (x, s)
            stats.append(s)
            if progress is not None:
                progress()
        if loss is not None and stats:
            # the loss keeps its own tensors until the backward (the log-softmax of the logits, in
            # fp32 under autocast: 4 bytes x sequence x vocabulary per sample): the last layer's;
            # its backward makes a gradient of each (LayerSpec.loss_gradient_bytes)
            kept = _loss_saved_bytes(loss, x, targets, compute_dtype)
            stats[-1] = {**stats[-1], "saved_bytes": stats[-1]["saved_bytes"] + kept, "loss_bytes": kept}
        per_batch.append(stats)

    specs = []
    for i, (layer_name, kind, _) in enumerate(layers):
        small, large = per_batch[0][i], per_batch[1][i]
        count, owned_bytes, shared, owners = owned[i]
        specs.append(LayerSpec(
            index=i, name=layer_name, kind=kind, param_count=count, param_bytes=owned_bytes, shared_param_bytes=shared,
            shared_owners=owners,
            forward_flops=_fit(small["fwd_flops"], large["fwd_flops"]),
            backward_flops=_fit(small["bwd_flops"], large["bwd_flops"]),
            output_bytes=_fit(small["out_bytes"], large["out_bytes"]),
            output_grad_bytes=_fit(small["out_grad_bytes"], large["out_grad_bytes"]),
            saved_bytes=_fit(small["saved_bytes"], large["saved_bytes"]),
            forward_ops=small["fwd_ops"], backward_ops=small["bwd_ops"], output_element_bytes=small["out_element_bytes"],
            attention_core_bytes=_fit(small["core_bytes"], large["core_bytes"]),
            attention_core_flops=_fit(small["core_flops"], large["core_flops"]),
            weight_grad_input_bytes=_fit(small["weight_grad_input_bytes"], large["weight_grad_input_bytes"]),
            loss_gradient_bytes=_fit(small.get("loss_bytes", 0), large.get("loss_bytes", 0)),
            forward_inventory=fit_pass(small["fwd_inventory"], large["fwd_inventory"], _FIT_BATCHES),
            backward_inventory=fit_pass(small["bwd_inventory"], large["bwd_inventory"], _FIT_BATCHES),
        ))
    return ModelSpec(name=name, family=family, layers=tuple(specs), inputs=inputs,
                     input_bytes=_fit(*input_bytes),
                     compute_dtype_bytes=4 if compute_dtype is None else torch.finfo(compute_dtype).bits // 8)


def measure(built: BuiltModel, progress=None, precision: str = "fp32", attention: str = "math") -> ModelSpec:
    """Measure a zoo model (built on any device; measurement itself runs on meta copies of the
    shapes, so a model built on "meta" is the cheap way), as a plan in `precision` runs it, its
    scaled-dot-product attention kept as `attention` says (`SdpaKernel`: "fused", "cpu", "math")."""
    if attention not in ATTENTION:
        raise ValueError(f"attention: expected one of {ATTENTION}, got {attention!r}")
    from paraplan.precision import Precision, compute_precision

    # an fp8 plan's layers run in bf16 but for its linears' GEMMs, which costs/fp8_linear.py prices
    compute_dtype = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(compute_precision(precision))
    if next(iter(built.module.parameters()), torch.empty(0, device="meta")).device.type != "meta":
        built = _meta_copy(built)
    built.module.train()  # dropout and friends as in training, so saved tensors are what training keeps
    with model_step(built.ref or built.name, "measuring its layers on the meta device", MEASURE_ADVICE):
        spec = measure_layers(built.layers(), built.inputs, built.name, built.family, progress,
                              batch=lambda b, device: built.batch(b, device=device), compute_dtype=compute_dtype,
                              loss=built.loss, attention=attention)
    return replace(with_experts(spec, built), ref=built.ref or built.name)


def with_experts(spec: ModelSpec, built: BuiltModel) -> ModelSpec:
    """The measured layers with the routed experts each holds (models/moe_spec.py: layer_experts), at
    the reference's `expert_imbalance` and `expert_routing`; a dense model unchanged (and those settings
    refused)."""
    from paraplan.errors import FieldError
    from paraplan.models.moe_spec import layer_experts
    from paraplan.models.ref import parse

    ref = parse(built.ref) if built.ref else None
    imbalance = ref.expert_imbalance if ref is not None else None
    routing = ref.expert_routing if ref is not None else None
    experts = layer_experts(built.module, [m for _, _, m in built.layers()], built.inputs.seq_len or 1,
                            **({"imbalance": imbalance} if imbalance is not None else {}),
                            **({"routing": routing} if routing is not None else {}),
                            capacity_factor=ref.capacity_factor if ref is not None else None)
    if not any(experts):
        if imbalance is not None:
            raise FieldError("expert_imbalance", f"{built.name} has no routed experts to balance")
        if routing is not None:
            raise FieldError("expert_routing", f"{built.name} has no routed experts to route")
        return spec
    return replace(spec, layers=tuple(replace(layer, experts=e) for layer, e in zip(spec.layers, experts, strict=True)))


def _meta_copy(built: BuiltModel) -> BuiltModel:
    from paraplan.models.source import build

    return build(built.ref or built.name, device="meta")
