"""One training step of an operator placement on this rank (dag/dag_runtime.py's loop calls it): the
rank's forward calls replayed in the plan's order on real tensors, reads of another rank's storage
versions received, its own sent right after writing, and the backward through the transfers'
autograd Functions (`_Send`, `_Recv`; dag_runtime.py's docstring says why it cannot deadlock).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from paraplan.models.op_record import BATCH_OPERAND
from paraplan.runtime.dag.analysis import Analysis, Item
from paraplan.runtime.dag.program import EXTERNAL, Ref, flatten, rebuild, substitute


class _Recv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, shape, stride, dtype, src, tag, pending):
        buf = torch.empty(shape, dtype=dtype)
        dist.recv(buf, src=src, tag=tag)
        ctx.src, ctx.tag, ctx.pending, ctx.shape, ctx.dtype = src, tag, pending, shape, dtype
        ctx.set_materialize_grads(False)
        if buf.stride() != tuple(stride) and buf.numel() > 1:
            buf = torch.empty_strided(shape, stride, dtype=dtype).copy_(buf)
        return buf, anchor.new_zeros(())

    @staticmethod
    def backward(ctx, grad, _root):
        g = torch.zeros(ctx.shape, dtype=ctx.dtype) if grad is None else grad.contiguous()
        ctx.pending.append((dist.isend(g, ctx.src, tag=ctx.tag + 1), g))
        return None, None, None, None, None, None, None


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx, base, payload, dst, tag, pending):
        pending.append((dist.isend(payload, dst, tag=tag), payload))
        ctx.dst, ctx.tag, ctx.shape, ctx.dtype = dst, tag, tuple(base.shape), base.dtype
        return base.new_zeros(())

    @staticmethod
    def backward(ctx, _root):
        g = torch.empty(ctx.shape, dtype=ctx.dtype)
        dist.recv(g, src=ctx.dst, tag=ctx.tag + 1)
        return g, None, None, None, None


class RankStep:
    """One rank's forward of one step: the tensors it holds and the roots of its backward."""

    def __init__(self, an: Analysis, rank: int, externals: dict, dropout: bool):
        self.an, self.rank, self.work = an, rank, an.work[rank]
        self.p = an.program
        self.externals = externals  # ("param" | "buffer" | "input" | "target", key) -> tensor
        self.dropout = dropout
        self.bases: dict[tuple[int, int], torch.Tensor] = {}
        self.views: dict[tuple[int, int], torch.Tensor] = {}
        self.parts: dict[tuple[int, int], list] = {}
        self.pending: list = []
        self.roots: list[torch.Tensor] = []
        self.anchor = torch.zeros((), requires_grad=True)
        self.inplace = {sk for it in self.work.items for sk, new in self.p.calls[it.call].writes.items() if not new}

    # --- tensors ------------------------------------------------------------------------------
    def _external(self, tid: int) -> torch.Tensor:
        info = self.p.tensors[tid]
        if info.source == "const":
            return info.key
        return self.externals[(info.source, info.key)]

    def _recv(self, sk: int, v: int, src: int, tag: int) -> torch.Tensor:
        info = self.p.tensors[self.p.storage_base[sk]]
        if self.p.rg.get((sk, v), False):
            t, root = _Recv.apply(self.anchor, info.shape, info.stride, info.dtype, src, tag, self.pending)
            self.roots.append(root)
            # a Function's output written in place would lose its backward: write a copy instead
            return t.clone() if sk in self.inplace else t
        buf = torch.empty(info.shape, dtype=info.dtype)
        dist.recv(buf, src=src, tag=tag)
        return buf

    def base(self, sk: int, v: int) -> torch.Tensor:
        t = self.bases.get((sk, v))
        if t is not None:
            return t
        calls = self.p.calls
        if v == EXTERNAL:
            t = self._external(self.p.storage_base[sk])
        elif calls[v].kind == "alloc":
            info = self.p.tensors[self.p.storage_base[sk]]
            t = torch.empty_strided(info.shape, info.stride, dtype=info.dtype)
        elif (sk, v) in self.work.recvs:
            t = self._recv(sk, v, *self.work.recvs[(sk, v)])
        else:
            raise RuntimeError(f"rank {self.rank}: {self.p.names[calls[v].node]}'s output is not here (plan order?)")
        self.bases[(sk, v)] = t
        return t

    def resolve(self, tid: int, v: int) -> torch.Tensor:
        info = self.p.tensors[tid]
        if info.view_call < 0:
            if info.source != "call" and v == EXTERNAL:
                return self._external(tid)
            return self.base(info.sk, v)
        b = self.base(info.sk, v)
        key = (tid, id(b))
        hit = self.views.get(key)
        if hit is not None:
            return hit
        call = self.p.calls[info.view_call]
        tensors = self.p.tensors

        def value(ref: Ref):
            sk = tensors[ref.tid].sk
            return self.resolve(ref.tid, v if sk == info.sk else call.need[sk])

        args, kwargs = _substitute(call, value)
        out = flatten(call.func(*args, **kwargs))
        for o_tid, o in zip(call.outs, out, strict=True):
            if o_tid is not None:
                self.views[(o_tid, id(b))] = o
        return self.views[key]

    # --- operators ----------------------------------------------------------------------------
    def run(self, item: Item) -> None:
        ci = item.call
        call = self.p.calls[ci]
        if item.part == -2:
            self._gather(item)
            return
        if item.part >= 0:
            self._part(item, call)
            return
        args, kwargs = _substitute(call, lambda ref: self.resolve(ref.tid, call.need[self.p.tensors[ref.tid].sk]))
        if not self.dropout and call.func.__name__.startswith("bernoulli_"):
            out = args[0].fill_(args[1] if len(args) > 1 else kwargs.get("p", 0.5))
        else:
            out = call.func(*args, **kwargs)
        self._commit(ci, out)

    def _rows(self, call) -> int:
        """The call's batch rows: the leading dimension of its batch operand (op_trace's)."""
        return self.p.tensors[call.args[BATCH_OPERAND[call.func.__name__.split(".")[0]]].tid].shape[0]

    def _part(self, item: Item, call) -> None:
        """Part k of a split: the call on rows [lo, hi) of every non-parameter tensor argument whose
        leading dimension is the batch rows; parameters whole."""
        rows = self._rows(call)
        lo, hi = item.part * rows // item.degree, (item.part + 1) * rows // item.degree
        tensors, params = self.p.tensors, self.p.param_storages

        def value(ref: Ref):
            info = tensors[ref.tid]
            t = self.resolve(ref.tid, call.need[info.sk])
            return t[lo:hi] if info.sk not in params and info.shape and info.shape[0] == rows else t

        args, kwargs = _substitute(call, value)
        outs = [o for o in flatten(call.func(*args, **kwargs)) if isinstance(o, torch.Tensor)]
        target = self.work.part_sends.get((item.call, item.part))
        if target is None:
            self.parts[(item.call, item.part)] = outs
            return
        dst, tag = target
        for j, o in enumerate(outs):
            if o.requires_grad:
                self.roots.append(_Send.apply(o, o.detach().contiguous(), dst, tag + 2 * j, self.pending))
            else:
                payload = o.detach().contiguous()
                self.pending.append((dist.isend(payload, dst, tag=tag + 2 * j), payload))

    def _gather(self, item: Item) -> None:
        call = self.p.calls[item.call]
        out_tids = [t for t in call.outs if t is not None]
        pieces = []
        for k in range(item.degree):
            if (item.call, k) in self.parts:
                pieces.append(self.parts.pop((item.call, k)))
                continue
            src, tag = self.work.part_recvs[(item.call, k)]
            rows = self._rows(call)
            lo, hi = k * rows // item.degree, (k + 1) * rows // item.degree
            got = []
            for j, tid in enumerate(out_tids):
                info = self.p.tensors[tid]
                shape = (hi - lo, *info.shape[1:])
                stride = torch.empty(shape, device="meta").stride()
                if self.p.rg.get((info.sk, item.call), False):
                    t, root = _Recv.apply(self.anchor, shape, stride, info.dtype, src, tag + 2 * j, self.pending)
                    self.roots.append(root)
                else:
                    t = torch.empty(shape, dtype=info.dtype)
                    dist.recv(t, src=src, tag=tag + 2 * j)
                got.append(t)
            pieces.append(got)
        whole = iter(torch.cat([p[j] for p in pieces], dim=0) for j in range(len(out_tids)))
        flat = [next(whole) if t is not None else None for t in call.outs]
        self._commit(item.call, rebuild(call.out_template, iter(flat)))

    def _commit(self, ci: int, out) -> None:
        call, p = self.p.calls[ci], self.p
        flat = flatten(out)
        for sk, new in call.writes.items():
            if new:
                t = next(o for o_tid, o in zip(call.outs, flat, strict=True) if o_tid == p.storage_base[sk])
            else:
                t = self.base(sk, call.need.get(sk, EXTERNAL))
            self.bases[(sk, ci)] = t
        for sk, dst, tag in self.work.sends.get(ci, ()):
            t = self.bases[(sk, ci)]
            payload = t.detach()
            if not payload.is_contiguous() or sk in self.inplace:
                payload = payload.contiguous().clone()
            rg = p.rg.get((sk, ci), False)
            if t.requires_grad != rg:
                raise RuntimeError(f"{p.names[call.node]}: requires_grad {t.requires_grad}, expected {rg}")
            if rg:
                self.roots.append(_Send.apply(t, payload, dst, tag, self.pending))
            else:
                self.pending.append((dist.isend(payload, dst, tag=tag), payload))

    def forward(self) -> torch.Tensor | None:
        for item in self.work.items:
            self.run(item)
        if self.rank == self.an.loss_rank:
            tid, v = self.p.loss
            return self.resolve(tid, v)
        return None

    def backward(self, loss: torch.Tensor | None) -> None:
        roots = self.roots + ([loss] if loss is not None else [])
        if roots:
            torch.autograd.backward(functools.reduce(torch.add, roots))
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def _substitute(call, value):
    return substitute(call.args, value), substitute(call.kwargs, value)
