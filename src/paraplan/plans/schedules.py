"""Pipeline schedules as data: every pipeline rank's order of actions, and which rank runs which
stage. Pure generators, no runtime objects; the simulator builds its task graph from them, the
memory model walks them, and the runtime hands the same (stages, virtual stages, micro-batches) to
torch.distributed.pipelining's schedule class of the same kind, whose order equals these (tests:
tests/unit/test_schedules.py builds torch's classes on stand-in stages and compares every rank).

An action is the forward, backward, input-gradient or weight-gradient pass of micro-batch j on
stage s, written as torch.distributed.pipelining writes its actions: "0F3" is stage 0's forward
of micro-batch 3, "2B0" stage 2's (whole) backward of micro-batch 0, "1I2" / "1W2" the two halves
of a split backward (zero-bubble, Qi et al. 2024: I computes the gradient of the stage's input,
which the previous stage waits for; W the gradients of the weights, which nothing waits for and
which the schedule moves into what would be bubbles). In a plan file an action is written
"F3.0" (kind, micro-batch, stage: docs/plan-format.md).

The kinds and their papers:
  gpipe             all forwards, then all backwards (Huang et al. 2019)
  1f1b              1F1B with a flush (PipeDream-Flush, Narayanan et al. 2021a; DAPPLE)
  interleaved-1f1b  v model chunks per rank, stage i on rank i mod p, depth first (Narayanan et
                    al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters" §2.2.2):
                    the bubble shrinks v times, p2p traffic grows v times
  looped-bfs        v chunks per rank, breadth first: every micro-batch through a rank's earlier
                    chunk before its next (Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism")
  interleaved-zb    ZB-1P (Qi et al. 2024, "Zero Bubble Pipeline Parallelism" §3) on v chunks per rank:
                    1F1B with the backward split, W delayed into the cool-down; v = 1 is ZB-H1
  zbv               ZB-V (Qi et al. 2024 §6): 2 chunks per rank in a V (rank r holds stages r and
                    2p - 1 - r), zero bubble when F = I = W, peak memory of 1F1B
  zb-2p             ZB-2p (Qi et al. 2024 §3.1, §5): one chunk per rank, the backward split, up to 2p
                    micro-batches in flight; the paper's heuristic order (plans/zero_bubble_auto.py)
  dualpipev         DualPipeV (DeepSeek-V3 report 2024, §3.2.1, its V-shaped variant): 2 chunks
                    in a V, one chunk's forward paired with the other's backward in the steady state
The orders are torch 2.13's (`torch/distributed/pipelining/schedules.py`), which implement those
papers; the idle slots torch pads them with ("None") are left out: what the simulator waits on is
the dependencies, not the slots.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum

from paraplan.plans.actions import Action, Computation, parse  # noqa: F401 (parse: schedules.parse for callers)
from paraplan.plans.zero_bubble_auto import zb_2p


class Schedule(StrEnum):
    """How a replica's micro-batches move through its stages."""

    GPIPE = "gpipe"  # all forwards, then all backwards (GPipe; CSIMD's MBPP)
    ONE_F_ONE_B = "1f1b"  # one forward, one backward in turn, with a flush (PipeDream-Flush / DAPPLE)
    ASYNC_1F1B = "async-1f1b"  # 1F1B without a flush, weight stashing (PipeDream)
    # several model chunks per rank (virtual_stages; plans/schedules.py has their orders and papers)
    INTERLEAVED_1F1B = "interleaved-1f1b"  # Narayanan et al. 2021: stage i on rank i mod p, depth first
    LOOPED_BFS = "looped-bfs"  # Lamy-Poirier 2023: the same placement, breadth first
    INTERLEAVED_ZB = "interleaved-zb"  # Qi et al. 2024 ZB-1P: the backward split, W fills the bubbles
    ZBV = "zbv"  # Qi et al. 2024 ZB-V: 2 chunks per rank in a V
    DUALPIPE_V = "dualpipev"  # DeepSeek-V3's DualPipeV: 2 chunks in a V, forward and backward paired
    ZB_2P = "zb-2p"  # Qi et al. 2024 ZB-2p: one chunk, the backward split, 2p micro-batches in flight
    DAG = "dag"  # an operator placement (FD-DPS)


# the actions themselves live in plans/actions.py (a leaf, which plans/zero_bubble_auto.py imports too)


