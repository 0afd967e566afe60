"""`paraplan calibrate`: measure this machine once and describe it as a cluster file that `plan`,
`simulate` and `train --compare` use.

Three measurements, each the way training meets it (a training run keeps every core busy):
  1. compute: reference models profiled layer by layer (profiling/profiler.py) on one core while
     every other core runs training steps of the same model ("loaded"), and once with the other
     cores idle; the analytic device model is fitted to the loaded times
     (costs/calibration_fit.py), so a model never profiled is priced at this machine's rate;
  2. links: gloo ping-pong between two processes, fitted to alpha + bytes / beta
     (profiling/links.py), idle and while every core also runs a busy process ("loaded": a
     transfer in a pipeline waits for a core that is computing);
  3. the runtime's own overheads (per pipeline action, per step; runtime/measure/compare.py) read off the
     timelines of several real `paraplan train` runs of one plan and averaged, so one run's noise
     does not become the model.
Everything measured is kept in the file's [calibration] table, beside the figures it chose.
"""

from __future__ import annotations

import multiprocessing
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from paraplan.errors import ParaplanError

REFERENCE_MODELS = ("gpt2-tiny", "vgg-tiny", "bert-tiny")  # attention + MLP, convolutions, another transformer
QUICK_MODELS = ("gpt2-tiny", "llama-tiny")  # two attention styles (explicit with dropout; fused SDPA with RMSNorm, rotary, SwiGLU)
BATCH_SIZES = (4, 16, 32)
LINK_MAX_BYTES = 16 * 2**20  # the tiny models' activations are KiBs to MiBs
# the plan whose timeline gives the overheads: the shipped measurement's plan (gpt2-tiny, 2 stages
# of 3 layers, 1F1B, 4 micro-batches of 8)
OVERHEAD_PLAN = dict(model="gpt2-tiny", cuts=(3,), n_micro=4, batch=32)
# the most a message inside a running pipeline is allowed to cost (effective_latency): twice the
# ~1 ms gloo loopback messages measured inside pipelines here (shared/notes/runtime-on-cpu.md: 1.5 ms)
CAP_LATENCY_S = 2e-3


@dataclass(frozen=True)
class Calibration:
    cluster: object  # hardware.Cluster, the calibrated one
    evidence: dict  # what goes into the file's [calibration] table
    summary: list[str]  # lines for the terminal


def _busy_model(model: str, ready, stop, go) -> None:
    """A loaded core: training steps of `model` on one thread while `go` is set, until `stop`."""
    import torch

    from paraplan.models import source

    torch.set_num_threads(1)
    built = source.build(model, device="cpu", seed=1)
    built.module.train()
    layers = [m for _, _, m in built.layers()]
    x, y = built.batch(16, seed=1)
    ready.set()
    while not stop.is_set():
        if not go.wait(0.05):
            continue
        h = x
        for layer in layers:
            h = layer(h)
        built.loss(h, y).backward()


def _busy_matmul(ready, stop, go) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    ready.set()
    while not stop.is_set():
        if go.wait(0.05):
            a = torch.tanh(a @ a)


class CoresLoaded:
    """`n` busy processes for the duration of a `with` block (from the warm forkserver, or spawned
    with PARAPLAN_START_METHOD=spawn: either way no inherited threads);
    `pause()` / `resume()` idle them without the cost of starting them again."""

    def __init__(self, n: int, model: str | None = None):
        self.n, self.model = n, model

    def __enter__(self):
        from paraplan.system.processes import start_method

        ctx = multiprocessing.get_context(start_method())
        self.stop, self.go = ctx.Event(), ctx.Event()
        self.go.set()
        self.procs = []
        for _ in range(self.n):
            ready = ctx.Event()
            args = (self.model, ready, self.stop, self.go) if self.model else (ready, self.stop, self.go)
            p = ctx.Process(target=_busy_model if self.model else _busy_matmul, args=args, daemon=True)
            p.start()
            if not ready.wait(120):
                raise ParaplanError("calibrate: a load process did not start")
            self.procs.append(p)
        time.sleep(0.5)  # let the loads reach their steady state
        return self

    def pause(self):
        self.go.clear()
        time.sleep(0.2)

    def resume(self):
        self.go.set()
        time.sleep(0.2)

    def __exit__(self, *exc):
        self.stop.set()
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        return False


