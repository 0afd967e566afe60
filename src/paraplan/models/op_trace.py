"""The operator DAG of one training iteration (forward, loss, backward), traced on the meta device.

FD-DPS (Zeng et al., Mathematics 2022, Sec. 3 Definition 1) schedules a graph G(O, E) of operators;
this module builds it for any model paraplan can build, without weights, as models/opspec.OpGraph.

Mechanism, and why (the recording TorchDispatchMode is models/op_record.py; this module drives the
iteration, walks its autograd graph and fits the graph's values):
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
from bisect import bisect_right

import torch

from paraplan.errors import ParaplanError
from paraplan.models.built import BuiltModel
from paraplan.models.op_record import CONV, NodeRecord, OpRecorder, Trace, backward_op_name
from paraplan.models.opspec import OpEdge, OpGraph, OpNode
from paraplan.models.spec import Affine


class OpGraphError(ParaplanError):
    """The model's operator graph cannot be built (its structure changes with the batch)."""


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


def operator_calls(built: BuiltModel, batch: int) -> dict[str, list[tuple]]:
    """Node name -> the aten calls it runs at `batch` as (op, args, kwargs), tensors as TensorSpecs:
    what profiling/operators.py replays on a real device. Names as in build_op_graph."""
    with _no_gc():
        trace, names = _trace(built, batch, record_calls=True)
    return {name: r.calls for name, r in zip(names, trace.recs, strict=True)}


def forward_program(built: BuiltModel, batch: int) -> tuple[Trace, list[str], dict]:
    """The trace of build_op_graph at `batch` (same node names) plus what makes its forward
    executable (runtime/dag/program.py): every forward aten call in order as (op, args, kwargs,
    out, node index, -1 for a view or an allocation) with the meta tensors themselves (their
    identities say which call produced what), the batch's inputs and targets, the loss, and the
    modules (for parameter and buffer names). Backward nodes carry `forward_of` as in the graph."""
    program: dict = {}
    with _no_gc():
        trace, names = _trace(built, batch, program=program)
    return trace, names, program


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
           program: dict | None = None) -> tuple[Trace, list[str]]:
    """One iteration at `batch` on meta: the recorded nodes and edges; node names are set.
    `program` (a dict, filled in): the forward's aten calls and what they read (forward_program)."""
    built.module.train()  # dropout as in training
    layers = built.layers()
    names = _module_names(built, layers)
    modules = {id(m): m for root in (built.module, *(layer for _, _, layer in layers)) for m in root.modules()}
    params = {p.untyped_storage()._cdata: p.untyped_storage().nbytes()
              for root in (built.module, *(layer for _, _, layer in layers)) for p in root.parameters()}
    rec = OpRecorder(params, record_calls)
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


def _backward_nodes(loss: torch.Tensor, rec: OpRecorder, bounds) -> list:
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
        r = NodeRecord(backward_op_name(node), "backward", module, layer)
        r.forward_of = rec.first_op_at_seq.get(s, -1)
        rec.node_rec[id(node)] = len(recs)
        recs.append(r)
    return walked


def _post_hook(order: list, position: int):
    def hook(grad_inputs, _grad_outputs):
        order.append((position, [g.numel() * g.element_size() if g is not None else 0 for g in grad_inputs]))
    return hook


def _renumber_backward(trace: Trace, n_forward: int, walked: list, order: list) -> None:
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


def _name(recs: list[NodeRecord]) -> None:
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


def _splittable(small: NodeRecord, large: NodeRecord, b0: int, b1: int) -> str:
    """The rule of the module docstring, on the leading dimension fitted from the two traces."""
    if small.rows < 0 or large.rows < 0:
        return ""
    per_sample = (large.rows - small.rows) / (b1 - b0)
    if per_sample <= 0 or small.rows != per_sample * b0:  # leading dim not proportional to the batch
        return ""
    if small.op in CONV or not small.reads_params or per_sample > 1:
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
