"""Measured against predicted for one `paraplan train` run: numbers, traces and the figure."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from paraplan.costs.model import CostModel, RuntimeOverheads
from paraplan.errors import ParaplanError
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import Plan
from paraplan.runtime.measure.timeline import load_runs, measured_trace, one_step, side_by_side
from paraplan.simulator.export import chrome_trace
from paraplan.simulator.predict import simulate_plan


@dataclass(frozen=True)
class Comparison:
    predicted_s: float
    measured_median_s: float
    measured_q1_s: float
    measured_q3_s: float
    steps: int

    @property
    def error(self) -> float:
        """(measured - predicted) / predicted: +1.04 when the measured step took 2.04x the prediction."""
        return relative_error(self.predicted_s, self.measured_median_s)


def relative_error(predicted_s: float, measured_s: float) -> float:
    """The one direction every error of a prediction is stated in: (measured - predicted) /
    predicted, positive when the run was slower than predicted."""
    return measured_s / predicted_s - 1 if predicted_s > 0 else float("inf")


def _percent(error: float) -> str:
    text = f"{error:+.0%}"
    return text if any(c in "123456789" for c in text) else "+0%"  # never "-0%"


def ratio_text(predicted_s: float, measured_s: float) -> str:
    """'2.04x (+104%)': measured over predicted, for a column headed "measured / predicted"."""
    if not predicted_s > 0:
        return "—"
    return f"{measured_s / predicted_s:.2f}x ({_percent(relative_error(predicted_s, measured_s))})"


def against_prediction(predicted_s: float, measured_s: float) -> str:
    """'measured 2.04x the prediction (+104%)': the words every comparison of a measured time with
    its prediction uses (train --compare, its drift warning, the figure's title)."""
    if not predicted_s > 0:
        return "measured with no prediction to compare"
    return (f"measured {measured_s / predicted_s:.2f}x the prediction "
            f"({_percent(relative_error(predicted_s, measured_s))})")


def step_times(out_dir: str | Path) -> list[float]:
    """Each step's time: the slowest rank's (a step ends when every rank has ended it)."""
    ranks = [json.loads(f.read_text()) for f in sorted(Path(out_dir).glob("steps_rank*.json"))]
    if not ranks:
        return []
    return [max(r[i] for r in ranks) for i in range(min(len(r) for r in ranks))]


def compare_run(plan: Plan, cm: CostModel, out_dir: str | Path) -> Comparison:
    """Simulate the plan, compare with the measured steps after the first (warm-up), and write
    measured.trace.json, simulated.trace.json and compare.png into out_dir."""
    per_step = step_times(out_dir)
    measured = per_step[1:] if len(per_step) > 1 else per_step
    if not measured:
        raise ParaplanError("the comparison needs at least one measured step")
    sim = simulate_plan(plan, cm)
    median = statistics.median(measured)
    q = statistics.quantiles(measured, n=4) if len(measured) >= 4 else [min(measured), median, max(measured)]
    result = Comparison(predicted_s=sim.prediction.iteration_s, measured_median_s=median, measured_q1_s=q[0],
                        measured_q3_s=q[-1], steps=len(measured))
    runs = load_runs(out_dir)
    out = Path(out_dir)
    chrome_trace(sim.timeline, out / "simulated.trace.json")
    if not runs:  # an operator placement's ranks record no timeline (runtime/dag/dag_runtime.py): numbers only
        return result
    measured_trace(runs, out / "measured.trace.json")
    # draw the step the numbers are about: the measured step nearest the median (per_step[i] is the
    # i-th step of this run; the events carry absolute step numbers, which a resumed run offsets)
    steps = sorted({e["step"] for ev in runs.values() for e in ev})
    first = 1 if len(per_step) > 1 else 0
    drawn = min(range(first, min(len(per_step), len(steps))), key=lambda i: (abs(per_step[i] - median), i))
    if per_step[drawn] == median:
        label = f"measured: step {steps[drawn]}, {median * 1e3:.1f} ms, the median of {len(measured)} steps"
    else:
        label = (f"measured: step {steps[drawn]}, {per_step[drawn] * 1e3:.1f} ms, nearest the median "
                 f"({median * 1e3:.1f} ms) of {len(measured)} steps")
    replicas = len(plan.stages[0].devices)
    if plan.kind is PlanKind.LAYERS:  # Galvatron: each stage's group shares every micro-batch
        shape = (f"{_count(plan.n_stages, 'stage')} x {replicas} devices with per-layer strategies, "
                 f"{_count(plan.n_micro, 'micro-batch', 'micro-batches')} of {plan.micro_batch_size:g}")
    else:
        shape = (f"{_count(plan.n_stages, 'stage')} x {_count(replicas, 'replica')}, "
                 f"{_count(plan.n_micro, 'micro-batch', 'micro-batches')} of {plan.micro_batch_size / replicas:g}")
    side_by_side(one_step(runs, steps[drawn]), sim.timeline, out / "compare.png",
                 title=f"{plan.model}: {plan.schedule}, {shape}; "
                       f"{against_prediction(result.predicted_s, result.measured_median_s)}",
                 measured_s=per_step[drawn], measured_label=label, predicted_s=result.predicted_s)
    return result


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


OVERHEADS_VERSION = 1
DEFAULT_OVERHEADS = Path(__file__).parents[1] / "overheads-local.json"  # package data: measured on this kind of machine


def measured_overheads(out_dir: str | Path, skip_steps: int = 2) -> RuntimeOverheads:
    """The runtime's own costs, read off a measured timeline (steps after `skip_steps`):
    - per pipeline action: the median time between the end of one forward/backward and the start
      of the next on a rank, less any wait for a transfer in between;
    - per step: the median of the step's time less the span of its recorded schedule (optimizer,
      zeroing gradients, the loss all-reduce, making the batch)."""
    runs = load_runs(out_dir)
    per_step = step_times(out_dir)
    gaps, outside = [], []
    for events in runs.values():
        events = sorted((e for e in events if e["step"] >= skip_steps), key=lambda e: e["start"])
        compute = [e for e in events if e["lane"] == "compute"]
        for a, b in zip(compute, compute[1:], strict=False):
            if a["step"] != b["step"]:
                continue
            waited = sum(e["end"] - e["start"] for e in events
                         if e["lane"] != "compute" and e["start"] >= a["end"] and e["end"] <= b["start"])
            gaps.append(max(0.0, b["start"] - a["end"] - waited))
    for step in range(skip_steps, len(per_step)):
        events = [e for ev in runs.values() for e in ev if e["step"] == step]
        if events:
            outside.append(max(0.0, per_step[step] - (max(e["end"] for e in events) - min(e["start"] for e in events))))
    if not gaps or not outside:
        raise ParaplanError("the timeline has too few steps to read the runtime's overheads from")
    return RuntimeOverheads(rendezvous=True, action_s=statistics.median(gaps), step_s=statistics.median(outside),
                            source=f"measured: timeline of {out_dir}")


def measured_compute_s(out_dir: str | Path, skip_steps: int = 2) -> float:
    """The compute a step ran, summed over every rank (its forwards and backwards on the measured
    timeline), the median over the steps after `skip_steps`: what calibrate sets against the same
    plan's compute profiled with one process alone (the machine's compute scale inside a run)."""
    runs = load_runs(out_dir)
    steps = sorted({e["step"] for ev in runs.values() for e in ev if e["step"] >= skip_steps})
    per_step = [sum(e["end"] - e["start"] for ev in runs.values() for e in ev
                    if e["step"] == s and e["lane"] == "compute") for s in steps]
    if not per_step:
        raise ParaplanError("the timeline has too few steps to read the compute from")
    return statistics.median(per_step)


def write_overheads(overheads: RuntimeOverheads, path: str | Path) -> None:
    from paraplan.system.fileio import atomic_write_text

    atomic_write_text(path, json.dumps({"format_version": OVERHEADS_VERSION, "rendezvous": overheads.rendezvous,
                                        "action_s": overheads.action_s, "step_s": overheads.step_s,
                                        "source": overheads.source}, indent=1) + "\n")


def read_overheads(path: str | Path = DEFAULT_OVERHEADS) -> RuntimeOverheads:
    """A measurement written by write_overheads (every `paraplan train` run writes one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ParaplanError(f"{path}: cannot read runtime overheads ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ParaplanError(f"{path}: malformed JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format_version") != OVERHEADS_VERSION:
        raise ParaplanError(f"{path}: format_version: expected {OVERHEADS_VERSION}")
    try:
        return RuntimeOverheads(rendezvous=bool(data["rendezvous"]), action_s=float(data["action_s"]),
                                step_s=float(data["step_s"]), source=str(data.get("source", str(path))))
    except (KeyError, TypeError, ValueError) as exc:
        raise ParaplanError(f"{path}: expected rendezvous, action_s and step_s (non-negative seconds): {exc}") from None


@dataclass(frozen=True)
class MemoryRow:
    """One rank: the planner's per-device prediction beside what the rank measured (bytes)."""

    rank: int
    stage: int
    # parameters (with mixed precision's 16-bit weight copies) + gradients + optimizer states
    predicted_states: float
    measured_states: int
    predicted_activations: float  # what autograd keeps (Megatron's replicated TP part and one recomputation included)
    measured_activations: int


def memory_comparison(breakdowns, out_dir: str | Path, by_rank: dict | None = None) -> list[MemoryRow]:
    """Predicted (`plan_memory`'s per-stage breakdowns; `by_rank`: a rank's own where the devices of
    its stage differ, costs/memory.py share_breakdowns) against each rank's `memory_rank*.json`."""
    rows = []
    for f in sorted(Path(out_dir).glob("memory_rank*.json"), key=lambda f: int(f.stem[len("memory_rank"):])):
        m = json.loads(f.read_text())
        # one breakdown per pipeline rank, named by its first stage (several with interleaved schedules)
        b = (by_rank or {}).get(m["rank"]) or next(b for b in breakdowns if b.stage == m["stage"])
        # autocast's weight copies count with the parameters, as the memory model files them
        rows.append(MemoryRow(rank=m["rank"], stage=m["stage"], predicted_states=b.states_bytes + b.compute_copy_bytes,
                              measured_states=m["params"] + m["grads"] + m["optimizer"] + m.get("weight_copies", 0),
                              predicted_activations=b.activation_bytes + b.tp_replicated_bytes,
                              measured_activations=m["activations"]))
    return rows


def dag_memory_comparison(predicted, out_dir: str | Path) -> list[tuple[int, float, float]]:
    """(rank, measured bytes, predicted peak bytes) for an operator placement: what each rank's
    memory_dag_rank{r}.json recorded (parameters, gradients, optimizer states, the peak of saved
    activations) against the simulator's peak for its device (costs/op_memory.py)."""
    by_device = {m.device: m.peak_bytes for m in predicted}
    rows = []
    for f in sorted(Path(out_dir).glob("memory_dag_rank*.json")):
        m = json.loads(f.read_text())
        measured = m["params"] + m["grads"] + m["optimizer"] + m["activations"]
        rows.append((m["rank"], float(measured), float(by_device.get(m["rank"], 0))))
    return sorted(rows)

