"""A user's own model: `path/to/file.py:build_fn`.

`build_fn()` returns `(model, sample_inputs)` or `(model, sample_inputs, sample_targets)`, the
batch on dim 0 (a tensor or a tuple of tensors). paraplan calls it under `torch.device(...)`, so
`torch.randn(...)` and the model's parameters land where paraplan builds (the meta device for
planning); the sample gives shapes and dtypes, and on a real device the range of integer inputs.
Training data are random tensors shaped like the sample (integers below the sample's maximum + 1),
seeded per step; the loss is cross-entropy for integer targets, mean squared error for float
targets, and the mean of the outputs without targets (models/built.py).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from torch import nn

from paraplan.errors import FieldError
from paraplan.models.ref import ModelRef


def _tensors_only(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() >= 1
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(_tensors_only(v) for v in value)


def _first(value) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else _first(value[0])


def load(ref: ModelRef):
    """(model, sample inputs, sample targets or None) from the user's build function."""
    path, _, fn_name = ref.target.rpartition(":")
    if not Path(path).is_file():
        raise FieldError("model", f"no such file {path!r}")
    name = f"paraplan_user_{Path(path).stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(Path(path).resolve().parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's file: any error there is theirs to see, in one line
        raise FieldError("model", f"{path} failed to import: {type(exc).__name__}: {exc}") from None
    finally:
        sys.path.pop(0)
    build = getattr(module, fn_name, None)
    if not callable(build):
        raise FieldError("model", f"{path} has no function {fn_name!r}")
    try:
        result = build()
    except Exception as exc:
        raise FieldError("model", f"{fn_name}() failed: {type(exc).__name__}: {exc}") from None
    if not (isinstance(result, tuple) and len(result) in (2, 3) and isinstance(result[0], nn.Module)):
        raise FieldError("model", f"{fn_name}() must return (model, sample_inputs) or "
                                  "(model, sample_inputs, sample_targets)")
    model, inputs = result[0], result[1]
    targets = result[2] if len(result) == 3 else None
    if not _tensors_only(inputs) or (targets is not None and not isinstance(targets, torch.Tensor)):
        raise FieldError("model", f"{fn_name}(): the sample batch must be a tensor or a tuple of tensors, "
                                  "batch on dim 0")
    batch = _first(inputs).shape[0]
    if targets is not None and targets.shape[0] != batch:
        raise FieldError("model", f"{fn_name}(): {batch} sample inputs but {targets.shape[0]} targets")
    return model, inputs, targets


def describe(inputs, targets) -> str:
    def shapes(v):
        return str(tuple(v.shape[1:])) if isinstance(v, torch.Tensor) else ", ".join(shapes(t) for t in v)
    text = f"sample: inputs {shapes(inputs)} per sample"
    return text + (f", targets {tuple(targets.shape[1:])}" if targets is not None else ", no targets")
