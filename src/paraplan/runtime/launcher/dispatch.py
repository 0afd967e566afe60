"""One rank of `paraplan train`: the plan's kind picks what the rank runs.

  - an operator placement (FD-DPS, schedule "dag"): runtime/dag/dag_runtime.py;
  - per-layer strategies (Galvatron-BMW): runtime/layers/hybrid_rank.py's stage under the stage loop;
  - separate backward ranges (Bi-Partition): runtime/bipartition/bipartition_rank.py's, likewise;
  - otherwise pipeline x data-parallel replicas: runtime/pipeline/pipeline_rank.py's, likewise.
The stage loop is runtime/pipeline/stage_loop.py; what every kind shares, runtime/rank/rank_base.py. The process
around a rank (the process group, the teardown) is runtime/launcher/launch.py's.
"""

from __future__ import annotations

from paraplan.runtime.rank.rank_base import TrainConfig


def train_rank(config: TrainConfig) -> dict:
    """Train this rank's part of config.plan (the process group is up); its losses and step times."""
    plan = config.plan
    if plan.schedule == "dag":  # an operator placement (FD-DPS)
        from paraplan.runtime.dag.dag_runtime import train_dag_rank

        return train_dag_rank(config)
    from paraplan.runtime.pipeline.stage_loop import train_stages

    if any(s.strategies for s in plan.stages):
        from paraplan.runtime.layers.hybrid_rank import hybrid_setup as setup
    elif any(s.backward_layers is not None for s in plan.stages):
        from paraplan.runtime.bipartition.bipartition_rank import bipartition_setup as setup
    else:
        from paraplan.runtime.pipeline.pipeline_rank import replica_setup as setup
    return train_stages(config, setup)
