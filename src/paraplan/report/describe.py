"""A plan described for people, whichever method found it: a plan with per-layer strategies as
runs of layers with one strategy (`paraplan plan` prints them; the runtime benchmarks label their
rows with them)."""

from __future__ import annotations

from paraplan.plans.kinds import PlanKind
from paraplan.plans.layer_strategy import LayerStrategy
from paraplan.plans.plan import Plan


def describe_strategies(plan: Plan) -> list[str]:
    """The plan as runs of layers with one strategy: 'stage 1, layers 0-13: SDP4 x TP2 + CKPT'."""
    lines = []
    for s, stage in enumerate(plan.stages):
        if not stage.strategies:
            lines.append(f"stage {s + 1}, layers {stage.layers.start}-{stage.layers.stop - 1}: "
                         f"{str(LayerStrategy(dp=len(stage.devices)))}")
            continue
        run_start = stage.layers.start
        for i in stage.layers:
            last = i == stage.layers.stop - 1
            if last or stage.strategy(i + 1) != stage.strategy(i):
                lines.append(f"stage {s + 1}, layers {run_start}-{i}: {stage.strategy(i)}")
                run_start = i + 1
    return lines


def strategy_lines(plan: Plan, throughput_samples_per_s: float) -> list[str]:
    """What `paraplan plan` prints under a plan of per-layer strategies: its runs of one strategy,
    then its batch, micro-batches and predicted throughput (nothing for the other kinds)."""
    if plan.kind is not PlanKind.LAYERS:
        return []
    return [*describe_strategies(plan), f"global batch {plan.global_batch}, {plan.n_micro} micro-batches, "
                                        f"{throughput_samples_per_s:.4g} samples/s predicted"]