F, B, W = Computation.FORWARD, Computation.BACKWARD, Computation.BACKWARD_WEIGHT
I = Computation.BACKWARD_INPUT  # noqa: E741 (the zero-bubble paper's and torch's letter)
# the kinds whose backward is split into I and W, and those whose two chunks sit in a V
SPLIT_BACKWARD = (Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPE_V, Schedule.ZB_2P)
V_SHAPED = (Schedule.ZBV, Schedule.DUALPIPE_V)
# the kinds torch runs with its multi-stage runtime (PipelineScheduleMulti), several chunks per rank
# or one (ZB-H1 = interleaved-zb with v = 1, zb-2p)
MULTI_CHUNK = (Schedule.INTERLEAVED_1F1B, Schedule.LOOPED_BFS, Schedule.INTERLEAVED_ZB, Schedule.ZBV,
               Schedule.DUALPIPE_V, Schedule.ZB_2P)


# ---------------------------------------------------------------------------------------------
# one chunk per rank (stage s on rank s)

def gpipe(n_stages: int, n_micro: int, stage: int) -> list[Action]:
    """GPipe: all forwards, then all backwards (in micro-batch order, as torch's ScheduleGPipe)."""
    return [Action(stage, F, j) for j in range(n_micro)] + [Action(stage, B, j) for j in range(n_micro)]


def one_f_one_b(n_stages: int, n_micro: int, stage: int) -> list[Action]:
    """1F1B with flush (PipeDream-Flush / DAPPLE): n_stages - stage - 1 warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards. At most n_stages - stage
    micro-batches are in flight on a stage."""
    warmup = min(n_stages - stage - 1, n_micro)
    order = [Action(stage, F, j) for j in range(warmup)]
    f, b = warmup, 0
    while f < n_micro:
        order.append(Action(stage, F, f))
        f += 1
        order.append(Action(stage, B, b))
        b += 1
    order += [Action(stage, B, j) for j in range(b, n_micro)]
    return order


ORDERS: dict[Schedule, Callable[[int, int, int], list[Action]]] = {
    Schedule.GPIPE: gpipe, Schedule.ONE_F_ONE_B: one_f_one_b, Schedule.ASYNC_1F1B: one_f_one_b}


# ---------------------------------------------------------------------------------------------
# several chunks per rank

def stage_ranks(kind: str, n_ranks: int, virtual: int) -> tuple[int, ...]:
    """The pipeline rank of each of the n_ranks x virtual stages: in a loop (stage i on rank i mod
    p: Narayanan et al. 2021's interleaving), or in a V for zbv / dualpipev (rank r holds stages r
    and 2p - 1 - r, so the last stage sits with the first and the turn needs no transfer)."""
    n = n_ranks * virtual
    if kind in V_SHAPED:
        return tuple(i if i < n_ranks else n - 1 - i for i in range(n))
    return tuple(i % n_ranks for i in range(n))


def rounds(n_ranks: int, n_micro: int) -> int:
    """Interleaved schedules run the micro-batches in rounds of (about) p: torch's flexible
    interleaving (any n_micro that the rounds divide, not only multiples of p)."""
    return max(1, n_micro // n_ranks)


def schedule_problem(kind: str, n_ranks: int, virtual: int, n_micro: int) -> str:
    """'' when (kind, p, v, n_micro) can run, else one line saying why (torch's schedule classes
    refuse the same: shared/notes/runtime-on-cpu.md's traps)."""
    if kind in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ASYNC_1F1B, Schedule.ZB_2P):
        return "" if virtual == 1 else f"{kind} runs one chunk per rank (virtual_stages 1), got {virtual}"
    if kind in V_SHAPED and virtual != 2:
        return f"{kind} runs exactly 2 chunks per rank in a V (virtual_stages 2), got {virtual}"
    if kind in (Schedule.INTERLEAVED_1F1B, Schedule.LOOPED_BFS) and virtual < 2:
        return f"{kind} needs at least 2 chunks per rank (virtual_stages >= 2; with 1 it is 1f1b / gpipe), got {virtual}"
    if virtual < 1:
        return f"virtual_stages must be at least 1, got {virtual}"
    if kind in (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB) and n_micro % rounds(n_ranks, n_micro):
        r = rounds(n_ranks, n_micro)
        return (f"{kind} runs the micro-batches in {r} rounds of {n_ranks} ranks: {n_micro} micro-batches "
                f"are not a multiple of {r}")
    if kind == Schedule.DUALPIPE_V and n_micro < 2 * n_ranks:
        return f"dualpipev needs at least as many micro-batches as stages ({2 * n_ranks}), got {n_micro}"
    return ""


