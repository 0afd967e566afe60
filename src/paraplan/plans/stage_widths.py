"""Stages of unequal width (issue 52 item 2): PipeDream's and DAPPLE's replicated stages, HetPipe's
and Sailor's per-stage device kind x data-parallel width.

A plain pipeline stage (no per-layer strategies) of w devices splits every micro-batch (global_batch
/ n_micro samples) into w contiguous slices of equal rows: device k of the stage runs rows
[k M / w, (k + 1) M / w) of each micro-batch. Where every stage has the same width this is today's
plan (replica r of the pipeline is devices[r] of every stage); where two neighbours differ, a and b
devices, device k of the first sends device l of the second the rows their slices share (forward:
that part of the activation; backward: that part of its gradient back). So 2 devices feeding 1 send
a half each, and 1 feeding 2 sends each its half. Every device of a stage holds the stage's whole
weights; their gradients are summed over the stage's devices (each device's are its rows' exact
share), which for equal widths is today's average of replicas that each took a mean over their rows.

DAPPLE splits a micro-batch over a replicated stage in the same way; PipeDream instead sends whole
micro-batches round-robin to a stage's replicas. The split keeps one order of actions per stage
(plans/schedules.py), so every device of a stage runs its stage's order and the runtime and the
simulator need no new schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraplan.plans.kinds import PlanKind
from paraplan.plans.schedules import Schedule

# the schedules a plan of unequal widths runs under: one model chunk per pipeline rank, every rank's
# order its stage's (the multi-chunk kinds put several stages on one group of devices)
WIDE_SCHEDULES = (Schedule.GPIPE, Schedule.ONE_F_ONE_B)


@dataclass(frozen=True)
class Hop:
    """What one device of a stage sends one device of the next: rows start..stop-1 of a micro-batch."""

    sender: int  # the sending device's position in its stage (0..a-1)
    receiver: int  # the receiving device's position in the next stage (0..b-1)
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def widths(plan) -> tuple[int, ...]:
    """Each stage's number of devices."""
    return tuple(len(s.devices) for s in plan.stages)


def unequal(plan) -> bool:
    """Whether the plan's stages differ in width."""
    return len(set(widths(plan))) > 1


def lane_rows(rows: int, width: int) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each of `width` devices' slices of a micro-batch of `rows` samples."""
    share = rows // width
    return tuple((k * share, (k + 1) * share) for k in range(width))


def hops(rows: int, a: int, b: int) -> tuple[Hop, ...]:
    """Every (sender, receiver, rows) where a stage of `a` devices meets one of `b`, in sender order."""
    out = []
    receivers = lane_rows(rows, b)
    for k, (s0, s1) in enumerate(lane_rows(rows, a)):
        for j, (r0, r1) in enumerate(receivers):
            start, stop = max(s0, r0), min(s1, r1)
            if stop > start:
                out.append(Hop(k, j, start, stop))
    return tuple(out)


def width_problem(plan) -> str | None:
    """Why a plan of plain stages of unequal width is malformed (one line), or None. (That every
    width divides the micro-batch, plans/plan.py checks of every plain stage.)"""
    if not unequal(plan) or plan.kind is not PlanKind.PIPELINE:
        return None
    if plan.schedule not in WIDE_SCHEDULES:
        return (f"stages of unequal width ({', '.join(map(str, widths(plan)))}) run with "
                f"{' or '.join(WIDE_SCHEDULES)}, one stage per pipeline rank, not {plan.schedule}")
    return None
