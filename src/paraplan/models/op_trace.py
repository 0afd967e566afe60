"""The operator DAG of one training iteration (forward, loss, backward), traced on the meta device.

FD-DPS (Zeng et al., Mathematics 2022, Sec. 3 Definition 1) schedules a graph G(O, E) of operators;
this module builds it for any model paraplan can build, without weights, as models/opspec.OpGraph.

Mechanism, and why:
  - The iteration is the one the project runs: `built.layers()` applied in order (as the runtime's
    stages compose them), then `built.loss`, then `loss.backward()`, all on "meta".
  - Forward nodes: a TorchDispatchMode sees every aten op below autograd (dropout = empty_like +
    bernoulli_ + div_ + mul, sdpa's math path = bmm + softmax + bmm: the kernels that would run).
    Every op is a node but those that compute nothing: a view by its schema (view, t, expand,
    detach, split, ...), a non-mutating op whose outputs share an input's storage (_unsafe_view),
    an op that writes no numbers (empty*, lift_fresh, metadata). Those fold into edges: tensors
    are tracked by storage, so a view's consumer reads from the op that last wrote its base.
  - Backward nodes: one per autograd Node reachable from the loss, AccumulateGrad excluded (it only
    stores a gradient; the Node computing it gets the parameter's bytes as `param_bytes`). The aten
    ops a Node runs are attributed to it by `torch._C._current_autograd_node()` and summed. One
    node per Node makes the backward checkable against the autograd graph; Nodes that run no
    kernel (ViewBackward) stay as zero-cost nodes so the autograd edges stay intact. Order: the
    engine's execution order (a post-hook per Node), which is topological.
  - Module of a backward Node: autograd numbers Nodes in creation order (`_sequence_nr`); the
    forward records the counter at every module entry/exit, so a Node belongs to the module that was
    innermost when it was created (a bisect, no per-op work).
  - Module paths: forward pre/post hooks on every module (torch.utils.module_tracker gives only
    the set of active parents; torch.distributed._tools.mod_tracker is off limits outside runtime
    and profiling). Paths are the model's (`transformer.h.0.attn`); adapter wrappers outside the
    model are named after their layer ("block0"). `layer` is the running layer; the loss runs in
    module "loss", layer -1.
  - FLOPs: torch.utils.flop_counter's registry, called as FlopCounterMode calls it (including its
    decomposition of CompositeImplicit ops without a formula), so totals equal FlopCounterMode's.
  - Edges: producer -> consumer, bytes = what the consumer reads of the producer's storages (each
    once). Forward op -> backward Node for each saved tensor its kernels read; Node -> next Node
    per autograd edge, bytes = the gradient passed (seen by the post-hook).
  - Speed: meta kernels are mostly Python; an op seen before on the same shapes/arguments gets
    its outputs from a cache (empty_strided) instead, and the GC is off during the trace.
  - No optimizer nodes: the step is per-parameter elementwise work independent of the batch; the
    cost model prices it from param_bytes.

splittable (FD-DPS Sec. 4.1 splits "computationally intensive operators" along the batch, each
part using "the entire convolution kernel tensor"): "batch" for a convolution, and for a matmul
(mm, addmm, bmm, baddbmm, fused attention) whose leading dimension is the batch times a constant
(fitted from the two traces) and which either reads no parameters (attention's activation x
activation products) or processes more than one row per sample (token-level linears, where each
weight is reused seq_len times per sample). A matmul with parameters and one row per sample is the
parameter-heavy fully connected layer (VGG's fc6, a classifier): not split, since every part would
read the whole weight for one row. A backward Node inherits the flag of the forward op that created
it (a batch-split conv/matmul backward: input-gradient parts concatenate, weight-gradient parts sum).

Affine values come from two traces (batches 2 and 4 by default, 1 avoided as in measure.py) that
must have the same node names and edges; otherwise a one-line OpGraphError.
"""

from __future__ import annotations

import contextlib
import gc
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from paraplan.errors import ParaplanError
from paraplan.models.built import BuiltModel
from paraplan.models.opspec import OpEdge, OpGraph, OpNode
from paraplan.models.spec import Affine

