"""A pipeline action, as torch.distributed.pipelining writes it: the forward, backward,
input-gradient or weight-gradient pass of micro-batch j on stage s ("0F3", "2B0", "1I2", "1W2"),
and its plan-file form ("F3.0"). A leaf: plans/schedules.py builds every schedule's orders of
them, plans/zero_bubble_auto.py ZB-2P's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Computation(StrEnum):
    FORWARD = "F"
    BACKWARD = "B"  # the whole backward (input and weight gradients)
    BACKWARD_INPUT = "I"  # zero-bubble's first half: the gradient of the stage's input
    BACKWARD_WEIGHT = "W"  # zero-bubble's second half: the weights' gradients


_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$")
_PLAN_ACTION = re.compile(r"^([FBIW])(\d+)\.(\d+)$")


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
            raise ValueError(f"not an action: {text!r} (expected e.g. '0F3': stage, F/B/I/W, micro-batch)")
        return Action(int(match[1]), Computation(match[2]), int(match[3]))

    def plan_text(self) -> str:
        """The plan file's form: "F3.0" (kind, micro-batch, stage)."""
        return f"{self.computation}{self.micro}.{self.stage}"

    @staticmethod
    def from_plan_text(text: str) -> Action:
        match = _PLAN_ACTION.match(text.strip())
        if match is None:
            raise ValueError(f"not an action: {text!r} (expected e.g. 'F3.0': F/B/I/W, micro-batch, stage)")
        return Action(int(match[3]), Computation(match[1]), int(match[2]))


def parse(text: str) -> list[Action]:
    """A whitespace-separated order: "0F0 0F1 0B0 ..."."""
    return [Action.from_str(word) for word in text.split()]
