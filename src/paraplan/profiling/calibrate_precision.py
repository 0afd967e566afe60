"""This machine's compute in another precision than fp32, measured when a plan in it first needs
it (issue 33: bf16 on a CPU is not fp32's speed; the device model's other dtypes otherwise keep
the analytic preset's ratio to fp32, never measured here).

The quick reference model is profiled as `paraplan calibrate` profiles it (every other core
training it too), its layers timed under autocast in that precision, and the device model fitted
to those times (costs/calibration_fit.py) gives the precision's effective rate: the calibrated
fp32 cluster's device with that dtype's peak replaced. The runtime's overheads and the links stay
fp32's (they do not depend on the precision the layers compute in).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from paraplan.hardware.cluster import Cluster


def calibrate_precision(cluster: Cluster, precision: str, progress: Callable[[str], None] = lambda s: None,
                        repeats: int = 5) -> Cluster:
    import torch

    from paraplan.costs.calibration_fit import fit_compute, layer_samples
    from paraplan.models import measure, source
    from paraplan.profiling.calibrate import BATCH_SIZES, QUICK_MODELS, CoresLoaded
    from paraplan.profiling.profiler import run_profile, workload

    cores = cluster.n_devices
    samples = []
    for model in QUICK_MODELS:
        work = workload(model, torch.device("cpu"))
        spec = measure.measure(source.build(model, device="meta"), precision=precision)
        progress(f"compute in {precision}: profiling {model} while {cores - 1} other core(s) train it too")
        with CoresLoaded(cores - 1, model):
            loaded = run_profile(work, torch.device("cpu"), list(BATCH_SIZES), 1, 3, repeats, step_check=False,
                                 repeat_check=False, precision=precision)
        samples.append((spec, loaded))
    fit = fit_compute(layer_samples(samples))
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    nodes = []
    for node in cluster.nodes:
        devices = tuple(replace(d, other_peaks=tuple(sorted({**dict(d.other_peaks), precision: fit.flops_per_s}.items())),
                                other_efficiencies=tuple((k, v) for k, v in d.other_efficiencies if k != precision),
                                source=f"{d.source}; {precision}: fitted to {', '.join(QUICK_MODELS)} under autocast "
                                       f"with every core loaded ({when} UTC)")
                        for d in node.devices)
        nodes.append(replace(node, devices=devices))
    return replace(cluster, nodes=tuple(nodes),
                   description=f"{cluster.description}; its {precision} compute measured on {when} UTC")
