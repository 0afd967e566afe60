"""A Galvatron plan's per-layer strategies for people (`paraplan plan` prints them)."""

from __future__ import annotations

from paraplan.plans.plan import LayerStrategy, Plan


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
