"""What one pass of a layer launches, operator by operator, for the per-operator cost model
(costs/op_roofline.py; issue 48, item 1).

`OpInventory` is a dispatch mode active while models/measure.py runs a layer's forward or backward
on meta. It sorts every kernel-launching aten op into one of four classes, each priced differently:
  GEMMs (mm, addmm, bmm, baddbmm): their shape (batch, M, N, K) and element size, so that tile and
      wave quantisation can be priced (a GEMM's efficiency depends on its shape);
  fused attention (SDPA's flash / memory-efficient kernels, `attention_kernel.FusedAttention`): the
      FLOPs the kernel really does (causal: half the s x s work) and the bytes it moves (q, k, v,
      output, log-sum-exp; never an s x s tensor);
  other compute (convolutions and whatever else has a FLOP formula): FLOPs and bytes;
  memory-bound ops (norms, activations, residual adds, softmax, dropout, casts, copies): the bytes
      they read and write.
The layer is measured at two batch sizes (models/measure.py); the two inventories list the same ops
in the same order, so every dimension and byte count is fitted as fixed + per_sample x b
(`fit_pass`). Identical entries are merged with a count, so a pass holds a few dozen entries.
"""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from paraplan.models.attention_kernel import ATTENTION_LISTENERS, fused_running
from paraplan.models.spec import Affine, Gemm, MemoryOp, PassOps
from paraplan.models.tensors import nbytes

_GEMM = {"mm", "addmm", "bmm", "baddbmm"}
# ops that launch no kernel or move no data worth pricing (views, metadata, allocation)
_FREE = {"view", "_unsafe_view", "t", "transpose", "permute", "expand", "unsqueeze", "squeeze", "reshape", "detach",
         "alias", "slice", "select", "split", "split_with_sizes", "unbind", "as_strided", "_reshape_alias", "empty",
         "empty_like", "new_empty", "lift_fresh", "view_as", "chunk", "narrow", "flatten", "unflatten",
         "empty_strided", "new_empty_strided", "sym_size", "sym_stride", "sym_numel", "size", "stride", "numel",
         "dim", "is_contiguous", "is_same_size", "_local_scalar_dense"}


class OpInventory(TorchDispatchMode):
    """Records the kernels of one pass as raw entries (`entries`), in launch order:
    ("gemm", batch, m, n, k, element_bytes), ("memory", bytes), ("other", flops, bytes) and
    ("attention", flops, bytes), the last appended by attention_kernel.FusedAttention (the aten ops of
    its own math, which runs inside it on meta, are the kernel's, not kernels of their own)."""

    def __init__(self):
        super().__init__()
        self.entries: list[tuple] = []

    def __enter__(self):
        ATTENTION_LISTENERS.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        ATTENTION_LISTENERS.remove(self)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if fused_running():
            return out
        name = func.__name__.split(".")[0]
        if name in _FREE:
            return out
        if name in _GEMM:
            a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
            batch = a.shape[0] if a.dim() == 3 else 1
            self.entries.append(("gemm", batch, a.shape[-2], b.shape[-1], a.shape[-1], a.element_size()))
            return out
        moved = nbytes(args) + nbytes(kwargs) + nbytes(out)
        flop_fn = flop_registry.get(func._overloadpacket)
        if flop_fn is not None:
            self.entries.append(("other", float(flop_fn(*args, **kwargs, out_val=out)), moved))
        elif moved:  # with the op and its tensors' shapes and types, to pair it across batch sizes (`_paired`)
            self.entries.append(("memory", moved, (name, _signature(args), _signature(out))))
        return out

    def record_attention(self, flops: float, nbytes: float) -> None:
        self.entries.append(("attention", flops, nbytes))