_NO_NUMBERS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
               "_local_scalar_dense", "detach", "alias", "is_same_size", "sym_size", "sym_stride", "sym_numel",
               "sym_storage_offset", "size", "stride", "numel", "dim", "is_contiguous", "set_"}
_CONV = {"convolution", "_convolution", "convolution_overrideable", "mkldnn_convolution"}
# convolutions and matmul-like ops: the tensor argument whose leading dimension holds the batch
_BATCH_OPERAND = {**dict.fromkeys(_CONV, 0), "mm": 0, "addmm": 1, "bmm": 0, "baddbmm": 1,
                  "_scaled_dot_product_flash_attention": 0, "_scaled_dot_product_flash_attention_for_cpu": 0,
                  "_scaled_dot_product_efficient_attention": 0, "_scaled_dot_product_cudnn_attention": 0,
                  "_efficient_attention_forward": 0, "_flash_attention_forward": 0}
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z0-9])(?=[A-Z][a-z])")  # MaxPool2DWith -> Max_Pool2D_With


class OpGraphError(ParaplanError):
    """The model's operator graph cannot be built (its structure changes with the batch)."""


@dataclass
class _Rec:
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
class _Trace:
    recs: list[_Rec] = field(default_factory=list)
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


@contextlib.contextmanager
def _no_gc():
    """Tens of thousands of live meta tensors make every collection slow (25% of the time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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


def operator_calls(built: BuiltModel, batch: int) -> dict[str, list[tuple]]:
    """Node name -> the aten calls it runs at `batch` as (op, args, kwargs), tensors as TensorSpecs:
    what profiling/operators.py replays on a real device. Names as in build_op_graph."""
    with _no_gc():
        trace, names = _trace(built, batch, record_calls=True)
    return {name: r.calls for name, r in zip(names, trace.recs, strict=True)}


def forward_program(built: BuiltModel, batch: int) -> tuple[_Trace, list[str], dict]:
    """The trace of build_op_graph at `batch` (same node names) plus what makes its forward
    executable (runtime/dag_graph.py): every forward aten call in order as (op, args, kwargs,
    out, node index, -1 for a view or an allocation) with the meta tensors themselves (their
    identities say which call produced what), the batch's inputs and targets, the loss, and the
    modules (for parameter and buffer names). Backward nodes carry `forward_of` as in the graph."""
    program: dict = {}
    with _no_gc():
        trace, names = _trace(built, batch, program=program)
    return trace, names, program


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


class _Recorder(TorchDispatchMode):
    """Records the forward's computing aten ops as nodes, then the backward's per autograd Node."""

    def __init__(self, params: dict[int, int], record_calls: bool = False):
        super().__init__()
        self.record_calls = record_calls
        self.params = params  # parameter storage key -> bytes
        self.trace = _Trace()
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
            rec = _Rec(name, "forward", self.stack[-1] if self.stack else "", self.layer)
            recs.append(rec)
            self.first_op_at_seq.setdefault(self.next_seq() - 1, index)
            if name in _BATCH_OPERAND and ins[_BATCH_OPERAND[name]].dim():
                rec.rows = int(ins[_BATCH_OPERAND[name]].shape[0])
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


def _module_names(built: BuiltModel, layers) -> dict[int, str]:
    """id(module) -> path: the model's own path, else (an adapter's wrapper) its layer's name."""
    names: dict[int, str] = {}
    for path, m in built.module.named_modules():
        names.setdefault(id(m), path)
    for layer_name, _, layer in layers:
        for sub, m in layer.named_modules():
            names.setdefault(id(m), f"{layer_name}.{sub}" if sub else layer_name)
    return names


