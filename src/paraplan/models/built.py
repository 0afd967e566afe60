"""A built model: the nn.Module, what one sample looks like, how to cut it, make batches and a loss.

Every way of naming a model (a zoo name, a transformers config, a user's file; models/source.py)
ends here, so measurement, profiling and the runtime handle them alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from paraplan.models.inputs import loss_fn, make_batch
from paraplan.models.spec import InputSpec

Layers = list[tuple[str, str, nn.Module]]


@dataclass(frozen=True)
class BuiltModel:
    name: str  # what tables show
    family: str  # how it is cut: an adapter (gpt2, llama, ...), "sequential", "hf" (generic) or "module"
    module: nn.Module
    inputs: InputSpec
    ref: str = ""  # the canonical model reference (models/ref.py): what a plan stores
    layers_path: str | None = None  # the user's block list, if given
    sample: tuple | None = None  # a user's module: (sample inputs, sample targets or None)
    recipe: object = None  # "hf": how to cut it (models/hf_cut.Recipe), recorded on meta

    def layers(self) -> Layers:
        """The ordered layers that compose back to the model."""
        if self.family == "hf":
            from paraplan.models.hf_cut import hf_layers

            return hf_layers(self.module, self.recipe)
        if self.family == "module":
            from paraplan.models.fx_cut import module_layers

            return module_layers(self.module, self.layers_path)
        from paraplan.models.adapters import decompose

        return decompose(self.module, self.family)

    def batch(self, batch: int, device: str | torch.device = "cpu", seed: int = 0):
        """(inputs, targets) for `batch` samples, deterministic in `seed`; shapes only on meta."""
        if self.sample is None:
            return make_batch(self.inputs, batch, device=device, seed=seed)
        gen = torch.Generator().manual_seed(seed)
        inputs, targets = self.sample
        return _like(inputs, batch, device, gen), (None if targets is None else _like(targets, batch, device, gen))

    def loss(self, out, targets) -> torch.Tensor:
        if self.sample is None:
            return loss_fn(out, targets)
        return sample_loss(out, targets)


def sample_loss(out, targets) -> torch.Tensor:
    """A user's module: cross-entropy for integer targets, mean squared error for float targets,
    and without targets the mean of the outputs (as `paraplan profile --module` has always done)."""
    if targets is None:
        return sum(t.float().mean() for t in (out if isinstance(out, (tuple, list)) else [out]))
    if not targets.is_floating_point():
        return F.cross_entropy(out.reshape(-1, out.shape[-1]).float(), targets.reshape(-1))
    return F.mse_loss(out.float(), targets.float())


def _like(value, batch: int, device, gen: torch.Generator):
    """Random data shaped like one sample of `value`, `batch` samples of it (batch on dim 0)."""
    if isinstance(value, (tuple, list)):
        return type(value)(_like(v, batch, device, gen) for v in value)
    shape = (batch, *value.shape[1:])
    device = torch.device(device)
    if device.type == "meta" or value.device.type == "meta":
        return torch.empty(shape, dtype=value.dtype, device="meta" if device.type == "meta" else device)
    if value.is_floating_point():
        return torch.randn(shape, generator=gen, dtype=torch.float32).to(value.dtype).to(device)
    high = int(value.max()) + 1 if value.numel() else 2
    return torch.randint(0, max(high, 1), shape, generator=gen, dtype=value.dtype).to(device)
