"""Cut a plain `nn.Module` into an ordered list of layers with a torch.fx trace.

Why fx and not just the module's children in registration order: the order children are
registered in says nothing about the order `forward` calls them, nor about the functional code
between them (`x.flatten(2).transpose(1, 2)`, a residual `x + f(x)`, a mean). The trace gives both,
and `torch.fx.passes.split_module` turns the traced graph into one GraphModule per layer that
computes exactly the traced code, so the layers compose back to the model by construction.

The units of the cut are the model's direct children, with `nn.ModuleList` and `nn.Sequential`
children opened one level (each element a unit); they are traced as leaves, so a unit runs its own
`forward` untouched. With `layers_path` (e.g. "blocks"), the elements of that list are the layers
and everything before the first (after the last) becomes one "embedding" ("head") layer.

A pipeline passes one value (or one tuple) from layer to layer, so a value that skips a layer (a
long skip connection) cannot be cut there: that is an error naming both layers.
"""

from __future__ import annotations

from torch import fx, nn
from torch.fx.passes.split_module import split_module

from paraplan.errors import FieldError

Layers = list[tuple[str, str, nn.Module]]


def kind_of(module: nn.Module) -> str:
    """conv / fc / other, by what the layer contains (for tables and the per-layer cost models)."""
    if any(isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) for m in module.modules()):
        return "conv"
    if any(isinstance(m, nn.Linear) for m in module.modules()):
        return "fc"
    return "other"


def _units(model: nn.Module, layers_path: str | None) -> tuple[list[str], set[str]]:
    """(the unit paths in call-independent registration order, the block paths of layers_path)."""
    blocks: set[str] = set()
    if layers_path is not None:
        try:
            listed = model.get_submodule(layers_path)
        except AttributeError:
            raise FieldError("layers", f"{type(model).__name__} has no submodule {layers_path!r}") from None
        if not isinstance(listed, (nn.ModuleList, nn.Sequential)) or len(listed) == 0:
            raise FieldError("layers", f"{layers_path!r} is a {type(listed).__name__}, not a non-empty list of blocks "
                                       "(nn.ModuleList or nn.Sequential)")
        blocks = {f"{layers_path}.{name}" for name, _ in listed.named_children()}
    units: list[str] = []

    def open_up(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            path = prefix + name
            if path == layers_path:
                units.extend(f"{path}.{n}" for n, _ in child.named_children())
            elif layers_path is not None and layers_path.startswith(path + "."):
                open_up(child, path + ".")  # an ancestor of the block list is traced through
            elif not prefix and isinstance(child, (nn.ModuleList, nn.Sequential)) and len(child) > 0:
                units.extend(f"{path}.{n}" for n, _ in child.named_children())
            else:
                units.append(path)

    open_up(model, "")
    return units, blocks


class _UnitTracer(fx.Tracer):
    def __init__(self, leaves: set[str]):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.leaves or super().is_leaf_module(m, qualname)


def fx_layers(model: nn.Module, layers_path: str | None = None) -> Layers:
    """The ordered layers of `model` (see the module docstring); raises FieldError('model', ...)."""
    what = type(model).__name__
    units, blocks = _units(model, layers_path)
    try:
        graph = _UnitTracer(set(units)).trace(model)
    except Exception as exc:  # fx raises many types for untraceable Python (data-dependent control flow)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FieldError("model", f"cannot cut {what} into layers: torch.fx cannot trace its forward ({first}); "
                                  "make it an nn.Sequential, or name its list of blocks with layers=PATH") from None
    gm = fx.GraphModule(model, graph)
    holders = _hold_root_tensors(gm, model)

    # each node belongs to the layer of the last unit called before it (code before the first
    # unit goes with the first); with a block list, everything outside the blocks merges into
    # one layer before and one after
    names: list[str] = []
    part_of: dict[str, int] = {}
    current = 0
    seen_block = False
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target not in holders:
            unit = next((u for u in units if node.target == u or node.target.startswith(u + ".")), node.target)
            if layers_path is not None:
                if unit in blocks:
                    seen_block = True
                else:
                    unit = "head" if seen_block else "embedding"
            if unit in names and names.index(unit) != len(names) - 1:
                raise FieldError("model", f"cannot cut {what} into layers: {unit} is called again after "
                                          f"{names[-1]}; a pipeline runs each layer once, in order")
            if unit not in names:
                names.append(unit)
            current = names.index(unit)
        if node.op != "output":
            part_of[node.name] = current
    if not names:
        raise FieldError("model", f"cannot cut {what} into layers: its forward calls no submodule")
    if len(names) == 1:
        raise FieldError("model", f"cannot cut {what} into layers: everything happens in {names[0]}; name a list "
                                  "of blocks with layers=PATH")
    split = split_module(gm, model, lambda node: part_of[node.name])
    _check_chain(split, names, what)
    parts = [getattr(split, f"submod_{i}") for i in range(len(names))]
    return [(name, "block" if name in blocks else kind_of(part), part) for name, part in zip(names, parts, strict=True)]


