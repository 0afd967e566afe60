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
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from paraplan.costs.profile import LayerProfile, Profile, StepCheck
from paraplan.errors import FieldError, ParaplanError
from paraplan.models.spec import ModelSpec
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


def workload(model: str, device: torch.device, seq_len: int | None = None, image_size: int | None = None,
             layers: str | None = None) -> Workload:
    """Any model reference (a zoo name, hf:..., path/file.py:build_fn; models/ref.py), built on
    `device` with seeded weights, cut as the planners and the runtime cut it."""
    from paraplan.models import source

    built = source.build(model, device=device, seq_len=seq_len, image_size=image_size, layers=layers, seed=0)
    built.module.to(device).train()
    return Workload(name=built.ref, layers=built.layers(), loss=built.loss, inputs=built.inputs.describe(),
                    make_batch=lambda b: built.batch(b, device=device, seed=b))


def estimated_step_bytes(spec: ModelSpec, batch: int) -> float:
    """What one profiled training step at micro-batch `batch` keeps alive at its peak, by the
    model's own measurement (models/measure.py): weights and gradients, the batch and its targets,
    and every layer's saved activations and output (the profiler holds them all until the backward;
    profiling/layers.py). A floor: the backward's temporaries come on top."""
    params = sum(layer.param_bytes for layer in spec.layers)
    activations = sum(layer.saved_bytes.at(batch) + layer.output_bytes.at(batch) for layer in spec.layers)
    return 2.0 * params + 2.0 * spec.input_bytes.at(batch) + activations


def check_batches_fit(reference: str, device: torch.device, batch_sizes, seq_len: int | None = None,
                      image_size: int | None = None, layers: str | None = None) -> None:
    """FieldError naming the largest batch size, its estimate and the memory available, before any
    real weight or batch is allocated: a batch of 10**12 samples otherwise ends deep in the
    allocator. The model is measured on meta (no memory)."""
    from paraplan.models import measure, source
    from paraplan.system.host import available_memory_bytes, gib

    spec = measure.measure(source.build(reference, device="meta", seq_len=seq_len, image_size=image_size,
                                        layers=layers))
    if device.type == "cuda":
        available, where = torch.cuda.mem_get_info(device)[0], f"{device_name(device)} has"
    else:
        available, where = available_memory_bytes(), "this machine has"
    largest = max(batch_sizes)
    need = estimated_step_bytes(spec, largest)
    if available is not None and need > available:
        raise FieldError("batch_sizes", f"a training step of {spec.name} at micro-batch {largest:,} needs about "
                                        f"{gib(need)} (weights, gradients, the batch and every layer's activations); "
                                        f"{where} {gib(available)} available")


def out_of_memory(exc: BaseException) -> bool:
    """Whether an exception is an allocator's refusal (torch's or Python's), not a bug."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def allocator_error(exc: BaseException, what: str) -> ParaplanError:
    """One line for an allocation that failed while `what` ran."""
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    return ParaplanError(f"out of memory while {what}: {first}")


def zoo_workload(name: str, device: torch.device, seq_len: int | None = None,
                 image_size: int | None = None) -> Workload:
    return workload(name, device, seq_len=seq_len, image_size=image_size)


def module_workload(spec: str, device: torch.device) -> Workload:
    """`path/to/file.py:build_fn`; build_fn() returns (model, sample batch) with the batch on dim 0."""
    return workload(spec, device)


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
                progress: Callable[[], None] | None = None, precision: str = "fp32") -> Profile:
    """`precision`: bf16 / fp16 layers timed under autocast (as the runtime's mixed-precision recipe
    runs them: fp32 weights, 16-bit compute)."""
    import contextlib

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    with torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
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