def _warmup_ops(rank: int, virtual: int, per_round: int, n_ranks: int, n_micro: int, factor: int) -> int:
    """Interleaved warm-up forwards: (v - 1) rounds on the last rank, `factor` more per hop before it."""
    return min((virtual - 1) * per_round + factor * (n_ranks - 1 - rank), n_micro * virtual)


def _interleaved(n_ranks: int, virtual: int, n_micro: int, rank: int, zero_bubble: bool) -> list[Action]:
    """Interleaved 1F1B (Narayanan et al. 2021 §2.2.2), or with zero_bubble ZB-1P on the same chunks
    (Qi et al. 2024 §3: warm-up one op shorter per hop, the backward split, each W delayed behind
    `rank` I's): warm-up forwards, then one forward and one backward in turn, then the rest of the
    backwards; a chunk's turn lasts one round of micro-batches (depth first)."""
    per_round = n_micro // rounds(n_ranks, n_micro)
    warmup = _warmup_ops(rank, virtual, per_round, n_ranks, n_micro, 1 if zero_bubble else 2)
    total = virtual * n_micro

    def forward_stage(op: int) -> int:
        return ((op // per_round) % virtual) * n_ranks + rank

    def backward_stage(op: int) -> int:
        return (virtual - 1 - ((op - warmup) // per_round) % virtual) * n_ranks + rank

    next_micro: dict[tuple[int, Computation], int] = {}

    def act(stage: int, kind: Computation) -> Action:
        j = next_micro.get((stage, kind), 0)
        next_micro[stage, kind] = j + 1
        return Action(stage, kind, j)

    backward = I if zero_bubble else B
    order: list[Action] = []
    backward_ops: list[int] = []  # the op numbers whose (input) backward has run, for the W that follow
    weights_done = 0
    for op in range(warmup + total):  # warm-up forwards, steady pairs, cool-down backwards
        if op < total:
            order.append(act(forward_stage(op), F))
        if op >= warmup:
            order.append(act(backward_stage(op), backward))
            backward_ops.append(op)
            if zero_bubble and op - warmup >= rank:  # ZB-1P: W trails its I by `rank` ops
                order.append(act(backward_stage(backward_ops[weights_done]), W))
                weights_done += 1
    while zero_bubble and weights_done < len(backward_ops):
        order.append(act(backward_stage(backward_ops[weights_done]), W))
        weights_done += 1
    return order


def _looped_bfs(n_ranks: int, virtual: int, n_micro: int, rank: int) -> list[Action]:
    """Breadth first: every micro-batch's forward on the rank's first chunk, then its next chunk, ...;
    the backwards in reverse (last chunk first, last micro-batch first), as torch's ScheduleLoopedBFS."""
    stages = range(rank, n_ranks * virtual, n_ranks)
    order = [Action(s, F, j) for s in stages for j in range(n_micro)]
    return order + [Action(s, B, j) for s in reversed(stages) for j in reversed(range(n_micro))]


def _zbv(n_ranks: int, n_micro: int, rank: int) -> list[Action]:
    """ZB-V (Qi et al. 2024 §6, Fig. 8): chunk 0 forwards while the V fills, then F-I-W triples on
    chunk 1 as its first backwards arrive, a steady state alternating the chunks, and a cool-down
    whose W fill the bubbles. Built for n_micro >= 2p - 1 and cut back to n_micro (torch's way)."""
    m = max(2 * n_ranks - 1, n_micro)
    s0, s1 = rank, 2 * n_ranks - 1 - rank
    count = {(s, k): 0 for s in (s0, s1) for k in (F, I, W)}
    order: list[Action] = []

    def act(stage: int, kind: Computation) -> None:
        order.append(Action(stage, kind, count[stage, kind]))
        count[stage, kind] += 1

    for _ in range(2 * (n_ranks - rank) - 1):
        act(s0, F)
    for _ in range(rank):
        act(s1, F)
        act(s0, F)
    for _ in range(n_ranks - rank):
        act(s1, F)
        act(s1, I)
        act(s1, W)
    while count[s1, F] < count[s0, F] or count[s0, F] < m:
        if count[s0, F] < m:
            act(s0, F)
        act(s0, I)
        act(s0, W)
        act(s1, F)
        act(s1, I)
        act(s1, W)
    for _ in range(rank):
        act(s0, I)
        act(s1, I)
    for _ in range(n_ranks - rank):
        act(s0, I)
        act(s0, W)
    while count[s1, W] < count[s1, I]:
        act(s1, W)
    while count[s0, W] < count[s0, I]:
        act(s0, W)
    return [a for a in order if a.micro < n_micro]


def _dualpipe_v(n_ranks: int, n_micro: int, rank: int) -> list[Action]:
    """DualPipeV (DeepSeek-V3 §3.2.1; deepseek-ai/DualPipe's dualpipev.py, as torch's
    ScheduleDualPipeV): the V's two chunks; in the main phase one chunk's forward is paired with the
    other chunk's whole backward (DeepSeek overlaps the pair's computation and communication on a
    GPU; torch runs the pair's two actions one after the other, and so does this order); the first
    and last backwards are split into I and W to fill the bubbles."""
    s0, s1 = rank, 2 * n_ranks - 1 - rank
    count: dict[tuple[int, Computation], int] = {}
    pending_w: list[tuple[int, int]] = []
    order: list[Action] = []

    def act(stage: int, kind: Computation) -> None:
        key = (stage, I if kind == B else kind)  # a whole backward advances the I and W counters
        j = count.get(key, 0)
        order.append(Action(stage, kind, j))
        count[key] = j + 1
        if kind == B:
            count[stage, W] = count.get((stage, W), 0) + 1
        elif kind == I:
            pending_w.append((stage, j))

    def weight_if_pending() -> None:
        if pending_w:
            stage, j = pending_w.pop(0)
            order.append(Action(stage, W, j))
            count[stage, W] = count.get((stage, W), 0) + 1

    for _ in range((n_ranks - rank - 1) * 2):
        act(s0, F)
    for _ in range(rank + 1):
        act(s0, F)
        act(s1, F)
    for _ in range(n_ranks - rank - 1):
        act(s1, I)
        weight_if_pending()
        act(s1, F)
    for _ in range(n_micro - 2 * n_ranks + rank + 1):
        # (on the last rank the first pair is not overlapped, to shrink the bubble: the same two
        # actions in the same order here)
        act(s0, F)
        act(s1, B)
        act(s1, F)
        act(s0, B)
    for _ in range(n_ranks - rank - 1):
        act(s1, B)
        act(s1, F)
        act(s0, B)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        act(s1, I if split else B)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        act(s0, I if split else B)
    for _ in range(n_ranks - rank - 1):
        weight_if_pending()
        act(s0, I if split else B)
    for _ in range(rank + 1):
        weight_if_pending()
    return order


def rank_order(kind: str, n_ranks: int, virtual: int, n_micro: int, rank: int) -> tuple[Action, ...]:
    """Pipeline rank `rank`'s actions, in order, over all the stages it holds (kept: a comparison
    asks for the same orders of thousands of plans' memory and timelines)."""
    return _rank_order(str(kind), n_ranks, virtual, n_micro, rank)


@functools.lru_cache(maxsize=512)
def _rank_order(kind: str, n_ranks: int, virtual: int, n_micro: int, rank: int) -> tuple[Action, ...]:
    if kind in ORDERS:
        return tuple(ORDERS[Schedule(kind)](n_ranks, n_micro, rank))
    if kind == Schedule.INTERLEAVED_1F1B:
        return tuple(_interleaved(n_ranks, virtual, n_micro, rank, zero_bubble=False))
    if kind == Schedule.INTERLEAVED_ZB:
        return tuple(_interleaved(n_ranks, virtual, n_micro, rank, zero_bubble=True))
    if kind == Schedule.LOOPED_BFS:
        return tuple(_looped_bfs(n_ranks, virtual, n_micro, rank))
    if kind == Schedule.ZBV:
        return tuple(_zbv(n_ranks, n_micro, rank))
    if kind == Schedule.DUALPIPE_V:
        return tuple(_dualpipe_v(n_ranks, n_micro, rank))
    if kind == Schedule.ZB_2P:
        return tuple(zb_2p(n_ranks, n_micro, rank))
    raise ValueError(f"no action order for schedule {kind!r}")


def rank_orders(kind: str, n_ranks: int, virtual: int, n_micro: int) -> list[tuple[Action, ...]]:
    return [rank_order(kind, n_ranks, virtual, n_micro, r) for r in range(n_ranks)]
