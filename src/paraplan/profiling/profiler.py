"""`paraplan profile`: measure a real model layer by layer and write a Profile.

Timing on a shared CPU is noisy (shared/notes/runtime-on-cpu.md: medians of one layer differ
1.3-1.9x between processes and runs), so: one thread by default, warm-up runs, the median of
repeats with its spread, and two honesty checks in the profile itself:
  - the sum of per-layer forward+backward times against a plain whole training step at the
    largest batch size, the two interleaved (the gap is reported, target within 10% on the CPU);
  - repeatability: the largest batch size is timed a second time; the ratio per layer is kept.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from paraplan.costs.profile import LayerProfile, Profile, StepCheck
from paraplan.errors import FieldError
from paraplan.models.adapters import decompose
from paraplan.models.inputs import loss_fn, make_batch
from paraplan.profiling.layers import profile_layers
from paraplan.profiling.layers import step_check as measure_step_check


@dataclass(frozen=True)
class Workload:
    """What to profile: layers, a maker of inputs (and targets) for a batch size, a loss."""

    name: str
    layers: list[tuple[str, str, nn.Module]]
    make_batch: Callable[[int], tuple]  # batch -> (inputs, targets)
    loss: Callable
    inputs: str


def zoo_workload(name: str, device: torch.device, seq_len: int | None = None,
                 image_size: int | None = None) -> Workload:
    from paraplan.models import zoo

    built = zoo.build(name, device=device, seq_len=seq_len, image_size=image_size, seed=0)
    built.module.train()
    layers = decompose(built.module, built.family)
    return Workload(name=built.name, layers=layers, loss=loss_fn, inputs=built.inputs.describe(),
                    make_batch=lambda b: make_batch(built.inputs, b, device=device, seed=b))


def module_workload(spec: str, device: torch.device) -> Workload:
    """`path/to/file.py:build_fn`; build_fn() returns (model, sample batch) with the batch on dim 0."""
    path, _, fn_name = spec.rpartition(":")
    if not path or not fn_name:
        raise FieldError("module", f"expected path/to/file.py:build_fn, got {spec!r}")
    if not Path(path).is_file():
        raise FieldError("module", f"no such file {path!r}")
    mod_spec = importlib.util.spec_from_file_location(f"paraplan_user_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.path.insert(0, str(Path(path).resolve().parent))
    try:
        mod_spec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    build = getattr(module, fn_name, None)
    if not callable(build):
        raise FieldError("module", f"{path} has no function {fn_name!r}")
    result = build()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise FieldError("module", f"{fn_name}() must return (model, sample_batch)")
    model, sample = result
    model = model.to(device).train()
    try:
        layers = decompose(model)
    except ValueError as exc:
        raise FieldError("module", str(exc)) from None

    def resize(value, batch: int):
        if isinstance(value, torch.Tensor):
            reps = -(-batch // value.shape[0])
            return value.repeat(reps, *([1] * (value.dim() - 1)))[:batch].to(device)
        if isinstance(value, (tuple, list)):
            return type(value)(resize(v, batch) for v in value)
        raise FieldError("module", "the sample batch must be a tensor or a tuple of tensors")

    def mean_loss(out, _targets):
        return sum(t.float().mean() for t in (out if isinstance(out, (tuple, list)) else [out]))

    first = sample[0] if isinstance(sample, (tuple, list)) else sample
    return Workload(name=f"{Path(path).name}:{fn_name}", layers=layers, loss=mean_loss,
                    inputs=f"sample batch of shape {tuple(first.shape)}",
                    make_batch=lambda b: (resize(sample, b), None))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return name


def run_profile(work: Workload, device: torch.device, batch_sizes: list[int], threads: int, warmup: int,
                repeats: int, step_check: bool = True, repeat_check: bool = True,
                progress: Callable[[], None] | None = None) -> Profile:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    raw = profile_layers(work.layers, work.make_batch, work.loss, batch_sizes, device, warmup, repeats, progress)
    layers = tuple(
        LayerProfile(name=name, kind=kind, batch_sizes=tuple(batch_sizes),
                     forward=tuple(t.forward for t in raw[i]), backward=tuple(t.backward for t in raw[i]),
                     output_bytes=tuple(t.output_bytes for t in raw[i]), saved_bytes=tuple(t.saved_bytes for t in raw[i]),
                     peak_bytes=tuple(t.peak_bytes for t in raw[i]))
        for i, (name, kind, _) in enumerate(work.layers))
    largest = batch_sizes[-1]
    check = None
    if step_check:
        measured, total = measure_step_check(work.layers, work.make_batch, work.loss, largest, device, warmup, repeats)
        check = StepCheck(batch=largest, measured=measured, sum_of_layers_s=total)
    ratios: tuple[float, ...] = ()
    if repeat_check:
        again = profile_layers(work.layers, work.make_batch, work.loss, [largest], device, warmup, repeats)
        ratios = tuple(
            (again[i][0].forward.median_s + again[i][0].backward.median_s)
            / max(1e-12, layers[i].forward[-1].median_s + layers[i].backward[-1].median_s)
            for i in range(len(layers)))
    return Profile(
        model=work.name, inputs=work.inputs, device=str(device), device_name=device_name(device),
        machine=f"{platform.node()} ({platform.system()} {platform.machine()}, {os.cpu_count()} cores)",
        torch_version=torch.__version__, threads=threads,
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), warmup=warmup, repeats=repeats,
        layers=layers, step_check=check, repeatability=ratios)
