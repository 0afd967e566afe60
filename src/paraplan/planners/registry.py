"""Every planner by name, behind one call: the CLI and benchmarks use this."""

from __future__ import annotations

from paraplan.costs.model import CostModel
from paraplan.errors import UnknownNameError
from paraplan.planners.pipeline_split import PLANNERS as SPLIT_PLANNERS
from paraplan.planners.pipeline_split import plan_split
from paraplan.plan.plan import Plan

PLANNERS = (*SPLIT_PLANNERS, "gropipe", "bipartition", "pipedream-layerwise")


def make_plan(cm: CostModel, model_name: str, cluster_name: str, batch: int, planner: str,
              n_stages: int | None = None, n_micro: int | None = None, eta: int = 1000, seed: int = 0) -> Plan:
    """The planner's Plan (its prediction, when set, comes from the simulator)."""
    if planner not in PLANNERS:
        raise UnknownNameError("planner", planner, list(PLANNERS))
    if planner == "gropipe":
        from paraplan.planners.gropipe import plan_gropipe

        micro = (n_micro,) if n_micro else (1, 2, 4, 6, 8, 10, 12, 14, 16)
        shapes = None
        if n_stages:
            g = cm.cluster.n_devices
            shapes = [(g // n_stages, n_stages)] if g // n_stages >= 1 else None
        return plan_gropipe(cm, model_name, cluster_name, batch, micro_batches=micro, shapes=shapes)[0]
    if planner in ("bipartition", "pipedream-layerwise"):
        from paraplan.planners.bipartition import plan_bipartition

        return plan_bipartition(cm, model_name, cluster_name, batch, n_workers=n_stages, n_micro=n_micro,
                                layerwise=planner == "pipedream-layerwise")
    return plan_split(cm, model_name, cluster_name, batch, planner, n_stages=n_stages, n_micro=n_micro, eta=eta,
                      seed=seed)
