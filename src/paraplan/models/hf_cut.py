"""Cut any transformers model into embedding -> blocks -> head, without knowing its family.

The hand-written adapters (models/adapters.py) know where GPT-2 keeps its blocks; this module
finds out, for any model type, by watching one forward pass on the meta device:

1. The block list is the largest `nn.ModuleList` whose children all share one class (or the
   dotted path the user gives as `layers=`).
2. A recorded forward (hooks on every module, a dispatch mode on every aten op) shows
   - what each block is called with: the hidden states plus keyword arguments (a causal mask,
     rotary position embeddings, position ids, constants);
   - which modules run before the first block (the "embedding" layer: the model's own code up to
     its first block, run for real by stopping the model's forward there) and after the last
     block (the "head": those modules in call order);
   - that no computation happens outside those modules after the first block (e.g. Gemma's
     logit soft-capping): the head would miss it, so that is an error, not a silent difference.
3. Each block's keyword arguments are rebuilt from the hidden states alone (so a pipeline stage
   needs nothing but the activation): position ids and cache positions are `arange`, masks come
   from transformers' own `masking_utils` (the full or sliding-window causal mask of that block's
   layer type), rotary embeddings from the model's rotary module called as the model calls it.
   Anything else a block receives is named in a one-line error.
The rebuilt arguments are checked against the recorded ones (shape, dtype, None-ness) for every
block, and the cut model's output shape against the model's; tests/unit/test_any_model.py checks
the numbers against the library's forward for Qwen2, Mistral and OPT.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from paraplan.errors import FieldError
from paraplan.models.adapters import Unregistered, only_tensor

Layers = list[tuple[str, str, nn.Module]]

# aten ops that move no numbers (views, casts): allowed outside modules after the first block
_FREE_OPS = {"view", "_unsafe_view", "slice", "select", "detach", "alias", "expand", "t", "transpose", "permute",
             "contiguous", "clone", "_to_copy", "to", "unsqueeze", "squeeze", "reshape", "lift_fresh", "empty",
             "empty_like", "new_empty", "as_strided", "_reshape_alias", "copy_", "arange", "zeros", "ones", "full"}


def find_block_list(model: nn.Module) -> str:
    """The dotted path of the largest ModuleList whose children share one class."""
    best, best_params = None, -1
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 and len({type(c) for c in module}) == 1:
            params = sum(p.numel() for p in module.parameters())
            if params > best_params:
                best, best_params = path, params
    if best is None:
        raise FieldError("model", f"cannot cut {type(model).__name__} into layers: it has no list of repeated blocks "
                                  "(nn.ModuleList); name one with layers=PATH")
    return best


@dataclass(frozen=True)
class Rule:
    """How to rebuild one keyword argument of a block from its hidden states."""

    kind: str  # const | positions | cache_position | mask | produced
    value: object = None  # const: the value; mask: the layer type; produced: the producer's path
    batched: bool = False  # positions: (batch, seq) rather than (1, seq); produced: ids passed by name


@dataclass(frozen=True)
class Recipe:
    blocks_path: str
    pre_paths: tuple[str, ...]
    head_paths: tuple[str, ...]
    rules: tuple[tuple[tuple[str, Rule], ...], ...]  # per block: (keyword, rule)


@contextlib.contextmanager
def meta_safe_masks(active: bool = True):
    """On meta, transformers' packed-sequence detection reads tensor values (`.all()`), which
    meta tensors do not have; our inputs are never packed (positions are a plain arange), so the
    detection is switched off while a meta forward runs. Real tensors run the library untouched."""
    if not active:
        yield
        return
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def _on_meta(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "meta"
    return isinstance(value, (tuple, list)) and any(_on_meta(v) for v in value)


class _Stop(Exception):
    def __init__(self, hidden):
        super().__init__("stopped at the first block")
        self.hidden = hidden


def _hidden_of(args, kwargs):
    return args[0] if args else kwargs.get("hidden_states")


def _is_ancestor(path: str, of: str) -> bool:
    return path == "" or of.startswith(path + ".")


def _maximal(paths: list[str]) -> list[str]:
    return [p for p in paths if not any(q != p and p.startswith(q + ".") for q in paths)]


class _Recorder(TorchDispatchMode):
    """Counts aten ops that run outside every recorded module once the first block has started."""

    def __init__(self):
        super().__init__()
        self.watching = False
        self.depth = 0
        self.loose: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if self.watching and self.depth == 0 and name not in _FREE_OPS:
            self.loose.append(name)
        return func(*args, **(kwargs or {}))


def record(model: nn.Module, example, layers_path: str | None = None, seen: dict | None = None) -> Recipe:
    """Watch one forward of `model` (on meta) and derive how to cut it. `seen`, when given, receives
    what that forward showed for the checks after it (so that they need no forward of their own):
    "calls", each block's (hidden states, keyword arguments), and "output", the model's output."""
    what = type(model).__name__
    blocks_path = layers_path or find_block_list(model)
    try:
        blocks = model.get_submodule(blocks_path)
    except AttributeError:
        raise FieldError("layers", f"{what} has no submodule {blocks_path!r}") from None
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        raise FieldError("layers", f"{blocks_path!r} is not a non-empty nn.ModuleList of blocks")
    n = len(blocks)
    clock = [0]
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    produced: dict[int, tuple[str, tuple]] = {}
    calls: dict[int, tuple[tuple, dict]] = {}
    recorder = _Recorder()
    handles = []
    outside = {path: m for path, m in model.named_modules()
               if not _is_ancestor(path, blocks_path) and not path.startswith(blocks_path + ".")}

    def pre(path):
        def hook(module, args, kwargs):
            clock[0] += 1
            start.setdefault(path, clock[0])
            recorder.depth += 1
            produced_args[path] = (args, tuple(kwargs))
        return hook

    produced_args: dict[str, tuple] = {}  # path -> (positional args, keyword names) of its last call

    def post(path):
        def hook(module, args, kwargs, output):
            clock[0] += 1
            end[path] = clock[0]
            recorder.depth -= 1
            produced[id(output)] = (path, produced_args.get(path, ((), ())))
        return hook

    def block_pre(i):
        def hook(module, args, kwargs):
            clock[0] += 1
            start.setdefault(f"{blocks_path}.{i}", clock[0])
            calls[i] = (args, dict(kwargs))
            recorder.depth += 1
            recorder.watching = True
        return hook

    def block_post(i):
        def hook(module, args, kwargs, output):
            clock[0] += 1
            end[f"{blocks_path}.{i}"] = clock[0]
            recorder.depth -= 1
        return hook

    for path, module in outside.items():
        handles.append(module.register_forward_pre_hook(pre(path), with_kwargs=True))
        handles.append(module.register_forward_hook(post(path), with_kwargs=True))
    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(block_pre(i), with_kwargs=True))
        handles.append(block.register_forward_hook(block_post(i), with_kwargs=True))
    try:
        with torch.no_grad(), meta_safe_masks(_on_meta(example)), recorder:
            out = model(example)
    finally:
        for h in handles:
            h.remove()
    if len(calls) != n:
        raise FieldError("model", f"cannot cut {what} into layers: only {len(calls)} of the {n} blocks in "
                                  f"{blocks_path} ran in its forward")
    first = start[f"{blocks_path}.0"]
    last = end[f"{blocks_path}.{n - 1}"]
    if any(start[f"{blocks_path}.{i}"] < end[f"{blocks_path}.{i - 1}"] for i in range(1, n)):
        raise FieldError("model", f"cannot cut {what} into layers: its blocks do not run one after another")
    pre_paths = _maximal([p for p in outside if p in end and end[p] < first])
    head_paths = sorted(_maximal([p for p in outside if p in start and start[p] > last]), key=start.get)
    between = [p for p in outside if p in start and first < start[p] < last
               and any(True for _ in outside[p].parameters())]
    if between:
        raise FieldError("model", f"cannot cut {what} into layers: {between[0]} runs between its blocks")
    if recorder.loose:
        raise FieldError("model", f"cannot cut {what} into layers: it computes {recorder.loose[0]} outside its "
                                  "modules after its first block, which a layer list cannot carry")
    rules = tuple(_rules(i, *calls[i], produced, model, what) for i in range(n))
    logits = getattr(out, "logits", out)
    _ = only_tensor(logits)
    if seen is not None:
        seen.update(calls={i: (_hidden_of(*calls[i]), calls[i][1]) for i in range(n)}, output=logits)
    return Recipe(blocks_path, tuple(pre_paths), tuple(head_paths), rules)


def _rules(index: int, args: tuple, kwargs: dict, produced, model: nn.Module, what: str):
    if len(args) > 1 or (not args and "hidden_states" not in kwargs):
        raise FieldError("model", f"cannot cut {what} into layers: its blocks take {len(args)} positional arguments; "
                                  "paraplan passes the hidden states alone")
    config = getattr(model, "config", None)
    rules = []
    for key, value in kwargs.items():
        if key == "hidden_states":
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            rules.append((key, Rule("const", value)))
        elif _is_cache(value):
            rules.append((key, Rule("const", None)))
        elif key == "position_ids" and isinstance(value, torch.Tensor):
            rules.append((key, Rule("positions", batched=value.shape[0] != 1)))
        elif key == "cache_position" and isinstance(value, torch.Tensor):
            rules.append((key, Rule("cache_position")))
        elif key == "attention_mask" and isinstance(value, torch.Tensor):
            types = getattr(config, "layer_types", None)
            rules.append((key, Rule("mask", types[index] if types else "full_attention")))
        elif id(value) in produced and _called_as_rotary(*produced[id(value)][1]):
            path, (args_, keywords) = produced[id(value)]
            rules.append((key, Rule("produced", path, batched="position_ids" in keywords)))
        else:
            raise FieldError("model", f"cannot cut {what} into layers: its block {index} receives {key!r}, which "
                                      "paraplan cannot rebuild from the hidden states")
    return tuple(rules)


def _called_as_rotary(args: tuple, keywords: tuple) -> bool:
    """A rotary-embedding module is called as f(hidden, position_ids), the ids by position or name."""
    return (len(args) == 2 and not keywords) or (len(args) == 1 and tuple(keywords) == ("position_ids",))


def _is_cache(value) -> bool:
    try:
        from transformers.cache_utils import Cache
    except ImportError:  # pragma: no cover - transformers always has it
        return False
    return isinstance(value, Cache)


def _mask(layer_type: str, config, hidden: torch.Tensor, positions: torch.Tensor):
    from transformers import masking_utils

    make = (masking_utils.create_sliding_window_causal_mask if layer_type == "sliding_attention"
            else masking_utils.create_causal_mask)
    # position_ids=None: the positions are a plain arange, nothing is packed, and the library's
    # packed-sequence detection would read values (impossible on meta)
    return make(config=config, inputs_embeds=hidden, attention_mask=None, past_key_values=None, position_ids=None)


class HFEmbedding(nn.Module):
    """The model's own code up to its first block: the whole model runs and stops there."""

    def __init__(self, model: nn.Module, pre: list[nn.Module], first_block: nn.Module):
        super().__init__()
        self.parts = nn.ModuleList(pre)  # registered: this layer owns (and moves) their parameters
        self._model = Unregistered(model)
        self._first = Unregistered(first_block)

    def forward(self, inputs):
        def stop(module, args, kwargs):
            raise _Stop(_hidden_of(args, kwargs))

        handle = self._first.module.register_forward_pre_hook(stop, with_kwargs=True)
        try:
            with meta_safe_masks(_on_meta(inputs)):
                self._model.module(inputs)
        except _Stop as stopped:
            return stopped.hidden
        finally:
            handle.remove()
        raise RuntimeError("the model finished without reaching its first block")


