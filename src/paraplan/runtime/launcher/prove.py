"""`paraplan plan --prove`: run the chosen plan, the even split and one process for real on this
machine, interleaved, and set each measurement beside its prediction.

The three plans run for real as `paraplan train` runs them (runtime/launcher/launch.py's launch_checked: the
same checks, ranks and files; launched from this process, so that every run's ranks fork from one
warm forkserver rather than each run paying a fresh interpreter and server), in rounds
(chosen, even, one, chosen, even, one, ...) so that the drift of a shared machine (10-25% over
minutes here) hits all of them alike; each run's steps after the first two are its measurement,
and a plan's number is the median over rounds with the spread (min..max) beside it.
Also used by benchmarks/fidelity.py for any set of plans.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paraplan.errors import ParaplanError
from paraplan.plans.plan import LayerRange, Plan, Stage

WARMUP_STEPS = 2


@dataclass(frozen=True)
class Measured:
    name: str
    predicted_s: float
    rounds_s: tuple[float, ...]  # per round: the median step of that run

    @property
    def median_s(self) -> float:
        return statistics.median(self.rounds_s)

    @property
    def error(self) -> float:
        """(measured - predicted) / predicted (runtime/measure/compare.py: relative_error): positive when
        the run was slower than predicted."""
        from paraplan.runtime.measure.compare import relative_error

        return relative_error(self.predicted_s, self.median_s)

    @property
    def ratio(self) -> str:
        """'2.04x (+104%)': measured over predicted (runtime/measure/compare.py: ratio_text)."""
        from paraplan.runtime.measure.compare import ratio_text

        return ratio_text(self.predicted_s, self.median_s)


def one_process_plan(like: Plan) -> Plan:
    """The whole model on device 0, the whole batch in one micro-batch: what a user runs without
    any planner."""
    return Plan(model=like.model, cluster=like.cluster, n_layers=like.n_layers, global_batch=like.global_batch,
                n_micro=1, schedule="gpipe", grad_sync="none", stages=(Stage(LayerRange(0, like.n_layers), (0,)),))


def check_runs_here(n_devices: int, cluster_name: str) -> None:
    cores = os.cpu_count() or 1
    if n_devices > cores:
        raise ParaplanError(f"the proof runs the plans on this machine, one process per device: cluster "
                            f"{cluster_name} has {n_devices} devices, this machine {cores} cores")


def run_plan(path: Path, steps: int, out_dir: Path) -> float:
    """One real training run of the plan file, as `paraplan train --plan PATH --steps STEPS`; its
    median step after the warm-up steps."""
    from paraplan.plans.plan_file import read_plan
    from paraplan.runtime.config import TrainConfig
    from paraplan.runtime.launcher.launch import launch_checked
    from paraplan.runtime.measure.compare import step_times

    plan = read_plan(path)
    try:
        launch_checked(TrainConfig(plan=plan, model=plan.model, steps=steps, out_dir=str(out_dir)))
    except ParaplanError as exc:
        raise ParaplanError(f"the run of {path.name} failed: {exc}") from None
    times = step_times(out_dir)[WARMUP_STEPS:]
    if not times:
        raise ParaplanError(f"the run of {path.name} recorded no steps after the warm-up")
    return statistics.median(times)


def run_interleaved(plans: dict[str, tuple[Plan, float]], rounds: int, steps: int,
                    progress: Callable[[str], None] = lambda s: None) -> list[Measured]:
    """Each plan (name -> (plan, predicted seconds)) run `rounds` times, A B C A B C ..."""
    from paraplan.plans.plan_file import write_plan

    if steps <= WARMUP_STEPS:
        raise ParaplanError(f"need more than {WARMUP_STEPS} steps per run (the first are warm-up), got {steps}")
    if rounds < 1:
        raise ParaplanError(f"rounds must be positive, got {rounds}")
    times: dict[str, list[float]] = {name: [] for name in plans}
    with tempfile.TemporaryDirectory(prefix="paraplan-prove-") as tmp:
        paths = {}
        for i, (name, (plan, _)) in enumerate(plans.items()):
            paths[name] = Path(tmp) / f"plan{i}.json"
            write_plan(plan, paths[name])
        for r in range(rounds):
            for i, name in enumerate(plans):
                progress(f"round {r + 1} of {rounds}: {name}")
                times[name].append(run_plan(paths[name], steps, Path(tmp) / f"run{r}-{i}"))
    return [Measured(name, predicted, tuple(times[name])) for name, (_, predicted) in plans.items()]


def check_this_machine(cluster, cluster_name: str, flag: str = "--try-top") -> None:
    """The plans of `flag` run here, one process per device: a cluster of accelerators (a preset or a
    file describing other machines) is refused in one line."""
    from paraplan.costs.memory_config import is_cpu

    kinds = sorted({slot.spec.name for slot in cluster.devices if not is_cpu(slot.spec.name)})
    if kinds:
        raise ParaplanError(f"{flag} runs the plans on this machine; cluster {cluster_name} is not this machine "
                            f"(its devices: {', '.join(kinds)}); plan for 'local' or a calibrated file of it")
    check_runs_here(cluster.n_devices, cluster_name)


def measured_best(candidates: dict[str, tuple[Plan, float]], rounds: int, steps: int,
                  run: Callable = run_interleaved, progress: Callable[[str], None] = lambda s: None,
                  ) -> tuple[str, list[Measured]]:
    """`paraplan plan --try-top K` (the practice of NeMo's AutoConfigurator and DeepSpeed's
    autotuner: measure, then choose): the K best predicted plans (name -> (plan, predicted s)) run
    for real, interleaved in rounds (`run`: run_interleaved, or a stand-in with its own clock in
    tests), and the one of the least median step chosen, whatever the prediction said."""
    if len(candidates) < 1:
        raise ParaplanError("no plan to try")
    measured = run(candidates, rounds, steps, progress)
    best = min(measured, key=lambda m: (m.median_s, list(candidates).index(m.name)))
    return best.name, measured


def spearman(a, b) -> float:
    """Spearman's rank correlation (average ranks for ties), without scipy."""
    import numpy as np

    def ranks(x):
        x = np.asarray(x, float)
        order = x.argsort(kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their mean rank
            r[x == v] = r[x == v].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])