class _HeldTensor(nn.Module):
    """A parameter or buffer the traced module reads directly (`x + self.pos`), held by a module
    of its own: split_module passes a tensor attribute into a layer as an extra input, which a
    pipeline cannot give (each layer takes only the previous one's output), while a module it
    copies into the layer that calls it. The tensor is the model's own object, so the layer owns
    it, trains it and checkpoints it under the model's name (runtime/state/layout_state.py keys by
    identity)."""

    def __init__(self, value, persistent: bool = True):
        super().__init__()
        if isinstance(value, nn.Parameter):
            self.value = value
        else:
            self.register_buffer("value", value, persistent=persistent)

    def forward(self):
        return self.value


def _hold_root_tensors(gm: fx.GraphModule, model: nn.Module) -> set[str]:
    """Every get_attr of a tensor (not a submodule) in the traced graph becomes calls of a
    `_HeldTensor` registered on `gm`, one just before each node that reads it, so the cut keeps
    the tensor in every layer that reads it (fx puts the get_attr where the attribute is first
    accessed, which may be a layer before: `self.gain * self.l2(h)`). A parameter read by two
    layers is then a weight they share, as a tied embedding is (owned by the first, synchronised
    by the runtime across stages). Returns the holders' names (the cut treats their calls as code,
    not as units)."""
    import torch

    holders: dict[str, str] = {}
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value, persistent = _tensor_attribute(model, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        if node.target not in holders:
            name, k = "paraplan_held_" + node.target.replace(".", "_"), 1
            while hasattr(gm, name):  # `a.b_c` and `a_b.c` must not share a holder
                name, k = f"paraplan_held_{node.target.replace('.', '_')}_{k}", k + 1
            gm.add_submodule(name, _HeldTensor(value, persistent))
            holders[node.target] = name
        for user in list(node.users):
            with gm.graph.inserting_before(user):
                call = gm.graph.call_module(holders[node.target])
            user.replace_input_with(node, call)
        gm.graph.erase_node(node)
    gm.recompile()
    return set(holders.values())


def _tensor_attribute(model: nn.Module, target: str):
    """(the parameter or buffer at `target`, whether a buffer is persistent), or (None, True)."""
    owner_path, _, attr = target.rpartition(".")
    try:
        owner = model.get_submodule(owner_path)
    except AttributeError:
        return None, True
    if attr in owner._parameters:
        return owner._parameters[attr], True
    if attr in owner._buffers:
        return owner._buffers[attr], attr not in owner._non_persistent_buffers_set
    return None, True


def _check_chain(split: fx.GraphModule, names: list[str], what: str) -> None:
    """Layer i may use only what layer i-1 returns (the model's input for layer 0)."""
    producer: dict[str, int] = {}
    for node in split.graph.nodes:
        if node.op == "placeholder":
            producer[node.name] = -1
        elif node.op == "call_module":
            index = int(node.target.split("_")[-1])
            for arg in node.all_input_nodes:
                src = _source(arg, producer)
                if src != index - 1:
                    origin = "the model's input" if src == -1 else names[src]
                    raise FieldError("model", f"cannot cut {what} into layers: {names[index]} uses a value from "
                                              f"{origin}, skipping the layers between (a pipeline passes values only "
                                              "to the next layer); keep skip connections inside one block, or name "
                                              "the list of blocks with layers=PATH")
            producer[node.name] = index
        elif node.op == "call_function":  # getitem on a tuple-returning layer
            producer[node.name] = max((_source(a, producer) for a in node.all_input_nodes), default=-1)
        elif node.op == "output":
            last = max((_source(a, producer) for a in node.all_input_nodes), default=-1)
            if last != len(names) - 1:
                raise FieldError("model", f"cannot cut {what} into layers: its output does not come from its last "
                                          f"layer {names[-1]}")


def _source(node: fx.Node, producer: dict[str, int]) -> int:
    return producer.get(node.name, -1)


def sequential_layers(model: nn.Sequential) -> Layers:
    """An nn.Sequential is already an ordered list of layers."""
    return [(name, kind_of(child), child) for name, child in model.named_children()]


def module_layers(model: nn.Module, layers_path: str | None = None) -> Layers:
    if isinstance(model, nn.Sequential) and layers_path is None:
        return sequential_layers(model)
    return fx_layers(model, layers_path)

