"""`paraplan plan --engine E` searches what E runs (issue 49): E's usual recipes, the uniform
layouts its users write by hand, as one more row of the comparison, judged by the simulator with
E's implementation profile like every other row.

The recipes are the practitioner's grid (planners/galvatron/grid.py: P pipeline stages x TP
inner-most x the rest data parallel, every layer alike, the least recomputation that fits,
micro-batch counts P, 2P, 4P and one sample per replica, interleaved rewrites where E runs them),
with E's own kinds of data parallelism and gradient accumulation without a pipeline:
  - torchtitan 0.3.0: FSDP2 (`data_parallel_shard_degree`: SDP) or DDP replicas, with TP and PP;
  - Megatron-LM (megatron-core 0.16.1): DP, its distributed optimizer (ZeRO-1), Megatron FSDP;
  - DeepSpeed 0.19.8: ZeRO-0/1/2 and ZeRO-3 (SDP), and its pipeline engine (ZeRO-0/1 only).
Each layout E refuses (engines/__init__.py `engine_problem`) is never judged. Without a pipeline,
every power of two of micro-batches up to one sample per replica is tried: FSDP / ZeRO-3 with
activation checkpointing and gradient accumulation is the recipe these users start from.
"""

from __future__ import annotations

import math

from paraplan.engines import engine_problem
from paraplan.engines.layout import ENGINE_NAMES
from paraplan.engines.shape import ModelShape
from paraplan.errors import FieldError
from paraplan.planners.auto import Row, judged_row
from paraplan.planners.galvatron.grid import grid_candidates
from paraplan.planners.request import PlanRequest

# (sharded, ZeRO stage) of the replicas (grid.py `families`)
ENGINE_FAMILIES = {
    "torchtitan": ((True, 0), (False, 0)),
    "megatron": ((False, 0), (False, 1), (True, 0)),
    "deepspeed": ((False, 0), (False, 1), (False, 2), (True, 0)),
}


def recipes_name(engine: str) -> str:
    return f"{engine}-recipes"


def recipe_row(request: PlanRequest, engine: str, shape: ModelShape) -> Row:
    """The fastest of E's recipes that fits, as a row (status ok); where none fits, the nearest to
    fitting (status infeasible) with what would make it fit in its reason."""
    from dataclasses import replace

    from paraplan.planners.registry import simulator_judge

    name = recipes_name(engine)

    def accept(plan) -> bool:
        return engine_problem(replace(plan, **request.costs.plan_precision), engine, shape) is None

    try:
        judged = grid_candidates(request, simulator_judge(request), ENGINE_FAMILIES[engine], accept,
                                 accumulation=True)
    except FieldError as exc:
        return Row(planner=name, status="failed", reason=f"{ENGINE_NAMES[engine]}'s recipes: {exc.detail}")
    plan, _ = judged[0]
    row = judged_row(name, replace(plan, **request.costs.plan_precision), request.costs)
    if row.status == "ok":
        return replace(row, reason=f"{ENGINE_NAMES[engine]}'s own recipes: {len(judged)} layouts judged")
    return replace(row, reason=row.reason + "; " + what_would_fit(row, request))


def what_would_fit(row: Row, request: PlanRequest) -> str:
    """What would make the nearest recipe fit, in one clause: the grid has already tried full
    recomputation and one sample per micro-batch, so what is left is memory: more devices (the
    states shard over them) or devices with more memory."""
    need = max(p / c for p, c in zip(row.peak_bytes, row.capacity_bytes, strict=True)) if row.peak_bytes else math.inf
    if not math.isfinite(need):
        return "nothing to compare its memory with"
    devices = request.n_devices * 2 ** math.ceil(math.log2(need)) if need > 1 else request.n_devices
    return (f"its recipes already tried full recomputation and one sample per micro-batch; the nearest needs "
            f"{need:.2f}x its devices' memory: about {devices} devices of this kind (the states shard over them), "
            "or devices with that much more memory")
