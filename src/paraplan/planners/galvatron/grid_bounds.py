"""What a uniform layout of the Megatron grid (grid.py) cannot beat, before it is simulated: its
ranks' compute (`compute_s`, a bound under any schedule) and a one-chunk pipeline's closed form
(`pipeline_bound_s`), both from the per-layer times the simulator itself charges (`stage_pass_s`).
The grid judges layouts in the order of these bounds and skips those that cannot win."""

from __future__ import annotations

from paraplan.costs.alike import first_alike
from paraplan.costs.strategy import layer_time_on, strategy_links
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import Plan


def compute_s(request: PlanRequest, plan: Plan) -> float:
    """The average pipeline rank's compute over the iteration: m x the sum of every layer's forward +
    backward as the simulator prices each (costs/strategy.py `layer_time`: TP's all-reduces,
    recomputation and ZeRO-2's reduce-scatters included), over the P ranks. No plan of this layout
    is faster (some rank is at least this busy), whatever its schedule and chunks: the grid skips a layout whose compute
    alone is no faster than its best plan so far."""
    return _compute(plan, *stage_pass_s(request, plan))


def _compute(plan: Plan, forward: list[float], backward: list[float]) -> float:
    ranks = len({s.devices for s in plan.stages})  # interleaved: several stages on each rank's group
    return plan.n_micro * (sum(forward) + sum(backward)) / ranks


# multi-chunk schedules whose backward is one computation a stage (not split as zero-bubble's is)
WHOLE_BACKWARD_CHUNKED = ("interleaved-1f1b", "looped-bfs")


def pipeline_bound_s(request: PlanRequest, plan: Plan) -> float:
    """A lower bound on a pipeline's iteration (GPipe, 1F1B, and interleaved 1F1B / looped BFS with
    several chunks a rank), tighter than `compute_s`: rank r runs its stages' m forwards and m
    backwards (m x the sum of f + b over its stages), cannot start before some micro-batch's forward
    has crossed the stages before its first stage i (sum of f_j, j < i), and its last computation is
    a backward of stage i (a micro-batch's backward reaches its earlier stages after its later ones),
    after which that backward must still cross the stages before i (sum of b_j). With one chunk a
    rank that is stage i's own m (f_i + b_i); with v chunks it is Narayanan et al. 2021's interleaved
    bubble, (P - 1) chunk passes. Transfers and the step after the schedule only add to it, so a
    layout whose bound is no faster than the best plan so far cannot win (the grid judges layouts in
    this order and stops there). Other multi-chunk schedules (a split backward): `compute_s`."""
    return _pipeline_bound(plan, *stage_pass_s(request, plan))


def bounds(request: PlanRequest, plan: Plan) -> tuple[float, float]:
    """(`pipeline_bound_s`, `compute_s`) of `plan`, its stages priced once."""
    forward, backward = stage_pass_s(request, plan)
    return _pipeline_bound(plan, forward, backward), _compute(plan, forward, backward)


def _pipeline_bound(plan: Plan, forward: list[float], backward: list[float]) -> float:
    m = plan.n_micro
    if plan.virtual_stages > 1:
        if str(plan.schedule) not in WHOLE_BACKWARD_CHUNKED:
            return _compute(plan, forward, backward)
        busy, first = [0.0] * plan.n_ranks, [len(forward)] * plan.n_ranks
        for i, rank in enumerate(plan.rank_of_stage):
            busy[rank] += forward[i] + backward[i]
            first[rank] = min(first[rank], i)
        return max(sum(forward[:first[r]]) + m * busy[r] + sum(backward[:first[r]]) for r in range(plan.n_ranks))
    return max(sum(forward[:i]) + m * (forward[i] + backward[i]) + sum(backward[:i]) for i in range(len(forward)))


def stage_pass_s(request: PlanRequest, plan: Plan) -> tuple[list[float], list[float]]:
    """Each stage's forward and backward of one micro-batch, as the simulator prices its layers (on
    the stage's own devices: their kind and links)."""
    cm = request.costs
    micro = plan.global_batch / plan.n_micro
    scale = cm.overheads.scale_for(len(set(plan.devices)))
    forward, backward = [], []
    links: dict = {}  # per strategy and group (an MoE layer's expert view too)
    for s in plan.stages:
        f = b = 0.0
        compute = cm.compute(s.devices[0])
        # a layer priced like an earlier one of the stage under the same strategy (costs/alike.py) is
        # read, not priced again: the same times (970 bounds of the grid at 1,024 H100s priced 82,000 layers)
        first = first_alike(compute, cm.model, range(cm.model.n_layers))
        priced: dict = {}
        for i in s.layers:
            st = s.strategy(i)
            if (st, s.devices) not in links:
                links[st, s.devices] = strategy_links(cm.cluster, st, s.devices)
            if (first[i], st) not in priced:
                priced[first[i], st] = layer_time_on(compute, cm.model, i, st, micro, links[st, s.devices],
                                                     cm.overlap_slowdown, cm.overheads, scale)
            t = priced[first[i], st]
            f, b = f + t.forward_s, b + t.backward_s
        forward.append(f)
        backward.append(b)
    return forward, backward
