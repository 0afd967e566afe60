"""Build one stage of a plan without ever holding the whole model.

The model is constructed with its parameters on the meta device and its buffers real (the trick
of accelerate's `init_empty_weights(include_buffers=False)`, written out here in a few lines so
as not to depend on accelerate for it): buffers such as rotary frequencies or position ids are
computed by the model's own constructor. Then only the parameters of the stage's layers are
materialised, each initialised from a generator seeded by the seed and the parameter's name in the
whole model, so every rank, and the single-process reference, gets identical weights.

Initialisation (paraplan's, for runs from scratch): matrices and embeddings N(0, 0.02), vectors
named "...weight" (norm scales) ones, other vectors (biases) zeros.
"""

from __future__ import annotations

import contextlib
import zlib

import torch
from torch import nn

from paraplan.models import source


@contextlib.contextmanager
def parameters_on_meta():
    original = nn.Module.register_parameter

    def register(module, name, param):
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            cls = type(module._parameters[name])
            kwargs = module._parameters[name].__dict__
            module._parameters[name] = cls(module._parameters[name].to("meta"), **kwargs)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def init_parameter(name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    if len(shape) >= 2:
        return torch.empty(shape).normal_(0.0, 0.02, generator=gen)
    if name.endswith("weight"):
        return torch.ones(shape)
    return torch.zeros(shape)


def build_layers(model: str, seed: int = 0, seq_len: int | None = None, image_size: int | None = None,
                 dropout: bool = True):
    """(full model with meta parameters, its layer list, parameter names by id); `model` is any
    model reference (models/ref.py), as a plan stores it."""
    with parameters_on_meta():
        built = source.build(model, device="cpu", seq_len=seq_len, image_size=image_size, seed=seed)
    if not dropout:
        without_dropout(built.module)
    names = {}
    for name, p in built.module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)
    return built, built.layers(), names


def materialize(modules: list[nn.Module], names: dict[int, str], seed: int, device: torch.device,
                made: dict[int, nn.Parameter] | None = None) -> None:
    """Give every parameter the modules use real, seeded values (tied parameters stay tied, also
    across calls that pass the same `made`); `names` learns the new parameters' names."""
    made = {} if made is None else made
    for top in modules:
        for module in top.modules():
            for pname, p in list(module._parameters.items()):
                if p is None:
                    continue
                if id(p) not in made:
                    value = init_parameter(names.get(id(p), pname), p.shape, seed).to(device)
                    new = nn.Parameter(value, requires_grad=p.requires_grad)
                    made[id(p)] = made[id(new)] = new
                    if id(p) in names:  # the new parameter keeps its name in the whole model
                        names[id(new)] = names[id(p)]
                module._parameters[pname] = made[id(p)]
        top.to(device)


def without_dropout(model: nn.Module) -> None:
    """Every dropout off, for runs compared with one process: nn.Dropout modules, and the float
    probabilities transformers copies from its config into modules and applies functionally
    (OPT's `F.dropout(x, p=self.dropout)`), and the config itself (read at forward time by some)."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
        for attr, value in list(vars(m).items()):
            if isinstance(value, float) and ("dropout" in attr or "pdrop" in attr or attr == "layerdrop"):
                setattr(m, attr, 0.0)
        config = getattr(m, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            for key, value in config.to_dict().items():
                if isinstance(value, float) and ("dropout" in key or "pdrop" in key or key == "layerdrop"):
                    setattr(config, key, 0.0)


class StageModule(nn.Module):
    """The layers of one stage, applied in order; several inputs arrive as one tuple."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, *args):
        x = args[0] if len(args) == 1 else args
        for layer in self.layers:
            x = layer(x)
        # gloo sends only contiguous tensors; a layer may end in a view (a transpose, a slice)
        if isinstance(x, torch.Tensor):
            return x.contiguous()
        if isinstance(x, tuple):
            return tuple(t.contiguous() if isinstance(t, torch.Tensor) else t for t in x)
        return x