class HFBlock(nn.Module):
    """One block, called with its keyword arguments rebuilt from the hidden states."""

    def __init__(self, block: nn.Module, rules, config, producers: dict[str, nn.Module]):
        super().__init__()
        self.block = block
        self._rules = rules
        self._config = config
        self._producers = {path: Unregistered(m) for path, m in producers.items()}

    def arguments(self, hidden: torch.Tensor) -> dict:
        batch, seq = hidden.shape[0], hidden.shape[1]
        steps = torch.arange(seq, device=hidden.device)
        positions = steps[None]
        kwargs = {}
        for key, rule in self._rules:
            if rule.kind == "const":
                kwargs[key] = rule.value
            elif rule.kind == "positions":
                kwargs[key] = positions.expand(batch, seq) if rule.batched else positions
            elif rule.kind == "cache_position":
                kwargs[key] = steps
            elif rule.kind == "mask":
                kwargs[key] = _mask(rule.value, self._config, hidden, positions)
            elif rule.batched:  # produced: the rotary module, called as the model calls it
                kwargs[key] = self._producers[rule.value].module(hidden, position_ids=positions)
            else:
                kwargs[key] = self._producers[rule.value].module(hidden, positions)
        return kwargs

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return only_tensor(self.block(hidden, **self.arguments(hidden)))


