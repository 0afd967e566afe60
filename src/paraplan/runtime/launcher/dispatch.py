"""One rank of `paraplan train`: the plan's kind picks what the rank runs.

  - an operator placement (FD-DPS, schedule "dag"): runtime/dag_runtime.py;
  - per-layer strategies (Galvatron-BMW): runtime/hybrid_rank.py's stage under the stage loop;
  - separate backward ranges (Bi-Partition): runtime/bipartition_rank.py's, likewise;
  - otherwise pipeline x data-parallel replicas: runtime/pipeline_rank.py's, likewise.
The stage loop is runtime/stage_loop.py; what every kind shares, runtime/rank_base.py. The process
around a rank (the process group, the teardown) is runtime/launch.py's.
"""

from __future__ import annotations

from paraplan.runtime.rank_base import TrainConfig


def train_rank(config: TrainConfig) -> dict:
    """Train this rank's part of config.plan (the process group is up); its losses and step times."""
    plan = config.plan
    if plan.schedule == "dag":  # an operator placement (FD-DPS)
        from paraplan.runtime.dag_runtime import train_dag_rank

        return train_dag_rank(config)
    from paraplan.runtime.stage_loop import train_stages

    if any(s.strategies for s in plan.stages):
        from paraplan.runtime.hybrid_rank import hybrid_setup as setup
    elif any(s.backward_layers is not None for s in plan.stages):
        from paraplan.runtime.bipartition_rank import bipartition_setup as setup
    else:
        from paraplan.runtime.pipeline_rank import replica_setup as setup
    return train_stages(config, setup)
