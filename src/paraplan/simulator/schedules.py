"""Per-stage action orders of the pipeline schedules: pure generators, no runtime objects.

An action is the forward or backward of micro-batch j on stage s, written and parsed as text the
way torch.distributed.pipelining writes its actions: "0F3" is stage 0's forward of micro-batch 3,
"2B0" stage 2's backward of micro-batch 0. Tests compare the orders with hand-written tables in
that form (tests/unit/test_simulator.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from paraplan.plans.plan import Schedule


class Computation(StrEnum):
    FORWARD = "F"
    BACKWARD = "B"


_ACTION = re.compile(r"^(\d+)([FB])(\d+)$")


@dataclass(frozen=True)
class Action:
    stage: int
    computation: Computation
    micro: int

    def __str__(self) -> str:
        return f"{self.stage}{self.computation}{self.micro}"

    @staticmethod
    def from_str(text: str) -> Action:
        match = _ACTION.match(text.strip())
        if match is None:
            raise ValueError(f"not an action: {text!r} (expected e.g. '0F3': stage, F or B, micro-batch)")
        return Action(int(match[1]), Computation(match[2]), int(match[3]))


def parse(text: str) -> list[Action]:
    """A whitespace-separated order: "0F0 0F1 0B0 ..."."""
    return [Action.from_str(word) for word in text.split()]


def gpipe(n_stages: int, n_micro: int, stage: int) -> list[Action]:
    """GPipe: all forwards, then all backwards (in micro-batch order, as torch's ScheduleGPipe)."""
    return ([Action(stage, Computation.FORWARD, j) for j in range(n_micro)]
            + [Action(stage, Computation.BACKWARD, j) for j in range(n_micro)])


def one_f_one_b(n_stages: int, n_micro: int, stage: int) -> list[Action]:
    """1F1B with flush (PipeDream-Flush / DAPPLE): n_stages - stage - 1 warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards. At most n_stages - stage
    micro-batches are in flight on a stage."""
    warmup = min(n_stages - stage - 1, n_micro)
    order = [Action(stage, Computation.FORWARD, j) for j in range(warmup)]
    f, b = warmup, 0
    while f < n_micro:
        order.append(Action(stage, Computation.FORWARD, f))
        f += 1
        order.append(Action(stage, Computation.BACKWARD, b))
        b += 1
    order += [Action(stage, Computation.BACKWARD, j) for j in range(b, n_micro)]
    return order


def in_flight(order: list[Action]) -> int:
    """The most micro-batches whose forward has run and whose backward has not, on one stage."""
    live = peak = 0
    for action in order:
        live += 1 if action.computation == Computation.FORWARD else -1
        peak = max(peak, live)
    return peak


ORDERS: dict[Schedule, Callable[[int, int, int], list[Action]]] = {
    Schedule.GPIPE: gpipe, Schedule.ONE_F_ONE_B: one_f_one_b, Schedule.ASYNC_1F1B: one_f_one_b}
