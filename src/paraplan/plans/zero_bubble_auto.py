"""ZB-2P: the zero-bubble paper's automatic schedule under a memory limit of 2p micro-batches (Qi
et al. 2024, "Zero Bubble Pipeline Parallelism", §3.1 and §5: ZB-2p), one chunk per rank, the
backward split into I (the input's gradient, which the previous stage waits for) and W (the
weights' gradients, which nothing waits for).

§3.1's heuristic, as the paper states it, is what builds the orders here:
  1. warm-up: within the memory limit, as many F as possible before the first B (I);
  2. then one F and one I in turn, a W inserted wherever a rank would otherwise idle;
  3. a W also when the memory limit is reached (it frees a micro-batch's activations).
It is run on unit times, T_F = T_I = T_W and free transfers, the setting of the paper's handcrafted
schedules (§2.2: ZB-H1, ZB-H2), so that a rank's order depends only on (p, m); the simulator then
times the orders with the measured costs. Deviation: the paper refines the heuristic's schedule
with an ILP on profiled times (§3.2); paraplan keeps the heuristic's order (no ILP solver is a
dependency, and the order must not depend on one run's timing). With m >= 2p the steady state is
the 1F-1I-1W pattern of ZB-H2 (Fig. 3), whose bubble the paper reports as near zero.

The same order on every rank, as torch would run it: paraplan's runtime hands these orders to
torch.distributed.pipelining's _PipelineScheduleRuntime (runtime/pipeline/stage_loop.py), which
adds the sends and receives.
"""

from __future__ import annotations

from functools import lru_cache

from paraplan.plans.actions import Action, Computation

F, I, W = Computation.FORWARD, Computation.BACKWARD_INPUT, Computation.BACKWARD_WEIGHT  # noqa: E741


def memory_limit(n_ranks: int) -> int:
    """ZB-2p's limit: 2p micro-batches' activations on a rank (the paper's M_limit = 2p M_B)."""
    return 2 * n_ranks


@lru_cache(maxsize=256)
def zb_2p_orders(n_ranks: int, n_micro: int) -> tuple[tuple[Action, ...], ...]:
    """Every rank's order (rank r runs stage r), by §3.1's heuristic on unit times."""
    p, m, limit = n_ranks, n_micro, memory_limit(n_ranks)
    done_f = [[-1] * m for _ in range(p)]  # the unit time each pass finished, -1 before
    done_i = [[-1] * m for _ in range(p)]
    next_f, next_i, next_w = [0] * p, [0] * p, [0] * p
    orders: list[list[Action]] = [[] for _ in range(p)]
    t = 0
    while any(next_w[r] < m for r in range(p)):
        started = []
        for r in range(p):
            j = next_i[r]
            # I(r, j) waits for the next stage's I of the same micro-batch (the last stage: its own F)
            i_ready = j < m and ((done_f[r][j] if r == p - 1 else done_i[r + 1][j]) not in (-1,)) and (
                (done_f[r][j] if r == p - 1 else done_i[r + 1][j]) <= t)
            k = next_f[r]
            f_ready = k < m and (r == 0 or 0 <= done_f[r - 1][k] <= t)
            live = next_f[r] - next_w[r]  # activations held until their W
            if i_ready:
                started.append((r, I, j))
            elif f_ready and live < limit:
                started.append((r, F, k))
            elif next_w[r] < next_i[r]:
                started.append((r, W, next_w[r]))
        for r, kind, j in started:  # each pass takes one unit and finishes at t + 1
            orders[r].append(Action(r, kind, j))
            if kind == F:
                done_f[r][j], next_f[r] = t + 1, j + 1
            elif kind == I:
                done_i[r][j], next_i[r] = t + 1, j + 1
            else:
                next_w[r] = j + 1
        t += 1
        if t > 4 * p * m + 4 * p:  # cannot happen with limit >= p; a guard, not a path
            raise RuntimeError(f"zb-2p: no order found for p={p}, m={m}")
    return tuple(tuple(o) for o in orders)


def zb_2p(n_ranks: int, n_micro: int, rank: int) -> list[Action]:
    return list(zb_2p_orders(n_ranks, n_micro)[rank])
