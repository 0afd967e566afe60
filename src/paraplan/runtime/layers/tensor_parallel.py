"""Megatron-style tensor parallelism (TP) of one layer of a zoo model, with DTensor.

Megatron-LM (Shoeybi et al., 2019, Sec. 3) splits a transformer block so that each rank holds a
slice of every weight and the block needs two all-reduces forward and two backward:
  - attention: Q, K, V column-parallel *by heads* (each rank computes whole heads, the softmax
    stays local), the output projection row-parallel (its partial sums are all-reduced);
  - MLP: the first projection(s) column-parallel (the activation is element-wise), the second
    row-parallel;
  - the token embedding vocab-parallel (each rank looks up the ids in its rows, the partial
    results are all-reduced), the head's projection column-parallel with its output gathered here
    so that the loss sees whole logits, and so a layer whose one matrix is a lone Linear (a CNN's
    classifier layers; before, they ran replicated, at twice the states the simulator predicted);
    norms, position embeddings and the rest stay replicated.
Megatron's conjugate operators f (identity forward, all-reduce backward) and g (all-reduce
forward, identity backward) are the input/output hooks of DTensor's ColwiseParallel (input
Replicate) and RowwiseParallel (output Replicate): a layer keeps taking and returning plain
tensors identical on every rank, and its input gradient comes back whole on every rank.

With Megatron's sequence parallelism (runtime/layers/sequence_parallel.py rewrites a layer's plan), f and g
become an all-gather and a reduce-scatter along the sequence, the norms between them on shards.

A layer's plan is read off its structure (the q/k/v/o, c_attn, fc1/fc2, ... submodules transformers
uses); a block whose config carries the library's own plan (Llama's `base_model_tp_plan`) uses
that. `tp_refusal` and `apply_tensor_parallel` (layers/tp_apply.py) share `layer_plan`: what the one
accepts the other runs. This module makes the plans (and says which layers have none); tp_apply.py
applies them and gathers a layer's whole values back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
)

from paraplan.models.adapters import T5Layer
from paraplan.runtime.layers.tp_styles import Conv1DColwise, Conv1DRowwise, GatheredColwise, HeadSharded

# attention attributes that count or measure heads: set to the local value (see _plan_attention)
_HEAD_ATTRS = ("num_heads", "num_attention_heads", "n_heads", "n_head", "num_key_value_heads",
               "all_head_size", "inner_dim", "split_size")
_HEAD_DIMS = ("head_dim", "attention_head_size", "key_value_proj_dim")
_POSITIONAL = ("position", "token_type", "wpe")  # embeddings that stay replicated
_OUTPUT_PROJECTIONS = ("proj", "lm_head", "decoder", "classifier")  # a head's last Linear
_MLP_PAIRS = ((("c_fc",), "c_proj"), (("fc1",), "fc2"), (("gate_proj", "up_proj"), "down_proj"),
              (("w1", "w3"), "w2"),  # Meta's and torchtitan's FeedForward: w2(silu(w1(x)) * w3(x))
              (("wi",), "wo"), (("wi_0", "wi_1"), "wo"), (("intermediate.dense",), "output.dense"))


def _is_conv1d(m: nn.Module | None) -> bool:
    # transformers' Conv1D (GPT-2): a Linear whose weight is stored (in, out)
    return type(m).__name__ == "Conv1D" and hasattr(m, "nf") and hasattr(m, "nx")


# --------------------------------------------------------------------------- the plan of a layer
@dataclass
class _Plan:
    styles: dict[str, ParallelStyle] = field(default_factory=dict)  # path in the layer -> style
    attrs: list[tuple[nn.Module, str, int]] = field(default_factory=list)  # local head counts
    t5_owner: nn.Module | None = None  # T5 block > 0: the bias owner to wrap


class TPRefused(Exception):
    """Why a layer's TP plan cannot be made (one line)."""


def _check(ok: bool, why: str) -> None:
    if not ok:
        raise TPRefused(why)


def _where(mod: nn.Module, path: str, sub: str = "") -> str:
    full = ".".join(x for x in (path, sub) if x)
    return f"{type(mod).__name__} '{full}'" if full else type(mod).__name__


def _heads(count: int, what: str = "attention head") -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def _child(m: nn.Module, path: str) -> nn.Module | None:
    try:
        return m.get_submodule(path)
    except AttributeError:
        return None


def _out(m: nn.Module) -> int:
    return m.nf if _is_conv1d(m) else m.out_features