def _signature(value) -> tuple:
    """The shapes and types of the tensors in `value` (a tensor, or a list or tuple of them and others)."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return ((tuple(value.shape), str(value.dtype)),)
    if isinstance(value, (list, tuple)):
        return tuple(x for v in value for x in _signature(v))
    return ()


def _scaled(small: tuple, large: tuple, ratio: float) -> bool:
    """Whether memory entry `large` is entry `small`'s op at the larger batch: the same op on tensors
    of the same types and ranks, each dimension the same or `ratio` times it (the batch's)."""
    (name, args, out), (name2, args2, out2) = small[2], large[2]
    if name != name2 or len(args) != len(args2) or len(out) != len(out2):
        return False
    dims = []
    for (shape, dtype), (shape2, dtype2) in zip(args + out, args2 + out2, strict=True):
        if dtype != dtype2 or len(shape) != len(shape2):
            return False
        dims += list(zip(shape, shape2, strict=True))
    return all(b in (a, a * ratio) for a, b in dims) and any(b != a for a, b in dims)


def _affine(small: float, large: float, batches: tuple[int, int]) -> Affine:
    b0, b1 = batches
    per_sample = (large - small) / (b1 - b0)
    return Affine(fixed=max(0.0, small - per_sample * b0), per_sample=max(0.0, per_sample))


def _paired(small: list[tuple], large: list[tuple], ratio: float) -> list[tuple[tuple, tuple]]:
    """The entries of one class at the two batch sizes, paired. The autograd engine may run a
    backward's independent branches in another order at another batch size, so pairs are not taken
    by position: entries equal at both sizes (what does not depend on the batch; a memory-bound op
    equal in its op, shapes and types too, not in its bytes alone: a float32 add at batch 2 moves as
    many bytes as a bfloat16 cast at batch 4) pair first; a GEMM then pairs with one whose dimensions
    are its own with one of them times `ratio` (the batch sizes' ratio: the dimension that holds the
    batch), a memory-bound op with the same op on tensors of the same types whose dimensions are its
    own or `ratio` times them; what is left pairs in order of size (what scales with the batch scales
    by the same factor, so the order holds)."""
    rest = list(large)
    pairs, unmatched = [], []
    for entry in small:
        if entry in rest:
            rest.remove(entry)
            pairs.append((entry, entry))
        else:
            unmatched.append(entry)
    left = []
    for entry in unmatched:
        match = None
        if entry[0] == "gemm":
            for candidate in rest:
                scaled = [i for i in range(1, 5) if candidate[i] != entry[i]]
                if candidate[5] == entry[5] and len(scaled) == 1 and candidate[scaled[0]] == entry[scaled[0]] * ratio:
                    match = candidate
                    break
        elif entry[0] == "memory":
            match = next((c for c in rest if _scaled(entry, c, ratio)), None)
        if match is None:
            left.append(entry)
        else:
            rest.remove(match)
            pairs.append((entry, match))

    def size(e: tuple):
        return (e[-1], e[1] * e[2] * e[3] * e[4], e[1:]) if e[0] == "gemm" else (e[1], repr(e[2:]))

    pairs += list(zip(sorted(left, key=size), sorted(rest, key=size), strict=True))
    return pairs


def fit_pass(small: list[tuple], large: list[tuple], batches: tuple[int, int]) -> PassOps | None:
    """The pass's PassOps from its entries at the two batch sizes; None when the two do not launch
    as many GEMMs or attention kernels (a layer whose code branches on the batch size: priced by the
    layer roofline). Memory-bound kernels may differ in number (a copy to another layout that one
    batch size needs): then they are kept as their count and their mean size."""
    by_class: dict[str, tuple[list, list]] = {}
    for entries, side in ((small, 0), (large, 1)):
        for e in entries:
            by_class.setdefault(e[0], ([], []))[side].append(e)
    if any(len(s) != len(t) or (k == "gemm" and sorted(e[5] for e in s) != sorted(e[5] for e in t))
           for k, (s, t) in by_class.items() if k != "memory"):
        return None

    def fit(i: int, s: tuple, t: tuple) -> Affine:
        return _affine(float(s[i]), float(t[i]), batches)

    def total(kind: str, i: int) -> Affine:
        s, t = by_class.get(kind, ([], []))
        return _affine(sum(e[i] for e in s), sum(e[i] for e in t), batches)

    gemms: dict[tuple, int] = {}
    for s, t in _paired(*by_class.get("gemm", ([], [])), batches[1] / batches[0]):
        key = (fit(1, s, t), fit(2, s, t), fit(3, s, t), fit(4, s, t), s[5])
        gemms[key] = gemms.get(key, 0) + 1
    memory: dict[Affine, int] = {}
    small_memory, large_memory = by_class.get("memory", ([], []))
    if len(small_memory) == len(large_memory):
        for s, t in _paired(small_memory, large_memory, batches[1] / batches[0]):
            key = fit(1, s, t)
            memory[key] = memory.get(key, 0) + 1
    else:  # copies that only one batch size needs (a contiguous() of another layout): their mean size
        n = max(len(small_memory), len(large_memory))
        moved = total("memory", 1)
        memory[Affine(moved.fixed / n, moved.per_sample / n)] = n
    return PassOps(gemms=tuple(Gemm(*key, count=n) for key, n in gemms.items()),
                   memory_ops=tuple(MemoryOp(key, n) for key, n in memory.items()),
                   attention_flops=total("attention", 1), attention_bytes=total("attention", 2),
                   attention_kernels=len(by_class.get("attention", ([], []))[0]),
                   other_flops=total("other", 1), other_bytes=total("other", 2),
                   other_kernels=len(by_class.get("other", ([], []))[0]))
