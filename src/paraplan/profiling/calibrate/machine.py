"""`paraplan calibrate` (profiling/calibrate/): this machine's three measurements put together into
the calibrated cluster: the device model fitted to the loaded compute, the loaded links with the
latency a running pipeline sees, the runtime's overheads; everything measured kept in the file's
[calibration] table, beside the figures it chose.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from paraplan.errors import ParaplanError
from paraplan.profiling.calibrate.compute import BATCH_SIZES, measure_compute, measure_links
from paraplan.profiling.calibrate.runtime_costs import (
    in_run_compute_scale,
    measure_optimizer,
    measure_overheads,
    measure_strategy_costs,
    message_and_step_costs,
)

REFERENCE_MODELS = ("gpt2-tiny", "vgg-tiny", "bert-tiny")  # attention + MLP, convolutions, another transformer
QUICK_MODELS = ("gpt2-tiny", "llama-tiny")  # two attention styles (explicit with dropout; fused SDPA with RMSNorm, rotary, SwiGLU)


@dataclass(frozen=True)
class Calibration:
    cluster: object  # hardware.Cluster, the calibrated one
    evidence: dict  # what goes into the file's [calibration] table
    summary: list[str]  # lines for the terminal


def calibrate(quick: bool = False, devices: int | None = None,
              progress: Callable[[str], None] = lambda s: None) -> Calibration:
    """`devices`: how many of this machine's cores the cluster has (default: all), each its own
    process in training; the compute is measured with that many cores busy."""
    import os

    from paraplan.costs.calibration_fit import fit_compute, fitted_device, layer_samples
    from paraplan.hardware.cluster import Cluster, LinkSpec, NodeSpec, RuntimeOverheads
    from paraplan.hardware.presets import local_cluster

    cores = os.cpu_count() or 1
    if cores < 2:
        raise ParaplanError("calibrate measures links and a 2-process run: this machine has one core")
    if devices is not None and not 2 <= devices <= cores:
        raise ParaplanError(f"calibrate: devices must be between 2 and this machine's {cores} cores, got {devices}")
    cores = devices or cores
    models = QUICK_MODELS if quick else REFERENCE_MODELS
    repeats = 5 if quick else 9
    compute = measure_compute(models, cores, repeats, progress)
    fit = fit_compute(layer_samples([(spec, loaded) for spec, _, loaded, _ in compute]))
    fit_idle = fit_compute(layer_samples([(spec, idle) for spec, idle, _, _ in compute]))
    largest = BATCH_SIZES[-1]
    slowdown = {spec.name: ratio for spec, _, _, ratio in compute}
    idle_links, loaded_links = measure_links(2, progress)
    overhead = measure_overheads(3 if quick else 4, 12 if quick else 14, progress)
    runs, overhead_plan = overhead.overheads, overhead.plan
    optimizer = measure_optimizer(cores, progress)
    compute_scale = statistics.median(slowdown.values())
    gpt2 = next((spec, idle) for spec, idle, _, _ in compute if spec.name == "gpt2-tiny")
    curve = tuple(tuple(p) for p in optimizer["curve"])
    own_step = _own_optimizer_step_s(overhead_plan, gpt2[0], curve)
    solo_own_step = _own_optimizer_step_s(overhead.solo, gpt2[0], curve)
    overheads = RuntimeOverheads(
        rendezvous=True, action_s=statistics.median(o.action_s for o in runs),
        step_s=max(0.0, statistics.median(o.step_s for o in runs) - own_step), compute_scale=compute_scale,
        solo_step_s=max(0.0, overhead.solo_outside_s - solo_own_step),
        optimizer_s_per_byte=optimizer["per_byte_s"], optimizer_curve=curve,
        source=f"paraplan calibrate: median of {len(runs)} runs of a 2-stage 1F1B gpt2-tiny plan on this machine; "
               f"compute scale loaded / idle over {', '.join(models)} and inside those runs; TP / SDP per layer and "
               f"DP per step from TP2 / SDP2 / DP2 runs")

    base = local_cluster()
    device = fitted_device(base.nodes[0].devices[0], fit,
                           f"paraplan calibrate: fitted to {', '.join(models)} profiled with every core loaded "
                           f"(peak_flops is the effective rate)")
    link = LinkSpec(bandwidth_bytes_per_s=loaded_links.p2p.bandwidth_bytes_per_s,
                    latency_s=loaded_links.p2p.latency_s)
    cluster = Cluster(name="local-calibrated", overheads=overheads,
                      description=f"this machine ({cores} CPU cores as devices, gloo on loopback), measured by "
                                  f"paraplan calibrate on {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC",
                      nodes=(NodeSpec(name="localhost", devices=(device,) * cores, intra_link=link, network=link),))
    # the compute scale as the overhead plan's runs measured it (their ranks' compute against the
    # same compute profiled alone), where it exceeds the busy-loop's: what the latency fit below
    # would otherwise put on the messages
    loaded_scale = compute_scale
    in_runs = in_run_compute_scale(overhead_plan, gpt2[0], gpt2[1], cluster, overhead.compute_s)
    compute_scale = max(loaded_scale, in_runs)
    cluster = replace(cluster, overheads=replace(cluster.overheads, compute_scale=compute_scale))
    cluster, alpha, step_extra = _messages_and_step(cluster, overhead, gpt2, link, progress)
    links_evidence, links_line = _links_evidence(idle_links, loaded_links, overhead, alpha, step_extra)
    strategies = measure_strategy_costs(gpt2[0], gpt2[1], cluster, 1 if quick else 2, 12 if quick else 14, progress)
    cluster = strategies["cluster"]
    evidence = {
        "compute": {"models": list(models), "batch_sizes": list(BATCH_SIZES), "repeats": repeats,
                    f"step_busy_over_idle_at_batch_{largest}": slowdown,
                    "fit_loaded": _fit_table(fit), "fit_idle": _fit_table(fit_idle)},
        "links": links_evidence,
        "runtime": {"runs": [{"action_s": o.action_s, "step_s": o.step_s} for o in runs],
                    "optimizer": optimizer, "overhead_plan_own_optimizer_s": own_step,
                    "one_process_outside_schedule_s": overhead.solo_outside_s, "one_process_own_optimizer_s": solo_own_step,
                    "compute_scale_in_runs": in_runs, "compute_scale_beside_busy_loops": loaded_scale,
                    "overhead_plan_compute_s": overhead.compute_s,
                    "strategies": strategies["evidence"]},
    }
    summary = [
        f"compute: effective {fit.flops_per_s / 1e9:.1f} GFLOP/s per core, {fit.kernel_overhead_s * 1e6:.1f} us per "
        f"kernel, {fit.memory_bandwidth_bytes_per_s / 1e9:.2f} GB/s (fitted to {fit.samples} layer passes of "
        f"{', '.join(models)} with every core loaded; median layer error {fit.median_abs_error:.0%})",
        f"compute: a training step with the other cores busy / idle, at batch {largest}: "
        + ", ".join(f"{m} {r:.2f}x" for m, r in slowdown.items()),
        links_line,
        f"runtime: {overheads.action_s * 1e3:.2f} ms per pipeline action, {overheads.step_s * 1e3:.2f} ms per step "
        f"(+{step_extra * 1e3:.2f} beyond the timeline) "
        f"(median of {len(runs)} runs: " + ", ".join(f"{o.action_s * 1e3:.2f}/{o.step_s * 1e3:.2f}" for o in runs)
        + f" ms, less {own_step * 1e3:.2f} ms of its own optimizer step); one process {overheads.solo_step_s * 1e3:.2f} ms "
        f"per step; compute x{compute_scale:.2f} while every "
        f"core computes (x{in_runs:.2f} inside the runs, x{loaded_scale:.2f} beside busy loops); the optimizer (Adam) " + ", ".join(f"{s / (b / 16) * 1e9:.2f}" for b, s in curve)
        + f" ns per parameter at {', '.join(f'{b / 16 / 1e6:g}M' for b, _ in curve)} parameters",
        f"runtime: TP (DTensor) {cluster.overheads.tp_kernel_s * 1e6:.0f} us per kernel of a pass, SDP (FSDP2) "
        f"{cluster.overheads.sdp_layer_s * 1e3:.2f} ms per layer and pass, DP (DDP) {cluster.overheads.dp_sync_s * 1e3:.2f}"
        " ms per step, beyond the collectives' link time",
    ]
    return Calibration(cluster=cluster, evidence=evidence, summary=summary)


def _links_evidence(idle_links, loaded_links, overhead, alpha: float, step_extra: float) -> tuple[dict, str]:
    """The file's [calibration.links] table and the summary's links line."""
    evidence = {"idle": _link_table(idle_links), "loaded": _link_table(loaded_links),
                "overhead_plan_step_s": overhead.step_s, "doubled_plan_step_s": overhead.doubled_step_s,
                "doubling_added_s": overhead.added_s, "doubling_added_each_s": list(overhead.added_each_s),
                "effective_latency_s": alpha, "step_s_beyond_the_timeline": step_extra,
                "chosen": "the loaded bandwidth; the latency at which the simulator reproduces what twice the "
                          "micro-batches added to the overhead plan's measured step (the loaded ping-pong's unless "
                          "the addition beyond it exceeds the spread of the pairs), the rest of that step a cost "
                          "per step"}
    line = (f"links: idle alpha {idle_links.p2p.latency_s * 1e6:.0f} us, beta "
            f"{idle_links.p2p.bandwidth_bytes_per_s / 1e9:.2f} GB/s; loaded alpha {loaded_links.p2p.latency_s * 1e6:.0f} "
            f"us, beta {loaded_links.p2p.bandwidth_bytes_per_s / 1e9:.2f} GB/s; inside a running 1F1B pipeline a message "
            f"costs {alpha * 1e6:.0f} us (the loaded latency written for the link, the rest as 1F1B's exchange; fitted to "
            f"what twice the micro-batches added to the "
            f"overhead plan's measured step, {overhead.step_s * 1e3:.1f} -> {overhead.doubled_step_s * 1e3:.1f} ms, "
            f"+{overhead.added_s * 1e3:.1f} over pairs run back to back; {step_extra * 1e3:.2f} ms more per step)")
    return evidence, line


def _messages_and_step(cluster, overhead, gpt2, link, progress):
    """A message's cost and the step's, told apart by what twice the micro-batches added to the
    overhead plan's step (measure_overheads): (the cluster with both, the latency, the step's extra)."""
    from paraplan.hardware.cluster import NodeSpec

    progress("runtime: the latency of a message inside a running pipeline")
    alpha, step_extra = message_and_step_costs(overhead.plan, overhead.doubled, gpt2[0], gpt2[1], cluster,
                                               overhead.step_s, overhead.added_each_s, link.latency_s)
    # the link keeps the loaded ping-pong's latency; what a message cost beyond it inside the 1F1B
    # overhead plan is 1F1B's exchange (RuntimeOverheads.exchange_s: its sender waits for the send
    # with the next receive), which GPipe, posting its sends and waiting later, does not pay (written
    # as the link's latency until 2026-11-28, it priced make demo's 8-micro-batch GPipe split 68 ms
    # where it ran in 47-49)
    cluster = replace(cluster, nodes=tuple(NodeSpec(n.name, n.devices, link, link) for n in cluster.nodes),
                      overheads=replace(cluster.overheads, step_s=cluster.overheads.step_s + step_extra,
                                        exchange_s=max(0.0, alpha - link.latency_s)))
    return cluster, alpha, step_extra


def _own_optimizer_step_s(overhead_plan, spec, curve) -> float:
    """The overhead plan's own optimizer step, inside the time it measured outside its schedule:
    taken out of step_s, since it is charged per plan (RuntimeOverheads.optimizer_step_s)."""
    from paraplan.costs.memory import plan_memory
    from paraplan.costs.memory_config import MemoryConfig
    from paraplan.hardware.cluster import RuntimeOverheads

    _, breakdown = plan_memory(overhead_plan, spec, {0: 2**40, 1: 2**40}, MemoryConfig().for_device_kind("cpu-core"))
    return RuntimeOverheads(optimizer_curve=curve).optimizer_step_s(max(b.states_bytes for b in breakdown))


def _link_table(lp) -> dict:
    return {"latency_s": lp.p2p.latency_s, "bandwidth_bytes_per_s": lp.p2p.bandwidth_bytes_per_s,
            "r_squared": lp.p2p.r_squared, "sizes": list(lp.sizes), "p2p_median_s": list(lp.p2p_s)}


def _fit_table(fit) -> dict:
    return {"flops_per_s": fit.flops_per_s, "kernel_overhead_s": fit.kernel_overhead_s,
            "memory_bandwidth_bytes_per_s": fit.memory_bandwidth_bytes_per_s,
            "median_abs_layer_error": fit.median_abs_error,
            "step_errors": {m: {str(b): e for b, e in errs.items()} for m, errs in fit.step_errors.items()}}
