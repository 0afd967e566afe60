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
    """Whether the plan's stages differ in width, or some stage shares its micro-batches unevenly:
    the plans simulator/wide_work.py prices and runtime/pipeline/wide_rank.py runs."""
    return len(set(widths(plan))) > 1 or any(s.shares for s in plan.stages)


def lane_rows(rows: int, width: int, shares: tuple[int, ...] = ()) -> tuple[tuple[int, int], ...]:
    """(start, stop) of each of `width` devices' slices of a micro-batch of `rows` samples: equal, or
    in proportion to `shares` (width_problem checks that every slice is whole rows)."""
    weights = shares or (1,) * width
    total, out, start = sum(weights), [], 0
    for w in weights:
        stop = start + rows * w // total
        out.append((start, stop))
        start = stop
    return tuple(out)


def stage_rows(plan, s: int) -> tuple[tuple[int, int], ...]:
    """Each device of stage s's slice of every micro-batch."""
    stage = plan.stages[s]
    return lane_rows(plan.global_batch // plan.n_micro, len(stage.devices), stage.shares)


def hops(senders: tuple[tuple[int, int], ...], receivers: tuple[tuple[int, int], ...]) -> tuple[Hop, ...]:
    """Every (sender, receiver, rows) where a stage whose devices take `senders` (their slices, as
    lane_rows gives them) meets one whose devices take `receivers`, in sender order."""
    out = []
    for k, (s0, s1) in enumerate(senders):
        for j, (r0, r1) in enumerate(receivers):
            start, stop = max(s0, r0), min(s1, r1)
            if stop > start:
                out.append(Hop(k, j, start, stop))
    return tuple(out)


def boundary_hops(plan, s: int) -> tuple[Hop, ...]:
    """The hops from stage s to stage s + 1."""
    return hops(stage_rows(plan, s), stage_rows(plan, s + 1))


def width_problem(plan) -> str | None:
    """Why a plan of plain stages of unequal width or shares is malformed (one line), or None.
    (That an equal split's width divides the micro-batch, plans/plan.py checks of every plain stage.)"""
    if not unequal(plan):
        return None
    if plan.kind is not PlanKind.PIPELINE:  # (unequal widths there: the simulator and runtime refuse them)
        shared = [i for i, st in enumerate(plan.stages) if st.shares]
        return (f"stages[{shared[0]}].shares: shares of the micro-batch are for plain pipeline stages (no per-layer "
                "strategies, no backward ranges)") if shared else None
    if plan.schedule not in WIDE_SCHEDULES:
        return (f"stages of unequal width ({', '.join(map(str, widths(plan)))}) run with "
                f"{' or '.join(WIDE_SCHEDULES)}, one stage per pipeline rank, not {plan.schedule}")
    rows = plan.global_batch // plan.n_micro
    for i, stage in enumerate(plan.stages):
        if not stage.shares:
            continue
        if len(stage.shares) != len(stage.devices):
            return f"stages[{i}].shares: {len(stage.shares)} shares for {len(stage.devices)} devices"
        if any(w < 1 for w in stage.shares):
            return f"stages[{i}].shares: each share must be at least 1, got {list(stage.shares)}"
        total = sum(stage.shares)
        if any(rows * w % total for w in stage.shares):
            return (f"stages[{i}].shares: a micro-batch of {rows} samples does not split "
                    f"{':'.join(map(str, stage.shares))} into whole rows")
    return None