def measure_compute(models, cores: int, repeats: int, progress: Callable[[str], None]):
    """Per reference model: (ModelSpec, idle Profile, loaded Profile)."""
    import torch

    from paraplan.models import measure, source
    from paraplan.profiling.profiler import run_profile, workload

    out = []
    for model in models:
        work = workload(model, torch.device("cpu"))
        spec = measure.measure(source.build(model, device="meta"))
        progress(f"compute: profiling {model} with the other cores idle")
        idle = run_profile(work, torch.device("cpu"), list(BATCH_SIZES), 1, 3, repeats, step_check=False,
                           repeat_check=False)
        progress(f"compute: profiling {model} while {cores - 1} other core(s) train it too")
        with CoresLoaded(cores - 1, model) as load:
            loaded = run_profile(work, torch.device("cpu"), list(BATCH_SIZES), 1, 3, repeats, step_check=False,
                                 repeat_check=False)
            progress(f"compute: {model}'s training step with the other cores idle and busy, interleaved")
            ratio = _contention(work, load)
        out.append((spec, idle, loaded, ratio))
    return out


def _contention(work, load, blocks: int = 4, steps: int = 5) -> float:
    """A whole training step's time with the other cores busy over with them idle, in alternating
    blocks (idle, busy, idle, busy, ...) so that the machine's drift hits both alike."""
    import torch

    layers = [m for _, _, m in work.layers]
    x, y = work.make_batch(BATCH_SIZES[-1])

    def step() -> float:
        t0 = time.perf_counter()
        h = x
        for layer in layers:
            h = layer(h)
        work.loss(h, y).backward()
        return time.perf_counter() - t0

    torch.set_num_threads(1)
    idle, busy = [], []
    for _ in range(blocks):
        load.pause()
        step()
        idle += [step() for _ in range(steps)]
        load.resume()
        step()
        busy += [step() for _ in range(steps)]
    return statistics.median(busy) / statistics.median(idle)


def measure_links(nproc: int, progress: Callable[[str], None]):
    from paraplan.profiling.links import profile_links

    progress(f"links: gloo ping-pong between {nproc} processes, idle")
    idle = profile_links("gloo", nproc, LINK_MAX_BYTES)
    progress("links: the same while every core also computes")
    with CoresLoaded(nproc):
        loaded = profile_links("gloo", nproc, LINK_MAX_BYTES)
    return idle, loaded


def _notice(line: str) -> None:
    """A line that stays on the console (stderr), above the progress spinner."""
    print(line, file=sys.stderr, flush=True)


def _run_train(plan_path: Path, steps: int, out: Path) -> subprocess.CompletedProcess:
    """One real training run of the plan, launched from this process as `paraplan train` launches
    it (the same checks before launch, the same ranks, the same files; runtime/launcher/launch.py), and
    returned as the status and error line a `paraplan train` process would give. Not a process of
    its own: the calibration's runs then start their ranks from one warm forkserver instead of each
    paying a fresh interpreter and a fresh server (~10 s of a core per run here)."""
    from paraplan.plans.plan_file import read_plan
    from paraplan.runtime.launcher.launch import launch_checked
    from paraplan.runtime.rank.rank_base import TrainConfig

    argv = ["paraplan", "train", "--plan", str(plan_path), "--steps", str(steps), "--out-dir", str(out)]
    try:
        plan = read_plan(plan_path)
        launch_checked(TrainConfig(plan=plan, model=plan.model, steps=steps, out_dir=str(out)))
    except ParaplanError as exc:
        return subprocess.CompletedProcess(argv, 2, "", f"paraplan: {exc}\n")
    return subprocess.CompletedProcess(argv, 0, "", "")


def _finished_steps(out: Path, steps: int, ranks: int) -> bool:
    """Whether a run wrote everything a finished run writes: every step's loss and every rank's step
    times and timeline (each written whole, by an atomic rename)."""
    import json

    try:
        if len(json.loads((out / "losses.json").read_text())) != steps:
            return False
        for r in range(ranks):
            if len(json.loads((out / f"steps_rank{r}.json").read_text())) != steps:
                return False
            json.loads((out / f"timeline_rank{r}.json").read_text())
    except (OSError, ValueError, TypeError):
        return False
    return True


