"""Where a simulated iteration's time goes, averaged over the cluster's devices: the compute each
device does, the communication its compute does not hide, what runs after the schedule (the step,
the optimizer, ZeRO's all-gather), and the rest, idle (pipeline bubbles, stages that wait on one
another, devices the plan leaves unused). The four add up to the iteration time exactly, on every
device and so on average:

    T = busy_d + exposed_d + after + idle_d     for each device d the plan uses
    T = idle_d                                  for a device it leaves unused

`paraplan plan` sets the compute against the lower bound (planners/bound.py: a least compute per
device) to say what the winner's gap to the bound is made of (issue 31: the bound does not count
bubbles or communication; this says how much of each a plan pays).

Exposed communication of a device: the time any of its transfer or collective lanes is busy while
its compute lane is not, |comm ∪ compute| - |compute|, within the schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.simulator.engine import COMPUTE, Timeline


@dataclass(frozen=True)
class TimeSplit:
    """Seconds per device per iteration, averaged over the cluster's `n_devices` (those the plan
    leaves unused count as idle throughout)."""

    iteration_s: float
    compute_s: float  # the compute lanes' busy time (forward, backward, recomputation, TP collectives in them)
    exposed_comm_s: float  # transfers and collectives while the compute lane is idle
    after_s: float  # after the schedule: the step's fixed cost, the optimizer, ZeRO-1/2's parameter all-gather
    n_devices: int
    n_used: int
    exposed_sync_s: float = 0.0  # of exposed_comm_s, while a collective runs (gradient sync); the rest: sends

    def describe(self) -> str:
        """The split in words (`paraplan simulate`)."""
        rest = _beyond_compute(self.exposed_comm_s, self.exposed_sync_s, self.after_s, self.idle_s, self.n_used,
                               self.n_devices)
        return ", ".join([f"{_ms(self.compute_s)} ms compute"] + [text for _, text in rest])

    @property
    def idle_s(self) -> float:
        """Bubbles, imbalance and unused devices: what is left of the iteration."""
        return max(0.0, self.iteration_s - self.compute_s - self.exposed_comm_s - self.after_s)


def _ms(s: float) -> str:
    """Milliseconds in four digits and never an exponent: '1.207e+04' beside '12.07 s' reads as another unit."""
    return f"{s * 1e3:.4g}" if abs(s) < 10 else f"{s * 1e3:,.0f}"


def union_length(start: np.ndarray, end: np.ndarray) -> float:
    """The measure of a union of intervals [start_i, end_i)."""
    if len(start) == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)  # the furthest end among the intervals up to each one
    previous = np.concatenate([[-np.inf], reach[:-1]])
    return float(np.maximum(0.0, e - np.maximum(s, previous)).sum())


def _beyond_compute(exposed_s: float, sync_s: float, after_s: float, idle_s: float, n_used: int,
                    n_devices: int) -> list[tuple[float, str]]:
    """(seconds, words) of what an iteration holds beside compute, as both splits say it."""
    sync = f" ({_ms(sync_s)} ms of it collectives: gradient sync)" if sync_s > 1e-12 else ""
    unused = f", {n_devices - n_used} of {n_devices} devices unused" if n_used < n_devices else ""
    return [(exposed_s, f"{_ms(exposed_s)} ms communication not hidden{sync}"),
            (after_s, f"{_ms(after_s)} ms after the schedule (step, optimizer, ZeRO gather)"),
            (idle_s, f"{_ms(idle_s)} ms idle (bubbles, imbalance{unused})")]


def exposed_comm(timeline: Timeline) -> dict[int, tuple[float, float]]:
    """Per device drawn in the timeline: (seconds its transfer or collective lanes are busy while its
    compute lane is idle, of those the seconds a collective is busy)."""
    compute: dict[int, list[int]] = {}
    comm: dict[int, list[int]] = {}
    collective: dict[int, list[int]] = {}
    for i in range(len(timeline.start)):
        if timeline.type[i] == COMPUTE:
            compute.setdefault(int(timeline.device[i]), []).append(i)
        elif timeline.groups[i] is None:  # a transfer: its sender's and its receiver's lanes
            for d in (int(timeline.device[i]), int(timeline.peer[i])):
                comm.setdefault(d, []).append(i)
        else:
            for d in timeline.groups[i]:
                comm.setdefault(int(d), []).append(i)
                collective.setdefault(int(d), []).append(i)

    def beyond_compute(d: int, tasks: list[int]) -> float:
        mine, computed = np.array(compute.get(d, []) + tasks, dtype=int), np.array(compute.get(d, []), dtype=int)
        return (union_length(timeline.start[mine], timeline.end[mine])
                - union_length(timeline.start[computed], timeline.end[computed]))

    return {d: (beyond_compute(d, tasks), beyond_compute(d, collective.get(d, []))) for d, tasks in comm.items()}


def split_time(iteration_s: float, busy: dict[int, float], exposed: dict[int, tuple[float, float]], after_s: float,
               n_devices: int) -> TimeSplit:
    """The averages over `n_devices` of per-device busy and exposed seconds (devices the plan uses:
    the keys of `busy`; `exposed`: (all, collectives) as `exposed_comm` gives them), with `after_s`
    paid by every device the plan uses."""
    used = len(busy)
    return TimeSplit(iteration_s=iteration_s, compute_s=sum(busy.values()) / n_devices,
                     exposed_comm_s=sum(exposed.get(d, (0.0, 0.0))[0] for d in busy) / n_devices,
                     exposed_sync_s=sum(exposed.get(d, (0.0, 0.0))[1] for d in busy) / n_devices,
                     after_s=after_s * used / n_devices, n_devices=n_devices, n_used=used)


@dataclass(frozen=True)
class GapParts:
    """A plan's iteration against the lower bound, per device on average over the cluster (seconds;
    they add up to the iteration): what the bound counts (`bound_s`, compute: every term of
    planners/bound.py is a least compute spread over the devices), and what it does not (bubbles,
    communication)."""

    bound_s: float  # the lower bound (planners/bound.py): the least compute any plan does, per device
    extra_compute_s: float  # computed beyond it: smaller pieces, TP collectives priced in the layers, recomputation
    exposed_comm_s: float  # transfers and collectives the compute does not hide
    exposed_sync_s: float  # of those, while a collective runs (gradient sync)
    after_s: float  # the step's fixed cost, the optimizer, ZeRO-1/2's all-gather
    idle_s: float  # bubbles, stages waiting on one another, devices left unused
    n_used: int
    n_devices: int

    def describe(self) -> str:
        """The parts in words, those of zero seconds left out."""
        parts = [(self.extra_compute_s, f"{_ms(self.extra_compute_s)} ms more compute (smaller pieces, TP "
                                        "collectives, recomputation)")]
        parts += _beyond_compute(self.exposed_comm_s, self.exposed_sync_s, self.after_s, self.idle_s, self.n_used,
                                 self.n_devices)
        return ", ".join([f"{_ms(self.bound_s)} ms the bound"] + [text for x, text in parts if abs(x) > 1e-12])


def against_bound(split: TimeSplit, bound_s: float) -> GapParts:
    """The split beside the lower bound: its compute beyond the bound's, and the rest."""
    return GapParts(bound_s=bound_s, extra_compute_s=split.compute_s - bound_s, exposed_comm_s=split.exposed_comm_s,
                    exposed_sync_s=split.exposed_sync_s, after_s=split.after_s, idle_s=split.idle_s,
                    n_used=split.n_used, n_devices=split.n_devices)