class HFHead(nn.Module):
    """The modules that run after the last block, in the order the model calls them."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            hidden = only_tensor(part(hidden))
        return hidden


def hf_layers(model: nn.Module, recipe: Recipe) -> Layers:
    blocks = model.get_submodule(recipe.blocks_path)
    pre = [model.get_submodule(p) for p in recipe.pre_paths]
    producers = {rule.value: model.get_submodule(rule.value)
                 for rules in recipe.rules for _, rule in rules if rule.kind == "produced"}
    config = getattr(model, "config", None)
    layers: Layers = [("embedding", "embedding", HFEmbedding(model, pre, blocks[0]))]
    layers += [(f"block{i}", "block", HFBlock(b, recipe.rules[i], config, producers)) for i, b in enumerate(blocks)]
    layers.append(("head", "head", HFHead([model.get_submodule(p) for p in recipe.head_paths])))
    return layers


def check_rebuilt(model: nn.Module, recipe: Recipe, recorded: dict) -> None:
    """On meta: the rebuilt keyword arguments look like the recorded ones, block by block
    (`recorded`: each block's (hidden states, keyword arguments) as `record(..., seen)` saw them)."""
    what = type(model).__name__
    blocks = model.get_submodule(recipe.blocks_path)
    for i, (hidden, kwargs) in recorded.items():
        rebuilt = HFBlock(blocks[i], recipe.rules[i], getattr(model, "config", None),
                          {r.value: model.get_submodule(r.value) for _, r in recipe.rules[i]
                           if r.kind == "produced"}).arguments(hidden)
        for key, value in kwargs.items():
            if key == "hidden_states" or _is_cache(value):
                continue
            if _signature(value) != _signature(rebuilt.get(key)):
                raise FieldError("model", f"cannot cut {what} into layers: block {i}'s {key!r} could not be rebuilt "
                                          f"({_signature(rebuilt.get(key))} instead of {_signature(value)})")


def _signature(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype)
    if isinstance(value, (tuple, list)):
        return tuple(_signature(v) for v in value)
    return value