def _train(plan, steps: int, tmp: Path, name: str, notice: Callable[[str], None] = _notice) -> Path:
    """One real `paraplan train` run of `plan`; its output directory. A run that died after
    finishing its steps (a rank that aborted at exit, e.g. code -6 while gloo tears down) is run once
    more rather than ending the calibration, and the console says so."""
    import re

    from paraplan.plans.plan_file import write_plan

    write_plan(plan, tmp / f"{name}.json")
    out = tmp / name

    def attempt() -> tuple[int, str]:
        shutil.rmtree(out, ignore_errors=True)  # a retry starts from an empty directory
        res = _run_train(tmp / f"{name}.json", steps, out)
        return res.returncode, (res.stderr.strip().splitlines() or ["(no output)"])[-1]

    code, last = attempt()
    if code != 0 and _finished_steps(out, steps, len(plan.devices)):
        died = re.search(r"exited with code (-?\d+)", last)
        notice(f"run {name} died at exit (code {died.group(1) if died else code}) after finishing its steps; "
               "retrying once")
        code, last = attempt()
    if code != 0:
        raise ParaplanError(f"calibrate: the run of {name} failed: {last}")
    return out


def measure_optimizer(cores: int, progress: Callable[[str], None]) -> dict:
    """Adam's step plus zeroing the gradients (what `paraplan train` does after the schedule), on
    one thread while the other cores are busy: seconds per byte of model states (parameters,
    gradients and Adam's two moments: 16 bytes per fp32 parameter), the slope between 1M and 4M
    parameters (the intercept, per-call overhead, is in step_s)."""
    import torch

    progress("runtime: timing the optimizer step")
    torch.set_num_threads(1)
    medians = {}
    with CoresLoaded(cores - 1):
        for n in (1_000_000, 4_000_000):
            params = [torch.nn.Parameter(torch.randn(n // 4)) for _ in range(4)]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = torch.optim.Adam(params, lr=1e-3)
            times = []
            for r in range(12):
                t0 = time.perf_counter()
                opt.step()
                opt.zero_grad(set_to_none=False)
                if r >= 2:
                    times.append(time.perf_counter() - t0)
            medians[n] = statistics.median(times)
    per_byte = max(0.0, (medians[4_000_000] - medians[1_000_000]) / (3_000_000 * 16))
    return {"per_byte_s": per_byte, "median_s": {str(n): t for n, t in medians.items()}}


def measure_overheads(runs: int, steps: int, progress: Callable[[str], None]):
    """`runs` real `paraplan train` runs of the overhead plan; each run's overheads read off its
    timeline (steps after the first two)."""
    from paraplan.plans.plan import LayerRange, Plan, Stage
    from paraplan.runtime.measure.compare import measured_overheads

    cfg = OVERHEAD_PLAN
    bounds = [0, *cfg["cuts"], 6]
    plan = Plan(model=cfg["model"], cluster="local", n_layers=6, global_batch=cfg["batch"], n_micro=cfg["n_micro"],
                schedule="1f1b", grad_sync="none",
                stages=tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:],
                                                                                          strict=True))))
    from paraplan.runtime.measure.compare import step_times

    measured, step_medians = [], []
    with tempfile.TemporaryDirectory(prefix="paraplan-calibrate-") as tmp:
        for r in range(runs):
            progress(f"runtime: overhead run {r + 1} of {runs} ({steps} steps of a 2-stage 1F1B plan)")
            out = _train(plan, steps, Path(tmp), f"run{r}")
            measured.append(measured_overheads(out))
            step_medians.append(statistics.median(step_times(out)[2:]))
            shutil.rmtree(out, ignore_errors=True)
    return measured, plan, statistics.median(step_medians)


def effective_latency(plan, spec, profile, cluster, measured_s: float, floor_s: float) -> float:
    """The link latency at which the simulator reproduces the overhead plan's measured step, with
    everything else calibrated: a gloo message inside a running pipeline costs more than an idle
    or loaded ping-pong shows (the receiving core is busy, torch's pipelining posts and waits per
    micro-batch), and the pipeline's per-micro-batch transfers carry that cost. Never below the
    ping-pong's `floor_s`, never above `CAP_LATENCY_S`: the fit puts every millisecond the
    simulator does not explain on the messages, so a machine that slowed down between the compute
    measurement and the runs (this shared VM drifts by a third within minutes) would otherwise
    turn into a latency of several ms (seen once: 5.7 ms). Bisection (the simulated step grows
    with the latency)."""
    from dataclasses import replace as dc_replace

    from paraplan.costs.model import profile_cost_model
    from paraplan.hardware.cluster import LinkSpec, NodeSpec
    from paraplan.simulator.predict import simulate_plan

    def predicted(alpha: float) -> float:
        link = LinkSpec(cluster.nodes[0].intra_link.bandwidth_bytes_per_s, alpha)
        c = dc_replace(cluster, nodes=tuple(NodeSpec(n.name, n.devices, link, link) for n in cluster.nodes))
        return simulate_plan(plan, profile_cost_model(spec, c, profile)).prediction.iteration_s

    lo, hi = floor_s, max(floor_s, CAP_LATENCY_S)
    if predicted(lo) >= measured_s:
        return lo
    if predicted(hi) < measured_s:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(mid) < measured_s else (lo, mid)
    return (lo + hi) / 2


