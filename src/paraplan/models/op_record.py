"""The recording half of models/op_trace.py: a TorchDispatchMode that turns the aten calls of one
training iteration on meta into node records and storage edges, and what it knows of aten ops by name.

The mechanism (which ops are nodes, how views fold into edges, how backward ops are attributed to
autograd Nodes, the meta cache) is described in models/op_trace.py's docstring; op_trace drives the
iteration, this module records it. BATCH_OPERAND (the batch operand of convolutions and matmul-like
ops) is also what the operator runtime slices a split call by (runtime/dag/program.py, rank_step.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

_NO_NUMBERS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
               "_local_scalar_dense", "detach", "alias", "is_same_size", "sym_size", "sym_stride", "sym_numel",
               "sym_storage_offset", "size", "stride", "numel", "dim", "is_contiguous", "set_"}
CONV = {"convolution", "_convolution", "convolution_overrideable", "mkldnn_convolution"}
# convolutions and matmul-like ops: the tensor argument whose leading dimension holds the batch
BATCH_OPERAND = {**dict.fromkeys(CONV, 0), "mm": 0, "addmm": 1, "bmm": 0, "baddbmm": 1,
                 "_scaled_dot_product_flash_attention": 0, "_scaled_dot_product_flash_attention_for_cpu": 0,
                 "_scaled_dot_product_efficient_attention": 0, "_scaled_dot_product_cudnn_attention": 0,
                 "_efficient_attention_forward": 0, "_flash_attention_forward": 0}
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z0-9])(?=[A-Z][a-z])")  # MaxPool2DWith -> Max_Pool2D_With


@dataclass
class NodeRecord:
    """One node while a trace runs (mutable; becomes an OpNode after the affine fit)."""

    op: str
    phase: str
    module: str
    layer: int
    flops: float = 0.0
    bytes_accessed: float = 0.0
    output_bytes: float = 0.0
    param_bytes: int = 0
    rows: int = -1  # leading dimension of a conv / matmul operand (-1: not one)
    reads_params: bool = False
    forward_of: int = -1  # backward: the forward node that created this autograd Node
    name: str = ""
    calls: list = field(default_factory=list)  # (op, args, kwargs) with TensorSpecs, when recording


@dataclass
class Trace:
    recs: list[NodeRecord] = field(default_factory=list)
    edges: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)  # (src, dst) -> storage -> bytes


def _storage_bytes(t: torch.Tensor) -> tuple[int, int]:
    """(storage key, bytes the tensor spans: its elements, capped by its storage for expanded views)."""
    s = t.untyped_storage()
    return s._cdata, min(t.numel() * t.element_size(), s.nbytes())


def _tensors_in(args, kwargs) -> list[torch.Tensor]:
    found = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            found.extend(x for x in a if isinstance(x, torch.Tensor))
    return found


def _meta_of(value):
    if isinstance(value, torch.Tensor):
        return value.shape, value.stride(), value.dtype, value.device
    if isinstance(value, (list, tuple)):
        return tuple(_meta_of(v) for v in value)
    return type(value), value  # 2 and 2.0 hash alike but may give different dtypes


class TensorSpec(NamedTuple):
    """A tensor argument of a recorded aten call, without its values."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype


def _spec_of(value):
    if isinstance(value, torch.Tensor):
        return TensorSpec(tuple(value.shape), value.stride(), value.dtype)
    if isinstance(value, dict):
        return {k: _spec_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_spec_of(v) for v in value)
    return value


def _signature(func, args, kwargs) -> tuple | None:
    """What a meta kernel's outputs depend on: the op, shapes, strides, dtypes and the other
    arguments (meta tensors have no values). None when an argument cannot be hashed."""
    key = (func, _meta_of(args), _meta_of(tuple(kwargs.items())) if kwargs else ())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def backward_op_name(node) -> str:
    """ConvolutionBackward0 -> convolution_backward, MaxPool2DWithIndicesBackward0 ->
    max_pool2d_with_indices_backward (the autograd Node's name in snake case, as aten names ops)."""
    name = node.name().rsplit("::", 1)[-1].rstrip("0123456789")
    return _CAMEL.sub("_", name).lower()