def _attention(mod: nn.Module):
    """(module holding the head counts, column-parallel paths, row-parallel path) of an attention
    recognised by its children, or None."""
    kids = dict(mod.named_children())
    for q, k, v, o in (("q_proj", "k_proj", "v_proj", "o_proj"), ("q", "k", "v", "o")):
        if all(isinstance(kids.get(n), nn.Linear) for n in (q, k, v, o)):
            return mod, [q, k, v], o
    inner = kids.get("self")  # BERT: BertAttention(self: query/key/value, output: dense + norm)
    if inner is not None and all(isinstance(_child(inner, n), nn.Linear) for n in ("query", "key", "value")) \
            and isinstance(_child(mod, "output.dense"), nn.Linear):
        return inner, ["self.query", "self.key", "self.value"], "output.dense"
    if _is_conv1d(kids.get("c_attn")) and _is_conv1d(kids.get("c_proj")) and hasattr(mod, "split_size"):
        return mod, ["c_attn"], "c_proj"
    return None


def _plan_attention(path: str, mod: nn.Module, found, tp: int, plan: _Plan, covered: set) -> None:
    attn, cols, row = found
    where = _where(attn, path)
    head_dim = next((getattr(attn, a) for a in _HEAD_DIMS if isinstance(getattr(attn, a, None), int)), None)
    _check(head_dim is not None, f"{where}: cannot tell its head size")
    first = mod.get_submodule(cols[0])
    if cols == ["c_attn"]:
        # GPT-2 fuses Q, K, V in one Conv1D whose output columns are [q; k; v] (each E wide) and
        # splits them by `split_size` = E. A plain Shard(1) would give rank 0 all of q and half of
        # k: permute the columns to [q_0, k_0, v_0, q_1, k_1, v_1, ...] (q_r: rank r's heads) so
        # each rank's shard is q, k, v of its own heads, and split them by E / tp locally.
        width = attn.split_size
        _check(_out(first) == 3 * width, f"{where}: c_attn is not a fused Q, K, V")
        heads = kv = width // head_dim
        c = width // tp
        order = torch.cat([torch.arange(s * width + r * c, s * width + (r + 1) * c)
                           for r in range(tp) for s in range(3)]) if width % tp == 0 else None
        styles = {cols[0]: Conv1DColwise(order), row: Conv1DRowwise()}
    else:
        heads, kv = _out(first) // head_dim, _out(mod.get_submodule(cols[1])) // head_dim
        styles = {c: ColwiseParallel() for c in cols} | {row: RowwiseParallel()}
    _check(heads % tp == 0, f"{where}: {_heads(heads)} not divisible by {tp}")
    _check(kv % tp == 0, f"{where}: {_heads(kv, 'key/value head')} not divisible by {tp}")
    for sub in attn.children():  # per-head position-bias tables: sharded by heads too
        sub_path = next(n for n, m in mod.named_modules() if m is sub)
        if isinstance(sub, nn.Embedding) and sub.embedding_dim == heads:  # T5's relative_attention_bias
            styles[sub_path] = ColwiseParallel()  # weight Shard(1): each rank looks up its heads' bias
        elif isinstance(getattr(sub, "relative_position_bias_table", None), nn.Parameter):  # Swin
            styles[sub_path] = HeadSharded("relative_position_bias_table", 1)
    for name, p in mod.named_parameters():
        owner = name.rpartition(".")[0]
        _check(p.dim() < 2 or any(owner == s or owner.startswith(s + ".") for s in styles),
               f"{where}: parameter '{name}' {tuple(p.shape)} has no tensor-parallel plan")
    # transformers 5.x views q/k/v as (..., -1, head_dim), so local heads need no change there;
    # some of these attributes are read elsewhere (GPT-2 splits its fused QKV by `split_size`, T5's
    # cross-attention builds a zero bias of shape (1, n_heads, q, k)): all get the local values
    plan.attrs += [(attn, a, getattr(attn, a) // tp) for a in _HEAD_ATTRS
                   if isinstance(getattr(attn, a, None), int)]
    _add(path, mod, styles, plan, covered)


def _add(path: str, root: nn.Module, styles: dict, plan: _Plan, covered: set) -> None:
    for sub, style in styles.items():
        plan.styles.setdefault(f"{path}.{sub}" if path else sub, style)
        covered.add(id(root.get_submodule(sub)))


def _check_width(where: str, m: nn.Module, style: ParallelStyle, tp: int) -> None:
    if isinstance(style, RowwiseParallel):
        n, what = (m.nx if _is_conv1d(m) else m.in_features), "input width"
    else:
        n, what = _out(m), "output width"
    _check(n % tp == 0, f"{where}: {what} {n} not divisible by {tp}")


def _library_plan(mod: nn.Module) -> dict[str, str]:
    """The library's own TP plan ('layers.*.self_attn.q_proj': 'colwise', ...) as the paths that
    exist in `mod` (a Llama decoder layer), or {}."""
    plans = {}
    for m in mod.modules():
        plans.update(getattr(getattr(m, "config", None), "base_model_tp_plan", None) or {})
    rests = {key.split(".*.", 1)[1]: kind for key, kind in plans.items() if ".*." in key}
    return {rest: kind for rest, kind in rests.items() if _child(mod, rest) is not None}


def _plan(layer: nn.Module, tp: int) -> _Plan:
    plan, covered = _Plan(), set()
    for path, mod in layer.named_modules():
        if id(mod) in covered:
            continue
        where, found = _where(mod, path), _attention(mod)
        library = _library_plan(mod) if found is None else {}
        if library:  # a block whose config carries the library's TP plan (Llama): use it as it is
            styles = {}
            for sub, kind in library.items():
                _check(kind in ("colwise", "rowwise"), f"{where}: TP plan '{sub}': '{kind}' not supported")
                styles[sub] = ColwiseParallel() if kind == "colwise" else RowwiseParallel()
                _check_width(_where(mod, path, sub), mod.get_submodule(sub), styles[sub], tp)
            for sub_path, sub in mod.named_modules():  # head counts: checked, and made local
                if (attention := _attention(sub)) is not None:
                    scratch = _Plan()
                    _plan_attention(f"{path}.{sub_path}".strip("."), sub, attention, tp, scratch, set())
                    plan.attrs += scratch.attrs
            _add(path, mod, styles, plan, covered)
            covered.update(id(m) for m in mod.modules())  # the rest of the block stays replicated
            continue
        if found is not None:
            _plan_attention(path, mod, found, tp, plan, covered)
            continue
        for firsts, second in _MLP_PAIRS:
            subs = [_child(mod, n) for n in (*firsts, second)]
            if all(isinstance(s, nn.Linear) or _is_conv1d(s) for s in subs):
                conv = _is_conv1d(subs[0])
                styles = {f: (Conv1DColwise() if conv else ColwiseParallel()) for f in firsts}
                styles[second] = Conv1DRowwise() if conv else RowwiseParallel()
                for sub, style in styles.items():
                    _check_width(_where(mod, path, sub), mod.get_submodule(sub), style, tp)
                _add(path, mod, styles, plan, covered)
                break
        name = path.rpartition(".")[2]
        if id(mod) in covered:
            continue
        if isinstance(mod, nn.Embedding):
            if any(s in name for s in _POSITIONAL):
                continue  # position / token-type embeddings: replicated (small, used whole)
            # vocab-parallel (Megatron's VocabParallelEmbedding): rows Shard(0), lookups all-reduced.
            # input_layouts=Replicate(): RowwiseParallel's default, Shard(-1), would take each
            # rank's ids for a shard of the sequence and all-gather them (torchtitan sets it too)
            vocab = mod.num_embeddings
            _check(vocab % tp == 0, f"{where}: vocabulary {vocab} not divisible by {tp}")
            plan.styles[path] = RowwiseParallel(input_layouts=Replicate())
        elif isinstance(mod, nn.Linear) and name in _OUTPUT_PROJECTIONS:
            # a head's projection: column-parallel, output all-gathered so the loss sees all of it
            _check(mod.out_features % tp == 0, f"{where}: {mod.out_features} outputs not divisible by {tp}")
            plan.styles[path] = ColwiseParallel(output_layouts=Replicate())
        elif isinstance(mod, nn.modules.conv._ConvNd):  # ViT's and Swin's patch embeddings: replicated
            _check("patch_embed" in path, f"{where}: convolutions have no tensor-parallel plan here")
        elif isinstance(mod, T5Layer) and mod._bias_owner is not None:
            heads = mod._bias_owner.module.relative_attention_bias.embedding_dim
            _check(heads % tp == 0, f"{where}: {_heads(heads)} not divisible by {tp}")
            plan.t5_owner = mod._bias_owner.module
        else:
            # other Linears beside a plan (BERT's head transform) and embedding tokens (ViT's cls
            # token) stay replicated; a lone one (Swin's patch merging, a CNN's classifier) below
            own = [n for n, p in mod.named_parameters(recurse=False) if p.dim() >= 2]
            known = isinstance(mod, nn.Linear) or _is_conv1d(mod) or "embedding" in type(mod).__name__.lower()
            _check(known or not own, f"{where}: parameter '{own[0] if own else ''}' has no TP plan")
    matrices = [(path, m) for path, m in layer.named_modules() if any(p.dim() > 1 for p in m.parameters(False))]
    if not plan.styles and len(matrices) == 1 and isinstance(lone := matrices[0][1], nn.Linear):  # module docstring
        path = matrices[0][0]
        _check(lone.out_features % tp == 0, f"{_where(lone, path)}: {lone.out_features} outputs not divisible by {tp}")
        plan.styles[path] = GatheredColwise(output_layouts=Replicate())
    # Linears and no part of the layer sharded: TP would run it replicated, at tp times the states
    # the simulator charges (issue 46: a user's block with Linears named like no known pair). A patch
    # embedding's convolution and embedding tokens alone stay replicated, as documented above.
    linears = [path for path, m in matrices if isinstance(m, nn.Linear) or _is_conv1d(m)]
    _check(bool(plan.styles) or plan.t5_owner is not None or not linears, _left_replicated(linears))
    return plan


def _unsharded_linears(layer: nn.Module, plan: _Plan) -> list[str]:
    """The paths of the layer's Linears (and GPT-2 Conv1Ds) that no style of `plan` shards."""
    sharded = {id(layer.get_submodule(path)) for path in plan.styles}
    return [path for path, m in layer.named_modules() if (isinstance(m, nn.Linear) or _is_conv1d(m))
            and id(m) not in sharded]


def _left_replicated(paths: list[str]) -> str:
    return (f"no tensor-parallel plan for its Linears {', '.join(paths[:3])}{', ...' if len(paths) > 3 else ''} "
            "(not an attention, an MLP pair or a lone Linear that paraplan's TP knows); they would run replicated")


# --------------------------------------------------------------------------- the API
def layer_plan(layer: nn.Module, tp: int, sequence_parallel: bool) -> _Plan:
    """The layer's TP plan, rewritten for sequence parallelism if asked (runtime/layers/sequence_parallel.py)."""
    plan = _plan(layer, tp)
    if sequence_parallel:
        from paraplan.runtime.layers.sequence_parallel import SequenceRefused, sequence_styles

        try:
            sequence_styles(layer, plan.styles)
        except SequenceRefused as exc:
            raise TPRefused(str(exc)) from None
    return plan


def tp_refusal(layer: nn.Module, tp: int, sequence_parallel: bool = False, strict: bool = False) -> str | None:
    """None when `layer` (the module of one entry of built.layers()) can run tensor parallel over
    `tp` ranks (with Megatron's sequence parallelism if asked), otherwise one short line saying why.
    `strict` (a model outside the zoo, whose blocks paraplan's plans were not written for): every
    Linear of the layer must be sharded; one left replicated beside sharded ones (a user's MLP
    named like no pair here, beside an attention it knows) would hold tp times the states the
    simulator charges. Pure inspection: no process group needed."""
    if tp < 1:
        return f"tensor-parallel degree {tp} must be at least 1"
    try:
        plan = layer_plan(layer, tp, sequence_parallel)
    except TPRefused as exc:
        return str(exc)
    if strict and (left := _unsharded_linears(layer, plan)):
        return _left_replicated(left)
    return None


def sequence_parallel_support(layers, max_degree: int, strict: bool = False) -> frozenset[tuple[int, int]]:
    """(layer index, tp degree) for every layer of `layers` (built.layers(): (name, kind, module)) and
    power-of-two degree 2..max_degree this runtime runs TP + SP on: where a planner may put Megatron-SP
    (PlanRequest.sequence_parallel), so that it never picks a plan `train` refuses. Pure inspection.
    `strict`: as `tp_refusal`'s (a model outside the zoo)."""
    return _support(layers, max_degree, sequence_parallel=True, strict=strict)


def tensor_parallel_support(layers, max_degree: int, strict: bool = False) -> frozenset[tuple[int, int]]:
    """As `sequence_parallel_support`, for TP alone (PlanRequest.tensor_parallel)."""
    return _support(layers, max_degree, sequence_parallel=False, strict=strict)


def strict_for(model_reference: str) -> bool:
    """Whether `tp_refusal` is strict for this model: every model outside the zoo (whose blocks
    paraplan's TP plans were not written and checked for)."""
    from paraplan.models import ref as refs
    from paraplan.models import zoo

    ref = refs.parse(model_reference)
    return ref.kind != refs.ZOO or bool(zoo.entry(ref.target).hf)  # an hf entry's blocks are transformers' own


def _support(layers, max_degree: int, sequence_parallel: bool, strict: bool) -> frozenset[tuple[int, int]]:
    degrees = [2 ** k for k in range(1, max_degree.bit_length())]  # 2, 4, ... up to max_degree
    return frozenset((index, degree) for index, (_, _, module) in enumerate(layers) for degree in degrees
                     if tp_refusal(module, degree, sequence_parallel=sequence_parallel, strict=strict) is None)