def measure_strategy_costs(spec, profile, cluster, runs: int, steps: int, progress: Callable[[str], None]) -> dict:
    """The TP (DTensor) and SDP (FSDP2) machinery's own cost per layer and pass: gpt2-tiny as one
    stage of TP2 (and of SDP2) on every layer, run for real; the part of the measured step the
    simulator (with everything else calibrated) does not explain, spread over layers x 2 passes."""
    from dataclasses import replace as dc_replace

    from paraplan.costs.model import profile_cost_model
    from paraplan.plans.axes import SHARDED_DATA, TENSOR
    from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
    from paraplan.runtime.measure.compare import step_times
    from paraplan.simulator.predict import simulate_plan

    n = spec.n_layers
    out = {}
    for axis, strategy in ((TENSOR, LayerStrategy(tp=2)), (SHARDED_DATA, LayerStrategy(sdp=2))):
        kind = axis.name  # the evidence's key, as the calibration file has it
        plan = Plan(model=spec.ref or spec.name, cluster="local", n_layers=n, global_batch=OVERHEAD_PLAN["batch"],
                    n_micro=1, schedule="gpipe", grad_sync="none",
                    stages=(Stage(LayerRange(0, n), (0, 1), strategies=(strategy,) * n),))
        predicted = simulate_plan(plan, profile_cost_model(spec, cluster, profile)).prediction.iteration_s
        measured = []
        with tempfile.TemporaryDirectory(prefix="paraplan-calibrate-") as tmp:
            for r in range(runs):
                progress(f"runtime: {axis.label}2 run {r + 1} of {runs} (the cost of its machinery per layer)")
                times = step_times(_train(plan, steps, Path(tmp), f"{kind}{r}"))[2:]
                measured.append(statistics.median(times))
        excess = max(0.0, statistics.median(measured) - predicted)
        # TP: DTensor's cost follows the operators it dispatches (per kernel of both passes);
        # SDP: FSDP2's follows its units (one per layer and pass)
        per = sum(max(1, lay.forward_ops) + max(1, lay.backward_ops) for lay in spec.layers) if axis is TENSOR else 2 * n
        out[kind] = {"measured_s": measured, "predicted_without_s": predicted, "per_unit_s": excess / per,
                     "unit": "kernel of a pass" if axis is TENSOR else "layer pass"}
    cluster = dc_replace(cluster, overheads=dc_replace(cluster.overheads, tp_kernel_s=out[TENSOR.name]["per_unit_s"],
                                                      sdp_layer_s=out[SHARDED_DATA.name]["per_unit_s"]))
    return {"cluster": cluster, "evidence": out}


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
    runs, overhead_plan, overhead_step_s = measure_overheads(2 if quick else 4, 10 if quick else 14, progress)
    optimizer = measure_optimizer(cores, progress)
    compute_scale = statistics.median(slowdown.values())
    # the time outside the schedule includes the overhead plan's own optimizer step: take it out,
    # it is charged per plan (RuntimeOverheads.optimizer_s_per_byte)
    from paraplan.costs.memory import plan_memory
    from paraplan.costs.memory_config import MemoryConfig

    gpt2_spec = next(spec for spec, _, _, _ in compute if spec.name == "gpt2-tiny")
    _, breakdown = plan_memory(overhead_plan, gpt2_spec, {0: 2**40, 1: 2**40}, MemoryConfig().for_device_kind("cpu-core"))
    own_step = optimizer["per_byte_s"] * max(b.states_bytes for b in breakdown)
    overheads = RuntimeOverheads(
        rendezvous=True, action_s=statistics.median(o.action_s for o in runs),
        step_s=max(0.0, statistics.median(o.step_s for o in runs) - own_step), compute_scale=compute_scale,
        optimizer_s_per_byte=optimizer["per_byte_s"],
        source=f"paraplan calibrate: median of {len(runs)} runs of a 2-stage 1F1B gpt2-tiny plan on this machine; "
               f"compute scale loaded / idle over {', '.join(models)}; TP / SDP per layer from TP2 / SDP2 runs")

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
    gpt2 = next((spec, idle) for spec, idle, _, _ in compute if spec.name == "gpt2-tiny")
    progress("runtime: the latency of a message inside a running pipeline")
    alpha = effective_latency(overhead_plan, gpt2[0], gpt2[1], cluster, overhead_step_s, link.latency_s)
    link = LinkSpec(bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=alpha)
    cluster = replace(cluster, nodes=tuple(NodeSpec(n.name, n.devices, link, link) for n in cluster.nodes))
    strategies = measure_strategy_costs(gpt2[0], gpt2[1], cluster, 1 if quick else 2, 8 if quick else 10, progress)
    cluster = strategies["cluster"]

    def link_table(lp):
        return {"latency_s": lp.p2p.latency_s, "bandwidth_bytes_per_s": lp.p2p.bandwidth_bytes_per_s,
                "r_squared": lp.p2p.r_squared, "sizes": list(lp.sizes), "p2p_median_s": list(lp.p2p_s)}

    evidence = {
        "compute": {"models": list(models), "batch_sizes": list(BATCH_SIZES), "repeats": repeats,
                    f"step_busy_over_idle_at_batch_{largest}": slowdown,
                    "fit_loaded": _fit_table(fit), "fit_idle": _fit_table(fit_idle)},
        "links": {"idle": link_table(idle_links), "loaded": link_table(loaded_links),
                  "overhead_plan_step_s": overhead_step_s, "effective_latency_s": alpha,
                  "chosen": "the loaded bandwidth; the latency at which the simulator reproduces the overhead plan's "
                            "measured step (never below the loaded ping-pong's)"},
        "runtime": {"runs": [{"action_s": o.action_s, "step_s": o.step_s} for o in runs],
                    "optimizer": optimizer, "overhead_plan_own_optimizer_s": own_step,
                    "strategies": strategies["evidence"]},
    }
    summary = [
        f"compute: effective {fit.flops_per_s / 1e9:.1f} GFLOP/s per core, {fit.kernel_overhead_s * 1e6:.1f} us per "
        f"kernel, {fit.memory_bandwidth_bytes_per_s / 1e9:.2f} GB/s (fitted to {fit.samples} layer passes of "
        f"{', '.join(models)} with every core loaded; median layer error {fit.median_abs_error:.0%})",
        f"compute: a training step with the other cores busy / idle, at batch {largest}: "
        + ", ".join(f"{m} {r:.2f}x" for m, r in slowdown.items()),
        f"links: idle alpha {idle_links.p2p.latency_s * 1e6:.0f} us, beta {idle_links.p2p.bandwidth_bytes_per_s / 1e9:.2f}"
        f" GB/s; loaded alpha {loaded_links.p2p.latency_s * 1e6:.0f} us, beta "
        f"{loaded_links.p2p.bandwidth_bytes_per_s / 1e9:.2f} GB/s; inside a running pipeline a message costs "
        f"{alpha * 1e6:.0f} us (the latency written, fitted to the overhead plan's measured {overhead_step_s * 1e3:.1f} "
        f"ms step)",
        f"runtime: {overheads.action_s * 1e3:.2f} ms per pipeline action, {overheads.step_s * 1e3:.2f} ms per step "
        f"(median of {len(runs)} runs: " + ", ".join(f"{o.action_s * 1e3:.2f}/{o.step_s * 1e3:.2f}" for o in runs)
        + f" ms, less {own_step * 1e3:.2f} ms of its own optimizer step); compute x{compute_scale:.2f} while every "
        f"core computes; the optimizer {optimizer['per_byte_s'] * 16e9:.2f} ns per parameter (Adam)",
        f"runtime: TP (DTensor) {cluster.overheads.tp_kernel_s * 1e6:.0f} us per kernel of a pass, SDP (FSDP2) "
        f"{cluster.overheads.sdp_layer_s * 1e3:.2f} ms per layer and pass, beyond the collectives' link time",
    ]
    return Calibration(cluster=cluster, evidence=evidence, summary=summary)


def _fit_table(fit) -> dict:
    return {"flops_per_s": fit.flops_per_s, "kernel_overhead_s": fit.kernel_overhead_s,
            "memory_bandwidth_bytes_per_s": fit.memory_bandwidth_bytes_per_s,
            "median_abs_layer_error": fit.median_abs_error,
            "step_errors": {m: {str(b): e for b, e in errs.items()} for m, errs in fit.step_errors.items()}}