class OpRecorder(TorchDispatchMode):
    """Records the forward's computing aten ops as nodes, then the backward's per autograd Node."""

    def __init__(self, params: dict[int, int], record_calls: bool = False):
        super().__init__()
        self.record_calls = record_calls
        self.params = params  # parameter storage key -> bytes
        self.trace = Trace()
        self.producer: dict[int, int] = {}  # storage key -> forward node that wrote it last
        self.keep: list[torch.Tensor] = []  # storage keys are addresses: keep them from being reused
        self.stack: list[str] = []
        self.layer = -1
        self.backward = False
        self.node_rec: dict[int, int] = {}  # id(autograd Node) -> rec index (backward)
        self.first_op_at_seq: dict[int, int] = {}  # autograd sequence nr -> forward rec (or -1 for a view)
        self.kinds: dict[object, tuple[bool, str, object, bool]] = {}  # op -> (skip, name, FLOPs, decomposes)
        self.next_seq = torch._C._autograd._get_sequence_nr
        self.meta_cache: dict[tuple, tuple] = {}  # op signature -> (output specs, is a tuple, FLOPs)
        # forward_program: every forward aten call as (op, args, kwargs, out, node index or -1)
        self.program: list | None = None

    def _kind(self, func) -> tuple[bool, str, object, bool]:
        kind = self.kinds.get(func)
        if kind is None:
            name, packet = func.__name__.split(".")[0], func._overloadpacket
            decomposes = (packet not in flop_registry and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), torch._C.DispatchKey.CompositeImplicitAutograd))
            kind = self.kinds[func] = (func.is_view or name in _NO_NUMBERS, name, flop_registry.get(packet), decomposes)
        return kind

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        skip, name, flop_fn, decomposes = self._kind(func)
        if decomposes:  # as FlopCounterMode: count the kernels it decomposes into
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if skip:
            if not self.backward:
                self.first_op_at_seq.setdefault(self.next_seq() - 1, -1)
            out = func(*args, **kwargs)
            if self.program is not None and not self.backward:
                self.program.append((func, args, kwargs, out, -1))
            return out
        ins = _tensors_in(args, kwargs)
        in_keys = [_storage_bytes(t) for t in ins]
        sig = None if func._schema.is_mutable else _signature(func, args, kwargs)
        hit = self.meta_cache.get(sig) if sig is not None else None
        if hit is not None:  # same op on the same shapes before: its outputs without the meta kernel
            specs, as_tuple, flops = hit
            outs = [torch.empty_strided(shape, stride, **kw) for shape, stride, kw in specs]
            out = tuple(outs) if as_tuple else outs[0]
            out_keys = [_storage_bytes(t) for t in outs]
        else:
            out = func(*args, **kwargs)
            outs = _tensors_in((out,), {})
            out_keys = [_storage_bytes(t) for t in outs]
            if outs and not func._schema.is_mutable and {k for k, _ in out_keys} <= {k for k, _ in in_keys}:
                if not self.backward:
                    self.first_op_at_seq.setdefault(self.next_seq() - 1, -1)
                    if self.program is not None:
                        self.program.append((func, args, kwargs, out, -1))
                return out  # a view in disguise (_unsafe_view): folded into edges like any view
            flops = flop_fn(*args, **kwargs, out_val=out) if flop_fn is not None else 0
            if sig is not None and outs and len({k for k, _ in out_keys}) == len(outs) and (
                    isinstance(out, torch.Tensor) or (isinstance(out, tuple) and len(outs) == len(out))):
                specs = [(tuple(t.shape), t.stride(), {"dtype": t.dtype, "device": t.device}) for t in outs]
                self.meta_cache[sig] = (specs, isinstance(out, tuple), flops)
        recs, edges = self.trace.recs, self.trace.edges
        if self.backward:
            node = torch._C._current_autograd_node()
            index = self.node_rec.get(id(node)) if node is not None else None
            if index is None:  # the loss's seed gradient, AccumulateGrad: no node
                return out
            rec = recs[index]
        else:
            index = len(recs)
            rec = NodeRecord(name, "forward", self.stack[-1] if self.stack else "", self.layer)
            recs.append(rec)
            self.first_op_at_seq.setdefault(self.next_seq() - 1, index)
            if name in BATCH_OPERAND and ins[BATCH_OPERAND[name]].dim():
                rec.rows = int(ins[BATCH_OPERAND[name]].shape[0])
            if self.program is not None:
                self.program.append((func, args, kwargs, out, index))
        rec.flops += flops
        if self.record_calls:
            rec.calls.append((func, _spec_of(args), _spec_of(kwargs)))
        seen_params = set()
        for key, nb in in_keys:
            rec.bytes_accessed += nb
            if key in self.params:
                rec.reads_params = True
                if not self.backward and key not in seen_params:
                    seen_params.add(key)
                    rec.param_bytes += self.params[key]
                continue
            src = self.producer.get(key)
            if src is not None and src != index:
                reads = edges.setdefault((src, index), {})
                reads[key] = max(reads.get(key, 0), nb)
        for key, nb in out_keys:
            rec.bytes_accessed += nb
            if not self.backward:
                rec.output_bytes += nb
                self.producer[key] = index
        self.keep.extend(outs)
        return out
