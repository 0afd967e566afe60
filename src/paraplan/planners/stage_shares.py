"""Shares of the micro-batch by device speed (issue 52 item 3, plans/stage_widths.py): for the
planners whose stages can span device kinds (PipeDream's replicated stages, GroPipe's groups)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import Plan


def speed_shares(request: PlanRequest, plan: Plan) -> Plan | None:
    """The plan with each stage over devices of several kinds sharing its micro-batches in
    proportion to its devices' speeds on its layers (Poplar's and Cephalo's idea: a faster device
    takes more of the batch, so that the stage's devices finish together), each device at least one
    row; None where no stage mixes kinds. Speeds at the equal split's rows (the time functions'
    fixed costs make a device's time not quite proportional to its rows: the simulator judges)."""
    cm = request.costs
    rows = plan.global_batch // plan.n_micro
    stages, changed = [], False
    for stage in plan.stages:
        tables = [cm.compute(d) for d in stage.devices]
        if len({id(t) for t in tables}) < 2 or rows < len(stage.devices):
            stages.append(stage)
            continue
        even = rows / len(stage.devices)
        speed = np.array([even / sum(float(t.forward[i](even)) + float(t.backward[i](even)) for i in stage.layers)
                          for t in tables])
        exact = rows * speed / speed.sum()
        taken = np.maximum(1, np.floor(exact)).astype(int)
        for k in np.argsort(-(exact - taken))[:max(0, rows - int(taken.sum()))]:  # largest remainders
            taken[k] += 1
        while taken.sum() > rows:  # the floor of one row each overshot: take back from the largest
            taken[int(np.argmax(taken))] -= 1
        divisor = int(np.gcd.reduce(taken))
        stages.append(replace(stage, shares=tuple(int(x) // divisor for x in taken)))
        changed = True
    return replace(plan, stages=tuple(stages)) if changed else None
