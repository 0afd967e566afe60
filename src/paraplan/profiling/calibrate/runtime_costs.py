"""`paraplan calibrate`'s third measurement (profiling/calibrate/): the runtime's own overheads (per
pipeline action, per step; runtime/measure/compare.py) read off the timelines of several real
`paraplan train` runs of one plan and averaged, so one run's noise does not become the model; Adam's
step per byte of states; the latency of a message inside a running pipeline (`message_and_step_costs`);
and the TP (DTensor) and SDP (FSDP2) machinery's own cost per layer, from TP2 / SDP2 runs.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from paraplan.errors import ParaplanError
from paraplan.profiling.calibrate.compute import CoresLoaded

# the plan whose timeline gives the overheads: the shipped measurement's plan (gpt2-tiny, 2 stages
# of 3 layers, 1F1B, 4 micro-batches of 8)
OVERHEAD_PLAN = dict(model="gpt2-tiny", cuts=(3,), n_micro=4, batch=32)
# the most a message inside a running pipeline is allowed to cost (message_and_step_costs): twice the
# ~1 ms gloo loopback messages measured inside pipelines here (shared/notes/runtime-on-cpu.md: 1.5 ms)
CAP_LATENCY_S = 2e-3


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
    from paraplan.runtime.config import TrainConfig
    from paraplan.runtime.launcher.launch import launch_checked

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


# parameters the optimizer's step is timed at: from well inside a CPU's last-level cache to well
# beyond it (16 bytes of states per parameter: 4 MiB to 128 MiB)
OPTIMIZER_SIZES = (250_000, 500_000, 1_000_000, 2_000_000, 4_000_000, 8_000_000)


def measure_optimizer(cores: int, progress: Callable[[str], None]) -> dict:
    """Adam's step plus zeroing the gradients (what `paraplan train` does after the schedule), on
    one thread while the other cores are busy, at each size of OPTIMIZER_SIZES: the curve of
    seconds against bytes of model states (parameters, gradients and Adam's two moments: 16 bytes
    per fp32 parameter), RuntimeOverheads.optimizer_curve, and, for readers of the rate alone, the
    slope of its last segment (beyond the cache) per byte."""
    import torch

    progress("runtime: timing the optimizer step")
    torch.set_num_threads(1)
    medians = {}
    with CoresLoaded(cores - 1):
        for n in OPTIMIZER_SIZES:
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
    a, b = OPTIMIZER_SIZES[-2:]
    per_byte = max(0.0, (medians[b] - medians[a]) / ((b - a) * 16))
    # the measured times, made non-decreasing (a smaller step never takes longer: noise)
    curve, most = [], 0.0
    for n in OPTIMIZER_SIZES:
        most = max(most, medians[n])
        curve.append([float(n * 16), most])
    return {"per_byte_s": per_byte, "curve": curve, "median_s": {str(n): t for n, t in medians.items()}}


class OverheadRuns(NamedTuple):
    """The overhead plan's runs and its doubled plan's, interleaved (measure_overheads)."""
    overheads: list  # each run's RuntimeOverheads read off its timeline
    plan: object  # the overhead plan
    step_s: float  # its median step over the runs
    compute_s: float  # its ranks' measured compute, median over the runs
    doubled: object  # the plan with twice the micro-batches of the same size
    doubled_step_s: float  # its median step over the runs
    added_s: float  # what doubling added: the median over pairs run back to back
    added_each_s: tuple  # each pair's addition
    solo: object  # the overhead plan's model on one device, the whole batch at once
    solo_outside_s: float  # its step outside its schedule (measured_overheads' step_s)


def measure_overheads(runs: int, steps: int, progress: Callable[[str], None]) -> OverheadRuns:
    """`runs` real `paraplan train` runs of the overhead plan, each followed at once by a run of
    the same plan with twice the micro-batches of the same size; each run's overheads read off its
    timeline (steps after the first two). Set beside the plan's own step, the doubled plan's tells a
    cost per message from a cost per step (message_and_step_costs). The pairs are interleaved and
    the addition is the median of each pair's own difference: run as two blocks, the machine's drift
    between the blocks (a few ms a step here) went whole into the difference and one calibration
    put 454 us on a message where a ping-pong takes 50. Last, one run of the same model on one
    device: a one-process step's cost outside its schedule, which has no rank to wait for
    (RuntimeOverheads.solo_step_s)."""
    from dataclasses import replace as dc_replace

    from paraplan.plans.plan import LayerRange, Plan, Stage
    from paraplan.runtime.measure.compare import measured_compute_s, measured_overheads, step_times

    cfg = OVERHEAD_PLAN
    bounds = [0, *cfg["cuts"], 6]
    plan = Plan(model=cfg["model"], cluster="local", n_layers=6, global_batch=cfg["batch"], n_micro=cfg["n_micro"],
                schedule="1f1b", grad_sync="none",
                stages=tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:],
                                                                                          strict=True))))
    doubled = dc_replace(plan, global_batch=2 * plan.global_batch, n_micro=2 * plan.n_micro)
    measured, step_medians, doubled_medians, computes = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="paraplan-calibrate-") as tmp:
        for r in range(runs):
            progress(f"runtime: overhead run {r + 1} of {runs} ({steps} steps of a 2-stage 1F1B plan)")
            out = _train(plan, steps, Path(tmp), f"run{r}")
            measured.append(measured_overheads(out))
            step_medians.append(statistics.median(step_times(out)[2:]))
            computes.append(measured_compute_s(out))
            shutil.rmtree(out, ignore_errors=True)
            progress(f"runtime: overhead run {r + 1} of {runs} with {doubled.n_micro} micro-batches")
            out = _train(doubled, steps, Path(tmp), f"double{r}")
            doubled_medians.append(statistics.median(step_times(out)[2:]))
            shutil.rmtree(out, ignore_errors=True)
        # the whole model on device 0, the whole batch at once (what `--prove` runs as one process)
        solo = dc_replace(plan, n_micro=1, schedule="gpipe", stages=(Stage(LayerRange(0, plan.n_layers), (0,)),))
        progress(f"runtime: the same model on one process ({steps} steps)")
        solo_outside = measured_overheads(_train(solo, steps, Path(tmp), "solo")).step_s
    added_each = tuple(d - m for d, m in zip(doubled_medians, step_medians, strict=True))
    return OverheadRuns(measured, plan, statistics.median(step_medians), statistics.median(computes), doubled,
                        statistics.median(doubled_medians), statistics.median(added_each), added_each, solo, solo_outside)


def message_and_step_costs(plan, doubled, spec, profile, cluster, measured_s: float, added_each_s,
                           floor_s: float) -> tuple[float, float]:
    """(the latency of a message inside a running pipeline, the step's cost beyond step_s): the
    latency at which the simulator reproduces what doubling the micro-batches added to the step
    (twice the messages, the same step; `profile`: the layers' measured times, None for the
    analytic costs; `added_each_s`: each back-to-back pair's addition, their
    median the target), by bisection (the added time grows with the latency); the rest of the
    plan's measured step not explained at that latency is a cost per step. One plan alone put all
    of it on the messages (0.77-1.06 ms each, where a ping-pong takes 0.05), which over-priced a
    pipeline with more micro-batches than the overhead plan's by up to 25% here.

    The latency rises above `floor_s` (the loaded ping-pong's) only when the addition beyond what
    the floor explains exceeds the pairs' own spread: here eight more messages at 1 ms each add
    ~4 ms to a ~24 ms addition, while pairs moved by 3-6 ms, so an unchecked fit put 380-450 us on
    a message in two calibrations of five and the floor in the rest. And it rises no higher than
    the plan's own measured step allows: the messages of the plan as it ran cannot take more than
    its whole step (its per-step cost stays at least 0)."""
    from dataclasses import replace as dc_replace

    from paraplan.costs.model import analytic_cost_model, profile_cost_model
    from paraplan.hardware.cluster import LinkSpec, NodeSpec
    from paraplan.simulator.predict import simulate_plan

    def predicted(p, alpha: float) -> float:
        link = LinkSpec(cluster.nodes[0].intra_link.bandwidth_bytes_per_s, alpha)
        c = dc_replace(cluster, nodes=tuple(NodeSpec(n.name, n.devices, link, link) for n in cluster.nodes))
        cm = profile_cost_model(spec, c, profile) if profile is not None else analytic_cost_model(spec, c)
        return simulate_plan(p, cm).prediction.iteration_s

    def added(alpha: float) -> float:
        return predicted(doubled, alpha) - predicted(plan, alpha)

    target = statistics.median(added_each_s)
    spread = max(added_each_s) - min(added_each_s)
    lo, hi = floor_s, max(floor_s, CAP_LATENCY_S)
    if added(lo) + spread >= target:
        alpha = lo
    elif added(hi) < target:
        alpha = hi
    else:
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if added(mid) < target else (lo, mid)
        alpha = (lo + hi) / 2
    if alpha > floor_s and predicted(plan, alpha) > measured_s:
        # the messages cannot cost more than the plan's own measured step leaves them: a latency at which
        # the undoubled plan is predicted slower than it ran explains the doubling's excess by something
        # else (a calibration at 1,217 us a message, its per-step cost clamped to 0, priced a 2-stage
        # pipeline 19% slow in make demo's proof; recalibrated at the ping-pong's 54 us, -8%)
        lo, hi = floor_s, alpha
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if predicted(plan, mid) <= measured_s else (lo, mid)
        alpha = lo
    return alpha, max(0.0, measured_s - predicted(plan, alpha))


def in_run_compute_scale(plan, spec, profile, cluster, measured_compute: float) -> float:
    """The overhead plan's compute as measured inside its runs (every rank's forwards and
    backwards) over the same compute profiled with one process alone (`profile`): how much slower a
    layer runs while the other cores run the other ranks, gloo's threads included. A busy loop on
    the other cores (measure_compute's CoresLoaded) understated it: 1.02-1.04x against 1.06-1.09x
    in the 2-stage runs here."""
    from dataclasses import replace as dc_replace

    from paraplan.costs.model import profile_cost_model
    from paraplan.simulator.predict import simulate_plan

    alone = dc_replace(cluster, overheads=dc_replace(cluster.overheads, compute_scale=1.0))
    profiled = float(simulate_plan(plan, profile_cost_model(spec, alone, profile)).timeline.compute_busy().sum())
    return measured_compute / profiled if profiled > 0 else 1.0


def measure_strategy_costs(spec, profile, cluster, runs: int, steps: int, progress: Callable[[str], None]) -> dict:
    """The TP (DTensor) and SDP (FSDP2) machinery's own cost per layer and pass, and DDP's per
    step: gpt2-tiny as one stage of TP2 (of SDP2, of DP2 with DDP's buckets) on every layer, run
    for real; the part of the measured step the simulator (with everything else calibrated) does
    not explain, spread over layers x 2 passes (TP, SDP) or charged once per step (DP: DDP's hooks,
    bucket copies and an all-reduce that waits for the slower replica; one run cannot tell a
    per-byte part from a fixed one, so it is one figure per step)."""
    from dataclasses import replace as dc_replace

    from paraplan.costs.model import profile_cost_model
    from paraplan.plans.axes import DATA, SHARDED_DATA, TENSOR
    from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
    from paraplan.runtime.measure.compare import step_times
    from paraplan.simulator.predict import simulate_plan

    n = spec.n_layers
    out = {}
    for axis, strategy in ((TENSOR, LayerStrategy(tp=2)), (SHARDED_DATA, LayerStrategy(sdp=2)),
                           (DATA, LayerStrategy(dp=2))):
        kind = axis.name  # the evidence's key, as the calibration file has it
        plan = Plan(model=spec.ref or spec.name, cluster="local", n_layers=n, global_batch=OVERHEAD_PLAN["batch"],
                    n_micro=1, schedule="gpipe", grad_sync="bucketed" if axis is DATA else "none",
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
        per = (sum(max(1, lay.forward_ops) + max(1, lay.backward_ops) for lay in spec.layers) if axis is TENSOR
               else 2 * n if axis is SHARDED_DATA else 1)
        out[kind] = {"measured_s": measured, "predicted_without_s": predicted, "per_unit_s": excess / per,
                     "unit": {TENSOR: "kernel of a pass", SHARDED_DATA: "layer pass", DATA: "step"}[axis]}
    cluster = dc_replace(cluster, overheads=dc_replace(cluster.overheads, tp_kernel_s=out[TENSOR.name]["per_unit_s"],
                                                      sdp_layer_s=out[SHARDED_DATA.name]["per_unit_s"],
                                                      dp_sync_s=out[DATA.name]["per_unit_s"]))
    return {"cluster": cluster, "evidence": out}