def _trace(built: BuiltModel, batch: int, record_calls: bool = False,
           program: dict | None = None) -> tuple[_Trace, list[str]]:
    """One iteration at `batch` on meta: the recorded nodes and edges; node names are set.
    `program` (a dict, filled in): the forward's aten calls and what they read (forward_program)."""
    built.module.train()  # dropout as in training
    layers = built.layers()
    names = _module_names(built, layers)
    modules = {id(m): m for root in (built.module, *(layer for _, _, layer in layers)) for m in root.modules()}
    params = {p.untyped_storage()._cdata: p.untyped_storage().nbytes()
              for root in (built.module, *(layer for _, _, layer in layers)) for p in root.parameters()}
    rec = _Recorder(params, record_calls)
    seq = rec.next_seq
    bounds: list[tuple[int, str, int]] = []  # (sequence nr, module path, layer) at every module entry/exit

    def mark():
        bounds.append((seq(), rec.stack[-1] if rec.stack else "", rec.layer))

    def pre(module, _args):
        rec.stack.append(names[id(module)])
        mark()

    def post(_module, _args, _out):
        rec.stack.pop()
        mark()

    handles = []
    for m in modules.values():
        handles.append(m.register_forward_pre_hook(pre))
        handles.append(m.register_forward_hook(post, always_call=True))
    inputs, targets = built.batch(batch, device="meta")
    if program is not None:
        rec.program = []
    try:
        with rec:
            out = inputs
            for i, (_, _, layer) in enumerate(layers):
                rec.layer = i
                out = layer(out)
            rec.layer = -1
            rec.stack.append("loss")
            mark()
            loss = built.loss(out, targets)
            rec.stack.pop()
    finally:
        for h in handles:
            h.remove()
    n_forward = len(rec.trace.recs)
    if program is not None:
        program.update(calls=rec.program, inputs=inputs, targets=targets, loss=loss, modules=modules)
        rec.program = None
    walked, order = _backward_nodes(loss, rec, bounds), []
    hook_handles = [node.register_hook(_post_hook(order, i)) for i, node in enumerate(walked)]
    rec.backward = True
    with rec:
        loss.backward()
    for h in hook_handles:
        h.remove()
    if len(order) != len(walked):
        raise RuntimeError(f"{len(walked) - len(order)} autograd nodes reachable from the loss did not run")
    _renumber_backward(rec.trace, n_forward, walked, order)
    _name(rec.trace.recs)
    return rec.trace, [r.name for r in rec.trace.recs]


def _backward_nodes(loss: torch.Tensor, rec: _Recorder, bounds) -> list:
    """Every autograd Node reachable from the loss but AccumulateGrad, each given a rec (module by
    its sequence number, see the module docstring), in walk order."""
    seqs = [b[0] for b in bounds]
    walked, seen, stack = [], set(), [loss.grad_fn]
    recs = rec.trace.recs
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.name().endswith("AccumulateGrad"):
            continue
        walked.append(node)
        stack.extend(fn for fn, _ in node.next_functions)
    for node in walked:
        s = node._sequence_nr()
        at = bisect_right(seqs, s) - 1
        module, layer = (bounds[at][1], bounds[at][2]) if at >= 0 else ("", -1)
        r = _Rec(backward_op_name(node), "backward", module, layer)
        r.forward_of = rec.first_op_at_seq.get(s, -1)
        rec.node_rec[id(node)] = len(recs)
        recs.append(r)
    return walked


def _post_hook(order: list, position: int):
    def hook(grad_inputs, _grad_outputs):
        order.append((position, [g.numel() * g.element_size() if g is not None else 0 for g in grad_inputs]))
    return hook


def _renumber_backward(trace: _Trace, n_forward: int, walked: list, order: list) -> None:
    """Backward recs into execution order, autograd edges (grad bytes) and parameter-grad bytes."""
    recs = trace.recs
    old_of = {id(node): n_forward + w for w, node in enumerate(walked)}
    new_index = {n_forward + w: n_forward + pos for pos, (w, _) in enumerate(order)}
    recs[n_forward:] = [recs[n_forward + w] for w, _ in order]
    edges = {(new_index.get(s, s), new_index.get(d, d)): reads for (s, d), reads in trace.edges.items()}
    for pos, (w, grads) in enumerate(order):
        node, me = walked[w], n_forward + pos
        rec = recs[me]
        for (fn, _), nb in zip(node.next_functions, grads, strict=True):
            if fn is None:
                continue
            rec.output_bytes += nb
            if id(fn) in old_of:
                reads = edges.setdefault((me, new_index[old_of[id(fn)]]), {})
                reads[-len(reads) - 1] = nb  # one entry per autograd edge
            else:  # AccumulateGrad: this Node writes that parameter's gradient
                rec.param_bytes += fn.variable.untyped_storage().nbytes()
    trace.edges = edges
    # A Node that runs no kernel (TBackward of nn.Linear's weight.t()) only passes the gradient
    # on: charge the parameter to the Node that computed it (AddmmBackward), through chains.
    feeders: dict[int, list[int]] = {}
    for src, dst in edges:
        if src >= n_forward:
            feeders.setdefault(dst, []).append(src)
    for me in range(len(recs) - 1, n_forward - 1, -1):
        rec = recs[me]
        if rec.param_bytes and rec.bytes_accessed == 0 and feeders.get(me):
            for src in feeders[me]:
                recs[src].param_bytes += rec.param_bytes
            rec.param_bytes = 0


