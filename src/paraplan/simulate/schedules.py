"""Per-stage action orders of the pipeline schedules: pure generators, no runtime objects.

An action is ("F", j) or ("B", j): the forward or backward of micro-batch j on that stage.
Tests compare them with hand-aligned tables (tests/unit/test_schedules.py).
"""

from __future__ import annotations

Action = tuple[str, int]


def gpipe(n_stages: int, n_micro: int, stage: int) -> list[Action]:
    """GPipe: all forwards, then all backwards (in micro-batch order, as torch's ScheduleGPipe)."""
    return [("F", j) for j in range(n_micro)] + [("B", j) for j in range(n_micro)]


def one_f_one_b(n_stages: int, n_micro: int, stage: int) -> list[Action]:
    """1F1B with flush (PipeDream-Flush / DAPPLE): n_stages - stage - 1 warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards. At most n_stages - stage
    micro-batches are in flight on a stage."""
    warmup = min(n_stages - stage - 1, n_micro)
    order: list[Action] = [("F", j) for j in range(warmup)]
    f, b = warmup, 0
    while f < n_micro:
        order.append(("F", f))
        f += 1
        order.append(("B", b))
        b += 1
    order += [("B", j) for j in range(b, n_micro)]
    return order


def in_flight(order: list[Action]) -> int:
    """The most micro-batches whose forward has run and whose backward has not, on one stage."""
    live = peak = 0
    for op, _ in order:
        live += 1 if op == "F" else -1
        peak = max(peak, live)
    return peak


ORDERS = {"gpipe": gpipe, "1f1b": one_f_one_b, "async-1f1b": one_f_one_b}
