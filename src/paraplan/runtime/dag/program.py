"""An FD-DPS operator placement ('dag' plan) made executable: which aten call each operator name
is, what every rank runs, and which tensors cross between ranks (runtime/dag/dag_runtime.py runs it).

The forward is the one models/op_trace.py traces, recorded once more on meta at the plan's batch
(`op_trace.forward_program`: same node names): every aten call with the meta tensors it read and
wrote. Tensor objects become ids (`tid`), their storages become storage ids (`sk`), and a storage
goes through versions: EXTERNAL (a parameter, buffer, input or target, present on every rank), an
allocation call (empty_like: replayed locally wherever it is needed) or the computing call that last
wrote it (an output, or an in-place write such as relu_ or bernoulli_). That is the trace's own
dependency rule (op_trace tracks producers by storage), so every read of a version written on
another rank is exactly one edge of the operator graph, and a transfer is (storage, version,
source rank, destination rank), sent once per destination however many calls read it there.
Views and allocations are no nodes: a rank replays the view calls it needs on its own copy of the
storage (as the trace folds them into edges).

Intra-operator splits (FD-DPS Sec. 4.1, models/op_split.py): part k runs the call on rows
[k*rows/d, (k+1)*rows/d) of every non-parameter tensor argument whose leading dimension is the
call's batch rows (a convolution's input, both operands of a bmm), with whole parameters; the gather
concatenates the parts' outputs along dim 0 and becomes the writer of the call's outputs. A part
receives the whole input storages (it slices locally): more bytes than the graph's 1/d share when
the part's device is not the producer's.

Refused here (one line each, see `analyse`): a plan whose names do not resolve or do not cover the
graph once; a backward node away from its forward op's device (autograd runs a Node where its
forward ran: plan with runnable=true); a split forward whose backward is not split the same way; a
device order that overwrites a storage in place before a read of its older version on that device;
tensors the forward creates from Python data (lift_fresh: their values are not in a meta trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from paraplan.models import source
from paraplan.models.op_trace import forward_program

EXTERNAL = -1  # the version of a storage before the forward writes it


class DagRefusal(Exception):
    """The plan cannot run faithfully; the message is one line."""


@dataclass(frozen=True)
class Ref:
    tid: int


# Argument and output structures: aten calls take and return tensors, scalars and (nested) tuples,
# lists and keyword dicts. Plain recursion here (torch's pytree costs ~10 us per call: a tenth of
# the runtime's step on the tiny models).
def flatten(x) -> list:
    if isinstance(x, (tuple, list)):
        return [y for e in x for y in flatten(e)]
    if isinstance(x, dict):
        return [y for e in x.values() for y in flatten(e)]
    return [x]


def substitute(x, fn):
    """x with every leaf replaced by fn(leaf) (a Ref, or a tensor at build time)."""
    if isinstance(x, (Ref, torch.Tensor)):
        return fn(x)
    if isinstance(x, tuple):
        return tuple(substitute(e, fn) for e in x)
    if isinstance(x, list):
        return [substitute(e, fn) for e in x]
    if isinstance(x, dict):
        return {k: substitute(v, fn) for k, v in x.items()}
    return x


def rebuild(template, values):
    """The structure of `template` with its leaves taken in order from the iterator `values`."""
    if isinstance(template, (tuple, list)):
        return type(template)(rebuild(e, values) for e in template)
    return next(values)


@dataclass
class TInfo:
    sk: int  # storage id
    source: str  # "call" | "input" | "target" | "param" | "buffer" | "const"
    key: object  # creating call index | flat position | name | the constant tensor
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    view_call: int = -1  # the view call that made it (-1: the storage's base object)
    view_arg: int = -1  # that call's argument it is a view of


@dataclass
class Call:
    func: object
    args: tuple  # tensors replaced by Ref
    kwargs: dict
    outs: list  # flat outputs: tid or None (non-tensors)
    out_template: object  # the output's structure (rebuild)
    node: int  # op_trace node index, -1 for a view or an allocation
    kind: str  # "compute" | "view" | "alloc"
    reads: list[int]  # tensor argument tids
    need: dict[int, int]  # storage -> the version this call reads
    writes: dict[int, bool] = field(default_factory=dict)  # storage -> True when it is new (an output)


@dataclass
class Program:
    calls: list[Call]
    tensors: list[TInfo]
    names: list[str]  # op_trace node names (forward and backward)
    forward_of: list[int]  # per node: backward -> its forward node, else -1
    loss: tuple[int, int]  # (tid, version) of the loss
    storage_base: list[int]  # storage -> the tid of its base object
    rg: dict[tuple[int, int], bool]  # (storage, version) -> requires grad
    node_call: dict[int, int]  # forward node -> its call
    param_storages: dict[int, str]  # storage -> parameter name


def _device_free(value):
    """meta -> cpu in factory arguments (arange(..., device=meta))."""
    if isinstance(value, torch.device) and value.type == "meta":
        return torch.device("cpu")
    return value


class _Tensors:
    """The trace's tensors as they are met: tensor objects as ids (`tid`), their storages as storage
    ids (`sk`), and what an external tensor is (a parameter or buffer by name, an input or target
    by position, a constant by value)."""

    def __init__(self, built, prog: dict):
        self.param_names, self.buffer_names = {}, {}
        # names as materialize.build_layers gives them: the whole model's, the first of tied ones
        for m in (built.module, *prog["modules"].values()):
            for n, p in m.named_parameters(remove_duplicate=False):
                self.param_names.setdefault(id(p), n)
            for n, b in m.named_buffers(remove_duplicate=False):
                self.buffer_names.setdefault(id(b), n)
        self.externals = {}
        for source_name, value in (("input", prog["inputs"]), ("target", prog["targets"])):
            for pos, t in enumerate(flatten(value)):
                if isinstance(t, torch.Tensor):
                    self.externals[id(t)] = (source_name, pos)
        self.tids: dict[int, int] = {}
        self.sks: dict[int, int] = {}
        self.tensors: list[TInfo] = []
        self.storage_base: list[int] = []
        self.keep = []

    def storage(self, t) -> int:
        key = t.untyped_storage()._cdata
        if key not in self.sks:
            self.sks[key] = len(self.storage_base)
            self.storage_base.append(-1)
        return self.sks[key]

    def add(self, t, src, key, view_call=-1, view_arg=-1) -> int:
        self.keep.append(t)
        sk = self.storage(t)
        tid = len(self.tensors)
        self.tids[id(t)] = tid
        self.tensors.append(TInfo(sk, src, key, tuple(t.shape), tuple(t.stride()), t.dtype, view_call, view_arg))
        if self.storage_base[sk] < 0:
            self.storage_base[sk] = tid
        return tid

    def external(self, t) -> int:
        if id(t) in self.tids:
            return self.tids[id(t)]
        if id(t) in self.param_names:
            return self.add(t, "param", self.param_names[id(t)])
        if id(t) in self.buffer_names:
            return self.add(t, "buffer", self.buffer_names[id(t)])
        if id(t) in self.externals:
            return self.add(t, *self.externals[id(t)])
        if t.device.type != "meta":  # a constant the forward made from real data
            return self.add(t, "const", t.clone())
        raise DagRefusal("the forward reads a tensor made from Python data on meta (its values are unknown); "
                         "the operator runtime cannot reproduce it")


def build_program(model: str, batch: int, seq_len=None, image_size=None, built=None) -> Program:
    """The static program of `model`'s forward at `batch` samples; `built`: the model already built
    on meta (the launcher's one build), else it is built here."""
    if built is None:
        built = source.build(model, device="meta", seq_len=seq_len, image_size=image_size)
    trace, names, prog = forward_program(built, batch)
    reg = _Tensors(built, prog)
    tensors = reg.tensors
    calls: list[Call] = []
    latest: dict[int, int] = {}  # storage -> the call that wrote its current version
    rg: dict[tuple[int, int], bool] = {}
    node_call: dict[int, int] = {}
    for ci, (func, args, kwargs, out, node) in enumerate(prog["calls"]):
        call = _call(reg, ci, func, args, kwargs, out, node, latest, rg)
        if call.kind == "compute":
            node_call[node] = ci
            _record_writes(reg, call, ci, args, kwargs, latest, rg)
        elif call.kind == "alloc":
            for o in call.outs:
                if o is not None:
                    latest[tensors[o].sk] = ci
                    rg[(tensors[o].sk, ci)] = False
        calls.append(call)
    loss_tid = reg.external(prog["loss"])
    loss_sk = tensors[loss_tid].sk
    forward_of = [r.forward_of for r in trace.recs]
    params = {tensors[t].sk: tensors[t].key for t in range(len(tensors)) if tensors[t].source == "param"}
    return Program(calls, tensors, names, forward_of, (loss_tid, latest.get(loss_sk, EXTERNAL)), reg.storage_base,
                   rg, node_call, params)


def _call(reg: _Tensors, ci: int, func, args, kwargs, out, node: int, latest: dict[int, int],
          rg: dict[tuple[int, int], bool]) -> Call:
    """Call `ci` of the trace with its tensors as Refs, the storage versions it reads, its kind
    and its outputs (registered); the external versions it reads enter `rg`."""
    name = func.__name__.split(".")[0]
    if name in ("lift_fresh", "set_", "_local_scalar_dense"):
        raise DagRefusal(f"the forward calls aten.{name}, which the operator runtime cannot replay")
    reads: list[int] = []

    def ref(t):
        reads.append(reg.external(t))
        return Ref(reads[-1])

    cargs = tuple(_device_free(a) for a in substitute(tuple(args), ref))
    ckwargs = {k: _device_free(v) for k, v in substitute(dict(kwargs), ref).items()}
    tensors, sks = reg.tensors, reg.sks
    need = {tensors[t].sk: latest.get(tensors[t].sk, EXTERNAL) for t in reads}
    for sk, v in need.items():
        if v == EXTERNAL:
            src = tensors[reg.storage_base[sk]]
            rg.setdefault((sk, v), src.source == "param")
    in_storages = {tensors[t].sk for t in reads}
    flat_out = flatten(out)
    out_tensors = [o for o in flat_out if isinstance(o, torch.Tensor)]
    if node >= 0:
        kind = "compute"
    elif out_tensors and all(o.untyped_storage()._cdata in sks and sks[o.untyped_storage()._cdata] in in_storages
                             for o in out_tensors):
        kind = "view"
    else:
        kind = "alloc"
    outs = []
    for o in flat_out:
        if not isinstance(o, torch.Tensor):
            outs.append(None)
        elif id(o) in reg.tids:  # an in-place op returns its argument
            outs.append(reg.tids[id(o)])
        elif kind == "view":
            o_sk = sks[o.untyped_storage()._cdata]
            arg = next(t for t in reads if tensors[t].sk == o_sk)
            outs.append(reg.add(o, "call", ci, ci, arg))
        else:
            outs.append(reg.add(o, "call", ci))
    return Call(func, cargs, ckwargs, outs, substitute(out, lambda _: None), node, kind, reads, need)


def _record_writes(reg: _Tensors, call: Call, ci: int, args, kwargs, latest: dict[int, int],
                   rg: dict[tuple[int, int], bool]) -> None:
    """A computing call's writes: the storages it returns (new ones) or writes in place (by its
    schema), each a new version `ci`, which requires grad when an input version does."""
    tensors, need = reg.tensors, call.need
    in_storages = {tensors[t].sk for t in call.reads}
    any_rg = any(rg.get((sk, v), False) for sk, v in need.items())
    written = {}
    for o in call.outs:
        if o is not None:
            sk = tensors[o].sk
            written[sk] = sk not in in_storages
    schema_args = call.func._schema.arguments
    for i, a in enumerate(schema_args):
        if a.alias_info is not None and a.alias_info.is_write:
            value = args[i] if i < len(args) else kwargs.get(a.name)
            for t in flatten(value):
                if isinstance(t, torch.Tensor):
                    written.setdefault(tensors[reg.tids[id(t)]].sk, False)
    returned = {tensors[o].sk for o in call.outs if o is not None}
    for sk, new in written.items():
        floating = tensors[reg.storage_base[sk]].dtype.is_floating_point
        old = rg.get((sk, need.get(sk, EXTERNAL)), False) if not new else False
        rg[(sk, ci)] = old or (any_rg and floating and sk in returned)
        latest[sk] = ci
    call.writes = written