def _name(recs: list[_Rec]) -> None:
    """fwd:<module>:<op>, then #1, #2... for repeats of that op in that module (likewise bwd:)."""
    seen: dict[str, int] = {}
    for r in recs:
        base = f"{'fwd' if r.phase == 'forward' else 'bwd'}:{r.module}:{r.op}"
        k = seen.get(base, 0)
        seen[base] = k + 1
        r.name = base if k == 0 else f"{base}#{k}"


def _fit(small: float, large: float, b0: int, b1: int) -> Affine:
    per_sample = (large - small) / (b1 - b0)
    return Affine(fixed=small - per_sample * b0, per_sample=per_sample)


def _splittable(small: _Rec, large: _Rec, b0: int, b1: int) -> str:
    """The rule of the module docstring, on the leading dimension fitted from the two traces."""
    if small.rows < 0 or large.rows < 0:
        return ""
    per_sample = (large.rows - small.rows) / (b1 - b0)
    if per_sample <= 0 or small.rows != per_sample * b0:  # leading dim not proportional to the batch
        return ""
    if small.op in _CONV or not small.reads_params or per_sample > 1:
        return "batch"
    return ""  # the parameter-heavy fully connected layer: one row per sample


def build_op_graph(built: BuiltModel, batches: tuple[int, int] = (2, 4)) -> OpGraph:
    """The DAG of one training iteration of `built` (forward, loss, backward), values affine in
    the batch from traces at `batches`; nodes in topological (execution) order."""
    b0, b1 = batches
    if b0 == b1 or min(b0, b1) < 1:
        raise OpGraphError(f"the op graph needs two different positive batches, got {batches}")
    if next(iter(built.module.parameters()), torch.empty(0, device="meta")).device.type != "meta":
        from paraplan.models.source import build

        built = build(built.ref or built.name, device="meta")
    with _no_gc():
        (small, small_names), (large, large_names) = _trace(built, b0), _trace(built, b1)
    if small_names != large_names or small.edges.keys() != large.edges.keys():
        pairs = enumerate(zip(small_names, large_names, strict=False))
        where = next((f"node {i}: {a} vs {b}" for i, (a, b) in pairs if a != b),
                     f"{len(small_names)} vs {len(large_names)} nodes, or edges")
        raise OpGraphError(f"{built.name}: the operator graph changes between batch {b0} and {b1} ({where}); "
                           "the affine fit needs the same graph at both")
    flags = [_splittable(s, g, b0, b1) for s, g in zip(small.recs, large.recs, strict=True)]
    nodes = []
    for s, g, flag in zip(small.recs, large.recs, flags, strict=True):
        if s.phase == "backward":
            fwd = s.forward_of
            same = fwd >= 0 and small.recs[fwd].op.lstrip("_") == s.op.removesuffix("_backward").lstrip("_")
            flag = flags[fwd] if same else ""
        nodes.append(OpNode(
            name=s.name, op=s.op, phase=s.phase, module=s.module, layer=s.layer,
            flops=_fit(s.flops, g.flops, b0, b1), bytes_accessed=_fit(s.bytes_accessed, g.bytes_accessed, b0, b1),
            output_bytes=_fit(s.output_bytes, g.output_bytes, b0, b1), param_bytes=s.param_bytes, splittable=flag,
            forward_of=small.recs[s.forward_of].name if s.phase == "backward" and s.forward_of >= 0 else ""))
    edges = tuple(OpEdge(src, dst, _fit(sum(small.edges[key].values()), sum(large.edges[key].values()), b0, b1))
                  for key in sorted(small.edges) for src, dst in [key])
    return OpGraph(model=built.ref or built.name, nodes=tuple(nodes), edges=edges, traced_batches=(b0, b1))
