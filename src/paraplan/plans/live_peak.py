"""What a pipeline rank holds along its order of actions (plans/schedules.py `rank_order`): the most
micro-batches in flight (`in_flight`), the moment its stages' kept bytes weigh the most
(`live_peak`), and the micro-batches a stage of a one-chunk pipeline holds
(`micro_batches_in_flight`), for costs/memory.py's count of a rank that holds several stages or
splits its backward."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from paraplan.plans import schedules
from paraplan.plans.actions import Action, Computation

F, B, W = Computation.FORWARD, Computation.BACKWARD, Computation.BACKWARD_WEIGHT
I = Computation.BACKWARD_INPUT  # noqa: E741 (the zero-bubble paper's and torch's letter)


def in_flight(order: list[Action]) -> int:
    """The most micro-batches whose forward has run and whose backward has not, on one stage (or
    summed over the stages of one rank). A split backward frees them at its W: torch's I keeps the
    graph for W, and the zero-bubble paper's M_W, what W still needs, is most of a transformer
    layer's M_B (Qi et al. 2024 Table 1: 32sbh of 34sbh + 5as^2b)."""
    live = peak = 0
    for action in order:
        if action.computation == F:
            live += 1
        elif action.computation in (B, W):
            live -= 1
        peak = max(peak, live)
    return peak


class LivePeak(NamedTuple):
    bytes: float  # the most bytes the rank's stages hold at once
    held: dict[int, int]  # at that moment: micro-batches each stage holds
    waiting: dict[int, int]  # ... and how many of them wait for their W
    units: dict[int, tuple[bool, bool]]  # ... and whether each stage keeps its gathered weights, its gradients


def live_peak(order: Sequence[Action], per_micro: dict[int, float],
              kept_for_weights: dict[int, float] | None = None,
              units: dict[int, tuple[float, float]] | None = None) -> LivePeak:
    """Walking one rank's order: the most bytes its stages hold at once, with `per_micro[stage]`
    bytes kept from each micro-batch's forward to its backward (its W when split) and, with a split
    backward, `kept_for_weights[stage]` more from its I to its W (the gradients W starts from);
    and, at that moment, how many micro-batches each stage holds and how many of them wait for W.
    `units[stage]` = (weights, gradients): FSDP under pipelining (torchtitan: reshard_after_forward
    off with PP; torch.distributed.pipelining syncs and reshards a stage's FSDP units once, after
    its last backward, its REDUCE_GRAD): the stage's gathered weights from its first forward, its
    unsharded gradients from its first weight-gradient pass (B, or W when split), both until its
    last one.

    The bytes of each moment are kept as a running sum (a constant per action, where summing every
    stage of the rank at every action had been a tenth of a 1,024-GPU comparison); a moment that the
    running sum puts within its rounding error (`slack`) of the peak so far is summed again stage by
    stage, as the peak is reported, so that the moment chosen (the first of the most bytes) and its
    bytes are those of the sum over stages."""
    extra = kept_for_weights or {}
    spans = units or {}
    live = {s: 0 for s in per_micro}
    waiting = {s: 0 for s in per_micro}
    weight_passes = dict.fromkeys(per_micro, 0)
    actions = dict.fromkeys(per_micro, 0)
    for a in order:
        if a.stage in actions:
            actions[a.stage] += 1
            weight_passes[a.stage] += a.computation in (B, W)
    passes_done = {s: 0 for s in per_micro}
    gathered = {s: False for s in per_micro}
    span = {s: spans.get(s, (0.0, 0.0)) for s in per_micro}
    # per stage, whether it keeps its gathered weights and its gradients while it is not the one running
    kept = {t: (False, False) for t in per_micro}

    def kept_bytes(t: int) -> float:
        return span[t][0] * kept[t][0] + span[t][1] * kept[t][1]

    def held_now(running: int | None) -> tuple[float, dict]:  # the sum over stages, as reported
        state = {t: (True, True) if t == running else kept[t] for t in live}
        return sum(live[t] * per_micro[t] + waiting[t] * extra.get(t, 0.0) for t in live) + sum(
            span[t][0] * state[t][0] + span[t][1] * state[t][1] for t in live), state

    # a bound on the running sum's rounding: each of its len(order) updates errs by at most one
    # rounding of a value no larger than every byte count summed
    largest = sum((abs(per_micro[t]) + abs(extra.get(t, 0.0))) * actions[t]
                  + abs(span[t][0]) + abs(span[t][1]) for t in per_micro)
    slack = 4 * (len(order) + len(per_micro) + 2) * 2.3e-16 * largest
    activations = unit_bytes = 0.0
    with_units = any(x or y for x, y in span.values())
    summed: set = set()
    best = LivePeak(0.0, dict(live), dict(waiting), {s: (False, False) for s in per_micro})
    for action in order:
        s, kind = action.stage, action.computation
        unit_bytes -= kept_bytes(s)
        if kind == F:
            live[s] += 1
            gathered[s] = True
            activations += per_micro[s]
        elif kind == I:
            waiting[s] += 1
            activations += extra.get(s, 0.0)
        elif kind == W:
            live[s] -= 1
            waiting[s] -= 1
            passes_done[s] += 1
            activations -= per_micro[s] + extra.get(s, 0.0)
        else:
            live[s] -= 1
            passes_done[s] += 1
            activations -= per_micro[s]
        # a stage's units are alive through its last weight-gradient pass, freed after it
        kept[s] = (gathered[s] and passes_done[s] < weight_passes[s], 0 < passes_done[s] < weight_passes[s])
        unit_bytes += kept_bytes(s)
        running = s if kind in (B, W) else None
        quick = activations + unit_bytes + (span[s][0] + span[s][1] - kept_bytes(s) if running is not None else 0.0)
        if quick + slack <= best.bytes:
            continue
        # the same counts as a moment summed before (a steady state comes back to them): the same bytes
        seen = (tuple(live.values()), tuple(waiting.values()), running, tuple(kept.values()) if with_units else None)
        if seen in summed:
            continue
        summed.add(seen)
        held, state = held_now(running)
        if held > best.bytes:
            best = LivePeak(held, dict(live), dict(waiting), state)
    return best


def micro_batches_in_flight(schedule: str, n_stages: int, stage: int, n_micro: int,
                            forward_stage: int | None = None) -> int:
    """Micro-batches whose activations wait on `stage` for their backward; `forward_stage` is where
    their forward ran when that is another stage (Bi-Partition). One chunk per rank; the kinds
    beyond GPipe and 1F1B (ZB-H1: interleaved-zb with one chunk) are counted on their order, a
    split backward freeing them at its W (`in_flight`)."""
    if schedule == "gpipe":
        return n_micro
    if schedule not in ("1f1b", "async-1f1b"):
        return in_flight(schedules.rank_order(schedule, n_stages, 1, n_micro, stage))
    a = stage if forward_stage is None else forward_stage
    return max(1, min(n_micro, math.ceil(n_stages - (a + stage) / 2)))
